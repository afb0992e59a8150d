"""Sources of training checkpoints: (step, model) pairs, loaded lazily, one at a time.

A source is a list of `Checkpoint` objects; each holds a step and a way to load its model, and
nothing is loaded until ``checkpoint.load()``.  Sources:

- `pretrained`: TransformerLens checkpoint labels (Pythia, stanford-crfm, NeelNanda models),
  through ``HookedTransformer.from_pretrained(name, checkpoint_value=...)`` or
  ``TransformerBridge.boot_transformers(name, checkpoint_value=...)``;
- `folder`: saved weights (``step_000100.safetensors``, ``model_100.pt``, ``checkpoint-100/``)
  with the architecture in a ``config.json`` beside them;
- `in_memory`: models you already hold.

Steps are chosen with `select_steps`:

>>> labels = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 3000]
>>> select_steps(labels, 4)
[0, 8, 128, 2000]
>>> select_steps(labels, "log:4")
[0, 16, 256, 3000]
>>> select_steps(labels, [2, 3000])
[2, 3000]
"""

from __future__ import annotations

import json
import math
import pickle
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointSource",
    "folder",
    "in_memory",
    "load_state_dict",
    "pretrained",
    "select_steps",
]

CONFIG_FORMAT = "scansnap_lens.HookedTransformerConfig/1"
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")


class CheckpointError(RuntimeError):
    """A checkpoint could not be read; the message names its file or label."""


@dataclass
class Checkpoint:
    step: int
    source: str
    loader: Callable[[], Any]

    def load(self):
        return self.loader()


@dataclass
class CheckpointSource:
    """Checkpoints in ascending step order; ``step_unit`` is "steps" or "tokens"."""

    name: str
    checkpoints: list[Checkpoint]
    step_unit: str = "steps"

    def __iter__(self):
        return iter(self.checkpoints)

    def __len__(self) -> int:
        return len(self.checkpoints)

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self.checkpoints]


def select_steps(available: Sequence[int], steps=None) -> list[int]:
    """Choose among `available` step values.

    steps: None or "all"; an int k (every k-th, starting with the first); "log:n" (n steps
    nearest to log-spaced targets between the first and last, first and last included); or an
    explicit list of values, each of which must be available.
    """
    available = sorted(int(s) for s in available)
    if not available:
        raise ValueError("no checkpoints available")
    if steps is None or steps == "all":
        return available
    if isinstance(steps, int):
        if steps < 1:
            raise ValueError(f"every k-th checkpoint needs k >= 1, got {steps}")
        return available[::steps]
    if isinstance(steps, str):
        match = re.fullmatch(r"log:(\d+)", steps)
        if not match:
            raise ValueError(f"steps must be 'all', 'log:N', an int or a list, got {steps!r}")
        return _log_spaced(available, int(match.group(1)))
    wanted = sorted({int(s) for s in steps})
    missing = [s for s in wanted if s not in set(available)]
    if missing:
        raise ValueError(
            f"steps {missing} are not available; there are {len(available)} checkpoints"
            f" from {available[0]} to {available[-1]}"
        )
    return wanted


def _log_spaced(available: list[int], n: int) -> list[int]:
    if n < 2 or n >= len(available):
        return available if n >= len(available) else available[:1]
    lo, hi = available[0] + 1, available[-1] + 1
    targets = [
        math.exp(math.log(lo) + i * (math.log(hi) - math.log(lo)) / (n - 1)) - 1 for i in range(n)
    ]
    chosen = []
    for t in targets:
        best = min(
            (s for s in available if s not in chosen),
            key=lambda s: abs(math.log1p(s) - math.log1p(t)),
        )
        chosen.append(best)
    return sorted(set(chosen))


# ------------------------------------------------------------------ pretrained labels
def pretrained(
    name: str,
    steps=None,
    backend: str = "hooked",
    device: str | None = None,
    **load_kwargs,
) -> CheckpointSource:
    """Checkpoints of a TransformerLens-known model, by its checkpoint labels.

    backend: "hooked" loads ``HookedTransformer.from_pretrained(name, checkpoint_value=s)``;
    "bridge" loads ``TransformerBridge.boot_transformers(name, checkpoint_value=s)``.
    load_kwargs go to the loader (``fold_ln``, ``dtype``, ...).
    """
    labels, unit = checkpoint_labels(name)
    chosen = select_steps(labels, steps)
    if backend == "hooked":
        try:
            from transformer_lens import HookedTransformer
        except ImportError:
            raise ImportError(
                "this transformer-lens has no HookedTransformer (4.x): use backend='bridge'"
            ) from None

        def loader(step):
            return lambda: _labelled(
                name, step, HookedTransformer.from_pretrained, device=device, **load_kwargs
            )
    elif backend == "bridge":
        from transformer_lens.model_bridge import TransformerBridge

        def loader(step):
            return lambda: _labelled(
                name, step, TransformerBridge.boot_transformers, device=device, **load_kwargs
            )
    else:
        raise ValueError(f"backend must be 'hooked' or 'bridge', got {backend!r}")
    unit = "tokens" if unit == "token" else "steps"
    return CheckpointSource(
        name, [Checkpoint(s, f"{name}@{s}", loader(s)) for s in chosen], step_unit=unit
    )


def checkpoint_labels(name: str) -> tuple[list[int], str]:
    """TransformerLens's checkpoint labels of a model and their unit ("step" or "token")."""
    try:  # transformer-lens 3.x
        from transformer_lens.loading_from_pretrained import get_checkpoint_labels
    except ImportError:  # 4.x moved it
        from transformer_lens.tools.model_registry.checkpoints import get_checkpoint_labels
    return get_checkpoint_labels(name)


