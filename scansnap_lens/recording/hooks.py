"""Record a checkpoint's attention aggregates with two hooks per layer.

For every watched layer the recorder hooks ``blocks.{L}.attn.hook_attn_scores`` (scores S) and
``blocks.{L}.attn.hook_pattern`` (weights A) and adds, on the fly, what each aggregate of the
table `aggregates.AGGREGATES` gathers into its sums: the plan aggregates read the (query,
context) position pairs the `RecordPlan` tracks (one gather per hook for all of them), the
position aggregates the positions they list.  No activation cache is built and the forward
pass stops after the last watched layer, so memory does not grow with the text.

Context positions come from the causal structure (T - W <= t < T with the plan's window W,
or every t < T without one; minus BOS, plus T if ``include_self``), never from testing scores
for -inf: masked scores are -inf on
HookedTransformer and the dtype's minimum on TransformerBridge.  Where a bridge fires
``hook_attn_scores`` with the softmax pattern, scores are rebuilt from ``hook_q``/``hook_k``
(whether it does is probed once per run, `RunState`).  Where a bridge's attention allows it
(joint-QKV or native; on a GPU for rows of 1024 positions or more), a layer runs fused
attention instead and the same reads come from q, k and each row's log-sum-exp
(`recording.fused`): no hook fires there.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch
from einops import rearrange
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens.recording.aggregates import (
    AGGREGATES,
    Aggregate,
    CheckpointRecord,
    Gathered,
    resolve,
)
from scansnap_lens.recording.fused import FusedReads, MaskCheck, fusable_layers, fused_attention
from scansnap_lens.recording.plan import RecordPlan, find_sorted
from scansnap_lens.recording.settings import LOSS_ON
from scansnap_lens.statistics.corpus import rows_fingerprint

if TYPE_CHECKING:
    from scansnap_lens.models.backend import HookedModel

__all__ = ["RunState", "model_vocab_size", "prompt_attention", "record_checkpoint", "watched"]


def model_vocab_size(model: HookedModel) -> int:
    return int(model.cfg.d_vocab)


def _attn_scale(model, layer: int) -> float:
    cfg = model.cfg
    if not getattr(cfg, "use_attn_scale", True):
        scale = 1.0
    else:
        scale = float(getattr(cfg, "attn_scale", -1.0) or -1.0)
        if scale <= 0:
            scale = math.sqrt(cfg.d_head)
    if getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
        scale *= layer + 1
    return scale


class _Lookup:
    """Slot of (row, col) among sorted keys row * V + col; -1 where absent.

    A dense [rows, V] table when it is small (one memory read per lookup), else a binary
    search in the sorted keys.
    """

    DENSE_LIMIT = 1 << 22  # entries: a 16 MB int32 table at most

    def __init__(self, row: Tensor, col: Tensor, rows: int, V: int):
        self.V = V
        keys = row * V + col
        if rows * V <= self.DENSE_LIMIT:
            self.table = torch.full((rows * V,), -1, dtype=torch.int32)
            self.table[keys] = torch.arange(keys.numel(), dtype=torch.int32)
            self.keys = None
        else:
            self.table = None
            self.keys = keys

    def __call__(self, row: Tensor, col: Tensor) -> Tensor:
        key = row * self.V + col
        return self.table[key].long() if self.table is not None else find_sorted(self.keys, key)


def _to_device(t: Tensor, device) -> Tensor:
    """Host tensor `t` on `device`; to a GPU pinned and asynchronous, so the host goes on
    (a copy from pageable memory waits for the device's queue)."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _to_host(t: Tensor) -> Tensor:
    """A contiguous host copy of `t`; from a GPU into pinned memory without waiting (the
    caller synchronises once, after all of them)."""
    if t.device.type != "cuda":
        return t.contiguous()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


def _cat(tensors: list[Tensor]) -> Tensor:
    """`tensors` joined along their first axis (one alone as it is: no copy)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _index_bytes(kept) -> int:
    """The bytes of a batch's kept index tensors (views of one storage counted once)."""
    batch, positions, counts, fused = kept
    tensors = [
        *(vars(batch).values() if batch is not None else ()),
        *counts.values(),
        *(vars(fused).values() if fused is not None else ()),
        positions.reads,
        positions.slot,
        positions.tokens,
    ]
    tensors += [t for line in (fused.lines if fused is not None else ()) for t in line]
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in tensors
        if isinstance(t, Tensor)
    }
    return sum(storages.values())


@dataclass
class _Batch:
    """Index tensors of the tracked position pairs of one batch (J pairs, E events)."""

    flat: Tensor  # [J] flat index of head 0 into a [B, n_heads, T, T] tensor
    event: Tensor  # [J] event of each pair (each event's pairs one run, in event order)
    n_ctx: Tensor  # [E] the pairs of each event
    zbar_flat: Tensor | None  # [J''] `flat` at the pairs the plan holds (all J: `flat`)
    pair_slot: Tensor  # [J] zbar slot ([J''] of `zbar_pairs` where the plan samples pairs)
    zbar_pairs: Tensor | None  # [J''] the pairs the plan holds (None: every pair)
    c_hat_pairs: Tensor  # [J'] the pairs whose class is tracked
    triple_slot: Tensor  # [J'] their c_hat slot
    all_tracked: bool  # every pair's class is tracked (c_hat_pairs is everything)
    event_query: Tensor  # [E] query slot of each event
    event_class: Tensor  # [E] class slot, -1 when the class is not tracked
    tracked_events: Tensor  # [E'] the events whose class is tracked
    tracked_class: Tensor  # [E'] their class slot
    num_events: int

    def to(self, device, flat: Tensor) -> _Batch:
        """This batch (as `index` makes it) on `device`, copied without the host waiting,
        with `flat` [J] its indices there."""
        moved = {
            k: _to_device(v, device) if isinstance(v, Tensor) else v for k, v in vars(self).items()
        }
        pairs = moved["zbar_pairs"]
        return _Batch(
            **{**moved, "flat": flat, "zbar_flat": flat if pairs is None else flat[pairs]}
        )


@dataclass
class _Positions:
    """What the hook_pattern hook reads in one batch: n position aggregates' reads, then
    (where the plan's weights are read) the J tracked pairs, in one index tensor."""

    reads: Tensor  # [n + J] flat indices of head 0 into a [B, n_heads, T, T] tensor
    slot: Tensor  # [n] each position read's slot among the sums' (its aggregate's row)
    n: int
    tokens: Tensor | None = None  # [B, T] the pass's rows on the device (one copy a run)
    # the slots of every weight read (`_HookAggregator.add_weights`): (the slot tensors it
    # joins, their regions' starts, their join) once made, kept while the aggregates return
    # the same tensors into the same regions
    joined: tuple[list[Tensor], list[int], Tensor] | None = field(default=None, repr=False)
    kept: bool = False  # kept for later checkpoints (`RunState.indices`)


