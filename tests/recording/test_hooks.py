"""The hooks' aggregates against a brute-force loop over `run_with_cache`, on both backends
and on bridges over Hugging Face models; the forward pass stops after the last watched layer."""

from __future__ import annotations

import json
import re

import pytest
import torch
from _backends import BACKENDS, requires_hooked
from _hub import bridge_from_hf, tiny_hf_model
from _reference import assert_matches, brute_force
from _tiny import QUIET, V, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from scansnap_lens.measures.entropy import position_entropy
from scansnap_lens.recording.hooks import (
    _looks_like_pattern,
    prompt_attention,
    record_checkpoint,
)
from scansnap_lens.recording.plan import plan_recording

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it


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
@pytest.mark.parametrize("in_one_batch", [False, True])
@pytest.mark.parametrize("alone", [True, False], ids=["cpu", "gpu"])
def test_recording_stops_after_the_last_watched_attention(backend, in_one_batch, alone,
                                                          monkeypatch):  # fmt: skip
    """Recording the last layer runs neither its MLP nor the unembedding (a bridge's
    stop_at_layer does not stop after its last block) but for the first rows that hold
    `LOSS_TOKENS` tokens, whose loss it records (the model's own), even where they share a
    batch with other rows (with Pythia's 50k tokens, the unembedding of 16 rows of 64 made the
    recording 1.45x the forward); and leaves no hook behind: the model's logits are the same
    before and after.  Where launches cost more than compute (a GPU), the loss rows' batch
    runs whole to the unembedding in one pass instead, and the loss is the same."""
    from scansnap_lens.recording import hooks

    monkeypatch.setattr(hooks, "_loss_rows_alone", lambda device, rows, batch: alone)
    monkeypatch.setattr(hooks, "LOSS_TOKENS", 75)  # 8 rows of 10 tokens (7.5 rounded up)
    loss_rows = hooks.loss_rows(10)
    assert loss_rows == 8
    model = tiny_model(backend=backend)
    tokens = torch.randint(0, V, (loss_rows + 6, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(tokens)
        truth = model(tokens[:loss_rows], return_type="loss")
    modules = {"unembed": model.unembed, "last mlp": model.blocks[1].mlp}
    rows = {name: [] for name in modules}
    handles = [
        module.register_forward_hook(lambda _, args, __, name=name: rows[name].append(
            args[0].shape[0]))
        for name, module in modules.items()
    ]  # fmt: skip
    plan = plan_recording(tokens, V)
    batch = loss_rows + 6 if in_one_batch else loss_rows // 2
    record = record_checkpoint(model, tokens, plan, batch_size=batch, progress=False)
    seen = [loss_rows] if in_one_batch else [loss_rows // 2] * 2  # the loss rows only
    if in_one_batch and not alone:
        seen = [tokens.shape[0]]  # their batch, in one pass
    assert rows == {"unembed": seen, "last mlp": seen}
    assert abs(record.loss - float(truth)) < 1e-5 * max(1.0, float(truth))  # float32 means
    prompt_attention(model, tokens[0], layers=[1], heads=[0])
    position_entropy(model, tokens)
    assert rows == {"unembed": seen, "last mlp": seen}
    for handle in handles:
        handle.remove()
    with torch.no_grad():
        assert torch.equal(model(tokens), before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cpu_runs_the_loss_rows_in_passes_whose_logits_stay_bounded(backend, monkeypatch):
    """On a CPU the loss rows' passes make at most `LOSS_LOGITS_BYTES` of logits (at
    Pythia's vocabulary 4 rows of 512 made the recorder's peak 1.6x its size with one row a
    pass); the loss is the model's, the attention the same as in one pass."""
    from scansnap_lens.recording import hooks

    monkeypatch.setattr(hooks, "LOSS_TOKENS", 75)  # 8 rows of 10 tokens
    model = tiny_model(backend=backend)
    tokens = torch.randint(0, V, (12, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        truth = model(tokens[:8], return_type="loss")
    plan = plan_recording(tokens, V)
    whole = record_checkpoint(model, tokens, plan, batch_size=12, progress=False)
    row = 4 * 10 * V  # bytes of one row's logits
    monkeypatch.setattr(hooks, "LOSS_LOGITS_BYTES", 3 * row)
    seen = []
    hook = lambda _, args, __: seen.append(args[0].shape[0])  # noqa: E731
    handle = model.unembed.register_forward_hook(hook)
    parts = record_checkpoint(model, tokens, plan, batch_size=12, progress=False)
    handle.remove()
    assert seen == [3, 3, 2]
    assert abs(parts.loss - float(truth)) < 1e-5 * max(1.0, float(truth))  # float32 means
    for name, values in whole.values.items():  # other passes: float32 sums in another order
        torch.testing.assert_close(parts.values[name], values, rtol=1e-5, atol=1e-6,
                                   equal_nan=True)  # fmt: skip


def test_the_loss_is_recorded_on_the_positions_the_training_optimizes(tmp_path, monkeypatch):
    """loss_on="last" records each row's final prediction, as `train(loss_on="last")`
    optimizes it; a Recorder takes it from the training's meta, the settings may say it for
    a loop of the user's own, the two may not differ, and the folder keeps it per checkpoint
    (a folder recorded before says nothing: all positions)."""
    from transformer_lens.utilities import lm_cross_entropy_loss

    from scansnap_lens.recording import hooks
    from scansnap_lens.recording.recorder import Recorder
    from scansnap_lens.recording.trajectory import Trajectory

    monkeypatch.setattr(hooks, "LOSS_TOKENS", 60)  # 6 rows of 10 tokens
    model = tiny_model()
    tokens = torch.randint(0, V, (8, 10), generator=torch.Generator().manual_seed(1))
    plan = plan_recording(tokens, V)
    with torch.no_grad():
        per_token = lm_cross_entropy_loss(model(tokens[:6]), tokens[:6], per_token=True)
    last = record_checkpoint(model, tokens, plan, progress=False, loss_on="last")
    every = record_checkpoint(model, tokens, plan, progress=False)
    assert (last.loss_on, every.loss_on) == ("last", "all")
    assert abs(last.loss - float(per_token[:, -1].mean())) < 1e-5
    assert abs(every.loss - float(per_token.mean())) < 1e-5
    with pytest.raises(ValueError, match="loss_on must be one of"):
        record_checkpoint(model, tokens, plan, progress=False, loss_on="first")

    recorder = Recorder(tmp_path / "t", tokens, QUIET, plan)
    recorder.on_checkpoint(0, model, {"lr_y": 0.1, "lr_z": 1.0, "loss_on": "last"})
    recorder.close()
    traj = Trajectory.load(tmp_path / "t")
    assert traj.loss_on == "last" and abs(float(traj.loss[0]) - last.loss) < 1e-6
    own = Recorder(tmp_path / "own", tokens, QUIET.replace(loss_on="last"), plan)
    own.on_checkpoint(0, model)
    own.close()
    assert Trajectory.load(tmp_path / "own").loss_on == "last"
    told = Recorder(tmp_path / "both", tokens, QUIET.replace(loss_on="all"), plan)
    with pytest.raises(ValueError, match="the training's loss is on 'last' positions"):
        told.on_checkpoint(0, model, {"lr_y": 0.1, "lr_z": 1.0, "loss_on": "last"})
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    for entry in manifest["checkpoints"]:
        del entry["loss_on"]
    (tmp_path / "t" / "manifest.json").write_text(json.dumps(manifest))
    assert Trajectory.load(tmp_path / "t").loss_on == "all"


def test_the_loss_rows_share_their_pass_only_where_launches_cost_more_than_compute():
    from scansnap_lens.recording.hooks import _loss_rows_alone

    assert _loss_rows_alone("cpu", 4, 8)  # the CPU: a row's unembedding costs
    assert not _loss_rows_alone("cuda", 4, 8)  # a GPU: a pass costs its launches
    assert _loss_rows_alone(torch.device("cuda:0"), 4, 32)  # 28 more rows' unembedding


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


def _show_pattern_at_scores(model, layers=2) -> None:
    """Make a HookedTransformer fire the softmax pattern at hook_attn_scores (as some bridges
    do) while its pattern stays the model's own."""
    stash = {}

    def scores_to_pattern(scores, hook):
        stash[hook.name] = torch.softmax(scores, -1)
        return stash[hook.name]

    def restore_pattern(pattern, hook):
        return stash[hook.name.replace("hook_pattern", "hook_attn_scores")]

    for layer in range(layers):
        model.add_perma_hook(f"blocks.{layer}.attn.hook_attn_scores", scores_to_pattern)
        model.add_perma_hook(f"blocks.{layer}.attn.hook_pattern", restore_pattern)


@requires_hooked  # on 4.x the native bridge is such a model, tested above
def test_pattern_in_scores_hook_is_detected_and_scores_rebuilt():
    """A HookedTransformer made to show the softmax pattern at hook_attn_scores."""
    model = tiny_model(backend="hooked")
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(3))
    plan = plan_recording(tokens, V)
    want = record_checkpoint(model, tokens, plan, progress=False)
    tol = brute_force(model, tokens)[-1]
    _show_pattern_at_scores(model)
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
    # a bridge in eval mode whose wrapped model alone trains: evaluated, each flag restored
    bridge.eval()
    hf.train()
    with torch.no_grad():
        assert not torch.equal(bridge(tokens), bridge(tokens))
    c = record_checkpoint(bridge, tokens, plan, progress=False)
    assert torch.equal(a.zbar, c.zbar) and torch.equal(a.entropy, c.entropy)
    assert not bridge.training and all(m.training for m in hf.modules())


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


@pytest.mark.parametrize("fused_on", [False, True], ids=["eager", "fused"])
def test_a_pass_that_sums_every_layer_at_its_end_records_what_each_layer_sums(monkeypatch,
                                                                             fused_on):  # fmt: skip
    """A GPU's passes keep their layers' reads and sum them once for every layer
    (`_HookAggregator._read`): every aggregate equals the per-layer sums' bit for bit (the
    same additions in the same order), on a subset of heads too; with a user's plan
    aggregate (its gather sees one layer's heads), or reads over `DEFER_BYTES`, each layer's
    are summed at once."""
    import dataclasses

    from scansnap_lens.recording import fused
    from scansnap_lens.recording.aggregates import DEFAULT, Aggregate, earlier_copies
    from scansnap_lens.recording.hooks import _HookAggregator

    monkeypatch.setattr(fused, "ENABLED", fused_on)
    model = tiny_model()
    tokens = torch.randint(0, V, (6, 12), generator=torch.Generator().manual_seed(4))
    plan = plan_recording(tokens, V)
    aggregates = [*DEFAULT, Aggregate("same_token", axis="rows", positions=earlier_copies)]
    summed = []
    original = _HookAggregator._sum
    monkeypatch.setattr(_HookAggregator, "_sum",
                        lambda self, i, *reads: summed.append(i if self.on_plan else None)
                        or original(self, i, *reads))  # fmt: skip

    def record(aggregates=aggregates):  # every head, and a subset
        return [record_checkpoint(model, tokens, plan, batch_size=4, progress=False,
                                  heads=heads, aggregates=aggregates)
                for heads in (None, [0, 2])]  # fmt: skip

    want = record()
    assert summed and -1 not in summed
    monkeypatch.setattr(_HookAggregator, "DEFER_ON", ("cpu",))
    summed.clear()
    got = record()
    assert set(summed) == {-1, None}  # None: the induction's own rows, positions only
    for one, other in zip(want, got):
        for name, values in one.values.items():
            assert torch.equal(values.nan_to_num(7.0), other.values[name].nan_to_num(7.0)), name
    summed.clear()
    mine = dataclasses.replace(DEFAULT[0], name="zbar_mine", key="zbar_mine")
    record(aggregates=[*DEFAULT, mine])
    assert summed and -1 not in summed
    monkeypatch.setattr(_HookAggregator, "DEFER_BYTES", 0)
    summed.clear()
    record()
    assert summed and -1 not in summed


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_query_attention_on_the_rebuilt_scores_equals_brute_force(backend):
    """Keys shared by pairs of query heads (4 query heads, 2 key/value heads), where the
    scores are rebuilt from hook_q/hook_k: TL 4's native bridge shows the pattern at
    hook_attn_scores; a HookedTransformer (TL 3) is made to.  Each query head reads its own
    group's keys: the logits equal the exact float64 ones, and the rebuilt scores reproduce
    the model's own pattern (so the reference's grouping is the model's)."""
    model = tiny_model(backend=backend, n_heads=4, n_key_value_heads=2)
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(5))
    plan = plan_recording(tokens, V)
    ref = brute_force(model, tokens)  # the true scores, before any hook changes them
    if backend == "hooked":
        _show_pattern_at_scores(model)
    _, cache = model.run_with_cache(tokens)
    assert _looks_like_pattern(cache["blocks.0.attn.hook_attn_scores"])  # the q/k path
    assert cache["blocks.0.attn.hook_k"].shape[2] == 2  # keys of 2 heads reach the hook
    q, k = cache["blocks.1.attn.hook_q"].double(), cache["blocks.1.attn.hook_k"].double()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, dim=2)) / 8**0.5
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    pattern = torch.softmax(scores.masked_fill(~causal, -torch.inf), -1)
    pattern_tol = 64 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(pattern, cache["blocks.1.attn.hook_pattern"].double(),
                               atol=pattern_tol, rtol=0)  # fmt: skip
    rec = record_checkpoint(model, tokens, plan, batch_size=2, progress=False)
    assert_matches(rec, plan, ref, range(2), range(4))


class _CountSyncs(TorchDispatchMode):
    """Counts the aten calls that make the host wait for a GPU: reading a value
    (``.item()``, ``bool()``), outputs whose size depends on values (``nonzero``, boolean
    indexing, ``unique``, ``repeat_interleave`` by a tensor, a segmented sum by lengths)."""

    NAMES = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "repeat_interleave",
             "segment_reduce", "is_nonzero", "equal")  # fmt: skip

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        boolean_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else ())
        )
        if boolean_index or any(name.startswith(n) for n in self.NAMES):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("fused_on", [False, True], ids=["eager", "fused"])
