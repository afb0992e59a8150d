"""Record a model's attention over its checkpoints into a resumable trajectory folder.

recorder = Recorder("out/traj", tokens, plan)
recorder.record(checkpoints.folder("runs/my_model"))
# or, inside your own training loop:
recorder.on_checkpoint(step, model)
"""

from __future__ import annotations

import copy
import gc
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens._io import check_writable
from scansnap_lens.models.backend import hf_bridge, is_hf_model
from scansnap_lens.models.checkpoints import CheckpointError, CheckpointSource
from scansnap_lens.recording.aggregates import Aggregate, CheckpointRecord, resolve
from scansnap_lens.recording.budget import (
    BYTES_PER_VALUE,
    CHECKPOINT_BUDGET,
    RUN_BUDGET,
    duration,
    size_text,
)
from scansnap_lens.recording.hooks import (
    RunState,
    count_rows,
    record_checkpoint,
    row_sources,
    watched,
)
from scansnap_lens.recording.plan import (
    RecordPlan,
    plan_recording,
)
from scansnap_lens.recording.storage import (
    RecordingLock,
    TrajectoryWriter,
    _read_manifest,
    _read_plan,
    manifest_aggregates,
    remove_trajectory,
)
from scansnap_lens.recording.sweep import (
    DUPLICATES,
    ON_DISK,
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

__all__ = ["Recorder", "record_trajectory", "trainer_callback"]

# the meta a Trainer's trainer_state.json gives (`formats.trainer_training`)
TRAINER_KEYS = {"lr_y", "lr_z", "optimizer", "momentum", "lr_schedule", "training_from"}


class Recorder:
    """Records checkpoints into ``out``; steps already recorded there are skipped.

    tokens: the evaluation tokens [N, T] (or batches) the plan was built from.
    plan: what to track (`plan.plan_recording`); without one, the recorder plans for
    `queries` (None: the queries that fit the budget, below; "all": every query; a float:
    the most frequent covering that share of the events; or token ids), `exclude_bos` and
    `tokenizer` (for token strings; default the model's) from the first model it records, or,
    resuming a folder, with the folder's vocabulary (and its queries unless given): a plan
    that differs from the folder's is refused.
    stats: corpus statistics; with ``queries=None`` the plan is made for the scan's power:
    the queries whose distinct and common tokens (by the statistics' token kinds, the default
    `groups.Classification`) both occur in the evaluation text, each with its distinct tokens
    and a sample of its common ones (`plan.plan_recording` with ``groups``); and the recording
    takes their context window.
    window: W, the most context positions before a query that the recording aggregates
    (default: the statistics' window, or the whole row without statistics).
    max_checkpoint_bytes, max_run_bytes: the budget.  With ``queries=None`` the plan takes
    the queries in that order while they fit one checkpoint's bytes and, when `record` knows
    how many checkpoints it records, the run's share per checkpoint (`plan.budget_queries`);
    any plan whose run would write more than `max_run_bytes` is refused before anything is
    written.
    layers, heads: what to watch (default: all); step_unit: "steps" or "tokens".
    prompt: [T'] ids whose full attention weights are kept at every checkpoint (for attention
    maps and circuitsvis views); by default the first ``prompt_length`` tokens of the first
    evaluation sequence (``prompt_length=0``: none).
    aggregates: what each checkpoint records (`aggregates.AGGREGATES` entries, by object or
    name; a notebook's own `aggregates.Aggregate` among them); default `aggregates.DEFAULT`
    for a new folder, and what the folder records for one that resumes.
    overwrite: replace a trajectory of another run in ``out``.  Without it, a folder whose
    run differs (plan, layers, heads, prompt, or a value of ``meta`` such as the rates or the
    checkpoint source) is refused with what differs; the same run resumes.

    While it records, the recorder holds the folder's `RecordingLock`: a recorder in another
    process fails at once.  `record` releases it when done; `on_checkpoint` (a training loop)
    holds it until `close` or the end of the process (``with Recorder(...) as recorder:``).
    """

    def __init__(
        self,
        out: str | Path,
        tokens: Tensor,
        plan: RecordPlan | None = None,
        layers=None,
        heads=None,
        step_unit: str = "steps",
        batch_size: int = 8,
        device=None,
        progress: bool = True,
        meta: dict | None = None,
        prompt: Tensor | None = None,
        prompt_length: int = 64,
        overwrite: bool = False,
        queries=None,
        exclude_bos: bool = False,
        tokenizer=None,
        stats: CooccurrenceStats | None = None,
        window: int | None = None,
        max_checkpoint_bytes: int = CHECKPOINT_BUDGET,
        max_run_bytes: int = RUN_BUDGET,
        aggregates=None,
    ):
        self.out = Path(out)
        if tokens is not None and not isinstance(tokens, Tensor):
            tokens = [torch.as_tensor(b) for b in tokens]  # read at every checkpoint
        self.aggregates = resolve(aggregates)
        self._aggregates_given = aggregates is not None
        self.state = RunState()  # what the run's checkpoints share, decided at the first
        self.entries: list[dict] | None = None  # the manifest's aggregate entries
        for name, value in (("max_checkpoint_bytes", max_checkpoint_bytes),
                            ("max_run_bytes", max_run_bytes)):  # fmt: skip
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        for name, values in (("layers", layers), ("heads", heads)):
            _check_indices(name, values)
        if isinstance(queries, str) and queries != "all":
            raise ValueError(f"queries must be None, 'all', a share, or token ids, not {queries!r}")
        self.max_checkpoint_bytes = int(max_checkpoint_bytes)
        self.max_run_bytes = int(max_run_bytes)
        self.stats = stats
        self._expected: int | None = None  # checkpoints of the run, where `record` knows them
        self._said: tuple[int | None] | None = None  # (run size) the plan's line was said for
        self._estimated = False  # the run's cost said, after its first batch
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"{self.out} is a file, not a folder for the trajectory")
        check_writable(self.out)  # before any checkpoint is loaded
        self.lock = RecordingLock(self.out)
        if (self.out / "manifest.json").exists():
            self.lock.acquire()  # before anything of the folder is read or removed
        try:
            if stats is not None:  # record the context the statistics counted
                if window is not None and window != (stats.window or None):
                    raise ValueError(
                        f"window {window} differs from the statistics' window"
                        f" {stats.window or None}: record with the statistics' window"
                    )
                window = stats.window or None
            planning = {"queries": queries, "exclude_bos": exclude_bos, "tokenizer": tokenizer,
                        "window": window}  # fmt: skip
            self._open(tokens, plan, layers, heads, step_unit, batch_size, device, progress,
                       meta, prompt, prompt_length, overwrite, planning)  # fmt: skip
        except BaseException:
            self.lock.release()  # a refused folder stays free for a corrected recorder
            raise

    def _open(self, tokens, plan, layers, heads, step_unit, batch_size, device, progress, meta,
              prompt, prompt_length, overwrite, planning) -> None:  # fmt: skip
        if plan is not None and (
            planning["queries"] is not None
            or self.stats is not None
            or planning["exclude_bos"]
            or planning["tokenizer"] is not None
            or planning["window"] is not None
        ):
            raise ValueError(
                "give a plan, or queries (stats, window, exclude_bos, tokenizer) to plan for"
            )
        if overwrite and (self.out / "manifest.json").exists():
            remove_trajectory(self.out)
        manifest_path = self.out / "manifest.json"
        if plan is None and planning["queries"] is None:  # what the budget planning reads
            meta = {**(meta or {}), **self._planned_for()}
        if plan is None and manifest_path.exists():  # resuming: plan as the folder did
            saved = _read_plan(self.out / _read_manifest(self.out).get("plan", "plan.safetensors"))
            queries = saved.queries if planning["queries"] is None else planning["queries"]
            queries = None if isinstance(queries, str) else queries  # "all"
            plan = plan_recording(tokens, saved.vocab_size, queries=queries,
                                  exclude_bos=planning["exclude_bos"],
                                  window=saved.window if planning["window"] is None
                                  else planning["window"],
                                  include_self=saved.include_self,
                                  tokenizer=planning["tokenizer"])  # fmt: skip
            if planning["queries"] is None:  # planned by the budget: the folder's plan holds
                _check_same_text(self.out, saved, plan)
                plan = saved
        self._planning = planning
        default_prompt = prompt is None
        if prompt is None and prompt_length > 0 and isinstance(tokens, Tensor):
            prompt = tokens[0, :prompt_length]
        self.prompt = None if prompt is None else torch.as_tensor(prompt).reshape(-1).cpu()
        self.tokens, self.plan = tokens, plan
        self.layers, self.heads = layers, heads
        self.step_unit = step_unit
        self.batch_size, self.device, self.progress = batch_size, device, progress
        self.meta = meta or {}
        self._writer: TrajectoryWriter | None = None
        self._skips: list[tuple[int, str, str]] = []
        if (self.out / "manifest.json").exists():
            # Resuming: check the folder against this plan now, before any model is loaded.
            manifest = _read_manifest(self.out)
            if not self._aggregates_given:  # record what the folder records
                self.aggregates = _folder_aggregates(self.out, manifest)
            self.layers = manifest["layers"] if layers is None else layers
            self.heads = manifest["heads"] if heads is None else heads
            if default_prompt:  # keep the prompt already recorded
                saved = manifest.get("prompt")
                self.prompt = None if saved is None else torch.tensor(saved, dtype=torch.long)
            self._writer_for()

    def _planned_for(self) -> dict:
        """What a plan made by the budget depends on (kept in the manifest's meta, so a
        resume with another value is refused naming it), never how many checkpoints are
        left to record."""
        return {
            "plan_stats": None if self.stats is None else str(self.stats.fingerprint),
            "max_checkpoint_bytes": self.max_checkpoint_bytes,
            "max_run_bytes": self.max_run_bytes,
        }

    def _check_same_run(self, meta: dict) -> None:
        """Refuse to add to a folder that holds another run: a value of `meta` it has differs."""
        saved = _read_manifest(self.out)["meta"] if (self.out / "manifest.json").exists() else {}
        # a Trainer's trainer_state.json grows while it trains: what it said when the
        # recording began stays (the checkpoint folder, `source`, still tells runs apart)
        growing = TRAINER_KEYS if str(meta.get("training_from", "")).startswith(
            "trainer_state.json"
        ) else set()  # fmt: skip
        differ = {
            k: (saved[k], v)
            for k, v in meta.items()
            if k in saved
            and k not in growing
            and json.loads(json.dumps(saved[k])) != json.loads(json.dumps(v))
        }
        if differ:
            flags = {"plan_stats": " (stats=, --stats)", "max_run_bytes": " (--max-run-gb)",
                     "max_checkpoint_bytes": " (--max-checkpoint-mb)"}  # fmt: skip
            what = "; ".join(
                f"{k}{flags.get(k, '')} {old!r} there, {new!r} here"
                for k, (old, new) in differ.items()
            )
            raise ValueError(
                f"{self.out} holds another run ({what}): give the values it was recorded with"
                " to resume it, record into another folder, or replace it (overwrite=True,"
                " --overwrite)"
            )

    def _writer_for(self, model=None) -> TrajectoryWriter | None:
        """The writer; it needs the layers and heads, so perhaps a model to count them."""
        if self._writer is None:
            self._check_same_run(self.meta)
            if model is None and (self.plan is None or self.layers is None or self.heads is None):
                return None
            if model is not None:  # checked before anything is written into the folder
                layers, heads = watched(model, self.layers, self.heads)
            else:
                layers, heads = list(self.layers), list(self.heads)
            vocab = int(model.cfg.d_vocab) if model is not None else self.plan.vocab_size
            self.entries = self._entries(vocab)
            if self.plan is None:  # planned from the first model: its vocabulary, its tokenizer
                self.plan = self._plan_for(model, len(layers) * len(heads))
            self._check_budget(len(layers) * len(heads))
            self.layers, self.heads = layers, heads
            self.lock.acquire()
            self._writer = TrajectoryWriter(
                self.out, self.plan, layers, heads, self.step_unit, self.meta, prompt=self.prompt,
                aggregates=self.entries,
            )  # fmt: skip
        for skip in self._skips:
            self._writer.skip(*skip)
        self._skips = []
        return self._writer

    @property
    def _prompt_length(self) -> int:
        return 0 if self.prompt is None else int(self.prompt.numel())

    def _entries(self, vocab_size: int) -> list[dict]:
        """The manifest entries of the aggregates; a rows aggregate's rows decided (once)."""
        sources = row_sources(self.aggregates, self.tokens, vocab_size, self.state)
        rows = count_rows(self.tokens)
        out = []
        for agg in self.aggregates:
            own, words = sources.get(agg.name, (None, ""))
            out.append(agg.entry(rows if own is None else own.shape[0], words))
        return out

    def _fixed_slots(self) -> int:
        """Values per head that do not depend on the plan's queries: the rows aggregates'."""
        return sum(e.get("slots", 0) for e in self.entries if e["axis"] == "rows")

    def _checkpoint_bytes(self, num_heads: int) -> int:
        """Bytes of one checkpoint's tensors: every aggregate's slots and the prompt's
        weights, per watched head."""
        slots = sum(
            e["slots"] if e["axis"] == "rows" else Aggregate.from_entry(e).slots(self.plan)
            for e in self.entries
        )
        return BYTES_PER_VALUE * num_heads * (slots + self._prompt_length**2)

    def _plan_for(self, model, num_heads: int) -> RecordPlan:
        """The plan of the first model: the asked queries, or those that fit the budget."""
        options = self._planning
        queries, max_slots, groups = options["queries"], None, None
        if queries is None:
            budget = self.max_checkpoint_bytes
            if self._expected:
                budget = min(budget, self.max_run_bytes // self._expected)
            per_head = budget // (BYTES_PER_VALUE * num_heads) - self._prompt_length**2
            max_slots = max(per_head - self._fixed_slots(), 1)
            if self.stats is not None:  # plan for the scan's power: see `plan_recording`
                try:
                    groups = TokenGroups.from_statistics(self.stats)
                except ValueError:
                    groups = None  # nothing classified distinct: the most frequent queries
        elif isinstance(queries, str):  # "all"
            queries = None
        return plan_recording(
            self.tokens,
            int(model.cfg.d_vocab),
            queries=queries,
            exclude_bos=options["exclude_bos"],
            window=options["window"],
            tokenizer=options["tokenizer"] or getattr(model, "tokenizer", None),
            max_slots=max_slots,
            groups=groups,
        )

    def _check_budget(self, num_heads: int) -> None:
        """Say the plan's size; refuse a run that would write more than `max_run_bytes`."""
        per = self._checkpoint_bytes(num_heads)
        runs = self._expected
        total = "" if not runs else f", {size_text(per * runs)} for {runs} checkpoints"
        if self.progress and self._said != (runs,):
            self._said = (runs,)
            tqdm.write(f"plan: {self.plan.describe()}; {size_text(per)} per checkpoint{total}")
        if runs and per * runs > self.max_run_bytes:
            total, budget = size_text(per * runs), size_text(self.max_run_bytes)
            raise ValueError(
                f"the recording would write {total} ({size_text(per)} per checkpoint for"
                f" {runs} checkpoints; {self.plan.describe()}), over the budget of"
                f" {budget} (max_run_bytes, --max-run-gb): track fewer queries (queries=,"
                " --queries), watch fewer layers or heads (layers=, heads=, --layers,"
                " --heads), select fewer checkpoints (steps=, --steps), or raise the budget"
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
        heads = len(self.layers) * len(self.heads)
        disk = self._checkpoint_bytes(heads)
        run = (
            f", {duration(per_checkpoint * left)} and {size_text(disk * left)} for the {left}"
            " checkpoints to record"
            if left > 0 else ""
        )  # fmt: skip
        tqdm.write(
            f"estimate: {rows} rows of {length} tokens, {total} batches per checkpoint; the"
            f" first took {duration(seconds)}: about {duration(per_checkpoint)} per checkpoint"
            f"{run} (loading aside).  Rows and checkpoints drive the cost: fewer with"
            " --max-rows and --steps (fewer evaluation rows, steps=)."
        )

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
        if self._writer is not None:
            return self._writer.done
        if (self.out / "manifest.json").exists():
            return {c["step"] for c in _read_manifest(self.out)["checkpoints"]}
        return set()

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
            return self._record_model(step, model)

    def _record_model(self, step: int, model) -> CheckpointRecord | None:
        if is_hf_model(model):
            if int(step) in self.done:
                return None
            model = recordable(model)
        writer = self._writer_for(model)
        if int(step) in writer.done:
            return None
        record = record_checkpoint(
            model,
            self.tokens,
            self.plan,
            step=int(step),
            layers=self.layers,
            heads=self.heads,
            batch_size=self.batch_size,
            device=self.device,
            progress=self.progress,
            prompt=self.prompt,
            on_batch=None if self._estimated or not self.progress else self._estimate,
            aggregates=self.aggregates,
            state=self.state,
        )
        writer.write(record)
        return record

    def record(
        self,
        source: CheckpointSource,
        on_error: str = "raise",
        on_disk: int = ON_DISK,
        keep_checkpoints: bool = False,
        download_dir: str | Path | None = None,
        duplicates: str = "refuse",
    ) -> Trajectory:
        """Record every checkpoint of `source` not yet done, one model in memory at a time,
        the next one fetched in the background meanwhile (`sweep`).

        on_error: "raise" stops at an unreadable checkpoint (everything recorded so far stays
        saved); "skip" notes it in the manifest's ``skipped`` list and goes on.
        on_disk: hub revisions of the sweep on disk at once (the one recording included).
        Revisions your hub cache holds are read from it, never changed; the others download
        into the sweep's own cache (``download_dir``, default ``hub-cache/`` in the recording
        folder) and are deleted from it once recorded, unless keep_checkpoints (then into
        your hub cache, kept).
        duplicates: checkpoints whose weights files are identical under different steps
        (from the hashes the hub lists, or of local files), found before anything is
        fetched: "refuse" (DuplicateWeightsError, saying which), "skip" (each group's last
        step recorded, the others noted as skipped) or "record" (all of them).
        """
        fetcher = None
        try:
            todo = self._begin(source, on_error)
            fetcher = fetcher_for(source, on_disk, keep_checkpoints, download_dir)
            if fetcher is not None:  # with nothing to record, it still cleans up
                todo = self._drop_duplicates(source, todo, fetcher, duplicates)
                if getattr(fetcher, "writes", False):  # one sweep in a folder at a time
                    self.lock.acquire()
                fetcher.prepare(todo, self.done, self.out)
            self._record_sequentially(todo, on_error, fetcher)
            self._end()
        finally:
            if fetcher is not None:
                fetcher.close()
            self.lock.release()
        return self.trajectory()

    def _drop_duplicates(self, source: CheckpointSource, todo: list, fetcher, duplicates: str):
        """`todo` less the checkpoints that serve another step's weights, as `duplicates`
        says (see `record`)."""
        if duplicates not in DUPLICATES:
            raise ValueError(f"duplicates must be one of {DUPLICATES}, got {duplicates!r}")
        if duplicates == "record":
            return todo
        groups = same_weights(fetcher.weights_ids(source.checkpoints))
        if not groups:
            return todo
        text = describe_duplicates(source.name, groups, len(source))
        if duplicates == "refuse":
            raise DuplicateWeightsError(
                f"{text}: duplicates='skip' (--duplicates skip) records only the last step of"
                " each group (whose weights they serve) and notes the others as skipped;"
                " duplicates='record' (--duplicates record) records them all"
            )
        drop = {step: group[-1] for group in groups for step in group[:-1]}
        tqdm.write(f"{text}: recording the last step of each group, skipping {len(drop)}")
        for checkpoint in todo:
            if checkpoint.step in drop:
                why = f"serves the same weights as step {drop[checkpoint.step]} (duplicates='skip')"
                self._skips.append((checkpoint.step, checkpoint.source, why))
        self._writer_for()  # a resumed folder notes them now; a new one at its first record
        return [c for c in todo if c.step not in drop]

    def _begin(self, source: CheckpointSource, on_error: str) -> list:
        """Check `source` against the folder, take the lock; the checkpoints still to record."""
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if source.step_unit != self.step_unit:
            self.step_unit = source.step_unit
        known = {**source.meta, "source": source.name}
        self._check_same_run(known)
        if self._writer is None:
            self.meta = {**known, **self.meta}
        if self.out.exists():
            self.lock.acquire()
        todo = [c for c in source if c.step not in self.done]
        self._expected = len(todo) + len(self.done)
        if self._writer is not None:  # resuming: the folder's plan, checked for this run
            self._check_budget(len(self.layers) * len(self.heads))
        return todo

    def _record_sequentially(self, todo: list, on_error: str, fetcher=None) -> None:
        with Ahead(todo, fetcher) as ahead:
            bar = tqdm(ahead, desc="checkpoints", unit="ckpt", disable=not self.progress)
            for checkpoint, fetch_error in bar:
                self._record_one(checkpoint, fetch_error, on_error)
                ahead.done(checkpoint)  # not on an error: its files stay for the resume

    def _record_one(self, checkpoint, fetch_error, on_error: str) -> None:
        try:
            if fetch_error is not None:
                raise fetch_error
            model = checkpoint.load()
            self._check_architecture(checkpoint, model)
        except CheckpointError as err:
            if on_error == "raise":
                raise
            self._skips.append((checkpoint.step, checkpoint.source, str(err)))
            self._writer_for()
            return
        self.on_checkpoint(checkpoint.step, model)
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _check_architecture(self, checkpoint, model) -> None:
        """CheckpointError naming the checkpoint where it lacks a layer or head the recording
        watches (a run whose architecture changed): skipped under on_error="skip"."""
        if self.layers is None or self.heads is None:
            return  # the first model decides
        n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
        if max(self.layers) >= n_layers or max(self.heads) >= n_heads:
            raise CheckpointError(
                f"{checkpoint.source}: checkpoint {checkpoint.step} has {n_layers} layers of"
                f" {n_heads} heads, but the recording watches layers {self.layers} and heads"
                f" {self.heads} (as its first checkpoint had them): another architecture"
                " (--on-error skip passes it over)"
            )

    def _end(self) -> None:
        if self._skips:  # none could be read, so no writer took them
            raise CheckpointError(
                "no checkpoint could be read: "
                + "; ".join(f"{source}: {error}" for _, source, error in self._skips)
            )

    def trajectory(self) -> Trajectory:
        return Trajectory.load(self.out)


def _check_same_text(out: Path, saved: RecordPlan, plan: RecordPlan) -> None:
    """ValueError naming what differs where `plan` (these tokens, planned for the folder's
    queries) is not of the text and context convention the folder's plan was made for."""
    differ = [
        what
        for what, a, b in (
            ("the evaluation tokens (tokens=, --tokens, --text, --max-rows)", saved.fingerprint,
             plan.fingerprint),
            ("exclude_bos (--exclude-bos)", saved.exclude_bos, plan.exclude_bos),
            ("window (--window, or the statistics' window)", saved.window, plan.window),
            ("the vocabulary", saved.vocab_size, plan.vocab_size),
        )
        if a != b
    ]  # fmt: skip
    if differ:
        raise ValueError(
            f"{out} was recorded with other {', '.join(differ)}: give those it was recorded"
            " with to resume it, record into another folder, or replace it (overwrite=True,"
            " --overwrite)"
        )


def _folder_aggregates(out: Path, manifest: dict) -> tuple[Aggregate, ...]:
    """The aggregates a folder records, to resume it; ValueError naming a notebook's own
    aggregate whose definition must be passed again."""
    found = [Aggregate.from_entry(e) for e in manifest_aggregates(manifest)]
    own = [a.name for a in found if not a.recordable]
    if own:
        raise ValueError(
            f"{out} records the aggregates {own} of your own: pass their definitions"
            " (Recorder(..., aggregates=[...]) with every aggregate the folder records) to"
            " resume it"
        )
    return tuple(found)


def _check_indices(name: str, values) -> None:
    """ValueError naming `values` unless they are distinct non-negative integers (or None)."""
    if values is None:
        return
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise ValueError(f"{name} must be non-negative integers, got {values} (--{name})")
    if len(set(values)) < len(values):
        twice = sorted({v for v in values if values.count(v) > 1})
        raise ValueError(f"{name} {values} name {twice} more than once: give each once (--{name})")


def recordable(model: HookedModel | torch.nn.Module) -> HookedModel:
    """`model` as the recorder hooks it: a Hugging Face model becomes a bridge around a copy."""
    return hf_bridge(copy.deepcopy(model).eval()) if is_hf_model(model) else model


def trainer_callback(recorder: Recorder, steps=None):
    """A ``transformers.TrainerCallback`` that records at the start and at every save, and,
    with `steps` (optimizer steps, e.g. Pythia's 0, 1, 2, 4, ..., 512, 1000, ...), at each of
    them whether or not the Trainer saves there (no weights are written for those).  The
    Trainer's rate, optimizer and schedule go into the trajectory's meta (what the recorder's
    `meta` already says stays).

    >>> # trainer = transformers.Trainer(..., callbacks=[trainer_callback(recorder)])
    """
    from transformers import TrainerCallback

    wanted = None if steps is None else {int(s) for s in steps}

    class ScanSnapCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            from scansnap_lens.models.formats import training_arguments

            for key, value in training_arguments(args).items():  # what you set stays
                recorder.meta.setdefault(key, value)
            if model is not None and state.global_step == 0:
                recorder.on_checkpoint(0, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if model is not None and wanted is not None and state.global_step in wanted:
                recorder.on_checkpoint(state.global_step, model)

        def on_save(self, args, state, control, model=None, **kwargs):
            if model is not None and state.global_step not in recorder.done:
                recorder.on_checkpoint(state.global_step, model)

    return ScanSnapCallback()


def record_trajectory(
    source: CheckpointSource,
    tokens: Tensor,
    out: str | Path,
    plan: RecordPlan | None = None,
    queries=None,
    on_error: str = "raise",
    **kwargs,
) -> Trajectory:
    """Plan (unless given), record every checkpoint of `source` into `out`, and load the result."""
    if not len(source):
        raise ValueError("the checkpoint source is empty")
    recorder = Recorder(out, tokens, plan, queries=None if plan is not None else queries, **kwargs)
    return recorder.record(source, on_error=on_error)
