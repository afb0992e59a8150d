"""A sweep: checkpoints brought onto disk ahead of the recorder, at most `on_disk` at a time.

While checkpoint k records, one background thread fetches checkpoint k+1 (downloads a hub
revision, or reads a local checkpoint's files through), so a sweep takes about the longer of
fetching and recording, not their sum.  A hub sweep downloads only into a cache of its own
(`SweepCache`) and deletes there only what it noted downloading, each revision once recorded;
your hub cache is read, never written or deleted in (``keep_checkpoints=True`` downloads into
it instead and deletes nothing).  A killed sweep resumes without re-recording or
re-downloading a whole file.  The rules, the disk it needs and what it costs: docs/scale.md,
"A whole sweep on one machine".

>>> [checkpoint.step for checkpoint, error in Ahead([], None)]
[]
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path

from tqdm.auto import tqdm

from scansnap_lens._io import (
    create_locked,
    make_folder,
    open_lock,
    read_small,
    refuse_link,
    write_text,
)
from scansnap_lens.models import hub
from scansnap_lens.models.checkpoints import Checkpoint, CheckpointSource
from scansnap_lens.models.formats import WEIGHT_SUFFIXES, CheckpointError
from scansnap_lens.recording.budget import size_text
from scansnap_lens.recording.settings import ON_DISK

try:
    import fcntl
except ImportError:  # not POSIX: one sweep per cache is then the user's to keep
    fcntl = None

__all__ = [
    "Ahead",
    "DiskError",
    "DuplicateWeightsError",
    "HubRevisions",
    "ReadAhead",
    "SweepCache",
    "same_weights",
]

CACHE = "hub-cache"  # the sweep's own cache, in the recording folder unless named
_READ_CHUNK = 1 << 23
_SAMPLE = 1 << 20  # bytes of each piece a local weights file is first compared by


class DiskError(OSError):
    """The disk that holds the sweep's downloads cannot hold what the sweep needs."""


def _free_bytes(path: Path) -> int:
    while not path.exists():  # the cache folder may not exist yet
        path = path.parent
    return shutil.disk_usage(path).free