def test_the_forward_passes_wait_for_the_host_no_more_than_the_bare_forward(monkeypatch,
                                                                          fused_on):  # fmt: skip
    """Per batch, the recorder indexes the tokens on the host and sends only indices to the
    device: inside its forward passes (every hook of every aggregate, the rebuilt scores,
    several parts per batch; or the fused layers' reads) the calls that make the host wait
    for a GPU are exactly the bare forward's, and the copy back to the host happens once per
    checkpoint (the eager path: a GPU's; the probe of the scores hook, which fused layers
    need not, once per run)."""
    import scansnap_lens.recording.hooks as hooks
    from scansnap_lens.recording import fused

    monkeypatch.setattr(fused, "ENABLED", fused_on)
    model, tokens, plan, bare, inside, passes = _counted_passes(monkeypatch, _CountSyncs)
    monkeypatch.setattr(hooks._HookAggregator, "MAX_PAIRS", 40)  # several parts per batch
    means = []
    monkeypatch.setattr(hooks._HookAggregator, "means", _spy(hooks._HookAggregator.means, means))
    record = hooks.record_checkpoint(model, tokens, plan, batch_size=4, progress=False,
                                     aggregates=["zbar", "c_hat", "entropy", "query_entropy",
                                                 "previous_token", "first_token"])  # fmt: skip
    assert len(passes) > 4 and record.zbar.shape[0] == 2
    per_pass, calls, n_passes = len(bare.calls), list(inside.calls), len(passes)
    if fused.fusable_layers(model, 1, "cpu"):
        assert len(calls) == per_pass * n_passes, calls
    else:  # one pass probed the scores hook
        assert len(calls) == per_pass * (n_passes - 1) + _probe_calls(model, tokens), calls
    assert len(means) == 1  # the sums come back to the host once per checkpoint


