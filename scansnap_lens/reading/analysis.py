"""`Analysis`: every measurement of one trajectory made once, with the settings it was made
with, saved and reloaded where its inputs are the same.  The report, the runs page, the
command line's tables and a notebook's summary read it; none measures again.

`AnalysisSettings` is the one settings value of the reading side (the classification of the
statistics' tokens, the training's rates, the theory fit's classes, what to leave out), as
`recording.settings.RecordingSettings` is of the recording side.

>>> AnalysisSettings(theory_classes=64).replace(theory=False).to_dict()["theory"]
False
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import re
import warnings
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from scansnap_lens._io import (
    check_kinds,
    read_json,
    read_small_bytes,
    read_tensors,
    regular_file,
    staged_folder,
    write_bytes,
    write_tensors,
    write_text,
)
from scansnap_lens.measures.catalog import measures_of
from scansnap_lens.measures.entropy import SINGLE_DISTINCT
from scansnap_lens.measures.measurement import Measurement
from scansnap_lens.measures.rates import theory_limits
from scansnap_lens.measures.settings import AnalysisSettings
from scansnap_lens.measures.summary import check_inputs, measure_all, summarize
from scansnap_lens.reading.findings import findings_of, in_progress
from scansnap_lens.recording.storage import StepStack
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.context import require_same
from scansnap_lens.statistics.groups import Classification, TokenGroups

__all__ = ["Analysis", "fingerprint"]

FORMAT = 1  # of the saved folder; a folder of another format is measured again
MEASURING = ("statistics", "recording", "theory", "measures", "reading")  # what the code key reads


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The package's version and a fingerprint of the code that measures (the sources of the
    `MEASURING` stages): part of a saved analysis's key, so an upgrade measures again."""
    from importlib import metadata

    try:
        version = metadata.version("scansnap_lens")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        version = "unknown"
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for stage in MEASURING:
        for path in sorted((root / stage).glob("*.py")):
            digest.update(f"{stage}/{path.name}".encode())
            digest.update(path.read_bytes())
    return f"{version}+{digest.hexdigest()[:16]}"


TAG = f"scansnap-analysis-{FORMAT}"
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a name a file is saved by: no path


