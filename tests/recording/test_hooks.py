"""The hooks' aggregates against a brute-force loop over `run_with_cache`, on both backends
and on bridges over Hugging Face models; the forward pass stops after the last watched layer."""

from __future__ import annotations

import re

import pytest
import torch
from _backends import BACKENDS, requires_hooked
from _reference import assert_matches, brute_force
from _tiny import V, tiny_model

from scansnap_lens.measures.entropy import position_entropy
from scansnap_lens.recording.hooks import (
    _looks_like_pattern,
    prompt_attention,
    record_checkpoint,
)
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.testing import bridge_from_hf, tiny_hf_model


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("exclude_bos", "window"), [(True, None), (False, None), (True, 3),
                                                     (False, 1), (False, 4)])  # fmt: skip
@pytest.mark.parametrize("include_self", [False, True])
def test_aggregates_equal_brute_force(exclude_bos, include_self, window, backend):
    model = tiny_model(backend=backend)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (5, 11), generator=g)
    plan = plan_recording(tokens, V, exclude_bos=exclude_bos, include_self=include_self,
                          window=window)  # fmt: skip
    rec = record_checkpoint(model, tokens, plan, batch_size=2, progress=False)
    ref = brute_force(model, tokens, exclude_bos, include_self, window=window)
    zbar, c_hat = ref[0], ref[1]

    L, H = 2, 3
    assert rec.zbar.shape == (L, H, plan.num_pairs)
    assert len(zbar) == L * H * plan.num_pairs and len(c_hat) == L * H * plan.num_triples
    assert_matches(rec, plan, ref, range(L), range(H))
    # c_hat sums to 1 over the tokens of each class
    per_class = torch.zeros(L, H, plan.num_classes).index_add_(2, plan.triple_class, rec.c_hat)
    torch.testing.assert_close(per_class, torch.ones_like(per_class))


@pytest.mark.parametrize("backend", BACKENDS)
def test_recording_stops_after_the_last_watched_attention(backend):
    """Recording the last layer runs neither its MLP nor the unembedding (a bridge's
    stop_at_layer does not stop after its last block), and leaves no hook behind: the model's
    logits are the same before and after."""
    model = tiny_model(backend=backend)
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(tokens)
    modules = {"unembed": model.unembed, "last mlp": model.blocks[1].mlp}
    calls = {name: 0 for name in modules}
    handles = [
        module.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
        for name, module in modules.items()
    ]
    plan = plan_recording(tokens, V)
    record_checkpoint(model, tokens, plan, progress=False)
    prompt_attention(model, tokens[0], layers=[1], heads=[0])
    position_entropy(model, tokens)
    assert calls == {"unembed": 0, "last mlp": 0}
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        assert torch.equal(model(tokens), before)


def test_tracked_queries_classes_layers_heads():
    model = tiny_model()
    tokens = torch.randint(0, V, (4, 12), generator=torch.Generator().manual_seed(2))
    queries = [3, 5, 7]
    plan = plan_recording(tokens, V, queries=queries)
    classes = list(zip(plan.class_query.tolist(), plan.class_next.tolist()))[:2]
    plan_c = plan_recording(tokens, V, queries=queries, classes=classes)
    assert plan_c.num_classes == 2 and plan_c.num_pairs == plan.num_pairs
    rec = record_checkpoint(model, tokens, plan_c, layers=[1], heads=[2, 0], progress=False)
    zbar, c_hat, _, _, tol = brute_force(model, tokens, False, False, queries=set(queries))
    assert rec.zbar.shape == (1, 2, plan_c.num_pairs)
    for j, (m, l) in enumerate(zip(plan_c.pair_query.tolist(), plan_c.pair_token.tolist())):
        assert rec.zbar[0, 0, j].item() == pytest.approx(zbar[1, 2, m, l], abs=tol["zbar"])
        assert rec.zbar[0, 1, j].item() == pytest.approx(zbar[1, 0, m, l], abs=tol["zbar"])
    for j in range(plan_c.num_triples):
        c = plan_c.triple_class[j].item()
        key = (1, 2, classes[c][0], classes[c][1], plan_c.triple_token[j].item())
        assert rec.c_hat[0, 0, j].item() == pytest.approx(c_hat[key], abs=tol["c_hat"])


def test_a_batch_without_a_tracked_query_adds_nothing():
    """A row holding none of the tracked queries is a batch without events (it has no
    context runs to sum): the record equals brute force over the other rows."""
    model = tiny_model()
    tokens = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(4))
    queries = [3, 5]
    tokens[1] = torch.where(torch.isin(tokens[1], torch.tensor(queries)), 0, tokens[1])
    plan = plan_recording(tokens, V, queries=queries)
    rec = record_checkpoint(model, tokens, plan, batch_size=1, progress=False)
    ref = brute_force(model, tokens, False, False, queries=set(queries))
    assert_matches(rec, plan, ref, range(2), range(3))