def _counted_passes(monkeypatch, mode):
    """A tiny model, rows and plan, a `mode` run over one bare forward pass of 2 rows, and
    one, with the batch sizes, that counts inside the recorder's passes from now on."""
    import scansnap_lens.recording.hooks as hooks

    model = tiny_model()
    tokens = torch.randint(0, V, (8, 12), generator=torch.Generator().manual_seed(6))
    plan = plan_recording(tokens, V)
    bare = mode()
    with torch.no_grad(), bare:
        hooks.run_until(model, tokens[:2], 1, [])
    inside, passes = mode(), []
    original = hooks.run_until

    def counted(model, x, last_layer, hook_list):
        passes.append(x.shape[0])
        with inside:
            return original(model, x, last_layer, hook_list)

    def sum_reads(self):  # a deferring pass's sums, after its forward
        with inside:
            return original_sums(self)

    original_sums = hooks._HookAggregator._sum_reads
    monkeypatch.setattr(hooks, "run_until", counted)
    monkeypatch.setattr(hooks._HookAggregator, "_sum_reads", sum_reads)
    monkeypatch.setattr(hooks, "LOSS_TOKENS", 0)  # every pass stops at the watched layers
    return model, tokens, plan, bare, inside, passes


def _spy(method, calls: list):
    def wrapped(self, *args, **kwargs):
        calls.append(1)
        return method(self, *args, **kwargs)

    return wrapped


