"""The trajectory folder on disk: its format, the tensor names, the writer, the locks, and the
lazy reader (the layout, what it costs and why float32: docs/trajectories.md).

The manifest lists the recorded aggregates (name, key, axis; for a rows aggregate its rows);
a folder written before the list existed holds the four plan aggregates (`aggregates.V1`).
Every file is written to a temporary name, synced and renamed; a replacing save writes the
new files first, then the manifest (the moment the new trajectory replaces the old one), then
removes the old checkpoint files, never a file outside the folder's ``checkpoints/``.
Reading is lazy (`read_steps`, `StepStack`): only the pages a measurement selects are read.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from scansnap_lens._io import (
    check_kinds,
    make_folder,
    open_lock,
    read_json,
    read_tensors,
    refuse_link,
    write_tensors,
    write_text,
)

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
from scansnap_lens.recording.aggregates import V1, Aggregate, CheckpointRecord
from scansnap_lens.recording.plan import RecordPlan

__all__ = [
    "FORMAT",
    "RecordingLock",
    "StepStack",
    "TrajectoryFolder",
    "TrajectoryWriter",
    "read_steps",
]

FORMAT = "scansnap_lens.Trajectory/1"
_OWN_FILE = re.compile(r"checkpoints/step_(\d{12,})(-[0-9a-f]{8})?\.safetensors")
_OWN_PLAN = re.compile(r"plan(-[0-9a-f]{8})?\.safetensors")
MAX_STEP = 2**63 - 1  # steps are stored as int64


def record_tensors(record: CheckpointRecord, entries: list[dict]) -> dict[str, Tensor]:
    """A checkpoint's tensors under their keys in its file: those of the manifest's
    aggregate `entries` (ValueError naming what the record lacks or adds)."""
    names = [e["name"] for e in entries]
    if set(record.values) != set(names):
        raise ValueError(
            f"checkpoint {record.step} holds the aggregates {sorted(record.values)}, the"
            f" trajectory records {sorted(names)}"
        )
    out = {e["key"]: record.values[e["name"]] for e in entries}
    if record.prompt_pattern is not None:
        out["prompt_pattern"] = record.prompt_pattern
    return out


def manifest_aggregates(manifest: dict) -> list[dict]:
    """The aggregate entries of a manifest (`Aggregate.entry`); the four plan aggregates for
    a folder written before the list existed."""
    return manifest.get("aggregates") or [a.entry() for a in V1]


def checkpoint_name(step: int, suffix: str = "") -> str:
    """The file of `step` in a trajectory folder: 12 digits at least, more for larger steps
    (runs counted in tokens reach 10^12)."""
    return f"checkpoints/step_{int(step):012d}{suffix}.safetensors"


class TrajectoryFolder:
    """A trajectory folder as a recording reads it: whether it holds one, its manifest, its
    plan, the steps done and skipped, and its recording lock (`RecordingLock`).

    >>> TrajectoryFolder("no/such/folder").holds_recording
    False
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock = RecordingLock(self.path)

    @property
    def holds_recording(self) -> bool:
        return (self.path / "manifest.json").exists()

    def manifest(self) -> dict:
        """The manifest as it is on disk now, checked (`FileNotFoundError` where none)."""
        return _read_manifest(self.path)

    def plan(self, manifest: dict | None = None) -> RecordPlan:
        manifest = self.manifest() if manifest is None else manifest
        return _read_plan(self.path / manifest.get("plan", "plan.safetensors"))

    @property
    def done(self) -> set[int]:
        """The steps recorded ({} where the folder holds no recording)."""
        if not self.holds_recording:
            return set()
        return {c["step"] for c in self.manifest()["checkpoints"]}

    @property
    def skipped(self) -> list[dict]:
        return self.manifest()["skipped"] if self.holds_recording else []


