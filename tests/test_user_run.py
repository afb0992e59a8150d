"""A user's own run, as a new user tries it: a word-level model trained with `train` on
WikiText-2 valid, statistics of the training text, `record --text` on WikiText-2 test with
`--queries 0.3`, then `report --stats`.  On whichever TransformerLens major is installed (CI
runs the suite on both)."""

from __future__ import annotations

import json

import pytest

from scansnap_lens.cli import main
from scansnap_lens.inputs.text import read_documents, word_level_tokenizer
from scansnap_lens.inputs.tokens import encode, rows_of
from scansnap_lens.models.training import attention_only_model, train

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it


@pytest.fixture(scope="module")
def user_run(tmp_path_factory):
    """(folder, WikiText-2 folder) after training, `stats` and `record --text`."""
    from conftest import SHARED

    wikitext = SHARED / "data" / "wikitext-2"
    if not wikitext.is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    root = tmp_path_factory.mktemp("user")
    docs = read_documents(wikitext / "valid.txt", "wikitext")
    tokenizer = word_level_tokenizer(docs, max_vocab=2000)
    tokenizer.save(str(root / "tokenizer.json"))
    model = attention_only_model(2000, d_model=32, n_heads=2, n_ctx=64, seed=0)
    train(model, rows_of(encode(tokenizer, docs), 32), num_steps=60, lr_y=0.1, lr_z=1.0,
          save_steps=[0, 5, 10, 20, 40, 60], out=root / "ckpt", progress=False)  # fmt: skip
    tok, stats = str(root / "tokenizer.json"), str(root / "stats.safetensors")
    assert main(["stats", str(wikitext / "valid.txt"), "--tokenizer", tok, "--documents",
                 "wikitext", "--window", "32", "--out", stats]) == 0  # fmt: skip
    assert main(["record", "--checkpoints", str(root / "ckpt"), "--text",
                 str(wikitext / "test.txt"), "--tokenizer", tok, "--queries", "0.3",
                 "--seq-len", "32", "--max-rows", "64", "--stats", stats,
                 "--out", str(root / "traj")]) == 0  # fmt: skip
    return root


def test_the_report_of_a_users_run_is_written_and_names_what_it_could_not_measure(user_run, capsys):
    """The most frequent queries of real text ('<unk>', 'the') have no distinct token under
    the binomial guard: the report is still written, says why, and what to change."""
    capsys.readouterr()
    code = main(["report", str(user_run / "traj"), "--stats", str(user_run / "stats.safetensors")])
    out = capsys.readouterr().out
    assert code == 0, out
    folder = user_run / "traj" / "report"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["title"] == "scansnap_lens: ckpt"  # the run's folder, not its path or meta
    why = summary["not_measured"]
    assert "guard=False" in why["token groups"] and "min_distinct=" in why["token groups"]
    assert "guard=False, --no-guard" in out and "min_distinct=, --min-distinct" in out  # CLI
    assert why["discriminative_bias"] == "needs token groups (see 'token groups')"
    rows = summary["summary"]
    assert len(rows) == 2 and all(r["attention_entropy"] > 0 for r in rows)
    assert all("rank_agreement" in r for r in rows)  # the theory's fit needs no groups
    page = (folder / "report.html").read_text()
    assert "<h2>Not measured</h2>" in page and "token groups" in page
    assert "not measured: token groups:" in out


