"""Theory against measurement: Theorem 3's bounds, and attention predicted from statistics.

- `growth_bounds`: the measured growth factor chi of each class's dominant distinct token
  against Theorem 3's bounds exp(2 f0^2 B) <= chi <= exp(2 B), with B from Theorem 4 at the
  training's effective rates and rho0 estimated from the data (`theory.rho0`).
- `theory_fit`: every recorded head against the population dynamics integrated on the
  corpus's statistics (`population.predict`): rank agreement of predicted and measured
  attention over each class's distinct tokens, correlation of predicted and measured logit
  changes, and the ratio of the measured snap step to the predicted one.

Both return a `measurement.Measurement` whose ``values`` are [step, layer, head] tensors.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens.measures.measurement import (
    Measurement,
    _frame,
    _tracked,
    _weighted_nanmean,
    _z,
)
from scansnap_lens.measures.rates import effective_rate, training_of
from scansnap_lens.measures.settings import AnalysisSettings
from scansnap_lens.measures.snap import snapping
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.context import require_same
from scansnap_lens.statistics.groups import TokenGroups
from scansnap_lens.theory.population import (
    THEORY_CLASSES,
    Population,
    gradients_at_most,
    predict,
)
from scansnap_lens.theory.transition import PhaseTransition, rho0

__all__ = ["growth_bounds", "theory_fit"]

MIN_FIT_CLASSES = 8  # fewest classes the time limit cuts the fit to
PROBE_GRADIENTS = 4  # timed to estimate the fit's cost
NOTHING_TO_RANK = "no tracked class has two distinct tokens to rank"


def _population(traj: Trajectory, source, classes=None):
    """The population of `source` for the classes (default: every tracked class), each
    weighted over the positions the training's loss averages: every next-token prediction,
    or one per row where the trajectory's meta says ``loss_on: "last"``."""
    require_same(source, traj.plan)
    if classes is None:
        classes = list(zip(traj.plan.class_query.tolist(), traj.plan.class_next.tolist()))
    positions = None
    if traj.meta.get("loss_on") == "last" and hasattr(source, "num_rows"):
        positions = source.num_rows  # `train(loss_on="last")`: one position per row
    return Population.of(source, classes, positions, traj.plan.vocab_size)


def _plan_population(traj: Trajectory) -> Population:
    """P(l|m, n) of the tracked classes as the recording's evaluation text has them."""
    plan = traj.plan
    tokens, column = torch.unique(plan.triple_token, return_inverse=True)
    counts = torch.zeros(plan.num_classes, tokens.numel(), dtype=torch.float64)
    counts.index_put_((plan.triple_class, column), plan.triple_count.double(), accumulate=True)
    events = plan.class_events.double()
    return Population.from_dense(
        plan.class_query,
        plan.class_next,
        events / events.sum(),
        counts / counts.sum(1, True).clamp_min(1),
        tokens,
        plan.vocab_size,
    )


def _head_training(traj: Trajectory, training: dict | None) -> list[dict]:
    found = training_of(traj, training)
    if found is None:
        raise ValueError(
            "the trajectory does not say how the model was trained (its meta has no lr_y and"
            " lr_z): pass training={'lr_y': ..., 'lr_z': ..., 'optimizer': ..., 'momentum': ...}"
            " (lr_y=, lr_z=, optimizer=, momentum=)"
        )
    return found