def _same_or_inside(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents or a in b.parents


class SweepCache:
    """A hub cache the sweep owns, and in it only what the sweep made.

    The folder is the sweep's where it made it or found it empty, and marked it with
    ``.scansnap-sweep-cache`` holding an id the recording folder keeps too
    (``.scansnap-sweep-id``): a marked folder whose id is not the recording's (another
    recording's downloads, a copy from elsewhere) is refused, never cleaned.  In it, each
    revision the sweep downloads is noted before its first byte (`note`, under
    ``.scansnap-made/``), and only a noted revision at its noted commit is ever deleted
    (`delete`).  When nothing noted is left, `close` removes the notes, the folders that are
    empty, the mark, and the folder if the sweep made it: a file the sweep did not make
    stays where it is.  Held by one sweep at a time (an flock on the mark, released when the
    process ends, so a killed sweep leaves no stale lock)."""

    MARK = ".scansnap-sweep-cache"
    MADE = ".scansnap-made"
    ID = ".scansnap-sweep-id"  # in the recording folder

    def __init__(self, folder: str | Path, recording: str | Path | None = None):
        self.folder = Path(folder)
        self.recording = None if recording is None else Path(recording)
        self._handle = None

    def open(self) -> SweepCache:
        folder, mark = self.folder, self.folder / self.MARK
        refuse_link(folder)
        if _same_or_inside(folder, hub.cache_dir()):
            raise ValueError(
                f"{folder} is (or holds, or is inside) your hub cache {hub.cache_dir()}: the"
                " sweep downloads into a folder of its own (download_dir=)"
            )
        if folder.exists() and not folder.is_dir():
            raise ValueError(
                f"{folder} is a file: the sweep downloads into a folder (download_dir=)"
            )
        if self.recording is not None and folder.resolve() != (self.recording / CACHE).resolve():
            if _same_or_inside(folder, self.recording):
                raise ValueError(
                    f"{folder} is (or holds, or is inside) the recording folder"
                    f" {self.recording}: the sweep deletes what it downloads, so its folder"
                    f" (download_dir=) is one apart from the recording's files (default:"
                    f" {self.recording / CACHE})"
                )
        own = self._recording_id()
        if mark.is_file():
            return self._held(mark, own)
        if folder.exists() and any(folder.iterdir()):
            if all(p.name.startswith(f".{self.MARK}.") for p in folder.iterdir()):
                raise ValueError(
                    f"{folder} is being opened by another sweep now: give this one"
                    " another download folder (download_dir=), or wait"
                )
            raise ValueError(
                f"{folder} holds files the sweep did not put there: name an empty or new folder"
                " for its downloads (download_dir=); it deletes what it downloads"
            )
        made = not folder.exists()
        make_folder(folder)
        own = own or uuid.uuid4().hex
        if self.recording is not None:
            write_text(self.recording / self.ID, own + "\n")
        try:  # visible only once locked: of two sweeps opening it at once, one holds it
            self._handle = create_locked(
                mark,
                json.dumps(
                    {
                        "made_by": "scansnap_lens sweep",
                        "id": own,
                        "made_folder": made,
                        "recording": str(self.recording.resolve()) if self.recording else None,
                        "deletes": "only the revisions it noted in .scansnap-made",
                    }
                ),
            )
        except FileExistsError:  # another sweep marked it first: it is theirs, or ours resumed
            return self._held(mark, own)
        return self

    def _held(self, mark: Path, own: str | None) -> SweepCache:
        """The folder of an existing mark, locked, where the mark holds this recording's id:
        a sweep running now, or one of another recording, refused."""
        self._lock(mark)  # a sweep running now says so first
        theirs = _read_json(mark)
        if own is None or theirs.get("id") != own:
            self._handle.close()
            self._handle = None
            where = theirs.get("recording") or "another recording"
            raise ValueError(
                f"{self.folder} is the download folder of another sweep ({where}): name another"
                " folder for this one's downloads (download_dir=); the sweep deletes only"
                " what it downloaded itself"
            )
        return self

    def _lock(self, mark: Path) -> None:
        self._handle = open_lock(mark)
        if fcntl is not None:
            try:
                fcntl.flock(self._handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._handle.close()
                self._handle = None
                raise ValueError(
                    f"{self.folder} is the download folder of a sweep running now: give this"
                    " one another (download_dir=), or wait for it"
                ) from None

    def _recording_id(self) -> str | None:
        if self.recording is None:
            return None
        file = self.recording / self.ID
        if file.is_symlink() or not file.is_file():
            return None
        try:
            return read_small(file, "recording's id", 4096).strip() or None
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------ what the sweep made
    def _note_file(self, name: str, revision: str) -> Path:
        import hashlib

        key = hashlib.sha256(f"{name}@{revision}".encode()).hexdigest()[:32]
        return self.folder / self.MADE / f"{key}.json"

    def note(self, name: str, revision: str, commit: str) -> None:
        """`revision` of `name` (at `commit`) is about to download here: the sweep's own."""
        make_folder(self.folder / self.MADE)
        write_text(
            self._note_file(name, revision),
            json.dumps({"repo": name, "revision": revision, "commit": commit}),
        )

    def noted(self) -> list[dict]:
        """The revisions the sweep noted here, as noted: each note checked as the sweep
        writes it (`_note_of`); another file there is left alone with a warning."""
        made = self.folder / self.MADE
        if made.is_symlink() or not made.is_dir():
            return []
        return [n for p in sorted(made.glob("*.json")) if (n := _note_of(p))]

    def delete(self, name: str, revision: str, keep: set[str] = frozenset()) -> int:
        """Delete `revision` of `name` where the sweep noted it, at the noted commit (see
        `hub.delete_snapshot`); the bytes freed.  Not noted: nothing."""
        file = self._note_file(name, revision)
        note = _note_of(file) if file.is_file() else {}
        if note.get("repo") != name or note.get("revision") != revision:
            return 0
        return hub.delete_snapshot(self.folder, name, revision, keep, commit=note.get("commit"))

    def close(self, repos=(), remove_if_empty: bool = True) -> None:
        """Release it; where no noted revision is left on disk, remove what the sweep made
        for `repos` and the repositories it noted."""
        if self._handle is None:
            return
        try:
            if remove_if_empty:
                self._clear(set(repos))
        finally:
            self._handle.close()  # closing releases the flock
            self._handle = None

    def _clear(self, repos: set[str]) -> None:
        notes = self.noted()
        if any(
            hub.snapshot_in(self.folder, n["repo"], n["revision"], n.get("commit")) for n in notes
        ):
            return  # still to record: the resume reads them
        made = [self.folder / ".locks"]
        for name in repos | {n["repo"] for n in notes}:
            commits = {n.get("commit") for n in notes if n["repo"] == name} - {None}
            made += hub.remove_downloaded(self.folder, name, commits)
        for note in notes:
            self._note_file(note["repo"], note["revision"]).unlink(missing_ok=True)
        for root in [*made, self.folder / self.MADE]:  # its folders, where empty
            inside = root.rglob("*") if root.is_dir() and not root.is_symlink() else ()
            for path in sorted([*inside, root], key=lambda p: -len(p.parts)):
                if path.is_dir() and not path.is_symlink():
                    with contextlib.suppress(OSError):
                        path.rmdir()
        mark = _read_json(self.folder / self.MARK)
        hub.remove_cache_tag(self.folder)
        (self.folder / self.MARK).unlink(missing_ok=True)
        if self.recording is not None and self._recording_id() == mark.get("id"):
            (self.recording / self.ID).unlink(missing_ok=True)
        if mark.get("made_folder"):
            with contextlib.suppress(OSError):
                self.folder.rmdir()


def _note_of(path: Path) -> dict:
    """A note of `SweepCache.note` read from `path`: a hub repository name, a revision name
    and a commit id (40 hex digits, or none), each checked as its kind, since the notes name what is
    deleted; {} with a warning where the file is not such a note (a folder from elsewhere:
    a path as its commit, a list as its repository), which is then never used."""
    note = _read_json(path)
    repo, revision, commit = note.get("repo"), note.get("revision"), note.get("commit")
    problem = None
    if not (isinstance(repo, str) and hub.is_repo_name(repo)):
        problem = f"its repository {repo!r} is not a hub repository name"
    elif not (isinstance(revision, str) and hub.is_revision_name(revision)):
        problem = f"its revision {revision!r} is not a revision name"
    elif not (commit is None or (isinstance(commit, str) and hub.is_commit(commit))):
        problem = f"its commit {commit!r} is not a commit id (40 hex digits)"
    if problem is None:
        return {"repo": repo, "revision": revision, "commit": commit}
    warnings.warn(
        f"{path} is not a note the sweep wrote ({problem}): left as it is, and "
        "nothing it names is deleted",
        stacklevel=2,
    )
    return {}


def _read_json(path: Path) -> dict:
    """A small JSON object the sweep wrote, or {} where it is not one (a link, corrupt)."""
    try:
        if path.is_symlink():
            return {}
        value = json.loads(read_small(path, "sweep's note", 1 << 20))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class HubRevisions:
    """Fetches the hub revisions of a `CheckpointSource` from `pretrained`, by the sweep's
    rules (this module's docstring)."""

    writes = True  # its cache is in the recording folder by default

    def __init__(
        self,
        name: str,
        on_disk: int = ON_DISK,
        keep_checkpoints: bool = False,
        download_dir: str | Path | None = None,
    ):
        if on_disk < 1:
            raise ValueError(f"on_disk must be at least 1 (the revision recording), got {on_disk}")
        self.name, self.on_disk, self.keep = name, int(on_disk), keep_checkpoints
        self.download_dir = None if download_dir is None else Path(download_dir)
        self.cache: SweepCache | None = None  # held by the process that prepared the sweep
        self.folder: Path | None = None  # the sweep's own cache (also in a Ray worker's copy)
        self.infos: dict[str, hub.RevisionInfo] = {}  # revision -> what the hub lists
        self.held: dict[str, Path] = {}  # revision -> a snapshot in your cache, read only
        self._said_unlike: set[str] = set()  # revisions whose cached files differ, said once
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- what the hub lists
    def info(self, revision: str) -> hub.RevisionInfo:
        with self._lock:
            known = self.infos.get(revision)
        if known is None:
            known = hub.revision_info(self.name, revision)
            with self._lock:
                self.infos[revision] = known
        return known

    def list(self, checkpoints: list[Checkpoint]) -> None:
        """Ask the hub for every revision's commit and files once (offline: nothing)."""
        if hub.offline():
            return
        todo = [c.revision for c in checkpoints if c.revision not in self.infos]
        for revision in tqdm(todo, desc="listing revisions", unit="rev", delay=2):
            try:
                self.info(revision)
            except CheckpointError:  # its fetch raises it again, for the recorder to decide
                continue

    def weights_ids(self, checkpoints: list[Checkpoint]) -> dict[int, tuple]:
        """{step: content ids of its weights files} from the hub's listing (LFS sha256), or
        from the blobs' names of a cached snapshot offline; steps with neither left out."""
        self.list(checkpoints)
        out, local = {}, {}
        for c in checkpoints:
            info = self.infos.get(c.revision)
            if info is not None:
                out[c.step] = info.weights_id()
            elif (folder := self._on_disk(c.revision)) is not None:
                local[c.step] = _weights_files(folder)
        return {**out, **local_weights_ids(local)}

    # ---------------------------------------------------------------- where a revision is
    def _users(self, revision: str, verify: bool = True) -> Path | None:
        """The revision's snapshot in your hub cache, by ref or by commit, whole and (with
        `verify`) each file the content the hub lists (read, whether linked or plain:
        `hub.mismatched`; offline, a linked blob against its own name); or None.  A snapshot
        whose content differs is never read nor changed: said once naming the files (the
        revision is then downloaded into the sweep's own cache), and offline, where nothing
        else can be read, refused (CheckpointError)."""
        info = self.infos.get(revision)
        commit, files = (None, None) if info is None else (info.commit, info.files)
        cache = hub.cache_dir()
        folder = hub.snapshot_in(cache, self.name, revision, commit, files, check=False)
        if folder is None or not verify:
            return folder
        bad = hub.mismatched(folder, None if info is None else info.ids)
        if not bad:
            return folder
        said = (
            f"{self.name}@{revision}: {', '.join(bad)} in your hub cache ({folder}) is not"
            " the file the hub lists (its content's hash differs)"
        )
        if hub.offline():
            raise CheckpointError(
                f"{said}: remove that revision from your cache"
                " (huggingface-cli delete-cache) and record again"
            )
        if revision not in self._said_unlike:
            self._said_unlike.add(revision)
            warnings.warn(
                f"{said}: not read; downloading it into the sweep's own cache", stacklevel=2
            )
        return None

    def _ours(self, revision: str) -> Path | None:
        return None if self.folder is None else self._snapshot(self.folder, revision)

    def _snapshot(self, cache: Path, revision: str) -> Path | None:
        info = self.infos.get(revision)
        if info is None:  # offline: as the cache has it
            return hub.snapshot_in(cache, self.name, revision)
        return hub.snapshot_in(cache, self.name, revision, info.commit, info.files, info.ids)

    def _on_disk(self, revision: str) -> Path | None:
        return self._users(revision) or self._ours(revision)

    # ---------------------------------------------------------------- the fetcher protocol
    def prepare(self, todo: list[Checkpoint], done: set[int], folder: Path) -> None:
        """Before the first fetch: open the sweep's cache and delete from it every revision
        not still to record (a killed run's), find the revisions your cache holds, and
        refuse a sweep the disk cannot hold."""
        place = self.download_dir or Path(folder) / CACHE
        if not self.keep or place.exists():
            self.cache = SweepCache(place, folder).open()
            self.folder = self.cache.folder
            hub.refuse_linked(self.folder, self.name)  # a prepared folder's links
            hub.remove_orphans(self.name, self.folder)  # a killed download's: anew
            wanted = {c.revision for c in todo}
            for note in self.cache.noted():
                if note["repo"] == self.name and note["revision"] not in wanted:
                    self.cache.delete(self.name, note["revision"])
        self.list(todo)
        for c in todo:
            users = self._users(c.revision, verify=False)  # read when it is fetched
            if users is not None:
                self.held[c.revision] = users
        missing = [
            c for c in todo if c.revision not in self.held and self._ours(c.revision) is None
        ]
        listed = [c for c in missing if c.revision in self.infos]  # the others fail to fetch
        if not listed or hub.offline():
            return
        one = sum(self.infos[listed[0].revision].files.values())
        target = hub.cache_dir() if self.keep else self.folder
        held = len(missing) if self.keep else min(self.on_disk, len(missing))
        free = _free_bytes(target)
        if held * one > free:
            raise DiskError(self._too_small(listed[0].revision, one, held, free, target))
        where = "your hub cache, kept" if self.keep else f"{target}, each deleted once recorded"
        tqdm.write(
            f"sweep: {len(missing)} revisions of {self.name} to download, about"
            f" {size_text(one)} each ({size_text(one * len(missing))} in all); at most"
            f" {held} on disk at once ({size_text(held * one)}; {size_text(free)} free), into"
            f" {where}; {len(self.held)} read from your hub cache"
        )

    def _too_small(self, revision: str, one: int, held: int, free: int, target: Path) -> str:
        how = "(keep_checkpoints keeps every one)" if self.keep else "at once (on_disk=)"
        start = (
            f"{self.name}: a revision is {size_text(one)} ({revision}), and {held} on disk"
            f" {how} need {size_text(held * one)}; the disk of {target} has {size_text(free)}"
            " free:"
        )
        if self.keep:
            return (
                f"{start} free space, point HF_HUB_CACHE at a larger disk, or record without"
                f" keep_checkpoints=True: then at most {self.on_disk} on disk at"
                f" once, {size_text(self.on_disk * one)}"
            )
        fewer = " keep one on disk at a time (on_disk=)," if self.on_disk > 1 else ""
        return f"{start} free space,{fewer} or put the downloads on a larger disk (download_dir=)"

    def fetch(self, checkpoint: Checkpoint) -> None:
        revision = checkpoint.revision
        if revision is None:
            return
        found = self.held.get(revision)
        if found is not None and self._users(revision) is None:  # its content, read once now
            del self.held[revision]
            found = None
        found = found or self._ours(revision)
        if found is not None:
            checkpoint.path = found
            return
        if hub.offline():  # neither cache holds it: the error names what to download
            hub.fetch_revision(self.name, revision, cache=hub.cache_dir())
        files = self.info(revision).files
        target = hub.cache_dir() if self.keep else self.folder
        need = sum(files.values())
        free = _free_bytes(target)
        if need > free:
            raise DiskError(
                f"{self.name}@{revision} needs {size_text(need)}, the disk of {target} has"
                f" {size_text(free)} free: free space and run again to resume"
            )
        info = self.info(revision)
        if not self.keep:
            self._own().note(self.name, revision, info.commit)
        stale = hub.repo_folder(self.name, target) / "snapshots" / info.commit
        bad = hub.mismatched(stale, info.ids) if stale.is_dir() else []
        if bad and self.keep:
            raise CheckpointError(
                f"{self.name}@{revision}: your hub cache's snapshot {stale} holds"
                f" {', '.join(bad)} unlike the hub's listing: delete it, or record without"
                " keep_checkpoints=True (then it is downloaded into the sweep's own cache)"
            )
        for file in bad:  # not what the hub lists: fetched again, not read through
            (stale / file).unlink()  # a link in the sweep's own cache
        checkpoint.path = hub.fetch_revision(self.name, revision, files, cache=target)

    def release(self, checkpoint: Checkpoint) -> None:
        """Delete `checkpoint`'s revision from the sweep's cache (it is recorded), keeping the
        blobs another revision of the sweep lists (revisions share blobs, the same
        config.json, which a download running now may be linking to) and a snapshot another
        revision resolves to (the same commit); those go with the cache at the end."""
        revision, checkpoint.path = checkpoint.revision, None
        if revision is None or self.keep or self.folder is None or revision in self.held:
            return
        with self._lock:
            others = [info for other, info in self.infos.items() if other != revision]
            commit = getattr(self.infos.get(revision), "commit", None)
        if commit is not None and any(info.commit == commit for info in others):
            return
        shared = {i for info in others for i in info.ids.values()}
        self._own().delete(self.name, revision, keep=shared)

    def _own(self) -> SweepCache:
        """The sweep's cache: the one this process holds, or (a Ray worker) its folder."""
        return self.cache or SweepCache(self.folder)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close(repos=[self.name])

    def __getstate__(self) -> dict:
        """What a Ray worker fetches with: the caches and the hub's listing, not the lock on
        the sweep's cache (its process keeps that) nor the thread lock.  Workers download
        into the same folder, each deleting its own revision once recorded but no blob that
        another revision of the sweep lists (a config.json they share, which another
        worker's download may be linking to); those go with the folder at the end."""
        return {**self.__dict__, "cache": None, "_lock": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


class ReadAhead:
    """Reads a local checkpoint's files through before it loads (the page cache keeps them),
    so slow or network storage reads the next checkpoint while this one records."""

    on_disk = 2

    def prepare(self, todo, done, folder) -> None:
        pass

    def fetch(self, checkpoint: Checkpoint) -> None:
        path = checkpoint.path
        if path is None:
            return
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            try:
                with open(file, "rb", buffering=0) as handle:
                    while handle.read(_READ_CHUNK):
                        pass
            except OSError:
                return  # loading says what is wrong with it

    def release(self, checkpoint: Checkpoint) -> None:
        pass

    def close(self) -> None:
        pass

    def weights_ids(self, checkpoints: list[Checkpoint]) -> dict[int, tuple]:
        """{step: content ids of its weights files} (`local_weights_ids`)."""
        return local_weights_ids(
            {c.step: _weights_files(c.path) for c in checkpoints if c.path is not None}
        )


def _weights_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(
        p
        for p in path.iterdir()
        if p.is_file()
        and p.name.startswith(("model", "pytorch_model"))
        and p.name.endswith(WEIGHT_SUFFIXES)
    )


def local_weights_ids(files: dict[int, list[Path]]) -> dict[int, tuple]:
    """{step: content ids of its weights `files`}: a link into a hub cache's blobs by the
    blob's name (content-addressed: its sha256); any other file, or a link elsewhere (named
    by whatever its target is called), by a sample (its size and three 1 MiB pieces), then
    by its whole sha256 where samples agree, so distinct checkpoints read a few MiB each."""

    def quick(file: Path) -> str:
        blob = _hub_blob(file)
        return "blob:" + blob.name if blob is not None else _sample_id(file)

    sampled = {step: tuple(quick(f) for f in fs) for step, fs in files.items() if fs}
    counts: dict[tuple, int] = {}
    for key in sampled.values():
        counts[key] = counts.get(key, 0) + 1
    return {
        step: tuple(
            hub.content_id(f) if k.startswith("sample:") else k for f, k in zip(files[step], key)
        )
        if counts[key] > 1
        else key
        for step, key in sampled.items()
    }


def _hub_blob(file: Path) -> Path | None:
    """The blob `file` links to where it is a hub cache's snapshot file (a link to
    ``models--*/blobs/<sha256>``), else None."""
    if not file.is_symlink():
        return None
    target = file.resolve()
    named = re.fullmatch(r"[0-9a-f]{64}", target.name) is not None
    in_blobs = target.parent.name == "blobs" and target.parent.parent.name.startswith("models--")
    return target if named and in_blobs else None


def _sample_id(file: Path) -> str:
    import hashlib

    size = file.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(file, "rb") as handle:
        for start in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
            handle.seek(start)
            digest.update(handle.read(_SAMPLE))
    return "sample:" + digest.hexdigest()


class DuplicateWeightsError(CheckpointError):
    """Checkpoints under different steps whose weights files are identical."""


def same_weights(ids: dict[int, tuple]) -> list[list[int]]:
    """Groups of steps (ascending, each of 2 or more) whose weights ids are equal.

    >>> same_weights({0: ("a",), 1: ("a",), 2: ("b",), 4: ("a",)})
    [[0, 1, 4]]
    """
    groups: dict[tuple, list[int]] = {}
    for step in sorted(ids):
        if ids[step]:
            groups.setdefault(ids[step], []).append(step)
    return [g for g in groups.values() if len(g) > 1]


def describe_duplicates(name: str, groups: list[list[int]], total: int) -> str:
    """One plain paragraph: which steps serve which step's weights."""
    dup = sum(len(g) - 1 for g in groups)
    parts = []
    for group in groups[:4]:
        shown = ", ".join(str(s) for s in group[:-1][:8]) + (", ..." if len(group) > 9 else "")
        parts.append(f"steps {shown} ({len(group) - 1}) serve the weights of step {group[-1]}")
    more = f"; and {len(groups) - 4} more groups" if len(groups) > 4 else ""
    return (
        f"{name}: {dup} of {total} checkpoints serve weights identical to another step's"
        f" (the same content hash of their weights files): {'; '.join(parts)}{more}.  A snap"
        " or formation measured over them would be an artefact of the files, not of training"
    )


def fetcher_for(
    source: CheckpointSource, on_disk: int = ON_DISK, keep_checkpoints=False, download_dir=None
):
    """The fetcher of `source`: hub revisions, local files, or None (models in memory)."""
    if any(c.revision is not None for c in source.checkpoints):
        return HubRevisions(source.name, on_disk, keep_checkpoints, download_dir)
    if any(c.path is not None for c in source.checkpoints):
        return ReadAhead()
    return None


def _lower_priority() -> None:
    """This thread yields the CPU to the recording (Linux: a thread has its own nice value):
    fetching waits on the network or the disk, recording on the CPU."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # not Linux, or not allowed: the same sweep, less overlap
        pass


class Ahead:
    """(checkpoint, error) of `checkpoints` in order, each fetched by `fetcher` in one
    background thread while the caller records the one before; at most ``fetcher.on_disk``
    fetched and not yet `done` at once.  error: what fetching raised, or None.  Call `done`
    after each checkpoint (its files are released) and `close` at the end.
    """

    def __init__(self, checkpoints: Iterable[Checkpoint], fetcher):
        self.checkpoints = list(checkpoints)
        self.fetcher = fetcher
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._slots = threading.Semaphore(fetcher.on_disk if fetcher is not None else 1)
        self._thread = None
        if fetcher is not None and self.checkpoints:
            self._thread = threading.Thread(target=self._run, name="scansnap-fetch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        _lower_priority()
        for checkpoint in self.checkpoints:
            while not self._slots.acquire(timeout=0.1):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            try:
                self.fetcher.fetch(checkpoint)
                self._queue.put((checkpoint, None))
            except BaseException as err:  # handed to the recording thread, which decides
                self._queue.put((checkpoint, err))

    def __iter__(self):
        for checkpoint in self.checkpoints:
            if self._thread is None:
                yield checkpoint, None
                continue
            item, error = self._queue.get()
            yield item, error

    def __len__(self) -> int:
        return len(self.checkpoints)

    def done(self, checkpoint: Checkpoint) -> None:
        """`checkpoint` is recorded (or skipped): release its files and its slot."""
        if self.fetcher is None:
            return
        try:
            self.fetcher.release(checkpoint)
        finally:
            self._slots.release()

    def close(self) -> None:
        """Stop fetching ahead; a download in flight finishes in the background (it is in
        the sweep's own cache, so the next run deletes it unless it is still to record)."""
        self._stop.set()

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