def test_relaxing_the_classification_as_advised_measures_the_scan(user_run, capsys):
    """The advice works: without the guard, the queries the statistics give distinct tokens
    are measured (record chose them with --stats when --queries is not given)."""
    stats = str(user_run / "stats.safetensors")
    tok = str(user_run / "tokenizer.json")
    from conftest import SHARED

    text = SHARED / "data" / "wikitext-2" / "test.txt"
    assert main(["record", "--checkpoints", str(user_run / "ckpt"), "--text", str(text),
                 "--tokenizer", tok, "--seq-len", "32", "--max-rows", "64", "--stats", stats,
                 "--out", str(user_run / "traj2")]) == 0  # fmt: skip
    out = user_run / "report2"
    args = ["report", str(user_run / "traj2"), "--stats", stats, "--out", str(out)]
    assert main([*args, "--no-guard"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "token groups" not in summary["not_measured"]
    assert all(r["bias"] is not None and r["auroc"] is not None for r in summary["summary"])
    assert (out / "head_ranking.csv").exists()


def test_tokens_writes_the_evaluation_tokens_record_text_reads(user_run, capsys):
    """`scansnap tokens` writes the rows `record --text` encodes: recording from the file gives
    the same trajectory."""
    import torch

    from conftest import SHARED
    from scansnap_lens.recording.trajectory import Trajectory

    text = SHARED / "data" / "wikitext-2" / "test.txt"
    stats, tok = str(user_run / "stats.safetensors"), str(user_run / "tokenizer.json")
    ev = user_run / "eval.safetensors"
    assert main(["tokens", str(text), "--tokenizer", tok, "--seq-len", "32", "--max-rows", "64",
                 "--out", str(ev)]) == 0  # fmt: skip
    assert "64 rows of 32 tokens" in capsys.readouterr().out
    out = str(user_run / "traj3")
    assert main(["record", "--checkpoints", str(user_run / "ckpt"), "--tokens", str(ev),
                 "--queries", "0.3", "--stats", stats, "--out", out]) == 0  # fmt: skip
    a, b = Trajectory.load(user_run / "traj3"), Trajectory.load(user_run / "traj")
    assert torch.equal(a.plan.queries, b.plan.queries)
    assert torch.equal(a.zbar.full(), b.zbar.full())


@pytest.fixture(scope="module")
def syn_medium_run(tmp_path_factory):
    """(checkpoint folder, evaluation rows, statistics) of a model trained on Syn-Medium,
    whose corpus statistics classify distinct tokens: the recorder plans for the scan's
    power from them (the plan a resume must make again)."""
    import torch

    from scansnap_lens.lab.synthetic import syn_medium
    from scansnap_lens.statistics.context import Context
    from scansnap_lens.statistics.corpus import count_corpus

    classes = syn_medium(1)
    tokens, labels, _ = classes.sample(2000, 16, torch.Generator().manual_seed(0))
    rows = torch.cat([tokens, labels[:, None]], 1)
    root = tmp_path_factory.mktemp("syn")
    model = attention_only_model(33, d_model=16, n_heads=2, n_ctx=17, seed=0)
    train(model, rows, num_steps=40, lr_y=0.5, lr_z=0.5, save_steps=[0, 5, 10, 20, 30, 40],
          out=root / "ckpt", progress=False)  # fmt: skip
    return root / "ckpt", rows[:16], count_corpus(rows, Context(window=17))


def test_the_identical_record_command_resumes_an_interrupted_and_a_finished_run(
    syn_medium_run, tmp_path, capsys, monkeypatch
):
    """Planned by the budget for the scan's power from the statistics, interrupted after two
    of six checkpoints: the identical command records the other four and nothing again,
    once more records nothing (both were refused as "another plan": the resumed plan was
    made without the statistics); a changed budget is refused naming it."""
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.recording.recorder import RecordingRun

    folder, rows, stats = syn_medium_run
    save_tokens(tmp_path / "eval.safetensors", rows)
    stats.save(tmp_path / "stats.safetensors")
    args = ["record", "--checkpoints", str(folder), "--tokens",
            str(tmp_path / "eval.safetensors"), "--stats", str(tmp_path / "stats.safetensors"),
            "--out", str(tmp_path / "traj")]  # fmt: skip
    calls = []
    record_model = RecordingRun.record_model  # the one step every driver takes

    def interrupted(self, step, model, *args, **kwargs):
        calls.append(step)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return record_model(self, step, model, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(RecordingRun, "record_model", interrupted)
        assert main(args) == 130
    files = sorted((tmp_path / "traj" / "checkpoints").glob("step_*.safetensors"))
    stamps = {p.name: p.stat().st_mtime_ns for p in files}
    assert len(stamps) == 2
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err
    assert "6 checkpoints recorded (4 new, 0 skipped)" in capsys.readouterr().out
    assert all((tmp_path / "traj" / "checkpoints" / n).stat().st_mtime_ns == t
               for n, t in stamps.items())  # fmt: skip
    assert main(args) == 0
    assert "6 checkpoints recorded (0 new, 0 skipped)" in capsys.readouterr().out
    assert main([*args, "--max-checkpoint-mb", "8"]) == 2
    err = capsys.readouterr().err
    assert "max_checkpoint_bytes=, --max-checkpoint-mb 64 MB there, 8 MB here" in err


def test_record_steps_auto_places_its_budget_and_resumes_with_the_identical_command(
    syn_medium_run, tmp_path, capsys, monkeypatch
):
    """`--steps auto --budget 4` over six checkpoints: a coarse pass, then the checkpoints
    that split the snap's bracket, four at most, each with why in placement.json; interrupted
    in its second round, the identical command goes on from the folder and records nothing
    again; --budget without --steps auto is refused naming both."""
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.recording.recorder import RecordingRun
    from scansnap_lens.recording.trajectory import Trajectory

    folder, rows, _ = syn_medium_run
    save_tokens(tmp_path / "eval.safetensors", rows)
    args = ["record", "--checkpoints", str(folder), "--tokens",
            str(tmp_path / "eval.safetensors"), "--out", str(tmp_path / "traj"),
            "--steps", "auto", "--budget", "4"]  # fmt: skip
    calls = []
    record_model = RecordingRun.record_model

    def interrupted(self, step, model, *args, **kwargs):
        calls.append(step)
        if len(calls) == 4:  # the coarse pass records 3
            raise KeyboardInterrupt
        return record_model(self, step, model, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(RecordingRun, "record_model", interrupted)
        assert main(args) == 130
    assert len(Trajectory.load(tmp_path / "traj").steps) == 3
    capsys.readouterr()
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    traj = Trajectory.load(tmp_path / "traj")
    assert "--steps auto: 4 of 6 checkpoints (budget 4)" in out, out
    placed = json.loads((tmp_path / "traj" / "placement.json").read_text())
    assert sorted(map(int, placed["steps"])) == traj.steps.tolist()
    reasons = list(placed["steps"].values())
    assert reasons.count("coarse pass: log-spaced, a third of the budget") == 3
    assert any("between checkpoints" in r for r in reasons), reasons
    assert main(args) == 0
    assert "4 checkpoints recorded (0 new, 0 skipped)" in capsys.readouterr().out
    assert main([*args[:-4], "--budget", "4"]) == 2
    assert "--budget" in capsys.readouterr().err