def fingerprint(*parts) -> str:
    """A content hash of measurement inputs: tensors and arrays by dtype, shape and bytes;
    dataclasses and objects by their fields (those starting with ``_`` are caches and left
    out); containers and scalars by value.  Equal inputs give equal fingerprints."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(x) -> None:
        if isinstance(x, Tensor):
            x = x.detach().cpu().contiguous()
            digest.update(f"T{x.dtype}{tuple(x.shape)}".encode())
            digest.update(x.view(torch.uint8).numpy().tobytes() if x.numel() else b"")
        elif isinstance(x, np.ndarray):  # a memory-mapped one is read, not copied
            digest.update(f"A{x.dtype}{x.shape}".encode())
            digest.update(np.ascontiguousarray(x).reshape(-1).view(np.uint8))
        elif isinstance(x, StepStack):  # memory-mapped: each step's array read in turn
            for array in x.arrays:
                feed(array)
        elif isinstance(x, dict):
            digest.update(b"D")
            for key in sorted(x, key=str):
                feed(str(key))
                feed(x[key])
        elif isinstance(x, list | tuple):
            digest.update(f"L{len(x)}".encode())
            for item in x:
                feed(item)
        elif x is None or isinstance(x, str | int | float | bool | np.generic):
            digest.update(f"{type(x).__name__}:{x!r};".encode())
        elif isinstance(x, Path):
            feed(str(x))
        elif is_dataclass(x):
            digest.update(type(x).__name__.encode())
            feed({f.name: getattr(x, f.name) for f in fields(x) if not f.name.startswith("_")})
        elif hasattr(x, "__dict__"):
            digest.update(type(x).__name__.encode())
            feed({k: v for k, v in vars(x).items() if not k.startswith("_")})
        else:
            raise TypeError(f"cannot fingerprint a {type(x).__name__}")

    for part in parts:
        feed(part)
    return digest.hexdigest()


@dataclass
class Analysis:
    """Every measurement of a trajectory (`catalog.measures_of`) made once: ``results``
    {name: `Measurement`}, ``not_measured`` {what: why}, and ``summary`` (one row per layer and
    head, `summary.summarize`).  traj, groups, source: what was measured (not saved: a saved
    analysis is reloaded with them, `of` with ``cache=``); key: the fingerprint of those and
    the settings."""

    traj: Trajectory
    groups: TokenGroups | None
    source: object | None
    settings: AnalysisSettings
    results: dict[str, Measurement]
    not_measured: dict[str, str]
    summary: pd.DataFrame
    inputs: str | None  # the fingerprint of traj, groups and source (None: not taken yet)
    key: str | None  # of those, the settings and why there are no groups
    reused: bool = False  # reloaded from a saved analysis
    cache: Path | None = None  # the folder it is saved in
    formed: bool = False  # the groups were formed from the statistics (and are saved with it)
    groups_reason: str | None = None  # as given to `of` (part of the key)
    remeasured: str | None = None  # why a saved analysis of the same inputs was not reused
    # read once from the above, for every page and table
    entries: list = field(init=False, repr=False)  # the catalog's of what traj holds, in order
    findings: list[str] = field(init=False, repr=False)  # in sentences, a live run's first
    theory_limits: list[str] = field(init=False, repr=False)  # what the theory can say here
    # how the groups were or were to be classified (None: made by hand or the synthetic truth)
    classification: Classification | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.entries = measures_of(self.traj)
        steps = self.traj.steps.tolist()
        found = findings_of(self.summary, self.entries, self.traj.step_unit, steps)
        self.findings = [*in_progress(self.traj), *found]
        self.theory_limits = theory_limits(self.traj, self.settings.training)
        self.classification = self.groups.settings if self.groups is not None else None
        if self.groups is None and hasattr(self.source, "window"):  # to come from these stats
            self.classification = self.settings.classification

    @classmethod
    def of(
        cls,
        traj: Trajectory,
        groups: TokenGroups | None = None,
        *,
        source=None,
        settings: AnalysisSettings | None = None,
        groups_reason: str | None = None,
        results: dict[str, Measurement] | None = None,
        cache: str | Path | None = None,
    ) -> Analysis:
        """Measure `traj` (or reload the analysis saved in `cache` where it was made of the same
        inputs and settings; one measured here is saved there).

        groups: the token groups; None forms them from `source` (`CooccurrenceStats`) with
        ``settings.classification`` where it can, and otherwise leaves out what needs them,
        saying why (`groups_reason`, or the classification's own reason).  source: the
        training corpus's statistics (or the lab's `SequenceClasses`) for the theory's checks.
        results: measurements made already (``{"theory_fit": ...}``), used as they are.
        """
        settings = settings or AnalysisSettings()
        if not isinstance(settings, AnalysisSettings):
            raise TypeError(f"settings must be AnalysisSettings, got {type(settings).__name__}")
        check_inputs(traj, groups)
        for statistics in (groups, source):  # counted as the recording counts, before anything
            require_same(statistics, traj.plan)
        # groups formed here are a function of the statistics and the classification: the key
        # names those, so a saved analysis is reloaded (with its groups) before they are formed
        formed = groups is None and groups_reason is None and _is_statistics(source)
        keys = (None, None)  # fingerprinting reads every input: only where a cache is named
        if cache is not None and not results:
            keys = _keys(traj, groups, source, settings, formed, groups_reason)
            saved = _reload(Path(cache), keys[1], traj, groups, source)
            if saved is not None:
                saved.cache = Path(cache)
                return saved
            again = _other_code(Path(cache), keys[0])
        given_reason = groups_reason
        if formed:
            groups, groups_reason = _groups_from(source, traj, settings.classification)
        analysis = cls._measure(traj, groups, source, settings, groups_reason, results, keys)
        analysis.formed, analysis.groups_reason = formed, given_reason
        if cache is not None and not results:
            analysis.remeasured = again
        if cache is not None and not results:
            try:
                analysis.save(cache)
                analysis.cache = Path(cache)
            except OSError as err:  # a folder the user cannot write still gets its report
                warnings.warn(f"the analysis is not saved in {cache}: {err}", stacklevel=2)
        return analysis

    @classmethod
    def _measure(cls, traj, groups, source, settings, groups_reason, given, keys) -> Analysis:
        not_measured = {}
        if groups is None:  # said once; each measurement that needs them points here
            not_measured["token groups"] = groups_reason or "none were given"
        for skip in traj.skipped:  # a step the recording could not read
            not_measured[f"step {skip['step']}"] = f"not recorded: {skip['error']}"
        skip = set(given or {}) | set(settings.leave_out)
        if not settings.theory:
            skip.add("theory_fit")
        made, why = measure_all(
            traj,
            groups,
            source=source,
            settings=settings,
            names=[m.name for m in measures_of(traj) if m.name not in skip],
            groups_reason="needs token groups (see 'token groups')",
        )
        results = {**made, **(given or {})}
        not_measured.update(why)
        if not settings.theory and "theory_fit" not in results:
            not_measured["theory_fit"] = "left out (theory=False)"
        for name in settings.leave_out:
            if name not in results:
                not_measured.setdefault(name, "left out (leave_out)")
        if "sparsity" in results and not results["sparsity"].table["sparsity_classes"].iloc[0]:
            not_measured["entropy, top_share"] = SINGLE_DISTINCT
        summary = summarize(traj, groups, settings, results=results)
        return cls(traj, groups, source, settings, results, not_measured, summary, *keys)

    def to_dataframe(self) -> pd.DataFrame:
        """The one-row-per-head summary."""
        return self.summary

    def settings_used(self) -> dict:
        """What decided the numbers, as a report's summary.json keeps them: the classification
        (None for groups made by hand or from the synthetic truth), the statistics' window,
        where the groups came from, the other analysis settings and the uncertainty's level,
        alpha, correction, least number of units, queries and shared tokens left out."""
        groups, source, chosen = self.groups, self.source, self.classification
        context = getattr(source, "context", None) or (groups.context if groups else None)
        own = self.settings.to_dict()
        out = {
            "classification": None if chosen is None else chosen.to_dict(),
            "window": None if context is None else context.window,
            "groups": "none" if groups is None else groups.source,
            "analysis": {k: v for k, v in own.items() if k not in ("classification", "training")},
        }
        if "uncertainty" in self.results:
            said = self.results["uncertainty"].table.attrs
            out["uncertainty"] = {k: said[k] for k in ("level", "alpha", "correction", "min_units")}
            out["uncertainty"].update(queries=said.get("queries"), shared=said.get("shared", []))
        return out

    def __repr__(self) -> str:
        made = ", ".join(self.results)
        return (
            f"Analysis({len(self.summary)} heads, {self.traj.num_steps} checkpoints: {made};"
            f" {len(self.not_measured)} not measured{', reloaded' if self.reused else ''})"
        )

    def save(self, path: str | Path) -> Path:
        """A folder: ``analysis.json`` (the keys, settings, what was not measured, each table's
        attributes), a parquet file per table and ``values.safetensors``; a theory fit's
        predicted trajectories as trajectory folders.  Written all or nothing
        (`_io.staged_folder`)."""
        if self.key is None:
            groups = None if self.formed else self.groups
            self.inputs, self.key = _keys(
                self.traj, groups, self.source, self.settings, self.formed, self.groups_reason
            )
        said = {
            "format": FORMAT,
            "inputs": self.inputs,
            "key": self.key,
            "code": code_version(),
            "settings": self.settings.to_dict(),
            "not_measured": self.not_measured,
            "measurements": {},
        }
        tensors = {}
        with staged_folder(path) as stage:
            _write_frame(stage / "summary.parquet", self.summary)
            for name, result in self.results.items():
                _write_frame(stage / f"{name}.parquet", result.table)
                if result.detail is not None:
                    _write_frame(stage / f"{name}_detail.parquet", result.detail)
                if result.values is not None:
                    tensors[name] = result.values.contiguous()
                for i, predicted in enumerate(result.predictions or []):
                    predicted.save(stage / f"{name}_prediction_{i}")
                said["measurements"][name] = {
                    "attrs": _jsonable(result.table.attrs),
                    "detail": result.detail is not None,
                    "predictions": len(result.predictions or []),
                }
            write_tensors(stage / "values.safetensors", tensors, {"format": TAG})
            said["formed"] = self.formed
            if self.formed and self.groups is not None:
                self.groups.save(stage / "groups.safetensors")
            write_text(stage / "analysis.json", json.dumps(said, indent=1))
        return Path(path)

    def drawn_figures(self) -> dict[str, bytes | str]:
        """What an earlier report of this analysis drew, kept beside it (`keep_figures`):
        {figure name: its PNG, or why it could not be drawn}; empty where none was kept."""
        folder = None if self.cache is None else self.cache / "figures"
        try:
            said = read_json(folder / "figures.json", "index of the kept figures")
            if said.get("key") != self.key:
                return {}
            names, failed = list(said["drawn"]), dict(said["failed"])
            if not all(isinstance(n, str) and FILE_NAME.fullmatch(n) for n in [*names, *failed]):
                return {}  # a name that is no figure's (a path) is never read
            files = [folder / f"{n}.png" for n in names]
            if any(f.is_symlink() for f in files):  # the report writes files, never links
                return {}
            drawn = {f.stem: read_small_bytes(f, "kept figure") for f in files}
            return {**drawn, **{n: str(why) for n, why in failed.items()}}
        except (OSError, TypeError, ValueError, KeyError, AttributeError):
            return {}

    def keep_figures(self, drawn: dict[str, Path], failed: dict[str, str]) -> None:
        """Keep a report's figures beside the saved analysis (figures are its function: a page
        drawn again with another title copies them)."""
        if self.cache is None:
            return
        try:
            with staged_folder(self.cache / "figures") as stage:
                for name, path in drawn.items():
                    write_bytes(stage / f"{name}.png", Path(path).read_bytes())
                said = {"key": self.key, "drawn": sorted(drawn), "failed": failed}
                write_text(stage / "figures.json", json.dumps(said, indent=1))
        except OSError as err:
            warnings.warn(f"the report's figures are not kept in {self.cache}: {err}", stacklevel=2)

    @classmethod
    def load(cls, path: str | Path, traj: Trajectory, groups=None, source=None) -> Analysis:
        """The analysis saved in `path`, with the inputs it was made of (refused, naming the
        difference, where its key is not theirs: a changed trajectory, groups or source)."""
        analysis = _reload(Path(path), None, traj, groups, source)
        analysis.cache = Path(path)
        formed = analysis.formed and groups is None
        if analysis.inputs != _inputs(traj, groups, source, analysis.settings, formed):
            raise ValueError(
                f"{path} was measured from other inputs (another trajectory, token groups or"
                " statistics): measure these with Analysis.of(..., cache=)"
            )
        return analysis


def _is_statistics(source) -> bool:
    from scansnap_lens.statistics.corpus import CooccurrenceStats

    return isinstance(source, CooccurrenceStats)


def _inputs(traj, groups, source, settings: AnalysisSettings, formed: bool) -> str:
    """The fingerprint of what is measured; groups formed from `source` by their recipe."""
    if formed:
        groups = ("formed", settings.classification.to_dict(), traj.plan.queries)
    return fingerprint(traj, groups, source)


def _keys(traj, groups, source, settings, formed, groups_reason) -> tuple[str, str]:
    """(inputs, key): the fingerprints `Analysis` is saved and reloaded by."""
    inputs = _inputs(traj, groups, source, settings, formed)
    return inputs, fingerprint(FORMAT, inputs, settings.to_dict(), groups_reason, code_version())


def _groups_from(source, traj, classification):
    """(TokenGroups, None) from corpus statistics, or (None, why) where none can be formed."""
    from scansnap_lens.statistics.groups import check_vocabulary

    check_vocabulary(source.vocab_size, traj.plan)
    try:
        queries = traj.plan.queries.tolist()
        return TokenGroups.from_statistics(source, queries, classification), None
    except ValueError as err:  # the report still measures what needs no groups, and says why
        return None, str(err)


def _other_code(path: Path, inputs: str) -> str | None:
    """Where `path` holds an analysis of the same inputs measured by other code: so said."""
    try:
        said = read_json(path / "analysis.json", "saved analysis's index")
    except (OSError, ValueError):
        return None
    code = said.get("code") if isinstance(said, dict) else None
    if said.get("inputs") != inputs or code == code_version():
        return None
    was = code if isinstance(code, str) and len(code) < 100 else "an older version"
    return (
        f"the analysis saved in {path} was measured by other code ({was}; now"
        f" {code_version()}): measured again"
    )


def _reload(path: Path, key, traj, groups, source) -> Analysis | None:
    """The analysis saved in `path` where its key is `key` (any key for None); None where
    there is none, or it is another's or unreadable (then it is measured again)."""
    try:
        said = _checked_index(read_json(path / "analysis.json", "saved analysis's index"))
        for file in path.iterdir():  # a FIFO or device among its files would block a reader
            if not file.is_dir():
                regular_file(file, "saved analysis's file", limit=None)
        if key is not None and said["key"] != key:
            return None
        _, tensors = read_tensors(path / "values.safetensors", TAG, "saved analysis's values")
        results = {}
        for name, entry in said["measurements"].items():
            table = _read_frame(path / f"{name}.parquet")
            table.attrs.update(entry["attrs"])
            detail = _read_frame(path / f"{name}_detail.parquet") if entry["detail"] else None
            predictions = [
                Trajectory.load(path / f"{name}_prediction_{i}")
                for i in range(entry["predictions"])
            ] or None
            results[name] = Measurement(name, table, detail, tensors.get(name), predictions)
        summary = _read_frame(path / "summary.parquet")
        formed = bool(said.get("formed")) and groups is None
        if formed and (path / "groups.safetensors").is_file():
            groups = TokenGroups.load(path / "groups.safetensors")
        settings = AnalysisSettings.from_dict(said["settings"])
    except (OSError, ValueError, KeyError, TypeError) as err:  # TypeError: a setting's kind
        if key is None:
            raise ValueError(f"{path} holds no readable saved analysis: {err}") from None
        return None
    return Analysis(
        traj,
        groups,
        source,
        settings,
        results,
        said["not_measured"],
        summary,
        said["inputs"],
        said["key"],
        reused=True,
        formed=formed,
    )


