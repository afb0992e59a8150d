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
from dataclasses import dataclass
from pathlib import Path

import torch

from scansnap_lens.models import backend as be
from scansnap_lens.models.formats import LOAD_ERRORS, WEIGHT_SUFFIXES, CheckpointError

__all__ = [
    "RevisionInfo",
    "cache_dir",
    "cached_commit",
    "checkpoint_labels",
    "content_id",
    "delete_snapshot",
    "fetch_revision",
    "mismatched",
    "offline",
    "refuse_linked",
    "remove_orphans",
    "repo_folder",
    "revision_info",
    "snapshot_in",
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


def is_commit(text: str) -> bool:
    """Whether `text` is a commit id as the hub cache names snapshots: 40 hex digits."""
    return re.fullmatch(r"[0-9a-f]{40}", text) is not None


def is_repo_name(text: str) -> bool:
    """Whether `text` is a hub repository name (huggingface_hub's own check): never a path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def is_revision_name(text: str) -> bool:
    """Whether `text` can name a revision (a branch, tag or commit) without leaving the
    folder it is looked up in: word characters, ".", "-" and "/", no "..", not absolute."""
    return re.fullmatch(r"[\w.\-]+(/[\w.\-]+)*", text) is not None and ".." not in text


def repo_folder(name: str, cache: Path | None = None) -> Path:
    """The folder of repository `name` in `cache` (default: the hub cache)."""
    return (cache or cache_dir()) / ("models--" + name.replace("/", "--"))


def _cached_files(name: str) -> list[str] | None:
    """Files of the cached snapshot of `name` at ``main`` (or any snapshot), or None."""
    repo = repo_folder(name)
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


_POLYPYTHIAS = re.compile(r"^(EleutherAI/pythia-[^/]+?)-(?:data-|weight-)?seed\d+$")


def checkpoint_labels(name: str) -> tuple[list[int], str]:
    """The checkpoint labels of a model and their unit ("steps" or "tokens")."""
    if family(name) == "legacy-tl":
        labels = list(legacy_files(name))
        return labels, "tokens" if labels[-1] > 1e9 else "steps"
    try:  # transformer-lens 3.x
        from transformer_lens.loading_from_pretrained import get_checkpoint_labels
    except ImportError:  # 4.x moved it
        from transformer_lens.tools.model_registry.checkpoints import get_checkpoint_labels
    # PolyPythias (pythia-160m-seed3, -data-seed2, -weight-seed1) keep Pythia's own branches,
    # under names TransformerLens does not list: ask for the model they vary
    match = _POLYPYTHIAS.match(name)
    labels, unit = get_checkpoint_labels(match.group(1) if match else name)
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


def load_labelled(
    name: str, label: int, backend: str | None = None, folder: Path | None = None, **load_kwargs
):
    """The model of checkpoint `label` of `name`, from exactly the revision or file that holds
    it; a recording sees which (``source``).  folder: the revision's snapshot, already on disk
    (a sweep's): read from there, nothing downloaded or written to any cache."""
    backend = be.resolve_backend(backend)
    kind = family(name)
    if load_kwargs and (backend != "hooked" or kind == "legacy-tl"):
        raise ValueError(
            f"load options {sorted(load_kwargs)} go to HookedTransformer.from_pretrained, which"
            " this checkpoint does not load through (backend='hooked',"
            " Pythia or stanford-crfm)"
        )
    if kind == "legacy-tl":
        return _load_legacy(name, label, backend)
    revision = revision_of(name, label)
    if backend == "hooked":
        return _load_hooked(name, label, folder, **load_kwargs)
    from scansnap_lens.models.formats import hf_folder_model

    if folder is not None:
        return hf_folder_model(folder).eval()
    folder = fetch_revision(name, revision)
    ref = folder.parents[1] / "refs" / revision
    if ref.is_file() and ref.read_text().strip() != folder.name:
        raise CheckpointError(
            f"{name}@{revision}: the cache resolved {folder.name}, the ref says"
            f" {ref.read_text().strip()}"
        )
    return hf_folder_model(folder).eval()


def _load_legacy(name: str, label: int, backend: str):
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


def _load_hooked(name: str, label: int, folder: Path | None, **load_kwargs):
    """HookedTransformer.from_pretrained at `label`.  With `folder` (a snapshot in a cache),
    the Hugging Face model and tokenizer load from there, and TransformerLens reads that
    revision's config from the same cache, files only: it writes to no cache."""
    from transformer_lens import HookedTransformer

    revision = revision_of(name, label)
    try:
        if folder is None:
            model = HookedTransformer.from_pretrained(name, checkpoint_value=label, **load_kwargs)
        else:
            import transformers

            from scansnap_lens.models.formats import hf_folder_weights

            hf = hf_folder_weights(folder)
            tokenizer = None
            if any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
                tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
            model = HookedTransformer.from_pretrained(
                name,
                hf_model=hf,
                tokenizer=tokenizer,
                revision=folder.name,
                cache_dir=str(folder.parents[2]),
                local_files_only=True,
                **load_kwargs,
            )
            model.cfg.checkpoint_value, model.cfg.from_checkpoint = label, True
    except LOAD_ERRORS as err:
        hint = f" ({_download_hint(name, '@' + revision)})" if offline() and folder is None else ""
        raise CheckpointError(f"{name} checkpoint {label}: {err}{hint}") from None
    if getattr(model.cfg, "checkpoint_value", label) != label:
        raise CheckpointError(
            f"{name}: asked for checkpoint {label}, TransformerLens loaded"
            f" {model.cfg.checkpoint_value}"
        )
    return model.eval()


# ------------------------------------------------------------------ revisions on disk
# Weight formats a recording does not read: other frameworks' files, never downloaded.
_OTHER_FRAMEWORKS = (".h5", ".msgpack", ".ot", ".onnx", ".tflite", ".mlmodel", ".gguf")


@dataclass(frozen=True)
class RevisionInfo:
    """What the hub lists of one revision: the commit it resolves to, and of each file that
    loading reads (`revision_files`) its bytes and content id (the LFS sha256 of a weights
    file, else the git blob id)."""

    commit: str
    files: dict[str, int]
    ids: dict[str, str]

    def weights_id(self) -> tuple[str, ...]:
        """The content ids of its weights files: equal where two revisions serve the same
        weights, whatever their names."""
        return tuple(self.ids[f] for f in sorted(self.files) if f.endswith(WEIGHT_SUFFIXES))


def revision_info(name: str, revision: str) -> RevisionInfo:
    """The commit, files, sizes and content ids of `revision`, from the hub's listing."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(name, revision=revision, files_metadata=True)
    except Exception as err:  # connection and HTTP errors
        raise CheckpointError(f"{name}@{revision}: cannot list its files ({err})") from None
    siblings = {s.rfilename: s for s in info.siblings or []}
    has_safetensors = any(f.endswith(".safetensors") for f in siblings)
    read = [
        f
        for f in siblings
        if not f.endswith(_OTHER_FRAMEWORKS)
        and not (has_safetensors and f.endswith((".bin", ".bin.index.json")))
    ]
    ids = {}
    for f in read:
        lfs = siblings[f].lfs
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        ids[f] = str(sha or siblings[f].blob_id or "")
    return RevisionInfo(str(info.sha), {f: int(siblings[f].size or 0) for f in read}, ids)


def revision_files(name: str, revision: str) -> dict[str, int]:
    """{file: bytes} of what loading `revision` reads: every file of it but weights in
    other frameworks' formats, and PyTorch ``.bin`` weights only where it has no
    safetensors (transformers loads those first), from the hub's listing."""
    return revision_info(name, revision).files


def cached_commit(name: str, revision: str, cache: Path | None = None) -> str | None:
    """The commit `revision` of `name` resolves to in `cache` (default: the hub cache), where
    its snapshot is there."""
    from scansnap_lens._io import NotAFile, read_small

    repo = repo_folder(name, cache)
    ref = repo / "refs" / revision
    if not is_revision_name(revision) or not ref.is_file():
        return None
    try:  # a cache is a folder someone else may have made: a ref names a commit, or nothing
        commit = read_small(ref, "commit a revision resolves to", limit=1024).strip()
    except (OSError, NotAFile, UnicodeDecodeError):
        return None
    return commit if is_commit(commit) and (repo / "snapshots" / commit).is_dir() else None


# the fields of a Hugging Face config that count a model's layers and heads, by architecture
_LAYERS, _HEADS = (
    ("num_hidden_layers", "n_layer", "n_layers"),
    ("num_attention_heads", "n_head", "n_heads"),
)


def model_shape(name: str, revision: str) -> tuple[int, int]:
    """(layers, heads) of `name` at `revision` from its config.json alone: read from your hub
    cache where it holds the revision, else fetched into a temporary folder removed after
    (no weights are downloaded, and nothing lands in a cache).  CheckpointError naming the
    file where it gives neither count."""
    import tempfile

    from scansnap_lens._io import NotAFile, read_json

    commit = cached_commit(name, revision)
    held = None if commit is None else repo_folder(name) / "snapshots" / commit / "config.json"
    with tempfile.TemporaryDirectory(prefix="scansnap-config-") as folder:
        if held is None or not held.is_file():
            from huggingface_hub import hf_hub_download

            try:
                held = Path(
                    hf_hub_download(name, "config.json", revision=revision, cache_dir=folder)
                )
            except Exception as err:  # LocalEntryNotFoundError, connection and HTTP errors
                if offline():
                    raise CheckpointError(_download_hint(name, " (config.json)")) from None
                raise CheckpointError(
                    f"{name}@{revision}: cannot download config.json ({err})"
                ) from None
        try:
            data = read_json(held, "model config")
        except (OSError, NotAFile, ValueError) as err:
            raise CheckpointError(f"{name}@{revision}: cannot read config.json ({err})") from None
    counts = [
        next((data[k] for k in keys if k in data), None) if isinstance(data, dict) else None
        for keys in (_LAYERS, _HEADS)
    ]
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 < c < 1 << 16 for c in counts):
        raise CheckpointError(
            f"{name}@{revision}: its config.json gives no count of layers"
            f" and heads ({', '.join(_LAYERS + _HEADS)})"
        )
    return counts[0], counts[1]


def snapshot_in(
    cache: Path,
    name: str,
    revision: str,
    commit: str | None = None,
    files=None,
    ids=None,
    check: bool = True,
) -> Path | None:
    """The snapshot folder of `name` at `revision` in `cache`, found by its ref or by its
    `commit` (a revision pinned by hash has no ref), holding every one of `files`, each with
    its content id in `ids` (`mismatched`; without `check`, not read); or None.  Reads
    only."""
    repo = repo_folder(name, cache)
    for found in (commit, cached_commit(name, revision, cache)):
        if found is None or not is_commit(found):
            continue
        folder = repo / "snapshots" / found
        if folder.is_dir() and all((folder / f).is_file() for f in files or ()):
            return None if check and mismatched(folder, ids) else folder
    return None


def mismatched(folder: Path, ids: dict[str, str] | None) -> list[str]:
    """The files of snapshot `folder` that are not what the hub lists: `ids` gives each
    file's content id (an LFS file's sha256, another's git blob id), checked against the
    file's content (`content_id`), linked or plain; a link must also land in the blobs of
    the folder's own repository.  Without `ids` (offline), a link to a blob named by a
    sha256 (an LFS file, as the cache names it) is checked against that name."""
    blobs = (folder.parents[1] / "blobs").resolve()
    wanted = dict(ids or {})
    if not ids:  # the names the cache gave the blobs: what the hub listed when it downloaded
        linked = [p for p in folder.rglob("*") if p.is_symlink()]
        wanted = {
            p.relative_to(folder).as_posix(): p.resolve().name
            for p in linked
            if re.fullmatch(r"[0-9a-f]{64}", p.resolve().name)
        }
    out = []
    for file, want in sorted(wanted.items()):
        path = folder / file
        if not want or not path.exists():
            continue
        if path.is_symlink() or folder.is_symlink():
            target = path.resolve()
            if target.parent != blobs or target.name != want:
                out.append(file)
                continue
        if content_id(path, len(want)) != want:
            out.append(file)
    return out


_CONTENT_IDS: dict[tuple, str] = {}  # (device, inode, size, mtime, length): the file's id


def content_id(path: Path, length: int = 64) -> str:
    """sha256 of the file (length 64), or its git blob id (length 40): the ids a hub lists.
    Read once per file: kept by its device, inode, size and modification time."""
    import hashlib

    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, length)
    if key in _CONTENT_IDS:
        return _CONTENT_IDS[key]
    if length == 64:
        digest = hashlib.sha256()
    else:
        digest = hashlib.sha1(f"blob {info.st_size}\0".encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 23):
            digest.update(chunk)
    _CONTENT_IDS[key] = digest.hexdigest()
    return _CONTENT_IDS[key]


