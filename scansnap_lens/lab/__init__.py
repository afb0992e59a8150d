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

_NAMES = {
    "FIG11_THRESHOLD_FACTORS": "experiments",
    "FIG6_LR_Z": "experiments",
    "FIG6_NUM_LAST": "experiments",
    "FIG6_RATIO": "experiments",
    "LabTraining": "experiments",
    "SCENARIOS": "calibration",
    "Scenario": "calibration",
    "SequenceClasses": "synthetic",
    "YZRun": "yz",
    "CorpusScenario": "calibration",
    "corpus_run": "calibration",
    "corpus_text": "calibration",
    "crossed_run": "calibration",
    "distinct_entropy": "experiments",
    "distinct_recall": "experiments",
    "effect_for_auroc": "calibration",
    "head_type_run": "calibration",
    "head_type_truth": "calibration",
    "HEAD_TYPE_SCENARIOS": "calibration",
    "entropy_sweep": "experiments",
    "per_token_attention": "yz",
    "recall_sweep": "experiments",
    "sample_attention_output": "yz",
    "sequence_classes": "synthetic",
    "sequence_sampler": "synthetic",
    "summarize_sweep": "experiments",
    "syn_medium": "synthetic",
    "syn_small": "synthetic",
    "syn_small_experiment": "experiments",
    "train_yz": "yz",
    "yz_loss": "yz",
}
_MODULES = {"calibration", "experiments", "synthetic", "yz"}

__all__ = sorted(set(_NAMES) | _MODULES)
__getattr__, __dir__ = exports(__name__, _NAMES, _MODULES)
