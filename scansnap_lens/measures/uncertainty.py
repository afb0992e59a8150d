"""How sure each head's figures are, and the `scans` verdict, at the last checkpoint.

Nothing is measured here: each figure comes from its own module's one definition
(`discriminative.QueryTokens`, `frequency.ClassTokens`, `entropy`,
`snap.snap_step_interval`), its interval and p-value from `resampling`.  What each interval
covers, the verdict's stages and its minimal detectable effect: docs/glossary.md, "How sure".

Shape letters (docs/shapes.md): L layers, H heads.
"""

from __future__ import annotations

import math

import pandas as pd
import torch
from scipy import stats as scipy_stats
from torch import Tensor

from scansnap_lens.measures.discriminative import QueryTokens
from scansnap_lens.measures.entropy import attention_entropy_estimate, distinct_entropy_estimate
from scansnap_lens.measures.frequency import ClassTokens
from scansnap_lens.measures.measurement import Measurement
from scansnap_lens.measures.resampling import (
    ALPHA,
    LEVEL,
    MIN_UNITS,
    POWER,
    Estimate,
    adjust,
    joint_mde,
    joint_power,
    too_few,
)
from scansnap_lens.measures.snap import snap_step_interval
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups

__all__ = ["UNCERTAINTY_COLUMNS", "VERDICTS", "scan_uncertainty"]

# the columns `scan_uncertainty` adds to the one-row-per-head summary
UNCERTAINTY_COLUMNS = (
    "scans",
    "verdict",
    "frequency_control",
    "bias_lo",
    "bias_hi",
    "bias_p",
    "bias_n_eff",
    "bias_baseline",
    "auroc_lo",
    "auroc_hi",
    "auroc_p",
    "auroc_n_eff",
    "auroc_mde",
    "auroc_baseline",
    "held_auroc",
    "held_auroc_lo",
    "held_auroc_hi",
    "held_auroc_p",
    "held_auroc_n_eff",
    "held_auroc_lost",
    "matched_auroc",
    "matched_auroc_lo",
    "matched_auroc_hi",
    "matched_auroc_p",
    "matched_auroc_n_eff",
    "word_matched_auroc",
    "word_matched_auroc_lo",
    "word_matched_auroc_hi",
    "word_matched_auroc_p",
    "word_matched_auroc_n_eff",
    "frequency_auroc",
    "held_units_needed",
    "rows_for_target",
    "frequency_bias_r",
    "frequency_bias_p",
    "spearman_lo",
    "spearman_hi",
    "spearman_p",
    "spearman_n_eff",
    "entropy_lo",
    "entropy_hi",
    "entropy_n_eff",
    "attention_entropy_lo",
    "attention_entropy_hi",
    "snap_step_lo",
    "snap_step_hi",
    "snap_share",
    "half_distance_step_lo",
    "half_distance_step_hi",
    "half_displacement_step_lo",
    "half_displacement_step_hi",
)
# the verdict's words, one per outcome (each may carry a number after it)
VERDICTS = {
    "scans": "scans",
    "too_few": "too few units",
    "no_scan": "no scan",
    "cannot_tell": "cannot tell from frequency",  # scans or prefers rarer tokens
    "not_beyond": "not beyond frequency",
}


