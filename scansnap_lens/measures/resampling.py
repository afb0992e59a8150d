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

import math
from dataclasses import dataclass

import numpy as np
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
    "interval_over_runs",
    "joint_mde",
    "joint_power",
    "kish",
    "mean_over_units",
    "normal_p",
    "resample_counts",
    "share_interval",
    "sum_of_squares",
    "too_few",
    "widened",
    "with_grid",
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
    estimates: list[Estimate], alpha: float, distance: Tensor, null: float = 0.0,
    units: Tensor | float = 1.0,
) -> Tensor:  # fmt: skip
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
    z = torch.where(null_sd > 0, value.abs() / null_sd.clamp_min(1e-300),
                    torch.where(value == 0, 0.0, math.inf))  # fmt: skip
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


def bootstrap_percentile(statistic, num_units: int, num: int, level: float = LEVEL,
                         generator=None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
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
    return (torch.where(none, math.nan, torch.fmin(lo, grid_lo)),
            torch.where(none, math.nan, torch.fmax(hi, grid_hi)))  # fmt: skip


def interval_over_runs(
    values: np.ndarray, log: bool = False, level: float = LEVEL, bounds: np.ndarray | None = None
):
    """(mean, sd, lo, hi) of the runs' values, each run one unit: t with n - 1 degrees of
    freedom (on the log axis with `log`, mapped back: a geometric mean); NaN below 2 runs.

    bounds: [R, 2] each run's own interval of a step (the checkpoints bracket it): a run's step
    is known only within it, so the interval holds the mean of those bounds as well (on the
    log axis with `log`), however alike the runs' values are; rows not finite and positive
    are left out."""
    values = values[np.isfinite(values)]
    if log:
        values = np.log(values[values > 0])
    n = len(values)
    if n == 0:
        return (math.nan,) * 4
    mean = float(values.mean())
    if n < 2:
        return (math.exp(mean) if log else mean), math.nan, math.nan, math.nan
    sd = float(values.std(ddof=1))
    half = float(scipy_stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    if log:
        mean, lo, hi = math.exp(mean), math.exp(lo), math.exp(hi)
    if bounds is not None:
        bounds = np.asarray(bounds, dtype=float).reshape(-1, 2)
        bounds = bounds[np.isfinite(bounds).all(1) & ((bounds > 0).all(1) if log else True)]
        if len(bounds):
            low, high = np.exp(np.log(bounds).mean(0)) if log else bounds.mean(0)
            lo, hi = min(lo, float(low)), max(hi, float(high))
    return mean, sd, lo, hi


def share_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Clopper-Pearson interval of a share k / n (NaN for none)."""
    if n == 0:
        return math.nan, math.nan
    alpha = 1 - level
    lo = 0.0 if k == 0 else float(scipy_stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(scipy_stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi
