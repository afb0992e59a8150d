"""Scan and snap while the model trains: each recorded checkpoint's figures as metrics for
the trainer's own loggers, and the events (a layer snapped, a head formed) as they happen.

`Live` wraps a `Recorder`.  At each checkpoint the recorder records, it computes from that
checkpoint's record (and the first one's, kept in memory) the report's own per-checkpoint
figures: the scan's ``bias`` and ``auroc`` (`QueryTokens.figures`), the frequency bias
``spearman`` (`ClassTokens`), the attention's movement ``rate`` per step since the last
checkpoint and its ``distance`` from the first (`snap.head_movement`), the
``attention_entropy`` (`entropy.over_queries`), the ``previous_token``, ``first_token`` and
``induction`` scores (mean over rows) and the evaluation ``loss``, named as loggers group them:
``scansnap/layer0/auroc`` (the mean over the layer's heads), or ``scansnap/layer0/head1/auroc``
with ``per_head``.  Nothing is computed at steps the recorder does not record.

Events, each logged once with the step it was seen at:

- ``snap/layer{l}``: half or more of the layer's heads have a rate of movement fallen to half
  its peak, as the report reads the checkpoints so far (`snap.snapping`, over each head's
  drift knots; looked at once `snap.snap_step` over every checkpoint says so, within a budget
  of `LOOK_READS` checkpoint reads per checkpoint), once training has gone `HELD` times past the
  step (on 1 + step) with the rate still down and the head's attention has moved by
  `MIN_MOVED` (total variation) from the first checkpoint; logged as
  ``scansnap/layer0/snap_step`` (the median of those heads' steps) with ``_lo``/``_hi`` (the
  medians of the checkpoints that bracket them).
- ``{type}/layer{l}/head{h}``: a head's previous-token, first-token or induction score rose
  significantly since the first checkpoint (paired over rows, Holm over heads, at least
  `head_types.MIN_RISE`: the report's own rule at this horizon) and has stopped rising (its
  rise per log-step under half its peak: a phase change past its midpoint); logged as
  ``scansnap/layer0/head1/previous_token_step`` with its bracket (`formation_step` over the
  checkpoints so far).  A head that rises again later is placed later by the report: an
  event says what the checkpoints showed when it was logged.

A plain loop calls ``live.on_checkpoint(step, model)`` where it would call the recorder's
(the metrics come back as a dict, and go to each of `to`: a TensorBoard ``SummaryWriter``, or
any callable as ``f(metrics, step)``); a ``transformers.Trainer`` gets them through its own
``log``, so every ``report_to`` logger receives them: ``live.watch(trainer)``.

>>> # live = Live(recorder, LiveSettings(stop_when=("snap",)))
>>> # live.watch(trainer)  # trainer = Trainer(..., args=TrainingArguments(report_to="tensorboard"))
>>> # trainer.train()      # stops once every layer has snapped
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens._settings import Settings
from scansnap_lens.measures.discriminative import QueryTokens
from scansnap_lens.measures.entropy import over_queries
from scansnap_lens.measures.frequency import ClassTokens
from scansnap_lens.measures.head_types import MIN_RISE, formation_step
from scansnap_lens.measures.resampling import ALPHA, adjust, mean_over_units
from scansnap_lens.measures.snap import head_movement, snap_step, snapping
from scansnap_lens.recording.aggregates import DEFAULT, CheckpointRecord
from scansnap_lens.statistics.groups import Classification, TokenGroups

__all__ = ["EVENT_KINDS", "Event", "Live", "LiveSettings"]

HEAD_TYPES = tuple(a.name for a in DEFAULT if a.axis == "rows")  # the built-in head types
EVENT_KINDS = ("snap", "formation", *HEAD_TYPES)  # what stop_when names
PREFIX = "scansnap"
# the report's snap reads every checkpoint so far: the looks read at most this many
# checkpoints per checkpoint recorded, a budget saved until the first look needs it (at
# Pythia-70m's shape a read is 2.7 % of recording it: bench_pythia.py's live_snap_look_cost)
LOOK_READS = 2
# a snap is told once the training has gone this factor past it (on 1 + step) with the rate
# still under half its peak, and once the head's attention has moved this far (total
# variation from the first checkpoint, as a head type's score must rise by
# `head_types.MIN_RISE`): the paper's run has an early, tiny peak (its attention moved by
# 0.01) that the phase change replaces: read then, its snap is 27 where the finished run's
# is 125
HELD = 1.5
MIN_MOVED = 0.1


@dataclass(frozen=True)
class LiveSettings(Settings):
    """What `Live` reports.  per_head: metrics per head (default: per layer, the mean over
    its heads; events are per head either way); stop_when: events after which training
    stops, each a kind (``"snap"``: every layer snapped, ``"formation"``: any head type,
    ``"previous_token"``, ...) or one event's name (``"snap/layer1"``,
    ``"induction/layer1/head3"``): training stops once every entry has happened; say: one
    console line per event; classification: how the statistics' tokens get their kinds (as
    the report's `AnalysisSettings.classification`)."""

    per_head: bool = False
    stop_when: tuple[str, ...] = ()
    say: bool = True
    classification: Classification = field(default_factory=Classification)

    def __post_init__(self):
        stop = (self.stop_when,) if isinstance(self.stop_when, str) else self.stop_when
        object.__setattr__(self, "stop_when", tuple(stop))
        for entry in self.stop_when:
            kind, *where = str(entry).split("/")
            if kind not in EVENT_KINDS or (where and kind == "formation"):
                raise ValueError(
                    f"stop_when entry {entry!r} names no event: a kind (one of"
                    f" {', '.join(EVENT_KINDS)}), or an event's name such as"
                    " 'snap/layer1' or 'induction/layer1/head3'"
                )