def scan_uncertainty(
    traj: Trajectory,
    groups: TokenGroups,
    level: float = LEVEL,
    alpha: float = ALPHA,
    correction: str = "holm",
    seed: int = 0,
    snap_resamples: int = 200,
) -> Measurement:
    """Intervals, p-values, baselines and the verdict of every head (see the module).

    Table, one row per layer and head: the figures at the last checkpoint (``bias``,
    ``auroc``, ``spearman``, ``entropy``, ``attention_entropy``, as their measurements give
    them) and `UNCERTAINTY_COLUMNS` (what the summary takes): ``bias_lo``, ``bias_hi``, ``bias_p``
    (two-sided), ``bias_n_eff``, ``bias_baseline``; the same for ``auroc`` with ``auroc_mde``
    (the AUROC of a pure kind effect the verdict would have called "scans" with 80 % power at
    the first step's level of the correction), for ``held_auroc`` (frequency held: the
    verdict's control) and for ``matched_auroc`` and ``word_matched_auroc`` (the same control
    by matching, shown beside it); ``frequency_auroc`` (how well the pair counts alone separate
    the kinds: below 0.5 the distinct tokens are the rarer); the
    intervals of ``spearman``, ``entropy``, ``attention_entropy`` and ``snap_step``; the
    ``verdict``, ``frequency_control`` (how frequency was ruled out) and ``scans``.
    ``table.attrs`` holds the level, alpha, correction, number of heads tested, `MIN_UNITS`,
    ``matched_on`` (corpus or evaluation counts), ``queries`` (those with both kinds: the
    verdict's units) and ``shared`` (the token ids left out, `TokenGroups.shared`).  Seeded
    (`seed`, for the snap step's bootstrap).
    """
    if not 0 < alpha < 1 or not 0 < level < 1:
        raise ValueError(f"alpha and level must lie in (0, 1), got {alpha} and {level}")
    units = QueryTokens.of(traj, groups)
    g = torch.Generator().manual_seed(seed)
    z0 = traj.zbar[0][..., units.slot].double()  # [L, H, N]
    dz = traj.zbar[-1][..., units.slot].double() - z0
    corpus = units.corpus_count is not None  # match on the counts the kinds came from
    estimates, nulls = _kind_estimates(units, dz, corpus)
    controls = ["held_auroc"]  # the verdict's frequency control; the matched ones are shown
    frequency = (units.corpus_pair_count if corpus else units.count).double().log()
    out: dict[str, Tensor] = {
        "bias_baseline": units.bias_estimate(z0).value,
        "auroc_baseline": units.auroc_estimate(z0).value,
        "frequency_auroc": units.auroc_estimate(frequency).value.expand_as(dz[..., 0]),
    }
    one_sided: dict[str, Tensor] = {}
    for c in controls:  # how much of the gain is lost with frequency held
        lost = units.difference(estimates["auroc"], estimates[c])
        out[f"{c}_lost"] = lost.value
        one_sided[f"{c}_lost"] = _above(lost.value, lost.p_value(0.0))
    _class_tests(traj, groups, estimates, out, one_sided)
    try:
        estimates["entropy"] = distinct_entropy_estimate(traj, groups)
    except ValueError:
        pass
    if traj.holds("query_entropy"):  # the lab's trajectories have no attention over positions
        estimates["attention_entropy"] = attention_entropy_estimate(traj)

    for name, est in estimates.items():
        out[name] = est.value
        out[f"{name}_lo"], out[f"{name}_hi"] = est.interval(level)
        if name in nulls:
            out[f"{name}_p"] = est.p_value(nulls[name])
        if name != "attention_entropy":
            out[f"{name}_n_eff"] = est.n_eff
    tested = int((~torch.isnan(out["auroc_p"])).sum())
    _power(estimates, controls, alpha / max(tested, 1), out)
    out.update(snap_step_interval(traj, snap_resamples, level, g))
    for name in ("snap_step_n_eff", "snap_step_grid_lo", "snap_step_grid_hi"):  # `snapping`'s
        out.pop(name)

    adjusted = {name: adjust(out[f"{name}_p"], correction) for name in nulls}
    adjusted.update({name: adjust(p, correction) for name, p in one_sided.items()})
    verdict, control = _verdicts(estimates, out, adjusted, alpha, corpus, controls)
    table = _table(traj, out, verdict, control)
    shared = [] if groups.shared is None else groups.shared.tolist()
    table.attrs.update(
        level=level,
        alpha=alpha,
        correction=correction,
        heads=tested,
        min_units=MIN_UNITS,
        matched_on=_MATCHED_ON[corpus],
        queries=int(units.query.numel()),
        shared=shared,
    )
    return Measurement("uncertainty", table)


