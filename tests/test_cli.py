"""The `scansnap` commands on the demo, on a user's own checkpoints and corpora, and on bad
input (exit code 2 and a message naming the problem)."""

import html
import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch
from _tiny import QUIET

from scansnap_lens.cli import main
from scansnap_lens.inputs.tokens import save_tokens
from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium
from scansnap_lens.models.backend import tl_major
from scansnap_lens.models.training import attention_only_model, train
from scansnap_lens.recording.trajectory import Trajectory


@pytest.mark.tl
def test_demo_shows_scan_and_snap(demo_out):
    out, printed = demo_out
    assert "report:" in printed and "bias" in printed
    summary = json.loads((out / "report" / "summary.json").read_text())["summary"][0]
    assert summary["bias"] > 0.5 and summary["auroc"] > 0.8  # the scan
    assert summary["spearman"] > 0.2  # frequency bias
    assert 0 < summary["snap_path"] <= 250  # the snap
    assert 50 < summary["snap_step"] < 250 and summary["snap_reason"] == ""
    assert summary["predicted_snap"] > 0  # the rates came from the training itself
    assert (out / "report" / "report.html").stat().st_size > 1_000_000  # the script inlined
    assert len(Trajectory.load(out / "trajectory").steps) >= 10


@pytest.mark.tl
def test_the_demos_recorded_loss_is_the_one_its_training_optimizes(demo_out):
    """The demo trains on each row's last prediction (loss_on="last"): the recorded loss is
    on those positions too, so it falls as the training loss does (measured at every
    position, which this task never trains, it rose from 3.5 to 7 nats), and the figure says
    which positions it averages over."""
    from scipy.stats import spearmanr

    out, _ = demo_out
    traj = Trajectory.load(out / "trajectory")
    assert traj.loss_on == "last" and traj.meta["loss_on"] == "last"
    recorded = traj.loss.numpy()
    trained = pd.read_csv(out / "report" / "loss.csv").set_index("step")["loss"]
    # the training loss around each checkpoint (a batch's loss is noisy): the mean of 5 steps
    near = [trained.loc[max(1, s - 2) : s + 2].mean() for s in traj.steps.tolist() if s > 0]
    assert recorded[-1] < 0.2 * recorded[0], recorded
    assert spearmanr(recorded[1:], near).statistic > 0.9, (recorded, near)
    assert abs(recorded[-1] - near[-1]) < 0.1 + 0.5 * near[-1]
    page = html.unescape((out / "report" / "report.html").read_text())
    assert "evaluation loss on each row's last position" in page


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A user's own run: checkpoints in a folder, a training corpus and evaluation tokens."""
    root = tmp_path_factory.mktemp("own")
    classes = syn_medium(1)
    sample = sequence_sampler(classes, seq_len=24)
    model = attention_only_model(classes.vocab_size, d_model=16, n_ctx=32, seed=0)
    train(
        model,
        sample,
        num_steps=40,
        lr_y=0.1,
        lr_z=3.0,
        batch_size=32,
        save_steps=[0, 10, 20, 40],
        out=root / "ckpt",
        loss_on="last",
        progress=False,
    )
    save_tokens(root / "corpus.safetensors", sample(256, torch.Generator().manual_seed(1)))
    save_tokens(root / "eval.safetensors", sample(16, torch.Generator().manual_seed(2)))
    return root, classes


@pytest.mark.tl
def test_stats_record_report_on_own_checkpoints(own_run, capsys):
    root, classes = own_run
    M, q = str(classes.vocab_size), str(int(classes.query[0]))
    stats = root / "stats.safetensors"
    assert (
        main(
            [
                "stats",
                str(root / "corpus.safetensors"),
                "--out",
                str(stats),
                "--vocab-size",
                M,
                "--queries",
                q,
            ]
        )
        == 0
    )
    assert "256 events" in capsys.readouterr().out
    traj_dir = root / "traj"
    record = [
        "record",
        "--checkpoints",
        str(root / "ckpt"),
        "--tokens",
        str(root / "eval.safetensors"),
    ]
    record += ["--out", str(traj_dir), "--steps", "0,20,40"]
    assert main(record) == 0
    assert "3 new" in capsys.readouterr().out
    assert main(record) == 0  # resumable: nothing left to do
    assert "0 new" in capsys.readouterr().out
    assert main([*record[:-1], "all"]) == 0  # and picks up what is missing
    assert "1 new" in capsys.readouterr().out
    assert Trajectory.load(traj_dir).steps.tolist() == [0, 10, 20, 40]

    assert main(["report", str(traj_dir), "--stats", str(stats), "--out", str(root / "rep")]) == 0
    printed = capsys.readouterr().out
    assert "report:" in printed
    saved = json.loads((root / "rep" / "summary.json").read_text())
    assert saved["steps"] == [0, 10, 20, 40] and len(saved["summary"]) == 1
    assert (root / "rep" / "figures" / "logit_change.png").stat().st_size > 0
    assert "theory_fit" in (root / "rep" / "summary.json").read_text()
    report = ["report", str(traj_dir), "--stats", str(stats), "--out", str(root / "rep2")]
    assert main([*report, "--no-theory"]) == 0
    assert "theory_fit: left out (theory=False, --no-theory)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([*report, "--theory-classes", "1"])
    assert exit_.value.code == 2 and "must lie in [2" in capsys.readouterr().err