class _Sums:
    """Every aggregate's sums in one float32 [slot, layer, head] tensor, each aggregate a run
    of slots (`region`), so that one index_add_ adds a layer's head rows wherever they go, or,
    where `every_layer` (a GPU's passes: `_HookAggregator._read`), every layer's at once (a
    GPU's hooks are bound by how many calls they launch).  In memory it is slot-major only
    then: a CPU's scatter into a layer's strided rows took 2.4x as long.

    The scores' aggregates (`buffered`: zbar, whose changes between checkpoints are small
    differences of logits up to 100) are summed in two levels: a pass adds into a zeroed
    buffer of their slots, then into the totals, so rounding grows with the passes, not the
    positions (docs/trajectories.md).  The weights (at most 1) and entropies are added to the
    totals at once: against float64 sums at Pythia-70m's shape (slots seen up to 31,557
    times) their means moved by at most 7e-6, for no buffer of their (most) slots.
    """

    def __init__(
        self,
        sizes: dict[str, int],
        n_layers: int,
        n_heads: int,
        device,
        buffered: Sequence[str] = (),
        every_layer: bool = False,
    ):
        starts = np.cumsum([0, *sizes.values()])
        self.region = {k: (int(a), int(b)) for k, a, b in zip(sizes, starts[:-1], starts[1:])}

        def zeros(slots: int) -> Tensor:  # [slots, L, H], in memory [L, slots, H] unless
            # every layer is added at once: a CPU's scatter into a strided layer is 2.4x slower
            shape = (slots, n_layers, n_heads) if every_layer else (n_layers, slots, n_heads)
            t = torch.zeros(shape, dtype=torch.float32, device=device)
            return t if every_layer else t.transpose(0, 1)

        self.total = zeros(int(starts[-1]))
        self.buffer = {name: zeros(sizes[name]) for name in buffered}
        # the views a scatter adds into, made once (a view costs an operation each time, and a
        # GPU's hooks are bound by their operations): per aggregate and for the whole layout,
        # each layer's [slots, H] (index i), and where `every_layer` every layer's
        # [slots, L * H] (index -1)
        self.slots = {
            name: self._views(
                self.buffer[name] if name in self.buffer else self.total[a:b], every_layer
            )
            for name, (a, b) in self.region.items()
        }
        self.layout = self._views(self.total, every_layer)

    @staticmethod
    def _views(t: Tensor, every_layer: bool) -> list[Tensor]:
        layers = list(t.unbind(1))
        return [*layers, t.flatten(1)] if every_layer else layers

    def add(self, name: str, layer: int, slot: Tensor, values: Tensor) -> None:
        """Add `values` into slots `slot` [n] of aggregate `name`: [n, H] at `layer`, or
        [n, L * H] at every layer (layer -1)."""
        self.slots[name][layer].index_add_(0, slot, values)

    def add_at(self, layer: int, slot: Tensor, values: Tensor) -> None:
        """`add` into `slot` [n] of the whole layout (offsets included; the slots of
        aggregates that are not buffered)."""
        self.layout[layer].index_add_(0, slot, values)

    def flush(self) -> None:
        """Add the buffers into the totals (after each forward pass)."""
        for name, buffer in self.buffer.items():
            self.of(name).add_(buffer)
            buffer.zero_()

    def of(self, name: str) -> Tensor:
        """[slots, L, H] aggregate `name`'s totals."""
        start, stop = self.region[name]
        return self.total[start:stop]