class TrajectoryWriter:
    """Writes one checkpoint file at a time and keeps the manifest up to date."""

    def __init__(
        self,
        path: str | Path,
        plan: RecordPlan,
        layers,
        heads,
        step_unit: str = "steps",
        meta: dict | None = None,
        resume: bool = True,
        prompt: Tensor | None = None,
        aggregates: list[dict] | None = None,
        settings: dict | None = None,
    ):
        """aggregates: the manifest entries of what each checkpoint records
        (`Aggregate.entry`; default the four plan aggregates, `aggregates.V1`); settings: how
        the run is recorded (`RecordingSettings.to_dict`), kept in a new folder's manifest."""
        self.path = Path(path)
        self.plan = plan
        entries = [a.entry() for a in V1] if aggregates is None else list(aggregates)
        prompt_ids = None if prompt is None else [int(t) for t in torch.as_tensor(prompt)]
        self._replacing: dict | None = None  # the manifest a `save` replaces, until `finish`
        self._suffix = ""
        if (self.path / "manifest.json").exists() and resume:
            self.manifest = self._resumed(plan, list(layers), list(heads), prompt_ids, entries)
            return
        plan_file = "plan.safetensors"
        if (self.path / "manifest.json").exists():  # replacing: new names, old files kept
            self._replacing = _read_manifest(self.path)
            self._suffix = "-" + secrets.token_hex(4)
            plan_file = f"plan{self._suffix}.safetensors"
        make_folder(self.path / "checkpoints")
        write_tensors(
            self.path / plan_file,
            plan.tensors(),
            {"format": FORMAT, "plan": json.dumps(plan.metadata())},
        )
        self.manifest = {
            "format": FORMAT,
            "step_unit": step_unit,
            "layers": list(layers),
            "heads": list(heads),
            "meta": meta or {},
            "prompt": prompt_ids,
            "plan": plan_file,
            "aggregates": entries,
            "checkpoints": [],
            "skipped": [],
            **({"settings": settings} if settings is not None else {}),
        }
        self._flush()

    def _resumed(self, plan, layers, heads, prompt_ids, entries) -> dict:
        """The folder's manifest, checked against what this writer would record."""
        manifest = _read_manifest(self.path)
        again = "record into another folder, or replace it (overwrite=True)"
        if not _read_plan(self.path / manifest.get("plan", "plan.safetensors")).same_as(plan):
            raise ValueError(
                f"{self.path} holds a recording with another plan (other evaluation tokens,"
                f" queries or context convention): {again}"
            )
        if (manifest["layers"], manifest["heads"]) != (layers, heads):
            raise ValueError(
                f"{self.path} was recorded for layers {manifest['layers']} and heads"
                f" {manifest['heads']}, not {layers} and {heads}: watch those to resume, {again}"
            )
        if manifest.get("prompt") != prompt_ids:
            raise ValueError(
                f"{self.path} was recorded with another example prompt"
                f" ({manifest.get('prompt')} against {prompt_ids}): {again}"
            )
        saved_entries = manifest_aggregates(manifest)
        if _names(saved_entries) != _names(entries):
            raise ValueError(
                f"{self.path} records the aggregates {_names(saved_entries)}, not"
                f" {_names(entries)}: record those to resume (aggregates=), {again}"
            )
        redo = incomplete(self.path, manifest)
        if redo:  # recorded anew: a truncated copy is no checkpoint
            steps = {step for step, _ in redo}
            manifest["checkpoints"] = [c for c in manifest["checkpoints"] if c["step"] not in steps]
            for step, why in redo:
                print(f"{self.path}: checkpoint {step} is {why}: recording it again")
        return manifest

    @property
    def done(self) -> set[int]:
        return {item["step"] for item in self.manifest["checkpoints"]}

    def write(self, record: CheckpointRecord) -> None:
        if not 0 <= int(record.step) <= MAX_STEP:
            raise ValueError(f"step {record.step} does not fit a trajectory (0 to 2^63 - 1)")
        name = checkpoint_name(record.step, self._suffix)
        tensors = record_tensors(record, manifest_aggregates(self.manifest))
        write_tensors(self.path / name, tensors, {"format": FORMAT, "step": str(record.step)})
        entry = {"step": int(record.step), "file": name}
        if record.loss is not None:  # the evaluation loss: one number, in the manifest
            entry["loss"] = float(record.loss)
            entry["loss_on"] = record.loss_on  # absent in folders from before: "all"
        self._update(record.step, entry, None)

    def skip(self, step: int, source: str, error: str) -> None:
        self._update(step, None, {"step": int(step), "source": source, "error": error})

    def _update(self, step: int, entry: dict | None, skipped: dict | None) -> None:
        """Add one step's entry to the manifest.  Under the folder's lock the manifest is read
        again from disk first, so writers in other processes (or other recorders on the same
        folder) add their steps without losing each other's."""
        with _folder_lock(self.path, active=self._replacing is None):
            if self._replacing is None and (self.path / "manifest.json").exists():
                disk = _read_manifest(self.path)
                self.manifest["checkpoints"] = _merged(
                    disk["checkpoints"], self.manifest["checkpoints"]
                )
                self.manifest["skipped"] = _merged(disk["skipped"], self.manifest["skipped"])
            m = self.manifest
            m["checkpoints"] = [c for c in m["checkpoints"] if c["step"] != step]
            m["skipped"] = [s for s in m["skipped"] if s["step"] != step]
            if entry is not None:
                m["checkpoints"] = sorted([*m["checkpoints"], entry], key=lambda c: c["step"])
            if skipped is not None:
                m["skipped"].append(skipped)
            self._flush()

    def _flush(self, force: bool = False) -> None:
        if self._replacing is not None and not force:
            return  # the old trajectory stays in place until `finish`
        write_text(self.path / "manifest.json", json.dumps(self.manifest, indent=1))

    def finish(self) -> None:
        """After a replacing `save`: the new manifest takes the old one's place, then the old
        trajectory's own files (and only those) are removed."""
        if self._replacing is None:
            return
        old, self._replacing = self._replacing, None
        self._flush(force=True)
        keep = {c["file"] for c in self.manifest["checkpoints"]} | {self.manifest["plan"]}
        names = [c["file"] for c in old["checkpoints"]] + [old.get("plan", "plan.safetensors")]
        for name in names:
            if name not in keep and (_OWN_FILE.fullmatch(name) or _OWN_PLAN.fullmatch(name)):
                (self.path / name).unlink(missing_ok=True)


