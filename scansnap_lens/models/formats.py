"""What a checkpoint file or folder holds, and the model it becomes.

Formats recognised from their layout, with no option needed:

- TransformerLens weights: ``.safetensors`` / ``.pt`` / ``.pth`` / ``.bin`` state dicts in
  HookedTransformer's layout or the native bridge's, with the architecture in a
  ``config.json`` beside them (ours, or ``cfg.to_dict()`` dumped with ``default=str``);
- Hugging Face folders (``config.json`` with a ``model_type``, ``model.safetensors`` or
  ``pytorch_model.bin``), as the ``transformers`` Trainer writes them (``checkpoint-N/``
  with ``trainer_state.json``): any architecture TransformerBridge supports;
- nanoGPT checkpoint dicts (``{"model", "model_args", "iter_num", ...}``, ``_orig_mod.``
  prefixes of ``torch.compile`` included), converted to a Hugging Face GPT-2;
- a whole pickled model (``torch.save(model)``), only when the caller trusts the file.

Nothing is unpickled unless trusted: torch files load with ``weights_only=True``.
"""

from __future__ import annotations

import json
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from scansnap_lens._io import read_json, read_small_bytes
from scansnap_lens.models import backend as be

if TYPE_CHECKING:
    from scansnap_lens.inputs.tokens import TokenizerLike
    from scansnap_lens.models.backend import HookedModel

__all__ = ["CheckpointError", "load_state_dict"]

WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


class CheckpointError(RuntimeError):
    """A checkpoint could not be read; the message names its file or label."""


# ------------------------------------------------------------------ files
def pickle_refusal(path: str | Path) -> str:
    """What a pickled file's refusal says: what was refused and why, and the safe way."""
    return (
        f"{path}: holds pickled Python objects beyond tensors, which are not loaded (unpickling"
        " runs the file's code); save the model's state_dict as safetensors"
        " (safetensors.torch.save_file) or as a dict of plain tensors"
    )


def load_file_object(path: str | Path, trust_pickle: bool = False) -> Any:
    """The object in a weights file: a dict of tensors (safetensors, or torch with
    ``weights_only=True``), or anything at all when `trust_pickle`."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint file is missing")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(
                f"{path}: corrupt or truncated safetensors file ({err})"
            ) from None
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError:
        raise CheckpointError(pickle_refusal(path)) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({err})") from None
    except (AttributeError, ModuleNotFoundError) as err:  # a trusted pickle of a missing class
        raise CheckpointError(
            f"{path}: the pickled object's class cannot be found ({err})"
        ) from None


def tensor_dict(obj) -> dict[str, torch.Tensor] | None:
    """The state dict in a loaded object (itself, or under ``state_dict`` / ``model`` ...), with
    ``torch.compile``'s ``_orig_mod.`` prefix removed; None when it holds something else."""
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return {str(k).removeprefix("_orig_mod."): v for k, v in obj.items()}
    return None