@dataclass(frozen=True)
class Event:
    """A snap or formation seen while training: name (``snap/layer0``,
    ``previous_token/layer0/head1``), kind, layer, head (None for a layer's snap), the step
    it is placed at with the checkpoints that bracket it (lo, hi), and seen_at: the step of
    the checkpoint that showed it."""

    name: str
    kind: str
    layer: int
    head: int | None
    step: float
    lo: float
    hi: float
    seen_at: int

    def sentence(self) -> str:
        what = (
            f"layer {self.layer} snapped"
            if self.kind == "snap"
            else f"layer {self.layer} head {self.head} became a {self.kind.replace('_', '-')} head"
        )
        return (
            f"scansnap: {what} near step {_num(self.step)} [{_num(self.lo)}, {_num(self.hi)}]"
            f" (seen at step {self.seen_at})"
        )

    def metrics(self) -> dict[str, float]:
        where = f"{PREFIX}/layer{self.layer}" + ("" if self.head is None else f"/head{self.head}")
        name = "snap_step" if self.kind == "snap" else f"{self.kind}_step"
        return {
            f"{where}/{name}": self.step,
            f"{where}/{name}_lo": self.lo,
            f"{where}/{name}_hi": self.hi,
        }


def _num(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) else "?"


class Live:
    """The figures and events of a recording as it is made (module docstring).

    recorder: the `Recorder` (its statistics, when it has them, give the token groups the
    scan's figures need); settings: `LiveSettings`; to: where the metrics go besides the
    returned dict (a ``SummaryWriter``, a callable ``f(metrics, step)``, or a list of them);
    record: what records a checkpoint (default the recorder's ``on_checkpoint``; an
    `AdaptiveSchedule` to choose the steps as it goes).

    metrics: {step: that checkpoint's metrics}; events: in the order seen; stop: whether
    every ``stop_when`` entry has happened.
    """

    def __init__(self, recorder, settings: LiveSettings | None = None, to=(), record=None):
        if settings is not None and not isinstance(settings, LiveSettings):
            raise TypeError(f"settings must be LiveSettings, got {type(settings).__name__}")
        self.recorder = recorder
        self.settings = settings or LiveSettings()
        self.to = [] if to is None else list(to) if isinstance(to, list | tuple) else [to]
        self.record = record if record is not None else recorder.on_checkpoint
        self.metrics: dict[int, dict[str, float]] = {}
        self.events: list[Event] = []
        self.steps: list[int] = []
        self._first = None  # the first checkpoint's record
        self._last_c_hat: Tensor | None = None
        self._moves: list[Tensor] = []  # [L, H] per interval
        self._scores: dict[str, list[Tensor]] = {}  # type -> [L, H] per checkpoint
        self._units = self._classes = None
        self._no_groups: str | None = None
        self._rows: dict[str, Tensor] = {}
        self._read = 0  # checkpoints the looks at the snap have read
        self._distance: Tensor | None = None  # [L, H] from the first checkpoint

    # ------------------------------------------------------------------ the loop's side
    def on_checkpoint(self, step: int, model, training: dict | None = None) -> dict | None:
        """Record `model` at `step` (as the recorder's ``on_checkpoint``) and return its
        metrics, sent to each of `to` too; None where the step was recorded already."""
        record = self.record(step, model, training=training)
        return None if record is None else self.observe(record)

    def watch(self, trainer, steps=None):
        """Record while `trainer` (a ``transformers.Trainer``) trains, at the steps
        `recorder.trainer_callback` takes with `steps`, each checkpoint's metrics and events
        logged through ``trainer.log`` (so every ``report_to`` logger gets them), and
        training stopped once `stop` holds.  Returns the callback it added."""
        from scansnap_lens.recording.recorder import trainer_callback

        def observe(record, control) -> None:
            trainer.log(dict(self.observe(record)))
            if self.stop:
                control.should_training_stop = True

        callback = trainer_callback(self.recorder, steps, observe=observe)
        trainer.add_callback(callback)
        return callback

    @property
    def stop(self) -> bool:
        wanted = self.settings.stop_when
        if not wanted:
            return False
        return all(self._happened(entry) for entry in wanted)

    def _happened(self, entry: str) -> bool:
        names = [e.name for e in self.events]
        if entry == "snap":  # every layer
            layers = self.recorder.run.layers if self.recorder.run is not None else []
            return bool(layers) and all(f"snap/layer{layer}" in names for layer in layers)
        if entry == "formation":
            return any(e.kind in HEAD_TYPES for e in self.events)
        return any(n == entry or n.startswith(entry + "/") for n in names)

    # ------------------------------------------------------------------ the figures
    def observe(self, record) -> dict[str, float]:
        """The metrics of a new checkpoint's `record` (`CheckpointRecord`), its events logged
        and said; sent to each of `to`."""
        step = int(record.step)
        if self._first is None:
            self._begin(record)
            if self._no_groups is not None and self.settings.say:
                tqdm.write(f"scansnap: no scan metrics (bias, auroc, spearman): {self._no_groups}")
        values = self._figures(record)
        out = self._named(values)
        if record.loss is not None:
            out[f"{PREFIX}/loss"] = float(record.loss)
        self.steps.append(step)
        for event in self._new_events(step):
            self.events.append(event)
            out.update(event.metrics())
            if self.settings.say:
                tqdm.write(event.sentence())
        self.metrics[step] = out
        for sink in self.to:
            _send(sink, out, step)
        return out

    def _begin(self, record) -> None:
        """The first checkpoint seen: its record is the origin of every change; earlier
        checkpoints already in the folder (a resumed run) are read back first."""
        run = self.recorder.run
        plan = run.plan
        stats = getattr(self.recorder, "stats", None)
        if stats is None:
            self._no_groups = "no corpus statistics (record with stats=)"
        else:
            try:
                groups = TokenGroups.from_statistics(
                    stats, plan.queries.tolist(), self.settings.classification
                )
                self._units = QueryTokens.of_plan(plan, groups)
                self._classes = ClassTokens.of_plan(plan, groups)
                if not self._classes.num_classes:
                    self._classes = None
            except ValueError as err:
                self._no_groups = str(err)
        self._first = record
        earlier = sorted(s for s in self.recorder.done if s < int(record.step))
        if earlier:  # a resumed run: the figures start where the folder does
            traj = self.recorder.trajectory()
            for i in range(traj.num_steps):
                values = {name: traj.values[name][i] for name in traj.values}
                past = CheckpointRecord(int(traj.steps[i]), values)
                if i == 0:
                    self._first = past
                if past.step >= int(record.step):
                    break
                self._figures(past)
                self.steps.append(past.step)
                self.events.extend(self._new_events(past.step))  # seen before: not said

    def _figures(self, record) -> dict[str, Tensor]:
        """{name: [L, H]} of `record` against the first checkpoint and the last one."""
        plan = self.recorder.run.plan
        first = self._first.values
        now = record.values
        out: dict[str, Tensor] = {}
        if self._units is not None and "zbar" in now:
            slot = self._units.slot
            dz = now["zbar"][..., slot].double() - first["zbar"][..., slot].double()
            figures = self._units.figures(dz)
            out["bias"], out["auroc"] = figures["bias"], figures["auroc"]
            if self._classes is not None:
                slot = self._classes.slot
                dz = now["zbar"][..., slot].double() - first["zbar"][..., slot].double()
                out["spearman"] = self._classes.mean_over_classes(self._classes.spearman(dz))
        if "c_hat" in now:
            c_hat = now["c_hat"].double()
            if self._last_c_hat is not None:
                move = head_movement(plan, self._last_c_hat, c_hat)
                self._moves.append(move)
                gap = max(int(record.step) - self.steps[-1], 1)
                out["rate"] = move / gap
            out["distance"] = head_movement(plan, first["c_hat"].double(), c_hat)
            self._distance = out["distance"]
            self._last_c_hat = c_hat
        if "query_entropy" in now:
            out["attention_entropy"] = over_queries(now["query_entropy"], plan)
        for name in HEAD_TYPES:
            if name in now:
                score = _over_rows(now[name])
                self._scores.setdefault(name, []).append(score)
                out[name] = score
        self._rows = {name: now[name] for name in HEAD_TYPES if name in now}
        return out

    def _named(self, values: dict[str, Tensor]) -> dict[str, float]:
        run = self.recorder.run
        out = {}
        for name, value in values.items():
            for i, layer in enumerate(run.layers):
                if self.settings.per_head:
                    for j, head in enumerate(run.heads):
                        out[f"{PREFIX}/layer{layer}/head{head}/{name}"] = float(value[i, j])
                else:
                    row = value[i].double()
                    ok = ~torch.isnan(row)
                    out[f"{PREFIX}/layer{layer}/{name}"] = (
                        float(row[ok].mean()) if bool(ok.any()) else math.nan
                    )
        return out

    # ------------------------------------------------------------------ the events
    def _snaps(self, layers: list[int], step: int) -> list[Event]:
        """The snap events of `layers` as the report reads the checkpoints so far
        (`snap.snapping`, over each head's drift knots): where half or more of a layer's
        heads have snapped.  Each look reads every checkpoint so far (`LOOK_READS`)."""
        self._read += len(self.steps)
        traj = self.recorder.trajectory()
        if traj.num_steps != len(self.steps):  # a resumed run's replay: the steps seen by then
            traj = traj.select(steps=self.steps)
        table = snapping(traj).table  # one row per head, every tracked class: the report's
        found = []
        for layer in layers:
            rows = table[table["layer"] == layer]
            # a rate under half its peak for a while: a higher peak after it moves the snap
            i = self.recorder.run.layers.index(layer)
            moved = (self._distance[i] >= MIN_MOVED).numpy()
            held = (1 + rows["snap_step"]) * HELD <= 1 + step  # False where NaN
            done = held & moved
            if 2 * int(done.sum()) < len(rows):
                continue
            rows = rows[done]
            found.append(
                Event(
                    f"snap/layer{layer}",
                    "snap",
                    layer,
                    None,
                    _median(rows["snap_step"]),
                    _median(rows["snap_step_grid_lo"]),
                    _median(rows["snap_step_grid_hi"]),
                    step,
                )
            )
        return found

    def _new_events(self, step: int) -> list[Event]:
        """The events the checkpoints so far show for the first time."""
        found: list[Event] = []
        seen = {e.name for e in self.events}
        run = self.recorder.run
        steps = torch.tensor(self.steps, dtype=torch.float64)
        if len(self._moves) >= 2 and len(self._moves) == len(self.steps) - 1:
            moves = torch.stack(self._moves, -1)  # [L, H, S - 1]
            snap = snap_step(steps, moves)[0]  # over every checkpoint: the first look
            held = ((1 + snap) * HELD <= 1 + step) & (self._distance >= MIN_MOVED)
            looking = [
                layer
                for i, layer in enumerate(run.layers)
                if f"snap/layer{layer}" not in seen and 2 * int(held[i].sum()) >= len(run.heads)
            ]
            if looking and self._read + len(self.steps) <= LOOK_READS * len(self.steps):
                found += self._snaps(looking, step)
        first_rows = {n: self._first.values[n] for n in HEAD_TYPES if n in self._first.values}
        for name, rows in self._rows.items():
            if name not in first_rows or len(self.steps) < 2:
                continue
            diff = (rows.double() - first_rows[name].double()).permute(2, 0, 1)  # [N, L, H]
            rise = mean_over_units(diff, torch.ones(diff.shape[0], dtype=torch.float64))
            risen = (adjust(rise.p_value()) < ALPHA) & (rise.value >= MIN_RISE)
            score = torch.stack(self._scores[name], -1)  # [L, H, S]
            risen &= _settled(steps, score)
            if not bool(risen.any()):
                continue
            at, lo, hi = formation_step(steps, score, grid=True)
            for i, j in risen.nonzero().tolist():
                layer, head = run.layers[i], run.heads[j]
                event = f"{name}/layer{layer}/head{head}"
                if event in seen:
                    continue
                found.append(
                    Event(
                        event,
                        name,
                        layer,
                        head,
                        float(at[i, j]),
                        float(lo[i, j]),
                        float(hi[i, j]),
                        step,
                    )
                )
        return found