def remove_trajectory(path: str | Path) -> None:
    """Remove a trajectory folder's own files (manifest, plan, checkpoints it names), nothing
    else: a user's other files in the folder stay."""
    path = Path(path)
    manifest = _read_manifest(path)  # validated: names only files of this folder
    with _folder_lock(path):
        (path / "manifest.json").unlink()
        (path / manifest.get("plan", "plan.safetensors")).unlink(missing_ok=True)
        for entry in manifest["checkpoints"]:
            (path / entry["file"]).unlink(missing_ok=True)


def _names(entries: list[dict]) -> list[str]:
    return [f"{e['name']} ({e['axis']})" for e in entries]


def _merged(theirs: list[dict], ours: list[dict]) -> list[dict]:
    """Entries of both lists by step (ours win), sorted."""
    by_step = {e["step"]: e for e in theirs}
    by_step.update({e["step"]: e for e in ours})
    return [by_step[s] for s in sorted(by_step)]


@contextmanager
def _folder_lock(path: Path, active: bool = True):
    """An exclusive lock on the trajectory folder (``.lock``) while the manifest changes."""
    if not active or fcntl is None:  # no flock on this platform: writes stay atomic
        yield
        return
    make_folder(path)
    with open_lock(path / ".lock") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RecordingLock:
    """The folder's recording lock (``.recording.lock``): one recording process at a time.

    Held by a `Recorder` while it records; a recorder in another process fails at once with
    this one's pid.  Within one process it is shared (a notebook that builds a new `Recorder`
    for the same folder takes it over), and the workers a recording fans out to (Ray) write
    under the manifest's short lock only.  The operating system releases it when the process
    ends, so a killed recording never leaves a stale lock.
    """

    _held: ClassVar[dict[Path, tuple[object, set[int]]]] = {}  # folder -> (open file, holder ids)

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._key = self.path.resolve()

    @property
    def held(self) -> bool:
        return id(self) in self._held.get(self._key, (None, set()))[1]

    def acquire(self) -> None:
        if self.held:
            return
        if self._key in self._held:
            self._held[self._key][1].add(id(self))
            return
        make_folder(self.path)
        handle = open_lock(self.path / ".recording.lock")
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                handle.close()
                raise BlockingIOError(
                    f"{self.path} is being recorded by another process (pid {holder}): wait"
                    " for it to finish, or record into another folder"
                ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._held[self._key] = (handle, {id(self)})

    def holder(self) -> str | None:
        """The pid of the process recording into the folder now (this one's where it holds
        the lock), or None.  Only looks: a shared lock taken and dropped at once, on a file
        opened read-only, so the folder is never changed."""
        if self._key in self._held:
            return str(os.getpid())
        path = self.path / ".recording.lock"
        if fcntl is None or path.is_symlink() or not path.is_file():
            return None
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd) as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = handle.read(32).strip()
                return pid if pid.isdigit() else "unknown"
            fcntl.flock(handle, fcntl.LOCK_UN)
        return None

    def release(self) -> None:
        handle, holders = self._held.get(self._key, (None, set()))
        holders.discard(id(self))
        if handle is not None and not holders:
            del self._held[self._key]
            handle.close()  # closing the file releases the flock

    def __enter__(self) -> RecordingLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_manifest(path: Path) -> dict:
    file = path / "manifest.json"
    refuse_link(file)  # the folder's own file: a link there is someone else's doing
    if not file.exists():
        raise FileNotFoundError(f"{path} is not a trajectory folder: {file.name} is missing")
    try:
        manifest = read_json(file, "recording's manifest")
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: corrupt manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{file}: not a scansnap_lens trajectory (format {found!r})")
    needed = {
        "checkpoints": list,
        "layers": list,
        "heads": list,
        "step_unit": str,
        "skipped": list,
        "meta": dict,
    }
    check_kinds(manifest, needed, f"{file}: the manifest")
    _check_entries(file, manifest)
    _check_aggregates(file, manifest)
    _check_values(file, manifest)
    return manifest


