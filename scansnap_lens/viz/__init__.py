"""Figures (PNG files) and circuitsvis views
(its modules, one concept each: docs/architecture.md).
"""

from scansnap_lens._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, "figures views")


def _show_figures_inline() -> None:
    """In IPython, display the figures these functions return as PNG: they are plain
    ``matplotlib.figure.Figure`` objects (no pyplot state), which a fresh kernel would print as
    '<Figure size ...>' until pyplot's inline backend is loaded."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "display_formatter"):
        select_figure_formats(shell, {"png"})


_show_figures_inline()