def fetch_revision(name: str, revision: str, files=None, cache: Path | None = None) -> Path:
    """Download `files` of `revision` (default: `revision_files`) into `cache` (default: the
    hub cache), skipping those there already; the snapshot folder.  Offline, the cached
    snapshot."""
    from huggingface_hub import snapshot_download

    try:
        if files is None and not offline():
            files = revision_files(name, revision)
        patterns = None if files is None else sorted(files)
        return Path(
            snapshot_download(
                name, revision=revision, allow_patterns=patterns, cache_dir=cache or cache_dir()
            )
        )
    except Exception as err:
        if offline():
            raise CheckpointError(_download_hint(name, "@" + revision)) from None
        raise CheckpointError(f"{name}@{revision}: cannot download ({err})") from None


def snapshots(cache: Path, name: str) -> dict[str, str]:
    """{ref: commit} of the snapshots of `name` in `cache` that a ref names."""
    refs = repo_folder(name, cache) / "refs"
    if not refs.is_dir():
        return {}
    found = (p for p in refs.rglob("*") if p.is_file())
    return {p.relative_to(refs).as_posix(): p.read_text().strip() for p in found}


def _linked(repo: Path) -> bool:
    folders = (repo, repo / "blobs", repo / "snapshots", repo / "refs")
    if any(p.is_symlink() for p in folders):
        return True
    snapshots = repo / "snapshots"  # a snapshot folder linked to another (someone's)
    return snapshots.is_dir() and any(p.is_symlink() for p in snapshots.iterdir())