@requires_hooked  # on 4.x the native bridge is such a model, tested above
def test_pattern_in_scores_hook_is_detected_and_scores_rebuilt():
    """A HookedTransformer made to show the softmax pattern at hook_attn_scores."""
    model = tiny_model(backend="hooked")
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(3))
    plan = plan_recording(tokens, V)
    want = record_checkpoint(model, tokens, plan, progress=False)
    tol = brute_force(model, tokens)[-1]
    stash = {}

    def scores_to_pattern(scores, hook):
        stash[hook.name] = torch.softmax(scores, -1)
        return stash[hook.name]

    def restore_pattern(pattern, hook):
        return stash[hook.name.replace("hook_pattern", "hook_attn_scores")]

    for layer in range(2):
        model.add_perma_hook(f"blocks.{layer}.attn.hook_attn_scores", scores_to_pattern)
        model.add_perma_hook(f"blocks.{layer}.attn.hook_pattern", restore_pattern)
    _, cache = model.run_with_cache(tokens)
    assert _looks_like_pattern(cache["blocks.0.attn.hook_attn_scores"])
    got = record_checkpoint(model, tokens, plan, progress=False)
    # Both are float32 recordings; each lies within `tol` of the exact value.
    torch.testing.assert_close(got.zbar, want.zbar, atol=2 * tol["zbar"], rtol=0)
    torch.testing.assert_close(got.c_hat, want.c_hat, atol=2 * tol["c_hat"], rtol=0)


def test_bad_inputs_name_the_problem():
    model = tiny_model()
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(4))
    plan = plan_recording(tokens, V)
    bad = tokens.clone()
    bad[1, 4] = V + 5
    with pytest.raises(ValueError, match=r"\[0, 13\).*18"):
        record_checkpoint(model, bad, plan, progress=False)
    with pytest.raises(ValueError, match="18"):
        plan_recording(bad, V)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        record_checkpoint(model, tokens, plan_recording(tokens, V + 1), progress=False)
    other = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match=r"not the ones the plan was built from|does not know"):
        record_checkpoint(model, other, plan, progress=False)
    with pytest.raises(ValueError, match="layers"):
        record_checkpoint(model, tokens, plan, layers=[2], progress=False)


def test_non_finite_weights_are_recorded_with_a_warning():
    """A diverged checkpoint is recorded as computed (NaN attention), never silently."""
    model = tiny_model()
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(4))
    plan = plan_recording(tokens, V)
    name, weight = next((n, w) for n, w in model.named_parameters() if ".attn." in n)
    with torch.no_grad():
        weight.view(-1)[0] = float("nan")
    message = rf"step 7: 1 weight tensors hold NaN or inf \({re.escape(name)}\)"
    with pytest.warns(RuntimeWarning, match=message):
        record = record_checkpoint(model, tokens, plan, step=7, progress=False)
    assert torch.isnan(record.zbar).any()  # the NaN reaches the attention logits


@pytest.mark.parametrize("exclude_bos", [True, False])
def test_gpt2_bridge_equals_brute_force(exclude_bos):
    hf = tiny_hf_model("gpt2", vocab_size=20, n_ctx=16, d_model=16, n_layers=2, n_heads=2)
    with torch.no_grad():  # peaked attention
        for block in hf.transformer.h:
            block.attn.c_attn.weight.mul_(8)
    bridge = bridge_from_hf(hf, "gpt2")
    tokens = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, 20, exclude_bos=exclude_bos)
    rec = record_checkpoint(bridge, tokens, plan, batch_size=2, progress=False)
    ref = brute_force(bridge, tokens, exclude_bos=exclude_bos)
    assert_matches(rec, plan, ref, range(2), range(2))


def test_dropout_is_off_while_recording():
    """A GPT-2 bridge with dropout 0.5 left in training mode: its forward passes differ, its
    recordings do not (the recorder evaluates), and it is back in training mode after."""
    hf = tiny_hf_model("gpt2", vocab_size=20, n_ctx=16, d_model=16, n_layers=1, n_heads=2)
    hf.config.resid_pdrop = hf.config.attn_pdrop = hf.config.embd_pdrop = 0.5
    hf = type(hf)(hf.config)  # rebuilt with the dropout rates
    bridge = bridge_from_hf(hf, "gpt2")
    bridge.train()
    tokens = torch.randint(0, 20, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(bridge(tokens), bridge(tokens))  # dropout is active
    plan = plan_recording(tokens, 20)
    a, b = (record_checkpoint(bridge, tokens, plan, progress=False) for _ in range(2))
    assert torch.equal(a.zbar, b.zbar) and torch.equal(a.entropy, b.entropy)
    assert bridge.training


@pytest.mark.parametrize("window", [None, 3])
def test_batches_with_more_position_pairs_than_the_bound_run_in_parts(monkeypatch, window):
    """A batch over MAX_PAIRS runs as several forward passes of fewer rows; the aggregates
    are those of the brute-force reference (only the order of float32 sums changes)."""
    from scansnap_lens.recording.hooks import _HookAggregator

    model = tiny_model()
    tokens = torch.randint(0, V, (6, 12), generator=torch.Generator().manual_seed(4))
    plan = plan_recording(tokens, V, window=window)
    runs = []
    monkeypatch.setattr(_HookAggregator, "MAX_PAIRS", 40)  # a row holds up to 55 pairs
    original = _HookAggregator.index
    monkeypatch.setattr(_HookAggregator, "index", lambda self, x: runs.append(len(x))
                        or original(self, x))  # fmt: skip
    rec = record_checkpoint(model, tokens, plan, batch_size=6, progress=False)
    assert sum(runs) == 6 and len(runs) >= 3  # split, every row once
    ref = brute_force(model, tokens, window=window)
    assert_matches(rec, plan, ref, range(2), range(3))
    runs.clear()  # the attention's own size bounds the rows too: 2 rows of 3 heads x 12 x 12
    monkeypatch.setattr(_HookAggregator, "MAX_PAIRS", 1 << 20)
    monkeypatch.setattr(_HookAggregator, "MAX_ATTENTION_BYTES", 2 * 4 * 3 * 12 * 12)
    again = record_checkpoint(model, tokens, plan, batch_size=6, progress=False)
    assert runs == [2, 2, 2]
    assert_matches(again, plan, ref, range(2), range(3))
