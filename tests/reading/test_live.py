"""Scan and snap while the model trains (`reading.live`): each checkpoint's metrics are the
report's own figures at that checkpoint, events come where the report later places them,
a Trainer's TensorBoard logger receives both (read back with TensorBoard's reader), a run
stops after the events named, and a report of a run still recording is the final one
restricted to its checkpoints so far."""

from __future__ import annotations

import math
import os

import pytest
import torch
from _tiny import QUIET, planted_run

from scansnap_lens.measures.discriminative import discriminative_bias
from scansnap_lens.measures.entropy import attention_entropy
from scansnap_lens.measures.frequency import frequency_bias
from scansnap_lens.measures.head_types import head_type
from scansnap_lens.measures.settings import AnalysisSettings
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.reading.live import Live, LiveSettings
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import Classification, TokenGroups

pytestmark = pytest.mark.tl
QUIET_LIVE = LiveSettings(per_head=True, say=False)


LAB = Classification("global", min_distinct=1)  # the demo's: Sec. 3.2, global scope


def _lab(rows: int = 24):
    """(eval rows, statistics, model_at(seed)) of the paper's Syn-Small (V = 34): rows of a
    context, a query and its next token; a 2-layer, 3-head attention-only model per seed."""
    from scansnap_lens.lab.synthetic import sequence_sampler, syn_small
    from scansnap_lens.models.training import attention_only_model

    classes = syn_small()
    sample = sequence_sampler(classes, seq_len=15)
    stats = cooccurrence(sample(512, torch.Generator().manual_seed(1)), classes.vocab_size,
                         queries=classes.query.unique().tolist())  # fmt: skip

    def model_at(seed: int):
        return attention_only_model(classes.vocab_size, d_model=24, n_heads=3, n_layers=2,
                                    n_ctx=32, seed=seed)  # fmt: skip

    return sample(rows, torch.Generator().manual_seed(2)), stats, model_at