# ------------------------------------------------------------------ Theorem 3 bounds
def growth_bounds(
    traj: Trajectory,
    groups: TokenGroups,
    source=None,
    rho0_value: float | str = "data",
    settings: AnalysisSettings | None = None,
) -> Measurement:
    """Measured growth factor against Theorem 3's bounds, per class, layer and head.

    For a class (m, n) with dominant distinct token l0 (highest P(l|m, n)), the measured
    dz = z_l0(t) - z_l0(t_first) = ln(chi) / 2 is compared with Theorem 4's
    B(t) = eta_Z int xi (`PhaseTransition.B_integral` from the first checkpoint), which the
    theorem says bounds it: f0^2 B <= dz <= B, with f0^2 = f_{n l0}(0)^2 = P(l0)^2 / ||P||^2.
    The Y/Z model's decoder couples every pair of next tokens (xi_n sums over all n' != n),
    so K is the number of next tokens of the tracked classes (as `rates.theory_of` counts them)
    and rho0 the data's (`theory.rho0` over all classes) or the given number; M is the
    vocabulary and the rates the training's effective ones (`rates.effective_rate`; Adam has
    none: ValueError saying so).

    source: the training corpus's `CooccurrenceStats` or `SequenceClasses` (default: the
    recording's own evaluation text) for P(l|m, n), rho0 and K; settings: its ``training``
    overrides the rates the trajectory's meta gives.

    Table columns: chi (geometric mean over classes), chi_lower and chi_upper (the bounds,
    likewise), bound_ratio (median over classes of dz / B: Theorem 3 holds where it lies in
    [f0^2, 1]) and inside (share of classes within the bounds).  ``values``: bound_ratio.
    """
    if traj.step_unit != "steps":
        raise ValueError("the theory counts optimizer steps; this trajectory counts tokens")
    heads_training = _head_training(traj, (settings or AnalysisSettings()).training)
    rates = [
        [effective_rate(s[lr], s["optimizer"], s["momentum"]) for lr in ("lr_y", "lr_z")]
        for s in heads_training
    ]
    if all(None in pair for pair in rates):  # said before the statistics are read
        raise ValueError(
            "Theorem 4's B(t) needs plain-SGD rates, and the training's optimizer has none"
            " (Adam normalises its steps): bound_ratio is not defined for it"
        )
    pop = _plan_population(traj) if source is None else _population(traj, source)
    t = traj.steps.double().numpy()
    rows, dzs, lower, upper = [], [], [], []
    M = traj.plan.vocab_size
    K = int(torch.unique(torch.as_tensor(pop.next_token)).numel())  # next tokens, as `rates`
    r0 = rho0(pop.probs.numpy()) if rho0_value == "data" else float(rho0_value)
    if not math.isfinite(r0):
        raise ValueError(
            "Theorem 4 needs classes that share context tokens (rho0 from data is"
            f" {r0}: {'one class' if K < 2 else 'no shared token'})"
        )
    # B(t) from the first checkpoint, per head: K, M and rho0 are shared by every class
    B_head = np.full((len(t), len(traj.heads)), np.nan)
    for j, (y, zr) in enumerate(rates):
        if y is not None and zr is not None:
            theory = PhaseTransition(K=K, M=M, lr_y=y, lr_z=zr, rho0=r0)
            B_head[:, j] = theory.B_integral(t) - theory.B_integral(t[:1])
    B = np.broadcast_to(B_head[:, None, :], (len(t), len(traj.layers), len(traj.heads)))
    for m, n, l0, f0_sq, dz in _dominant_growth(traj, groups, pop):
        dzs.append(dz)
        upper.append(B)
        lower.append(f0_sq * B)
        for li, layer in enumerate(traj.layers):
            for j, head in enumerate(traj.heads):
                b_final, d_final = B[-1, li, j], dz[-1, li, j]
                rows.append((layer, head, m, n, l0, K, r0, f0_sq, d_final, b_final))
    if not dzs:
        raise ValueError(
            "no tracked class has a distinct token in the statistics: Theorem 3 needs one"
        )
    return _bounds_measurement(
        traj, rows, np.stack(dzs, -1), np.stack(lower, -1), np.stack(upper, -1)
    )


