"""Recorded attention over checkpoints: in memory, on disk, resumable.

On disk a trajectory is a folder, written one checkpoint at a time::

    manifest.json                     steps done, skipped checkpoints, layers, heads, step unit
    plan.safetensors                  the RecordPlan (tracked queries, classes, slots)
    checkpoints/step_000001000.safetensors   zbar, c_hat (as "chat"), entropy, query_entropy
                                      (and prompt_pattern where a prompt is recorded)

Every file is written to a temporary name, synced and renamed, so an interrupted recording
leaves only whole files, and `TrajectoryWriter` resumes by skipping the steps already done.
`Trajectory.save` over an existing trajectory writes the new files under new names first,
then the manifest (the moment the new trajectory replaces the old one), and only then removes
the old checkpoint files, and never a file outside the folder's ``checkpoints/``.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens._io import read_tensors, write_tensors, write_text

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
from scansnap_lens.recording.hooks import FILE_KEYS, CheckpointRecord
from scansnap_lens.recording.plan import RecordPlan

__all__ = ["RecordingLock", "Trajectory", "TrajectoryWriter", "remove_trajectory"]

FORMAT = "scansnap_lens.Trajectory/1"
_FIELDS = ("zbar", "c_hat", "entropy", "query_entropy")
_OWN_FILE = re.compile(r"checkpoints/step_\d{12}(-[0-9a-f]{8})?\.safetensors")
_OWN_PLAN = re.compile(r"plan(-[0-9a-f]{8})?\.safetensors")
MAX_STEP = 2**63 - 1  # steps are stored as int64


@dataclass
class Trajectory:
    """Aggregates of S checkpoints, L layers and H heads (`recording.hooks` defines each).

    steps: [S] ascending, in ``step_unit`` ("steps" or "tokens").
    zbar: [S, L, H, Pz] mean attention logit of each pair (m, l); c_hat: [S, L, H, Pc] the
    paper's c-hat, the attention of class (m, n) on token l; entropy: [S, L, H, K];
    query_entropy: [S, L, H, Q].
    skipped: checkpoints that could not be read: dicts with step, source and error.
    prompt: [T] ids of an example prompt, and prompt_pattern [S, L, H, T, T] its attention
    weights at every checkpoint (None where no prompt was recorded).
    """

    plan: RecordPlan
    steps: Tensor
    layers: list[int]
    heads: list[int]
    zbar: Tensor
    c_hat: Tensor
    entropy: Tensor
    query_entropy: Tensor
    step_unit: str = "steps"
    skipped: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    prompt: Tensor | None = None
    prompt_pattern: Tensor | None = None

    @property
    def num_steps(self) -> int:
        return self.steps.numel()

    @property
    def chat(self) -> Tensor:
        warnings.warn("Trajectory.chat is now c_hat (the paper's c-hat)", FutureWarning, 2)
        return self.c_hat

    @classmethod
    def from_records(
        cls, plan: RecordPlan, records: list[CheckpointRecord], layers, heads, **kwargs
    ) -> Trajectory:
        if not records:
            raise ValueError("a trajectory needs at least one recorded checkpoint")
        records = sorted(records, key=lambda r: r.step)
        stacked = {k: torch.stack([getattr(r, k) for r in records]) for k in _FIELDS}
        steps = torch.tensor([r.step for r in records], dtype=torch.long)
        patterns = [r.prompt_pattern for r in records]
        if kwargs.get("prompt") is not None and all(p is not None for p in patterns):
            kwargs["prompt_pattern"] = torch.stack(patterns)
        else:
            kwargs["prompt"] = None
        return cls(plan, steps, list(layers), list(heads), **stacked, **kwargs)

    # -- lookups ---------------------------------------------------------------------
    def class_slot(self, query: int, next_token: int) -> int | None:
        """Index of the class (query, next_token) in the plan, None if it is not tracked."""
        return self.plan.class_slot(query, next_token)

    def class_attention(self, c: int, tokens: Tensor) -> Tensor:
        """c_hat [S, L, H, n] (float64) of class slot `c` for `tokens`; 0 where a token never
        occurred in the context of the class."""
        slot = self.plan.triple_slot(c, tokens)
        held = slot >= 0
        out = torch.zeros(*self.c_hat.shape[:3], slot.numel(), dtype=torch.float64)
        out[..., held] = self.c_hat[..., slot[held]].double()
        return out

    def attention(self, query: int, next_token: int, tokens) -> Tensor:
        """[S, L, H, n] (float64) the attention that class (query, next_token) puts on each of
        `tokens` (c_hat: per event, the weights on the token's context positions, summed and
        renormalised over the context; averaged over events); 0 where a token never occurred
        in the class's contexts.  KeyError where the class is not tracked."""
        c = self.plan.class_slot(query, next_token)
        if c is None:
            raise KeyError(f"class (query {query}, next token {next_token}) is not tracked")
        return self.class_attention(c, torch.as_tensor(tokens))

    def logits(self, query: int, tokens) -> Tensor:
        """[S, L, H, n] (float64) the mean attention logit zbar of `query` on each of `tokens`
        (over every event of the query); NaN where a token never occurred in its context."""
        slot = self.plan.pair_slot(query, tokens)
        held = slot >= 0
        out = torch.full((*self.zbar.shape[:3], slot.numel()), math.nan, dtype=torch.float64)
        out[..., held] = self.zbar[..., slot[held]].double()
        return out

    # -- selection -------------------------------------------------------------------
    def select(self, steps=None, layers=None, heads=None, queries=None) -> Trajectory:
        """A sub-trajectory: given step values, layer and head ids, and query tokens."""
        s = _positions(self.steps.tolist(), steps, "step")
        lay = _positions(self.layers, layers, "layer")
        hd = _positions(self.heads, heads, "head")

        def cut(x: Tensor) -> Tensor:
            return x[s][:, lay][:, :, hd]

        out = {k: cut(getattr(self, k)) for k in _FIELDS}
        plan = self.plan
        if queries is not None:
            plan, keep = plan.for_queries(torch.as_tensor(list(queries)))
            out = {k: v[..., keep[k]] for k, v in out.items()}
        return Trajectory(
            plan,
            self.steps[s],
            [self.layers[i] for i in lay],
            [self.heads[i] for i in hd],
            **out,
            step_unit=self.step_unit,
            skipped=list(self.skipped),
            meta=dict(self.meta),
            prompt=self.prompt,
            prompt_pattern=None if self.prompt_pattern is None else cut(self.prompt_pattern),
        )

    # -- tables ----------------------------------------------------------------------
    def to_dataframe(self, decode: bool = False) -> pd.DataFrame:
        """Long format: one row per (step, layer, head, query, next, token) of the tracked classes.

        Columns: step, layer, head, query, next, token, zbar, c_hat, count (C(m, n, l)),
        events (N(m, n)), pair_count (positions averaged in zbar); with ``decode`` also the
        token strings.
        """
        plan = self.plan
        _S, _L, _H, Pc = self.c_hat.shape
        pair = plan.triple_pair()
        idx = pd.MultiIndex.from_product(
            [self.steps.tolist(), self.layers, self.heads, range(Pc)],
            names=["step", "layer", "head", "slot"],
        )
        frame = idx.to_frame(index=False)
        slot = frame.pop("slot").to_numpy()
        cls = plan.triple_class.numpy()[slot]
        frame["query"] = plan.class_query.numpy()[cls]
        frame["next"] = plan.class_next.numpy()[cls]
        frame["token"] = plan.triple_token.numpy()[slot]
        frame["zbar"] = self.zbar[..., pair].reshape(-1).numpy()
        frame["c_hat"] = self.c_hat.reshape(-1).numpy()
        frame["count"] = plan.triple_count.numpy()[slot]
        frame["events"] = plan.class_events.numpy()[cls]
        frame["pair_count"] = plan.pair_count[pair].numpy()[slot]
        if decode:
            for col in ("query", "next", "token"):
                frame[col + "_str"] = [plan.decode(t) for t in frame[col]]
        return frame

    def entropy_dataframe(self) -> pd.DataFrame:
        """One row per (step, layer, head, query, next) with the mean attention entropy."""
        _S, _L, _H, C = self.entropy.shape
        idx = pd.MultiIndex.from_product(
            [self.steps.tolist(), self.layers, self.heads, range(C)],
            names=["step", "layer", "head", "cls"],
        ).to_frame(index=False)
        cls = idx.pop("cls").to_numpy()
        idx["query"] = self.plan.class_query.numpy()[cls]
        idx["next"] = self.plan.class_next.numpy()[cls]
        idx["events"] = self.plan.class_events.numpy()[cls]
        idx["entropy"] = self.entropy.reshape(-1).numpy()
        return idx

    # -- files -----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the folder format (see the module docstring)."""
        writer = TrajectoryWriter(
            path,
            self.plan,
            self.layers,
            self.heads,
            self.step_unit,
            self.meta,
            resume=False,
            prompt=self.prompt,
        )
        for i, step in enumerate(self.steps.tolist()):
            pattern = None if self.prompt_pattern is None else self.prompt_pattern[i]
            writer.write(CheckpointRecord(step, *(getattr(self, k)[i] for k in _FIELDS), pattern))
        for item in self.skipped:
            writer.skip(item["step"], item["source"], item["error"])
        writer.finish()
        return writer.path

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        path = Path(path)
        manifest = _read_manifest(path)
        plan = _read_plan(path / manifest.get("plan", "plan.safetensors"))
        records = [
            _read_record(path / item["file"], item["step"]) for item in manifest["checkpoints"]
        ]
        if not records:
            raise ValueError(f"{path}: no checkpoint has been recorded yet")
        _check_shapes(path, manifest, plan, records)
        return cls.from_records(
            plan,
            records,
            manifest["layers"],
            manifest["heads"],
            step_unit=manifest["step_unit"],
            skipped=manifest["skipped"],
            meta=manifest["meta"],
            prompt=_prompt_tensor(manifest.get("prompt")),
        )


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
    ):
        self.path = Path(path)
        self.plan = plan
        prompt_ids = None if prompt is None else [int(t) for t in torch.as_tensor(prompt)]
        manifest_path = self.path / "manifest.json"
        self._replacing: dict | None = None  # the manifest a `save` replaces, until `finish`
        self._suffix = ""
        if manifest_path.exists() and resume:
            manifest = _read_manifest(self.path)
            saved = _read_plan(self.path / manifest.get("plan", "plan.safetensors"))
            if not saved.same_as(plan):
                raise ValueError(
                    f"{self.path} holds a recording with another plan (other evaluation tokens,"
                    " queries or context convention); record into another folder"
                )
            if (manifest["layers"], manifest["heads"]) != (list(layers), list(heads)):
                raise ValueError(
                    f"{self.path} was recorded for layers {manifest['layers']} and heads"
                    f" {manifest['heads']}, not {list(layers)} and {list(heads)}"
                )
            if manifest.get("prompt") != prompt_ids:
                raise ValueError(
                    f"{self.path} was recorded with another example prompt"
                    f" ({manifest.get('prompt')} against {prompt_ids})"
                )
            self.manifest = manifest
        else:
            plan_file = "plan.safetensors"
            if manifest_path.exists():  # replacing a trajectory: new names, old files kept
                self._replacing = _read_manifest(self.path)
                self._suffix = "-" + secrets.token_hex(4)
                plan_file = f"plan{self._suffix}.safetensors"
            (self.path / "checkpoints").mkdir(parents=True, exist_ok=True)
            meta_json = json.dumps(plan.metadata())
            write_tensors(
                self.path / plan_file,
                plan.tensors(),
                {"format": FORMAT, "plan": meta_json},
            )
            self.manifest = {
                "format": FORMAT,
                "step_unit": step_unit,
                "layers": list(layers),
                "heads": list(heads),
                "meta": meta or {},
                "prompt": prompt_ids,
                "plan": plan_file,
                "checkpoints": [],
                "skipped": [],
            }
            self._flush()

    @property
    def done(self) -> set[int]:
        return {item["step"] for item in self.manifest["checkpoints"]}

    def write(self, record: CheckpointRecord) -> None:
        if not 0 <= int(record.step) <= MAX_STEP:
            raise ValueError(f"step {record.step} does not fit a trajectory (0 to 2^63 - 1)")
        name = f"checkpoints/step_{record.step:012d}{self._suffix}.safetensors"
        write_tensors(
            self.path / name, record.tensors(), {"format": FORMAT, "step": str(record.step)}
        )
        self._update(record.step, {"step": int(record.step), "file": name}, None)

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
    path.mkdir(parents=True, exist_ok=True)
    with open(path / ".lock", "a") as handle:
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
        self.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.path / ".recording.lock", "a+")
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
    if not file.exists():
        raise FileNotFoundError(f"{path} is not a trajectory folder: {file.name} is missing")
    try:
        manifest = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: corrupt manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{file}: not a scansnap_lens trajectory (format {found!r})")
    needed = {"checkpoints": list, "layers": list, "heads": list, "step_unit": str,
              "skipped": list, "meta": dict}  # fmt: skip
    for key, kind in needed.items():
        if not isinstance(manifest.get(key), kind):
            what = "lacks" if key not in manifest else f"has no {kind.__name__} as"
            raise ValueError(f"{file}: the manifest {what} '{key}' (hand-edited?)")
    _check_entries(file, manifest)
    return manifest


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
        if not isinstance(name, str) or not _OWN_FILE.fullmatch(name):
            raise ValueError(
                f"{file}: checkpoint {step} names {name!r}, not a file of this folder's"
                " checkpoints/ (hand-edited manifest?)"
            )
        if not name.startswith(f"checkpoints/step_{step:012d}"):
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


