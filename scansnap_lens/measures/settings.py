"""How a trajectory is measured: `AnalysisSettings`, the one value the measurements read
their settings from (`summary.measure_all`, `summary.summarize`) and that
`reading.analysis.Analysis` measures with and saves beside its tables; the command line's
options are made from it (as `recording.settings` for recording), without importing the
measurements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor

from scansnap_lens._settings import Settings, count_or_all, nonnegative, setting
from scansnap_lens.statistics.groups import Classification
from scansnap_lens.theory.population import THEORY_CLASSES, THEORY_SECONDS

if TYPE_CHECKING:  # the models' stage loads its libraries: read once a value needs it
    from scansnap_lens.models.training import Rates

__all__ = ["AnalysisSettings"]

THEORY = "the theory fit"


@dataclass(frozen=True)
class AnalysisSettings(Settings):
    """How a trajectory is read.  classification: how the statistics' tokens get their kinds
    (used where `Analysis.of` forms the token groups itself); training: the training's
    `Rates` (a dict of them is read as one; `rates.training_of`), for the theory's
    prediction; theory: False leaves out the theory fit (the population dynamics);
    theory_classes, theory_seconds: the classes it integrates and the seconds it takes at
    most (`fit.theory_fit`; the positions its loss averages are the training's own, from the
    trajectory's meta); prediction: the theory's snap step (one value, or one per head;
    default `rates.predicted_snap`); leave_out: names of measurements not made."""

    classification: Classification = field(default_factory=Classification)
    training: Rates | None = None
    theory: bool = setting(
        True,
        THEORY,
        "leave out the theory fit (the paper's population dynamics on the"
        " statistics, on theory_classes= classes; made by default)",
    )
    theory_classes: int | None = setting(
        THEORY_CLASSES,
        THEORY,
        "the theory fit's classes: those with two distinct tokens"
        " first, then the most frequent (its time grows faster than the classes; all: every"
        " recorded class)",
        reads=count_or_all(2, all=None),
    )
    theory_seconds: float | None = setting(
        THEORY_SECONDS,
        THEORY,
        "the theory fit's seconds at most: fewer classes where"
        " theory_classes= would take longer (timed before it starts; 0: no limit)",
        reads=nonnegative,
    )
    prediction: float | tuple[float, ...] | None = None
    leave_out: tuple[str, ...] = ()

    def __post_init__(self):
        from scansnap_lens.models.training import Rates

        if isinstance(self.training, dict):  # as a user writes it: {"lr_y": ..., "lr_z": ...}
            object.__setattr__(self, "training", Rates.from_dict(self.training))
        if self.training is not None and not isinstance(self.training, Rates):
            raise ValueError(f"training must be Rates or None, got {self.training!r}")
        if isinstance(self.prediction, list | tuple | np.ndarray | Tensor):
            object.__setattr__(self, "prediction", tuple(float(p) for p in self.prediction))
        elif self.prediction is not None:
            object.__setattr__(self, "prediction", float(self.prediction))
        object.__setattr__(self, "leave_out", tuple(self.leave_out))
        if self.theory_classes is not None and self.theory_classes < 1:
            raise ValueError(f"theory_classes must be >= 1 or None, got {self.theory_classes}")
        if self.theory_seconds is not None and not self.theory_seconds >= 0:
            raise ValueError(
                f"theory_seconds must be >= 0 (0: no limit), got {self.theory_seconds}"
            )