@pytest.mark.tl
def test_both_routes_of_record_take_the_same_rows_by_default(own_run, tmp_path, capsys):
    """`--tokens` took every row of the file (5,606 rows of WikiText: 1.6 h) while `--text`
    took 64: both take the first 64 unless --max-rows says a number or all."""
    from scansnap_lens.cli import MAX_ROWS
    from scansnap_lens.inputs.tokens import read_tokens, save_tokens

    root, _ = own_run
    rows = read_tokens(root / "eval.safetensors")
    many = torch.cat([rows] * 5)  # 80 rows
    save_tokens(tmp_path / "eval.safetensors", many)
    args = ["record", "--checkpoints", str(root / "ckpt"), "--tokens",
            str(tmp_path / "eval.safetensors"), "--steps", "0,"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert f"rows: the first {MAX_ROWS} of 80" in capsys.readouterr().err
    assert Trajectory.load(tmp_path / "a").values["previous_token"].shape[-1] == MAX_ROWS
    assert main([*args, "--out", str(tmp_path / "b"), "--max-rows", "all"]) == 0
    assert Trajectory.load(tmp_path / "b").values["previous_token"].shape[-1] == 80


@pytest.mark.tl
def test_record_power_chooses_the_rows_that_reach_the_asked_auroc(tmp_path, capsys):
    """A corpus of topic words tied to next tokens (`lab.calibration.corpus_text`), a model of
    its vocabulary and statistics of the corpus: `--power` plans each doubling of the rows,
    records the fewest that reach the asked AUROC, and the recorder's own plan says its power
    again; an AUROC the whole text cannot reach is said so, with all rows recorded."""
    from scansnap_lens.lab.calibration import CorpusScenario, corpus_text

    scenario = CorpusScenario(rows=1200, tied=True)
    text, queries = corpus_text(scenario, seed=0)
    save_tokens(tmp_path / "corpus.safetensors", text[256:])
    save_tokens(tmp_path / "eval.safetensors", text[:256])
    model = attention_only_model(scenario.vocab, d_model=16, n_ctx=64, seed=0)
    train(model, lambda n, g: text[torch.randint(0, len(text), (n,), generator=g)],
          num_steps=1, save_steps=[0, 1], out=tmp_path / "ckpt", progress=False)  # fmt: skip
    stats = tmp_path / "stats.safetensors"
    assert main(["stats", str(tmp_path / "corpus.safetensors"), "--out", str(stats),
                 "--vocab-size", str(scenario.vocab), "--window", "16", "--queries",
                 ",".join(map(str, queries.tolist()))]) == 0  # fmt: skip
    args = ["record", "--checkpoints", str(tmp_path / "ckpt"), "--tokens",
            str(tmp_path / "eval.safetensors"), "--stats", str(stats), "--steps", "0,"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a"), "--power", "0.8"]) == 0
    err = capsys.readouterr().err
    assert "--power 0.8: 64 rows -> AUROC >= " in err
    chosen = int(err.split("recording the first ")[1].split(" of 256")[0])
    planned = [float(line.split(">= ")[1].split(" ")[0]) for line in err.splitlines()
               if " rows -> " in line]  # fmt: skip
    assert planned[-1] <= 0.8 and all(m > 0.8 for m in planned[:-1])
    assert chosen in (64, 128, 256)
    assert Trajectory.load(tmp_path / "a").values["previous_token"].shape[-1] == chosen
    assert "power: the scan verdict on " in err and "it could see AUROC >= " in err
    assert main([*args, "--out", str(tmp_path / "b"), "--power", "0.51"]) == 0
    assert "--power 0.51: not reached with any of the first rows of the 256" in (
        capsys.readouterr().err)  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "c"), "--power", "0.8", "--max-rows", "64"]) == 2
    assert "without --max-rows" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "d"), "--power", "1.5"]) == 2
    assert "--power is the AUROC to detect, in (0.5, 1]; got 1.5" in capsys.readouterr().err
    no_stats = [a for a in args if a not in ("--stats", str(stats))]
    assert main([*no_stats, "--out", str(tmp_path / "e"), "--power", "0.8"]) == 2
    assert "--power plans the rows from the statistics: give --stats" in capsys.readouterr().err


def test_stats_of_text_and_of_a_dataset(shared_dir, tmp_path, capsys):
    text = shared_dir / "data" / "wikitext-2" / "test.txt"
    out = tmp_path / "wiki.safetensors"
    args = ["stats", str(text), "--out", str(out), "--max-vocab", "200", "--window", "8"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "word-level tokenizer (200 words)" in printed
    assert (tmp_path / "wiki.tokenizer.json").is_file()

    import datasets

    rows = [[1, 2, 3, 4], [2, 3, 1, 4], [5, 1, 2]]
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "ds.safetensors"
    assert (
        main(["stats", "--dataset", str(tmp_path / "ds"), "--out", str(out), "--vocab-size", "6"])
        == 0
    )
    assert "5 events" in capsys.readouterr().out  # T - 2 per row: a query needs context


def test_text_splits_into_the_documents_asked_for(tmp_path, capsys):
    """Events never cross a document: a row of T words holds T - 2 events (a query needs
    context and a next token), so the split shows in the count."""
    from scansnap_lens.statistics.corpus import CooccurrenceStats

    (tmp_path / "t.txt").write_text("a b c d\ne f g\n\nh i j k l\n")
    events = {}
    for split in ("line", "paragraph", "document"):
        out = tmp_path / f"{split}.safetensors"
        assert (
            main(["stats", str(tmp_path / "t.txt"), "--documents", split, "--out", str(out)]) == 0
        )
        events[split] = int(CooccurrenceStats.load(out).events.sum())
    assert events == {"line": 2 + 1 + 3, "paragraph": 5 + 3, "document": 12 - 2}


@pytest.mark.tl
def test_record_pretrained_labels_offline(fake_hub, own_run, tmp_path, capsys):
    tokens = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(0))
    save_tokens(tmp_path / "eval.safetensors", tokens)
    args = ["record", "--model", "EleutherAI/pythia-14m", "--steps", "0,2000"]
    args += ["--tokens", str(tmp_path / "eval.safetensors"), "--out", str(tmp_path / "t")]
    assert main([*args, "--layers", "0", "--queries", "0.5"]) == 0
    traj = Trajectory.load(tmp_path / "t")
    assert traj.steps.tolist() == [0, 2000] and traj.layers == [0]


def _record_args(root, tmp, *extra, tokens=None, checkpoints=None):
    tokens = tokens or root / "eval.safetensors"
    checkpoints = checkpoints or root / "ckpt"
    args = ["record", "--checkpoints", str(checkpoints), "--tokens", str(tokens)]
    return [*args, "--out", str(tmp / "t"), *extra]


def _garbage_tokens(root, tmp):
    (tmp / "bad.safetensors").write_bytes(b"not a tensor file")
    return _record_args(root, tmp, tokens=tmp / "bad.safetensors")


def _empty_text(root, tmp):
    (tmp / "empty.txt").write_text("\n\n")
    return ["stats", str(tmp / "empty.txt"), "--out", str(tmp / "s.safetensors")]


def _stats_of_another_vocabulary(root, tmp):
    """A trajectory of the run's model and statistics over a 5-token vocabulary."""
    save_tokens(tmp / "other.safetensors", torch.tensor([[1, 2, 3, 4]]))
    other = tmp / "other_stats.safetensors"
    assert main(["stats", str(tmp / "other.safetensors"), "--out", str(other),
                 "--vocab-size", "5"]) == 0  # fmt: skip
    assert main(_record_args(root, tmp, "--steps", "0,40")) == 0
    return ["report", str(tmp / "t"), "--stats", str(other)]


def _window_other_than_the_statistics(root, tmp):
    """Statistics counted with a window of 4, recorded with --window 6."""
    stats = tmp / "w4.safetensors"
    assert main(["stats", str(root / "eval.safetensors"), "--out", str(stats),
                 "--window", "4"]) == 0  # fmt: skip
    return _record_args(root, tmp, "--stats", str(stats), "--window", "6")


@pytest.mark.parametrize("flag", ["--layers", "--heads"])
@pytest.mark.tl
def test_a_layer_or_head_the_model_lacks_is_refused_before_anything_is_written(
    own_run, tmp_path, capsys, flag
):
    root, _ = own_run
    assert main(_record_args(root, tmp_path, flag, "5", "--steps", "0,40")) == 2
    err = capsys.readouterr().err
    assert f"{flag[2:]} [5] out of range: the model has 1 {flag[2:]}, 0 to 0" in err
    assert not (tmp_path / "t").exists()  # so the corrected command is not refused
    assert main(_record_args(root, tmp_path, "--steps", "0,40")) == 0
    assert main(_record_args(root, tmp_path, flag, "0", "--steps", "0,10,40")) == 0  # resumes