def _kind_estimates(units: QueryTokens, dz: Tensor, corpus: bool) -> tuple[dict, dict]:
    """The kinds' estimates of `scan_uncertainty` from the logit changes dz [L, H, N] and the
    value each is tested against: bias, AUROC, the AUROC with frequency held and the AUROC
    among pairs matched on frequency (the pair's, and on a corpus's counts also the word's)."""
    estimates = {
        "bias": units.bias_estimate(dz),
        "auroc": units.auroc_estimate(dz, units.ranks(dz)),
        "matched_auroc": units.matched_auroc_estimate(
            dz, units.corpus_pair_matched_pairs if corpus else None
        ),
    }
    estimates["held_auroc"] = units.held_auroc_estimate(dz)
    nulls = {"bias": 0.0, "auroc": 0.5, "held_auroc": 0.5, "matched_auroc": 0.5}
    if corpus:  # the word's frequency too: a key-side preference belongs to the word
        estimates["word_matched_auroc"] = units.matched_auroc_estimate(
            dz, units.corpus_matched_pairs
        )
        nulls["word_matched_auroc"] = 0.5
    return estimates, nulls


def _class_tests(traj, groups, estimates: dict, out: dict, one_sided: dict) -> None:
    """The per-class tests, added to `scan_uncertainty`'s estimates and p-values: Spearman's
    rank correlation and the frequency bias among distinct tokens."""
    classes = ClassTokens.of(traj, groups)
    if not classes.num_classes:
        return
    z = traj.zbar[..., classes.slot]
    d_class = z[-1].double() - z[0].double()
    estimates["spearman"] = classes.estimate(d_class)
    out["spearman_p"] = torch.where(
        estimates["spearman"].n_eff >= MIN_UNITS, classes.null_p(d_class), math.nan
    )
    # the paper's second line (Theorem 3): dz grows with P(l|m, n) itself; these classes'
    # tokens as units, P shuffled within each class
    r, p = classes.growth_test(d_class)
    enough = (classes.sizes - 1).sum() >= MIN_UNITS
    out["frequency_bias_r"], out["frequency_bias_p"] = r, torch.where(enough, p, math.nan)
    one_sided["frequency_bias"] = out["frequency_bias_p"]


def _power(estimates: dict, controls: list[str], per_head: float, out: dict) -> None:
    """The verdict's power at the level `per_head`, added to `out`: ``auroc_mde``,
    ``held_units_needed`` and ``rows_for_target``."""
    joint = [estimates[k] for k in ("auroc", *controls)]
    out["auroc_mde"] = 0.5 + joint_mde(joint, per_head, null=0.5)
    out["held_units_needed"] = _units_needed(estimates, controls, per_head)
    out["rows_for_target"] = _rows_factor(joint, per_head, out["auroc_mde"])


def _table(traj, out: dict, verdict: list[str], control: list[str]) -> pd.DataFrame:
    """`scan_uncertainty`'s table: one row per layer and head, NaN where a figure could not
    be made."""
    index = pd.MultiIndex.from_product([traj.layers, traj.heads], names=["layer", "head"])
    columns = {
        "scans": [v == VERDICTS["scans"] for v in verdict],
        "verdict": verdict,
        "frequency_control": control,
    }
    nan = torch.full((len(traj.layers), len(traj.heads)), math.nan, dtype=torch.float64)
    figures = ("bias", "auroc", "spearman", "entropy", "attention_entropy")
    for name in (*figures, *UNCERTAINTY_COLUMNS):
        if name not in columns:
            columns[name] = out.get(name, nan).reshape(-1).numpy()
    return pd.concat([index.to_frame(index=False), pd.DataFrame(columns)], axis=1)


_MATCHED_ON = {True: "corpus counts", False: "evaluation counts"}


def _above(value: Tensor, p_two_sided: Tensor) -> Tensor:
    """One-sided p-value of value > its null from a symmetric test's two-sided one."""
    return torch.where(value > 0, p_two_sided / 2, 1 - p_two_sided / 2)


