"""circuitsvis views of a trajectory: one function per view, each returning a `View`.

A `View` renders inline in a notebook (through circuitsvis itself), saves to an HTML file
that works offline (``view.save("attention.html")``), and goes into a report where the
circuitsvis script is loaded once for the whole page (`page`).

>>> view = View("ColoredTokens", {"tokens": ["a", "b"], "values": [0.5, 1.0]}, "demo")
>>> "CircuitsVis.ColoredTokens" in view.fragment("v0")
True
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from scansnap_lens._io import make_folder, write_text
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.groups import TokenGroups
from scansnap_lens.statistics.kinds import TokenKind
from scansnap_lens.viz import _palette as palette

__all__ = [
    "View",
    "attention_over_checkpoints",
    "default_position",
    "kinds_view",
    "page",
    "prompt_pattern",
    "query_attention",
    "run_views",
    "spread_steps",
]

# The colour scale of `kinds_view` runs from common (-1) to distinct (+1): each
# `TokenKind`'s place on it (the labels themselves are the kinds').
SCALE = {TokenKind.DISTINCT: 1.0, TokenKind.COMMON: -1.0, TokenKind.UNDETERMINED: 0.0}
DISTINCT_CODE, COMMON_CODE = SCALE[TokenKind.DISTINCT], SCALE[TokenKind.COMMON]
OTHER_CODE = SCALE[TokenKind.UNDETERMINED]


@dataclass
class View:
    """A circuitsvis element (e.g. ``"AttentionHeads"``) with its props."""

    element: str
    props: dict = field(default_factory=dict)
    title: str = ""

    def rendered(self):
        """circuitsvis's own `RenderedHTML` of this view."""
        from circuitsvis.utils.render import render

        return render(self.element, **self.props)

    def _repr_html_(self) -> str:
        return self.rendered()._repr_html_()

    def props_json(self) -> str:
        """The props as a JavaScript literal that is safe inside a <script> element.

        ``<``, ``>`` and ``&`` occur only inside string literals there, so writing them as
        ``\\u003c`` etc. changes no value, and no ``</script>`` or ``<!--`` can end or
        blank the script.
        """
        from circuitsvis.utils.convert_props import convert_props

        literal = convert_props(self.props)
        for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
            literal = literal.replace(char, escaped)
        return literal

    def fragment(self, div_id: str) -> str:
        """HTML of this view for a page that has loaded the circuitsvis script (see `page`)."""
        return (
            f'<div id="{div_id}" class="circuitsvis-view"></div>\n'
            f"<script>CircuitsVis.render({json.dumps(div_id)}, CircuitsVis.{self.element},"
            f" {self.props_json()});</script>"
        )

    def save(self, path: str | Path) -> Path:
        """A standalone HTML page of this view (the script inlined: it works offline)."""
        path = Path(path)
        make_folder(path.parent)
        body = f"<h2>{html.escape(self.title)}</h2>\n" if self.title else ""
        write_text(path, page(self.title or self.element, body + self.fragment("view-0")))
        return path


def circuitsvis_script() -> str:
    """The circuitsvis browser bundle (about 1.3 MB) in a <script> element."""
    from importlib.resources import files

    source = files("circuitsvis").joinpath("dist/cdn/iife.js").read_text(encoding="utf-8")
    return "<script>" + source.replace("</script>", "<\\/script>") + "</script>"


def page(title: str, body: str, head: str = "", script: bool = True) -> str:
    """A whole HTML page: the circuitsvis script once in <head> (unless not `script`: a page
    without views), then `body` (fragments)."""
    scripts = circuitsvis_script() if script else ""
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>\n{head}\n{scripts}\n</head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


# ------------------------------------------------------------------ views
def _prompt(traj: Trajectory) -> Tensor:
    if traj.prompt is None or traj.prompt_pattern is None:
        raise ValueError(
            "this trajectory holds no example prompt: record it with Recorder(..., prompt=ids)"
            " (by default the first evaluation sequence is kept)"
        )
    return traj.prompt


# Inserted after "<" and "&": the word joiner (U+2060) is invisible, and an HTML parser reads
# "<" or "&" followed by it as the character itself, never as a tag or an entity.
JOINER = "\u2060"


