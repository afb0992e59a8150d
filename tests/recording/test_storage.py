"""The trajectory folder read lazily: a loaded trajectory maps its checkpoint files, serves
steps and slots by indexing, measures and reports the same numbers as one held in memory,
and never loads all of zbar or c_hat to do so."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from _tiny import QUIET

from scansnap_lens.demo import DEMO_DATA
from scansnap_lens.lab.synthetic import sequence_sampler
from scansnap_lens.measures import measure_all
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.models.training import attention_only_model
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.recording.storage import StepStack
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.report import write_report
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import TokenGroups

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it


def _demo_groups():
    """The demo's own groups (its training corpus's statistics)."""
    classes = DEMO_DATA["syn-medium"]()
    corpus = sequence_sampler(classes)(512, torch.Generator().manual_seed(1))
    stats = cooccurrence(corpus, classes.vocab_size, queries=classes.query.unique().tolist())
    return TokenGroups.from_statistics(stats, min_distinct=1, scope="global"), stats


def test_indexing_a_loaded_trajectory_reads_what_it_selects(demo_out):
    out, _ = demo_out
    lazy = Trajectory.load(out / "trajectory")
    assert all(isinstance(v, StepStack) for v in lazy.values.values())
    c_hat = lazy.c_hat.full()
    S, L, H, P = c_hat.shape
    assert lazy.c_hat.shape == (S, L, H, P) and S == 15
    slots = torch.tensor([P - 1, 0, 3])
    mask = torch.arange(P) % 2 == 0
    for key in (3, -1, slice(2, 9, 3), [0, 4], (..., slots), (..., mask), (slice(None), 0),
                (slice(1, 3), 0, 0, slots)):  # fmt: skip
        assert torch.equal(lazy.c_hat[key], c_hat[key]), key
    assert torch.equal(lazy.zbar - lazy.zbar[:1], lazy.zbar.full() - lazy.zbar.full()[:1])
    assert torch.equal(torch.stack([lazy.entropy, lazy.entropy]).sum(0), 2 * lazy.entropy.full())
    assert lazy.c_hat.double().dtype == torch.float64  # tensor methods load the whole stack
    assert "StepStack(shape=(15," in repr(lazy.c_hat)


def test_measurements_and_the_report_of_a_loaded_trajectory_load_no_whole_stack(
    demo_out, tmp_path, monkeypatch
):
    out, _ = demo_out
    groups, stats = _demo_groups()
    lazy = Trajectory.load(out / "trajectory")
    eager = lazy.replace(**{k: v.full() for k, v in lazy.values.items()},
                         prompt_pattern=lazy.prompt_pattern.full())  # fmt: skip
    want, _ = measure_all(eager, groups)

    def whole(self):
        raise AssertionError("a measurement loaded every checkpoint of zbar or c_hat")

    for name in ("zbar", "c_hat"):  # the large ones; entropies are per class and query
        monkeypatch.setattr(getattr(lazy, name), "full", whole.__get__(getattr(lazy, name)))
    got, _ = measure_all(lazy, groups)
    assert got.keys() == want.keys()
    for name in want:
        pd.testing.assert_frame_equal(got[name].table, want[name].table)
    report = write_report(Analysis.of(lazy, groups, source=stats), tmp_path / "report")
    assert (report.path).exists()


def test_steps_of_thirteen_digits_and_more_record_resume_and_load(tmp_path):
    """Runs counted in tokens reach 10^12 steps: their files take more than 12 digits."""
    V = 12
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, V)
    models = {s: attention_only_model(V, d_model=8, n_ctx=16, seed=i)
              for i, s in enumerate((0, 10**12, 3 * 10**15))}  # fmt: skip
    first = Recorder(
        tmp_path / "t", tokens, RecordingSettings(progress=False, step_unit="tokens"), plan=plan
    )
    first.record(in_memory({s: m for s, m in models.items() if s < 10**15}))
    traj = Recorder(
        tmp_path / "t", tokens, RecordingSettings(progress=False, step_unit="tokens"), plan=plan
    ).record(in_memory(models))
    assert traj.steps.tolist() == [0, 10**12, 3 * 10**15]
    names = sorted(p.name for p in (tmp_path / "t" / "checkpoints").iterdir())
    assert names[-1] == "step_3000000000000000.safetensors"
    again = Trajectory.load(tmp_path / "t")
    assert torch.equal(again.zbar.full(), traj.zbar.full())
    # step 0's entry naming step 1's file (whose name begins like step 0's) is refused
    manifest = (tmp_path / "t" / "manifest.json").read_text()
    bad = manifest.replace("step_000000000000.", "step_0000000000001.")
    (tmp_path / "t" / "manifest.json").write_text(bad)
    with pytest.raises(ValueError, match="names the file of another step"):
        Trajectory.load(tmp_path / "t")


def test_a_truncated_checkpoint_is_named_and_a_resumed_recording_records_it_again(tmp_path, capsys):
    """A partial copy of a checkpoint file: loading names the file and the way out (was:
    "mmap length is greater than file size"), and running the recording again records that
    checkpoint anew, giving what the whole recording gave."""
    V = 12
    tokens = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, V)
    models = in_memory({s: attention_only_model(V, d_model=8, n_ctx=16, seed=s) for s in (0, 5)})
    whole = Recorder(tmp_path / "t", tokens, QUIET, plan=plan).record(models)
    zbar, c_hat = whole.zbar.full().clone(), whole.c_hat.full().clone()  # before the cut
    file = tmp_path / "t" / "checkpoints" / "step_000000000005.safetensors"
    file.write_bytes(file.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"step_000000000005.safetensors is truncated .*again"):
        Trajectory.load(tmp_path / "t")
    again = Recorder(tmp_path / "t", tokens, QUIET, plan=plan).record(models)
    assert "checkpoint 5 is truncated" in capsys.readouterr().out
    assert torch.equal(again.zbar.full(), zbar)
    assert torch.equal(Trajectory.load(tmp_path / "t").c_hat.full(), c_hat)


def test_a_folder_written_by_this_version_loads_with_its_values(tmp_path):
    """tests/data/trajectory_v1 was written by `tests/data/make_trajectory_v1.py` with this
    version; a change of the disk format (names, layout, metadata) that strands users'
    folders fails here.  Its values are those a recording of the same models gives now."""
    import importlib.util
    from pathlib import Path

    data = Path(__file__).parents[1] / "data"
    spec = importlib.util.spec_from_file_location("make_v1", data / "make_trajectory_v1.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    saved = Trajectory.load(data / "trajectory_v1")
    assert saved.steps.tolist() == [0, 10, 10**12] and saved.step_unit == "steps"
    assert saved.plan.queries.tolist() == [1, 2, 3] and saved.plan.window == 4
    assert saved.meta["lr_y"] == 0.1 and saved.prompt.numel() == 6
    from scansnap_lens.recording.recorder import record_trajectory

    now = record_trajectory(
        in_memory(make.models()),
        make.tokens(),
        tmp_path / "now",
        RecordingSettings(queries=[1, 2, 3], window=4, prompt_length=6, progress=False),
    )
    assert saved.plan.same_as(now.plan)
    assert list(saved.values) == ["zbar", "c_hat", "entropy", "query_entropy"]
    for name in (*saved.values, "prompt_pattern"):  # float32 sums of a handful of terms
        torch.testing.assert_close(getattr(saved, name).full(), getattr(now, name).full(),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