def test_each_checkpoints_metrics_are_the_reports_figures_at_that_checkpoint(tmp_path):
    """A plain loop over five checkpoints: every metric per head equals what the report's
    measurements give at that step on the finished trajectory (bias, AUROC, spearman,
    entropy, the head types' scores, the loss), the movement from the recorded c_hat; a
    SummaryWriter given as `to` holds them all."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    rows, stats, model_at = _lab()
    recorder = Recorder(tmp_path / "t", rows, QUIET, stats=stats)
    writer = SummaryWriter(str(tmp_path / "tb"))
    live = Live(recorder, QUIET_LIVE.replace(classification=LAB), to=writer)
    steps = [0, 3, 10, 30, 100]
    for step, seed in zip(steps, range(5)):
        out = live.on_checkpoint(step, model_at(seed))
        assert out == live.metrics[step]
    assert live.on_checkpoint(100, model_at(9)) is None  # recorded already
    writer.close()
    recorder.close()
    traj = Trajectory.load(tmp_path / "t")
    assert traj.recording is None
    groups = TokenGroups.from_statistics(stats, traj.plan.queries.tolist(), LAB)
    types = ("previous_token", "first_token", "induction")
    tables = [
        discriminative_bias(traj, groups).table,
        frequency_bias(traj, groups).table,
        attention_entropy(traj).table,
        *(head_type(traj, n).table for n in types),
    ]
    checked = 0
    for table in tables:
        for name in {"bias", "auroc", "spearman", "attention_entropy", "previous_token",
                     "first_token", "induction"} & set(table.columns):  # fmt: skip
            for row in table.to_dict("records"):
                got = live.metrics[int(row["step"])][
                    f"scansnap/layer{row['layer']}/head{row['head']}/{name}"
                ]
                want = float(row[name])
                assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(
                    want, rel=1e-9, abs=1e-12), (name, row["step"])  # fmt: skip
                checked += 1
    assert checked == 7 * len(steps) * 2 * 3
    for i, step in enumerate(steps):
        assert live.metrics[step]["scansnap/loss"] == pytest.approx(float(traj.loss[i]))
    from scansnap_lens.measures.snap import head_movement

    moved = head_movement(traj.plan, traj.c_hat[2].double(), traj.c_hat[3].double())
    assert live.metrics[30]["scansnap/layer1/head2/rate"] == pytest.approx(
        float(moved[1, 2]) / 20, rel=1e-9)  # fmt: skip
    assert "scansnap/layer0/head0/rate" not in live.metrics[0]

    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    for name in live.metrics[100]:
        seen = {e.step: e.value for e in board.Scalars(name)}
        want = {s: m[name] for s, m in live.metrics.items() if name in m}
        assert seen.keys() == want.keys()
        for s, value in want.items():
            assert math.isnan(value) or seen[s] == pytest.approx(value, rel=1e-6)  # float32


def _planted_run(tmp_path, steps, settings=QUIET_LIVE):
    """Checkpoints moving a random start to a planted circuit (layer 0 previous-token, layer
    1 induction) along a sigmoid centred on step 100, recorded through `Live`."""
    model_at, rows = planted_run()
    recorder = Recorder(tmp_path / "t", rows, RecordingSettings(queries="all", progress=False))
    live = Live(recorder, settings)
    for step in steps:
        live.on_checkpoint(step, model_at(step))
        if live.stop:
            break
    recorder.close()
    return live, Trajectory.load(tmp_path / "t")


def test_planted_heads_form_where_the_weights_made_them_and_the_report_agrees(tmp_path, capsys):
    """The planted previous-token and induction heads each get one formation event, seen
    soon after the sigmoid's midpoint (step 100), placed in the same checkpoint bracket as
    the finished run's report places it; the layer that never becomes an induction head
    gets none; each event is said in one console line."""
    steps = list(range(0, 201, 10))
    live, traj = _planted_run(tmp_path, steps, LiveSettings(per_head=True))
    events = {e.name: e for e in live.events}
    assert set(events) >= {"previous_token/layer0/head0", "induction/layer1/head0"}
    assert "induction/layer0/head0" not in events
    said = capsys.readouterr().out
    for name, layer in (("previous_token", 0), ("induction", 1)):
        event = events[f"{name}/layer{layer}/head0"]
        assert 100 < event.seen_at <= 140, event
        final = head_type(traj, name).final().set_index("layer").loc[layer]
        assert event.lo <= final[f"{name}_step"] <= event.hi, (event, final[f"{name}_step"])
        assert abs(event.step - final[f"{name}_step"]) <= 10
        assert event.sentence() in said
        at = live.metrics[event.seen_at]
        assert at[f"scansnap/layer{layer}/head0/{name}_step"] == event.step


def test_stop_when_ends_the_loop_once_every_named_event_happened(tmp_path):
    """stop_when=("induction",) stops the planted run at the checkpoint that showed it; a
    name that is no event is refused, naming the known ones."""
    steps = list(range(0, 201, 10))
    live, traj = _planted_run(tmp_path, steps, LiveSettings(stop_when=("induction",), say=False))
    seen = [e.seen_at for e in live.events if e.kind == "induction"]
    assert seen and int(traj.steps[-1]) == seen[0] < 200
    for wrong in ("snapped", "formation/layer0/head0"):
        with pytest.raises(ValueError, match=r"names no event.*snap, formation"):
            LiveSettings(stop_when=(wrong,))
    with pytest.raises(TypeError, match="settings must be LiveSettings"):
        Live(live.recorder, {"stop_when": ("snap",)})


def test_a_resumed_run_goes_on_as_if_it_had_not_stopped(tmp_path):
    """A run recorded through `Live` for three checkpoints, stopped, and resumed by a new
    recorder and a new `Live` on its folder: the later checkpoints' metrics (the changes
    since the folder's first checkpoint, the rate since the one before) are those of one
    uninterrupted run."""
    rows, stats, model_at = _lab()
    steps = [0, 3, 10, 30, 100]
    whole = Live(Recorder(tmp_path / "whole", rows, QUIET, stats=stats),
                 QUIET_LIVE.replace(classification=LAB))  # fmt: skip
    for step, seed in zip(steps, range(5)):
        whole.on_checkpoint(step, model_at(seed))
    whole.recorder.close()
    for part in (steps[:3], steps[3:]):
        recorder = Recorder(tmp_path / "parts", rows, QUIET, stats=stats)
        live = Live(recorder, QUIET_LIVE.replace(classification=LAB))
        for step in part:
            live.on_checkpoint(step, model_at(steps.index(step)))
        recorder.close()
    assert live.steps == steps
    for step in steps[3:]:
        assert live.metrics[step] == pytest.approx(whole.metrics[step], rel=1e-9, nan_ok=True)


def test_the_papers_run_snaps_live_where_the_finished_report_places_it(tmp_path):
    """The demo's run (the paper's 1-layer model on Syn-Medium, 250 steps, 15 log-spaced
    checkpoints) recorded through `Live` in `train`'s loop: the layer's snap event lies in
    the finished report's interval for it (a checkpoint past an early, lower peak once read
    27 where the finished run's is 125: a snap is told once the rate stays down), and the
    last checkpoint's scan figures are the report's."""
    from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium
    from scansnap_lens.models.training import attention_only_model, train
    from scansnap_lens.reading.runs import median_bounds

    classes = syn_medium(1)
    sample = sequence_sampler(classes)
    queries = classes.query.unique().tolist()
    stats = cooccurrence(sample(512, torch.Generator().manual_seed(1)), classes.vocab_size,
                         queries=queries)  # fmt: skip
    rows = sample(64, torch.Generator().manual_seed(2))
    model = attention_only_model(classes.vocab_size, d_model=32, n_heads=1, n_ctx=64, seed=0,
                                 normalization_type=None)  # fmt: skip
    recorder = Recorder(tmp_path / "t", rows, RecordingSettings(queries=queries, progress=False),
                        stats=stats)  # fmt: skip
    live = Live(recorder, LiveSettings(say=False, classification=LAB))
    train(model, sample, num_steps=250, lr_y=0.1, lr_z=3.0, batch_size=64, save_steps="log:15",
          loss_on="last", seed=0, progress=False, on_checkpoint=live.on_checkpoint)  # fmt: skip
    recorder.close()
    traj = Trajectory.load(tmp_path / "t")
    settings = AnalysisSettings(classification=LAB, theory=False)
    summary = Analysis.of(traj, source=stats, settings=settings).summary
    lo, hi = median_bounds(summary, "snap_step")
    (snap,) = [e for e in live.events if e.kind == "snap"]
    assert lo <= snap.step <= hi, (snap, lo, hi)
    assert snap.seen_at >= 1.5 * float(summary["snap_step"].iloc[0])
    last = live.metrics[traj.steps.tolist()[-1]]
    assert last["scansnap/layer0/auroc"] == pytest.approx(float(summary["auroc"].iloc[0]))


@pytest.mark.slow
def test_a_trainer_reporting_to_tensorboard_gets_the_metrics_and_events(tmp_path, monkeypatch):
    """A Hugging Face Trainer (GPT-NeoX, 1 layer x 2 heads, AdamW, batches of 32) on the
    paper's Syn-Medium, its loss on the next token, reporting to TensorBoard: TensorBoard's
    own reader finds every metric at every recorded step and the snap event at the step it
    was seen, which is the report's own reading of the checkpoints up to it and lies in the
    finished run's interval; with stop_when the Trainer stops at the checkpoint that showed
    it, and the Trainer's own logging goes on as before."""
    import transformers
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium
    from scansnap_lens.measures.snap import snapping
    from scansnap_lens.models.steps import select_steps
    from scansnap_lens.reading.runs import median_bounds

    classes, last = syn_medium(1), 100
    sample, queries = sequence_sampler(classes, seq_len=15), classes.query.unique().tolist()
    rows = sample(1024, torch.Generator().manual_seed(0))

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):  # the loss on the next token only, as the paper's
            labels = torch.full_like(rows[i], -100)
            labels[-1] = rows[i][-1]
            return {"input_ids": rows[i], "labels": labels}

    stats = cooccurrence(rows, classes.vocab_size, queries=queries)
    evaluation = sample(64, torch.Generator().manual_seed(2))

    def train(out, settings):
        monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(out / "tb"))
        torch.manual_seed(0)
        config = transformers.GPTNeoXConfig(
            vocab_size=classes.vocab_size, max_position_embeddings=rows.shape[1],
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        args = transformers.TrainingArguments(
            str(out / "ckpt"), max_steps=last, save_strategy="no", logging_steps=10,
            per_device_train_batch_size=32, learning_rate=3e-3, report_to=["tensorboard"],
            use_cpu=True, disable_tqdm=True, seed=0, data_seed=0, lr_scheduler_type="constant",
        )  # fmt: skip
        trainer = transformers.Trainer(
            model=transformers.AutoModelForCausalLM.from_config(config), args=args,
            train_dataset=Rows(),
        )  # fmt: skip
        recording = RecordingSettings(queries=queries, progress=False)
        recorder = Recorder(out / "traj", evaluation, recording, stats=stats)
        live = Live(recorder, settings.replace(classification=LAB))
        live.watch(trainer, steps=select_steps(list(range(last + 1)), "log:14"))
        trainer.train()
        recorder.close()
        return live, trainer, Trajectory.load(out / "traj")

    live, trainer, traj = train(tmp_path / "a", LiveSettings(say=False))
    assert traj.steps.tolist() == sorted(live.metrics)
    board = EventAccumulator(str(next((tmp_path / "a" / "tb").rglob("events.out.*")).parent))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    assert "train/loss" in tags  # the Trainer's own
    for name in ("auroc", "bias", "spearman", "rate", "distance", "attention_entropy",
                 "previous_token", "first_token", "induction", "loss"):  # fmt: skip
        key = f"scansnap/{name}" if name == "loss" else f"scansnap/layer0/{name}"
        logged = {e.step: e.value for e in board.Scalars(f"train/{key}")}
        want = {s: m[key] for s, m in live.metrics.items() if key in m}
        assert logged.keys() == want.keys() and len(want) >= len(traj.steps) - 1, name
        assert all(logged[s] == pytest.approx(v, rel=1e-5, nan_ok=True)
                   for s, v in want.items()), name  # fmt: skip
    (snap,) = live.events  # no head type forms on this task
    assert snap.kind == "snap"
    logged = board.Scalars("train/scansnap/layer0/snap_step")
    assert [(e.step, e.value) for e in logged] == [(snap.seen_at, pytest.approx(snap.step))]
    upto = [s for s in traj.steps.tolist() if s <= snap.seen_at]
    table = snapping(traj.select(steps=upto)).table  # as the report reads them
    assert snap.step == pytest.approx(float(table["snap_step"].dropna().median()))
    summary = Analysis.of(traj, source=stats, settings=AnalysisSettings(
        classification=LAB, theory=False)).summary  # fmt: skip
    lo, hi = median_bounds(summary, "snap_step")
    assert lo <= snap.step <= hi, (snap, lo, hi)

    stopped, trainer, traj = train(tmp_path / "b", LiveSettings(stop_when=("snap",), say=False))
    assert trainer.state.global_step == snap.seen_at < last
    assert int(traj.steps[-1]) == snap.seen_at
    assert stopped.events == live.events


def test_a_report_of_a_run_still_recording_is_the_final_one_restricted(tmp_path):
    """`scansnap report` on a folder a recorder is still writing (its lock held) reads the
    checkpoints so far, says the run is still going (page, summary.json, terminal), and
    its summary is the finished run's summary restricted to those checkpoints."""
    import json

    from scansnap_lens.cli import main

    rows, stats, model_at = _lab()
    stats.save(tmp_path / "stats.safetensors")
    recorder = Recorder(tmp_path / "t", rows, QUIET, stats=stats)
    steps = [0, 3, 10, 30, 100, 300]
    for step, seed in zip(steps[:4], range(4)):
        recorder.on_checkpoint(step, model_at(seed))
    assert Trajectory.load(tmp_path / "t").recording == str(os.getpid())
    args = ["report", str(tmp_path / "t"), "--stats", str(tmp_path / "stats.safetensors"),
            "--no-theory", "--scope", "global", "--min-distinct", "1"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "half")]) == 0
    page = (tmp_path / "half" / "report.html").read_text()
    assert "Still recording (process" in page and "first 4 checkpoints, to step 30" in page
    half = json.loads((tmp_path / "half" / "summary.json").read_text())
    assert half["recording"] == str(os.getpid()) and half["steps"] == steps[:4]
    for step, seed in zip(steps[4:], range(4, 6)):
        recorder.on_checkpoint(step, model_at(seed))
    recorder.close()
    final = Trajectory.load(tmp_path / "t")
    assert final.recording is None
    settings = AnalysisSettings(classification=LAB, theory=False)
    restricted = Analysis.of(final.select(steps=steps[:4]), source=stats,
                             settings=settings).summary  # fmt: skip
    got = json.loads(restricted.to_json(orient="records"))
    assert got == half["summary"]


def test_a_folder_another_process_records_into_reads_as_still_recording(tmp_path):
    """While another process holds a folder's recording lock, loading it names that process
    (the report says the run is still going) and changes nothing in the folder; once that
    process ends, the folder reads as finished."""
    import subprocess
    import sys
    import time

    rows, stats, model_at = _lab()
    recorder = Recorder(tmp_path / "t", rows, QUIET, stats=stats)
    recorder.on_checkpoint(0, model_at(0))
    recorder.close()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from scansnap_lens.recording.storage import RecordingLock\n"
        "RecordingLock(sys.argv[1]).acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"), str(tmp_path / "t")], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "t").iterdir())
        assert Trajectory.load(tmp_path / "t").recording == str(holder.pid)
        after = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "t").iterdir())
        assert after == before
    finally:
        holder.kill()
        holder.wait(timeout=30)
    deadline = time.monotonic() + 10
    while Trajectory.load(tmp_path / "t").recording is not None:  # the kill releases it
        assert time.monotonic() < deadline
        time.sleep(0.05)