def _check_values(file: Path, manifest: dict) -> None:
    """The manifest's other values as their kinds (each used as it is when the trajectory is
    loaded): layers, heads and the prompt's token ids as counts, losses as numbers, skipped
    checkpoints as objects with a step."""

    def counts(value) -> bool:
        return all(type(v) is int and 0 <= v < 2**31 for v in value)

    for key in ("layers", "heads"):
        if not counts(manifest[key]):
            raise ValueError(f"{file}: '{key}' must be a list of indices (hand-edited?)")
    prompt = manifest.get("prompt")
    if prompt is not None and not (isinstance(prompt, list) and counts(prompt)):
        raise ValueError(f"{file}: 'prompt' must be a list of token ids (hand-edited?)")
    for entry in manifest["checkpoints"]:
        loss = entry.get("loss")
        if loss is not None and (isinstance(loss, bool) or not isinstance(loss, int | float)):
            raise ValueError(f"{file}: checkpoint {entry['step']}'s loss is not a number")
        if not isinstance(entry.get("loss_on", "all"), str):
            raise ValueError(f"{file}: checkpoint {entry['step']}'s loss_on is not a name")
    if not all(isinstance(s, dict) and type(s.get("step")) is int for s in manifest["skipped"]):
        raise ValueError(f"{file}: 'skipped' must list objects with a step (hand-edited?)")


def _check_aggregates(file: Path, manifest: dict) -> None:
    """The manifest's aggregate entries name distinct aggregates and keys, each readable."""
    entries = manifest.get("aggregates")
    if entries is None:
        return
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{file}: 'aggregates' must be a non-empty list (hand-edited?)")
    for entry in entries:
        if not isinstance(entry, dict):
            raise ValueError(f"{file}: an aggregate entry is not an object ({entry!r})")
        try:
            Aggregate.from_entry(entry)
        except ValueError as err:
            raise ValueError(f"{file}: {err}") from None
        if entry.get("axis") == "rows" and not (
            isinstance(entry.get("slots"), int) and entry["slots"] >= 0
        ):
            raise ValueError(f"{file}: aggregate {entry['name']} has no row count ('slots')")
        if entry.get("key") == "prompt_pattern":
            raise ValueError(f"{file}: aggregate {entry['name']} takes the prompt's key")
    for what in ("name", "key"):
        seen = [e.get(what) for e in entries]
        if len(set(seen)) < len(seen):
            raise ValueError(f"{file}: two aggregates share a {what} (hand-edited?)")