class _HookAggregator:
    """The hooks of one pass over rows: each batch's attention scores and weights summed into
    the slots of the aggregates (`aggregates.AGGREGATES`) it records
    (`recorder.Recorder` is the public, resumable recorder).

    plan aggregates read the plan's tracked pairs (none: the pass reads positions only);
    rows: the rows of the pass (the slots of its position aggregates); positions: their
    length (on a GPU, short rows keep the eager attention: `fused.GPU_MIN_POSITIONS`).
    """

    def __init__(
        self,
        model,
        plan: RecordPlan,
        layers,
        heads,
        device,
        aggregates: Sequence[Aggregate],
        rows: int,
        state=None,
        positions: int | None = None,
    ):
        self.model, self.plan = model, plan
        self.layers, self.heads = list(layers), torch.as_tensor(list(heads))
        self.heads_on_device = self.heads.to(device)
        self.all_heads = self.heads.tolist() == list(range(int(model.cfg.n_heads)))
        self.n_heads = int(model.cfg.n_heads)
        self.device = device
        self.on_plan = [a for a in aggregates if a.axis != "rows"]
        self.on_rows = [a for a in aggregates if a.axis == "rows"]
        self.read_scores = [a for a in self.on_plan if a.reads == "scores"]
        self.read_weights = [a for a in self.on_plan if a.reads == "weights"]
        sizes = {a.name: a.slots(plan, rows) for a in aggregates}
        # position aggregates first: their regions depend only on the rows (kept indices)
        order = [*self.on_rows, *self.on_plan]
        # a GPU's passes sum every layer's reads at once (`_read`) where the plan aggregates
        # are the built-in ones (a user's gather sees [J, H], one layer's heads)
        self.can_defer = torch.device(device).type in self.DEFER_ON and all(
            a in AGGREGATES for a in self.on_plan
        )
        self.sums = _Sums(
            {a.name: sizes[a.name] for a in order},
            len(self.layers),
            len(self.heads),
            device,
            [a.name for a in self.read_scores],
            every_layer=self.can_defer,
        )
        self.row_counts = {a.name: torch.zeros(rows, dtype=torch.long) for a in self.on_rows}
        self.rows_done = 0
        self.loss_sum, self.loss_tokens = torch.zeros((), dtype=torch.float64, device=device), 0
        self.loss_last = False  # the loss on each row's final prediction only (`loss_on`)
        self.batch: _Batch | None = None
        self.positions: _Positions | None = None
        # what the checkpoints of one run share: per layer, whether hook_attn_scores carries
        # the pattern (`probe`), and each batch's index tensors (they depend on the tokens)
        self.state = RunState() if state is None else state
        self.scores_from_qk = self.state.scores_from_qk
        self.qk: dict[int, dict[str, Tensor]] = {}
        # layers up to the last watched whose attention runs fused (`recording.fused`)
        self.fused = fusable_layers(model, max(self.layers), device, positions)
        for layer in self.layers:
            if layer in self.fused:  # its scores are read from q and k, not probed
                self.scores_from_qk.setdefault(layer, False)
        self.fused_reads: FusedReads | None = None
        self.masks = MaskCheck()  # the attention masks the fused layers ran under
        self.stop_after: int | None = None  # the fused layer that ends a pass (`run_until`)
        self.defer = False
        self.reads: dict[int, list[Tensor | None]] = {}

    # the lookups index the tokens on the host (they depend on the text, not the model); made
    # where a batch's indices are not kept from an earlier checkpoint (`RunState`)
    @cached_property
    def query_slot(self) -> Tensor:
        """[V] each query token's slot, -1 for other tokens."""
        slot = torch.full((self.plan.vocab_size,), -1, dtype=torch.long)
        slot[self.plan.queries] = torch.arange(self.plan.num_queries)
        return slot

    @cached_property
    def lookups(self) -> tuple[_Lookup, _Lookup, _Lookup]:
        """The slots of (query slot, token) pairs, (query slot, next token) classes and
        (class, token) triples."""
        plan, qs, V = self.plan, self.query_slot, self.plan.vocab_size
        return (
            _Lookup(qs[plan.pair_query], plan.pair_token, plan.num_queries, V),
            _Lookup(qs[plan.class_query], plan.class_next, plan.num_queries, V),
            _Lookup(plan.triple_class, plan.triple_token, plan.num_classes, V),
        )

    # -- indices ---------------------------------------------------------------------
    def index(self, x: Tensor) -> _Batch:
        """The batch's tracked pairs, computed on the host from the tokens `x` [B, T] (host)."""
        _B, T = x.shape
        dev = x.device
        first = int(self.plan.exclude_bos)
        own = int(self.plan.include_self)
        pos = torch.arange(T, device=dev)
        qslot = self.query_slot[x]
        is_event = (qslot >= 0) & (pos >= first + 1) & (pos <= T - 2)
        b_e, t_e = torch.nonzero(is_event, as_tuple=True)
        E = b_e.numel()
        qslot_e, n_e = qslot[b_e, t_e], x[b_e, t_e + 1]
        pair_lookup, class_lookup, triple_lookup = self.lookups
        event_class = class_lookup(qslot_e, n_e)
        W = self.plan.window
        start = t_e - W if W else torch.zeros_like(t_e)
        start = start.clamp_min_(first)  # the first context position of each event
        n_ctx = t_e - start + own
        event = torch.repeat_interleave(torch.arange(E, device=dev), n_ctx)
        starts = torch.cumsum(n_ctx, 0) - n_ctx
        t = torch.arange(event.numel(), device=dev) - starts[event] + start[event]
        b, tq = b_e[event], t_e[event]
        key_l = x[b, t]
        pair_slot = pair_lookup(qslot_e[event], key_l)
        zbar_pairs = None
        if bool((pair_slot < 0).any()):
            if self.plan.common_per_query is None:  # a whole plan knows every pair
                raise ValueError(
                    "the evaluation tokens hold (query, token) pairs the plan does not know:"
                    " build the plan from the same tokens you record on"
                )
            zbar_pairs = torch.nonzero(pair_slot >= 0, as_tuple=True)[0]  # a sampled plan
            pair_slot = pair_slot[zbar_pairs]
        base = (b * self.n_heads * T + tq) * T + t
        cls_p = event_class[event]
        c_hat_pairs = torch.nonzero(cls_p >= 0, as_tuple=True)[0]
        tracked = event_class >= 0
        triple_slot = triple_lookup(cls_p[c_hat_pairs], key_l[c_hat_pairs])
        if self.plan.common_per_query is not None:  # tokens a class does not keep
            kept = triple_slot >= 0
            c_hat_pairs, triple_slot = c_hat_pairs[kept], triple_slot[kept]
        return _Batch(
            flat=base,
            n_ctx=n_ctx,
            zbar_flat=None,
            event=event,
            pair_slot=pair_slot,
            zbar_pairs=zbar_pairs,
            c_hat_pairs=c_hat_pairs,
            triple_slot=triple_slot,
            all_tracked=c_hat_pairs.numel() == cls_p.numel(),
            event_query=qslot[b_e, t_e],
            event_class=event_class,
            tracked_events=torch.nonzero(tracked, as_tuple=True)[0],
            tracked_class=event_class[tracked],
            num_events=E,
        )

    def index_positions(self, x: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The position aggregates' reads in batch `x` (host): head 0's flat indices [n],
        their slots [n] in the sums' layout, and each aggregate's query positions' rows
        (for `row_counts`)."""
        B, T = x.shape
        flats, slots, counts = [torch.zeros(0, dtype=torch.long)], [], {}
        for agg in self.on_rows:
            row, q, k = (torch.as_tensor(t).cpu().long() for t in agg.positions(x))
            if (
                agg not in AGGREGATES
                and row.numel()
                and (  # a user's: checked (one sync)
                    int(row.min()) < 0
                    or int(row.max()) >= B
                    or int(torch.minimum(q, k).min()) < 0
                    or int(torch.maximum(q, k).max()) >= T
                )
            ):
                raise ValueError(
                    f"aggregate {agg.name}: positions(x) lists positions outside the batch"
                    f" [{B}, {T}]"
                )
            queries = torch.unique(row * T + q) // T  # each query position counts once
            counts[agg.name] = queries + self.rows_done
            flats.append((row * self.n_heads * T + q) * T + k)
            slots.append(row + self.rows_done + self.sums.region[agg.name][0])
        return torch.cat(flats), torch.cat([torch.zeros(0, dtype=torch.long), *slots]), counts

    def at_heads(self, t: Tensor, flat: Tensor) -> Tensor:
        """[J, H] float32: `t` [B, n_heads, ...] (the attention's [B, n_heads, T, T]) read at
        head 0's flat indices `flat` [J] for every watched head (a strided view: the [J, H]
        indices are never made, or kept)."""
        n, per = t.shape[1], math.prod(t.shape[2:])
        t = t if t.is_contiguous() else t.contiguous()
        every = t.as_strided((t.numel() - (n - 1) * per, n), (1, per))  # [i, h]: t[i + h per]
        out = every[flat] if self.all_heads else every[flat[:, None], self.heads_on_device]
        return out if out.dtype == torch.float32 else out.float()

    # -- hooks -------------------------------------------------------------------------
    def scores_hook(self, i: int, layer: int):
        def hook(scores: Tensor, hook=None):
            if self.scores_from_qk[layer]:
                return None
            self._read(i, zbar=self.at_heads(scores, self.batch.zbar_flat))
            return None

        return hook

    def qk_hook(self, layer: int, name: str):
        def hook(act: Tensor, hook=None):
            self.qk.setdefault(layer, {})[name] = act.detach()
            return None

        return hook

    def pattern_hook(self, i: int, layer: int):
        def hook(pattern: Tensor, hook=None):
            if pattern.shape[1] != self.n_heads:
                raise RuntimeError(
                    f"layer {layer}: hook_pattern has {pattern.shape[1]} heads,"
                    f" the config says {self.n_heads}"
                )
            bt, pos = self.batch, self.positions
            if self.read_scores and self.scores_from_qk.get(layer):
                self._scores_from_qk(i, layer)
            weights = bool(self.read_weights) and bt.num_events > 0
            if not weights and pos.n == 0:
                return None
            # one gather for every read of the layer (a GPU's hooks cost what they launch)
            read = pos.reads if weights else pos.reads[: pos.n]
            gathered = self.at_heads(pattern, read)
            self._read(
                i,
                at_positions=gathered[: pos.n] if pos.n else None,
                at_plan=gathered[pos.n :] if weights else None,
            )
            return None

        return hook

    def fused_reader(self, layer: int):
        """What a fused layer calls with its q, k [B, H, T, d], row log-sum-exp [B, H, T] and
        scale: the reads the scores and pattern hooks make, from them (None: unwatched)."""
        if layer not in self.layers:
            return None
        i = self.layers.index(layer)

        def read(q: Tensor, k: Tensor, lse: Tensor, scale: float) -> None:
            bt, pos, where = self.batch, self.positions, self.fused_reads
            heads = None if self.all_heads else self.heads_on_device
            weights = bool(self.read_weights) and bt.num_events > 0
            at_positions = where.position_weights(q, k, lse, scale, heads) if pos.n else None
            zbar = at_plan = None
            if bt is not None and (self.read_scores or weights):
                scores = where.plan_scores(q, k, scale)  # the event rows' [B, H, nb, N, S + W]
                if self.read_scores:
                    zbar = self.at_heads(scores, where.plan if where.zbar is None else where.zbar)
                if weights:
                    s = self.at_heads(scores, where.plan)
                    s.sub_(self.at_heads(where.row_lse(lse), where.plan_row))
                    at_plan = s.clamp_max_(0).exp_()  # a weight <= 1, as a softmax's
            self._read(i, zbar, at_positions, at_plan)
            if layer == self.stop_after:
                raise _Enough

        return read

    def _read(
        self,
        i: int,
        zbar: Tensor | None = None,
        at_positions: Tensor | None = None,
        at_plan: Tensor | None = None,
    ) -> None:
        """What layer `i` read: the scores at the plan's pairs [J'', H], the weights at the
        position reads [n, H] and at the plan's pairs [J, H] (None: not read).  Summed at
        once, or, where the pass defers (`defer`), kept until its end and summed for every
        layer at once (a GPU's small model is bound by the calls it launches: the sums' ~15
        calls a layer become ~15 a pass)."""
        if not self.defer:
            self._sum(i, zbar, at_positions, at_plan)
            return
        kept = self.reads.setdefault(i, [None, None, None])
        for j, t in enumerate((zbar, at_positions, at_plan)):
            if t is not None:
                kept[j] = t

    def _sum_reads(self) -> None:
        """Sum the reads the pass kept (`_read`): every layer's at once where every watched
        layer read the same things, else each layer's."""
        reads, self.reads = self.reads, {}
        L = len(self.layers)
        present = {tuple(t is not None for t in r) for r in reads.values()}
        if len(reads) == L and len(present) == 1:
            parts = [[r[j] for r in (reads[i] for i in range(L))] for j in range(3)]
            # [n, H] per layer -> [n, L * H]: the layers as heads of one read
            stacked = [None if p[0] is None else torch.stack(p, 1).flatten(1) for p in parts]
            self._sum(-1, *stacked)
        else:
            for i, r in reads.items():
                self._sum(i, *r)

    def _sum(
        self, i: int, zbar: Tensor | None, at_positions: Tensor | None, at_plan: Tensor | None
    ) -> None:
        """Add layer `i`'s reads ([n, H] each; layer -1: every layer's, [n, L * H]) into the
        sums."""
        if zbar is not None:
            self._add(i, self.read_scores, Gathered(self.batch, scores=zbar))
        self._add_weights(i, at_positions, at_plan)

    def _add_weights(self, i: int, at_positions: Tensor | None, at_plan: Tensor | None) -> None:
        """Add the weights read at the batch's position reads [n, H] and at the plan's reads
        [J, H] (`_Positions`; None: not read) into the sums of layer `i` (-1: every layer,
        [n, L * H]): every weight aggregate's values by one scatter into the whole layout."""
        bt, pos = self.batch, self.positions
        slots, values = [], []
        if pos.n and at_positions is not None:
            slots.append(pos.slot)
            values.append(at_positions)
        if at_plan is not None:
            a, E, H = at_plan, bt.num_events, at_plan.shape[1]
            # each event's context weight and sum of a log a, by one scatter each: [E, H]
            den = a.new_zeros(E, H).index_add_(0, bt.event, a)
            a_log_a = a.new_zeros(E, H).index_add_(0, bt.event, torch.special.xlogy(a, a))
            # the entropy of a / den is log den - sum(a log a) / den, written (den log den -
            # sum a log a) / den so that an event whose context weights all underflow to 0
            # contributes 0 without a comparison and a select
            context = den.clamp_min(1e-30)
            ent = torch.special.xlogy(den, den).sub_(a_log_a).div_(context)
            gathered = Gathered(bt, pattern=a, context=context, entropy=ent)
            for agg in self.read_weights:
                slot, v = agg.gather(gathered)
                slots.append(slot)
                values.append(v)
        if values:
            self.sums.add_at(i, self._joined_slots(slots), _cat(values))

    def _joined_slots(self, slots: list[Tensor]) -> Tensor:
        """The slots of `_add_weights`' reads in the whole layout: [position slots, each
        weight aggregate's slots offset by its region], joined once per batch (each layer's
        hook returns the same tensors; an aggregate that makes new ones is joined anew)."""
        pos = self.positions
        regions = [self.sums.region[a.name][0] for a in self.read_weights]
        if (
            pos.joined is not None
            and pos.joined[1] == regions  # another aggregate list may lay the sums out anew
            and len(pos.joined[0]) == len(slots)
            and all(a is b for a, b in zip(pos.joined[0], slots))
        ):
            return pos.joined[2]
        first = [pos.slot] if slots and slots[0] is pos.slot else []
        joined = _cat([*first, *(s + r for s, r in zip(slots[len(first) :], regions))])
        if pos.kept and pos.joined is None:
            self.state.index_bytes += joined.numel() * joined.element_size()
        pos.joined = (slots, regions, joined)
        return joined

    def _add(self, i: int, aggregates: list[Aggregate], gathered: Gathered) -> None:
        for agg in aggregates:
            slot, values = agg.gather(gathered)
            self.sums.add(agg.name, i, slot, values)

    def _scores_from_qk(self, i: int, layer: int) -> None:
        acts = self.qk.pop(layer, {})
        if "q" not in acts or "k" not in acts:
            raise RuntimeError(
                f"layer {layer}: hook_attn_scores carries the softmax pattern and no usable"
                " hook_q/hook_k fired to rebuild the scores"
            )
        bt = self.batch
        # the batch's scores [B, n_heads, T, T] as the forward makes them (one matmul, within
        # the pass's attention bound), read at the tracked pairs as hook_attn_scores would be;
        # keys may have fewer heads (grouped-query attention), each shared by n_heads / n_kv
        # consecutive query heads.  Gathering q and k per pair instead cost [J, H, d] each.
        k = acts["k"].float()
        q = rearrange(acts["q"].float(), "b t (c g) d -> b t c g d", c=k.shape[2])
        scores = torch.einsum("bqcgd,bkcd->bcgqk", q, k).div_(_attn_scale(self.model, layer))
        scores = rearrange(scores, "b c g q k -> b (c g) q k")
        self._read(i, zbar=self.at_heads(scores, bt.zbar_flat))  # [J'', H]

    def hooks(self) -> list[tuple[str, object]]:
        hooks = []
        for i, layer in enumerate(self.layers):
            if layer in self.fused:  # read by `fused_reader`
                continue
            if self.read_scores:
                hooks.append((f"blocks.{layer}.attn.hook_attn_scores", self.scores_hook(i, layer)))
                if self.scores_from_qk.get(layer):
                    q_name, k_name = _qk_hook_names(self.model, layer)
                    hooks.append((q_name, self.qk_hook(layer, "q")))
                    hooks.append((k_name, self.qk_hook(layer, "k")))
            hooks.append((f"blocks.{layer}.attn.hook_pattern", self.pattern_hook(i, layer)))
        return hooks

    def probe(self, x: Tensor) -> None:
        """Find out, per layer, whether hook_attn_scores carries scores or the pattern (once
        per run: the checkpoints of a run share their architecture)."""

        def probe_hook(layer):
            def hook(scores: Tensor, hook=None):
                self.scores_from_qk[layer] = _looks_like_pattern(scores)

            return hook

        hooks = [(f"blocks.{L}.attn.hook_attn_scores", probe_hook(L)) for L in self.layers]
        run_until(self.model, x, max(self.layers), hooks)

    # The most (query, context) position pairs one forward pass aggregates, and the most
    # bytes of one [rows, heads, T, T] attention tensor of it: a batch over either runs as
    # several forward passes of fewer rows, so that neither the recorder's [J, H] tensors
    # nor the model's own attention tensors (several alive at once in a bridge's forward)
    # grow with T^2 past these (8 rows of 2048 tokens and 12 heads would make 1.6 GB each).
    MAX_PAIRS = 1 << 21
    MAX_ATTENTION_BYTES = 1 << 29
    # the devices whose passes sum their reads at their end, and the most bytes of reads one
    # pass keeps to do so (`_read`)
    DEFER_ON = ("cuda",)
    DEFER_BYTES = 1 << 28

    def pairs_per_row(self, x: Tensor) -> Tensor:
        """[B] the tracked position pairs of each row (what `index` would gather)."""
        if not self.on_plan:
            return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        T = x.shape[1]
        first, own, W = int(self.plan.exclude_bos), int(self.plan.include_self), self.plan.window
        pos = torch.arange(T, device=x.device)
        start = (pos - W).clamp_min(first) if W else torch.full_like(pos, first)
        n_ctx = pos - start + own  # [T]
        is_event = (self.query_slot[x] >= 0) & (pos >= first + 1) & (pos <= T - 2)
        return (is_event * n_ctx).sum(1)

    def run_batch(self, x: Tensor) -> None:
        """Aggregate evaluation batch `x` [B, T], the next-token loss of its rows among the
        first `loss_rows` as well (`_loss_rows_alone`)."""
        need = max(0, loss_rows(x.shape[1]) - self.rows_done)
        if 0 < need < x.shape[0] and _loss_rows_alone(self.device, need, x.shape[0]):
            self.run(x[:need], loss_rows=need)
            self.run(x[need:])
        else:
            self.run(x, loss_rows=need)

    def run(self, x: Tensor, loss_rows: int = 0) -> None:
        """Aggregate the rows `x` [B, T] (on the host: they are indexed there, and only the
        indices and the tokens go to the device, so the host never waits for it); where the
        first `loss_rows` rows are in a pass, it runs to the unembedding and their next-token
        loss is summed as well."""
        x = x.cpu()
        if self.read_scores and len(self.scores_from_qk) < len(self.layers):
            self.probe(x[:1].to(self.device))
        key = (bool(self.on_plan), _digest(x))
        pairs = self.state.pairs.get(key)
        if pairs is None:
            pairs = self.state.pairs[key] = torch.cumsum(self.pairs_per_row(x), 0)
        per_row = 4 * self.n_heads * x.shape[1] ** 2  # bytes of one row's float32 attention
        most_rows = max(1, self.MAX_ATTENTION_BYTES // per_row)
        if loss_rows and torch.device(self.device).type == "cpu":  # a GPU: a pass, launches
            logits = 4 * x.shape[1] * model_vocab_size(self.model)  # bytes of a row's logits
            most_rows = min(most_rows, max(1, LOSS_LOGITS_BYTES // logits))
        with fused_attention(self.model, self.fused, self.fused_reader, self.masks):
            self._run_parts(x, pairs, most_rows, loss_rows)

    def _run_parts(self, x: Tensor, pairs: Tensor, most_rows: int, loss_rows: int) -> None:
        start = 0
        while start < x.shape[0]:  # rows [start, stop) within both bounds (one at least)
            before = int(pairs[start - 1]) if start else 0
            stop = int(torch.searchsorted(pairs, before + self.MAX_PAIRS, right=True))
            stop = min(max(stop, start + 1), start + most_rows)
            part = x[start:stop]
            self.batch, self.positions, self.fused_reads = self._indices(part)
            read = (int(pairs[stop - 1]) - before + self.positions.n) * len(self.layers)
            self.defer = self.can_defer and read * len(self.heads) * 4 <= self.DEFER_BYTES
            self.reads = {}
            with_loss = min(stop, loss_rows) - start  # of this pass's rows
            self.stop_after = None if with_loss > 0 else max(self.layers)
            on_device = self.positions.tokens
            if with_loss > 0:  # the whole forward, to the unembedding: its loss per next token
                logits = self.model.run_with_hooks(
                    on_device, return_type="logits", fwd_hooks=self.hooks()
                )
                per_token = next_token_loss(logits[:with_loss], on_device[:with_loss])
                if self.loss_last:  # the training's loss is on each row's final prediction
                    per_token = per_token[:, -1:]
                self.loss_sum += per_token.double().sum()
                self.loss_tokens += per_token.numel()
            else:
                run_until(self.model, on_device, max(self.layers), self.hooks())
            self._sum_reads()
            self.sums.flush()
            self.batch, self.positions, self.fused_reads = None, None, None
            self.qk.clear()
            self.rows_done += part.shape[0]
            start = stop

    # The most bytes of index tensors a run keeps between its checkpoints (each batch's are
    # the same at every checkpoint); batches past it are indexed again at each.
    KEEP_INDEX_BYTES = 1 << 30

    def _indices(self, part: Tensor) -> tuple[_Batch | None, _Positions, FusedReads | None]:
        """`part`'s index tensors on the device: made on the host, or kept from an earlier
        checkpoint of the run (`RunState.indices`)."""
        fused = any(layer in self.fused for layer in self.layers)
        key = (
            bool(self.on_plan),
            fused,
            tuple(a.name for a in self.on_rows),
            self.rows_done,
            tuple(self.sums.region[a.name] for a in self.on_rows),
            _digest(part),
        )
        kept = self.state.indices.get(key)
        if kept is None:
            batch = self.index(part) if self.on_plan else None
            flat, slot, counts = self.index_positions(part)
            n = flat.numel()
            if batch is not None:
                flat = torch.cat([flat, batch.flat])
            where = None
            if fused:
                where = FusedReads.of(
                    flat,
                    n,
                    None if batch is None else batch.zbar_pairs,
                    part.shape[0],
                    self.n_heads,
                    part.shape[1],
                    self.plan.window,
                )
                where = where.to(self.device, _to_device)
            reads = _to_device(flat, self.device)  # head 0's: each hook reads every head's
            if batch is not None:
                batch = batch.to(self.device, reads[n:])
            positions = _Positions(
                reads, _to_device(slot, self.device), n, _to_device(part, self.device)
            )
            kept = (batch, positions, counts, where)
            size = _index_bytes(kept)
            if self.state.keep_indices and self.state.index_bytes + size <= self.KEEP_INDEX_BYTES:
                self.state.indices[key] = kept
                self.state.index_bytes += size
                kept[1].kept = True
        batch, positions, counts, where = kept
        for name, rows in counts.items():
            self.row_counts[name].index_add_(0, rows, torch.ones_like(rows))
        return batch, positions, where

    def mean_loss(self) -> float | None:
        """The mean next-token loss of the rows run with ``loss`` (one read from the device)."""
        return float(self.loss_sum) / self.loss_tokens if self.loss_tokens else None

    def means(self) -> dict[str, Tensor]:
        """{name: [L, H, slots]} float32 on the host: each slot's sum over its count (the
        plan's for plan aggregates, each row's query positions for position aggregates; NaN
        for a row with none)."""
        out = {}
        for agg in [*self.on_plan, *self.on_rows]:
            count = self._count(agg)
            avg = self.sums.of(agg.name).to(count.dtype) / count
            out[agg.name] = _to_host(rearrange(avg, "s l h -> l h s").float())  # [L, H, slot]
        if torch.device(self.device).type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # once: the copies landed
        self.masks.verify()  # the host waited already
        return out

    def _count(self, agg: Aggregate) -> Tensor:
        """[slots, 1, 1] on the device: what `agg`'s sums divide by (a plan slot never seen
        by 1, its sum being 0; a row without reads by 0, its mean NaN), made once per run
        (`RunState.counts`: a GPU checkpoint's host time is mostly its launches, and these
        are counted and copied on the host)."""
        rows = agg.axis == "rows"
        key = (agg.name, _digest(self.row_counts[agg.name]) if rows else id(self.plan))
        kept = self.state.counts.get(key)
        if kept is not None and kept[0] is (None if rows else self.plan):
            return kept[1]
        count = self.row_counts[agg.name] if rows else agg.count(self.plan)
        # counts below 2^24 are exact in float32, whose one correctly rounded division
        # then equals the float64 one's to an ulp, without a float64 copy of the sums
        exact = count.numel() == 0 or int(count.max()) < 1 << 24
        count = count.to(torch.float32 if exact else torch.float64)
        count = _to_device(count if rows else count.clamp_min(1), self.device)[:, None, None]
        self.state.counts[key] = (None if rows else self.plan, count)
        return count


class _Enough(Exception):
    """Raised by the last hook a recording needs, so that the forward pass goes no further."""


# the evaluation tokens whose next-token loss each checkpoint records, in the first rows that
# hold them: the whole forward pass runs for those rows, to the unembedding, which the other
# rows skip (with Pythia's 50k-token vocabulary a row's unembedding costs more than the body:
# 16 loss rows of 64 made the recording 1.45x the forward instead of 1.12x)
LOSS_TOKENS = 2048


def next_token_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """[B, T - 1] each next token's cross-entropy, from `logits` [B, T, V] of `tokens` [B, T]:
    log-sum-exp minus the next token's logit, a few positions at a time.  A log-softmax, or
    a log-sum-exp of the whole, writes a [B, T, V] temporary (at Pythia's vocabulary 100 MB
    a row of 512), on pages the allocator takes afresh each time on a CPU (a GPU's allocator
    keeps its memory, and there each step costs a launch: one step)."""
    logits = logits[:, :-1].detach()
    B, T, V = logits.shape
    picked = logits.gather(-1, tokens[:, 1:, None]).squeeze(-1).float()
    if logits.device.type != "cpu":
        return torch.logsumexp(logits.float(), -1).sub_(picked)
    per = max(1, LOSS_CHUNK_BYTES // (4 * V))  # positions at a time
    lse = torch.cat(
        [
            torch.logsumexp(row[start : start + per].float(), -1)
            for row in logits
            for start in range(0, T, per)
        ]
    )
    return lse.view(B, T).sub_(picked)


# The bytes of logits one step of `next_token_loss` reads (small enough to stay on the heap)
LOSS_CHUNK_BYTES = 8 << 20
# The most bytes of float32 logits one pass of loss rows makes on a CPU (one row at least):
# at Pythia's vocabulary a row of 512 makes 103 MB, and 4 rows in one pass raised the
# recorder's peak at 70m's shape from 393 to 698 MB above its model, no faster; a smaller
# vocabulary's rows share passes (docs/scale.md)
LOSS_LOGITS_BYTES = 1 << 24


def loss_rows(seq_len: int) -> int:
    """How many first rows of `seq_len` tokens the loss is recorded on: enough to hold
    `LOSS_TOKENS` tokens, one at least (none where `LOSS_TOKENS` is 0)."""
    return 0 if LOSS_TOKENS <= 0 else max(1, -(-LOSS_TOKENS // max(seq_len, 1)))


@contextlib.contextmanager
def evaluating(model: HookedModel):
    """`model` in eval mode inside; after, each module that was training trains again.

    Only a model with a module in training mode (a bridge's wrapped model counted) is
    switched: a bridge's ``eval()`` walks its whole module tree, which takes longer than a
    small model's forward pass on a GPU, and a checkpoint is recorded with several."""
    roots = [model, getattr(model, "original_model", None)]
    training = [
        m for r in roots if isinstance(r, torch.nn.Module) for m in r.modules() if m.training
    ]
    if training:
        model.eval()
    try:
        yield model
    finally:
        for module in training:
            module.training = True


def _loss_rows_alone(device, rows: int, batch: int) -> bool:
    """Whether the first `rows` of a batch of `batch`, whose loss is recorded, run in a pass
    of their own: where compute costs (the CPU: a row's unembedding costs more than its
    body), or where the rest of their batch outnumbers them; else (a GPU, where a pass costs
    its launches and a few rows' unembedding little) their whole batch runs to the
    unembedding (docs/scale.md)."""
    return torch.device(device).type == "cpu" or batch > 2 * rows


def run_until(model: HookedModel, x: Tensor, last_layer: int, hooks: list) -> None:
    """Run `model` on `x` with `hooks` and stop once the attention scores and pattern of
    `last_layer` have both fired (after the hooks given for them).

    ``stop_at_layer`` alone is not enough: a TransformerBridge stops only *before* a block,
    so at its last block it runs the MLP, the final norm and the unembedding, which with a
    large vocabulary is most of a small model's forward pass.  Bridges also fire the scores
    and pattern hooks in either order, after ``hook_attn_out`` on some architectures.
    """
    names = [f"blocks.{last_layer}.attn.hook_attn_scores", f"blocks.{last_layer}.attn.hook_pattern"]
    fired: set[str] = set()

    def stop(name: str):
        def hook(tensor: Tensor, hook=None):
            fired.add(name)
            if len(fired) == len(names):
                raise _Enough

        return hook

    stops = [(name, stop(name)) for name in names]
    try:
        model.run_with_hooks(
            x, return_type=None, stop_at_layer=last_layer + 1, fwd_hooks=[*hooks, *stops]
        )
    except _Enough:
        pass


def _looks_like_pattern(scores: Tensor) -> bool:
    """True when a hook_attn_scores tensor holds softmax weights instead of masked scores."""
    if scores.shape[-1] < 2:
        raise ValueError("evaluation rows need at least 2 positions")
    future = torch.triu(torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device), 1)
    # Real causal scores are masked far below zero above the diagonal; a pattern holds 0 there.
    if not bool((scores[..., future] == 0).all()):
        return False
    rows = scores.double().sum(-1)
    return bool(((rows - 1).abs() < 1e-3).all()) and bool((scores >= 0).all())


def _qk_hook_names(model, layer: int) -> tuple[str, str]:
    names = set(model.hook_dict)
    prefix = f"blocks.{layer}.attn."
    if prefix + "hook_rot_q" in names and prefix + "hook_rot_k" in names:
        return prefix + "hook_rot_q", prefix + "hook_rot_k"
    if getattr(model.cfg, "positional_embedding_type", "standard") == "rotary":
        raise RuntimeError(
            f"layer {layer}: hook_attn_scores carries the softmax pattern, and this rotary model"
            " exposes no rotated hook_rot_q/hook_rot_k to rebuild the scores from"
        )
    return prefix + "hook_q", prefix + "hook_k"


def _batches(tokens, batch_size: int) -> Iterable[Tensor]:
    if isinstance(tokens, Tensor):
        for start in range(0, tokens.shape[0], batch_size):
            yield tokens[start : start + batch_size]
        return
    for batch in tokens:
        batch = torch.as_tensor(batch)
        yield batch if batch.ndim == 2 else batch[None]


def check_tokens(x: Tensor, vocab_size: int) -> None:
    if x.ndim != 2:
        raise ValueError(f"evaluation batches must be [batch, seq], got {tuple(x.shape)}")
    if x.dtype.is_floating_point or x.dtype == torch.bool:
        raise ValueError(f"token ids must be integers, got {x.dtype}")
    if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}) for this model (d_vocab = {vocab_size});"
            f" the evaluation tokens hold ids from {int(x.min())} to {int(x.max())}"
        )


def watched(model, layers=None, heads=None) -> tuple[list[int], list[int]]:
    """The layers and heads to watch (default: all of `model`'s), checked against the model."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    layers = list(range(n_layers)) if layers is None else [int(v) for v in layers]
    heads = list(range(n_heads)) if heads is None else [int(v) for v in heads]
    for name, values, n in (("layer", layers, n_layers), ("head", heads, n_heads)):
        if len(set(values)) < len(values):
            raise ValueError(f"{name}s {values} repeat a {name}: give each once ({name}s=)")
        bad = [v for v in values if not 0 <= v < n]
        if bad or not values:
            raise ValueError(
                f"{name}s {bad or values} out of range: the model has {n} {name}s, 0 to {n - 1}"
                " (layers=, heads=)"
            )
    return layers, heads


@dataclass
class RunState:
    """What the checkpoints of one run share, decided at its first checkpoint and kept: per
    layer whether ``hook_attn_scores`` carries the pattern (the probe), each position
    aggregate's rows (the evaluation rows, or its own: `Aggregate.own_rows`).  A `Recorder`
    keeps one; `record_checkpoint` without one decides anew."""

    scores_from_qk: dict[int, bool] = field(default_factory=dict)
    rows: dict[str, tuple[Tensor | None, str]] = field(default_factory=dict)
    indices: dict = field(default_factory=dict, repr=False)  # each batch's, on the device
    index_bytes: int = 0
    pairs: dict = field(default_factory=dict, repr=False)  # each batch's [B] cumulative pairs
    keep_indices: bool = True  # False: no later checkpoint will reuse them (a one-off call)
    counts: dict = field(default_factory=dict, repr=False)  # each aggregate's, on the device

    def __getstate__(self) -> dict:
        # sent to other processes (Ray) without the index tensors, which may be on a GPU
        return {**self.__dict__, "indices": {}, "index_bytes": 0, "pairs": {}, "counts": {}}


def _digest(x: Tensor) -> bytes:
    """A 16-byte digest of host tensor `x`'s values (a batch's tokens: what its indices are
    kept under)."""
    return hashlib.blake2b(x.numpy().tobytes(), digest_size=16).digest()


def row_sources(
    aggregates: Sequence[Aggregate], tokens, vocab_size: int, state: RunState | None = None
) -> dict[str, tuple[Tensor | None, str]]:
    """{name: (own rows [R, T'] or None for the evaluation rows, words)} of the position
    aggregates, kept in `state`."""
    state = RunState() if state is None else state
    missing = [a for a in aggregates if a.axis == "rows" and a.name not in state.rows]
    if missing:
        rows = tokens if isinstance(tokens, Tensor) else torch.cat(list(_batches(tokens, 1 << 30)))
        for agg in missing:
            own = None if agg.own_rows is None else agg.own_rows(rows.cpu(), vocab_size)
            state.rows[agg.name] = (None, "evaluation rows") if own is None else own
    return {a.name: state.rows[a.name] for a in aggregates if a.axis == "rows"}


def count_rows(tokens) -> int:
    """N, the evaluation rows of `tokens` ([N, T] or [B, T] batches)."""
    if isinstance(tokens, Tensor):
        return int(tokens.shape[0])
    return sum(
        int(torch.as_tensor(b).reshape(-1, torch.as_tensor(b).shape[-1]).shape[0]) for b in tokens
    )


def _warn_broken(model, step: int) -> None:
    """Warn where the weights hold NaN or inf (a diverged run: its attention is what it is,
    but the user should know); one fused norm over all weights, the names only then."""
    params = [p for p in model.parameters() if p.numel()]  # under no_grad: no detach
    if not params:
        return
    # one stack of the norms (it promotes mixed dtypes): a call per weight would cost a GPU
    # checkpoint a launch per weight
    if bool(torch.stack(torch._foreach_norm(params, math.inf)).isfinite().all()):
        return
    broken = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if broken:
        warnings.warn(
            f"checkpoint at step {step}: {len(broken)} weight tensors hold NaN or inf"
            f" ({', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}); its attention"
            " is recorded as the model computes it",
            RuntimeWarning,
            stacklevel=3,
        )


@torch.no_grad()
def record_checkpoint(
    model: HookedModel,
    tokens: Tensor | Iterable,
    plan: RecordPlan,
    step: int = 0,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    progress: bool = True,
    prompt: Tensor | None = None,
    on_batch=None,
    aggregates: Sequence[Aggregate | str] | None = None,
    state: RunState | None = None,
    loss_on: str = "all",
) -> CheckpointRecord:
    """Run the evaluation tokens through `model` and record its attention's aggregates.

    tokens: [N, T] ids (or an iterable of [B, T] batches) -- the tokens the plan was built on.
    layers, heads: what to watch (default: all).  Returns means as float32, [L, H, slots]
    per aggregate (`aggregates.AGGREGATES`; default `aggregates.DEFAULT`).
    prompt: [T'] ids of an example whose full attention weights are kept as well.
    on_batch: called after each batch with (batches done, batches in all or None, seconds).
    state: what a run's checkpoints share (`RunState`), decided once and kept in it (without
    one, a one-off call: each batch's indices are not kept past it).
    loss_on: the positions the loss averages over, as the training optimizes them ("all", or
    "last": each row's final prediction; `settings.RecordingSettings.loss_on`).
    """
    if loss_on not in LOSS_ON:
        raise ValueError(f"loss_on must be one of {LOSS_ON}, got {loss_on!r}")
    vocab = model_vocab_size(model)
    if plan.vocab_size != vocab:
        raise ValueError(
            f"vocabulary mismatch: the plan was built for {plan.vocab_size} tokens and the"
            f" model has d_vocab = {vocab}"
        )
    aggregates = resolve(aggregates)
    unusable = [a.name for a in aggregates if not a.recordable]
    if unusable:
        raise ValueError(f"aggregates {unusable} were read from a folder: pass their definitions")
    _warn_broken(model, step)
    layers, heads = watched(model, layers, heads)
    if device is None:
        device = next(model.parameters()).device
    state = RunState(keep_indices=False) if state is None else state
    batches = list(_batches(tokens, batch_size))
    sources = row_sources(aggregates, batches, vocab, state)
    own = [a for a in aggregates if a.axis == "rows" and sources[a.name][0] is not None]
    main = [a for a in aggregates if a not in own]
    rows = sum(x.shape[0] for x in batches)
    positions = max((x.shape[1] for x in batches), default=None)
    aggregator = _HookAggregator(model, plan, layers, heads, device, main, rows, state, positions)
    aggregator.loss_last = loss_on == "last"
    fingerprint = 0
    start = time.perf_counter()
    values = {}
    with evaluating(model):
        for done, x in enumerate(
            tqdm(
                batches, desc=f"record step {step}", unit="batch", disable=not progress, leave=False
            ),
            1,
        ):
            check_tokens(x, vocab)
            fingerprint = (
                fingerprint + rows_fingerprint(list(x.cpu().numpy().astype(np.int64)))
            ) & ((1 << 64) - 1)
            aggregator.run_batch(x)
            if on_batch is not None:
                on_batch(done, len(batches), time.perf_counter() - start)
        if fingerprint != plan.fingerprint:
            raise ValueError(
                "these evaluation tokens are not the ones the plan was built from"
                " (fingerprints differ): build the plan with plan_recording(tokens, ...)"
            )
        values.update(aggregator.means())
        for agg in own:  # an aggregate that reads rows of its own: one pass over them
            values.update(
                _own_rows_means(
                    model, plan, layers, heads, device, agg, sources[agg.name][0], batch_size, state
                )
            )
    return CheckpointRecord(
        step=int(step),
        values={a.name: values[a.name] for a in aggregates},
        prompt_pattern=None if prompt is None else prompt_attention(model, prompt, layers, heads),
        loss=aggregator.mean_loss(),
        loss_on=loss_on,
    )


def _own_rows_means(model, plan, layers, heads, device, agg, rows, batch_size, state):
    """{name: [L, H, R]} of a position aggregate over rows of its own [R, T']."""
    check_tokens(rows, model_vocab_size(model))
    extra = _HookAggregator(
        model, plan, layers, heads, device, [agg], rows.shape[0], state, rows.shape[1]
    )
    for x in rows.split(batch_size):
        extra.run(x)
    return extra.means()


@torch.no_grad()
def prompt_attention(
    model: HookedModel, prompt: Tensor, layers: Sequence[int], heads: Sequence[int]
) -> Tensor:
    """Attention weights [L, H, T, T] (float32, CPU) of one prompt [T] on the given layers and
    heads: the maps of Fig. 7 and of the circuitsvis views."""
    prompt = torch.as_tensor(prompt).reshape(1, -1)
    check_tokens(prompt, model_vocab_size(model))
    device = next(model.parameters()).device
    kept: dict[int, Tensor] = {}
    heads_idx = torch.as_tensor(list(heads))

    def keep(layer: int):
        def hook(pattern: Tensor, hook=None):
            kept[layer] = pattern[0, heads_idx.to(pattern.device)].float().cpu()

        return hook

    hooks = [(f"blocks.{layer}.attn.hook_pattern", keep(layer)) for layer in layers]
    with evaluating(model):
        run_until(model, prompt.to(device), max(layers), hooks)
    return torch.stack([kept[layer] for layer in layers])
