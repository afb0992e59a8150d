"""Figures and views.

- `figures`: static matplotlib figures (saved as PNG): the scan (logit change of distinct vs
  common tokens), frequency bias and entropy over steps with snap markers, the Fig. 4 heat map
  of per-token attention, attention maps of a prompt (Fig. 7), theory curves (Fig. 3), the
  growth factor against Theorem 3's bounds, the fit to the population dynamics, the lab,
  several runs side by side (`plot_runs`, `plot_runs_maps`).
- `views`: circuitsvis views (rendered inline in a notebook, saved as offline HTML): the
  prompt's attention across checkpoints, its tokens coloured by kind and by the attention a
  query pays them.
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
