"""The paper's synthetic laboratory (Sec. 8, App. G), and runs whose truth is known
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "calibration experiments synthetic yz")
