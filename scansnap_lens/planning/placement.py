"""Where to record: checkpoints placed where they resolve each head's snap and formation steps.

A grid fixed in advance (every k-th, log-spaced, a hub's schedule) places a step no better
than the checkpoints around it (the ``*_grid_lo``/``_hi`` brackets of `snap.snapping` and
`head_types.formation_step`).  Two ways to spend a budget of N recordings instead:

- **Checkpoints that exist** (hub revisions, a folder): `record_placed` records a coarse,
  log-spaced pass (`coarse_steps`), then, round by round, the checkpoint in the middle of each
  bracket still wider than `tolerance` of its step (`step_brackets`, `next_steps`), widest
  first, until every bracket is resolved, no checkpoint lies inside one, or the budget is
  spent (``scansnap record --steps auto --budget N``).  Resumable: the folder's recordings
  decide the next round.
- **A training run**, which cannot go back: `AdaptiveSchedule` chooses the next step from what
  the last recordings showed: close where a head's rate of movement peaks and where it is
  foreseen to fall past half its peak, log-spaced where it has settled, never so close that
  the rest of the budget could not reach the last step.

Both write ``placement.json`` in the trajectory folder: each chosen step and why.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens._io import read_json, write_text
from scansnap_lens.measures.head_types import formation_step, head_type, head_type_scores
from scansnap_lens.measures.snap import DRIFT_ABOVE, POOL, head_movement, snapping
from scansnap_lens.models.steps import select_steps
from scansnap_lens.recording.trajectory import Trajectory

__all__ = [
    "PLACEMENT_FILE",
    "TOLERANCE",
    "AdaptiveSchedule",
    "coarse_steps",
    "next_steps",
    "record_placed",
    "step_brackets",
]

TOLERANCE = 0.1  # a step is resolved when its checkpoints place it within 10 % of itself
PLACEMENT_FILE = "placement.json"


def step_brackets(traj: Trajectory, tolerance: float = TOLERANCE) -> pd.DataFrame:
    """One row per head and step quantity the checkpoints bracket: ``layer``, ``head``,
    ``quantity`` (``snap_step``, ``rate_peak_step``, ``<head type>_step``), ``step``, ``lo``,
    ``hi`` (the checkpoints that bracket it) and ``resolved`` (both within `tolerance` x
    step of it).  Heads that never snapped, heads whose drift the checkpoints already
    outnumber (`snap.drift_knots` left some out: closer checkpoints measure more noise, not
    the drift) and head types that did not rise have no row."""
    rows = []
    if traj.num_steps >= 2 and "c_hat" in traj.aggregates:
        table = snapping(traj).table
        table = table[table["drift_checkpoints"] == table["checkpoints"]]  # else: more noise
        for quantity in ("snap_step", "rate_peak_step"):
            part = table[["layer", "head"]].assign(
                quantity=quantity,
                step=table[quantity],
                lo=table[f"{quantity}_grid_lo"],
                hi=table[f"{quantity}_grid_hi"],
            )
            rows.append(part)
    if traj.num_steps >= 2:
        for name, agg in traj.aggregates.items():
            if agg.axis != "rows":
                continue
            risen = head_type(traj, name, num=20).final()  # its rise's test decides
            score = head_type_scores(traj, name).nanmean(-1).permute(1, 2, 0)  # [L, H, S]
            _, lo, hi = formation_step(traj.steps, score, grid=True)
            rows.append(
                risen[["layer", "head"]].assign(
                    quantity=f"{name}_step",
                    step=risen[f"{name}_step"],
                    lo=lo.reshape(-1).numpy(),
                    hi=hi.reshape(-1).numpy(),
                )
            )
    columns = ["layer", "head", "quantity", "step", "lo", "hi"]
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=columns)
    out = out[np.isfinite(out["step"].astype(float))].reset_index(drop=True)
    step = out["step"].astype(float)
    near = tolerance * step
    out["resolved"] = (step - out["lo"] <= near) & (out["hi"] - step <= near)
    return out


def coarse_steps(available, budget: int) -> list[int]:
    """The first pass: a third of `budget` (at least 3, at most the budget) log-spaced among
    `available`."""
    available = sorted({int(s) for s in available})
    n = min(len(available), budget, max(3, budget // 3))
    return select_steps(available, f"log:{n}") if n >= 2 else available


def next_steps(brackets: pd.DataFrame, available, done, room: int) -> list[tuple[int, str]]:
    """Up to `room` (step, why) to record next: for each unresolved bracket, widest (relative
    to its step) first, the checkpoint of `available` not in `done` nearest its middle on the
    log(1 + step) axis; a bracket with no checkpoint inside is left as the grid allows."""
    have = np.array(sorted({int(s) for s in available} - {int(s) for s in done}), dtype=float)
    open_ = brackets[~brackets["resolved"]]
    if not len(open_) or not len(have) or room < 1:
        return []
    width = (open_["hi"] - open_["lo"]) / open_["step"].astype(float)
    chosen: dict[int, str] = {}
    for i in width.sort_values(ascending=False, kind="stable").index:
        b = open_.loc[i]
        inside = have[(have > b["lo"]) & (have < b["hi"])]
        if not len(inside):
            continue
        middle = math.expm1((math.log1p(b["lo"]) + math.log1p(b["hi"])) / 2)
        step = int(inside[np.argmin(np.abs(np.log1p(inside) - math.log1p(middle)))])
        if step not in chosen:
            chosen[step] = (
                f"L{b['layer']}H{b['head']} {b['quantity']} {b['step']:.6g}"
                f" between checkpoints {b['lo']:.6g} and {b['hi']:.6g}"
            )
        if len(chosen) == room:
            break
    return sorted(chosen.items())


def record_placed(recorder, source, budget: int, tolerance: float = TOLERANCE, execute=None):
    """Record at most `budget` checkpoints of `source` (a `models.checkpoints.CheckpointSource`)
    with `recorder` (a `recording.Recorder`): the coarse pass, then the checkpoints that split
    the unresolved brackets, round by round (module docstring); each round's steps and why go
    to ``placement.json``.  Run again, it goes on from what the folder holds.  Returns the
    trajectory."""
    if budget < 2:
        raise ValueError(f"budget must be >= 2 recordings, got {budget}")
    available = source.steps
    placed = _read_placement(Path(recorder.out))
    _check_budget(Path(recorder.out), budget, len(set(recorder.done) & set(available)))

    def record(steps: list[int]) -> Trajectory:
        wanted = set(steps)
        part = dataclasses.replace(source, checkpoints=[c for c in source if c.step in wanted])
        return recorder.record(part, execute=execute)

    first = coarse_steps(available, budget)
    placed.update(
        {s: "coarse pass: log-spaced, a third of the budget" for s in first if s not in placed}
    )
    traj = record(first)
    while True:
        _write_placement(Path(recorder.out), placed, budget, tolerance)
        done = set(recorder.done) | {int(s["step"]) for s in traj.skipped}
        for step in done - set(placed):
            placed[step] = "recorded before (not by this placement)"
        room = budget - len(done & set(available))
        picks = next_steps(step_brackets(traj, tolerance), available, done, room)
        if not picks:
            return traj
        placed.update(picks)
        _write_placement(Path(recorder.out), placed, budget, tolerance)
        traj = record([s for s, _ in picks])


def _read_placement(out: Path) -> dict[int, str]:
    """The steps and reasons a placement wrote before; none where it wrote none (it is the
    placement's own log: an unreadable one is written again)."""
    path = out / PLACEMENT_FILE
    if not path.is_file() or path.is_symlink():
        return {}
    try:
        return {int(k): str(v) for k, v in read_json(path, "placement's log")["steps"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _check_budget(out: Path, budget: int, recorded: int) -> None:
    """A resumed placement's budget: refused below what the folder holds, said where it
    changed."""
    path = out / PLACEMENT_FILE
    try:
        before = read_json(path, "placement's log")["budget"] if path.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        before = None
    if recorded > budget:
        was = f"; it was {before}" if before is not None else ""
        raise ValueError(
            f"{out} holds {recorded} recordings of these checkpoints, more than budget= allows"
            f" ({budget}{was}): give a budget of at least {recorded} to go on, or record into"
            " another folder"
        )
    if before is not None and before != budget:
        tqdm.write(f"placement: budget {budget} (it was {before}; {recorded} recorded so far)")


def _write_placement(out: Path, placed: dict, budget: int, tolerance: float, **extra) -> None:
    if not out.is_dir():
        return  # the recorder makes the folder with its first checkpoint
    body = {
        "budget": budget,
        "tolerance": tolerance,
        **extra,
        "steps": {str(k): placed[k] for k in sorted(placed)},
    }
    write_text(out / PLACEMENT_FILE, json.dumps(body, indent=1))


@dataclass
class AdaptiveSchedule:
    """When a training run records, chosen from what it has seen, within `budget` recordings
    up to `last_step`.

    After each recording it measures every head's movement since the last one (`snap.
    head_movement`) and chooses the next step (`choose`): close (`fine` x step apart) where a
    head's rate of movement peaks and where it is foreseen to fall past half its peak (its
    snap step), log-spaced elsewhere, within the budget.  Use it as both the steps and the
    callback:

    >>> # schedule = AdaptiveSchedule(recorder, budget=40, last_step=2000)
    >>> # train(model, data, 2000, save_steps=schedule, on_checkpoint=schedule)
    >>> # trainer_callback(recorder, steps=schedule)  # a transformers.Trainer
    """

    recorder: object
    budget: int
    last_step: int
    fine: float = 0.05
    steps: list[int] = field(default_factory=list, init=False)  # recorded so far
    reasons: dict[int, str] = field(default_factory=dict, init=False)  # step -> why
    _next: int = field(default=0, init=False, repr=False)
    _c_hat: Tensor | None = field(default=None, init=False, repr=False)
    _moves: list[Tensor] = field(default_factory=list, init=False, repr=False)
    _fine: int = field(default=0, init=False, repr=False)
    _before: Tensor | None = field(default=None, init=False, repr=False)
    _triples: list[tuple[Tensor, Tensor]] = field(default_factory=list, init=False, repr=False)
    noisy: Tensor | None = field(default=None, init=False)  # [L, H] heads that set no pace

    def __post_init__(self) -> None:
        if self.budget < 2:
            raise ValueError(f"budget must be >= 2 recordings, got {self.budget}")
        if self.last_step < 1:
            raise ValueError(f"last_step must be >= 1, got {self.last_step}")
        if not 0 < self.fine < 1:
            raise ValueError(f"fine must lie in (0, 1), got {self.fine}")
        self.reasons[0] = "the first checkpoint"

    def wants(self, step: int) -> bool:
        """Whether to record at `step` (the next chosen step, or the last)."""
        step = int(step)
        return step not in self.steps and (step >= self._next or step == self.last_step)

    def __call__(self, step: int, model, training: dict | None = None):
        """Record `model` at `step` through the recorder, then choose the next step."""
        record = self.recorder.on_checkpoint(step, model, training=training)
        if record is not None:
            self.observe(int(step), record.values["c_hat"])
        return record

    def observe(self, step: int, c_hat: Tensor) -> int:
        """Take the c_hat [L, H, Pc] recorded at `step`; returns the next step to record."""
        plan = self.recorder.run.plan
        c_hat = c_hat.detach().double().cpu()
        if self._c_hat is not None:
            self._moves.append(head_movement(plan, self._c_hat, c_hat))
        if self._before is not None:  # the latest splits' straightness, as `snap.drift_knots`
            self._triples.append(
                (head_movement(plan, self._before, c_hat), self._moves[-2] + self._moves[-1])
            )
            recent = self._triples[-(POOL + 1) :]
            straight, path = (sum(x[i] for x in recent) for i in (0, 1))
            self.noisy = straight < DRIFT_ABOVE * path
        self._before, self._c_hat = self._c_hat, c_hat
        self.steps.append(step)
        self._next, why = self.choose(self.steps, self._moves)
        self.reasons.setdefault(self._next, why)
        out = Path(self.recorder.out)
        _write_placement(
            out,
            {s: self.reasons.get(s, "") for s in self.steps},
            self.budget,
            self.fine,
            next_step=self._next,
            next_why=why,
        )
        return self._next

    def choose(self, steps: list[int], moves: list[Tensor]) -> tuple[int, str]:
        """The next step after `steps` (recorded) given each interval's movement [..., heads].

        Per head: while its rate of movement has passed its peak but not half of it, the
        crossing (its snap step) is foreseen from the last two rates (a power law) and the
        recordings close in on it `fine` x step apart, one more after it crosses; near its
        peak (the rate rising by under 25 % an interval, or within 10 % below it), and while
        it rises by 60 % or more an interval (a transition may be coming), `fine` x 2;
        elsewhere the log spacing that reaches the last step with the budget left beyond a
        reserve for those (a third of the budget, until every head has snapped), and only that
        once half the budget went to closing in.  The next
        step is the soonest any head wants, never closer than a third (on the log axis) of the
        budget's pace.  The reserve spent so far is the schedule's state; heads whose
        latest movements are mostly noise (`noisy`: the straightness of the last few pairs
        of intervals under `snap.DRIFT_ABOVE`, as `snap.drift_knots` pools it) set no pace:
        on them, closer checkpoints only measure more noise."""
        t = steps[-1]
        left = self.budget - len(steps)
        if left <= 1 or t >= self.last_step:
            return self.last_step, "the last step (the budget's last recording)"

        def pace(n: int) -> float:  # the log spacing reaching the last step in n recordings
            return (1 + t) * math.expm1((math.log1p(self.last_step) - math.log1p(t)) / max(n, 1))

        fine = max(1.0, self.fine * (1 + t))
        wish, what = None, ""
        snapped = False
        if len(moves) >= 2:
            m = torch.stack([x.reshape(-1) for x in moves]).double()  # [intervals, heads]
            s = torch.tensor(steps, dtype=torch.float64)
            rate = m / torch.diff(s)[:, None]
            mid = (s[1:] + s[:-1]) / 2
            top, at = rate.max(0)
            live = top >= 0.01 * top.max()  # a head that never moves sets no pace
            if self.noisy is not None:  # nor one whose movement is mostly noise
                live &= ~self.noisy.reshape(-1)
            last, before = rate[-1], rate[-2]
            n = rate.shape[0] - 1
            after = torch.arange(n + 1)[:, None] > at[None]
            below = (after & (rate <= 0.5 * top)).any(0)  # crossed half its peak: snapped
            snapped = bool((below | ~live).all())
            falling = live & (at < n) & ~below
            crossed = live & below & (before > 0.5 * top) & (last <= 0.5 * top) & (at < n - 1)
            rising = live & (at == n) & (last >= 1.6 * before)  # a transition may be coming
            near_peak = live & (
                ((at == n) & (last < 1.25 * before)) | ((at < n) & (last > 0.9 * top))
            )
            a = torch.log(before / last) / torch.log(mid[-1] / mid[-2])  # rate ~ t^-a
            foreseen = torch.where(a > 0.05, mid[-1] * (last / (0.5 * top)) ** (1 / a), math.inf)
            close_in = (1 - 4 * self.fine) * foreseen - t  # from 20 % before it, at 0.05
            until = torch.where((last > 0.8 * top) & torch.isfinite(foreseen), close_in, fine)
            wish = torch.full_like(last, math.inf)
            wish = torch.where(falling, until.clamp_min(fine), wish)
            wish = torch.where(
                near_peak | rising, torch.minimum(wish, torch.full_like(wish, 2 * fine)), wish
            )
            wish = torch.where(crossed, torch.full_like(wish, fine), wish)
            i = int(wish.argmin())
            what = f"{_head_name(self.recorder, moves[-1].shape, i)} " + (
                "crossed half its peak rate"
                if bool(crossed[i])
                else (
                    f"foreseen to snap near step {float(foreseen[i]):.0f}"
                    if float(foreseen[i]) <= self.last_step
                    else "past its peak rate"
                )
                if bool(falling[i])
                else "its rate rising fast"
                if bool(rising[i])
                else "near its peak rate"
            )
            wish = float(wish.min())
        # a reserve for closing in on snaps still to come
        reserve = 0 if snapped else max(0, min(self.budget // 3 - self._fine, left - 2))
        gap, why = pace(left - 1 - reserve), "log spacing within the budget"
        if wish is not None and wish < gap and self._fine >= self.budget // 2:
            why = "log spacing within the budget (half of it spent closing in)"
        elif wish is not None and wish < gap:
            gap, why = wish, what
            self._fine += 1
        closest = max(1.0, pace(3 * (left - 1)))
        if gap < closest:
            gap, why = closest, why + "; held back by the budget's pace"
        return min(self.last_step, t + max(1, round(gap))), why


def _head_name(recorder, shape, index: int) -> str:
    """ "L1H3" for the flat `index` into a [L, H] movement, the recorder's layers and heads."""
    if len(shape) != 2:
        return f"head {index}"
    layer, head = divmod(index, shape[1])
    run = getattr(recorder, "run", None)
    if run is not None:
        layer, head = run.layers[layer], run.heads[head]
    return f"L{layer}H{head}"