TARGET_AUROC = 0.75  # the effect a plan of more rows is stated for (`rows_for_target`)


def _rows_factor(estimates: list[Estimate], alpha: float, mde: Tensor) -> Tensor:
    """[L, H] how many times the evaluation rows would bring the verdict's minimal detectable
    AUROC to `TARGET_AUROC`, taking the units to grow with the rows (the standard errors fall
    as one over their root); 1 where it is there already, NaN where no number of rows helps
    (too few units of some test) or past 1024 times."""
    d = torch.full_like(mde, TARGET_AUROC - 0.5)
    lo = torch.zeros_like(mde)  # log2 of the factor
    hi = torch.full_like(mde, 10.0)
    for _ in range(30):  # bisection: the joint power rises with the units
        mid = (lo + hi) / 2
        ok = joint_power(estimates, alpha, d, 0.5, 2.0**mid) >= POWER
        lo, hi = torch.where(ok, lo, mid), torch.where(ok, mid, hi)
    reached = joint_power(estimates, alpha, d, 0.5, 2.0**hi) >= POWER
    factor = torch.where(mde <= TARGET_AUROC, 1.0, 2.0**hi)
    return torch.where(torch.isnan(mde) | ~reached, math.nan, factor)


def _units_needed(est: dict[str, Estimate], controls: list[str], alpha: float) -> Tensor:
    """[L, H] the effective units at which the weakest frequency control would tell the
    head's own AUROC from 0.5 with 80 % power (the standard error falls as one over
    the root of the units); NaN where the AUROC is not above 0.5."""
    gap = est["auroc"].value - 0.5
    need = torch.zeros_like(gap)
    z = float(scipy_stats.norm.ppf(1 - alpha / 2) + scipy_stats.norm.ppf(POWER))
    for c in controls:
        e = est[c]
        se_one = e.se_at(est["auroc"].value) * e.n_eff.clamp_min(1).sqrt()  # one unit's spread
        se_one = torch.where(
            e.enough,
            se_one,
            est["auroc"].se_at(est["auroc"].value) * est["auroc"].n_eff.clamp_min(1).sqrt(),
        )
        need = torch.fmax(need, (z * se_one / gap.clamp_min(1e-12)) ** 2)
    return torch.where(gap > 0, need.ceil().clamp_min(MIN_UNITS), math.nan)


_CONTROL_WORDS = {
    True: {"held_auroc": "pair counts C(m, l) and word counts"},
    False: {"held_auroc": "pair counts in the evaluation text"},
}


def _power_seen(mde: float, rows: float) -> str:
    """What a "no scan" verdict could have seen: its minimal detectable AUROC, and how many
    times the rows would see `TARGET_AUROC`."""
    if math.isnan(mde):
        seen = "no power: too few units with frequency held"
    elif mde < 1:
        seen = f"could have seen AUROC >= {mde:.3g}"
    else:
        seen = "no power: not even an AUROC of 1 was within reach"
    if rows > 1:
        seen += f"; about {rows:.2g} times the evaluation rows would see {TARGET_AUROC:g}"
    return seen