def _read_record(file: Path, step: int) -> CheckpointRecord:
    _, tensors = _read_tensors(file)
    missing = [FILE_KEYS[k] for k in _FIELDS if FILE_KEYS[k] not in tensors]
    if missing:
        raise ValueError(f"{file} is not a trajectory checkpoint: it lacks {missing}")
    fields = (tensors[FILE_KEYS[k]] for k in _FIELDS)
    return CheckpointRecord(step, *fields, tensors.get("prompt_pattern"))


def _check_shapes(path: Path, manifest: dict, plan: RecordPlan, records: list) -> None:
    """Each checkpoint holds [layers, heads, slots] as the manifest and the plan say: a
    hand-edited manifest or a file from another recording is named, not indexed past."""
    for key in ("layers", "heads"):
        if not isinstance(manifest.get(key), list):
            raise ValueError(f"{path}/manifest.json: '{key}' must be a list")
    L, H = len(manifest["layers"]), len(manifest["heads"])
    slots = {"zbar": plan.num_pairs, "c_hat": plan.num_triples, "entropy": plan.num_classes,
             "query_entropy": plan.num_queries}  # fmt: skip
    for record in records:
        for name, n in slots.items():
            shape = tuple(getattr(record, name).shape)
            if shape != (L, H, n):
                raise ValueError(
                    f"{path}: checkpoint {record.step} holds {name} of shape {shape}, but the"
                    f" manifest and plan say ({L}, {H}, {n}) (layers {manifest['layers']}, heads"
                    f" {manifest['heads']}): a hand-edited manifest, or a file of another run"
                )


def _prompt_tensor(ids: list[int] | None) -> Tensor | None:
    return None if ids is None else torch.tensor(ids, dtype=torch.long)


def _positions(values: list, wanted, name: str) -> list[int]:
    if wanted is None:
        return list(range(len(values)))
    wanted = [wanted] if isinstance(wanted, int) else list(wanted)
    missing = [w for w in wanted if w not in values]
    if missing:
        raise KeyError(f"{name}s {missing} are not in this trajectory (it has {values})")
    return [values.index(w) for w in wanted]
