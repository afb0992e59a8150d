"""Every benchmark runs, in a quick mode (small shapes, no goal checked), so none can rot
unseen: each prints its JSON line(s) and exits 0.  The figures are the benchmarks' own, at
the shapes users have (analyses/benchmarks, docs/scale.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scansnap_lens.models.backend import tl_major

BENCHMARKS = Path(__file__).resolve().parents[1] / "analyses" / "benchmarks"
QUICK = {  # the arguments that make each one small
    "bench_calibration.py": ["--trajectories", "1"],
    "bench_classify.py": ["--quick"],
    "bench_cooccurrence.py": ["--quick", "--reference-tokens", "2000"],
    "bench_fuzz_folders.py": ["--quick"],
    "bench_device.py": ["--quick", "--rounds", "1", "--device", "cpu"],
    "bench_plan_power.py": ["--quick"],
    "bench_population.py": ["--quick", "--family", "transformer_b64"],
    "bench_pythia.py": ["--quick"],
    "bench_record.py": ["--quick"],
    "bench_report.py": ["--quick", "--case", "words"],  # the BPE run is the rehearsal's
    "bench_runs.py": ["--quick"],
    "bench_scale.py": ["--sizes", "2e4", "--shards", "2"],
    "bench_sweep.py": ["--quick", "--revisions", "2", "--rows", "2"],
    "bench_time_resolution.py": ["--quick"],
    "bench_uncertainty.py": ["--layers", "1", "--heads", "2"],
}

pytestmark = pytest.mark.slow


def test_every_benchmark_has_a_quick_mode():
    assert sorted(QUICK) == sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))


@pytest.fixture
def little_text(shared_dir, tmp_path) -> Path:
    """A stand-in for ../shared with the first 600 lines of WikiText-2 valid and test (about
    30 k words each: bench_uncertainty's 64 rows of 512): what the benchmarks read, small."""
    root = tmp_path / "shared"
    (root / "data" / "wikitext-2").mkdir(parents=True)
    for name in ("valid.txt", "test.txt"):
        lines = (shared_dir / "data" / "wikitext-2" / name).read_text().splitlines(True)
        (root / "data" / "wikitext-2" / name).write_text("".join(lines[:600]))
    return root


# Not marked tl though the benchmarks build models (in subprocesses): one major is enough, as
# they run the library code that the tl-marked tests check under both majors.
@pytest.mark.skipif(tl_major() < 4, reason="the benchmarks' quick run is CI's under TL 4")
@pytest.mark.parametrize("script", sorted(QUICK))
def test_the_benchmark_runs_in_its_quick_mode(script, little_text):
    if script == "bench_scale.py":
        pytest.importorskip("ray")
    args = [*QUICK[script]]
    if "--shared" in (BENCHMARKS / script).read_text():
        args += ["--shared", str(little_text)]
    command = [sys.executable, str(BENCHMARKS / script), *args]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert any(_is_json(line) for line in done.stdout.splitlines()), done.stdout[-2000:]


def _is_json(line: str) -> bool:
    """A benchmark's result line (a Trainer's log lines are Python dicts, not JSON)."""
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


@pytest.mark.tl
def test_the_batched_transformer_is_the_recorders(tmp_path):
    """bench_time_resolution trains and reads many seeds of the demo's transformer in one
    batched forward; each seed's c_hat equals what the `Recorder` records on that seed's own
    model trained by `train`, at every step (float32: a few ulps of the values)."""
    import torch

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_time_resolution as bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    seeds, last = [0, 3], 8
    batched, plan = bench.batched_transformer_c_hat(seeds, last)
    recorded, plan_again = bench.transformer_c_hat(seeds, last, tmp_path)
    assert plan.same_as(plan_again)
    assert batched.shape == recorded.shape == (last + 1, 1, len(seeds), plan.num_triples)
    assert bool((batched[-1] != batched[0]).any())  # the models moved
    tol = 64 * torch.finfo(torch.float32).eps * float(recorded.abs().max())
    torch.testing.assert_close(batched, recorded, rtol=0, atol=tol)
    # the same initial weights with other batches: equal at step 0, apart once trained;
    # one run's initial weights with its own batches: the run above
    again, _ = bench.batched_transformer_c_hat([5, 3], last, init_seeds=[0, 3])
    assert torch.equal(again[0, :, 0], batched[0, :, 0])
    assert bool((again[-1, :, 0] != batched[-1, :, 0]).any())
    assert torch.equal(again[:, :, 1], batched[:, :, 1])


def test_a_family_draw_is_read_back_from_its_cache_as_trained(tmp_path):
    """bench_time_resolution --family --cache: a draw's runs and its truth's means are written
    once and read back equal (a new reading is checked on the same family without training
    it again); a file of another recipe is refused, not read as this one."""
    import torch

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_time_resolution as bench
    finally:
        sys.path.remove(str(BENCHMARKS))
    import numpy as np

    config = bench.family_config(np.random.default_rng(0))
    where = tmp_path / "draw.safetensors"
    c, plan, means = bench.family_draw(config, 2, 16, 40, where)
    assert c.shape == (41, 1, 2, plan.num_triples) and sorted(means) == [16]
    assert means[16].shape == (41 // bench.TRUTH_EVERY + 1, 1, 1, plan.num_triples)
    again, plan_again, means_again = bench.family_draw(config, 2, 16, 40, where)
    assert plan_again.same_as(plan)
    assert torch.equal(again, c) and torch.equal(means_again[16], means[16])
    other = {**config, "lr_z": config["lr_z"] * 2}
    with pytest.raises(ValueError, match="another recipe"):
        bench.family_draw(other, 2, 16, 40, where)
    with pytest.raises(ValueError, match="truth"):  # the truth over other runs
        bench.family_draw(config, 2, 32, 40, where)