def safe_token(token: str) -> str:
    """A token string that shows as itself both where circuitsvis inserts it as raw HTML and
    where React or a chart shows it as text: an invisible word joiner follows each "<" and
    "&", so no tag or entity can start (quotes and ">" are harmless outside attributes).

    >>> safe_token("'s") == "'s", safe_token("<b>&amp;") == "<\u2060b>&\u2060amp;"
    (True, True)
    """
    return token.replace("&", "&" + JOINER).replace("<", "<" + JOINER)


def _strings(traj: Trajectory, ids: Tensor, token_strings: Sequence[str] | None) -> list[str]:
    """Token strings for circuitsvis (`safe_token`): they come from any tokenizer or a shared
    trajectory folder."""
    if token_strings is not None:
        if len(token_strings) != ids.numel():
            raise ValueError(
                f"token_strings has {len(token_strings)} entries for a prompt of {ids.numel()}"
            )
        strings = [str(t) for t in token_strings]
    else:
        strings = [traj.plan.decode(t) for t in ids.tolist()]
    return [safe_token(t) for t in strings]


def spread_steps(traj: Trajectory, steps=None, most: int = 8) -> list[int]:
    """`steps` checked against the trajectory, or by default up to `most` of its steps spread
    evenly over its checkpoints (log-spaced checkpoints stay log-spaced)."""
    if steps is not None:
        steps = [int(s) for s in steps]
        missing = [s for s in steps if s not in traj.steps.tolist()]
        if missing:
            raise KeyError(f"steps {missing} are not in this trajectory ({traj.steps.tolist()})")
        return steps
    index = np.unique(np.linspace(0, traj.num_steps - 1, min(most, traj.num_steps)).round())
    return [int(traj.steps[int(i)]) for i in index]


def prompt_pattern(traj: Trajectory, step: int, layer: int, head: int) -> Tensor:
    """[T, T] attention weights of the example prompt at one checkpoint, layer and head."""
    _prompt(traj)
    s = traj.steps.tolist().index(step)
    return traj.prompt_pattern[s, traj.layers.index(layer), traj.heads.index(head)]


def attention_over_checkpoints(
    traj: Trajectory,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
    token_strings: Sequence[str] | None = None,
) -> View:
    """The example prompt's attention pattern at several checkpoints (circuitsvis
    ``attention_heads``: one panel per checkpoint and head, labelled by step, the last
    checkpoint first: the view opens on its first panel, and at step 0 attention is uniform).

    layer: default the first recorded; heads: default all recorded; steps: default up to 8
    spread over the trajectory.
    """
    prompt = _prompt(traj)
    layer = traj.layers[0] if layer is None else layer
    heads = list(traj.heads) if heads is None else list(heads)
    steps = spread_steps(traj, steps)
    panels, names = [], []
    for head in heads:
        for step in reversed(steps):
            panels.append(prompt_pattern(traj, step, layer, head))
            names.append(f"step {step}" if len(heads) == 1 else f"H{head} step {step}")
    return View(
        "AttentionHeads",
        {
            "attention": torch.stack(panels),
            "tokens": _strings(traj, prompt, token_strings),
            "attentionHeadNames": names,
            "maskUpperTri": True,
        },
        f"Attention of the example prompt over training (layer {layer}; each panel a"
        " checkpoint, the last first: circuitsvis's selector calls them heads)",
    )


def _class_codes(prompt: Tensor, position: int, groups: TokenGroups) -> Tensor:
    """+1 / -1 / 0 for each context token of the query at `position`: distinct for the class
    (query, next token), common for the query, neither."""
    m = int(prompt[position])
    n = int(prompt[position + 1]) if position + 1 < prompt.numel() else None
    codes = torch.full((position + 1,), OTHER_CODE)
    common = groups.common.get(m, torch.empty(0, dtype=torch.long))
    codes[torch.isin(prompt[: position + 1], common)] = COMMON_CODE
    distinct = torch.empty(0, dtype=torch.long)
    for k in groups.classes_of(m):  # the query's classes, not every class
        if int(groups.next_token[k]) == n:
            distinct = groups.distinct[k]
    codes[torch.isin(prompt[: position + 1], distinct)] = DISTINCT_CODE
    codes[position] = OTHER_CODE  # the query itself
    return codes


