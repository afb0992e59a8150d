"""The learning rates a trajectory was trained with, and the theory's snap at those rates.

The theory holds for gradient flow at eta_Y (``lr_y``) and eta_Z (``lr_z``); `effective_rate`
turns an optimizer's nominal rate into the plain-SGD rate it amounts to.
"""

from __future__ import annotations

import math
import re
import warnings

from scansnap_lens.models.training import Rates
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.theory.transition import PhaseTransition

__all__ = [
    "effective_rate",
    "known_rates",
    "predicted_snap",
    "theory_limits",
    "theory_of",
    "training_of",
]


def effective_rate(lr: float, optimizer: str = "sgd", momentum: float = 0.0) -> float | None:
    """The plain-SGD rate that an optimizer's steps amount to, or None where there is none.

    SGD with momentum beta moves, once its velocity has built up (after about 1 / (1 - beta)
    steps), by lr / (1 - beta) times the gradient per step.  Adam's step is normalised by
    the gradient's running scale, so no plain-SGD rate corresponds to it and the theory
    (derived for gradient flow) gives no prediction.

    >>> effective_rate(0.5, "sgd", 0.75)
    2.0
    >>> effective_rate(0.1, "adam") is None
    True
    """
    if optimizer == "adam":
        return None
    if optimizer != "sgd":
        raise ValueError(f"unknown optimizer {optimizer!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must lie in [0, 1), got {momentum}")
    return float(lr) / (1.0 - float(momentum))


def training_of(traj: Trajectory, training: Rates | dict | None = None) -> list[dict] | None:
    """How each head was trained, as the training wrote it: per head a dict with the nominal
    ``lr_y``, ``lr_z``, ``optimizer`` and ``momentum``; None where the trajectory does not say.
    `training` (``lr_y`` and ``lr_z``, optionally ``optimizer``, ``momentum``) overrides it.

    The trajectory's meta holds what the training wrote (`train`, `Recorder.on_checkpoint(...,
    training=)`, ``training.json`` beside checkpoints); the Y/Z lab holds ``lr_z`` and
    ``ratio`` per run (one head per run).
    """
    if training is not None:
        rates = training if isinstance(training, Rates) else Rates.of_meta(training)
        return [rates.to_dict()] * len(traj.heads)
    meta = traj.meta
    optimizer = meta.get("optimizer", "sgd")
    momentum = float(meta.get("momentum", 0.0))
    if "lr_z" in meta and "ratio" in meta and isinstance(meta["lr_z"], list):  # the lab
        pairs = [(z * r, z) for z, r in zip(meta["lr_z"], meta["ratio"])]
        pairs = [pairs[h] for h in traj.heads]
    elif "lr_y" in meta and "lr_z" in meta:
        return [Rates.of_meta(meta, "the trajectory's meta").to_dict()] * len(traj.heads)
    else:
        typed = sorted(k for k in meta if re.match(r"(lr|eta|learning_rate)", k, re.IGNORECASE))
        if typed:  # rates under other names would silently give no prediction
            warnings.warn(
                f"the trajectory's meta holds {typed} but not lr_y and lr_z (the paper's eta_Y,"
                " eta_Z), so the theory gives no prediction: record with those keys, or pass"
                " training={'lr_y': ..., 'lr_z': ...} (lr_y=, lr_z=)",
                stacklevel=3,
            )
        return None
    return [{"lr_y": y, "lr_z": z, "optimizer": optimizer, "momentum": momentum} for y, z in pairs]


def known_rates(
    traj: Trajectory, training: dict | None = None
) -> list[tuple[float, float] | None] | None:
    """Effective (eta_Y, eta_Z) per head (`effective_rate` of `training_of`), None for a head
    trained with Adam or with a rate of 0, or None where the trajectory does not say how it
    was trained."""
    settings = training_of(traj, training)
    if settings is None:
        return None
    out = []
    for t in settings:
        y = effective_rate(t["lr_y"], t["optimizer"], t["momentum"])
        z = effective_rate(t["lr_z"], t["optimizer"], t["momentum"])
        frozen = y is not None and z is not None and min(y, z) <= 0  # no transition to time
        out.append(None if y is None or z is None or frozen else (y, z))
    return out


def theory_of(traj: Trajectory, training: dict | None = None) -> list | None:
    """A `theory.PhaseTransition` per head (None for a head with no effective rate) where the
    training is known (`known_rates`); K is the number of next tokens and M the vocabulary."""
    rates = known_rates(traj, training)
    if rates is None:
        return None
    K = int(traj.plan.class_next.unique().numel())
    M = traj.plan.vocab_size
    return [None if r is None else PhaseTransition(K=K, M=M, lr_y=r[0], lr_z=r[1]) for r in rates]


def predicted_snap(traj: Trajectory, training: dict | None = None) -> list[float] | None:
    """The theory's transition t0 = 2 (1 + delta') K ln M / eta_Y (Sec. 6) per head at the
    effective rates (`known_rates`); NaN for a head trained with Adam."""
    theories = theory_of(traj, training)
    return None if theories is None else [math.nan if t is None else t.t0 for t in theories]


def theory_limits(traj: Trajectory, training: dict | None = None) -> list[str]:
    """What the theory can and cannot say of this training, in sentences for the report: the
    theory is gradient flow at constant rates eta_Y, eta_Z from a zero start."""
    settings = training_of(traj, training) if training is not None or traj.meta else None
    if not settings:
        return [
            "The training's rates are not known: no predicted snap and no population"
            " dynamics (give them: lr_y=, lr_z=, optimizer=)."
        ]
    said = []
    if any(s["optimizer"] == "adam" for s in settings):
        said.append(
            "Adam normalises its steps, so no plain-SGD rate corresponds to them: the theory's"
            " t0 (predicted_snap) is not defined; the population dynamics run with Adam itself"
            " (population_snap, rank_agreement, dz_corr)."
        )
    schedule = traj.meta.get("lr_schedule") if training is None else None
    rates = [r for _, r in schedule] if isinstance(schedule, list) else []
    if (rates and max(rates) > 1.05 * min(rates)) or (
        isinstance(schedule, str) and not schedule.startswith("constant")
    ):
        said.append(
            "The training changed its rate (warmup and decay); the theory and the population"
            " dynamics take one constant rate, the peak: their times are those of a"
            " constant-rate run, an order of magnitude to compare with, not this run's steps."
        )
    source = str(traj.meta.get("training_from", ""))
    if "assumed" in source:
        said.append(f"How it was trained comes from {source}.")
    return said