def _checked_index(said) -> dict:
    """A saved analysis's index (analysis.json) checked as `save` writes it, each value as its
    kind before any is used (a measurement's name names a file: a plain name, never a path);
    ValueError naming the first that is not."""
    if not isinstance(said, dict):
        raise ValueError("its index is not a JSON object")
    if said.get("format") != FORMAT:
        raise ValueError(f"its index is not a saved analysis's (format {said.get('format')!r})")
    kinds = {
        "key": str,
        "inputs": str,
        "measurements": dict,
        "not_measured": dict,
        "settings": dict,
    }
    check_kinds(said, kinds, "its index")
    for name, entry in said["measurements"].items():
        if not (
            FILE_NAME.fullmatch(name)
            and isinstance(entry, dict)
            and isinstance(entry.get("attrs"), dict)
            and isinstance(entry.get("detail"), bool)
            and type(entry.get("predictions")) is int
            and 0 <= entry["predictions"] <= MAX_PREDICTIONS
        ):
            raise ValueError(f"its index's measurement {name!r} is not one save writes")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in said["not_measured"].items()):
        raise ValueError("its index's not_measured is not names and reasons")
    return said


MAX_PREDICTIONS = 64  # a measurement's predicted runs: one per training setting of its heads
FRAME_BYTES = 1 << 30  # a saved table's columns, uncompressed: far above any analysis's


def _read_frame(path: Path) -> pd.DataFrame:
    """A saved table, its size bounded before it is read: the columns' uncompressed bytes
    its footer gives (a 3.6 MB file of one repeated value expanded to 6.4 GB)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if size > FRAME_BYTES:
        raise ValueError(
            f"{path} expands to {size:,} bytes, more than a saved analysis's"
            f" table holds ({FRAME_BYTES:,})"
        )
    return pd.read_parquet(path)


def _write_frame(path: Path, frame: pd.DataFrame) -> None:
    buffer = io.BytesIO()
    frame = frame.copy()
    frame.attrs = {}  # saved in analysis.json, as JSON
    frame.to_parquet(buffer)
    write_bytes(path, buffer.getvalue())


def _jsonable(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = None if math.isnan(v) else v
        out[k] = v
    return json.loads(json.dumps(out))
