"""Figures and views.

- `figures`: static matplotlib figures (saved as PNG): the scan (logit change of distinct vs
  common tokens), frequency bias and entropy over steps with snap markers, the Fig. 4 heat map
  of per-token attention, attention maps of a prompt (Fig. 7), theory curves (Fig. 3), the
  growth factor against Theorem 3's bounds, the fit to the population dynamics, the lab.
- `views`: circuitsvis views (rendered inline in a notebook, saved as offline HTML): the
  prompt's attention across checkpoints, its tokens coloured by class and by the attention a
  query pays them.
"""

from .figures import (
    plot_attention_heatmap,
    plot_attention_maps,
    plot_class_attention,
    plot_entropy_sweep,
    plot_growth_bounds,
    plot_growth_factor,
    plot_head_grid,
    plot_logit_change,
    plot_loss,
    plot_over_steps,
    plot_theory_fit,
)
from .views import View, attention_over_checkpoints, page, query_attention, token_classes

__all__ = [
    "View",
    "attention_over_checkpoints",
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
    "plot_over_steps",
    "plot_theory_fit",
    "query_attention",
    "token_classes",
]
