"""One atomic writer for every file a result is saved in (safetensors with a format tag, text,
bytes), and the reader of tagged safetensors files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
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


def _commit(tmp: Path, path: Path) -> None:
    """Make `tmp` durable, rename it onto `path`, and make the rename durable.  The file gets
    the permissions of a plain ``open`` (0644 under the usual umask): some writers create
    their temporary files 0600, which would keep results from the rest of a team."""
    os.chmod(tmp, 0o666 & ~_umask())
    _fsync(tmp)
    os.replace(tmp, path)
    _fsync(path.parent)


def write_tensors(path: str | Path, tensors: dict[str, Tensor], metadata: dict[str, str]) -> Path:
    """Write to a temporary name, sync, then rename: readers never see half a file, and a
    crash or power loss leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
        _commit(tmp, path)
    except SafetensorError as err:  # safetensors reports a failed write (full, read-only) so
        tmp.unlink(missing_ok=True)
        raise OSError(f"cannot write {path}: {err}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """`write_tensors` for bytes (pages, figures, CSV, JSON).  A failed write (a full disk)
    leaves the old file as it was and no temporary file behind."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        _write_file(tmp, data)
        _commit(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


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