def load_state_dict(path: str | Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors or torch checkpoint file (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        for candidate in ("model.safetensors", "pytorch_model.bin", "model.pt"):
            if (path / candidate).exists():
                return load_state_dict(path / candidate, trust_pickle)
        raise CheckpointError(f"{path}: no model.safetensors / pytorch_model.bin / model.pt in it")
    state = tensor_dict(load_file_object(path, trust_pickle))
    if state is None:
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return state


# ------------------------------------------------------------------ TransformerLens weights
# sizes of a TransformerLens config: a model is built from them, so each is checked by name
SIZE_FIELDS = (
    "n_layers",
    "d_model",
    "n_ctx",
    "d_head",
    "n_heads",
    "d_vocab",
    "d_mlp",
    "n_key_value_heads",
)


def read_tl_config(path: str | Path) -> tuple[dict, str | None]:
    """(config fields, weight layout or None) from a TransformerLens ``config.json``."""
    path = Path(path)
    try:
        data = read_json(path, "model config")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read the model config ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: the model config must be a JSON object")
    layout = data.get("layout")
    if isinstance(data.get("config"), dict) and str(data.get("format", "")).startswith(
        "scansnap_lens."
    ):
        data = data["config"]
    for name in SIZE_FIELDS:
        value = data.get(name)
        if value is not None and (type(value) is not int or value < 1):
            raise CheckpointError(f"{path}: {name} must be a positive integer, got {value!r}")
    return data, layout


def tl_model(fields: Mapping, state: Mapping[str, torch.Tensor], source: str, backend=None):
    """A HookedTransformer or native bridge of `fields` holding `state`.

    Native-layout weights need the bridge; TransformerLens-layout weights load into the
    installed major's default (converted for the bridge).
    """
    if backend is None:
        backend = "bridge" if be.state_layout(state) == "native" else be.default_backend()
    try:
        model = be.build_model(fields, backend)
    except (TypeError, ValueError) as err:
        raise CheckpointError(
            f"{source}: the model config does not build a model ({err})"
        ) from None
    try:
        be.load_weights(model, state, source)
    except ValueError as err:
        raise CheckpointError(str(err)) from None
    return model


# ------------------------------------------------------------------ Hugging Face folders
def is_hf_folder(path: Path) -> bool:
    """A folder with a Hugging Face ``config.json`` (one that names a ``model_type``)."""
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        data = read_json(config, "model config")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and "model_type" in data


def _tokenizer_near(path: Path):
    """The tokenizer saved in `path` or its parent (the Trainer's output root), or None."""
    import transformers

    for folder in (path, path.parent):
        if (folder / "tokenizer.json").exists() or (folder / "tokenizer_config.json").exists():
            try:
                return transformers.AutoTokenizer.from_pretrained(str(folder))
            except (OSError, ValueError):
                continue
    return None


def hf_folder_model(path: str | Path, tokenizer: TokenizerLike | None = None) -> HookedModel:
    """A TransformerBridge over the Hugging Face model saved in `path` (weights_only loads)."""
    path = Path(path)
    hf = hf_folder_weights(path)
    tokenizer = tokenizer if tokenizer is not None else _tokenizer_near(path)
    try:
        return be.hf_bridge(hf.eval(), tokenizer=tokenizer, name=str(path))
    except (ValueError, NotImplementedError, KeyError) as err:
        raise CheckpointError(
            f"{path}: TransformerBridge does not support this architecture"
            f" ({hf.config.model_type}): {err}"
        ) from None


# What loading a Hugging Face folder raises where its files are damaged (truncated, corrupt,
# pickled objects where tensors should be): each is a CheckpointError naming the file.
LOAD_ERRORS = (
    OSError,
    ValueError,
    KeyError,
    RuntimeError,
    EOFError,
    SafetensorError,
    pickle.UnpicklingError,
    zipfile.BadZipFile,
)


def damaged_file(folder: Path) -> Path | None:
    """The first weights file in `folder` that is truncated or corrupt (a safetensors header
    or size that does not fit, a torch zip archive whose entries fail their checksums, or a
    torch file that does not load); or None."""
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError):
            return file
    for file in sorted(p for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth")):
        try:
            with zipfile.ZipFile(file) as archive:
                if archive.testzip() is None:
                    continue
            return file
        except zipfile.BadZipFile:  # not a zip (torch's legacy format) or cut: try it
            try:
                torch.load(file, map_location="cpu", weights_only=True)
            except Exception:  # whatever it raises, this file is the one that does not load
                return file
        except OSError:
            return file
    return None


def hf_folder_weights(path: Path, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(path, weights_only=True)``, every loading error a
    CheckpointError that names the damaged file where one is."""
    import transformers

    try:
        return transformers.AutoModelForCausalLM.from_pretrained(
            str(path), weights_only=True, **kwargs
        )
    except LOAD_ERRORS as err:
        damaged = damaged_file(path)
        what = f"{damaged} is truncated or corrupt" if damaged is not None else str(err)
        raise CheckpointError(
            f"{path}: cannot load the Hugging Face model: {what}"
            + (f" ({err})" if damaged is not None else "")
        ) from None


def trainer_step(path: Path) -> int | None:
    """The global step in a Trainer checkpoint's ``trainer_state.json``, if there is one."""
    state = path / "trainer_state.json"
    if not state.is_file():
        return None
    try:
        return int(read_json(state, "Trainer's state", TRAINER_STATE_BYTES)["global_step"])
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as err:
        warnings.warn(
            f"{state} is not readable ({type(err).__name__}: {err}): the step is taken from"
            " the folder's name, unchecked, and the training's rates and losses from the other"
            " checkpoints' files",
            stacklevel=2,
        )
        return None


SEED_ARGS = ("seed", "data_seed")  # the TrainingArguments that say what a run shares
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
_INTS = {"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG", "NONE"}
_MEMO = {"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"}
ARGS_BYTES = 1 << 20  # a TrainingArguments pickle is a few kB
TRAINER_STATE_BYTES = 1 << 30  # its log of every step of a long run: far below this


def trainer_seeds(args_file: Path) -> dict:
    """``seed`` and ``data_seed`` of the Trainer's ``training_args.bin`` (``torch.save`` of
    its TrainingArguments), read from the pickle's opcodes without running it: a field name
    followed by an integer (or None) in the arguments' state.  {} where the file is not such
    a pickle, is larger than `ARGS_BYTES` or holds neither."""
    import pickletools

    try:
        if args_file.stat().st_size > ARGS_BYTES:
            return {}
        if zipfile.is_zipfile(args_file):
            with zipfile.ZipFile(args_file) as archive:
                names = [n for n in archive.namelist() if n.endswith("data.pkl")]
                if not names or archive.getinfo(names[0]).file_size > ARGS_BYTES:
                    return {}
                data = archive.read(names[0])
        else:
            data = read_small_bytes(args_file, "Trainer's arguments", ARGS_BYTES)
        found, key = {}, None
        for op, arg, _ in pickletools.genops(data):
            if op.name in _MEMO:
                continue
            if key is not None and op.name in _INTS and key not in found:
                found[key] = None if op.name == "NONE" else int(arg)
            key = arg if op.name in _STRINGS and arg in SEED_ARGS else None
    except (OSError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError, EOFError):
        return {}
    return {k: v for k, v in found.items() if v is None or isinstance(v, int)}


def trainer_training(states: list[Path]) -> dict:
    """What the Trainer's ``trainer_state.json`` files (of its checkpoints) say of how the
    model was trained, as the trajectory's meta takes it: the peak learning rate as ``lr_y``
    and ``lr_z`` (the Trainer has one rate for all parameters), ``lr_schedule`` ([step, rate]
    of its log, the warmup and decay), ``train_loss`` and ``eval_loss`` ([step, loss] of its
    log, where it logged them), and the optimizer, AdamW (``adam``): the Trainer's
    default, which the file does not name (``training_from`` says so).  {} where no file has a
    logged rate."""
    rates: dict[int, float] = {}
    losses: dict[str, dict[int, float]] = {"loss": {}, "eval_loss": {}}
    for state in states:
        try:
            log = read_json(state, "Trainer's state", TRAINER_STATE_BYTES).get("log_history", [])
        except (OSError, ValueError, AttributeError):
            continue  # trainer_step has said so
        entries = log if isinstance(log, list) else []
        read = [
            e
            for e in entries
            if isinstance(e, dict)
            and isinstance(e.get("learning_rate", 0), int | float)
            and isinstance(e.get("step", 0), int)
        ]
        if len(read) < len(entries) or not isinstance(log, list):
            warnings.warn(
                f"{state}: its log_history is not the Trainer's list of logged steps (hand-edited"
                " or corrupt?): the training's rates are read from the rest of it, unchecked",
                stacklevel=2,
            )
        for entry in read:
            if "learning_rate" in entry:
                rates[int(entry.get("step", 0))] = float(entry["learning_rate"])
            for key in ("loss", "eval_loss"):
                if isinstance(entry.get(key), int | float):
                    losses[key][int(entry.get("step", 0))] = float(entry[key])
    if not rates:
        return {}
    steps = sorted(rates)
    keep = steps[:: max(1, len(steps) // 64)] + steps[-1:]  # the shape of it, not every log
    peak = max(rates.values())
    logged = {
        name: [[s, losses[key][s]] for s in dict.fromkeys(at[:: max(1, len(at) // 200)] + at[-1:])]
        for key, name in (("loss", "train_loss"), ("eval_loss", "eval_loss"))
        if (at := sorted(losses[key]))
    }  # the logged losses, at most about 200 points each
    return {
        **logged,
        "lr_y": peak,
        "lr_z": peak,
        "optimizer": "adam",
        "momentum": 0.0,
        "lr_schedule": [[s, rates[s]] for s in dict.fromkeys(keep)],
        "training_from": "trainer_state.json: the peak of its logged learning rate; the"
        " optimizer assumed AdamW, the Trainer's default (the file does not name it)",
    }


def training_arguments(args) -> dict:
    """The trajectory's meta from a ``transformers.TrainingArguments`` (what a callback sees):
    the rate, optimizer (``adam`` for the AdamW family, ``sgd``), schedule and weight decay."""
    optim = str(getattr(args, "optim", "adamw_torch")).lower().split(".")[-1]
    optimizer = "sgd" if "sgd" in optim else "adam"
    lr = float(getattr(args, "learning_rate", 0.0))
    warmup = getattr(args, "warmup_steps", 0) or getattr(args, "warmup_ratio", 0.0)
    return {
        "lr_y": lr,
        "lr_z": lr,
        "optimizer": optimizer,
        "momentum": 0.0,
        "lr_schedule": f"{getattr(args, 'lr_scheduler_type', 'linear')}".split(".")[-1].lower()
        + f", warmup {warmup}",
        "weight_decay": float(getattr(args, "weight_decay", 0.0)),
        "training_from": f"the Trainer's arguments (optim {optim})",
    }


# ------------------------------------------------------------------ nanoGPT
def is_nanogpt(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("model_args"), dict) and "model" in obj


def nanogpt_model(ckpt: dict, source: str, tokenizer: TokenizerLike | None = None) -> HookedModel:
    """A TransformerBridge over the GPT-2 that a nanoGPT checkpoint dict describes.

    nanoGPT's ``nn.Linear`` weights are transposed into GPT-2's ``Conv1D`` layout; without
    biases (``bias=False``) the GPT-2 biases are zeros, which computes the same function.
    """
    import transformers

    args = ckpt["model_args"]
    try:
        cfg = transformers.GPT2Config(
            vocab_size=int(args["vocab_size"]),
            n_positions=int(args["block_size"]),
            n_embd=int(args["n_embd"]),
            n_layer=int(args["n_layer"]),
            n_head=int(args["n_head"]),
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=1e-5,
            activation_function="gelu",
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: nanoGPT model_args incomplete ({err})") from None
    state = tensor_dict(ckpt["model"])
    if state is None:
        raise CheckpointError(f"{source}: the nanoGPT 'model' entry is not a state dict")
    hf = transformers.GPT2LMHeadModel(cfg)
    target = hf.state_dict()
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    converted = {}
    for key, value in state.items():
        if key.endswith(".attn.bias") and value.ndim == 4:  # nanoGPT's causal-mask buffer
            continue
        converted[key] = value.t().contiguous() if key.endswith(conv1d) else value
    for key, value in target.items():  # bias=False: GPT-2's biases as zeros
        if key not in converted and key.endswith(".bias") and not key.endswith("attn.bias"):
            converted[key] = torch.zeros_like(value)
    converted.setdefault("lm_head.weight", converted.get("transformer.wte.weight"))
    missing = [k for k in target if k not in converted and not k.endswith(("attn.bias",))]
    unexpected = [k for k in converted if k not in target]
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: not a nanoGPT GPT state dict (missing {missing[:5]},"
            f" unexpected {unexpected[:5]})"
        )
    hf.load_state_dict(converted, strict=False)
    return be.hf_bridge(hf.eval(), tokenizer=tokenizer, name="gpt2")


def model_from_object(
    obj: object, source: str, tokenizer: TokenizerLike | None = None
) -> HookedModel:
    """A recordable model from what a trusted pickle held (a model, or a nanoGPT dict)."""
    if is_nanogpt(obj):
        return nanogpt_model(obj, source, tokenizer)
    if be.is_hf_model(obj):
        return be.hf_bridge(obj.eval(), tokenizer=tokenizer)
    if isinstance(obj, torch.nn.Module) and hasattr(obj, "run_with_hooks"):
        return obj.eval()
    raise CheckpointError(
        f"{source}: holds a {type(obj).__name__}, not a TransformerLens or Hugging Face model"
        " nor a state dict"
    )
