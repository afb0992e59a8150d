"""One colour per token kind in every figure and view (the paper's Fig. 2 draws distinct tokens
in blue).  circuitsvis colours positive values blue and negative ones red by default, and its
``colored_tokens_multi`` cannot be told otherwise, so these are those colours, by name (CSS and
matplotlib read them the same)."""

__all__ = ["COMMON", "DISTINCT"]

DISTINCT = "blue"
COMMON = "red"
