"""How sure a figure is: every interval, p-value, correction over heads and minimal detectable
effect of the package comes from this module (what each covers: docs/glossary.md, "How sure").

A measure hands over its figure's pieces per unit (`measurement.QueryTokens`, the per-class
values, the per-class movement behind `snap_step`) and gets an `Estimate` back: a weighted
mean over units (`mean_over_units`, cluster-robust with CR2 leverage), a contrast over crossed
queries and tokens (`crossed`, two-way cluster-robust), a bootstrap percentile interval
(`bootstrap_percentile`, for figures that are no mean); intervals and p-values are Student t
on ``n_eff - 1`` degrees of freedom (Kish's effective units), none below `MIN_UNITS`; Holm or
Benjamini-Hochberg over heads; `Estimate.mde` at 80 % power.

Shape letters (docs/shapes.md): U units, B resamples, ``...`` any leading shape.

>>> x = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]], dtype=torch.float64)
>>> est = mean_over_units(x, torch.ones(6))
>>> est.value.item(), round(est.se.item(), 4), est.n_eff.item()  # se: sd / sqrt(6)
(3.5, 0.7638, 6.0)
>>> lo, hi = est.interval()
>>> round(lo.item(), 3), round(hi.item(), 3)  # 3.5 -+ t(5, 0.975) * 0.7638
(1.537, 5.463)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from scipy import special
from scipy import stats as scipy_stats
from torch import Tensor

__all__ = [
    "ALPHA",
    "LEVEL",
    "MIN_UNITS",
    "POWER",
    "Estimate",
    "adjust",
    "auroc_variance",
    "bootstrap_percentile",
    "crossed",
    "far_runs",
    "interval_over_runs",
    "joint_mde",
    "joint_power",
    "mean_over_units",
    "pair_variances",
    "run_components",
    "run_groups",
    "share_interval",
    "spread_split",
    "too_few",
]

LEVEL = 0.95  # every interval's coverage
ALPHA = 0.05  # the verdict's level over the heads (family-wise with Holm)
POWER = 0.8  # the power at which the minimal detectable effect is stated
MIN_UNITS = 5.0  # below this effective number of units: no interval, no p-value


def kish(weights: Tensor, dim: int = -1) -> Tensor:
    """Kish's effective number of units, (sum w)^2 / sum w^2 along `dim` (0 where no weight).

    >>> kish(torch.tensor([1.0, 1.0, 1.0, 1.0])).item(), kish(torch.tensor([3.0, 1.0])).item()
    (4.0, 1.6)
    """
    w = weights.double().abs()
    total = w.sum(dim)
    return torch.where(total > 0, total**2 / (w**2).sum(dim).clamp_min(1e-300), 0.0)


def too_few(n_eff: float) -> str:
    """The words shown where a figure rests on too few units for an interval."""
    return f"too few units (n_eff = {n_eff:.3g} < {MIN_UNITS:g})"


@dataclass
class Estimate:
    """A figure with its uncertainty: ``value``, standard error ``se`` and the effective
    number of units ``n_eff`` behind it, all of one shape [...] (a layer x head grid)."""

    value: Tensor
    se: Tensor
    n_eff: Tensor
    bounds: tuple[float, float] = (-math.inf, math.inf)  # the values the figure can take
    dof: Tensor | None = None  # degrees of freedom where fewer than n_eff - 1
    terms: tuple[Tensor, ...] | None = None  # its influences per unit, where a difference needs
    pairs: bool = False  # a share of matched pairs ordered: its spread moves as p (1 - p)

    @property
    def df(self) -> Tensor:
        """Degrees of freedom of the t reference: n_eff - 1, or fewer where the variance
        rests on fewer units (`dof`); at least 1."""
        df = self.n_eff - 1
        if self.dof is not None:
            df = torch.minimum(df, self.dof)
        return torch.nan_to_num(df, nan=1.0).clamp_min(1.0)

    @property
    def enough(self) -> Tensor:
        """Where the figure rests on at least `MIN_UNITS` effective units (and is a number)."""
        return (self.n_eff >= MIN_UNITS) & ~torch.isnan(self.value) & ~torch.isnan(self.se)

    def _t(self, q: float) -> Tensor:
        return torch.from_numpy(np.asarray(_t_quantile(q, self.df.numpy()), np.float64))

    def interval(self, level: float = LEVEL) -> tuple[Tensor, Tensor]:
        """value -+ t(n_eff - 1, (1 + level) / 2) * se; NaN where there are too few units."""
        half = self._t((1 + level) / 2) * self.se
        lo = (self.value - half).clamp_min(self.bounds[0])
        hi = (self.value + half).clamp_max(self.bounds[1])
        return torch.where(self.enough, lo, math.nan), torch.where(self.enough, hi, math.nan)

    def logit_interval(self, level: float = LEVEL) -> tuple[Tensor, Tensor]:
        """The interval of a mean in [0, 1] made on the logit scale (delta method) and mapped
        back: asymmetric, longer towards the middle, as the mean of skewed units near 0 or 1
        needs (a score near 0 whose rare high units were not drawn).  Where every unit has
        the same value (a planted head at exactly 1) the spread says nothing: the rule of
        three then bounds the share of unseen units at the other end by -log(1 - level) / n,
        the interval reaching as far as they would move the mean."""
        m = self.value.clamp(1e-6, 1 - 1e-6)
        half = self._t((1 + level) / 2) * self.se / (m * (1 - m))
        lo, hi = torch.sigmoid(torch.logit(m) - half), torch.sigmoid(torch.logit(m) + half)
        share = -math.log(1 - level) / self.n_eff.clamp_min(1)
        flat = self.se == 0
        lo = torch.where(flat, self.value * (1 - share), lo)
        hi = torch.where(flat, self.value + (1 - self.value) * share, hi)
        return torch.where(self.enough, lo, math.nan), torch.where(self.enough, hi, math.nan)

    def se_at(self, value: Tensor | float) -> Tensor:
        """The standard error this figure would have at true `value` on the same units: the
        seen one for a figure that shifts with its effect (a mean, a bias); for a proportion
        in [0, 1] (an AUROC) the seen one moved from the seen value to `value` by
        `auroc_variance` (the seen value held within 0.1 and 0.9, where dividing by it stays
        stable), with `crossed`'s floor at `value`.  A share of matched pairs (`pairs`: each
        distinct token against the few common tokens as frequent) is a mean of 0/1 orderings,
        whose spread moves as p (1 - p): less towards 1 than an AUROC over many tokens of
        each kind (at 0.75 by 0.866 rather than 0.841, as seen on WikiText-2's units)."""
        if self.bounds != (0.0, 1.0):
            return self.se
        value = torch.as_tensor(value, dtype=torch.float64).clamp(0.0, 1.0)
        seen = torch.nan_to_num(self.value.double(), nan=0.5).clamp(0.1, 0.9)
        spread = _pair_variance if self.pairs else auroc_variance
        se = self.se * torch.sqrt(spread(value) / spread(seen))
        return torch.maximum(se, _proportion_floor(value, self.n_eff))

    def p_value(self, null: float = 0.0) -> Tensor:
        """Two-sided p-value of value = `null` (t with n_eff - 1 degrees of freedom); 0 where
        the standard error is 0 and the value differs; NaN where there are too few units."""
        diff = (self.value - null).abs()
        t = torch.where(self.se > 0, diff / self.se.clamp_min(1e-300), math.inf)
        t = torch.where(diff > 0, t, 0.0)
        p = 2 * _t_sf(t.numpy(), self.df.numpy())
        return torch.where(self.enough, torch.from_numpy(np.asarray(p, np.float64)), math.nan)

    def mde(self, alpha: float, power: float = POWER) -> Tensor:
        """The smallest distance from the null that a two-sided test at `alpha` detects with
        probability `power` at this standard error; NaN where there are too few units."""
        reach = (self._t(1 - alpha / 2) + self._t(power)) * self.se
        return torch.where(self.enough, reach, math.nan)


def joint_mde(
    estimates: list[Estimate], alpha: float, power: float = POWER, null: float = 0.0
) -> Tensor:
    """The smallest distance from `null` at which every one of `estimates`' two-sided tests at
    `alpha` rejects, all of them, with probability `power`: a verdict that needs each test is
    no surer than its weakest.  Each test's power is that of its t reference at its standard
    error *at that effect* (`Estimate.se_at`: an AUROC's spread shrinks towards 0 and 1, so
    the spread seen at no effect would overstate what a large effect needs), and the joint
    power their product (taken as independent: the tests of one effect go together, so the
    true joint power is higher and the distance errs large).  NaN where any test has too few
    units.

    >>> one = Estimate(torch.tensor([0.0]), torch.tensor([0.1]), torch.tensor([30.0]))
    >>> a, b = joint_mde([one], 0.05).item(), one.mde(0.05).item()
    >>> round(a, 4) == round(b, 4), joint_mde([one, one], 0.05).item() > a
    (True, True)
    """
    enough = torch.stack([e.enough for e in estimates]).all(0)
    lo = torch.zeros_like(estimates[0].value, dtype=torch.float64)
    hi = torch.stack([e.mde(alpha, power) for e in estimates]).nan_to_num(1.0).amax(0) * 4 + 1e-12
    for _ in range(60):  # bisection: the joint power rises with the distance
        mid = (lo + hi) / 2
        reached = joint_power(estimates, alpha, mid, null) >= power
        lo, hi = torch.where(reached, lo, mid), torch.where(reached, mid, hi)
    return torch.where(enough, hi, math.nan)


def joint_power(
    estimates: list[Estimate],
    alpha: float,
    distance: Tensor,
    null: float = 0.0,
    units: Tensor | float = 1.0,
) -> Tensor:
    """[...] the probability that every one of `estimates`' two-sided tests at `alpha` rejects
    at a true value `distance` [...] from `null` (`joint_mde`), with `units` times the units
    behind each (standard errors over its root; the t references kept, which errs low)."""
    out = torch.ones_like(distance, dtype=torch.float64)
    root = torch.as_tensor(units, dtype=torch.float64).sqrt()
    for e in estimates:
        se = e.se_at(null + distance) / root
        z = (e._t(1 - alpha / 2) - distance / se.clamp_min(1e-300)).numpy()
        out = out * torch.from_numpy(np.asarray(_t_sf(z, e.df.numpy()), np.float64))
    return out


# Student t's quantile and survival function as scipy.stats.t computes them (its ``_ppf`` and
# ``_sf``), without its argument checks: the power's bisections call them about 200 times a
# table, where the checks took most of `scan_uncertainty`'s time.
def _t_quantile(q, df):
    return special.stdtrit(df, q)


def _t_sf(x, df):
    return special.stdtr(df, -np.asarray(x))


def auroc_variance(auroc: Tensor) -> Tensor:
    """The variance of an AUROC's placements at true value `auroc` [...] relative to that at
    0.5 (Hanley and McNeil 1982: A / (2 - A) + 2 A^2 / (1 + A) - 2 A^2, 1/6 at 0.5): 1 at 0.5,
    0 at 0 and 1.

    >>> [round(v, 3) for v in auroc_variance(torch.tensor([0.5, 0.75, 0.95, 1.0])).tolist()]
    [1.0, 0.707, 0.152, 0.0]
    """
    a = auroc.double().clamp(0.0, 1.0)
    return 6 * (a / (2 - a) + 2 * a**2 / (1 + a) - 2 * a**2)


def _pair_variance(share: Tensor) -> Tensor:
    """The variance of a 0/1 ordering at true share `share` [...] relative to that at 0.5."""
    p = share.double().clamp(0.0, 1.0)
    return 4 * p * (1 - p)


def mean_over_units(
    values: Tensor, weights: Tensor, bounds: tuple[float, float] = (-math.inf, math.inf)
) -> Estimate:
    """The weighted mean over units of `values` [U, ...] (`weights` [U]; a NaN value has no
    weight) with its cluster-robust standard error and Kish's n_eff of the weights; `bounds`:
    the values it can take (an interval is cut there)."""
    ok = ~torch.isnan(values)
    w = weights.double().reshape(-1, *([1] * (values.dim() - 1))) * ok
    total = w.sum(0)
    share = w / total.clamp_min(1e-300)
    mean = torch.where(total > 0, (torch.nan_to_num(values.double()) * share).sum(0), math.nan)
    influence = share * (torch.nan_to_num(values.double()) - mean)
    se = torch.sqrt(sum_of_squares(influence, share, dim=0))
    return Estimate(mean, se, kish(w, 0), bounds)


def sum_of_squares(influence: Tensor, leverage: Tensor, dim: int = -1) -> Tensor:
    """sum of influence^2 / (1 - leverage) along `dim`: the units' influences on a weighted
    mean, each corrected for how much its own weight pulled the mean towards it (the CR2
    correction; with U equal weights it is the familiar U / (U - 1)).  A unit that is the whole
    mean (leverage 1) has influence 0 and adds nothing."""
    room = (1 - leverage.double()).clamp_min(1e-12)
    return torch.where(room > 1e-9, influence.double() ** 2 / room, 0.0).sum(dim)


def crossed(
    value: Tensor,
    query_var: Tensor,
    token_var: Tensor,
    cell_var: Tensor,
    n_eff: Tensor,
    dof: Tensor,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> Estimate:
    """A figure over crossed queries and tokens: `value` [...], the summed squared influences
    (`sum_of_squares`) of its queries `query_var` [...], of its tokens `token_var` [...] and of
    its (query, token) cells `cell_var` [...] (each unit's derivative of the figure with
    respect to its resampling weight), and the effective number of units `n_eff` [...].

    The variance is the two-way cluster-robust one, query + token - cell (Cameron, Gelbach
    and Miller 2011: a token held by one query only is counted once, through its query), and
    never less than either one-way variance (with one query, the token one).  `dof` [...]:
    the degrees of freedom of the design (`kish` of the squared weights: a variance that a few
    units carry is poorly known), used where fewer than n_eff - 1.

    A proportion's influences vanish where it is 0 or 1 (an AUROC of 1: every pair ordered),
    which would read as certainty: for `bounds` (0, 1) the standard error is at least
    |2p - 1| sqrt(p (1 - p) / (12 (n_eff + 1))) with p = (value n_eff + 1/2) / (n_eff + 1),
    the proportion moved half a unit inwards: half that of one uniform placement per unit
    near 0 and 1, and nothing in the middle, where the influences measure the spread (a
    floor there made a test over 12 queries of many tokens conservative: planted at its
    printed minimal detectable effect, the verdict found 0.98 of the heads, not 0.8)."""
    var = torch.maximum(query_var + token_var - cell_var, torch.maximum(query_var, token_var))
    se = torch.sqrt(var)
    if bounds == (0.0, 1.0):
        se = torch.maximum(se, _proportion_floor(value, n_eff))
    return Estimate(value, torch.where(torch.isnan(value), math.nan, se), n_eff, bounds, dof)


def _proportion_floor(value: Tensor, n_eff: Tensor) -> Tensor:
    """`crossed`'s least standard error of a proportion `value` over `n_eff` units."""
    p = (value * n_eff + 0.5) / (n_eff + 1)
    return (2 * p - 1).abs() * torch.sqrt(p * (1 - p) / (12 * (n_eff + 1)))


def normal_p(value: Tensor, null_sd: Tensor) -> Tensor:
    """Two-sided p-value of `value` [...] against a null centred on 0 with standard deviation
    `null_sd` [...], nearly normal (a sum of many small independent parts); 0 where the null
    has no spread and the value is not 0."""
    z = torch.where(
        null_sd > 0, value.abs() / null_sd.clamp_min(1e-300), torch.where(value == 0, 0.0, math.inf)
    )
    p = 2 * scipy_stats.norm.sf(z.numpy())
    return torch.where(torch.isnan(value), math.nan, torch.from_numpy(np.asarray(p, np.float64)))


def adjust(p: Tensor, method: str = "holm") -> Tensor:
    """p-values [...] adjusted over all their entries (the heads): ``"holm"`` (Holm's step-down,
    family-wise) or ``"fdr"`` (Benjamini-Hochberg); NaN entries are not tested and stay NaN.

    >>> p = torch.tensor([0.01, 0.04, 0.03, float("nan")], dtype=torch.float64)
    >>> [round(x, 6) for x in adjust(p).tolist()]
    [0.03, 0.06, 0.06, nan]
    >>> [round(x, 6) for x in adjust(p, "fdr").tolist()]
    [0.03, 0.04, 0.04, nan]
    """
    if method not in ("holm", "fdr"):
        raise ValueError(f"correction must be 'holm' or 'fdr', got {method!r}")
    flat = p.reshape(-1).double()
    tested = (~torch.isnan(flat)).nonzero().flatten()
    out = torch.full_like(flat, math.nan)
    m = tested.numel()
    if m == 0:
        return out.reshape(p.shape)
    values, order = torch.sort(flat[tested])
    rank = torch.arange(1, m + 1, dtype=torch.float64)
    if method == "holm":
        adjusted = torch.cummax(values * (m - rank + 1), 0).values
    else:
        adjusted = (values * m / rank).flip(0).cummin(0).values.flip(0)
    out[tested[order]] = adjusted.clamp_max(1.0)
    return out.reshape(p.shape)


def resample_counts(num_units: int, num: int, generator=None) -> Tensor:
    """[B, U] how often each unit is drawn in each of `num` resamples with replacement."""
    drawn = torch.randint(num_units, (num, num_units), generator=generator)
    counts = torch.zeros(num, num_units, dtype=torch.float64)
    return counts.scatter_add_(1, drawn, torch.ones_like(drawn, dtype=torch.float64))


def bootstrap_percentile(
    statistic, num_units: int, num: int, level: float = LEVEL, generator=None
) -> tuple[Tensor, Tensor, Tensor]:
    """The percentile interval of `statistic(counts)` -> [B, ...] over `num` resamples of
    `num_units` units with replacement (`counts` [B, U]), for a figure that is no weighted
    mean: (lo [...], hi [...], share [...] of resamples where the statistic is a number).

    >>> values = torch.arange(10.0, dtype=torch.float64)
    >>> lo, hi, share = bootstrap_percentile(
    ...     lambda c: (c @ values) / c.sum(-1), 10, 500, generator=torch.Generator().manual_seed(0))
    >>> bool(2.0 < lo < 4.5 < hi < 7.0), share.item()
    (True, 1.0)
    """
    stat = statistic(resample_counts(num_units, num, generator))
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.nanquantile(stat.double(), q, dim=0)
    return lo, hi, (~torch.isnan(stat)).double().mean(0)


def widened(point: Tensor, lo: Tensor, hi: Tensor, num_units: int, level: float = LEVEL):
    """A percentile interval of `num_units` resampled units widened around `point`: it is too
    narrow for few units, by t(n - 1) / z and sqrt(n / (n - 1)) (calibrated for the head
    types' formation steps in bench_calibration.py)."""
    z = float(scipy_stats.norm.ppf((1 + level) / 2))
    factor = float(scipy_stats.t.ppf((1 + level) / 2, max(num_units - 1, 1))) / z
    factor *= math.sqrt(num_units / max(num_units - 1, 1))
    return point - factor * (point - lo), point + factor * (hi - point)


def with_grid(lo: Tensor, hi: Tensor, grid_lo: Tensor, grid_hi: Tensor) -> tuple[Tensor, Tensor]:
    """A step's interval that holds what the checkpoints allow as well: the hull of its
    resampling interval [lo, hi] and the checkpoints that bracket it [grid_lo, grid_hi] (a
    crossing between two checkpoints is known no better than they place it, however sure the
    resampling is); NaN where the resampling gave none ("too few units" stays so).

    >>> [t.item() for t in with_grid(torch.tensor([345.0]), torch.tensor([346.0]),
    ...                              torch.tensor([256.0]), torch.tensor([500.0]))]
    [256.0, 500.0]
    """
    none = torch.isnan(lo) | torch.isnan(hi)
    return (
        torch.where(none, math.nan, torch.fmin(lo, grid_lo)),
        torch.where(none, math.nan, torch.fmax(hi, grid_hi)),
    )


def interval_over_runs(
    values: np.ndarray,
    log: bool = False,
    level: float = LEVEL,
    bounds: np.ndarray | None = None,
    init=None,
    data=None,
):
    """(mean, sd, lo, hi) of the runs' values for the mean of the recipe's runs: t on the
    runs' mean (on the log axis with `log`, mapped back: a geometric mean); NaN below 2 runs.

    init, data: [R] labels of each run's initial weights and data order (default: each run
    its own).  Runs that share one are not independent draws of the recipe: the mean's
    variance is the design's (`run_components`: sigma_I^2 over runs sharing initial weights,
    sigma_D^2 over those sharing a data order), on Satterthwaite's degrees of freedom (each
    part on its factor's levels - 1); with every run its own, Student's t on n - 1.  Runs
    that all share their initial weights give no interval (NaN bounds): they say what that
    init does over data orders, not what the recipe does.

    bounds: [R, 2] each run's own interval of a step (the checkpoints bracket it): a run's step
    is known only within it, so the interval holds the mean of those bounds as well (on the
    log axis with `log`), however alike the runs' values are; rows not finite and positive
    are left out.

    >>> x = np.array([100.0, 104.0, 150.0, 156.0])
    >>> [round(v, 1) for v in interval_over_runs(x)]  # four independent runs
    [127.5, 29.6, 80.4, 174.6]
    >>> [round(v, 1) for v in interval_over_runs(x, init=[0, 0, 1, 1])]  # two inits: 1 df
    [127.5, 29.6, -189.0, 444.0]
    >>> interval_over_runs(x, init=[0, 0, 0, 0])[2]  # one init: not the recipe's mean
    nan
    """
    values = np.asarray(values, dtype=float)
    keep = np.isfinite(values) & ((values > 0) if log else True)
    labels = [_labels(x, len(values))[keep] for x in (init, data)]
    values = np.log(values[keep]) if log else values[keep]
    n = len(values)
    if n == 0:
        return (math.nan,) * 4
    mean = float(values.mean())
    back = (lambda v: math.exp(v)) if log else (lambda v: v)
    if n < 2:
        return back(mean), math.nan, math.nan, math.nan
    sd = float(values.std(ddof=1))
    variance, df = _variance_of_mean(values, *labels)
    if df < 1:
        return back(mean), sd, math.nan, math.nan
    half = float(scipy_stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(variance)
    mean, lo, hi = back(mean), back(mean - half), back(mean + half)
    if bounds is not None:
        bounds = np.asarray(bounds, dtype=float).reshape(-1, 2)[keep]
        bounds = bounds[np.isfinite(bounds).all(1) & ((bounds > 0).all(1) if log else True)]
        if len(bounds):
            low, high = np.exp(np.log(bounds).mean(0)) if log else bounds.mean(0)
            lo, hi = min(lo, float(low)), max(hi, float(high))
    return mean, sd, lo, hi


def _labels(labels, n: int) -> np.ndarray:
    """[n] integer codes of `labels`; None (or a missing label): each run its own."""
    if labels is None:
        return np.arange(n)
    labels = list(labels)
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} runs")
    codes: dict = {}
    out = []
    for r, label in enumerate(labels):
        missing = label is None or (isinstance(label, float) and math.isnan(label))
        out.append(codes.setdefault(("own", r) if missing else label, len(codes)))
    return np.array(out)


PAIR_KINDS = ("init", "data", "both")  # what two runs differ in: initial weights, data, both


def pair_variances(values: np.ndarray, init=None, data=None) -> dict[str, tuple[float, int]]:
    """{kind: (half the mean squared difference, pairs)} over the pairs of runs that differ in
    their initial weights only ("init": sigma_I^2 + sigma_e^2), their data order only
    ("data": sigma_D^2 + sigma_e^2) or both ("both": sigma_I^2 + sigma_D^2 + sigma_e^2),
    each unbiased in any design (crossed, nested, PolyPythias' seed / data-seed /
    weight-seed); kinds no pair has are left out.  Pairs that share both are replicates
    and count nowhere, runs without a value (NaN) in none.  [R] values; labels as
    `interval_over_runs` takes them.

    >>> v = pair_variances(np.array([1.0, 2.0, 5.0, 6.0]), init=[0, 0, 1, 1], data=[0, 1, 0, 1])
    >>> {k: (round(x, 2), n) for k, (x, n) in v.items()}
    {'init': (8.0, 2), 'data': (0.5, 2), 'both': (8.5, 2)}
    """
    values = np.asarray(values, dtype=float)
    i, d = _labels(init, len(values)), _labels(data, len(values))
    keep = np.isfinite(values)  # a run without a value is in no pair
    values, i, d = values[keep], i[keep], d[keep]
    r, s = np.triu_indices(len(values), 1)
    half_sq = (values[r] - values[s]) ** 2 / 2
    same_i, same_d = i[r] == i[s], d[r] == d[s]
    out = {}
    for kind, which in zip(PAIR_KINDS, (same_d & ~same_i, same_i & ~same_d, ~same_i & ~same_d)):
        if which.any():
            out[kind] = (float(half_sq[which].mean()), int(which.sum()))
    return out


def run_components(variances: Mapping[str, tuple[float, int]]) -> dict[str, float]:
    """{"init": sigma_I^2, "data": sigma_D^2, "rest": sigma_e^2} from `pair_variances`, each
    at least 0: what only the initial weights move, what only the data order moves, and
    what moves with neither alone (their interaction, nondeterminism).  A part the design
    cannot tell apart from the rest is folded into the rest (no pair differs in the data
    order only: sigma_D^2 is 0 and the rest holds it); with no pair differing in both, the
    rest is put at 0 (the larger shared parts: a wider interval for the mean)."""
    v = {k: x for k, (x, _) in variances.items()}
    both, vi, vd = v.get("both"), v.get("init"), v.get("data")
    if both is None:
        comps = {"init": vi or 0.0, "data": vd or 0.0, "rest": 0.0}
    elif vi is not None and vd is not None:
        comps = {"init": both - vd, "data": both - vi, "rest": vi + vd - both}
    else:
        comps = {
            "init": both - vd if vd is not None else 0.0,
            "data": both - vi if vi is not None else 0.0,
            "rest": vd if vd is not None else (vi if vi is not None else both),
        }
    return {k: max(float(x), 0.0) for k, x in comps.items()}


def _variance_of_mean(values: np.ndarray, init: np.ndarray, data: np.ndarray):
    """(variance of the runs' mean, its degrees of freedom) in the design of `init`, `data`:
    sum over run pairs of sigma_I^2 [same init] + sigma_D^2 [same data] + sigma_e^2 [same
    run], over n^2; Satterthwaite's degrees of freedom, each part on its own (levels - 1 for
    a factor, the rest what the factors leave; at most n - 1); 0 where every run shares its
    initial weights."""
    n = len(values)
    levels_i, levels_d = len(set(init.tolist())), len(set(data.tolist()))
    if levels_i == n and levels_d == n:  # every run its own: Student's t
        return float(values.var(ddof=1)) / n, n - 1
    if levels_i < 2:
        return math.nan, 0
    comps = run_components(pair_variances(values, init, data))
    parts = {
        "init": comps["init"] * float((np.bincount(init) ** 2).sum()) / n**2,
        "data": comps["data"] * float((np.bincount(data) ** 2).sum()) / n**2,
        "rest": comps["rest"] / n,
    }
    # Satterthwaite: each part on the degrees of freedom of what estimates it
    shared = {k: len(set(x.tolist())) for k, x in (("init", init), ("data", data))}
    dfs = {k: v - 1 for k, v in shared.items()}
    dfs["rest"] = n - 1 - sum(v - 1 for v in shared.values() if v < n)
    variance = sum(parts.values())
    spread = sum(p * p / max(dfs[k], 1) for k, p in parts.items() if p > 0)
    df = variance**2 / spread if spread > 0 else float(levels_i - 1)
    return float(variance), min(df, float(n - 1))


def spread_split(
    values: np.ndarray,
    init,
    data,
    log: bool = False,
    level: float = LEVEL,
    draws: int = 4000,
    seed: int = 0,
) -> pd.DataFrame:
    """How the runs' spread splits between what their initial weights and their data order
    do: one row per part (``init``, ``data``, ``rest``; those the design tells apart) with
    its ``share`` of the variance between runs that differ in both (sigma_I^2, sigma_D^2,
    sigma_e^2 over their sum), the interval (``share_lo``/``_hi``), ``sd`` (on the log axis
    with `log`: a factor's spread) and ``df``, the degrees of freedom behind it; ``method``
    says which of the two below.  Empty where no two runs share either.

    ``anova``: where the residual of the additive fit has degrees of freedom (a crossed grid
    of initial weights x data orders, or inits each with several runs), each factor's sum of
    squares adjusted for the other and the residual's, with the generalised pivotal quantities
    of Weerahandi (exact in balanced designs: each sum of squares a scaled chi-square).  A
    factor no two runs share is folded into the rest.  ``pairs``: otherwise (PolyPythias'
    seeds, data-seeds and weight-seeds), each kind of pair's variance (`pair_variances`) as
    a scaled chi-square of Satterthwaite's degrees of freedom, drawn independently.  Both are
    checked by simulation in `analyses/benchmarks/bench_population.py`.

    >>> x = np.array([1.0, 1.1, 3.0, 3.2, 5.0, 4.9, 2.0, 2.2])
    >>> split = spread_split(x, init=[0, 0, 1, 1, 2, 2, 3, 3], data=[0, 1] * 4)
    >>> split.set_index("part").loc["init", ["share", "df"]].round(3).tolist()
    [0.995, 3.0]
    """
    columns = ["part", "share", "share_lo", "share_hi", "sd", "df", "method"]
    values = np.asarray(values, dtype=float)
    keep = np.isfinite(values) & ((values > 0) if log else True)
    i, d = (_labels(x, len(values))[keep] for x in (init, data))
    values = np.log(values[keep]) if log else values[keep]
    n = len(values)
    shared = {k: bool((np.bincount(x) > 1).any()) for k, x in (("init", i), ("data", d))}
    if n < 3 or not any(shared.values()):
        return pd.DataFrame(columns=columns)
    g = np.random.default_rng(seed)
    alpha = (1 - level) / 2
    factors = {
        k: _indicators(x)
        for k, x in (("init", i), ("data", d))
        if shared[k] and len(np.unique(x)) > 1
    }
    full = np.hstack([np.ones((n, 1)), *factors.values()])
    df_e = n - np.linalg.matrix_rank(full)
    if df_e >= 1 and factors:
        method = "anova"
        resid = _residual(full, values)
        ss_e = float(resid @ resid)
        sigma2 = {"rest": ss_e / df_e}
        star = {"rest": ss_e / g.chisquare(df_e, draws)}
        dfs = {"rest": float(df_e)}
        for name, z in factors.items():
            others = np.hstack([np.ones((n, 1)), *(v for k, v in factors.items() if k != name)])
            reduced = _residual(others, values)
            ss = float(reduced @ reduced) - ss_e
            df = np.linalg.matrix_rank(full) - np.linalg.matrix_rank(others)
            # E[ss] = df sigma_e^2 + k sigma_f^2, k = tr(Z' (P_full - P_others) Z)
            k = float(np.sum(_residual(others, z) ** 2) - np.sum(_residual(full, z) ** 2))
            if df < 1 or k <= 0:
                continue
            sigma2[name] = max((ss / df - sigma2["rest"]) * df / k, 0.0)
            star[name] = np.maximum((ss / g.chisquare(df, draws) - star["rest"]) * df / k, 0.0)
            dfs[name] = float(df)
        total, total_star = sum(sigma2.values()), np.maximum(sum(star.values()), 1e-300)
        shares = {k: v / total if total > 0 else math.nan for k, v in sigma2.items()}
        shares_star = {k: v / total_star for k, v in star.items()}
    else:
        seen = pair_variances(values, i, d)
        if "both" not in seen or len(seen) < 2:
            return pd.DataFrame(columns=columns)
        method = "pairs"
        sigma2 = run_components(seen)
        pair_dfs = _pair_dfs(values, i, d, sigma2)
        point = {k: v for k, (v, _) in seen.items()}
        drawn = {k: v * pair_dfs[k] / g.chisquare(pair_dfs[k], draws) for k, v in point.items()}
        # shares of the variance between runs that differ in both, V_both: what remains when
        # only the data order changes (V_data) is the rest the initial weights leave
        shares, shares_star = (_pair_shares(v) for v in (point, drawn))
        dfs = {
            "init": pair_dfs.get("data", math.nan),
            "data": pair_dfs.get("init", math.nan),
            "rest": pair_dfs["both"],
        }
    rows = []
    for part in ("init", "data", "rest"):
        if part not in shares or part not in shares_star:
            continue
        share = np.clip(shares_star[part], 0.0, 1.0)
        rows.append(
            {
                "part": part,
                "share": float(np.clip(shares[part], 0.0, 1.0)),
                "share_lo": float(np.quantile(share, alpha)),
                "share_hi": float(np.quantile(share, 1 - alpha)),
                "sd": math.sqrt(sigma2.get(part, 0.0)),
                "df": dfs.get(part, math.nan),
                "method": method,
            }
        )
    return pd.DataFrame(rows, columns=columns)


def _pair_shares(v: dict) -> dict:
    """Shares of V_both from pair variances (floats or [draws] arrays): the initial weights'
    1 - V_data / V_both, the data order's 1 - V_init / V_both, the rest what is left (or,
    where one kind is missing, that kind over V_both: the part folded into the rest)."""
    both = np.maximum(v["both"], 1e-300)
    out = {}
    if "data" in v:
        out["init"] = 1 - v["data"] / both
    if "init" in v:
        out["data"] = 1 - v["init"] / both
    if "init" in v and "data" in v:  # what neither part (each within [0, 1]) holds
        out["rest"] = 1 - np.clip(out["init"], 0, 1) - np.clip(out["data"], 0, 1)
    else:
        out["rest"] = v.get("data", v.get("init")) / both
    return out


FAR_LEVEL = 0.99  # a run is said far off where normal runs of the design rarely are


def far_runs(
    values: np.ndarray, init=None, data=None, log: bool = False, level: float = FAR_LEVEL
) -> np.ndarray:
    """[R] the runs far from what their initial weights and data order predict: the largest
    residual of a median polish (each factor's per-level medians taken out in turn, so a far
    run does not pull its initialisation's effect towards itself), over the residuals'
    spread without their largest quarter, beyond the `level` quantile of the same statistic
    over normal runs of the same design (simulated, seeded), taken out one at a time, at
    most a quarter of the runs; none where no factor is shared or under 6 runs.  Such runs
    (a seed that went another way) carry a variance share that a few runs rarely show, so
    the split of the others is the typical runs' and these are said apart.

    >>> x = np.array([1.0, 1.1, 1.22, 1.3, 1.98, 2.11, 2.24, 2.33, 2.98, 3.66, 3.18, 3.3,
    ...               3.93, 4.09, 4.16, 4.28])  # 4 inits x 4 data orders, run 9 0.6 off
    >>> far_runs(x, init=np.repeat(np.arange(4), 4), data=np.tile(np.arange(4), 4)).nonzero()[0]
    array([9])
    """
    values = np.asarray(values, dtype=float)
    ok = np.isfinite(values) & ((values > 0) if log else True)
    x = np.log(values[ok]) if log else values[ok]
    i, d = (_labels(lab, len(values))[ok] for lab in (init, data))
    far = np.zeros(len(x), dtype=bool)
    for _ in range(len(x) // 4):
        kept = np.flatnonzero(~far)
        found = _largest_residual(x[kept], i[kept], d[kept], level)
        if found is None:
            break
        far[kept[found]] = True
    out = np.zeros(len(values), dtype=bool)
    out[ok] = far
    return out


def _polished(x: np.ndarray, levels: list[np.ndarray], sweeps: int = 8) -> np.ndarray:
    """[..., n] residuals of a median polish of `x` [..., n] over factors (level codes)."""
    r = x - np.median(x, -1, keepdims=True)
    for _ in range(sweeps):
        for codes in levels:
            for level in np.unique(codes):
                at = codes == level
                r[..., at] -= np.median(r[..., at], -1, keepdims=True)
    return r


def _largest_residual(x, i, d, level: float) -> int | None:
    """The run whose polished residual is beyond the design's `level` quantile, or None."""
    levels = [c for c in (i, d) if len(np.unique(c)) > 1 and (np.bincount(c) > 1).any()]
    if not levels or len(x) < 6:
        return None
    r = np.abs(_polished(x, levels))
    scale = _trimmed_scale(r)
    if scale <= 1e-12 * (np.abs(x).max() + 1):
        return None
    if r.max() / scale <= _far_threshold((tuple(i.tolist()), tuple(d.tolist()), level), levels):
        return None
    return int(r.argmax())


def _trimmed_scale(r: np.ndarray) -> np.ndarray:
    """[...] the root mean square of |r| [..., n] without its largest quarter: the spread of
    the runs a quarter of far ones cannot inflate (median polish leaves some residuals at
    exactly 0, so a median would be no scale)."""
    n = r.shape[-1]
    kept = np.sort(r, -1)[..., : n - (n + 3) // 4]
    return np.sqrt((kept**2).mean(-1))


_FAR: dict = {}


def _far_threshold(key, levels: list[np.ndarray]) -> float:
    """The `level` quantile of max |r| / `_trimmed_scale` over normal runs of the design."""
    if key not in _FAR:
        z = np.random.default_rng(len(key[0])).normal(size=(2000, len(key[0])))
        r = np.abs(_polished(z, levels))
        stat = r.max(-1) / _trimmed_scale(r)
        _FAR[key] = float(np.quantile(stat, key[2]))
        if len(_FAR) > 256:  # designs seen in one process: a bound, not a cache to keep
            _FAR.pop(next(iter(_FAR)))
    return _FAR[key]


def _indicators(labels: np.ndarray) -> np.ndarray:
    """[n, levels] 0/1 columns of `labels`' levels."""
    return (labels[:, None] == np.unique(labels)[None, :]).astype(float)


def _residual(design: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`y` (one column or several) less its least-squares fit on `design`'s columns."""
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return y - design @ coef


def _pair_dfs(values, i, d, sigma2) -> dict[str, float]:
    """Satterthwaite's degrees of freedom of each kind of pair variance: 2 E^2 / Var of the
    quadratic form under Gaussian effects of sizes `sigma2` on the design."""
    n = len(values)
    cov = (
        sigma2["init"] * (i[:, None] == i[None, :])
        + sigma2["data"] * (d[:, None] == d[None, :])
        + max(sigma2["rest"], 1e-12) * np.eye(n)
    )
    r, s = np.triu_indices(n, 1)
    same_i, same_d = i[r] == i[s], d[r] == d[s]
    out = {}
    for kind, which in zip(PAIR_KINDS, (same_d & ~same_i, same_i & ~same_d, ~same_i & ~same_d)):
        if not which.any():
            continue
        a = np.zeros((n, n))  # V = x' A x: the mean of (x_r - x_s)^2 / 2 over the kind's pairs
        p, q = r[which], s[which]
        np.add.at(a, (p, p), 0.5)
        np.add.at(a, (q, q), 0.5)
        np.add.at(a, (p, q), -0.5)
        np.add.at(a, (q, p), -0.5)
        a /= which.sum()
        ac = a @ cov
        out[kind] = 2 * np.trace(ac) ** 2 / max(2 * np.trace(ac @ ac), 1e-300)
    return out


def _gap_statistic(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[..., n] sorted values -> (largest split statistic, where): over the splits of the
    sorted values into a lower and an upper group, the gap between them over the pooled
    within-group sd (n - 2 degrees of freedom)."""
    n = x.shape[-1]
    k = np.arange(1, n)
    csum, csq = np.cumsum(x, -1), np.cumsum(x * x, -1)
    lo_ss = csq[..., :-1] - csum[..., :-1] ** 2 / k
    hi_n = n - k
    hi_sum, hi_sq = csum[..., -1:] - csum[..., :-1], csq[..., -1:] - csq[..., :-1]
    hi_ss = hi_sq - hi_sum**2 / hi_n
    within = np.sqrt(np.maximum(lo_ss + hi_ss, 0.0) / (n - 2))
    gap = np.diff(x, axis=-1)
    stat = gap / np.maximum(within, 1e-12 * (np.abs(x).max(-1, keepdims=True) + 1))
    return stat.max(-1), stat.argmax(-1)


@functools.lru_cache(maxsize=64)
def _gap_threshold(n: int, level: float) -> float:
    """The `level` quantile of `_gap_statistic` over n normal runs (simulated, seeded)."""
    x = np.sort(np.random.default_rng(n).normal(size=(20_000, n)), -1)
    return float(np.quantile(_gap_statistic(x)[0], level))


def run_groups(values: np.ndarray, log: bool = False, level: float = LEVEL):
    """Where the runs fall in two separate groups: (runs below, runs above, the lower
    group's mean, the upper's; on the log axis with `log`, mapped back), or None.  Groups
    are said where the largest gap between the sorted runs, over the spread within the two
    groups it leaves, exceeds what `level` of normal samples of as many runs show (a test of
    one normal group; needs 4 runs).

    >>> run_groups(np.array([115.0, 118, 122, 125, 130, 170, 172, 177]), log=True)
    (5, 3, 121.9, 173.0)
    >>> run_groups(np.array([115.0, 130, 150, 160, 171, 177])) is None
    True
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x) & ((x > 0) if log else True)]
    x = np.sort(np.log(x) if log else x)
    if len(x) < 4:
        return None
    stat, where = _gap_statistic(x)
    if stat <= _gap_threshold(len(x), level):
        return None
    k = int(where) + 1
    back = np.exp if log else (lambda v: v)
    return k, len(x) - k, round(float(back(x[:k].mean())), 1), round(float(back(x[k:].mean())), 1)


def share_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Clopper-Pearson interval of a share k / n (NaN for none)."""
    if n == 0:
        return math.nan, math.nan
    alpha = 1 - level
    lo = 0.0 if k == 0 else float(scipy_stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(scipy_stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi
