"""Fused attention while recording (`recording.fused`): a bridge's joint-QKV attention runs
the flash kernel and the recorder reads scores and weights from q, k and the row
log-sum-exp; every aggregate equals the eager path's and the brute-force reference's, and
whatever the fused path cannot honour keeps the eager one."""

from __future__ import annotations

import pytest
import torch
from _hub import bridge_from_hf, tiny_hf_model
from _reference import assert_matches, brute_force
from _tiny import V as TINY_V
from _tiny import tiny_model

from scansnap_lens.recording import fused, hooks
from scansnap_lens.recording.aggregates import DEFAULT, Aggregate, earlier_copies
from scansnap_lens.recording.hooks import record_checkpoint
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import TokenGroups

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

V = 24
ARCHS = ["gpt2", "gpt_neox"]  # joint QKV, and joint QKV with (partial) rotary
COPIES = Aggregate("copies", axis="rows", positions=earlier_copies, doc="earlier copies")


def _bridge(arch: str, n_layers: int = 2, n_heads: int = 4):
    hf = tiny_hf_model(arch, vocab_size=V, n_ctx=32, d_model=32, n_layers=n_layers,
                       n_heads=n_heads)  # fmt: skip
    with torch.no_grad():  # peaked attention, where a renormalisation slip would show
        for name, p in hf.named_parameters():
            if "attn" in name or "attention" in name:
                p.mul_(3)
    return bridge_from_hf(hf, arch)


def _tokens(rows: int = 6, length: int = 17, seed: int = 0):
    return torch.randint(0, V, (rows, length), generator=torch.Generator().manual_seed(seed))


class _Count:
    """Counts the eager `_reconstruct_attention` calls of a model's attention classes (the
    counting method replaces the class's, so `fusable_layers` knows it as the eager one)."""

    def __init__(self, model, monkeypatch):
        self.calls = 0
        for cls in {type(b.attn) for b in model.blocks}:
            eager = cls._reconstruct_attention

            def counted(attn, *a, _eager=eager, **k):
                self.calls += 1
                return _eager(attn, *a, **k)

            monkeypatch.setattr(cls, "_reconstruct_attention", counted)


def _record(model, tokens, plan, enabled, monkeypatch, **kw):
    monkeypatch.setattr(fused, "ENABLED", enabled)
    return record_checkpoint(model, tokens, plan, progress=False, **kw)


def _assert_same(a, b, tol):
    """Every aggregate of two recordings equal to float32 rounding: each is within the
    brute-force tolerance `tol` of the exact value (`float32_tolerance`), so of each other
    within twice that."""
    assert a.values.keys() == b.values.keys()
    for name in a.values:
        bound = 2 * tol["zbar" if name == "zbar" else "entropy" if "entropy" in name else "c_hat"]
        x, y = a.values[name], b.values[name]
        assert torch.equal(x.isnan(), y.isnan()), name
        diff = (x - y).nan_to_num().abs().max().item()
        assert diff <= bound, (name, diff, bound)
    assert abs(a.loss - b.loss) <= 1e-5 * max(1.0, abs(a.loss))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("exclude_bos", "include_self", "window"),
                         [(False, False, None), (True, True, None), (True, False, 3)])  # fmt: skip
def test_fused_recording_equals_eager_and_brute_force(arch, exclude_bos, include_self, window,
                                                      monkeypatch):  # fmt: skip
    model = _bridge(arch)
    tokens = _tokens()
    plan = plan_recording(tokens, V, exclude_bos=exclude_bos, include_self=include_self,
                          window=window)  # fmt: skip
    monkeypatch.setattr(hooks, "LOSS_TOKENS", 30)  # two loss rows, in a pass of their own
    monkeypatch.setattr(fused.FusedReads, "MIN_BLOCK", 4)  # a window's rows in blocks
    aggregates = [*DEFAULT, COPIES]
    count = _Count(model, monkeypatch)
    on = _record(model, tokens, plan, True, monkeypatch, batch_size=4, aggregates=aggregates)
    assert count.calls == 0  # every layer fused, the loss rows' pass too
    off = _record(model, tokens, plan, False, monkeypatch, batch_size=4, aggregates=aggregates)
    assert count.calls > 0
    ref = brute_force(model, tokens, exclude_bos, include_self, window=window)
    _assert_same(on, off, ref[-1])
    assert_matches(on, plan, ref, range(2), range(4))
    assert "_reconstruct_attention" not in vars(model.blocks[0].attn)  # the eager one back


@pytest.mark.parametrize("positional", ["standard", "rotary"])
def test_the_native_bridge_records_fused_as_eager(positional, monkeypatch):
    """The native bridge's attention (what `build_model` makes as a bridge): every aggregate
    fused equals the brute-force reference and the eager path's."""
    model = tiny_model(positional=positional, backend="bridge")
    assert set(fused.fusable_layers(model, 1, "cpu").values()) == {"native"}
    tokens = torch.randint(0, TINY_V, (5, 13), generator=torch.Generator().manual_seed(2))
    plan = plan_recording(tokens, TINY_V, window=4)
    monkeypatch.setattr(fused.FusedReads, "MIN_BLOCK", 4)
    on = _record(model, tokens, plan, True, monkeypatch, batch_size=2)
    ref = brute_force(model, tokens, window=4)
    assert_matches(on, plan, ref, range(2), range(3))
    if positional == "standard":  # rotary: the eager path finds no rotated q, k to rebuild
        off = _record(model, tokens, plan, False, monkeypatch, batch_size=2)  # scores from
        _assert_same(on, off, ref[-1])
    assert "forward" not in vars(model.blocks[0].attn.original_component)


@pytest.mark.parametrize("arch", ARCHS)
def test_watched_heads_layers_and_a_sampled_plan_read_the_same_slots(arch, monkeypatch):
    """Some heads of the first layer only (the forward stops there), and a plan made for power
    (a sample of each query's common tokens: the plan's reads are a subset of the pairs)."""
    model = _bridge(arch, n_layers=3)
    tokens = _tokens(rows=8, length=20, seed=1)
    stats = cooccurrence(tokens, V, window=6)
    groups = TokenGroups.from_statistics(stats, guard=False, purity=0.5)
    plan = plan_recording(tokens, V, window=6, groups=groups, max_slots=10**6,
                          common_per_query=2, classes_per_query=1)  # fmt: skip
    assert plan.common_per_query == 2
    kw = dict(layers=[0, 1], heads=[1, 3], batch_size=3)
    monkeypatch.setattr(fused.FusedReads, "MIN_BLOCK", 4)  # blocks of 6 rows and 12 keys
    on = _record(model, tokens, plan, True, monkeypatch, **kw)
    off = _record(model, tokens, plan, False, monkeypatch, **kw)
    _assert_same(on, off, brute_force(model, tokens, window=6)[-1])
    assert on.zbar.shape[:2] == (2, 2)


def test_a_users_hook_on_the_pattern_keeps_that_layer_eager(monkeypatch):
    """A hook someone left on a layer's hook_pattern still sees every batch's pattern: that
    layer runs eagerly (the others fused), and the recording is the same."""
    model = _bridge("gpt_neox")
    tokens = _tokens()
    plan = plan_recording(tokens, V)
    seen = []
    model.blocks[1].attn.hook_pattern.add_hook(lambda t, hook: seen.append(t.shape[0]))
    assert fused.fusable_layers(model, 1, "cpu") == {0: "joint_rotary"}
    count = _Count(model, monkeypatch)
    on = _record(model, tokens, plan, True, monkeypatch, batch_size=3)
    # layer 1 in every pass; both layers in the one-row probe of layer 1's scores hook
    assert seen[0] == 1 and count.calls == len(seen) + 1
    model.reset_hooks()
    off = _record(model, tokens, plan, False, monkeypatch, batch_size=3)
    _assert_same(on, off, brute_force(model, tokens)[-1])


