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

from scansnap_lens.viz.figures import (
    plot_attention_heatmap,
    plot_attention_maps,
    plot_class_attention,
    plot_entropy_sweep,
    plot_growth_bounds,
    plot_growth_factor,
    plot_head_grid,
    plot_logit_change,
    plot_loss,
    plot_loss_with_steps,
    plot_over_steps,
    plot_runs,
    plot_runs_maps,
    plot_theory_fit,
)
from scansnap_lens.viz.views import (
    View,
    attention_over_checkpoints,
    kinds_view,
    page,
    query_attention,
)


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

__all__ = [
    "View",
    "attention_over_checkpoints",
    "kinds_view",
    "page",
    "plot_attention_heatmap",
    "plot_attention_maps",
    "plot_class_attention",
    "plot_entropy_sweep",
    "plot_growth_bounds",
    "plot_growth_factor",
    "plot_head_grid",
    "plot_logit_change",
    "plot_loss",
    "plot_loss_with_steps",
    "plot_over_steps",
    "plot_runs",
    "plot_runs_maps",
    "plot_theory_fit",
    "query_attention",
]