def _median(values) -> float:
    return float(np.median(np.asarray(values, dtype=float)))


def _settled(steps: Tensor, score: Tensor) -> Tensor:
    """[...] whether `score` [..., S] has stopped rising: its rise per unit of log(1 + step)
    since the last checkpoint is under half its peak, which came before (a phase change past
    its midpoint: the half-rise step, read now, is where the report will place it)."""
    if score.shape[-1] < 3:
        return torch.zeros(score.shape[:-1], dtype=torch.bool)
    gap = torch.diff(torch.log1p(steps.double() - steps[0]))
    rate = torch.diff(score.double(), dim=-1) / gap.clamp_min(1e-300)
    peak, at = rate.max(-1)
    return (peak > 0) & (at < rate.shape[-1] - 1) & (rate[..., -1] <= 0.5 * peak)


def _over_rows(rows: Tensor) -> Tensor:
    """[L, H] the mean of each head's per-row score `rows` [L, H, N], NaN rows left out (the
    report's score: `head_types.head_type`)."""
    rows = rows.double()
    ok = ~torch.isnan(rows)
    n = ok.sum(-1)
    return torch.where(n > 0, torch.nan_to_num(rows).sum(-1) / n.clamp_min(1), math.nan)


def _send(sink, metrics: dict[str, float], step: int) -> None:
    """`metrics` to a ``SummaryWriter`` (``add_scalar``) or a callable ``f(metrics, step)``."""
    if hasattr(sink, "add_scalar"):
        for name, value in metrics.items():
            sink.add_scalar(name, value, step)
        return
    sink(metrics, step)
