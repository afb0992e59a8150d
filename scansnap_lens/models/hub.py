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

__all__ = [
    "cache_dir",
    "cached_commit",
    "checkpoint_labels",
    "delete_revision",
    "fetch_revision",
    "label_of_file",
    "load_labelled",
    "offline",
    "remove_orphans",
    "revision_files",
    "revision_of",
]

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


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set: nothing is downloaded."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")


def _download_hint(name: str, what: str = "") -> str:
    return (
        f"{name}{what} is not in the local hub cache and HF_HUB_OFFLINE=1 is set: download it"
        f" first (huggingface-cli download {name}), or unset HF_HUB_OFFLINE"
    )


def cache_dir() -> Path:
    """The hub cache this process reads (``HF_HUB_CACHE`` as it is now)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return Path(os.environ.get("HF_HUB_CACHE", HF_HUB_CACHE))


def _repo_folder(name: str) -> Path:
    return cache_dir() / ("models--" + name.replace("/", "--"))


def _cached_files(name: str) -> list[str] | None:
    """Files of the cached snapshot of `name` at ``main`` (or any snapshot), or None."""
    repo = _repo_folder(name)
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
    if not offline():
        try:
            from huggingface_hub import HfApi

            files = HfApi().list_repo_files(name)
        except Exception:  # no network, or the hub refused: the cache may still have it
            files = None
    if files is None:
        files = _cached_files(name)
    if files is None:
        raise CheckpointError(_download_hint(name) if offline() else f"{name}: cannot list")
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
        if offline():
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
            hint = f" ({_download_hint(name, '@' + revision)})" if offline() else ""
            raise CheckpointError(f"{name} checkpoint {label}: {err}{hint}") from None
        if getattr(model.cfg, "checkpoint_value", label) != label:
            raise CheckpointError(
                f"{name}: asked for checkpoint {label}, TransformerLens loaded"
                f" {model.cfg.checkpoint_value}"
            )
        return model.eval()
    from scansnap_lens.models.formats import hf_folder_model

    folder = fetch_revision(name, revision)
    ref = folder.parents[1] / "refs" / revision
    if ref.is_file() and ref.read_text().strip() != folder.name:
        raise CheckpointError(
            f"{name}@{revision}: the cache resolved {folder.name}, the ref says"
            f" {ref.read_text().strip()}"
        )
    return hf_folder_model(folder).eval()


# ------------------------------------------------------------------ revisions on disk
# Weight formats a recording does not read: other frameworks' files, never downloaded.
_OTHER_FRAMEWORKS = (".h5", ".msgpack", ".ot", ".onnx", ".tflite", ".mlmodel", ".gguf")


def revision_files(name: str, revision: str) -> dict[str, int]:
    """{file: bytes} of what loading `revision` reads: every file of it but weights in
    other frameworks' formats, and PyTorch ``.bin`` weights only where it has no
    safetensors (transformers loads those first), from the hub's listing."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(name, revision=revision, files_metadata=True)
    except Exception as err:  # connection and HTTP errors
        raise CheckpointError(f"{name}@{revision}: cannot list its files ({err})") from None
    sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    has_safetensors = any(f.endswith(".safetensors") for f in sizes)
    return {
        f: n
        for f, n in sizes.items()
        if not f.endswith(_OTHER_FRAMEWORKS)
        and not (has_safetensors and f.endswith((".bin", ".bin.index.json")))
    }


def cached_commit(name: str, revision: str) -> str | None:
    """The commit `revision` of `name` resolves to in the cache, where its snapshot is there."""
    ref = _repo_folder(name) / "refs" / revision
    if not ref.is_file():
        return None
    commit = ref.read_text().strip()
    return commit if (_repo_folder(name) / "snapshots" / commit).is_dir() else None


def fetch_revision(name: str, revision: str, files=None) -> Path:
    """Download `files` of `revision` (default: `revision_files`) into the hub cache,
    resuming partial files and skipping those there already; the snapshot folder.  Offline,
    the cached snapshot."""
    from huggingface_hub import snapshot_download

    try:
        if files is None and not offline():
            files = revision_files(name, revision)
        patterns = None if files is None else sorted(files)
        return Path(
            snapshot_download(
                name, revision=revision, allow_patterns=patterns, cache_dir=cache_dir()
            )
        )
    except Exception as err:
        if offline():
            raise CheckpointError(_download_hint(name, "@" + revision)) from None
        raise CheckpointError(f"{name}@{revision}: cannot download ({err})") from None


# huggingface_hub >= 1.x downloads into ``<etag>.<id>.incomplete``, unique to the process, and
# never reuses one: a killed download leaves it behind for good.
_PARTIAL = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})\.[0-9a-f]{8}\.incomplete$")


def remove_orphans(name: str) -> int:
    """Delete the partial downloads killed processes left in `name`'s blobs (files no process
    can resume), where no download holds the file's lock (huggingface_hub's flock on
    ``.locks/<repo>/<etag>.lock``); the bytes freed.  Only where flock exists (not Windows)."""
    try:
        import fcntl
    except ImportError:
        return 0
    from scansnap_lens._io import open_lock

    repo = _repo_folder(name)
    blobs = repo / "blobs"
    locks = cache_dir() / ".locks" / repo.name
    if not blobs.is_dir():
        return 0
    freed = 0
    for path in sorted(blobs.glob("*.incomplete")):
        match = _PARTIAL.match(path.name)
        if match is None:  # <etag>.incomplete: older huggingface_hub resumes it
            continue
        handle = None
        if locks.is_dir():  # no folder: no download of this repository ever took a lock
            handle = open_lock(locks / f"{match.group(1)}.lock")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a download is writing it
                handle.close()
                continue
        try:
            size = path.stat().st_size
            path.unlink()
            freed += size
        except FileNotFoundError:
            pass
        finally:
            if handle is not None:
                handle.close()  # closing releases the flock
    return freed


def delete_revision(name: str, revision: str, ours: set[str]) -> int:
    """Delete `revision`'s snapshot and the blobs no other snapshot uses from the hub cache;
    the bytes freed.  Nothing is deleted where another ref than those in `ours` (the
    revisions a sweep downloaded itself) points at the same commit: Pythia's ``main`` is its
    last step, and a ``main`` cached before stays whole."""
    from huggingface_hub import scan_cache_dir

    commit = cached_commit(name, revision)
    if commit is None:
        return 0
    refs = _repo_folder(name) / "refs"
    sharing = {
        p.relative_to(refs).as_posix()
        for p in refs.rglob("*")
        if p.is_file() and p.read_text().strip() == commit
    }
    if sharing - set(ours):
        return 0
    strategy = scan_cache_dir(cache_dir()).delete_revisions(commit)
    strategy.execute()
    for ref in sharing:  # deleted with the snapshot; a ref left over would point at nothing
        (refs / ref).unlink(missing_ok=True)
    return int(strategy.expected_freed_size)