def _check_entries(file: Path, manifest: dict) -> None:
    """Every checkpoint entry names one step and one file of this folder's own, once."""
    entries = manifest.get("checkpoints")
    if not isinstance(entries, list):
        raise ValueError(f"{file}: 'checkpoints' must be a list")
    steps, names = set(), set()
    for entry in entries:
        step, name = entry.get("step") if isinstance(entry, dict) else None, None
        if isinstance(entry, dict):
            name = entry.get("file")
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
            raise ValueError(f"{file}: a checkpoint entry has no valid step ({entry!r})")
        own = _OWN_FILE.fullmatch(name) if isinstance(name, str) else None
        if own is None:
            raise ValueError(
                f"{file}: checkpoint {step} names {name!r}, not a file of this folder's"
                " checkpoints/ (hand-edited manifest?)"
            )
        if int(own.group(1)) != step:
            raise ValueError(f"{file}: checkpoint {step} names the file of another step ({name})")
        if step in steps or name in names:
            raise ValueError(f"{file}: checkpoint {step} or its file {name} is listed twice")
        steps.add(step)
        names.add(name)
    plan = manifest.get("plan", "plan.safetensors")
    if not isinstance(plan, str) or not _OWN_PLAN.fullmatch(plan):
        raise ValueError(f"{file}: names the plan file {plan!r}, not one of this folder's")


def _read_tensors(file: Path) -> tuple[dict, dict[str, Tensor]]:
    return read_tensors(file, FORMAT, "trajectory file")


def _read_plan(file: Path) -> RecordPlan:
    meta, tensors = _read_tensors(file)
    try:
        plan = RecordPlan.from_parts(json.loads(meta["plan"]), tensors)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{file} is not a recording plan ({type(err).__name__}: {err})") from None
    problems = plan.problems()
    if problems:
        raise ValueError(f"{file} is not a consistent recording plan: {'; '.join(problems)}")
    return plan


_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64}


