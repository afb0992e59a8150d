"""A sweep: checkpoints brought onto disk ahead of the recorder, at most `on_disk` at a time.

While checkpoint k records, one background thread fetches checkpoint k+1: it downloads a
hub revision into the Hugging Face cache, or reads a local checkpoint's files through (warm in
the page cache, for slow or network storage).  A sweep's wall time then nears the larger of
fetching and recording, not their sum.

A hub sweep keeps at most `on_disk` revisions of its own on disk (default 2: the one
recording and the one downloading) and deletes each revision it downloaded once recorded,
blobs shared with other snapshots aside.  A revision that was in the cache before the sweep
is never deleted: ``downloads.json`` in the recording folder names the revisions the sweep
downloaded itself (written before each download starts), so a killed sweep resumes knowing
them: it re-records nothing (the manifest), re-downloads no file it had whole (the cache),
deletes what it had recorded but not yet deleted, and removes the partial file a killed
download left (`huggingface_hub` >= 1.0 writes each download to a name of its own and never
resumes one: that file downloads anew).  ``keep_checkpoints=True`` deletes nothing.  It
refuses to start, with sizes, where the cache's disk cannot hold `on_disk` revisions.

>>> [checkpoint.step for checkpoint, error in Ahead([], None)]
[]
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from tqdm.auto import tqdm

from scansnap_lens._io import refuse_link, write_text
from scansnap_lens.models import hub
from scansnap_lens.models.checkpoints import Checkpoint, CheckpointError, CheckpointSource
from scansnap_lens.recording.budget import size_text

__all__ = ["ON_DISK", "Ahead", "DiskError", "HubRevisions", "ReadAhead", "fetcher_for"]

ON_DISK = 2  # revisions of a hub sweep on disk at once: the one recording, the next
DOWNLOADS = "downloads.json"  # in the recording folder: revisions the sweep downloaded
_READ_CHUNK = 1 << 23


class DiskError(OSError):
    """The disk that holds the hub cache cannot hold what the sweep needs."""


def _free_bytes(path: Path) -> int:
    while not path.exists():  # the cache folder may not exist yet
        path = path.parent
    return shutil.disk_usage(path).free


class HubRevisions:
    """Fetches and deletes the hub revisions of a `CheckpointSource` from `pretrained`."""

    writes = True  # downloads.json in the recording folder

    def __init__(self, name: str, on_disk: int = ON_DISK, keep_checkpoints: bool = False):
        if on_disk < 1:
            raise ValueError(f"on_disk must be at least 1 (the revision recording), got {on_disk}")
        self.name, self.on_disk, self.keep = name, int(on_disk), keep_checkpoints
        self.ours: set[str] = set()  # revisions this sweep downloaded and has not deleted
        self._file: Path | None = None
        self._lock = threading.Lock()
        self._sizes: dict[str, dict[str, int]] = {}

    # ---------------------------------------------------------------- bookkeeping
    def _save(self) -> None:
        if self._file is not None:
            data = {"repo": self.name, "cache": str(hub.cache_dir())}
            data["revisions"] = sorted(self.ours)
            write_text(self._file, json.dumps(data, indent=1))

    def _load(self, folder: Path) -> None:
        """The revisions an earlier sweep into `folder` downloaded into this same cache: a
        file naming another repository or cache (a folder from elsewhere) deletes nothing."""
        self._file = folder / DOWNLOADS
        refuse_link(self._file)  # what it names gets deleted: never read through a link
        if not self._file.is_file():
            return
        try:
            data = json.loads(self._file.read_text())
            ours = data.get("repo") == self.name and data.get("cache") == str(hub.cache_dir())
            self.ours = {str(r) for r in data["revisions"]} if ours else set()
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{self._file}: cannot read which revisions the sweep downloaded ({err}):"
                " remove the file (revisions it named then stay in the hub cache)"
            ) from None

    def _files(self, revision: str) -> dict[str, int]:
        if revision not in self._sizes:
            self._sizes[revision] = hub.revision_files(self.name, revision)
        return self._sizes[revision]

    # ---------------------------------------------------------------- the fetcher protocol
    def prepare(self, todo: list[Checkpoint], done: set[int], folder: Path) -> None:
        """Before the first fetch: delete what a killed sweep recorded but kept, and refuse
        a sweep the cache's disk cannot hold."""
        self._load(folder)
        hub.remove_orphans(self.name)  # what a killed download left: it resumes anew
        recorded = {hub.revision_of(self.name, step) for step in done}
        for revision in sorted(self.ours & recorded):
            self._release(revision)
        missing = [c for c in todo if c.revision is not None and self._downloads(c.revision)]
        if not missing or hub.offline():
            return
        sizes = self._files(missing[0].revision)
        one = sum(sizes.values())
        held = min(self.on_disk, len(missing)) if not self.keep else len(missing)
        free = _free_bytes(hub.cache_dir())
        if held * one > free:
            keep = (
                "--keep-checkpoints keeps every revision"
                if self.keep
                else f"{self.on_disk} on disk at once (on_disk, --on-disk)"
            )
            raise DiskError(
                f"{self.name}: a revision is {size_text(one)} ({missing[0].revision}), and"
                f" {keep} needs {size_text(held * one)}; the disk of the hub cache"
                f" {hub.cache_dir()} has {size_text(free)} free: free space, keep fewer"
                " revisions on disk (--on-disk 1), or point HF_HUB_CACHE at a larger disk"
            )
        tqdm.write(
            f"sweep: {len(missing)} revisions of {self.name} to download, about"
            f" {size_text(one)} each ({size_text(one * len(missing))} in all); at most"
            f" {held} on disk at once ({size_text(held * one)}; {size_text(free)} free)"
            + ("" if self.keep else ", each deleted once recorded")
        )

    def _downloads(self, revision: str) -> bool:
        """Whether fetching `revision` downloads: it is not in the cache, or half there."""
        return hub.cached_commit(self.name, revision) is None or revision in self.ours

    def fetch(self, checkpoint: Checkpoint) -> None:
        revision = checkpoint.revision
        if hub.offline() or revision is None:
            return  # offline, loading reads the cache (and names what is missing)
        if not self._downloads(revision):
            return  # cached before the sweep: loaded as it is, never deleted
        files = self._files(revision)
        with self._lock:
            if revision not in self.ours:
                self.ours.add(revision)
                self._save()  # before the first byte: a kill leaves it known as ours
        need = sum(files.values())
        free = _free_bytes(hub.cache_dir())
        if need > free:
            raise DiskError(
                f"{self.name}@{revision} needs {size_text(need)}, the disk of the hub cache has"
                f" {size_text(free)} free: free space and run again to resume"
            )
        hub.fetch_revision(self.name, revision, files)

    def release(self, checkpoint: Checkpoint) -> None:
        if checkpoint.revision is not None:
            self._release(checkpoint.revision)

    def _release(self, revision: str) -> None:
        if self.keep:
            return
        with self._lock:
            if revision not in self.ours:
                return
            hub.delete_revision(self.name, revision, self.ours)
            self.ours.discard(revision)
            self._save()


class ReadAhead:
    """Reads a local checkpoint's files through before it loads (the page cache keeps them),
    so slow or network storage reads the next checkpoint while this one records."""

    on_disk = 2
    writes = False

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


def fetcher_for(source: CheckpointSource, on_disk: int = ON_DISK, keep_checkpoints=False):
    """The fetcher of `source`: hub revisions, local files, or None (models in memory)."""
    if any(c.revision is not None for c in source.checkpoints):
        return HubRevisions(source.name, on_disk, keep_checkpoints)
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
        """Stop fetching ahead; a download in flight finishes in the background (its
        revision is named in ``downloads.json``, so a later sweep deletes it)."""
        self._stop.set()

    def __enter__(self) -> Ahead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
