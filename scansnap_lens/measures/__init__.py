"""Measurements of scan and snap (docs/glossary.md), one module per quantity of the paper
(its modules, one concept each: docs/architecture.md).

Every function takes a `Trajectory` and, where the quantity compares token kinds,
`TokenGroups`, and returns a `Measurement`: a table with ``to_dataframe()`` and its values as
``[step, layer, head]`` tensors.  What the measurements say is `reading`; where to record
next, `planning`.
"""

from scansnap_lens._lazy import exports

_MODULES = """catalog discriminative entropy fit frequency growth head_types matching measurement
rates resampling settings snap summary uncertainty"""
__all__, __getattr__, __dir__ = exports(__name__, _MODULES)
