"""One safe writer for every file the package writes (safetensors with a format tag, text,
bytes): a unique temporary, no link followed, an atomic rename; its folders and lock files
likewise; and the reader of tagged safetensors files."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor


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


@contextmanager
def staged_folder(out: str | Path) -> Iterator[Path]:
    """A hidden folder beside `out` to fill in its place: once the block ends without an
    error, each file in it moves into `out` (a rename, replacing its namesake and no other
    file of `out`); on any error or Ctrl-C it is removed and `out` stays as it was."""
    out = Path(out)
    make_folder(out.parent)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield stage
        for path in sorted(p for p in stage.rglob("*") if p.is_file()):
            target = out / path.relative_to(stage)
            make_folder(target.parent)
            refuse_link(target)
            os.replace(path, target)
        _fsync(out)
    finally:
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