def _negative_step(root, tmp):
    shutil.copytree(root / "ckpt", tmp / "neg")
    shutil.copy(tmp / "neg" / "step_000000010.safetensors", tmp / "neg" / "step_-5.safetensors")
    return _record_args(root, tmp, checkpoints=tmp / "neg")


def _not_a_tokenizer(root, tmp):
    return ["tokens", str(root / "eval.safetensors"), "--tokenizer", str(root / "eval.safetensors"),
            "--out", str(tmp / "t.safetensors")]  # fmt: skip


def _missing_tokenizer_file(root, tmp):
    (tmp / "eval.txt").write_text("a b c d e f g h\n")
    args = ["record", "--checkpoints", str(root / "ckpt"), "--text", str(tmp / "eval.txt")]
    return [*args, "--tokenizer", str(tmp / "tok.json"), "--out", str(tmp / "t")]


BAD_INPUTS = [  # (what is wrong, the arguments (made from the run and a scratch folder), message)
    ("a trajectory folder that cannot be written (refused before a checkpoint loads)",
     lambda r, t: [*_record_args(r, t)[:-2], "--out", "/proc/scansnap-t"],
     "cannot write /proc/scansnap-t: /proc takes no new files"),
    ("a report folder that cannot be written",
     lambda r, t: ["report", str(t), "--stats", str(t / "s"), "--out", "/proc/scansnap-r"],
     "cannot write /proc/scansnap-r"),
    ("a negative step in a file name", _negative_step,
     "step_-5.safetensors names a negative step"),
    ("a tokenizer file that does not exist (no wait for the hub)", _missing_tokenizer_file,
     "tok.json does not exist"),
    ("no checkpoint folder", lambda r, t: _record_args(r, t, checkpoints=t / "none"),
     "does not exist"),
    ("no tokens", lambda r, t: ["record", "--checkpoints", str(r / "ckpt"), "--out", str(t / "t")],
     "--tokens FILE or --text FILE"),
    ("unreadable tokens", _garbage_tokens, "not a readable token file"),
    ("a step not saved", lambda r, t: _record_args(r, t, "--steps", "0,15"),
     "steps [15] are not available"),
    ("--seq-len with a token file", lambda r, t: _record_args(r, t, "--seq-len", "16"),
     "--seq-len sets the row length of --text"),
    ("--steps 0", lambda r, t: _record_args(r, t, "--steps", "0"),
     "for the checkpoint at step 0 give a list"),
    ("a file that is not a tokenizer", _not_a_tokenizer, "is not a tokenizer.json file"),
    ("layers named twice", lambda r, t: _record_args(r, t, "--layers", "0,0"),
     "name [0] more than once"),
    ("empty text", _empty_text, "holds no text"),
    ("statistics of another vocabulary", _stats_of_another_vocabulary, "vocabulary mismatch"),
    ("no trajectory", lambda r, t: ["report", str(t / "nothing"), "--stats", str(t / "s")],
     "manifest.json is missing"),
    ("a window other than the statistics'", _window_other_than_the_statistics,
     "window 6 differs from the statistics' window 4"),
    ("a run over the disk budget",
     lambda r, t: _record_args(r, t, "--queries", "all", "--max-run-gb", "1e-6"),
     "over the budget of 1 kB (max_run_bytes=, --max-run-gb): track fewer queries (queries=,"
     " --queries), watch fewer layers or heads (layers=, --layers, heads=, --heads), select"
     " fewer checkpoints (steps=, --steps), or raise the budget"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "message"), [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])  # fmt: skip
@pytest.mark.tl
def test_bad_input_gives_exit_code_2_and_names_the_problem(own_run, tmp_path, capsys, make,
                                                           message):  # fmt: skip
    root, _classes = own_run
    args = make(root, tmp_path)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_demo_refuses_unknown_data():
    from scansnap_lens.demo import run_demo

    with pytest.raises(ValueError, match="data must be one of"):
        run_demo(data="syn-large")


def test_every_option_has_help_and_shows_its_default():
    import argparse

    from scansnap_lens.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    for name, command in commands.items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            said = action.help or ""
            assert said, (name, action.option_strings)
            if action.default not in (None, False, argparse.SUPPRESS):
                assert "default" in said, (name, action.option_strings, said)
    assert "checkpoint-N/" in commands["record"].format_help()  # the Trainer's layout