def refuse_linked(cache: Path, name: str) -> None:
    """ValueError where `name`'s folder in `cache`, or a folder of it, is a symbolic link: a
    cache from someone else could point them at another cache, and writing or deleting
    through one would reach there."""
    repo = repo_folder(name, cache)
    if _linked(repo):
        raise ValueError(
            f"{repo}, or a folder in it, is a symbolic link: the sweep neither downloads nor"
            " deletes through one; remove that folder (the sweep's own cache) and run again"
        )


def delete_snapshot(
    cache: Path, name: str, revision: str, keep: set[str] = frozenset(), commit: str | None = None
) -> int:
    """Delete `revision` of `name` from `cache`: its snapshot, the refs naming its commit,
    and the blobs no other snapshot of `name` in `cache` uses and `keep` (blob names: content
    ids) does not name; the bytes freed.  commit: where given, only if the revision's ref
    names it (else nothing).  Only inside ``cache/models--{name}``: another
    repository's snapshot of the same commit (a mirror) is never touched.  Only for a cache
    the caller owns (the sweep's).

    Not ``scan_cache_dir(cache).delete_revisions(commit)``: it deletes whatever a snapshot's
    link points to, inside the cache or not, and takes the first repository of a set that
    holds the commit, which may be the mirror's (huggingface_hub 2.4)."""
    import shutil

    refuse_linked(cache, name)
    repo = repo_folder(name, cache)
    ref = repo / "refs" / revision
    named = ref.read_text().strip() if ref.is_file() and not ref.is_symlink() else None
    if commit is None:
        commit = named
    elif named is not None and named != commit:
        return 0  # the ref moved to another commit: not the snapshot that was made
    if commit is None or not is_commit(commit):
        return 0
    folder = repo / "snapshots" / commit

    def blobs_of(snapshot: Path) -> set[Path]:
        return {
            (p.parent / os.readlink(p)).resolve() for p in snapshot.rglob("*") if p.is_symlink()
        }

    used = set()
    for other in (repo / "snapshots").iterdir() if (repo / "snapshots").is_dir() else ():
        if other.name != commit:
            used |= blobs_of(other)
    freed = 0
    blobs = (repo / "blobs").resolve()  # no link (checked above): the folder itself
    for blob in blobs_of(folder) - used if folder.is_dir() else ():
        if (
            blob.parent == blobs
            and blob.is_file()
            and not blob.is_symlink()
            and (blob.name not in keep)
        ):
            freed += blob.stat().st_size
            blob.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    for ref, named in snapshots(cache, name).items():
        if named == commit:
            (repo / "refs" / ref).unlink(missing_ok=True)
    return freed


