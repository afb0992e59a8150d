"""Record a model's attention over its checkpoints into a resumable trajectory folder.

recorder = Recorder("out/traj", tokens, RecordingSettings(layers=(0, 1)))
recorder.record(checkpoints.folder("runs/my_model"))
# or, inside your own training loop:
recorder.on_checkpoint(step, model)

Every driver (the loop over a source, the sweep of hub revisions, a training callback, a Ray
worker) records a checkpoint with the one step of `RecordingRun`: load, make recordable,
check the architecture, record, write.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens._io import check_writable
from scansnap_lens.models.backend import hf_bridge, is_hf_model
from scansnap_lens.models.checkpoints import CheckpointSource
from scansnap_lens.models.formats import CheckpointError
from scansnap_lens.recording.aggregates import Aggregate, CheckpointRecord, resolve
from scansnap_lens.recording.budget import BYTES_PER_VALUE, duration, size_text
from scansnap_lens.recording.hooks import (
    RunState,
    count_rows,
    record_checkpoint,
    row_sources,
    watched,
)
from scansnap_lens.recording.plan import RecordPlan, plan_recording
from scansnap_lens.recording.settings import LOSS_ON, PROMPT_LENGTH, RecordingSettings
from scansnap_lens.recording.storage import (
    TrajectoryFolder,
    TrajectoryWriter,
    manifest_aggregates,
    remove_trajectory,
)
from scansnap_lens.recording.sweep import (
    Ahead,
    DuplicateWeightsError,
    describe_duplicates,
    fetcher_for,
    same_weights,
)
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

if TYPE_CHECKING:
    from scansnap_lens.models.backend import HookedModel
    from scansnap_lens.statistics.corpus import CooccurrenceStats

__all__ = ["Recorder", "RecordingRun", "record_trajectory", "trainer_callback"]

# the meta a Trainer's trainer_state.json gives (`formats.trainer_training`)
TRAINER_KEYS = {
    "lr_y",
    "lr_z",
    "optimizer",
    "momentum",
    "lr_schedule",
    "training_from",
    "train_loss",
    "eval_loss",
}
_PLANNING = ("queries", "exclude_bos", "tokenizer", "window")  # what a plan is made from


@dataclass
class RecordingRun:
    """What every checkpoint of one recording shares once its first has decided: the folder,
    the evaluation tokens [N, T] (or batches), the plan, the watched layers and heads, the
    prompt [T'], the aggregates with their manifest entries, the settings, the `RunState`.

    `record` (a checkpoint) and `record_model` (a model in memory) are the one step every
    driver calls; `writer` opens the folder's writer in any process that sees the folder.
    """

    folder: Path
    tokens: Any
    plan: RecordPlan
    layers: list[int]
    heads: list[int]
    prompt: Tensor | None
    aggregates: tuple[Aggregate, ...]
    entries: list[dict]
    settings: RecordingSettings
    state: RunState = field(default_factory=RunState)

    def writer(self, meta: dict | None = None) -> TrajectoryWriter:
        return TrajectoryWriter(
            self.folder,
            self.plan,
            self.layers,
            self.heads,
            self.settings.step_unit,
            meta,
            prompt=self.prompt,
            aggregates=self.entries,
            settings=self.settings.to_dict(),
        )

    def record(self, checkpoint, writer: TrajectoryWriter, on_batch=None) -> CheckpointRecord:
        """Load `checkpoint` (onto the settings' device), then `record_model`.
        CheckpointError where it cannot be read or has another architecture."""
        with _collected_after():
            return self._load_and_record(checkpoint, writer, on_batch)

    def _load_and_record(self, checkpoint, writer, on_batch) -> CheckpointRecord:
        model = checkpoint.load()
        if self.settings.device is not None:
            model.to(self.settings.device)
        return self.record_model(checkpoint.step, model, writer, on_batch, where=checkpoint.source)

    def record_model(
        self, step: int, model, writer: TrajectoryWriter, on_batch=None, where: str = ""
    ) -> CheckpointRecord | None:
        """Make `model` recordable, check its architecture, record it and write it as
        checkpoint `step` (None where the folder has it already)."""
        if int(step) in writer.done:
            return None
        model = _recordable(model)
        self.check(model, step, where)
        s = self.settings
        record = record_checkpoint(
            model,
            self.tokens,
            self.plan,
            step=int(step),
            layers=self.layers,
            heads=self.heads,
            batch_size=s.batch_size,
            device=s.device,
            progress=s.progress,
            prompt=self.prompt,
            on_batch=on_batch,
            aggregates=self.aggregates,
            state=self.state,
            loss_on=s.loss_on or "all",
        )
        writer.write(record)
        return record

    def check(self, model, step: int, where: str = "") -> None:
        """CheckpointError naming the checkpoint where it lacks a layer or head the recording
        watches (a run whose architecture changed): skipped under on_error="skip"."""
        n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
        if max(self.layers) >= n_layers or max(self.heads) >= n_heads:
            raise CheckpointError(
                f"{where + ': ' if where else ''}checkpoint {step} has {n_layers} layers of"
                f" {n_heads} heads, but the recording watches layers {self.layers} and heads"
                f" {self.heads} (as its first checkpoint had them): another architecture"
            )


class Recorder:
    """Records checkpoints into ``out``; steps already recorded there are skipped.

    tokens: the evaluation tokens [N, T] (or batches) the plan is built from.
    settings: how the run is recorded (`RecordingSettings`: what is tracked and watched, the
    budget, how to run); saved in the folder's manifest.
    plan: what to track (`plan.plan_recording`); without one, the recorder plans for the
    settings' ``queries`` (None: those that fit the budget; "all"; a share of the events; or
    token ids), ``exclude_bos``, ``window`` and ``tokenizer`` from the first model it records
    (its vocabulary), or, resuming a folder, with the folder's vocabulary (and its plan where
    the budget chose the queries): a plan that differs from the folder's is refused.
    stats: corpus statistics; with ``queries=None`` the plan is made for the scan's power
    (the queries whose distinct and common tokens both occur in the evaluation text, by the
    statistics' token kinds; `plan.plan_recording` with ``groups``), and the recording takes
    the statistics' context window.
    meta: what is known of the run (its rates, model, data), kept in the manifest; a folder
    whose run differs (a value of ``meta``, the plan, layers, heads, prompt, aggregates) is
    refused with what differs, unless ``overwrite``; the same run resumes.
    on_plan: called with the plan and the number of watched heads once both are decided,
    before anything is recorded (the command line says the scan's planned power there).

    While it records, the recorder holds the folder's `RecordingLock`: a recorder in another
    process fails at once.  `record` releases it when done; `on_checkpoint` (a training loop)
    holds it until `close` or the end of the process (``with Recorder(...) as recorder:``).
    """

    def __init__(
        self,
        out: str | Path,
        tokens: Tensor,
        settings: RecordingSettings | None = None,
        plan: RecordPlan | None = None,
        stats: CooccurrenceStats | None = None,
        meta: dict | None = None,
        on_plan: Callable[[RecordPlan, int], None] | None = None,
    ):
        settings = RecordingSettings() if settings is None else settings
        if not isinstance(settings, RecordingSettings):
            raise TypeError(f"settings must be RecordingSettings, got {type(settings).__name__}")
        # the window the recording aggregates: the settings', or the statistics' (one setting)
        self.settings = settings = settings.replace(window=_window(settings, stats))
        self.on_plan = on_plan  # told the plan and the watched heads' number once both are known
        self.folder = TrajectoryFolder(out)
        self.out, self.lock = self.folder.path, self.folder.lock
        if tokens is not None and not isinstance(tokens, Tensor):
            tokens = [torch.as_tensor(b) for b in tokens]  # read at every checkpoint
        self.tokens, self.stats, self.meta = tokens, stats, dict(meta or {})
        self.aggregates = resolve(settings.aggregates)
        self.state = RunState()  # what the run's checkpoints share, decided at the first
        self.run: RecordingRun | None = None
        self._writer: TrajectoryWriter | None = None
        self._skips: list[tuple[int, str, str]] = []
        self._expected: int | None = None  # checkpoints of the run, where `record` knows them
        self._said: tuple[int | None] | None = None  # (run size) the plan's line was said for
        self._estimated = False  # the run's cost said, after its first batch
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"{self.out} is a file, not a folder for the trajectory")
        check_writable(self.out)  # before any checkpoint is loaded
        if self.folder.holds_recording:
            self.lock.acquire()  # before anything of the folder is read or removed
        try:
            self._open(plan)
        except BaseException:
            self.lock.release()  # a refused folder stays free for a corrected recorder
            raise
        if self.plan is None and stats is not None and settings.queries is None:
            TokenGroups.ahead(stats)  # the plan's groups, made while the first model loads

    # ---------------------------------------------------------------- the folder
    def _open(self, plan: RecordPlan | None) -> None:
        s = self.settings
        planning = self.stats is not None or any(
            getattr(s, name) not in (None, False) for name in _PLANNING
        )
        if plan is not None and planning:
            raise ValueError(
                "give a plan, or the settings to plan for (queries, window, exclude_bos,"
                " tokenizer) and stats, not both"
            )
        if s.overwrite and self.folder.holds_recording:
            remove_trajectory(self.out)
        if plan is None and s.queries is None:  # what the budget planning reads
            self.meta = {**self.meta, **self._planned_for()}
        layers, heads = s.layers, s.heads
        self.prompt = _prompt(s, self.tokens)
        if self.folder.holds_recording:  # resuming: checked now, before a model is loaded
            manifest = self.folder.manifest()
            if plan is None:
                plan = self._replanned(manifest)
            if s.aggregates is None:  # record what the folder records
                self.aggregates = _folder_aggregates(self.out, manifest)
            layers = manifest["layers"] if layers is None else layers
            heads = manifest["heads"] if heads is None else heads
            if s.prompt is None:  # keep the prompt already recorded, of the length asked
                saved = manifest.get("prompt")
                asked = _prompt(s, self.tokens)
                given = s.prompt_length is not None
                if given and len(saved or ()) != (0 if asked is None else len(asked)):
                    raise ValueError(
                        f"{self.out} keeps an example prompt of {len(saved or ())} tokens, and"
                        f" prompt_length= here ({s.prompt_length}) asks for"
                        f" {0 if asked is None else len(asked)}: give the length it was"
                        " recorded with to resume it, or record into another folder"
                    )
                self.prompt = None if saved is None else torch.tensor(saved, dtype=torch.long)
        self.plan, self.layers, self.heads = plan, layers, heads
        if self.folder.holds_recording:
            self._decide()  # the folder's plan, layers and heads: decided before any model

    def _replanned(self, manifest: dict) -> RecordPlan:
        """The plan of a resumed folder: its own where the budget chose the queries (for the
        same text and convention), else these queries planned with its vocabulary."""
        s, saved = self.settings, self.folder.plan(manifest)
        queries = saved.queries if s.queries is None else s.queries
        plan = plan_recording(
            self.tokens,
            saved.vocab_size,
            queries=None if isinstance(queries, str) else queries,
            exclude_bos=s.exclude_bos,
            window=saved.window if s.window is None else s.window,
            include_self=saved.include_self,
            tokenizer=_tokenizer(s.tokenizer),
        )
        if s.queries is None:  # planned by the budget: the folder's plan holds
            _check_same_text(self.out, saved, plan)
            return saved
        return plan

    def _planned_for(self) -> dict:
        """What a plan made by the budget depends on (kept in the manifest's meta, so a
        resume with another value is refused naming it), never how many checkpoints are
        left to record."""
        return {
            "plan_stats": None if self.stats is None else str(self.stats.fingerprint),
            "max_checkpoint_bytes": self.settings.max_checkpoint_bytes,
            "max_run_bytes": self.settings.max_run_bytes,
        }

    def _check_same_run(self, meta: dict) -> None:
        """Refuse to add to a folder that holds another run: a value of `meta` it has differs."""
        saved = self.folder.manifest()["meta"] if self.folder.holds_recording else {}
        # a Trainer's trainer_state.json grows while it trains: what it said when the
        # recording began stays (the checkpoint folder, `source`, still tells runs apart)
        growing = (
            TRAINER_KEYS
            if str(meta.get("training_from", "")).startswith("trainer_state.json")
            else set()
        )
        differ = {
            k: (saved[k], v)
            for k, v in meta.items()
            if k in saved
            and k not in growing
            and json.loads(json.dumps(saved[k])) != json.loads(json.dumps(v))
        }
        if differ:
            scales = {
                o["name"]: (o["scale"], o["flag"][-2:].upper())
                for o in RecordingSettings.options()
                if o["scale"] != 1
            }

            def told(key: str, value) -> str:  # in the units the flag is given in
                if key in scales and isinstance(value, (int, float)):
                    scale, unit = scales[key]
                    return f"{value / scale:g} {unit}"
                return repr(value)

            labels = {
                "plan_stats": "the statistics (stats=)",
                "max_checkpoint_bytes": "max_checkpoint_bytes=",
                "max_run_bytes": "max_run_bytes=",
            }
            what = "; ".join(
                f"{labels.get(k, k)} {told(k, old)} there, {told(k, new)} here"
                for k, (old, new) in differ.items()
            )
            raise ValueError(
                f"{self.out} holds another run ({what}): give the values it was recorded with"
                " to resume it, record into another folder, or replace it (overwrite=True)"
            )

    def _decide(self, model=None) -> RecordingRun | None:
        """The run, decided once: its plan, layers and heads (a resumed folder's, or those
        given; else counted on `model`, the first checkpoint's), its budget checked and the
        folder's writer opened; None while they cannot be decided without a model."""
        if self.run is not None:
            return self.run
        self._check_same_run(self.meta)
        if model is None and (self.plan is None or self.layers is None or self.heads is None):
            return None
        if model is not None:  # checked before anything is written into the folder
            layers, heads = watched(model, self.layers, self.heads)
        else:
            layers, heads = list(self.layers), list(self.heads)
        vocab = int(model.cfg.d_vocab) if model is not None else self.plan.vocab_size
        entries = self._entries(vocab)
        if self.plan is None:  # planned from the first model: its vocabulary, its tokenizer
            self.plan = self._plan_for(model, len(layers) * len(heads), entries)
        self.layers, self.heads = layers, heads
        if self.on_plan is not None:
            self.on_plan(self.plan, len(layers) * len(heads))
        settings = self.settings.replace(loss_on=self._loss_on())
        run = RecordingRun(
            self.out,
            self.tokens,
            self.plan,
            layers,
            heads,
            self.prompt,
            self.aggregates,
            entries,
            settings,
            self.state,
        )
        self._check_budget(run)
        self.lock.acquire()
        self._writer, self.run = run.writer(self.meta), run
        self._note_skips()
        return run

    def _note_skips(self) -> None:
        """Write the skipped checkpoints found so far into the manifest, once the run has its
        writer (until then they wait for it)."""
        if self._writer is None:
            return
        for skip in self._skips:
            self._writer.skip(*skip)
        self._skips = []

    def _loss_on(self) -> str:
        """The positions the recorded loss averages over: the settings', else the training's
        (its meta's ``loss_on``, which `train` passes), else all; ValueError where the two
        differ."""
        told, given = self.meta.get("loss_on"), self.settings.loss_on
        if told is not None and told not in LOSS_ON:
            raise ValueError(f"the run's meta says loss_on {told!r}: one of {LOSS_ON} expected")
        if told is not None and given is not None and told != given:
            raise ValueError(
                f"loss_on={given!r}, but the training's loss is on {told!r} positions (its"
                " meta): record the loss the training optimizes, or leave loss_on unset"
            )
        return given or told or "all"

    # ---------------------------------------------------------------- the budget
    def _entries(self, vocab_size: int) -> list[dict]:
        """The manifest entries of the aggregates; a rows aggregate's rows decided (once)."""
        sources = row_sources(self.aggregates, self.tokens, vocab_size, self.state)
        rows = count_rows(self.tokens)
        out = []
        for agg in self.aggregates:
            own, words = sources.get(agg.name, (None, ""))
            out.append(agg.entry(rows if own is None else own.shape[0], words))
        return out

    def _checkpoint_bytes(self, plan: RecordPlan, entries: list[dict], num_heads: int) -> int:
        """Bytes of one checkpoint's tensors: every aggregate's slots and the prompt's
        weights, per watched head."""
        slots = sum(
            e["slots"] if e["axis"] == "rows" else Aggregate.from_entry(e).slots(plan)
            for e in entries
        )
        return BYTES_PER_VALUE * num_heads * (slots + self._prompt_length**2)

    @property
    def _prompt_length(self) -> int:
        return 0 if self.prompt is None else int(self.prompt.numel())

    def _plan_for(self, model, num_heads: int, entries: list[dict]) -> RecordPlan:
        """The plan of the first model: the asked queries, or those that fit the budget."""
        s = self.settings
        queries, max_slots, groups = s.queries, None, None
        if queries is None:
            budget = s.max_checkpoint_bytes
            if self._expected:
                budget = min(budget, s.max_run_bytes // self._expected)
            fixed = sum(e.get("slots", 0) for e in entries if e["axis"] == "rows")
            per_head = budget // (BYTES_PER_VALUE * num_heads) - self._prompt_length**2
            max_slots = max(per_head - fixed, 1)
            if self.stats is not None:  # plan for the scan's power: see `plan_recording`
                try:
                    groups = TokenGroups.from_statistics(self.stats)
                except ValueError:
                    groups = None  # nothing classified distinct: the most frequent queries
        elif isinstance(queries, str):  # "all"
            queries = None
        tokenizer = _tokenizer(s.tokenizer)
        return plan_recording(
            self.tokens,
            int(model.cfg.d_vocab),
            queries=queries,
            exclude_bos=s.exclude_bos,
            window=s.window,
            tokenizer=tokenizer or getattr(model, "tokenizer", None),
            max_slots=max_slots,
            groups=groups,
        )

    def _check_budget(self, run: RecordingRun) -> None:
        """Say the plan's size; refuse a run that would write more than `max_run_bytes`."""
        per = self._checkpoint_bytes(run.plan, run.entries, len(run.layers) * len(run.heads))
        runs, budget = self._expected, self.settings.max_run_bytes
        total = "" if not runs else f", {size_text(per * runs)} for {runs} checkpoints"
        if self.settings.progress and self._said != (runs,):
            self._said = (runs,)
            tqdm.write(f"plan: {run.plan.describe()}; {size_text(per)} per checkpoint{total}")
        if runs and per * runs > budget:
            raise ValueError(
                f"the recording would write {size_text(per * runs)} ({size_text(per)} per"
                f" checkpoint for {runs} checkpoints; {run.plan.describe()}), over the budget of"
                f" {size_text(budget)} (max_run_bytes=): track fewer queries (queries=), watch"
                " fewer layers or heads (layers=, heads=), select fewer checkpoints (steps=),"
                " or raise the budget"
            )

    def _estimate(self, done: int, total: int | None, seconds: float) -> None:
        """After the first batch of the run: what the whole run will cost, before it goes on."""
        if done != 1 or total is None:
            return
        self._estimated = True
        first = self.tokens if isinstance(self.tokens, Tensor) else self.tokens[0]
        rows, length = count_rows(self.tokens), int(first.shape[-1])
        per_checkpoint = seconds * total
        left = (self._expected or 0) - len(self.done)
        run = self.run
        disk = self._checkpoint_bytes(run.plan, run.entries, len(run.layers) * len(run.heads))
        rest = (
            f", {duration(per_checkpoint * left)} and {size_text(disk * left)} for the {left}"
            " checkpoints to record"
            if left > 0
            else ""
        )
        tqdm.write(
            f"estimate: {rows} rows of {length} tokens, {total} batches per checkpoint; the"
            f" first took {duration(seconds)}: about {duration(per_checkpoint)} per checkpoint"
            f"{rest} (loading aside).  Rows and checkpoints drive the cost: fewer evaluation"
            " rows (max_rows=) and checkpoints (steps=)."
        )

    @property
    def _on_batch(self):
        return None if self._estimated or not self.settings.progress else self._estimate

    # ---------------------------------------------------------------- recording
    def close(self) -> None:
        """Release the folder's recording lock (a later call records and takes it again)."""
        self.lock.release()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def done(self) -> set[int]:
        """Steps already recorded in the output folder."""
        return self._writer.done if self._writer is not None else self.folder.done

    def on_checkpoint(
        self, step: int, model: HookedModel | torch.nn.Module, training: dict | None = None
    ) -> CheckpointRecord | None:
        """Record `model` as checkpoint `step` (for use inside a training loop).

        model: a HookedTransformer, a TransformerBridge, or a Hugging Face causal LM (recorded
        through a bridge around a copy, so the model you train is never changed).  The random
        state is restored afterwards, so recording does not change the training that follows.
        training: the rates, optimizer and momentum (as `train` passes them), kept in the
        trajectory's meta for the theory's prediction.
        """
        if training:
            self._check_same_run(training)
            if self._writer is None:
                self.meta = {**training, **self.meta}
        if self.out.exists():
            self.lock.acquire()  # again after a `record` or `close` released it
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            if int(step) in self.done:
                return None
            model = _recordable(model)
            return self._decide(model).record_model(step, model, self._writer, self._on_batch)

    def record(self, source: CheckpointSource, execute=None) -> Trajectory:
        """Record every checkpoint of `source` not yet done, one model in memory at a time,
        the next one fetched in the background meanwhile (`sweep`), as the settings say:
        on_error ("raise" stops at an unreadable checkpoint, everything recorded so far
        saved; "skip" notes it in the manifest's ``skipped`` list), on_disk, keep_checkpoints
        and download_dir (the sweep's rules: `recording.sweep`), duplicates
        (checkpoints whose weights files are identical: "refuse", "skip" all but the last of
        each group, or "record").

        execute: who records the checkpoints after the first (which decides the run), as
        ``execute(run, checkpoints, fetcher, note_skip)``; default here, one at a time
        (`distributed.ray_execute`: one Ray task each).
        """
        fetcher = None
        try:
            todo = self._begin(source)
            s = self.settings
            fetcher = fetcher_for(source, s.on_disk, s.keep_checkpoints, s.download_dir)
            if fetcher is not None:  # with nothing to record, it still cleans up
                todo = self._drop_duplicates(source, todo, fetcher)
                if getattr(fetcher, "writes", False):  # one sweep in a folder at a time
                    self.lock.acquire()
                fetcher.prepare(todo, self.done, self.out)
            if todo:
                self._decide()  # where the folder or the settings already say the run
            while todo and self.run is None:  # else the first checkpoint that loads decides it
                self._sequentially(None, [todo.pop(0)], fetcher, self._note_skip)
            if todo:
                (execute or self._sequentially)(self.run, todo, fetcher, self._note_skip)
            self._end()
        finally:
            if fetcher is not None:
                fetcher.close()
            self.lock.release()
        return self.trajectory()

    def _note_skip(self, step: int, source: str, error: str) -> None:
        """A checkpoint that could not be recorded: raised, or noted (on_error="skip")."""
        if self.settings.on_error == "raise":
            raise CheckpointError(
                f"{error}; what is recorded is kept: fix or remove the checkpoint and record"
                " again to go on, or note it and go on (on_error='skip')"
            )
        self._skips.append((step, source, error))
        self._note_skips()

    def _sequentially(self, run, todo: list, fetcher, note_skip) -> None:
        """Record `todo` one at a time, the next fetched meanwhile (`sweep.Ahead`)."""
        with Ahead(todo, fetcher) as ahead:
            bar = tqdm(ahead, desc="checkpoints", unit="ckpt", disable=not self.settings.progress)
            for checkpoint, fetch_error in bar:
                failed = False
                try:
                    if fetch_error is not None:
                        raise fetch_error
                    if self.run is None:  # the first: its model decides the run
                        self._record_first(checkpoint)
                    else:
                        self.run.record(checkpoint, self._writer, self._on_batch)
                except CheckpointError as err:
                    note_skip(checkpoint.step, checkpoint.source, str(err))
                    failed = True
                if failed:  # the error's frames held the model: collected (`_collected`)
                    _collected()
                ahead.done(checkpoint)  # not on another error: its files stay for the resume

    def _record_first(self, checkpoint) -> None:
        def record() -> None:
            model = checkpoint.load()
            if self.settings.device is not None:
                model.to(self.settings.device)
            model = _recordable(model)
            self._decide(model).record_model(
                checkpoint.step, model, self._writer, self._on_batch, checkpoint.source
            )

        with _collected_after():
            record()

    def _drop_duplicates(self, source: CheckpointSource, todo: list, fetcher) -> list:
        """`todo` less the checkpoints that serve another step's weights, as the settings'
        ``duplicates`` say (see `record`)."""
        if self.settings.duplicates == "record":
            return todo
        groups = same_weights(fetcher.weights_ids(source.checkpoints))
        if not groups:
            return todo
        text = describe_duplicates(source.name, groups, len(source))
        if self.settings.duplicates == "refuse":
            raise DuplicateWeightsError(
                f"{text}: duplicates='skip' records only the last step of each group (whose"
                " weights they serve) and notes the others as skipped; duplicates='record'"
                " records them all"
            )
        drop = {step: group[-1] for group in groups for step in group[:-1]}
        tqdm.write(f"{text}: recording the last step of each group, skipping {len(drop)}")
        for checkpoint in todo:
            if checkpoint.step in drop:
                why = f"serves the same weights as step {drop[checkpoint.step]} (duplicates='skip')"
                self._skips.append((checkpoint.step, checkpoint.source, why))
        self._note_skips()  # a resumed folder notes them now; a new one once its run is decided
        return [c for c in todo if c.step not in drop]

    def _begin(self, source: CheckpointSource) -> list:
        """Check `source` against the folder, take the lock; the checkpoints still to record."""
        if source.step_unit != self.settings.step_unit:
            self.settings = self.settings.replace(step_unit=source.step_unit)
        known = {**source.meta, "source": source.name}
        self._check_same_run(known)
        if self._writer is None:
            self.meta = {**known, **self.meta}
        if self.out.exists():
            self.lock.acquire()
        todo = [c for c in source if c.step not in self.done]
        self._expected = len(todo) + len(self.done)
        if self.run is not None:  # resuming: the folder's plan, checked for this run
            self._check_budget(self.run)
        return todo

    def _end(self) -> None:
        if self._skips:  # none could be read, so no writer took them
            raise CheckpointError(
                "no checkpoint could be read: "
                + "; ".join(f"{source}: {error}" for _, source, error in self._skips)
            )
        if self._writer is not None:  # what other processes added
            self._writer.manifest = self.folder.manifest()

    def trajectory(self) -> Trajectory:
        return Trajectory.load(self.out)


def _window(settings: RecordingSettings, stats) -> int | None:
    """The context window the recording aggregates: the settings', or the statistics' (the
    context they counted); ValueError where both are given and differ."""
    if stats is None:
        return settings.window
    if settings.window is not None and settings.window != (stats.window or None):
        raise ValueError(
            f"window {settings.window} differs from the statistics' window"
            f" {stats.window or None}: record with the statistics' window"
        )
    return stats.window or None


def _tokenizer(tokenizer):
    """A tokenizer object: the one given, or the one a tokenizer.json or hub name names."""
    if isinstance(tokenizer, str):
        from scansnap_lens.inputs.tokens import load_tokenizer

        return load_tokenizer(tokenizer)
    return tokenizer


def _collected() -> None:
    """Collect a released model.  A model's reference cycles keep its weights, and with them
    the memory map of its file: a sweep deletes that file next, and its disk space would stay
    in use while the next revision downloads.  A full collection walks every object of the
    process (0.2 s with the libraries loaded, more in a full notebook): `_collected_after`
    walks only what the checkpoint made."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def _collected_after():
    """Around one checkpoint's load and record: the objects older than it are frozen
    (``gc.freeze``), so the collection at its end (`_collected`) walks only what it made,
    the released model's cycles among them (0.5 ms, not 0.2 s); then thawed.  A caller's own
    frozen objects are left as they are (a full collection then)."""
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        yield
    finally:
        try:
            _collected()
        finally:
            if freeze:
                gc.unfreeze()


def _prompt(settings: RecordingSettings, tokens) -> Tensor | None:
    """The example prompt [T']: the settings', or the first evaluation row's first tokens."""
    if settings.prompt is not None:
        return torch.tensor(settings.prompt, dtype=torch.long)
    length = PROMPT_LENGTH if settings.prompt_length is None else settings.prompt_length
    if length > 0 and isinstance(tokens, Tensor):
        return tokens[0, :length].reshape(-1).cpu()
    return None


def _check_same_text(out: Path, saved: RecordPlan, plan: RecordPlan) -> None:
    """ValueError naming what differs where `plan` (these tokens, planned for the folder's
    queries) is not of the text and context convention the folder's plan was made for."""
    differ = [
        what
        for what, a, b in (
            ("evaluation tokens (tokens=, max_rows=)", saved.fingerprint, plan.fingerprint),
            ("exclude_bos (exclude_bos=)", saved.exclude_bos, plan.exclude_bos),
            ("window (window=, or the statistics' window)", saved.window, plan.window),
            ("vocabulary", saved.vocab_size, plan.vocab_size),
        )
        if a != b
    ]
    if differ:
        raise ValueError(
            f"{out} was recorded with other {', '.join(differ)}: give those it was recorded"
            " with to resume it, record into another folder, or replace it (overwrite=True)"
        )


def _folder_aggregates(out: Path, manifest: dict) -> tuple[Aggregate, ...]:
    """The aggregates a folder records, to resume it; ValueError naming a notebook's own
    aggregate whose definition must be passed again."""
    found = [Aggregate.from_entry(e) for e in manifest_aggregates(manifest)]
    own = [a.name for a in found if not a.recordable]
    if own:
        raise ValueError(
            f"{out} records the aggregates {own} of your own: pass their definitions"
            " (RecordingSettings(aggregates=[...]) with every aggregate the folder records) to"
            " resume it"
        )
    return tuple(found)


def _recordable(model: HookedModel | torch.nn.Module) -> HookedModel:
    """`model` as the recorder hooks it: a Hugging Face model becomes a bridge around a copy."""
    return hf_bridge(copy.deepcopy(model).eval()) if is_hf_model(model) else model


def trainer_callback(recorder: Recorder, steps=None, observe=None):
    """A ``transformers.TrainerCallback`` that records at the start and at every save, and,
    with `steps` (optimizer steps, e.g. Pythia's 0, 1, 2, 4, ..., 512, 1000, ...), at each of
    them whether or not the Trainer saves there (no weights are written for those); `steps`
    may choose as training goes (``wants(step)`` and called as the recorder's
    `on_checkpoint`: `planning.placement.AdaptiveSchedule`), and then every recording,
    saves included, goes through it.  The Trainer's rate, optimizer and schedule go into the
    trajectory's meta (what the recorder's `meta` already says stays); the recorder is closed
    when training ends.  observe: called as ``observe(record, control)`` after each new
    recording (`reading.live.Live.watch`: metrics into the Trainer's loggers, a stop).

    >>> # trainer = transformers.Trainer(..., callbacks=[trainer_callback(recorder)])
    """
    from transformers import TrainerCallback

    chooses = hasattr(steps, "wants")
    wanted = None if steps is None or chooses else {int(s) for s in steps}
    recorded = steps if chooses else recorder.on_checkpoint

    def record(step: int, model, control) -> None:
        made = recorded(step, model)
        if made is not None and observe is not None:
            observe(made, control)

    class ScanSnapCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            from scansnap_lens.models.formats import training_arguments

            for key, value in training_arguments(args).items():  # what you set stays
                recorder.meta.setdefault(key, value)
            if model is not None and state.global_step == 0:
                record(0, model, control)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = state.global_step
            if model is not None and (
                step in wanted if wanted is not None else chooses and steps.wants(step)
            ):
                record(step, model, control)

        def on_save(self, args, state, control, model=None, **kwargs):
            if model is not None and state.global_step not in recorder.done:
                record(state.global_step, model, control)

        def on_train_end(self, args, state, control, **kwargs):
            recorder.close()  # the run is done: a report no longer reads it as recording

    return ScanSnapCallback()


def record_trajectory(
    source: CheckpointSource,
    tokens: Tensor,
    out: str | Path,
    settings: RecordingSettings | None = None,
    plan: RecordPlan | None = None,
    stats: CooccurrenceStats | None = None,
) -> Trajectory:
    """Plan (unless given), record every checkpoint of `source` into `out`, and load it."""
    if not len(source):
        raise ValueError("the checkpoint source is empty")
    return Recorder(out, tokens, settings, plan, stats).record(source)