def test_every_command_has_help(capsys):
    for command in ("demo", "stats", "tokens", "record", "report", "theory"):
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert "usage: scansnap " + command in capsys.readouterr().out
    # the console entry point itself
    done = subprocess.run(
        [sys.executable, "-m", "scansnap_lens.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "scansnap demo" in done.stdout and "Exit codes" in done.stdout


def test_theory_refuses_more_next_tokens_than_the_vocabulary(capsys):
    assert main(["theory", "--K", "40", "--M", "33", "--lr-y", "1", "--lr-z", "1"]) == 2
    assert "K=40 next tokens exceed the vocabulary M=33" in capsys.readouterr().err


def test_theory_command_and_errors(tmp_path, capsys):
    args = ["theory", "--K", "10", "--M", "1000", "--lr-y", "1", "--lr-z", "0.5"]
    assert main([*args, "--csv", str(tmp_path / "b.csv")]) == 0
    assert "182.34" in capsys.readouterr().out
    assert (tmp_path / "b.csv").read_text().startswith("t,B,xi,B_integral,chi_upper")
    with pytest.raises(SystemExit) as exit_:  # rejected by the argument parser itself
        main(["theory", "--K", "10", "--M", "1000", "--lr-y", "-1", "--lr-z", "0.5"])
    assert exit_.value.code == 2
    assert "--lr-y: must be a positive finite number" in capsys.readouterr().err


def _pickled_model_folder(root, tmp):
    folder = tmp / "pickled"
    folder.mkdir()
    torch.save({"model": object()}, folder / "model_3.pt")
    return folder


def _weights_without_config(root, tmp):
    folder = tmp / "noconfig"
    folder.mkdir()
    (folder / "step_000000010.safetensors").write_bytes(
        (root / "ckpt" / "step_000000010.safetensors").read_bytes()
    )
    return folder


def _trainer_step_mismatch(root, tmp):
    folder = tmp / "trainer" / "checkpoint-3"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    return folder.parent


CHECKPOINT_ERRORS = [  # (folder maker, extra flags, what the message must say)
    (_pickled_model_folder, [], "holds pickled Python objects beyond tensors, which are not"),
    (_weights_without_config, [], "config.json beside the checkpoints"),
    (_trainer_step_mismatch, [], "says step 3, its trainer_state.json says 2"),
]
if tl_major() >= 4:
    CHECKPOINT_ERRORS.append(
        (
            lambda root, tmp: root / "ckpt",
            ["--backend", "hooked"],
            "backend='bridge', --backend bridge",
        )
    )


@pytest.mark.parametrize("make, flags, message", CHECKPOINT_ERRORS)
@pytest.mark.tl
def test_checkpoint_errors_exit_2_naming_the_option(own_run, tmp_path, capsys, make, flags,
                                                    message):  # fmt: skip
    root, _ = own_run
    folder = make(root, tmp_path)
    args = ["record", "--checkpoints", str(folder), "--tokens", str(root / "eval.safetensors")]
    assert main([*args, "--out", str(tmp_path / "t"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "\x1b[" not in err


@pytest.mark.tl
def test_on_error_skip_covers_the_first_checkpoint(own_run, tmp_path, capsys):
    root, _ = own_run
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for f in (root / "ckpt").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    first = folder / "step_000000000.safetensors"
    first.write_bytes(first.read_bytes()[:100])  # truncated
    args = ["record", "--checkpoints", str(folder), "--tokens", str(root / "eval.safetensors")]
    assert main([*args, "--out", str(tmp_path / "t"), "--on-error", "skip"]) == 0
    assert "3 checkpoints recorded (3 new, 1 skipped)" in capsys.readouterr().out


@pytest.mark.tl
def test_padded_model_vocabulary_measures_with_tokenizer_statistics(own_run, tmp_path, capsys):
    """A model whose d_vocab is padded beyond the tokenizer's (Pythia: 50304 vs 50277)."""
    root, classes = own_run
    M, pad = classes.vocab_size, 7
    sample = sequence_sampler(classes, seq_len=24)
    model = attention_only_model(M + pad, d_model=16, n_ctx=32, seed=0)
    train(model, sample, num_steps=20, lr_y=0.1, lr_z=3.0, batch_size=32, out=tmp_path / "ckpt",
          save_steps=[0, 10, 20], loss_on="last", progress=False)  # fmt: skip
    ev = str(root / "eval.safetensors")
    args = ["record", "--checkpoints", str(tmp_path / "ckpt"), "--tokens", ev]
    assert main([*args, "--out", str(tmp_path / "traj")]) == 0
    summaries = {}
    for vocab in (M, M + pad):  # the tokenizer's size, and the model's
        stats = tmp_path / f"stats_{vocab}.safetensors"
        corpus = str(root / "corpus.safetensors")
        assert main(["stats", corpus, "--out", str(stats), "--vocab-size", str(vocab)]) == 0
        out = tmp_path / f"rep_{vocab}"
        assert (
            main(["report", str(tmp_path / "traj"), "--stats", str(stats), "--out", str(out)]) == 0
        )
        summaries[vocab] = json.loads((out / "summary.json").read_text())["summary"]
    assert summaries[M] == summaries[M + pad]  # padding changes nothing measured
    # statistics of more tokens than the model has are a real mismatch
    big = tmp_path / "big.safetensors"
    corpus = str(root / "corpus.safetensors")
    assert main(["stats", corpus, "--out", str(big), "--vocab-size", str(M + pad + 1)]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "traj"), "--stats", str(big)]) == 2
    assert "vocabulary mismatch" in capsys.readouterr().err


@pytest.mark.tl
def test_the_notebook_route_and_the_command_line_give_one_answer(own_run, tmp_path, capsys):
    """The same trajectory and statistics: `scansnap report` and the README's library route
    (`Analysis.of`) give the same table, verdicts included, and the report says which settings
    it used; the command's analysis, saved beside the trajectory, is what a notebook reloads."""
    import pandas as pd

    import scansnap_lens as ss

    root, classes = own_run
    stats = tmp_path / "stats.safetensors"
    assert main(["stats", str(root / "corpus.safetensors"), "--out", str(stats),
                 "--vocab-size", str(classes.vocab_size)]) == 0  # fmt: skip
    traj_dir = tmp_path / "traj"
    assert main(["record", "--checkpoints", str(root / "ckpt"), "--tokens",
                 str(root / "eval.safetensors"), "--out", str(traj_dir)]) == 0  # fmt: skip
    assert main(["report", str(traj_dir), "--stats", str(stats), "--out",
                 str(tmp_path / "rep")]) == 0  # fmt: skip
    capsys.readouterr()
    cli = pd.read_csv(tmp_path / "rep" / "summary.csv")

    traj = ss.Trajectory.load(traj_dir)  # the README's route
    loaded = ss.CooccurrenceStats.load(stats)
    analysis = ss.Analysis.of(traj, source=loaded)
    assert not analysis.reused
    mine = analysis.summary.replace("", float("nan"))  # as CSV reads
    assert list(mine.columns) == list(cli.columns)
    pd.testing.assert_frame_equal(mine.reset_index(drop=True), cli, check_dtype=False,
                                  rtol=1e-12)  # fmt: skip
    saved = json.loads((tmp_path / "rep" / "summary.json").read_text())["settings"]
    assert saved["classification"] == ss.Classification().to_dict()
    assert saved["uncertainty"]["correction"] == "holm"
    page = (tmp_path / "rep" / "report.html").read_text()
    assert ss.Classification().describe() in page
    again = ss.Analysis.of(traj, source=loaded, cache=traj_dir / "analysis")
    analysis.save(tmp_path / "mine")  # one nobody cached takes its key when saved
    assert again.reused and again.key == analysis.key
    pd.testing.assert_frame_equal(again.summary, analysis.summary)


@pytest.mark.tl
def test_a_report_of_one_checkpoint_is_written(own_run, tmp_path, capsys):
    """A natural first try: one checkpoint, the rates given.  The report is written and says
    that the snap needs two checkpoints (was: "error: snap_step" and no report.html)."""
    root, classes = own_run
    traj_dir = tmp_path / "traj"
    assert (
        main(
            [
                "record",
                "--checkpoints",
                str(root / "ckpt"),
                "--tokens",
                str(root / "eval.safetensors"),
                "--out",
                str(traj_dir),
                "--steps",
                "0,",
            ]
        )
        == 0
    )
    stats = tmp_path / "stats.safetensors"
    assert main(["stats", str(root / "corpus.safetensors"), "--out", str(stats),
                 "--vocab-size", str(classes.vocab_size)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["report", str(traj_dir), "--stats", str(stats), "--out", str(tmp_path / "r"),
                 "--lr-y", "0.1", "--lr-z", "3"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "not measured: snapping: snapping needs at least two checkpoints" in printed
    assert (tmp_path / "r" / "report.html").is_file()


@pytest.mark.tl
def test_a_report_without_token_groups_is_written_and_says_why(own_run, tmp_path, capsys):
    """A filter that leaves no class: the report is still written with what needs no token
    groups (snapping, attention entropy, the theory's fit), and names the threshold to relax."""
    root, classes = own_run
    stats = tmp_path / "stats.safetensors"
    corpus, M = str(root / "corpus.safetensors"), str(classes.vocab_size)
    assert main(["stats", corpus, "--out", str(stats), "--vocab-size", M]) == 0
    ev = str(root / "eval.safetensors")
    args = ["record", "--checkpoints", str(root / "ckpt"), "--tokens", ev, "--steps", "0,40"]
    assert main([*args, "--out", str(tmp_path / "traj")]) == 0
    capsys.readouterr()
    report = ["report", str(tmp_path / "traj"), "--stats", str(stats), "--min-distinct", "999"]
    assert main(report) == 0
    out = capsys.readouterr().out
    assert "not measured: token groups:" in out and "with >= 999 distinct tokens" in out
    assert "--min-distinct" in out
    folder = tmp_path / "traj" / "report"
    summary = json.loads((folder / "summary.json").read_text())
    why = summary["not_measured"]
    assert "min_distinct=" in why["token groups"]  # the library's words; the CLI adds flags
    assert why["discriminative_bias"] == "needs token groups (see 'token groups')"
    assert {"snapping", "attention_entropy", "theory_fit"}.isdisjoint(why)
    assert "snap_step" in summary["summary"][0] and "attention_entropy" in summary["summary"][0]
    assert "Not measured" in (folder / "report.html").read_text()
    assert (folder / "figures" / "attention_entropy.png").exists()


BAD_ARGUMENTS = [  # (arguments, what the message must say): argparse exits 2
    (["record", "--checkpoints", "x", "--tokens", "t", "--out", "o", "--batch-size", "0"],
     "--batch-size: must lie in [1,"),
    (["record", "--checkpoints", "x", "--tokens", "t", "--out", "o", "--max-rows", "-1"],
     "--max-rows: must lie in [1,"),
    (["record", "--checkpoints", "x", "--tokens", "t", "--out", "o", "--steps", "log:0"],
     "log:N needs an integer N >= 2"),
    (["stats", "a.txt", "--out", "s", "--window", "1e20"], "--window: expected an integer"),
    (["stats", "a.txt", "--out", "s", "--documents", "sentence"], "invalid choice: 'sentence'"),
    (["theory", "--K", "2", "--M", "33", "--lr-y", "nan", "--lr-z", "1"],
     "--lr-y: must be a positive finite number"),
    (["theory", "--K", "2", "--M", "33", "--lr-y", "1", "--lr-z", "1", "--points", "100000000"],
     "--points: must lie in [2, 100000]"),
    (["stats", "a.npy", "--out", "s", "--vocab-size", "1000000000000"],
     "--vocab-size: must lie in [1, 2147483647]"),
    (["record", "--checkpoints", "x", "--tokens", "t", "--out", "o", "--device", "quantum"],
     "not a device"),
    (["report", "t", "--stats", "s", "--lr-y", "0.1", "--lr-z", "3", "--momentum", "1"],
     "--momentum: must lie in [0, 1)"),
    (["report", "t", "--stats", "s", "--lr-y", "0", "--lr-z", "3"],
     "--lr-y: must be a positive finite number"),
]  # fmt: skip
if not torch.cuda.is_available():
    BAD_ARGUMENTS.append(
        (["record", "--checkpoints", "x", "--tokens", "t", "--out", "o", "--device", "cuda"],
         "--device: cuda: this machine has no CUDA device")
    )  # fmt: skip


@pytest.mark.parametrize("args, message", BAD_ARGUMENTS)
def test_bad_arguments_exit_2_before_anything_is_written(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.tl
def test_record_keeps_the_tokenizer_strings_for_own_checkpoints(own_run, tmp_path, capsys):
    """Own checkpoints carry no tokenizer: --tokenizer gives the report its words."""
    from scansnap_lens.inputs.text import word_level_tokenizer

    root, classes = own_run
    words = " ".join(f"w{i}" for i in range(classes.vocab_size))
    tok = word_level_tokenizer([words])
    tok.save(str(tmp_path / "tok.json"))
    args = ["record", "--checkpoints", str(root / "ckpt"), "--tokens"]
    args += [str(root / "eval.safetensors"), "--out", str(tmp_path / "t")]
    assert main([*args, "--tokenizer", str(tmp_path / "tok.json"), "--steps", "0,40"]) == 0
    plan = Trajectory.load(tmp_path / "t").plan
    assert plan.token_strings and all(
        text == tok.decode([i]) for i, text in plan.token_strings.items()
    )
    assert plan.decode(int(plan.queries[0])) != str(int(plan.queries[0]))  # a word, not an id


@pytest.mark.tl
def test_report_takes_the_rates_or_reads_them(own_run, demo_out, tmp_path, capsys):
    """The rates the trajectory recorded, or --lr-y/--lr-z (both or neither, checked before
    anything is read); the theory's prediction follows them."""
    out = tmp_path / "demo"  # a copy: the report saves its analysis beside the trajectory
    shutil.copytree(demo_out[0] / "trajectory", out / "trajectory")
    stats = tmp_path / "stats.safetensors"
    root, _ = own_run
    assert main(["stats", str(root / "corpus.safetensors"), "--out", str(stats)]) == 0
    base = ["report", str(out / "trajectory"), "--stats", str(stats)]
    assert main([*base, "--lr-y", "0.1"]) == 2
    assert "--lr-y and --lr-z go together" in capsys.readouterr().err
    assert not (out / "trajectory" / "report").exists()
    assert main([*base, "--out", str(tmp_path / "a")]) == 0  # the demo's recorded 0.1 / 3
    assert main([*base, "--out", str(tmp_path / "b"), "--lr-y", "0.4", "--lr-z", "3"]) == 0
    read = [json.loads((tmp_path / f / "summary.json").read_text())["summary"][0] for f in "ab"]
    assert read[0]["population_snap"] != read[1]["population_snap"]
    assert read[0]["predicted_snap"] == pytest.approx(4 * read[1]["predicted_snap"])  # 1/eta_Y


@pytest.mark.tl
def test_every_kth_checkpoint_that_leaves_one_is_an_error(own_run, tmp_path, capsys):
    root, _ = own_run  # 4 checkpoints: 0, 10, 20, 40
    args = ["record", "--checkpoints", str(root / "ckpt"), "--tokens"]
    args += [str(root / "eval.safetensors"), "--out", str(tmp_path / "t")]
    assert main([*args, "--steps", "40"]) == 2
    assert "give a list" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()  # nothing written
    assert main([*args, "--steps", "40,"]) == 0  # the checkpoint at step 40
    assert Trajectory.load(tmp_path / "t").steps.tolist() == [40]


@pytest.mark.tl
def test_an_output_folder_of_another_run_is_refused(demo_out, own_run, tmp_path, capsys):
    out = tmp_path / "demo"  # a copy: the demo's folder is read by other workers' tests
    shutil.copytree(demo_out[0] / "trajectory", out / "trajectory")
    before = sorted(p.name for p in (out / "trajectory" / "checkpoints").iterdir())
    assert main(["demo", "--out", str(out), "--num-steps", "100"]) == 2
    err = capsys.readouterr().err
    assert "holds another run (num_steps 250 there, 100 here)" in err and "--overwrite" in err
    assert sorted(p.name for p in (out / "trajectory" / "checkpoints").iterdir()) == before

    root, _ = own_run  # resuming with another checkpoint folder mixes two trainings: refused
    other = tmp_path / "other"
    other.mkdir()
    for f in (root / "ckpt").iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    ev = str(root / "eval.safetensors")
    args = ["record", "--tokens", ev, "--out", str(tmp_path / "t"), "--checkpoints"]
    assert main([*args, str(root / "ckpt"), "--steps", "0,10"]) == 0
    capsys.readouterr()
    assert main([*args, str(other)]) == 2
    assert "holds another run (source" in capsys.readouterr().err
    assert main([*args, str(other), "--overwrite"]) == 0
    assert Trajectory.load(tmp_path / "t").meta["source"] == str(other)


@pytest.mark.tl
def test_what_cannot_change_on_resume_is_refused_in_the_flags_units(own_run, tmp_path, capsys):
    """Resuming with another --max-checkpoint-mb says MB, not bytes; another --prompt-length
    is refused naming the folder's; --steps auto with a --budget below what is recorded is
    refused, a larger one said; --download-dir with --keep-checkpoints is refused."""
    root, _ = own_run
    args = ["record", "--checkpoints", str(root / "ckpt"), "--tokens",
            str(root / "eval.safetensors"), "--out", str(tmp_path / "t")]  # fmt: skip
    assert main([*args, "--steps", "0,10"]) == 0
    capsys.readouterr()
    assert main([*args, "--max-checkpoint-mb", "32"]) == 2
    err = capsys.readouterr().err
    assert "--max-checkpoint-mb 64 MB there, 32 MB here" in err and "32000000" not in err, err
    assert main([*args, "--prompt-length", "0"]) == 2
    err = capsys.readouterr().err
    assert "prompt of 25 tokens, and prompt_length=, --prompt-length here (0) asks" in err, err
    assert Trajectory.load(tmp_path / "t").steps.tolist() == [0, 10]
    auto = [*args[:-1], str(tmp_path / "auto"), "--steps", "auto"]
    assert main([*auto, "--budget", "3"]) == 0
    capsys.readouterr()
    assert main([*auto, "--budget", "2"]) == 2
    err = capsys.readouterr().err
    assert (
        "3 recordings of these checkpoints, more than budget=, --budget allows (2; it was 3)" in err
    ), err
    assert main([*auto, "--budget", "4"]) == 0
    assert "placement: budget 4 (it was 3; 3 recorded so far)" in capsys.readouterr().out
    assert main([*args, "--download-dir", str(tmp_path / "d"), "--keep-checkpoints"]) == 2
    assert "download_dir=, --download-dir and keep_checkpoints=True" in capsys.readouterr().err


def test_a_closed_output_pipe_ends_quietly():
    """`scansnap theory ... | head -1`: the reader goes away; no traceback, no error line."""
    code = "import sys; from scansnap_lens.cli import main; sys.exit(main(sys.argv[1:]))"
    args = ["theory", "--K", "2", "--M", "33", "--lr-y", "1", "--lr-z", "1", "--points", "5000"]
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.readline()
    proc.stdout.close()  # as head does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_an_interrupt_at_any_moment_exits_130_without_a_traceback():
    """SIGINT while the libraries load (the first seconds) or while a command runs."""
    import signal
    import subprocess
    import sys
    import time

    # "ready" once main is in place: however loaded the machine, each signal lands inside
    # main (while it loads the libraries, or runs), never in Python's own start-up
    script = [sys.executable, "-c", "import sys; from scansnap_lens.cli import main; "
              "print('ready', file=sys.stderr, flush=True); sys.exit(main())", "theory", "--K",
              "2", "--M", "33", "--lr-y", "1", "--lr-z", "1", "--points", "100000", "--t-max",
              "1e9"]  # fmt: skip

    def in_a_terminal():  # Ctrl-C as a terminal gives it, wherever pytest runs (a background
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # job ignores it, and so its children)

    for delay in (0.05, 0.2, 0.6, 1.2, 2.0):
        process = subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   preexec_fn=in_a_terminal)  # fmt: skip
        assert process.stderr.readline() == b"ready\n"
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        if process.returncode == 0:
            continue  # it finished first
        assert process.returncode == 130, err.decode()
        assert "Traceback" not in err.decode() and "interrupted" in err.decode()


def test_an_interrupt_that_surfaces_as_another_error_exits_130(monkeypatch, capsys):
    """Ctrl-C inside a C extension's import comes out as that import's error (matplotlib's
    "initialization failed"): still an interrupt (130), not bad input (2)."""
    import signal

    from scansnap_lens import cli

    def interrupted_import(args):
        try:
            signal.raise_signal(signal.SIGINT)  # the handler runs before the next line
            raise AssertionError("the interrupt did not arrive")
        except KeyboardInterrupt:
            raise ImportError("initialization failed") from None  # as the extension reports it

    monkeypatch.setattr(cli, "_theory", interrupted_import)
    # main takes Ctrl-C over where the handler is Python's own; another test or library may
    # have left another one
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.default_int_handler)
    assert cli.main(["theory", "--K", "2", "--M", "33", "--lr-y", "1", "--lr-z", "1"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "initialization failed" not in err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # given back


@pytest.mark.tl
def test_files_a_user_gets_wrong_are_named(demo_out, own_run, tmp_path, capsys):
    """Each exits 2 with the file and what is wrong with it (in CLI words), no traceback."""
    import shutil

    out, _ = demo_out
    root, _ = own_run
    binary = tmp_path / "latin1.txt"
    binary.write_bytes(b"\xff\xfe caf\xe9")
    no_meta = tmp_path / "traj"
    shutil.copytree(out / "trajectory", no_meta)
    manifest = json.loads((no_meta / "manifest.json").read_text())
    del manifest["meta"]
    (no_meta / "manifest.json").write_text(json.dumps(manifest))
    stats = tmp_path / "s.safetensors"
    assert main(["stats", str(root / "corpus.safetensors"), "--out", str(stats)]) == 0
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    cases = [
        (["stats", str(binary), "--out", str(tmp_path / "x")], "latin1.txt is not UTF-8 text"),
        (["report", str(no_meta), "--stats", str(stats)], "manifest lacks 'meta'"),
        (["report", str(out / "trajectory"), "--stats", str(stats), "--out", str(a_file)],
         "a_file is a file, not a folder"),
        (["stats", "--dataset", str(tmp_path), "--out", str(tmp_path / "y"), "--ray"],
         "needs its vocabulary size (vocab_size=, --vocab-size)"),
    ]  # fmt: skip
    capsys.readouterr()
    for args, message in cases:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


@pytest.mark.tl
def test_a_second_recording_process_fails_at_once(own_run, tmp_path, capsys):
    """The folder's recording lock: another process holding it stops `record` before anything
    is read or written; a killed holder leaves no stale lock; one process shares it (a
    notebook that builds a second Recorder for the same folder)."""
    import time

    from scansnap_lens.recording.recorder import Recorder

    root, _ = own_run
    args = ["record", "--checkpoints", str(root / "ckpt"), "--tokens"]
    args += [str(root / "eval.safetensors"), "--out", str(tmp_path / "t")]
    assert main([*args, "--steps", "0,10"]) == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from scansnap_lens.recording.storage import "
         "RecordingLock; RecordingLock(sys.argv[1]).acquire(); print('held', flush=True); "
         "time.sleep(120)", str(tmp_path / "t")],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == b"held"
        manifest = (tmp_path / "t" / "manifest.json").read_bytes()
        start = time.monotonic()
        assert main(args) == 2
        # at once, not after waiting for the holder (which sleeps 120 s); the bound leaves room
        # for a machine loaded many times over
        assert time.monotonic() - start < 60
        err = capsys.readouterr().err
        assert f"being recorded by another process (pid {holder.pid})" in err
        assert (tmp_path / "t" / "manifest.json").read_bytes() == manifest
    finally:
        holder.kill()
        holder.wait()
    assert main(args) == 0  # the killed holder's lock went with its process
    assert Trajectory.load(tmp_path / "t").steps.tolist() == [0, 10, 20, 40]

    from scansnap_lens.inputs.tokens import read_tokens
    from scansnap_lens.recording.plan import plan_recording

    tokens, plan = read_tokens(root / "eval.safetensors"), Trajectory.load(tmp_path / "t").plan
    first = Recorder(tmp_path / "t", tokens, QUIET, plan=plan)
    second = Recorder(tmp_path / "t", tokens, QUIET, plan=plan)  # same process: shared
    assert first.lock.held and second.lock.held
    first.close()
    assert second.lock.held
    second.close()
    # a recorder refused by the folder (another plan) does not keep it locked
    with pytest.raises(ValueError, match="another plan"):
        Recorder(tmp_path / "t", tokens[:4], plan=plan_recording(tokens[:4], plan.vocab_size))
    probe = ("import sys; from scansnap_lens.recording.storage import RecordingLock; "
             "RecordingLock(sys.argv[1]).acquire()")  # fmt: skip
    subprocess.run([sys.executable, "-c", probe, str(tmp_path / "t")], check=True)


def _config_variant(root, tmp, edit):
    folder = tmp / "variant"
    shutil.copytree(root / "ckpt", folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config.get("config", config))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.tl
def test_more_inputs_a_user_gets_wrong(own_run, tmp_path, capsys):
    """(what is wrong, arguments, exit code, what the message says or what happens): config
    fields, unsigned token files, statistics pruned to nothing, an output that cannot be
    written.  Exit 2 with the file named and no traceback, or a stated behaviour."""
    import numpy as np

    root, _ = own_run
    ev = str(root / "eval.safetensors")
    np.save(tmp_path / "u16.npy", np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.uint16))
    np.save(tmp_path / "u64.npy", np.array([[1, 2, 3, 2**63 + 5]], dtype=np.uint64))
    pruned, empty = tmp_path / "pruned.safetensors", tmp_path / "empty.safetensors"
    from dataclasses import replace

    from scansnap_lens.inputs.tokens import read_tokens
    from scansnap_lens.statistics.corpus import cooccurrence

    counted = cooccurrence(read_tokens(root / "corpus.safetensors"), own_run[1].vocab_size)
    none = torch.zeros(0, dtype=torch.long)
    offsets = torch.zeros(counted.num_classes + 1, dtype=torch.long)
    replace(counted, token=none, count=none, offsets=offsets, _index=None).save(empty)
    traj = tmp_path / "traj"
    assert main(["record", "--checkpoints", str(root / "ckpt"), "--tokens", ev, "--out",
                 str(traj), "--steps", "0,40"]) == 0  # fmt: skip

    def record(edit):
        out = str(tmp_path / "t")
        return lambda: ["record", "--checkpoints", str(_config_variant(root, tmp_path, edit)),
                        "--tokens", ev, "--out", out, "--steps", "0,40"]  # fmt: skip

    cases = [
        ("config.json lacks a field", record(lambda c: c.pop("d_model")), 2,
         "the model config does not build a model (the model config lacks d_model)"),
        ("config.json field of the wrong type", record(lambda c: c.update(n_layers="two")), 2,
         "config.json: n_layers must be a positive integer, got 'two'"),
        ("config.json with a negative size", record(lambda c: c.update(d_model=-4)), 2,
         "config.json: d_model must be a positive integer, got -4"),
        ("config.json with no heads", record(lambda c: c.update(n_heads=0)), 2,
         "config.json: n_heads must be a positive integer, got 0"),
        ("config.json with a fractional size", record(lambda c: c.update(d_head=3.5)), 2,
         "config.json: d_head must be a positive integer, got 3.5"),
        ("config.json with an unknown field: ignored (configs of newer versions load)",
         record(lambda c: c.update(frobnicate=3)), 0, "2 checkpoints recorded"),
        ("uint16 token file: read as the ids it holds",
         lambda: ["stats", str(tmp_path / "u16.npy"), "--out", str(tmp_path / "s16")], 0,
         "4 events, 4 classes (m, n), 6 co-occurrences over a vocabulary of 9"),
        ("uint64 ids beyond int32",
         lambda: ["stats", str(tmp_path / "u64.npy"), "--out", str(tmp_path / "s64")], 2,
         "u64.npy is not a readable token file (token id 9223372036854775813 is beyond"),
        ("statistics pruned to nothing: refused before anything is written",
         lambda: ["stats", str(root / "corpus.safetensors"), "--out", str(pruned),
                  "--min-count", "1000000"], 2,
         "min_count 1000000 prunes every co-occurrence (the most frequent is counted"),
        ("report on statistics without a co-occurrence: written, and says why",
         lambda: ["report", str(traj), "--stats", str(empty), "--out", str(tmp_path / "r")],
         0, "the statistics hold no co-occurrence (C(m, n, l) is empty)"),
        ("an output that cannot be written",
         lambda: ["stats", str(root / "corpus.safetensors"), "--out", "/proc/s.safetensors"],
         2, "cannot write /proc/s.safetensors"),
    ]  # fmt: skip
    capsys.readouterr()
    for what, args, code, message in cases:
        shutil.rmtree(tmp_path / "variant", ignore_errors=True)
        shutil.rmtree(tmp_path / "t", ignore_errors=True)
        assert main(args()) == code, what
        out = capsys.readouterr()
        assert message in out.out + out.err and "Traceback" not in out.err, (what, out.err)


@pytest.mark.tl
def test_report_compares_three_seeds_and_refuses_another_plan(own_run, tmp_path, capsys):
    """`scansnap report A B C`: three seeds of the run, recorded alike, compared head by head;
    a run recorded with other queries is refused, naming the difference."""
    root, classes = own_run
    sample = sequence_sampler(classes, seq_len=24)
    stats = tmp_path / "stats.safetensors"
    assert main(["stats", str(root / "corpus.safetensors"), "--out", str(stats),
                 "--vocab-size", str(classes.vocab_size)]) == 0  # fmt: skip
    runs = []
    for seed in range(3):
        model = attention_only_model(classes.vocab_size, d_model=16, n_ctx=32, seed=seed)
        train(model, sample, num_steps=40, lr_y=0.1, lr_z=3.0, batch_size=32,
              save_steps=[0, 10, 20, 40], out=tmp_path / f"seed{seed}" / "ckpt",
              loss_on="last", progress=False, seed=seed)  # fmt: skip
        runs.append(tmp_path / f"seed{seed}" / "trajectory")
        assert main(["record", "--checkpoints", str(tmp_path / f"seed{seed}" / "ckpt"),
                     "--tokens", str(root / "eval.safetensors"), "--stats", str(stats),
                     "--out", str(runs[-1])]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "runs"
    assert main(["report", *map(str, runs), "--stats", str(stats), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "3 runs: seed0, seed1, seed2" in printed and "report:" in printed
    table = pd.read_csv(out / "across_runs.csv")
    per_run = pd.read_csv(out / "per_run.csv")
    assert len(table) == len(per_run) / 3 and table["runs"].eq(3).all()
    for run in ("seed0", "seed1", "seed2"):  # each run's verdict, as its own report says it
        alone = tmp_path / f"{run}_report"
        assert main(["report", str(tmp_path / run / "trajectory"), "--stats", str(stats),
                     "--out", str(alone)]) == 0  # fmt: skip
        rows = json.loads((alone / "summary.json").read_text())["summary"]
        assert table[f"verdict_{run}"].tolist() == [row["verdict"] for row in rows]
    for name in ("runs.html", "figures/runs_auroc.png", "figures/runs_map_bias.png"):
        assert (out / name).stat().st_size > 0
    # which runs share what: the seeds train kept, or a design the user gives
    design = pd.read_csv(out / "design.csv")
    assert design["said"].eq("the recording's seeds").all() and design["init"].nunique() == 3
    given = tmp_path / "design.csv"
    given.write_text("run,init,data\nseed0,a,x\nseed1,a,y\nseed2,b,x\n")
    shared = tmp_path / "runs_shared"
    assert main(["report", *map(str, runs), "--stats", str(stats), "--out", str(shared),
                 "--design", str(given)]) == 0  # fmt: skip
    assert pd.read_csv(shared / "design.csv")["said"].eq("given").all()
    assert "from 2 initial weights and 2 data orders" in capsys.readouterr().out
    given.write_text("run,seed\nseed0,1\n")
    assert main(["report", *map(str, runs), "--stats", str(stats), "--out", str(shared),
                 "--design", str(given)]) == 2  # fmt: skip
    assert "a design needs columns run, init and data" in capsys.readouterr().err
    # another plan: the same checkpoints recorded with other queries
    other = tmp_path / "other"
    record = ["record", "--checkpoints", str(tmp_path / "seed0" / "ckpt"), "--tokens",
              str(root / "eval.safetensors"), "--queries", "3", "--out", str(other)]  # fmt: skip
    assert main(record) == 0
    capsys.readouterr()
    code = main(["report", str(runs[0]), str(other), "--stats", str(stats), "--out",
                 str(tmp_path / "refused")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "runs 'trajectory' and 'other' differ in their tracked queries (" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--stats", "s1", "s2", "--out", "o"], "give one --stats for every run, or one for each"),
        (["--stats", "s1"], "several runs need --out, the folder of their comparison"),
    ],
)
def test_report_of_several_runs_says_what_is_missing(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "a", "b", "c", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_run_given_twice_is_refused_by_name(tmp_path, capsys, monkeypatch):
    """The same folder twice, or once and once through a link, would compare a run with
    itself (it reported one run, silently)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").symlink_to(tmp_path / "a", target_is_directory=True)
    for second, named in (("a", "a"), ("./a", "a"), ("b", "b")):
        assert main(["report", "a", second, "--stats", "s", "--out", "o"]) == 2
        err = capsys.readouterr().err
        assert f"a and {named} are the same run" in err and "Traceback" not in err


def test_the_report_options_are_the_settings_fields(capsys):
    """`scansnap report`'s options are generated from the settings values the library reads:
    their defaults are the library's, and each option lands in its field."""
    from scansnap_lens.cli import _settings, build_parser
    from scansnap_lens.measures.settings import AnalysisSettings
    from scansnap_lens.models.training import Rates
    from scansnap_lens.statistics.groups import Classification

    parser = build_parser()
    plain = parser.parse_args(["report", "traj", "--stats", "stats"])
    assert _settings(plain, Classification) == Classification()
    assert _settings(plain, AnalysisSettings) == AnalysisSettings()
    given = parser.parse_args([
        "report", "traj", "--stats", "stats", "--no-guard", "--purity", "0.9", "--scope",
        "global", "--theory-classes", "all", "--no-theory", "--lr-y", "0.1", "--lr-z", "2",
        "--optimizer", "adam",
    ])  # fmt: skip
    assert _settings(given, Classification) == Classification("global", purity=0.9, guard=False)
    assert _settings(given, AnalysisSettings) == AnalysisSettings(theory=False,
                                                                  theory_classes=None)  # fmt: skip
    assert _settings(given, Rates) == Rates(0.1, 2.0, "adam")
    limit = parser.parse_args(["report", "traj", "--stats", "stats", "--theory-seconds", "0"])
    assert _settings(limit, AnalysisSettings).theory_seconds == 0.0  # 0: no limit
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["report", "traj", "--stats", "stats", "--theory-seconds", "-1"])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and "--theory-seconds" in error and "-1" in error, error
    assert "Traceback" not in error


def test_every_numeric_setting_option_is_read_as_its_fields_kind():
    """Each setting's option is read by the reader its field declares (`setting(reads=)`): a
    number field is never handed the option's text (`--max-shared 0` reached Classification
    as the string '0' and was refused)."""
    import dataclasses

    from scansnap_lens._settings import options
    from scansnap_lens.cli import _settings, build_parser
    from scansnap_lens.measures.settings import AnalysisSettings
    from scansnap_lens.models.training import Rates
    from scansnap_lens.recording.settings import RecordingSettings
    from scansnap_lens.statistics.groups import Classification

    for cls in (RecordingSettings, Classification, AnalysisSettings, Rates):
        kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        for option in options(cls):
            if any(k in kinds[option["name"]] for k in ("int", "float")):
                assert option["reads"] is not str, (cls.__name__, option["name"])
    given = build_parser().parse_args(
        ["report", "traj", "--stats", "stats", "--max-shared", "0", "--min-support", "2"]
    )
    assert _settings(given, Classification) == Classification(min_support=2, max_shared=0)


def test_building_the_parser_imports_no_measurement():
    """Every command builds the whole parser, the report's options from `AnalysisSettings`:
    that must not import the measurements and scipy (about a second of every command)."""

    code = (
        "import sys; from scansnap_lens.cli import build_parser; build_parser();"
        " print(sorted(m for m in ('scansnap_lens.measures.catalog', 'scansnap_lens.measures.fit',"
        " 'scansnap_lens.reading.analysis', 'scipy.stats') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)  # fmt: skip
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--power", "0.7"], "--power chooses one run's rows"),
        (["--steps", "auto"], "--steps auto places each run's own checkpoints"),
    ],
)
def test_a_suite_refuses_what_its_runs_cannot_share(tmp_path, capsys, extra, message):
    """Several repositories record the same rows and steps in each run: options that choose
    them per run are refused before anything is fetched, and a name given twice too."""
    record = ["record", "--model", "EleutherAI/pythia-14m-seed{1..2}", "--tokens", "t",
              "--out", str(tmp_path / "suite")]  # fmt: skip
    assert main([*record, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "suite").exists()
    twice = ["record", "--model", "a/m-seed{1..2}", "a/m-seed2", "--tokens", "t", "--out", "o"]
    assert main(twice) == 2
    assert "a/m-seed2 is given twice" in capsys.readouterr().err