def _verdicts(
    est: dict[str, Estimate],
    out: dict[str, Tensor],
    adj: dict[str, Tensor],
    alpha: float,
    corpus: bool,
    controls: list[str],
) -> tuple[list[str], list[str]]:
    """Per head (flattened [L * H]) the verdict and how frequency was ruled out (the module's
    stages)."""

    def flat(x: Tensor | None) -> list[float]:
        return [math.nan] * len(bias) if x is None else x.reshape(-1).tolist()

    bias = est["bias"].value.reshape(-1).tolist()
    auroc, n_eff = flat(est["auroc"].value), flat(est["auroc"].n_eff)
    p_bias, p_auroc = flat(adj["bias"]), flat(adj["auroc"])
    mde = flat(out["auroc_mde"])
    words = _CONTROL_WORDS[corpus]
    value = {c: flat(est[c].value) for c in controls}
    lo = {c: flat(out[f"{c}_lo"]) for c in controls}
    hi = {c: flat(out[f"{c}_hi"]) for c in controls}
    units = {c: flat(est[c].n_eff) for c in controls}
    p_control = {c: flat(adj[c]) for c in controls}
    p_lost = {c: flat(adj[f"{c}_lost"]) for c in controls}
    rho, p_rho = flat(out.get("frequency_bias_r")), flat(adj.get("frequency_bias"))
    need = flat(out["held_units_needed"])
    rows = flat(out["rows_for_target"])
    rarer = flat(out["frequency_auroc"])
    verdicts, reasons = [], []
    for h in range(len(bias)):
        control = ""
        passed = [
            c
            for c in controls
            if units[c][h] >= MIN_UNITS and value[c][h] > 0.5 and p_control[c][h] < alpha
        ]
        # the gain falls with frequency held: significantly, or the held figure's interval
        # ends below the AUROC itself (then it is not wide: "cannot tell" only where it is)
        lost = [
            c
            for c in controls
            if c not in passed
            and (p_lost[c][h] < alpha or (units[c][h] >= MIN_UNITS and hi[c][h] < auroc[h]))
        ]
        if not n_eff[h] >= MIN_UNITS:
            verdict = f"{VERDICTS['too_few']} (n_eff = {n_eff[h]:.3g} < {MIN_UNITS:g})"
        elif not (bias[h] > 0 and auroc[h] > 0.5 and p_bias[h] < alpha and p_auroc[h] < alpha):
            verdict = f"{VERDICTS['no_scan']} ({_power_seen(mde[h], rows[h])})"
        elif len(passed) == len(controls):
            verdict = VERDICTS["scans"]
            control = "held AUROC (" + ", ".join(words[c] for c in controls) + ")"
        elif rho[h] > 0 and p_rho[h] < alpha and rarer[h] < 0.5:
            # the signature opposes a preference for rare tokens, which is what a gain of
            # distinct tokens could be only where they are the rarer (frequency_auroc < 0.5)
            verdict = VERDICTS["scans"]
            control = (
                f"frequency bias (r {rho[h]:.3g}, p = {p_rho[h]:.3g}: the more"
                " frequent distinct tokens gain more, not a rarity preference)"
            )
        elif lost and not passed:
            c = lost[0]
            verdict = (
                f"{VERDICTS['not_beyond']} (with {words[c]} held alike the gain falls from"
                f" AUROC {auroc[h]:.3g} to {value[c][h]:.3g} [{lo[c][h]:.3g}, {hi[c][h]:.3g}]"
                + (f", p = {p_lost[c][h]:.3g})" if p_lost[c][h] < alpha else ")")
            )
        else:
            side = "rarer" if rarer[h] < 0.5 else "more frequent"
            shown = [
                f"{words[c]} held: {value[c][h]:.3g} [{lo[c][h]:.3g}, {hi[c][h]:.3g}]"
                if units[c][h] >= MIN_UNITS
                else f"{words[c]} held: {too_few(units[c][h])}"
                for c in controls
                if c not in passed
            ]
            settle = (
                f"; about {need[h]:,.0f} effective units would settle it"
                if need[h] == need[h]
                else ""
            )
            bias_seen = f" (r {rho[h]:.3g}, p = {p_rho[h]:.3g})" if p_rho[h] == p_rho[h] else ""
            signature = (
                ", or the frequency bias among distinct tokens" + bias_seen + " on more of them"
                if rarer[h] < 0.5
                else "; the distinct tokens are the more frequent, so the frequency bias"
                " among them" + bias_seen + " cannot tell scanning from a preference"
                " for frequent tokens"
            )
            verdict = (
                f"{VERDICTS['cannot_tell']} (scans, or prefers {side} tokens: AUROC with "
                + "; with ".join(shown)
                + settle
                + signature
                + ")"
            )
        verdicts.append(verdict)
        reasons.append(control)
    return verdicts, reasons
