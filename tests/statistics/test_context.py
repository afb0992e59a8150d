"""The context convention: statistics and recordings must agree on position 0."""

from __future__ import annotations

import pytest
import torch
from _tiny import QUIET

from scansnap_lens import measures
from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium
from scansnap_lens.models.training import attention_only_model
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.statistics.context import Context
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import TokenGroups
from scansnap_lens.statistics.kinds import token_kinds

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it


def test_defaults_agree_and_a_mismatch_is_refused_where_the_two_meet(tmp_path):
    classes = syn_medium(1)
    sample = sequence_sampler(classes)
    V = classes.vocab_size
    eval_tokens = sample(16, torch.Generator().manual_seed(2))
    corpus = sample(64, torch.Generator().manual_seed(1))
    model = attention_only_model(V, d_model=16, n_ctx=64, seed=0)
    plan = plan_recording(eval_tokens, V, queries=classes.query.unique())
    with Recorder(tmp_path / "t", eval_tokens, QUIET, plan=plan) as recorder:
        recorder.on_checkpoint(0, model)
        traj = recorder.trajectory()

    queries = classes.query.unique().tolist()
    stats = cooccurrence(corpus, V, queries=queries)  # the defaults: position 0 is context
    assert stats.context.mismatch(plan.context) is None
    groups = TokenGroups.from_kinds(token_kinds(stats, scope="global", guard=False), stats)
    assert measures.discriminative_bias(traj, groups).table["bias"].notna().all()

    other = cooccurrence(corpus, V, queries=queries, exclude_bos=True)
    groups = TokenGroups.from_kinds(token_kinds(other, scope="global", guard=False), other)
    message = "the statistics leave position 0 out of context and the recording counts it"
    for measurement in (measures.discriminative_bias, measures.frequency_bias, measures.sparsity):
        with pytest.raises(ValueError, match=message):
            measurement(traj, groups)
    with pytest.raises(ValueError, match=message):
        measures.theory_fit(traj, other)
    for given in ({"groups": groups}, {"source": other}):  # the analysis, before measuring
        with pytest.raises(ValueError, match=message):
            Analysis.of(traj, **given)
    # a window is the statistics' own choice, not a mismatch
    assert Context(window=8).mismatch(plan.context) is None
    assert TokenGroups.from_synthetic(classes).context is None  # the lab: nothing to check


def test_the_command_line_refuses_statistics_of_another_convention(tmp_path, capsys):
    from scansnap_lens.cli import main
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.models.training import train

    classes = syn_medium(1)
    sample = sequence_sampler(classes)
    model = attention_only_model(classes.vocab_size, d_model=16, n_ctx=64, seed=0)
    train(model, sample, num_steps=4, lr_y=0.1, lr_z=3.0, save_steps=[0, 4], out=tmp_path / "ckpt",
          loss_on="last", progress=False)  # fmt: skip
    save_tokens(tmp_path / "corpus.safetensors", sample(64, torch.Generator().manual_seed(1)))
    save_tokens(tmp_path / "eval.safetensors", sample(16, torch.Generator().manual_seed(2)))
    for flags, name in (([], "s"), (["--exclude-bos"], "s_nobos")):
        args = ["stats", str(tmp_path / "corpus.safetensors"), "--out", str(tmp_path / name)]
        assert main([*args, *flags]) == 0
    args = ["record", "--checkpoints", str(tmp_path / "ckpt"), "--tokens"]
    assert main([*args, str(tmp_path / "eval.safetensors"), "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    report = ["report", str(tmp_path / "t"), "--out", str(tmp_path / "r"), "--stats"]
    assert main([*report, str(tmp_path / "s_nobos")]) == 2
    err = capsys.readouterr().err
    assert "leave position 0 out of context and the recording counts it" in err
    assert "--exclude-bos" in err and "Traceback" not in err
    assert main([*report, str(tmp_path / "s")]) == 0  # the defaults agree