def remove_downloaded(cache: Path, name: str, commits: set[str]) -> list[Path]:
    """After the sweep deleted its snapshots of `name` from `cache` (its own): the files
    huggingface_hub made beside them (the blobs no snapshot links to, the listings and
    "no such file" notes of `commits`, the download locks and partial files); the folders
    that held them, to remove where empty.  Nothing of a snapshot still there."""
    refuse_linked(cache, name)
    repo = repo_folder(name, cache)
    remove_orphans(name, cache)
    snapshots = repo / "snapshots"
    used = {
        (p.parent / os.readlink(p)).resolve()
        for p in (snapshots.rglob("*") if snapshots.is_dir() else ())
        if p.is_symlink()
    }
    blobs = repo / "blobs"
    for blob in blobs.iterdir() if blobs.is_dir() else ():
        if blob.is_file() and not blob.is_symlink() and blob.resolve() not in used:
            blob.unlink(missing_ok=True)
    locks = cache / ".locks" / repo.name
    for lock in locks.glob("*.lock") if locks.is_dir() and not locks.is_symlink() else ():
        lock.unlink(missing_ok=True)
    for commit in filter(is_commit, commits):  # never a path
        (repo / "trees" / f"{commit}.json").unlink(missing_ok=True)
        no_exist = repo / ".no_exist" / commit
        for note in no_exist.rglob("*") if no_exist.is_dir() else ():
            if note.is_file() and not note.is_symlink() and note.stat().st_size == 0:
                note.unlink()
    return [repo, locks]