def _probe_calls(model, tokens) -> int:
    """The once-per-run probe's own calls (whether hook_attn_scores carries the pattern)."""
    import scansnap_lens.recording.hooks as hooks

    counter, state = _CountSyncs(), {}

    def probe(scores, hook=None):
        with counter:
            state[hook.name] = hooks._looks_like_pattern(scores)

    with _CountSyncs() as forward:
        hooks.run_until(model, tokens[:1], 1, [(f"blocks.{i}.attn.hook_attn_scores", probe)
                                                for i in range(2)])  # fmt: skip
    return len(forward.calls)


def test_a_runs_later_checkpoints_reuse_the_index_of_its_tokens(monkeypatch):
    """Each batch's index tensors depend on the tokens only: the run's first checkpoint makes
    them, later ones reuse them (none indexed again) and record what a fresh run records;
    past `KEEP_INDEX_BYTES` they are made again at each checkpoint."""
    import scansnap_lens.recording.hooks as hooks

    tokens = torch.randint(0, V, (6, 12), generator=torch.Generator().manual_seed(7))
    plan = plan_recording(tokens, V)
    calls = []
    monkeypatch.setattr(hooks._HookAggregator, "index", _spy(hooks._HookAggregator.index, calls))
    state = hooks.RunState()
    first, second = tiny_model(seed=1), tiny_model(seed=2)
    hooks.record_checkpoint(first, tokens, plan, batch_size=4, progress=False, state=state)
    made = len(calls)
    again = hooks.record_checkpoint(second, tokens, plan, batch_size=4, progress=False,
                                    state=state)  # fmt: skip
    assert made == 2 and len(calls) == made and state.index_bytes > 0
    fresh = hooks.record_checkpoint(second, tokens, plan, batch_size=4, progress=False)
    for name in fresh.values:
        assert torch.equal(again.values[name], fresh.values[name]), name
    monkeypatch.setattr(hooks._HookAggregator, "KEEP_INDEX_BYTES", 0)
    small = hooks.RunState()
    for _ in range(2):
        hooks.record_checkpoint(second, tokens, plan, batch_size=4, progress=False, state=small)
    assert len(calls) == 4 * made and small.indices == {}  # fresh, then 2 checkpoints


