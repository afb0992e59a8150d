"""Sources of training checkpoints: (step, model) pairs, loaded lazily, one at a time.

A source is a list of `Checkpoint` objects; each holds a step and a way to load its model, and
nothing is loaded until ``checkpoint.load()``.  Sources:

- `pretrained`: TransformerLens checkpoint labels (Pythia, stanford-crfm, NeelNanda models),
  through ``HookedTransformer.from_pretrained(name, checkpoint_value=...)`` or
  ``TransformerBridge.boot_transformers(name, checkpoint_value=...)``;
- `folder`: saved checkpoints in the formats people have (`formats`): TransformerLens state
  dicts with a ``config.json``, Hugging Face Trainer ``checkpoint-N/`` folders, nanoGPT
  dicts, trusted pickles of whole models;
- `in_memory`: models you already hold.

Steps are chosen in the one step language of `steps.select_steps` (``steps=``: "all", every
k-th, "log:N" or a list), the same that training saves checkpoints with.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from scansnap_lens._io import read_json
from scansnap_lens.models import formats, hub
from scansnap_lens.models.backend import BackendError, config_fields, load_weights, resolve_backend
from scansnap_lens.models.formats import WEIGHT_SUFFIXES, CheckpointError
from scansnap_lens.models.steps import select_steps
from scansnap_lens.models.training import Rates

if TYPE_CHECKING:
    from scansnap_lens.inputs.tokens import TokenizerLike
    from scansnap_lens.models.steps import Steps

__all__ = [
    "Checkpoint",
    "CheckpointSource",
    "folder",
    "in_memory",
    "pretrained",
]


@dataclass
class Checkpoint:
    """One checkpoint: its step, where it comes from, how to load it, and what holds it on
    disk (a hub revision, a local file or folder), which a sweep fetches ahead and frees."""

    step: int
    source: str
    loader: Callable[[], Any]
    revision: str | None = None  # the hub revision that holds it
    path: Path | None = None  # the local file or folder that holds it (a revision's snapshot)

    def load(self):
        return self.loader()


@dataclass
class CheckpointSource:
    """Checkpoints in ascending step order; ``step_unit`` is "steps" or "tokens"."""

    name: str
    checkpoints: list[Checkpoint]
    step_unit: str = "steps"
    meta: dict = field(default_factory=dict)  # what is known of the training (rates, ...)

    def __iter__(self):
        return iter(self.checkpoints)

    def __len__(self) -> int:
        return len(self.checkpoints)

    @property
    def steps(self) -> list[int]:
        return [c.step for c in self.checkpoints]


# ------------------------------------------------------------------ pretrained labels
def pretrained(
    name: str,
    steps: Steps = None,
    backend: str | None = None,
    device: str | None = None,
    **load_kwargs,
) -> CheckpointSource:
    """Checkpoints of a model TransformerLens knows by checkpoint labels (`hub`).

    Each label is resolved here to the exact hub revision (Pythia, stanford-crfm) or file
    (NeelNanda) that holds it.  backend: "bridge" loads that revision into a TransformerBridge
    (the default on 4.x); "hooked" uses ``HookedTransformer.from_pretrained(name,
    checkpoint_value=)`` and checks the label it loaded (the default on 3.x).  Legacy
    TransformerLens files load into either.  load_kwargs go to ``from_pretrained``.  A local
    folder is read as `folder` reads it.
    """
    if Path(name).is_dir():  # a local model or checkpoint folder, not a hub name
        return folder(name, steps=steps, backend=backend, device=device)
    backend = resolve_backend(backend)
    if hub.family(name) is None:
        raise ValueError(
            f"{name} has no checkpoint labels TransformerLens knows (Pythia, stanford-crfm,"
            " NeelNanda models): for your own checkpoints use a folder"
        )
    available, unit = hub.checkpoint_labels(name)
    chosen = select_steps(available, steps)

    revisions = hub.family(name) in ("pythia", "crfm")

    def checkpoint(step: int) -> Checkpoint:
        revision = hub.revision_of(name, step) if revisions else None
        held = Checkpoint(step, f"{name}@{step}", lambda: None, revision)

        def load():  # from the snapshot a sweep put on disk (`path`), or as the hub gives it
            model = hub.load_labelled(name, step, backend, folder=held.path, **load_kwargs)
            return model if device is None else model.to(device)

        held.loader = load
        return held

    return CheckpointSource(name, [checkpoint(s) for s in chosen], step_unit=unit)


def checkpoint_labels(name: str) -> tuple[list[int], str]:
    """The checkpoint labels of a model and their unit ("steps" or "tokens")."""
    return hub.checkpoint_labels(name)


# ------------------------------------------------------------------ saved files
_STEP = re.compile(r"(\d+)(?!.*\d)")
_NEGATIVE = re.compile(r"(?<![A-Za-z0-9])-\d+(?!.*\d)")  # "_-5", not "checkpoint-5"


def parse_step(name: str) -> int | None:
    """The step in a checkpoint name: the last number in it.  A minus sign before it (not a
    dash after a word, as in ``checkpoint-100``) is refused: no step is negative.

    >>> [parse_step(n) for n in ("step_000100.safetensors", "model_100.pt", "checkpoint-100")]
    [100, 100, 100]
    >>> parse_step("step_-5.safetensors")
    Traceback (most recent call last):
    ValueError: step_-5.safetensors names a negative step: rename the file or move it away
    """
    stem = name
    for suffix in WEIGHT_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    if _NEGATIVE.search(stem):
        raise ValueError(f"{name} names a negative step: rename the file or move it away")
    match = _STEP.search(stem)
    return int(match.group(1)) if match else None


def _config_fields(config) -> dict:
    if isinstance(config, str | Path):
        return formats.read_tl_config(config)[0]
    if isinstance(config, Mapping):
        return dict(config)
    return config_fields(config)  # a HookedTransformerConfig / TransformerBridgeConfig


def _nanogpt_step(file: Path) -> int | None:
    """`iter_num` of a nanoGPT checkpoint dict, or None when the file is something else.
    CheckpointError where a file named like nanoGPT's (``ckpt.pt``) holds pickled objects
    beyond tensors: it is refused by name, not passed over in silence."""
    try:
        obj = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        if file.name.startswith("ckpt"):
            raise CheckpointError(formats.pickle_refusal(file)) from None
        return None
    except Exception:  # not a plain-tensor torch file: not a nanoGPT dict we can peek into
        return None
    if formats.is_nanogpt(obj) and "iter_num" in obj:
        return int(obj["iter_num"])
    return None


def folder(
    path: str | Path,
    steps: Steps = None,
    config=None,
    model_factory: Callable[[], Any] | None = None,
    trust_pickle: bool = False,
    device: str | None = None,
    backend: str | None = None,
    tokenizer: TokenizerLike | None = None,
) -> CheckpointSource:
    """Checkpoints saved in a folder, in whichever format its layout shows (see `formats`).

    - ``checkpoint-N/`` Hugging Face folders (the Trainer's output), or one such folder:
      a TransformerBridge each, the step from the name checked against
      ``trainer_state.json``;
    - TransformerLens state dicts (``step_000100.safetensors``, ``model_100.pt``, ...) with
      the architecture from `config` (fields, a config object or a path) or the folder's
      ``config.json``, or ``model_factory()``;
    - nanoGPT checkpoint dicts (``ckpt_100.pt``, or ``ckpt.pt`` with its ``iter_num``);
    - a pickled whole model, only with ``trust_pickle=True``.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint folder {path} does not exist")
    found = _steps_in(path)
    if backend == "hooked" and any(p.is_dir() and formats.is_hf_folder(p) for p in found.values()):
        raise BackendError(
            f"{path} holds Hugging Face checkpoints, which load through TransformerBridge:"
            " use backend='bridge'"
        )
    fields = None
    if model_factory is None:
        if config is not None:
            fields = _config_fields(config)
        elif (path / "config.json").is_file() and not formats.is_hf_folder(path):
            fields = formats.read_tl_config(path / "config.json")[0]
    if backend is not None:
        resolve_backend(backend)
    load = _FolderLoad(fields, model_factory, trust_pickle, device, backend, tokenizer)
    chosen = select_steps(found, steps)
    return CheckpointSource(
        str(path),
        [Checkpoint(s, str(found[s]), partial(load, found[s]), path=found[s]) for s in chosen],
        meta=_training_meta(path),
    )


def _steps_in(path: Path) -> dict[int, Path]:
    """{step: its file or checkpoint-N folder} of a checkpoint folder."""
    found: dict[int, Path] = {}
    items = [path] if formats.is_hf_folder(path) else sorted(path.iterdir())
    for item in items:
        is_weights = item.is_file() and item.name.endswith(WEIGHT_SUFFIXES)
        is_dir = item.is_dir() and (item == path or item.name.startswith("checkpoint"))
        if not (is_weights or is_dir):
            continue
        step = parse_step(item.name)
        if is_dir and formats.is_hf_folder(item):
            recorded = formats.trainer_step(item)
            if step is None:
                step = recorded if recorded is not None else 0
            elif recorded is not None and recorded != step:
                raise CheckpointError(
                    f"{item}: the folder name says step {step},"
                    f" its trainer_state.json says {recorded}"
                )
        if step is None and is_weights and item.suffix in (".pt", ".pth"):
            step = _nanogpt_step(item)
        if step is None:
            continue
        if step in found:
            raise CheckpointError(f"{found[step].name} and {item.name} both hold step {step}")
        found[step] = item
    if not found:
        raise FileNotFoundError(
            f"no checkpoint files in {path} (expected Hugging Face checkpoint-N/ folders, or"
            " names like step_000100.safetensors, model_100.pt, ckpt.pt)"
        )
    return found


@dataclass
class _FolderLoad:
    """Load one item of a checkpoint folder (see `folder`) as a model in eval mode."""

    fields: dict | None
    model_factory: Callable[[], Any] | None
    trust_pickle: bool
    device: str | None
    backend: str | None
    tokenizer: TokenizerLike | None

    def __call__(self, item: Path):
        if item.is_dir() and formats.is_hf_folder(item):
            model = formats.hf_folder_model(item, self.tokenizer)
        else:
            model = self._weights(item)
        if self.device is not None:
            model.to(self.device)
        return model.eval()

    def _weights(self, item: Path):
        if item.is_dir():
            obj = formats.load_state_dict(item, self.trust_pickle)
        else:
            obj = formats.load_file_object(item, self.trust_pickle)
        if formats.is_nanogpt(obj):
            step = obj.get("iter_num")
            named = parse_step(item.name)
            if named is not None and step is not None and int(step) != named:
                raise CheckpointError(f"{item}: named step {named}, but its iter_num is {step}")
            return formats.nanogpt_model(obj, str(item), self.tokenizer)
        state = formats.tensor_dict(obj)
        if state is None:
            return formats.model_from_object(obj, str(item), self.tokenizer)
        if self.model_factory is not None:
            model = self.model_factory()
            try:
                load_weights(model, state, str(item))
            except ValueError as err:
                raise CheckpointError(str(err)) from None
            return model
        if self.fields is None:
            raise CheckpointError(
                f"{item}: a state dict needs the model's architecture: put its config.json"
                " beside the checkpoints (or pass config= or model_factory= to folder)"
            )
        return formats.tl_model(self.fields, state, str(item), self.backend)


def _training_meta(path: Path) -> dict:
    """The rates, optimizer and momentum that `train` wrote beside its checkpoints, or what a
    Trainer's ``trainer_state.json`` files say (`formats.trainer_training`), if any, with its
    ``seed`` and ``data_seed`` (`formats.trainer_seeds`: which runs share initial weights
    and data order)."""
    file = path / "training.json"
    if not file.is_file():
        hf = formats.is_hf_folder(path)
        states = (
            [path / "trainer_state.json"]
            if hf
            else sorted(path.glob("checkpoint-*/trainer_state.json"))
        )
        meta = formats.trainer_training([s for s in states if s.is_file()])
        args = (
            [path / "training_args.bin"]
            if hf
            else sorted(path.glob("checkpoint-*/training_args.bin"))
        )
        seeds = formats.trainer_seeds(args[0]) if args and args[0].is_file() else {}
        if seeds.get("seed") is not None:  # the seeds say which runs share what
            meta["seed"] = seeds["seed"]
            if seeds.get("data_seed") is not None:
                meta["data_seed"] = seeds["data_seed"]
        return meta
    try:
        data = read_json(file, "training description")
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{file}: cannot read the training description ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: the training description is not a JSON object")
    if "lr_y" in data or "lr_z" in data:  # refused here, not when a report reads it back
        try:
            Rates.of_meta(data, where=str(file))
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    return data


def in_memory(models: Mapping[int, Any] | Iterable[tuple[int, Any]], name: str = "memory"):
    """Models you already hold, as {step: model} or (step, model) pairs."""
    pairs = sorted((models.items() if isinstance(models, Mapping) else models), key=lambda p: p[0])
    return CheckpointSource(
        name, [Checkpoint(int(s), f"{name}@{s}", (lambda m=m: m)) for s, m in pairs]
    )