def remove_cache_tag(cache: Path) -> None:
    """Remove the CACHEDIR.TAG huggingface_hub writes into a cache it downloads into."""
    tag = cache / "CACHEDIR.TAG"
    try:
        if not tag.is_symlink() and tag.read_bytes().startswith(_CACHE_TAG):
            tag.unlink()
    except OSError:
        pass


_CACHE_TAG = b"Signature: 8a477f597d28d172789f06886806bc55"  # the CACHEDIR.TAG standard's

# huggingface_hub >= 1.x downloads into ``<etag>.<id>.incomplete``, unique to the process, and
# never reuses one: a killed download leaves it behind for good.
_PARTIAL = re.compile(r"^([0-9a-f]{40}|[0-9a-f]{64})\.[0-9a-f]{8}\.incomplete$")


def remove_orphans(name: str, cache: Path | None = None) -> int:
    """Delete the partial downloads killed processes left in `name`'s blobs (files no process
    can resume), where no download holds the file's lock (huggingface_hub's flock on
    ``.locks/<repo>/<etag>.lock``); the bytes freed.  Only where flock exists (not Windows)."""
    try:
        import fcntl
    except ImportError:
        return 0
    from scansnap_lens._io import open_lock

    repo = repo_folder(name, cache)
    blobs = repo / "blobs"
    locks = (cache or cache_dir()) / ".locks" / repo.name
    if not blobs.is_dir() or _linked(repo):
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