def test_a_kept_batch_recorded_with_another_aggregate_list_sums_into_its_own_layout():
    """The weight reads' joined slots are kept with a batch's indices; another aggregate list
    on the same run state lays the sums out anew (zbar's slots first), and is joined anew."""
    import scansnap_lens.recording.hooks as hooks

    tokens = torch.randint(0, V, (6, 12), generator=torch.Generator().manual_seed(7))
    plan, state, model = plan_recording(tokens, V), hooks.RunState(), tiny_model(seed=1)
    record = lambda aggs, state: hooks.record_checkpoint(  # noqa: E731
        model, tokens, plan, batch_size=4, progress=False, state=state, aggregates=aggs
    )
    record(["c_hat", "first_token"], state)
    again = record(["zbar", "c_hat", "first_token"], state)
    fresh = record(["zbar", "c_hat", "first_token"], None)
    for name in fresh.values:
        assert torch.equal(again.values[name].nan_to_num(7.0), fresh.values[name].nan_to_num(7.0))


def test_a_run_makes_each_aggregates_divisor_once():
    """The plan's counts are counted and copied to the device once per run (`RunState.counts`):
    a later checkpoint divides by the kept ones, and a new plan gets its own."""
    import dataclasses

    import scansnap_lens.recording.hooks as hooks
    from scansnap_lens.recording.aggregates import aggregate_named

    calls = []
    zbar = aggregate_named("zbar")
    again = dataclasses.replace(zbar, name="zbar_again", key="zbar_again",
                                count=lambda plan: calls.append(1) or plan.pair_count)  # fmt: skip
    tokens = torch.randint(0, V, (6, 12), generator=torch.Generator().manual_seed(7))
    plan, state, model = plan_recording(tokens, V), hooks.RunState(), tiny_model(seed=1)
    aggregates = [zbar, again, "first_token"]
    for _ in range(2):
        rec = hooks.record_checkpoint(model, tokens, plan, batch_size=4, progress=False,
                                      state=state, aggregates=aggregates)  # fmt: skip
        assert torch.equal(rec.values["zbar_again"], rec.values["zbar"])
    assert len(calls) == 1
    other = plan_recording(tokens[:3], V)  # another plan: counted again
    hooks.record_checkpoint(model, tokens[:3], other, batch_size=4, progress=False,
                            state=state, aggregates=[zbar, again])  # fmt: skip
    assert len(calls) == 2


