"""Checkpoint labels of hub model families, each resolved to its exact revision or file here.

TransformerLens knows the labels of three families, and scansnap_lens resolves each label to
what holds it, without TransformerLens's own lookup:

- ``EleutherAI/pythia-*``: revision ``step{N}`` of the hub repository;
- ``stanford-crfm/*``: revision ``checkpoint-{N}``;
- ``NeelNanda/*`` (and ``ArthurConmy/*``, ``Baidicoot/*``): files ``checkpoints/*_{N}.pth`` in
  the repository.  TransformerLens 3.9 picks the first file whose name *ends* with the label,
  so label 5,000,000 can load the file of 15,000,000; here the label must equal the file's
  number exactly.

Offline (``HF_HUB_OFFLINE=1``), labels and files come from the local hub cache, and what is
missing there is an error that says what to download.

>>> label_of_file("checkpoints/attn-only-1l_checkpoint_15000000.pth")
15000000
>>> revision_of("EleutherAI/pythia-14m", 1000)
'step1000'
>>> revision_of("stanford-crfm/alias-gpt2-small-x21", 10)
'checkpoint-10'
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from scansnap_lens.models import backend as be
from scansnap_lens.models.formats import CheckpointError

__all__ = ["checkpoint_labels", "label_of_file", "load_labelled", "revision_of"]

LEGACY_TL = ("NeelNanda/", "ArthurConmy/", "Baidicoot/")
_FILE = re.compile(r"^checkpoints/.*_(\d+)\.pth$")


def family(name: str) -> str | None:
    if name.startswith("EleutherAI/pythia"):
        return "pythia"
    if name.startswith("stanford-crfm/"):
        return "crfm"
    if name.startswith(LEGACY_TL):
        return "legacy-tl"
    return None


def label_of_file(path: str) -> int | None:
    """The checkpoint label in a legacy TransformerLens file name, or None."""
    match = _FILE.match(path)
    return int(match.group(1)) if match else None


def revision_of(name: str, label: int) -> str:
    """The hub revision that holds checkpoint `label` of a Pythia or stanford-crfm model."""
    kind = family(name)
    if kind == "pythia":
        return f"step{label}"
    if kind == "crfm":
        return f"checkpoint-{label}"
    raise ValueError(f"{name} keeps its checkpoints in files, not revisions")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def _download_hint(name: str, what: str = "") -> str:
    return (
        f"{name}{what} is not in the local hub cache and HF_HUB_OFFLINE=1 is set: download it"
        f" first (huggingface-cli download {name}), or unset HF_HUB_OFFLINE"
    )


def _cached_files(name: str) -> list[str] | None:
    """Files of the cached snapshot of `name` at ``main`` (or any snapshot), or None."""
    from huggingface_hub.constants import HF_HUB_CACHE

    repo = Path(os.environ.get("HF_HUB_CACHE", HF_HUB_CACHE)) / (
        "models--" + name.replace("/", "--")
    )
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    main = repo / "refs" / "main"
    chosen = snapshots / main.read_text().strip() if main.is_file() else None
    folders = [chosen] if chosen is not None and chosen.is_dir() else sorted(snapshots.iterdir())
    files = set()
    for folder in folders:
        files |= {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    return sorted(files)


def legacy_files(name: str) -> dict[int, str]:
    """{label: file} of a legacy TransformerLens repository, labels matched exactly."""
    files = None
    if not _offline():
        try:
            from huggingface_hub import HfApi

            files = HfApi().list_repo_files(name)
        except Exception:  # no network, or the hub refused: the cache may still have it
            files = None
    if files is None:
        files = _cached_files(name)
    if files is None:
        raise CheckpointError(_download_hint(name) if _offline() else f"{name}: cannot list")
    found: dict[int, str] = {}
    for file in files:
        label = label_of_file(file)
        if label is None:
            continue
        if label in found:
            raise CheckpointError(f"{name}: {found[label]} and {file} both hold label {label}")
        found[label] = file
    if not found:
        raise CheckpointError(f"{name}: no checkpoints/*_<label>.pth files in the repository")
    return dict(sorted(found.items()))


def checkpoint_labels(name: str) -> tuple[list[int], str]:
    """The checkpoint labels of a model and their unit ("steps" or "tokens")."""
    if family(name) == "legacy-tl":
        labels = list(legacy_files(name))
        return labels, "tokens" if labels[-1] > 1e9 else "steps"
    try:  # transformer-lens 3.x
        from transformer_lens.loading_from_pretrained import get_checkpoint_labels
    except ImportError:  # 4.x moved it
        from transformer_lens.tools.model_registry.checkpoints import get_checkpoint_labels
    labels, unit = get_checkpoint_labels(name)
    return sorted(labels), "tokens" if unit == "token" else "steps"


def _hub_file(name: str, file: str, revision: str | None = None) -> str:
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(name, file, revision=revision)
    except Exception as err:  # LocalEntryNotFoundError, connection and HTTP errors
        if _offline():
            raise CheckpointError(_download_hint(name, f" ({file})")) from None
        raise CheckpointError(f"{name}: cannot download {file} ({err})") from None


def _legacy_fields(name: str) -> dict:
    data = json.loads(Path(_hub_file(name, "config.json")).read_text())
    architecture = data.get("architecture", "neel")
    if architecture != "neel" or "_old" in name:
        raise CheckpointError(f"{name}: the {architecture!r} weight layout is not supported")
    fields = {k: v for k, v in data.items() if k != "tokenizer_name"}
    if "normalization" in data:
        fields["normalization_type"] = data["normalization"]
    fields["positional_embedding_type"] = (
        "shortformer" if data.get("shortformer_pos") else "standard"
    )
    return fields


def load_labelled(name: str, label: int, backend: str | None = None, **load_kwargs):
    """The model of checkpoint `label` of `name`, from exactly the revision or file that holds
    it; a recording sees which (``source``)."""
    backend = be.resolve_backend(backend)
    kind = family(name)
    if load_kwargs and (backend != "hooked" or kind == "legacy-tl"):
        raise ValueError(
            f"load options {sorted(load_kwargs)} go to HookedTransformer.from_pretrained, which"
            " this checkpoint does not load through (backend 'hooked' or --backend hooked,"
            " Pythia or stanford-crfm)"
        )
    if kind == "legacy-tl":
        files = legacy_files(name)
        if label not in files:
            raise CheckpointError(f"{name}: no checkpoint file has label {label}")
        file = files[label]
        if label_of_file(file) != label:  # the exact match TransformerLens 3.9 does not make
            raise CheckpointError(f"{name}: {file} does not hold label {label}")
        state = torch.load(_hub_file(name, file), map_location="cpu", weights_only=True)
        fields = _legacy_fields(name)
        model = be.build_model(fields, backend)
        try:
            be.load_weights(model, state, f"{name}/{file}")
        except ValueError as err:
            raise CheckpointError(str(err)) from None
        return model.eval()
    revision = revision_of(name, label)
    if backend == "hooked":
        from transformer_lens import HookedTransformer

        try:
            model = HookedTransformer.from_pretrained(name, checkpoint_value=label, **load_kwargs)
        except (OSError, ValueError) as err:
            hint = f" ({_download_hint(name, '@' + revision)})" if _offline() else ""
            raise CheckpointError(f"{name} checkpoint {label}: {err}{hint}") from None
        if getattr(model.cfg, "checkpoint_value", label) != label:
            raise CheckpointError(
                f"{name}: asked for checkpoint {label}, TransformerLens loaded"
                f" {model.cfg.checkpoint_value}"
            )
        return model.eval()
    from huggingface_hub import snapshot_download

    from scansnap_lens.models.formats import hf_folder_model

    try:
        folder = Path(snapshot_download(name, revision=revision))
    except Exception as err:
        if _offline():
            raise CheckpointError(_download_hint(name, "@" + revision)) from None
        raise CheckpointError(f"{name}@{revision}: cannot download ({err})") from None
    ref = folder.parents[1] / "refs" / revision
    if ref.is_file() and ref.read_text().strip() != folder.name:
        raise CheckpointError(
            f"{name}@{revision}: the cache resolved {folder.name}, the ref says"
            f" {ref.read_text().strip()}"
        )
    return hf_folder_model(folder).eval()