def default_position(traj: Trajectory, groups: TokenGroups) -> int:
    """The prompt position that shows the scan best: of those whose (token, next token) is a
    class of `groups`, the one whose context holds the most distinct tokens of the class and
    at least one common token (the last on a tie; one with nothing to compare would show
    nothing), else the last such position, else the last holding one of its queries."""
    prompt = _prompt(traj)
    keys = set(zip(groups.query.tolist(), groups.next_token.tolist()))
    pairs = list(zip(prompt[:-1].tolist(), prompt[1:].tolist()))
    candidates = [p for p in range(len(pairs)) if pairs[p] in keys]
    shown = []
    for p in candidates:
        codes = _class_codes(prompt, p, groups)
        if bool((codes == COMMON_CODE).any()):
            shown.append((int((codes == DISTINCT_CODE).sum()), p))
    if shown and max(shown)[0] > 0:
        return max(shown)[1]
    if candidates:
        return candidates[-1]
    for p in range(len(pairs) - 1, -1, -1):
        if pairs[p] in keys:
            return p
    queries = set(groups.query.tolist())
    for p in range(prompt.numel() - 1, -1, -1):
        if int(prompt[p]) in queries:
            return p
    raise ValueError("the example prompt holds none of the queries of these token groups")


def kinds_view(
    traj: Trajectory,
    groups: TokenGroups,
    position: int | None = None,
    token_strings: Sequence[str] | None = None,
) -> View:
    """The prompt up to the query at `position`, coloured by kind (circuitsvis
    ``colored_tokens``): +1 distinct for (query, next token), -1 common, 0 neither."""
    prompt = _prompt(traj)
    position = default_position(traj, groups) if position is None else position
    codes = _class_codes(prompt, position, groups)
    strings = _strings(traj, prompt, token_strings)
    return View(
        "ColoredTokens",
        {
            "tokens": strings[: position + 1],
            "values": codes,
            "minValue": -1.0,
            "maxValue": 1.0,
            "positiveColor": palette.DISTINCT,
            "negativeColor": palette.COMMON,
        },
        f"Token classes for query {strings[position].replace(JOINER, '')!r} at position {position}:"
        f" {palette.DISTINCT} distinct, {palette.COMMON} common",
    )


def query_attention(
    traj: Trajectory,
    groups: TokenGroups,
    position: int | None = None,
    layer: int | None = None,
    head: int | None = None,
    steps: Sequence[int] | None = None,
    token_strings: Sequence[str] | None = None,
) -> View:
    """The attention the query at `position` pays each earlier token, at several checkpoints,
    beside the token kinds (circuitsvis ``colored_tokens_multi``: pick a column to colour)."""
    prompt = _prompt(traj)
    position = default_position(traj, groups) if position is None else position
    layer = traj.layers[0] if layer is None else layer
    head = traj.heads[0] if head is None else head
    steps = spread_steps(traj, steps)
    codes = _class_codes(prompt, position, groups)
    columns = [codes] + [
        prompt_pattern(traj, s, layer, head)[position, : position + 1] for s in steps
    ]
    strings = _strings(traj, prompt, token_strings)
    return View(
        "ColoredTokensMulti",
        {
            "tokens": strings[: position + 1],
            "values": torch.stack(columns, -1),
            "labels": [f"class (+1 distinct: {palette.DISTINCT}, -1 common: {palette.COMMON})"]
            + [f"attention @ {s}" for s in steps],
        },
        f"Attention of query {strings[position].replace(JOINER, '')!r} (position {position},"
        f" layer {layer}, head {head}) over training",
    )


def run_views(
    traj: Trajectory,
    groups: TokenGroups | None,
    layer: int,
    head: int,
    token_strings: Sequence[str] | None = None,
) -> tuple[str, dict[str, str]]:
    """A run's views of its example prompt as a report shows them, in one HTML fragment:
    `layer`, `head`'s attention over checkpoints, then the token kinds and the query's
    attention where there are `groups`; and {view: why it is not there}."""
    if traj.prompt_pattern is None:
        return "", {"views": "the trajectory holds no example prompt"}
    made = [attention_over_checkpoints(traj, layer, [head], token_strings=token_strings)]
    missing = {}
    if groups is None:
        missing["token views"] = "they colour token kinds, which need token groups"
    else:
        try:
            made.append(kinds_view(traj, groups, token_strings=token_strings))
            made.append(
                query_attention(traj, groups, layer=layer, head=head, token_strings=token_strings)
            )
        except ValueError as err:
            missing["token views"] = str(err)
    fragments = [
        f"<h3>{html.escape(view.title)}</h3>\n{view.fragment(f'view-{i}')}"
        for i, view in enumerate(made)
    ]
    return "\n".join(fragments), missing