class _CountKernels(TorchDispatchMode):
    """Counts the aten calls that launch work (views and allocations left out)."""

    FREE = ("view", "_unsafe_view", "reshape", "_reshape_alias", "slice", "select", "expand",
            "as_strided", "unsqueeze", "squeeze", "t", "transpose", "permute", "alias",
            "detach", "split", "split_with_sizes", "narrow", "unbind", "lift_fresh", "empty",
            "empty_strided", "_to_copy", "to")  # fmt: skip

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ not in self.FREE
        return func(*args, **(kwargs or {}))


def _hook_kernels(monkeypatch, aggregates) -> float:
    """The calls the recorder's hooks make per watched layer and forward pass."""
    import scansnap_lens.recording.hooks as hooks

    model, tokens, plan, bare, inside, passes = _counted_passes(monkeypatch, _CountKernels)
    state = hooks.RunState()
    hooks.record_checkpoint(model, tokens, plan, batch_size=4, progress=False, state=state,
                            aggregates=aggregates)  # fmt: skip
    inside.count, passes[:] = 0, []  # the run's second checkpoint: indices kept, probe done
    hooks.record_checkpoint(model, tokens, plan, batch_size=4, progress=False, state=state,
                            aggregates=aggregates)  # fmt: skip
    return (inside.count - bare.count * len(passes)) / (len(passes) * 2)


def test_the_hooks_launch_few_calls_per_layer_whatever_the_position_aggregates(monkeypatch):
    """A GPU's recording is bound by the calls its hooks launch (the forward of a small model
    takes tens of milliseconds, each call some microseconds): every default aggregate costs
    few calls per layer and pass, and more position aggregates cost none (one gather and one
    scatter read them all)."""
    import scansnap_lens.recording.hooks as hooks
    from scansnap_lens.recording import fused
    from scansnap_lens.recording.aggregates import Aggregate, earlier_copies

    monkeypatch.setattr(fused, "ENABLED", False)  # a GPU's path (the fused one is the CPU's)
    scan = ["zbar", "c_hat", "entropy", "query_entropy"]
    heads = ["previous_token", "first_token"]
    mine = Aggregate("same_token", axis="rows", positions=earlier_copies)
    per_layer = _hook_kernels(monkeypatch, [*scan, *heads])
    # 51 on TL 4's bridge (scores rebuilt from q and k) and 44 on TL 3's tiny model before
    # the reads were fused; 22 and 18 after; 21 and 17 with one scatter of every weight
    assert per_layer <= 21, per_layer
    assert _hook_kernels(monkeypatch, [*scan, *heads, mine]) == per_layer
    assert _hook_kernels(monkeypatch, scan) == per_layer  # the positions join the scatter
    # a GPU's pass sums every layer's reads at its end: the gathers a layer, the sums' calls
    # once a pass (21 -> 15 over these 2 layers; at Pythia-70m's 6, 17 -> 2 + 16 / 6)
    monkeypatch.setattr(hooks._HookAggregator, "DEFER_ON", ("cpu",))
    deferred = _hook_kernels(monkeypatch, [*scan, *heads])
    assert deferred <= per_layer - 6, (deferred, per_layer)


@pytest.mark.parametrize("chunk_bytes", [4 * 11 * 3, 8 << 20])  # 3 positions a step, or all
def test_the_next_token_loss_is_transformer_lens_cross_entropy(chunk_bytes, monkeypatch):
    """Log-sum-exp minus the next token's logit, a few positions at a time, equals
    TransformerLens's log-softmax cross-entropy per token, at every chunk boundary."""
    from transformer_lens.utilities import lm_cross_entropy_loss

    import scansnap_lens.recording.hooks as hooks

    monkeypatch.setattr(hooks, "LOSS_CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 8, 11, generator=g) * 5
    tokens = torch.randint(0, 11, (3, 8), generator=g)
    want = lm_cross_entropy_loss(logits.double(), tokens, per_token=True)
    got = hooks.next_token_loss(logits, tokens)
    assert got.shape == (3, 7) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=64 * torch.finfo(torch.float32).eps)