def test_what_the_fused_path_cannot_honour_stays_eager():
    neox = _bridge("gpt_neox")
    assert fused.fusable_layers(neox, 1, "cpu") == {0: "joint_rotary", 1: "joint_rotary"}
    assert fused.fusable_layers(neox, 0, "cpu") == {0: "joint_rotary"}  # to the last watched
    assert fused.fusable_layers(neox, 1, "cuda") == {0: "joint_rotary", 1: "joint_rotary"}
    assert fused.fusable_layers(neox, 1, "mps") == {}  # no kernel known to give log-sum-exp
    assert fused.fusable_layers(neox, 1, "cuda", positions=512) == {}  # launches bind there
    assert fused.fusable_layers(neox, 1, "cpu", positions=512) == {0: "joint_rotary",
                                                                   1: "joint_rotary"}  # fmt: skip
    assert fused.fusable_layers(_bridge("gpt2"), 1, "cpu") == {0: "joint", 1: "joint"}
    assert fused.fusable_layers(tiny_model(n_key_value_heads=1, backend="bridge"), 1, "cpu") == {}
    neox.cfg.use_attn_result = True  # per-head results: the eager path computes them
    assert fused.fusable_layers(neox, 1, "cpu") == {}
    # masks: the causal one only (no padding, no additive bias)
    T = 5
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    additive = torch.zeros(2, 1, T, T).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert fused._causal_only(None, T) and fused._causal_only(additive, T)
    assert fused._causal_only(causal.expand(2, 1, T, T), T)
    assert fused._causal_only(torch.ones(2, T, dtype=torch.bool), T)
    padded = torch.ones(2, T, dtype=torch.bool)
    padded[1, 0] = False
    assert not fused._causal_only(padded, T)
    assert not fused._causal_only(torch.ones(2, T), T)  # the eager path adds it to the scores
    biased = additive.clone()
    biased[..., 3, 1] = -0.5  # ALiBi-like
    assert not fused._causal_only(biased, T)
    assert not fused._causal_only(additive[..., :4], T)
    check = fused.MaskCheck()  # on a GPU, a pass's flag read later, where the host waits
    check.pending += [torch.tensor(True), torch.tensor(False)]
    with pytest.raises(RuntimeError, match="other than the causal one"):
        check.verify()
    check.verify()  # each flag read once


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's kernels")
@pytest.mark.parametrize("arch", [*ARCHS, "native"])
@pytest.mark.parametrize("fused_on", [True, False], ids=["fused", "eager"])
def test_a_gpu_recording_equals_eager_on_the_cpu(arch, fused_on, monkeypatch):
    """The GPU's kernels (memory-efficient attention for float32, or the eager attention)
    with the reads on the GPU, each pass's sums made once for every layer at its end: every
    aggregate equals the CPU's eager recording and the brute-force reference."""
    model = tiny_model(backend="bridge") if arch == "native" else _bridge(arch)
    tokens = _tokens(rows=6, length=24) % TINY_V if arch == "native" else _tokens(length=24)
    plan = plan_recording(tokens, TINY_V if arch == "native" else V, window=9)
    monkeypatch.setattr(hooks, "LOSS_TOKENS", 60)
    monkeypatch.setattr(fused.FusedReads, "MIN_BLOCK", 8)
    monkeypatch.setattr(fused, "GPU_MIN_POSITIONS", 16)  # these rows of 24 too
    ref = brute_force(model, tokens, window=9)
    off = _record(model, tokens, plan, False, monkeypatch, batch_size=4)
    model.to("cuda")
    summed, original = [], hooks._HookAggregator._sum

    def spy(self, i, *reads):
        summed.append(i)
        return original(self, i, *reads)

    monkeypatch.setattr(hooks._HookAggregator, "_sum", spy)
    on = _record(model, tokens, plan, fused_on, monkeypatch, batch_size=4, device="cuda")
    assert bool(fused.fusable_layers(model, 1, "cuda")) == fused_on and set(summed) == {-1}
    model.to("cpu")
    _assert_same(on, off, ref[-1])
    assert_matches(on, plan, ref, range(2), range(model.cfg.n_heads))