def _labelled(name, step, load, **kwargs):
    try:
        model = load(name, checkpoint_value=step, **kwargs)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{name} checkpoint {step}: could not be loaded ({err})") from err
    model.eval()
    return model


# ------------------------------------------------------------------ saved files
_STEP = re.compile(r"(\d+)(?!.*\d)")


def parse_step(name: str) -> int | None:
    """The step in a checkpoint name: the last number in it.

    >>> [parse_step(n) for n in ("step_000100.safetensors", "model_100.pt", "checkpoint-100")]
    [100, 100, 100]
    """
    stem = name
    for suffix in WEIGHT_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    match = _STEP.search(stem)
    return int(match.group(1)) if match else None


def load_state_dict(path: str | Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors or torch checkpoint file; never unpickles unless trusted."""
    path = Path(path)
    if path.is_dir():
        for candidate in ("model.safetensors", "pytorch_model.bin", "model.pt"):
            if (path / candidate).exists():
                return load_state_dict(path / candidate, trust_pickle)
        raise CheckpointError(f"{path}: no model.safetensors / pytorch_model.bin / model.pt in it")
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
        state = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"{path}: carries a pickled payload beyond plain tensors, refused"
            " (pass trust_pickle=True only for files you trust)"
            f" [{str(err).splitlines()[0]}]"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({err})") from None
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), Mapping):
            state = state[key]
            break
    if not isinstance(state, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in state.values()
    ):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return dict(state)


def read_config(path: str | Path):
    """A HookedTransformerConfig from a ``config.json`` (ours, or a plain dict of its fields)."""
    from transformer_lens import HookedTransformerConfig

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read the model config ({err})") from None
    if data.get("format") == CONFIG_FORMAT:
        data = data["config"]
    if "model_type" in data and "n_layers" not in data:
        raise CheckpointError(
            f"{path}: a Hugging Face config; pass model_factory= to build the model"
        )
    return HookedTransformerConfig(**config_from_json(data))


def config_to_json(cfg) -> dict:
    """HookedTransformerConfig fields as JSON values (dtypes as strings)."""
    out = {}
    for key, value in cfg.to_dict().items():
        if isinstance(value, torch.dtype):
            value = str(value).removeprefix("torch.")
        elif isinstance(value, torch.device):
            value = str(value)
        try:
            json.dumps(value)
        except TypeError:
            continue
        out[key] = value
    return {"format": CONFIG_FORMAT, "config": out}


def config_from_json(data: dict) -> dict:
    data = dict(data)
    if isinstance(data.get("dtype"), str):
        data["dtype"] = getattr(torch, data["dtype"])
    data.pop("device", None)
    # Derived fields are recomputed by the config itself.
    for derived in ("n_params", "tokenizer_prepends_bos"):
        data.pop(derived, None)
    return data


def folder(
    path: str | Path,
    steps=None,
    config=None,
    model_factory: Callable[[], Any] | None = None,
    trust_pickle: bool = False,
    device: str | None = None,
) -> CheckpointSource:
    """Checkpoints saved in a folder, the step parsed from each name.

    The model is ``model_factory()`` if given, else a HookedTransformer built from `config`
    (a HookedTransformerConfig, a dict, or a path) or from the folder's ``config.json``; each
    checkpoint's state dict is loaded into it with ``strict=True``.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint folder {path} does not exist")
    found: dict[int, Path] = {}
    for item in sorted(path.iterdir()):
        is_weights = item.is_file() and item.name.endswith(WEIGHT_SUFFIXES)
        is_dir = item.is_dir() and item.name.startswith("checkpoint")
        if not (is_weights or is_dir):
            continue
        step = parse_step(item.name)
        if step is None:
            continue
        if step in found:
            raise CheckpointError(f"{found[step].name} and {item.name} both hold step {step}")
        found[step] = item
    if not found:
        raise FileNotFoundError(
            f"no checkpoint files in {path} (expected names like step_000100.safetensors,"
            " model_100.pt or checkpoint-100/)"
        )
    if model_factory is None:
        cfg = config if config is not None else path / "config.json"
        if isinstance(cfg, str | Path):
            if not Path(cfg).exists():
                raise FileNotFoundError(
                    f"{cfg} is missing: the folder needs the model's config.json beside its"
                    " checkpoints (or pass config= or model_factory=)"
                )
            cfg = read_config(cfg)
        elif isinstance(cfg, dict):
            from transformer_lens import HookedTransformerConfig

            cfg = HookedTransformerConfig(**config_from_json(cfg))

        def model_factory():
            from transformer_lens import HookedTransformer

            return HookedTransformer(cfg, move_to_device=False)

    def loader(file: Path):
        def load():
            state = load_state_dict(file, trust_pickle)
            model = model_factory()
            try:
                model.load_state_dict(state, strict=True)
            except RuntimeError as err:
                raise CheckpointError(
                    f"{file}: does not fit the model ({str(err).splitlines()[0]})"
                ) from None
            if device is not None:
                model.to(device)
            return model.eval()

        return load

    chosen = select_steps(found, steps)
    return CheckpointSource(
        str(path), [Checkpoint(s, str(found[s]), loader(found[s])) for s in chosen]
    )


def in_memory(models: Mapping[int, Any] | Iterable[tuple[int, Any]], name: str = "memory"):
    """Models you already hold, as {step: model} or (step, model) pairs."""
    pairs = sorted((models.items() if isinstance(models, Mapping) else models), key=lambda p: p[0])
    return CheckpointSource(
        name, [Checkpoint(int(s), f"{name}@{s}", (lambda m=m: m)) for s, m in pairs]
    )