def _header(file: Path) -> tuple[dict, int]:
    """The safetensors header of `file` (tensor dtypes, shapes, offsets; metadata) and where
    its data begin, read without touching the data."""
    try:
        with open(file, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > 100_000_000:
                raise ValueError("header too large")
            header = json.loads(handle.read(size))
    except (OSError, ValueError, struct.error) as err:
        raise ValueError(f"{file} is not a trajectory file (corrupt or truncated: {err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a trajectory file (no header)")
    meta = header.pop("__metadata__", None) or {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{file} is not a trajectory file (format={meta.get('format')!r})")
    return header, 8 + size


class StepStack:
    """A [S, ...] tensor whose steps live in S checkpoint files, memory-mapped.

    Indexing reads only what it selects: ``stack[s]`` one step, ``stack[..., slots]`` some
    slots of every step, ``stack[a:b]`` some steps; each returns a torch tensor.  Any other
    use (arithmetic, ``torch.*`` functions, tensor methods) loads the whole stack first, as a
    tensor would be.
    """

    def __init__(self, arrays: list[np.ndarray]):
        self._arrays = arrays
        self.shape = torch.Size([len(arrays), *arrays[0].shape])
        self.dtype = torch.from_numpy(np.empty(0, dtype=arrays[0].dtype)).dtype

    def __len__(self) -> int:
        return len(self._arrays)

    @property
    def arrays(self) -> list[np.ndarray]:
        """The step arrays it stacks, as read (memory-mapped where they were)."""
        return self._arrays

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.shape.numel()

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __getitem__(self, key) -> Tensor:
        key = key if isinstance(key, tuple) else (key,)
        key = tuple(k.numpy() if isinstance(k, Tensor) else k for k in key)
        first, rest = key[0], key[1:]
        if first is Ellipsis:  # (..., idx): the same selection of every step
            steps, rest = slice(None), key
        else:
            steps = first
        if isinstance(steps, int | np.integer):
            return torch.from_numpy(np.array(self._arrays[steps][rest]))
        chosen = np.arange(len(self._arrays))[steps]
        if not len(chosen):
            return self.full()[key]
        return torch.from_numpy(np.stack([np.asarray(self._arrays[i][rest]) for i in chosen]))

    def full(self) -> Tensor:
        """The whole [S, ...] tensor in memory."""
        return torch.from_numpy(np.stack(self._arrays))

    def __array__(self, dtype=None, copy=None):
        out = np.stack(self._arrays)
        return out if dtype is None else out.astype(dtype)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def real(x):
            if isinstance(x, StepStack):
                return x.full()
            if isinstance(x, list | tuple):
                return type(x)(real(v) for v in x)
            return x

        return func(*real(args), **{k: real(v) for k, v in (kwargs or {}).items()})

    def __repr__(self) -> str:
        return f"StepStack(shape={tuple(self.shape)}, dtype={self.dtype}, files={len(self)})"


def _binary(name: str):
    def op(self, other):
        return getattr(self.full(), name)(other.full() if isinstance(other, StepStack) else other)

    return op


for _name in (
    "add",
    "sub",
    "mul",
    "truediv",
    "pow",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "radd",
    "rsub",
    "rmul",
    "rtruediv",
):
    setattr(StepStack, f"__{_name}__", _binary(f"__{_name}__"))
StepStack.__neg__ = lambda self: -self.full()
StepStack.__abs__ = lambda self: self.full().abs()
StepStack.__hash__ = object.__hash__


def _short(file: Path, header: dict, start: int) -> str:
    """ "truncated (N of M bytes; a partial copy?)" where `file` ends before its header's last
    tensor does, else ""."""
    ends = [
        info["data_offsets"][1]
        for info in header.values()
        if isinstance(info, dict) and isinstance(info.get("data_offsets"), list)
    ]
    need, have = start + max(ends, default=0), file.stat().st_size
    return f"truncated ({have:,} of {need:,} bytes; a partial copy?)" if have < need else ""


def incomplete(path: Path, manifest: dict) -> list[tuple[int, str]]:
    """(step, why) of the checkpoints the manifest lists whose file is missing, truncated or
    unreadable: what a resumed recording records again."""
    out = []
    for item in manifest["checkpoints"]:
        file = path / item["file"]
        if not file.is_file():
            out.append((item["step"], "missing"))
            continue
        try:
            header, start = _header(file)
        except ValueError as err:
            out.append((item["step"], str(err)))
            continue
        short = _short(file, header, start)
        if short:
            out.append((item["step"], short))
    return out


def read_steps(path: Path, manifest: dict, plan: RecordPlan) -> dict[str, StepStack | None]:
    """The checkpoint tensors of a trajectory folder, memory-mapped: {name: StepStack} for
    each aggregate the manifest lists (`manifest_aggregates`), and prompt_pattern (None where
    not every checkpoint holds one).  Every file's shapes are checked against the manifest
    and the plan first (from the headers alone), so a hand-edited manifest or another run's
    file is named, not indexed past."""
    L, H = len(manifest["layers"]), len(manifest["heads"])
    entries = manifest_aggregates(manifest)
    slots = {e["name"]: Aggregate.from_entry(e).slots(plan, e.get("slots")) for e in entries}
    keys = {e["name"]: e["key"] for e in entries}
    arrays: dict[str, list] = {name: [] for name in (*keys, "prompt_pattern")}
    for item in manifest["checkpoints"]:
        file = path / item["file"]
        if not file.is_file():
            raise FileNotFoundError(f"no trajectory file at {file}")
        header, start = _header(file)
        short = _short(file, header, start)
        if short:
            raise ValueError(
                f"{file} is {short}: copy it again, or run the recording's command again (it"
                " resumes and records that checkpoint anew)"
            )
        for name in arrays:
            key = keys.get(name, name)
            if key not in header:
                if name == "prompt_pattern":
                    continue
                raise ValueError(f"{file} is not a trajectory checkpoint: it lacks {key!r}")
            info = header[key]
            shape = tuple(info["shape"])
            if name in slots and shape != (L, H, slots[name]):
                raise ValueError(
                    f"{path}: checkpoint {item['step']} holds {name} of shape {shape}, but the"
                    f" manifest and plan say ({L}, {H}, {slots[name]}) (layers"
                    f" {manifest['layers']}, heads {manifest['heads']}): a hand-edited"
                    " manifest, or a file of another run"
                )
            dtype = _DTYPES.get(info["dtype"])
            lo, hi = info["data_offsets"]
            if dtype is None or hi - lo != int(np.prod(shape)) * np.dtype(dtype).itemsize:
                raise ValueError(f"{file}: tensor {key!r} is not a readable {info['dtype']} array")
            if hi - lo == 0:
                arrays[name].append(np.zeros(shape, dtype))
            else:
                arrays[name].append(np.memmap(file, dtype, "r", start + lo, shape))
    out: dict[str, StepStack | None] = {name: StepStack(arrays[name]) for name in keys}
    patterns = arrays["prompt_pattern"]
    full = len(patterns) == len(manifest["checkpoints"]) and patterns
    out["prompt_pattern"] = StepStack(patterns) if full else None
    return out