def _causal_attention(B: int, H: int, T: int, d: int, scale: float, seed: int):
    """Random q, k [B, H, T, d] and their causal scores, row log-sum-exp and weights."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, T, d, generator=g), torch.randn(B, H, T, d, generator=g)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(
        torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))  # fmt: skip
    return q, k, scores, scores.logsumexp(-1), scores.softmax(-1)


@pytest.mark.parametrize("window", [None, 3])
def test_fused_reads_are_the_scores_and_weights_at_the_reads(window, monkeypatch):
    """The plan's reads re-indexed into blocks of event rows (of 4 query positions against
    their 4 + window keys, or one block of all keys) read the scores q.k * scale and weights
    softmax of the full [B, H, T, T]; position reads the weights, 0 above the diagonal."""
    monkeypatch.setattr(fused.FusedReads, "MIN_BLOCK", 4)
    B, H, T, d, scale = 2, 3, 16, 5, 0.7
    q, k, scores, lse, weights = _causal_attention(B, H, T, d, scale, seed=0)
    flat_of = lambda b, q, k: (b * H * T + q) * T + k  # noqa: E731  head 0
    W = window or T
    plan = torch.tensor([flat_of(b, tq, t) for b in range(B) for tq in (3, 6, 7, 11, 15)
                         if (tq + b) % 3 for t in range(max(0, tq - W), tq + 1)])  # fmt: skip
    pos = torch.tensor([flat_of(1, 4, 3), flat_of(0, 2, 0), flat_of(1, 5, 9)])
    zbar = torch.arange(0, plan.numel(), 2)
    where = fused.FusedReads.of(torch.cat([pos, plan]), 3, zbar, B, H, T, window)
    assert (where.block, where.window) == ((4, 3) if window else (T, 0))
    agg = hooks._HookAggregator.__new__(hooks._HookAggregator)
    agg.all_heads = True
    got = where.plan_scores(q, k, scale)
    torch.testing.assert_close(agg.at_heads(got, where.plan), agg.at_heads(scores, plan))
    torch.testing.assert_close(agg.at_heads(got, where.zbar), agg.at_heads(scores, plan[zbar]))
    torch.testing.assert_close(
        agg.at_heads(where.row_lse(lse), where.plan_row),
        agg.at_heads(lse[..., None].expand(-1, -1, -1, T), plan),
    )
    assert where.at.tolist() == [[1, 4, 3], [0, 2, 0], [1, 5, 9]]
    want = agg.at_heads(weights, pos)
    torch.testing.assert_close(where.position_weights(q, k, lse, scale, None), want)
    assert want[2].eq(0).all()  # key after the query
    heads = torch.tensor([2, 0])
    torch.testing.assert_close(where.position_weights(q, k, lse, scale, heads), want[:, heads])


@pytest.mark.parametrize("share", [0.25, 2.0], ids=["lines", "dot products"])
def test_position_reads_on_shared_lines_read_the_weights_of_their_reads(share, monkeypatch):
    """Position reads that many share a line of the scores (the previous token's diagonal,
    the first token's column, the query itself) are read from that line's dot products, the
    rest one by one: every read's weight is the softmax's, 0 above the diagonal, in the
    reads' order, for every head and a subset; with no line made, the same."""
    monkeypatch.setattr(fused.FusedReads, "LINE_SHARE", share)
    B, H, T, d, scale = 2, 3, 16, 5, 0.7
    q, k, _, lse, weights = _causal_attention(B, H, T, d, scale, seed=1)
    reads = [(b, t, t - 1) for b in range(B) for t in range(1, T)]  # previous token
    reads += [(b, t, 0) for b in range(B) for t in range(T)]  # first token
    reads += [(b, t, t) for b in range(B) for t in range(T)]  # itself
    reads += [(1, 4, 3), (0, 2, 0), (1, 5, 9), (0, 9, 6), (1, 15, 2)]  # scattered, one after
    order = torch.randperm(len(reads), generator=torch.Generator().manual_seed(2))
    at = torch.tensor(reads)[order]
    flat = (at[:, 0] * H * T + at[:, 1]) * T + at[:, 2]  # head 0's
    where = fused.FusedReads.of(flat, len(reads), None, B, H, T)
    assert len(where.lines) == (3 if share < 1 else 0)
    assert where.at.tolist() == at.tolist()
    agg = hooks._HookAggregator.__new__(hooks._HookAggregator)
    agg.all_heads = True
    want = agg.at_heads(weights, flat)
    got = where.position_weights(q, k, lse, scale, None)
    torch.testing.assert_close(got, want)
    assert got[at[:, 2] > at[:, 1]].eq(0).all() and (at[:, 2] > at[:, 1]).any()
    heads = torch.tensor([2, 0])
    torch.testing.assert_close(where.position_weights(q, k, lse, scale, heads), want[:, heads])
