"""One safe writer for every file the package writes (safetensors with a format tag, text,
bytes): a unique temporary, no link followed, an atomic rename; its folders and lock files
likewise; and the reader of tagged safetensors files."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from glob import escape as glob_escape
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor

try:
    import fcntl
except ImportError:  # not POSIX: a killed stage stays until removed by hand
    fcntl = None


def check_writable(path: str | Path) -> None:
    """OSError naming `path` unless a file or folder can be made there: checked before a long
    run, by making and removing a temporary file in the nearest folder that exists."""
    path = Path(path).absolute()
    folder = path if path.is_dir() else path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise OSError(f"cannot write {path}: {folder} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".scansnap-probe-")
    except OSError as err:
        raise OSError(
            f"cannot write {path}: {folder} takes no new files ({err.strerror or err})"
        ) from None
    os.close(fd)
    os.unlink(probe)


def refuse_link(path: str | Path) -> None:
    """ValueError naming `path` where it, or the folder it is in, is a symbolic link: a
    folder from someone else (a shared folder, an unpacked archive) could hold links at the
    names a writer opens, and writing through one overwrites whatever it points to."""
    path = Path(path)
    for p in (path, path.parent):
        if p.is_symlink():
            raise ValueError(
                f"{p} is a symbolic link: scansnap_lens does not write through links (it could"
                f" point anywhere); remove it, or write into a real folder"
            )


def make_folder(path: str | Path) -> Path:
    """The folder `path` (and its parents), refused where it is a symbolic link."""
    path = Path(path)
    refuse_link(path)
    path.mkdir(parents=True, exist_ok=True)
    refuse_link(path)  # made between the check and the mkdir
    return path


STAGE_LOCK = ".scansnap-staging.lock"  # held while a stage fills; not moved into the folder
STAGE_MARK = "scansnap_lens stage"  # what the tool writes into its stages' lock: only those go
JOURNAL = ".scansnap-journal.json"  # the move-in's list, while it runs: a kill rolls back
_OLD = ".scansnap-old"  # in a stage: the files the move-in replaced, until it is done


@contextmanager
def staged_folder(out: str | Path) -> Iterator[Path]:
    """A hidden folder beside `out` to fill in its place: once the block ends without an
    error, its files move into `out` all or nothing (each replacing its namesake and no
    other file of `out`; where one cannot move, those moved go back and the old ones return);
    on any error, Ctrl-C or SIGTERM (the command line turns it into an interrupt) it is
    removed and `out` stays as it was.  A stage is the tool's by the mark in its lock file;
    one a killed process left (its lock free) is removed by the next one, and a move-in it
    left half done is rolled back from its journal first (the old files return).  A folder
    of a user's named like a stage is never touched; two move-ins into one `out` take turns."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder: name another")
    check_writable(out)
    make_folder(out.parent)
    _remove_stale_stages(out)
    # made under another name and renamed once locked: a stage seen by its name always
    # has its lock, so a kill at any moment leaves one that the next process can remove
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".new", dir=out.parent))
    lock = None
    try:
        write_text(stage / STAGE_LOCK, json.dumps({"made_by": STAGE_MARK, "pid": os.getpid()}))
        lock = open_lock(stage / STAGE_LOCK)
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        named = stage.with_suffix(".partial")
        os.rename(stage, named)
        stage = named
        yield stage
        files = sorted(p for p in stage.rglob("*") if p.is_file() and p.name != STAGE_LOCK)
        make_folder(out)
        with _taking_turns(out):
            _move_in(stage, files, out)
            _fsync(out)
    finally:
        if lock is not None:
            lock.close()
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def _taking_turns(out: Path) -> Iterator[None]:
    """An exclusive lock on the folder `out` itself (no file of its own): two move-ins into
    one folder run one after the other."""
    fd = os.open(out, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _move_in(stage: Path, files: list[Path], out: Path) -> None:
    """Move `files` of `stage` into `out` at their places, all or nothing: a journal in the
    stage lists them first (what a kill midway leaves for `_roll_back`), and goes once all
    are in."""
    targets = [out / p.relative_to(stage) for p in files]
    for target in targets:  # what would stop it midway, found before anything moves
        refuse_link(target)
        for folder in [target, *target.parents]:
            if folder == out.parent:
                break
            if folder != target and folder.exists() and not folder.is_dir():
                raise NotADirectoryError(f"cannot write {target}: {folder} is a file")
        if target.is_dir():
            raise IsADirectoryError(
                f"cannot write {target}: a folder of that name is in the way; move it, or"
                " write elsewhere"
            )
    old = stage / _OLD
    journal = [[p.relative_to(stage).as_posix(), t.exists()] for p, t in zip(files, targets)]
    write_text(stage / JOURNAL, json.dumps(journal))
    made, moved = [], []  # folders made; (target, its old file or None)
    try:
        for path, target in zip(files, targets):
            missing = [f for f in [target.parent, *target.parents] if not f.exists()]
            make_folder(target.parent)
            made += reversed(missing)
            backup = None
            if target.exists():
                backup = old / target.relative_to(out)
                make_folder(backup.parent)
                os.replace(target, backup)
            moved.append((target, backup))
            os.replace(path, target)
    except BaseException:
        for target, backup in reversed(moved):
            if backup is not None:
                os.replace(backup, target)
            else:
                target.unlink(missing_ok=True)
        for folder in reversed(made):
            with suppress(OSError):
                folder.rmdir()
        raise
    (stage / JOURNAL).unlink()  # all in: a kill from here on leaves nothing to undo


def _roll_back(stage: Path, out: Path) -> None:
    """Undo a move-in a killed process left half done, from the stage's journal: each old
    file back in its place, each new one it had moved in (where none was before) removed."""
    try:
        entries = json.loads(read_small(stage / JOURNAL, "move-in's journal"))
    except (OSError, ValueError):
        return
    if not isinstance(entries, list):
        return
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            continue
        name, had_old = entry
        relative = Path(name)
        if relative.is_absolute() or ".." in relative.parts:  # never outside the folder
            continue
        target, backup = out / relative, stage / _OLD / relative
        if backup.is_file() and not backup.is_symlink():
            refuse_link(target)
            os.replace(backup, target)
        elif had_old is False and not (stage / relative).exists() and target.is_file():
            target.unlink()


def _is_stage(stage: Path) -> bool:
    """Whether `stage` is one the tool made: its lock file holds the tool's mark."""
    try:
        mark = json.loads(read_small(stage / STAGE_LOCK, "stage's lock", limit=4096))
    except (OSError, ValueError):
        return False
    return isinstance(mark, dict) and mark.get("made_by") == STAGE_MARK


STALE_NEW_S = 60  # a stage not yet locked, older than this, was left by a kill


def _age_s(path: Path) -> float:
    """Seconds since `path` last changed (inf where it is gone)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _remove_stale_stages(out: Path) -> None:
    """Remove the stages beside `out` that no process fills (a kill's leftovers), a move-in
    they left half done rolled back first; only the tool's own (`_is_stage`), and an empty
    one a kill left before its mark, by its age."""
    if fcntl is None:
        return
    name = glob_escape(out.name)
    for stage in [*out.parent.glob(f".{name}.*.partial"), *out.parent.glob(f".{name}.*.new")]:
        if stage.is_symlink() or not stage.is_dir():
            continue
        # a `.new` stage is marked a moment before it is locked (and renamed): one seen marked
        # and unlocked may be another writer's between the two, so only its age says stale
        young = stage.suffix == ".new" and _age_s(stage) < STALE_NEW_S
        if young:
            continue
        if not _is_stage(stage):  # a user's folder of that name, or one killed before its mark
            with suppress(OSError):
                if _age_s(stage) > STALE_NEW_S:
                    stage.rmdir()  # only where empty
            continue
        try:
            handle = open_lock(stage / STAGE_LOCK)
        except (OSError, ValueError):
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a process is filling it now
            handle.close()
            continue
        try:
            if (stage / JOURNAL).is_file() and out.is_dir():
                with _taking_turns(out):
                    _roll_back(stage, out)
        finally:
            handle.close()
        shutil.rmtree(stage, ignore_errors=True)


def open_lock(path: str | Path):
    """A lock file opened for reading and writing, made if missing, never through a link
    (O_NOFOLLOW): the open file object."""
    path = Path(path)
    refuse_link(path)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            refuse_link(path)  # names the link
        raise OSError(f"cannot open the lock {path}: {err.strerror or err}") from None
    return os.fdopen(fd, "r+")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a directory; the rename still holds
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_bytes(path: str | Path, data: bytes) -> Path:
    """The one writer of the package: `data` into a new temporary file of a unique name in
    the target's folder (``mkstemp``: O_CREAT | O_EXCL, so no link planted at a name can be
    followed), synced, then renamed onto `path` (the rename replaces a name, never writes
    through it) and the rename synced.  Readers never see half a file; a crash, a full disk
    or power loss leaves the old file or the new one, and no temporary file behind (but
    for a kill).  The file gets the permissions of a plain ``open`` (0644 under the usual
    umask).  ValueError where `path` or its folder is a symbolic link."""
    path = Path(path)
    refuse_link(path)
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise OSError(f"cannot write {path}: {err.strerror or err}") from None
    try:
        try:
            _write_all(fd, data)
            os.fchmod(fd, 0o666 & ~_umask())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and not isinstance(err, IsADirectoryError):
            raise OSError(f"cannot write {path}: {err.strerror or err}") from None
        raise
    _fsync(path.parent)
    return path


def create_locked(path: str | Path, text: str):
    """`path` made with `text` where no file has that name yet, locked (``flock``, exclusive)
    before it is visible: written, synced and locked under a temporary name, then linked to
    `path` (a link never replaces a name).  The open, locked file; FileExistsError where
    another process made `path` first.  Two processes making one mark at once: one holds
    it, the other sees it made and locked (a rename made the second replace the first's
    mark, and both held a lock)."""
    path = Path(path)
    refuse_link(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        _write_all(fd, text.encode("utf-8"))
        os.fchmod(fd, 0o666 & ~_umask())
        os.fsync(fd)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no one else has the file yet
        os.link(tmp, path)
    except BaseException:
        os.close(fd)
        raise
    finally:
        Path(tmp).unlink(missing_ok=True)
    _fsync(path.parent)
    return os.fdopen(fd, "r+")


def write_tensors(path: str | Path, tensors: dict[str, Tensor], metadata: dict[str, str]) -> Path:
    """A safetensors file through `write_bytes`."""
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
    return write_bytes(path, data)


def write_text(path: str | Path, text: str) -> Path:
    """`write_bytes` for text (UTF-8)."""
    return write_bytes(path, text.encode("utf-8"))


def read_tensors(path: str | Path, fmt: str, what: str) -> tuple[dict, dict[str, Tensor]]:
    """(metadata, tensors) of a file tagged ``format = fmt``; clear errors naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {what} at {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = handle.metadata() or {}
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{path} is not a {what} (corrupt or truncated: {err})") from None
    if meta.get("format") != fmt:
        raise ValueError(f"{path} is not a {what} (format={meta.get('format')!r})")
    return meta, tensors


SMALL_FILE = 64 << 20  # a note, manifest or saved analysis's index: far below this


class NotAFile(OSError):
    """A path that should hold a small regular file holds something else (a FIFO, a device,
    a folder) or more bytes than such a file has."""


def read_small(path: str | Path, what: str, limit: int = SMALL_FILE) -> str:
    """The text of `path` (`read_small_bytes`, decoded as UTF-8: `NotAFile` where it is not)."""
    try:
        return read_small_bytes(path, what, limit).decode("utf-8")
    except UnicodeDecodeError as err:
        raise NotAFile(f"{path} should be the {what}, text; it is not UTF-8 ({err})") from None


def read_small_bytes(path: str | Path, what: str, limit: int = SMALL_FILE) -> bytes:
    """The bytes of `path`, read only where it is a regular file of at most `limit` bytes
    (a FIFO would block for ever, /dev/zero or a sparse file exhaust memory): `NotAFile`
    naming the file and what it should hold otherwise.  Links are followed, as a reader of
    a folder someone else made must; the file is checked once open (not between)."""
    import stat

    path = Path(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens at once
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(f"{path} should be the {what}, a file; it is not a regular file")
        if info.st_size > limit:
            raise NotAFile(
                f"{path} should be the {what}, a file of at most {limit:,} bytes;"
                f" it holds {info.st_size:,}"
            )
        with os.fdopen(fd, "rb", closefd=True) as handle:
            fd = -1
            data = handle.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)
    if len(data) > limit:
        raise NotAFile(f"{path} should be the {what}, a file of at most {limit:,} bytes")
    return data


def check_kinds(values: dict, kinds: dict[str, type], what: str) -> None:
    """Each of `kinds`' keys in `values` (read from a file) of its kind; ValueError naming the
    first that is missing or of another (``what`` lacks 'key', or has no list as 'key').

    >>> check_kinds({"layers": "0"}, {"layers": list}, "the manifest")
    Traceback (most recent call last):
    ValueError: the manifest has no list as 'layers' (hand-edited?)
    """
    for key, kind in kinds.items():
        if not isinstance(values.get(key), kind):
            lacks = "lacks" if key not in values else f"has no {kind.__name__} as"
            raise ValueError(f"{what} {lacks} '{key}' (hand-edited?)")


def read_json(path: str | Path, what: str, limit: int = SMALL_FILE):
    """`read_small` parsed as JSON (`json.JSONDecodeError`, a ValueError, where it is not)."""
    import json

    return json.loads(read_small(path, what, limit))


def regular_file(path: str | Path, what: str, limit: int | None = SMALL_FILE) -> Path:
    """`path` where it is a regular file (of at most `limit` bytes; None: any size), else
    `NotAFile` naming it: checked before a reader that would block on a FIFO opens it."""
    import stat

    path = Path(path)
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotAFile(f"{path} should be the {what}, a file; it is not a regular file")
    if limit is not None and info.st_size > limit:
        raise NotAFile(
            f"{path} should be the {what}, a file of at most {limit:,} bytes;"
            f" it holds {info.st_size:,}"
        )
    return path
