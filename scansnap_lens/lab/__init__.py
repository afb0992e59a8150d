"""The paper's synthetic laboratory (Sec. 8, App. G).

- `synthetic`: sequence classes with known distinct and common tokens (Syn-Small,
  Syn-Medium) and a sampler of training rows;
- `yz`: the Y/Z model of Lemma 1 and its trainer;
- `experiments`: Figs. 4-6 and 11-12 as library calls;
- `calibration`: trajectories whose truth is known, shaped like real text (or counted from a
  corpus whose truth is known), that the scan's intervals, p-values and verdict are checked
  against.
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "calibration experiments synthetic yz")