def _bounds_measurement(
    traj, rows: list, dz: np.ndarray, lo: np.ndarray, B: np.ndarray
) -> Measurement:
    """`growth_bounds`' result from each class's growth dz and bounds [S, L, H, classes]."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(B > 0, dz / B, np.nan)
        inside = np.where(B > 0, (dz >= lo - 1e-12) & (dz <= B + 1e-12), np.nan)
    values = {
        "chi": np.exp(2 * dz.mean(-1)),
        "chi_lower": np.exp(2 * lo.mean(-1)),
        "chi_upper": np.exp(2 * B.mean(-1)),
        "bound_ratio": _nanmedian(ratio),
        "inside": _nanmean(inside),
    }
    table = _frame(traj, {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in values.items()})
    detail = pd.DataFrame(
        rows,
        columns=["layer", "head", "query", "next", "l0", "K", "rho0", "f0_sq", "dz", "B"],
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        detail["bound_ratio"] = detail["dz"] / detail["B"]
    detail["inside"] = (detail["bound_ratio"] >= detail["f0_sq"] - 1e-12) & (
        detail["bound_ratio"] <= 1 + 1e-12
    )
    return Measurement(
        "growth_bounds", table, detail, values=torch.from_numpy(values["bound_ratio"])
    )


def _dominant_growth(traj: Trajectory, groups: TokenGroups, pop):
    """(m, n, l0, f0^2, dz [S, L, H]) of each tracked class with a dominant distinct token l0
    in the population `pop`: its logit's growth since the first checkpoint."""
    probs = pop.probs  # [K, U], dense once
    pop_row = {(int(q), int(n)): i for i, (q, n) in enumerate(zip(pop.query, pop.next_token))}
    for k in _tracked(traj, groups):
        m, n = int(groups.query[k]), int(groups.next_token[k])
        z, held = _z(traj, m, groups.distinct[k])
        if not held.any() or (m, n) not in pop_row:
            continue
        i0 = int(torch.argmax(groups.distinct_p[k][held]))
        l0 = int(groups.distinct[k][held][i0])
        p = probs[pop_row[(m, n)]]
        col = int(torch.searchsorted(pop.tokens, torch.tensor(l0)))
        if col >= pop.tokens.numel() or int(pop.tokens[col]) != l0:
            continue
        f0_sq = float(p[col] ** 2 / (p**2).sum())
        yield m, n, l0, f0_sq, (z[..., i0] - z[:1, ..., i0]).numpy()


def _nanmedian(x: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(x).all(-1)
    out = np.full(x.shape[:-1], np.nan)
    out[ok] = np.nanmedian(x[ok], -1)
    return out


def _nanmean(x: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(x).all(-1)
    out = np.full(x.shape[:-1], np.nan)
    out[ok] = np.nanmean(x[ok], -1)
    return out


# ------------------------------------------------------------------ prediction fit
def _corr(a: Tensor, b: Tensor) -> Tensor:
    """Pearson correlation along the last axis (a, b broadcast); NaN where either is flat."""
    a = a - a.mean(-1, keepdim=True)
    b = b - b.mean(-1, keepdim=True)
    den = torch.sqrt((a**2).sum(-1) * (b**2).sum(-1))
    return torch.where(den > 1e-300, (a * b).sum(-1) / den.clamp_min(1e-300), math.nan)


def _rank(x: Tensor) -> Tensor:
    return torch.from_numpy(rankdata(x.numpy(), axis=-1)).double()


def fit_classes(
    traj: Trajectory,
    theory_classes: int | None = THEORY_CLASSES,
    groups: TokenGroups | Tensor | None = None,
) -> list | None:
    """The `theory_classes` tracked classes (m, n) the fit can rank (two or more of their
    tracked context tokens distinct in `groups`, or `_rankable`'s [K] mask of them) first, the
    most frequent (by their events in the recording) next; None (every class) where the plan
    tracks no more."""
    plan = traj.plan
    if theory_classes is None or plan.num_classes <= theory_classes:
        return None
    events = plan.class_events.double()
    if groups is not None:
        rankable = groups if isinstance(groups, Tensor) else _rankable(plan, groups)
        events = events + rankable.double() * (events.max() + 1)  # those first
    top = torch.argsort(events, descending=True, stable=True)[:theory_classes]
    top = top.sort().values
    return list(zip(plan.class_query[top].tolist(), plan.class_next[top].tolist()))


def _rankable(plan, groups: TokenGroups) -> Tensor:
    """[K] bool: the plan's classes with two or more tracked context tokens distinct in
    `groups` (those whose attention the fit can rank)."""
    if not groups.num_classes:
        return torch.zeros(plan.num_classes, dtype=torch.bool)
    V = plan.vocab_size
    keys = groups.query * V + groups.next_token
    sizes = torch.tensor([d.numel() for d in groups.distinct])
    held = torch.repeat_interleave(keys, sizes) * V + torch.cat(groups.distinct)
    triple = plan.class_keys[plan.triple_class] * V + plan.triple_token
    counts = torch.bincount(plan.triple_class[torch.isin(triple, held)], minlength=plan.num_classes)
    return counts >= 2


def _classes_within(traj, source, rankable, theory_classes, seconds, trainings, progress):
    """(classes, population, estimated seconds): `theory_classes` of `fit_classes` (None:
    every class), fewer where their prediction would take over `seconds`.  A gradient's cost
    grows with triples x next tokens, about the square of the classes: each candidate is
    timed on a few gradients and the classes scaled by the square root of the time over."""
    from scansnap_lens.recording.budget import duration

    total = traj.plan.num_classes
    wanted = total if theory_classes is None else min(theory_classes, total)
    n, last, checkpoints = wanted, int(traj.steps[-1]), traj.num_steps
    while True:
        classes = fit_classes(traj, n, rankable)
        pop = _population(traj, source, classes)
        if seconds is None:
            return classes, pop, None
        estimate = (
            len(trainings)
            * gradients_at_most(last, checkpoints)
            * max(_gradient_seconds(pop, setting) for setting in trainings)
        )
        if estimate <= seconds or n <= MIN_FIT_CLASSES:
            break
        n = max(MIN_FIT_CLASSES, min(n - 1, int(0.9 * n * math.sqrt(seconds / estimate))))
    if progress:
        cut = f" of {wanted:,}" if n < wanted else ""
        order = "those with two distinct tokens first, then the most frequent"
        order = "the most frequent" if rankable is None else order
        order = f"theory_seconds={seconds:g}; {order}" if cut else order
        tqdm.write(
            f"theory fit: {n:,}{cut} classes ({order}), {pop.num_classes:,} with"
            f" statistics, {len(trainings)} run(s) of the population dynamics to step"
            f" {last:,}: about {duration(estimate)}"
        )
    return classes, pop, estimate


def _gradient_seconds(pop, setting: dict) -> float:
    """Seconds of one gradient of the population dynamics, timed on a few (the first included:
    the estimate errs long)."""
    started = time.perf_counter()
    predict(pop, steps=[0, PROBE_GRADIENTS], exact=True, **setting)
    return (time.perf_counter() - started) / (PROBE_GRADIENTS + 1)


def _class_sets(plan, held: Tensor, groups: TokenGroups | None) -> list[tuple]:
    """(m, n, triple slots, weight) of each `held` class with two tokens to rank: its distinct
    tokens and N(m, n) from `groups`, else all its tracked tokens and the plan's events."""
    class_sets = []
    # each class's triples are one run of the sorted triple_class; groups found by key
    bounds = torch.searchsorted(plan.triple_class, torch.arange(plan.num_classes + 1))
    group_of = {}
    if groups is not None:
        keys = (groups.query * plan.vocab_size + groups.next_token).tolist()
        group_of = {key: k for k, key in reversed(list(enumerate(keys)))}  # the first wins
    for c in held.nonzero().flatten().tolist():
        m, n = int(plan.class_query[c]), int(plan.class_next[c])
        slots = torch.arange(int(bounds[c]), int(bounds[c + 1]))
        weight = float(plan.class_events[c])
        if groups is not None:
            k = group_of.get(m * plan.vocab_size + n)
            if k is None:
                continue
            keep = torch.isin(plan.triple_token[slots], groups.distinct[k])
            slots, weight = slots[keep], float(groups.events[k])
        if slots.numel() >= 2:
            class_sets.append((m, n, slots, weight))
    if not class_sets:
        raise ValueError(NOTHING_TO_RANK)
    return class_sets


def theory_fit(
    traj: Trajectory,
    source,
    groups: TokenGroups | None = None,
    settings: AnalysisSettings | None = None,
    classes=None,
    progress: bool = True,
) -> Measurement:
    """Score every head against attention predicted from corpus statistics alone (the
    population dynamics show their progress where they take over two seconds).

    The population dynamics (`population.predict`) run on `source` (the training corpus's
    `CooccurrenceStats`, or the lab's `SequenceClasses`) for the trajectory's tracked
    classes, with the training's own optimizer and rates (`rates.training_of`, or
    the settings' ``training``), to the trajectory's steps.  Per step, layer and head:

    - ``rank_agreement``: Spearman correlation of predicted and measured per-token attention
      c(t) over each class's distinct tokens (`groups`; all its tracked context tokens without
      groups), mean over classes weighted by N(m, n);
    - ``dz_corr``: Pearson correlation of predicted and measured logit changes
      z(t) - z(t_first) over every tracked pair (m, l) of the classes' queries (NaN at the first
      checkpoint, where both are 0).

    Per head: ``snap_step`` (measured, `snap.snapping` over the tracked classes the
    statistics hold), ``population_snap`` (the same estimator on the prediction) and
    ``snap_ratio`` = snap_step / population_snap.
    ``values``: dz_corr [S, L, H]; ``detail``: rank agreement per class at the last step.

    Each class is weighted over the positions the training's loss averages (`_population`:
    one per row where the trajectory's meta says ``loss_on: "last"``).
    classes: pairs (m, n) to predict (default: the settings' ``theory_classes`` of
    `fit_classes`, fewer where they would take over its ``theory_seconds``: timed on a few
    gradients of each candidate and said before it starts).  Each class carries its own
    weight N(m, n) / loss positions, so a subset evolves as it would among the others except
    through the parameters it shares with them.  The table's ``fit_classes`` says how many
    classes were fit, its attrs ``fit_seconds`` the estimate said and the seconds taken.
    """
    if traj.step_unit != "steps":
        raise ValueError("the prediction counts optimizer steps; this trajectory counts tokens")
    settings = settings or AnalysisSettings()
    require_same(source, traj.plan)  # a convention mismatch first: it is the inputs' fault
    heads_training = _head_training(traj, settings.training)
    pop, estimate = _fit_population(
        traj, source, groups, heads_training, classes, progress, settings
    )
    plan = traj.plan
    S, L, H = traj.num_steps, len(traj.layers), len(traj.heads)

    # pairs of the queries that have a population class, and the classes' token sets
    pair_mask = torch.isin(plan.pair_query, pop.queries)
    measured_z = traj.zbar[..., pair_mask].double()  # [S, L, H, P]: only these slots read
    measured_dz = measured_z - measured_z[:1]
    held = torch.isin(plan.class_keys, pop.query * plan.vocab_size + pop.next_token)
    class_sets = _class_sets(plan, held, groups)
    shared = list(zip(plan.class_query[held].tolist(), plan.class_next[held].tolist()))
    # the snap of both is measured on the classes the statistics hold
    measured_snap = snapping(traj, classes=shared).table
    # the c_hat of every class set, read once: [S, L, H, sum of the sets' sizes]
    measured_c_hat = traj.c_hat[..., torch.cat([c[2] for c in class_sets])].double()
    rank = torch.full((S, L, H), math.nan, dtype=torch.float64)
    corr = torch.full((S, L, H), math.nan, dtype=torch.float64)
    pop_snap = np.full(H, np.nan)
    per_class = []
    runs, took = _predictions(traj, pop, heads_training, progress, announce=estimate is None)
    for j, setting in enumerate(heads_training):
        predicted = runs[tuple(sorted(setting.items()))]
        pred_dz = (predicted.zbar - predicted.zbar[:1]).double()[:, 0, 0][..., pair_mask]
        corr[:, :, j] = _corr(measured_dz[:, :, j], pred_dz[:, None])
        corr[0, :, j] = math.nan
        rank[:, :, j] = _rank_agreement(traj, j, predicted, class_sets, measured_c_hat, per_class)
        pop_snap[j] = float(snapping(predicted, classes=shared).table["snap_step"].iloc[0])
    table = _fit_table(traj, rank, corr, measured_snap, pop_snap, len(shared))
    table.attrs["fit_seconds"] = {"estimate": estimate, "took": took}
    detail = pd.DataFrame(per_class, columns=_FIT_DETAIL)
    return Measurement("theory_fit", table, detail, values=corr, predictions=list(runs.values()))


def _fit_population(
    traj, source, groups, heads_training, classes, progress, settings: AnalysisSettings
):
    """(population, estimated seconds or None) of `theory_fit`: its `classes`, or those
    `_classes_within` the time."""
    rankable = None if groups is None else _rankable(traj.plan, groups)
    if rankable is not None and not rankable.any():
        raise ValueError(NOTHING_TO_RANK)  # before the population dynamics are timed
    if classes is not None:
        return _population(traj, source, classes), None
    trainings = list({tuple(sorted(t.items())): t for t in heads_training}.values())
    _, pop, estimate = _classes_within(
        traj,
        source,
        rankable,
        settings.theory_classes,
        settings.theory_seconds or None,
        trainings,
        progress,
    )
    return pop, estimate


def _predictions(
    traj, pop, heads_training: list[dict], progress: bool, announce: bool
) -> tuple[dict[tuple, Trajectory], float]:
    """({training setting: the population dynamics' trajectory at the run's steps}, seconds):
    one prediction for each setting the heads were trained with."""
    started = time.perf_counter()
    runs: dict[tuple, Trajectory] = {}
    for setting in heads_training:
        key = tuple(sorted(setting.items()))
        if key not in runs:
            run = predict(pop, steps=traj.steps, progress=progress, announce=announce, **setting)
            runs[key] = run.to_trajectory(traj.plan)
    return runs, time.perf_counter() - started


def _rank_agreement(traj, j: int, predicted, class_sets, measured_c_hat, per_class: list) -> Tensor:
    """[S, L] head `j`'s rank agreement with the `predicted` trajectory, mean over the class
    sets weighted by N(m, n) (each class's last value appended to `per_class`); NaN where
    none can be ranked.  measured_c_hat: [S, L, H, the sets' tokens, in order]."""
    sizes = [c[2].numel() for c in class_sets]
    ranks, weights = [], []
    for (m, n, slots, weight), at in zip(class_sets, torch.arange(sum(sizes)).split(sizes)):
        meas = measured_c_hat[:, :, j, at]  # [S, L, n]
        pred = predicted.c_hat[:, 0, 0][..., slots].double()  # [S, n]
        if torch.isnan(pred).all():
            continue
        r = _corr(_rank(meas), _rank(pred)[:, None])
        ranks.append(r)
        weights.append(weight)
        for li, layer in enumerate(traj.layers):
            per_class.append((layer, traj.heads[j], m, n, slots.numel(), weight, float(r[-1, li])))
    if not ranks:
        return torch.full(measured_c_hat.shape[:2], math.nan, dtype=torch.float64)
    return _weighted_nanmean(torch.stack(ranks, -1), torch.tensor(weights, dtype=torch.float64))


_FIT_DETAIL = ["layer", "head", "query", "next", "tokens", "events", "rank_agreement"]


def _fit_table(
    traj, rank: Tensor, corr: Tensor, measured_snap, pop_snap, fit_classes: int
) -> pd.DataFrame:
    """`theory_fit`'s table: each step, layer and head's scores, each head's snaps and how
    many classes were fit."""
    table = _frame(traj, {"rank_agreement": rank, "dz_corr": corr})
    by_head = measured_snap.set_index(["layer", "head"])["snap_step"]
    table["snap_step"] = [
        by_head.get((la, h), math.nan) for la, h in zip(table["layer"], table["head"])
    ]
    table["population_snap"] = table["head"].map(dict(zip(traj.heads, pop_snap)))
    with np.errstate(invalid="ignore", divide="ignore"):
        table["snap_ratio"] = table["snap_step"] / table["population_snap"]
    table["fit_classes"] = fit_classes
    return table
