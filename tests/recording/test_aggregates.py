"""The table of recorded aggregates: the head types against a brute-force loop over
`run_with_cache` on both backends, a planted induction head, and a notebook's own aggregate
recorded, killed, resumed bit-identically and loaded."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _backends import BACKENDS
from _reference import _float64_copy, float32_tolerance
from _tiny import QUIET, V, planted_run, tiny_model

from scansnap_lens.measures.head_types import head_type
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.models.training import attention_only_model
from scansnap_lens.recording.aggregates import (
    AGGREGATES,
    DEFAULT,
    Aggregate,
    induction_positions,
    repeated_random_rows,
)
from scansnap_lens.recording.hooks import record_checkpoint
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.recording.trajectory import NotRecorded, Trajectory

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

# A notebook's own aggregate: the attention two positions back (defined here, as a user would).
TWO_BACK = Aggregate(
    "two_back",
    axis="rows",
    positions=lambda x: (
        torch.arange(x.shape[0]).repeat_interleave(max(x.shape[1] - 2, 0)),
        torch.arange(2, x.shape[1]).repeat(x.shape[0]),
        torch.arange(0, x.shape[1] - 2).repeat(x.shape[0]),
    ),
    doc="attention weight on the position two back, A[q, q - 2]",
)


def brute_force_rows(model, tokens) -> tuple[dict[str, torch.Tensor], float]:
    """[L, H, R] per head type: plain loops over the float64 attention of every position;
    and the float32 bound of a recorded weight against it (`_reference.float32_tolerance`'s
    c_hat, from the largest score)."""
    cfg = model.cfg
    exact = _float64_copy(model)
    _, cache = exact.run_with_cache(tokens)
    top = max(cache[f"blocks.{i}.attn.hook_attn_scores"].double().clamp_min(-1e4).abs().max().item()
              for i in range(cfg.n_layers))  # fmt: skip
    L, H = model.cfg.n_layers, model.cfg.n_heads
    R, T = tokens.shape
    out = {n: torch.full((L, H, R), math.nan, dtype=torch.float64)
           for n in ("previous_token", "first_token", "induction", "two_back")}  # fmt: skip
    for layer in range(L):
        A = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        for r, row in enumerate(tokens.tolist()):
            for h in range(H):
                prev = [A[r, h, q, q - 1].item() for q in range(2, T)]
                first = [A[r, h, q, 0].item() for q in range(1, T)]
                back = [A[r, h, q, q - 2].item() for q in range(2, T)]
                ind = []
                for q in range(T):
                    earlier = [s for s in range(q) if row[s] == row[q]]
                    if earlier and earlier[-1] + 1 < q - 1:
                        ind.append(A[r, h, q, earlier[-1] + 1].item())
                for name, vals in (("previous_token", prev), ("first_token", first),
                                   ("induction", ind), ("two_back", back)):  # fmt: skip
                    if vals:
                        out[name][layer, h, r] = sum(vals) / len(vals)
    return out, float32_tolerance(cfg, top, T)["c_hat"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_types_and_a_users_aggregate_equal_brute_force(backend):
    model = tiny_model(backend=backend)
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, V, (16, 20), generator=g)  # V = 13: plenty of repeats
    plan = plan_recording(tokens, V)
    rec = record_checkpoint(model, tokens, plan, batch_size=4, progress=False,
                            aggregates=[*DEFAULT, TWO_BACK])  # fmt: skip
    assert list(rec.values) == [a.name for a in AGGREGATES] + ["two_back"]
    want, tol = brute_force_rows(model, tokens)
    for name, ref in want.items():
        got = rec.values[name].double()
        assert got.shape == (2, 3, 16), name
        assert torch.equal(got.isnan(), ref.isnan()), name
        torch.testing.assert_close(got.nan_to_num(), ref.nan_to_num(), atol=tol, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_too_few_repeats_reads_repeated_random_rows(backend):
    """Rows without a repeated token: the induction score reads seeded repeated random rows
    of the model's vocabulary (the same at every call), the other head types the evaluation
    rows."""
    model = tiny_model(backend=backend)
    g = torch.Generator().manual_seed(5)
    tokens = torch.stack([torch.randperm(V, generator=g)[:9] for _ in range(6)])
    assert induction_positions(tokens)[0].numel() == 0
    rows, words = repeated_random_rows(tokens, V)
    assert rows.shape == (16, 1 + 2 * 4) and "repeated random tokens" in words
    assert torch.equal(rows[:, 1:5], rows[:, 5:])  # four distinct ids, then the same again
    assert torch.equal(rows[:, 0], tokens[torch.arange(16) % 6, 0])  # each row's own first token
    again, _ = repeated_random_rows(tokens, V)
    assert torch.equal(rows, again)
    plan = plan_recording(tokens, V)
    rec = record_checkpoint(model, tokens, plan, progress=False)
    assert rec.induction.shape == (2, 3, 16) and rec.previous_token.shape == (2, 3, 6)
    want, tol = brute_force_rows(model, rows)
    torch.testing.assert_close(rec.induction.double(), want["induction"], atol=tol, rtol=0)


def test_a_planted_induction_head_scores_near_one_and_forms_where_it_was_made(tmp_path):
    """Checkpoints move the weights from a random start to a planted circuit along a sigmoid
    centred on step 100: layer 1's head gets an induction score near 1, layer 0's a
    previous-token score near 1, each with a formation step where the weights made it."""
    at, rows = planted_run()
    steps = list(range(0, 201, 10))
    source = in_memory({s: at(s) for s in steps})
    traj = Recorder(tmp_path / "t", rows, RecordingSettings(queries="all", progress=False)).record(
        source
    )
    assert traj.rows["induction"] == "evaluation rows"
    ind = head_type(traj, "induction").final().set_index("layer")
    prev = head_type(traj, "previous_token").final().set_index("layer")
    score, lo, hi = ind.loc[1, ["induction", "induction_lo", "induction_hi"]]
    # every row at 1 (float32 softmax saturates): the rule of three over 16 rows, 1 - 3/16
    assert score > 0.99 and 0.8 < lo <= score <= hi
    assert prev.loc[0, "previous_token"] > 0.99
    assert ind.loc[0, "induction_reason"] == "no rise"  # layer 0 never becomes one
    for table, layer, name in ((ind, 1, "induction"), (prev, 0, "previous_token")):
        step = table.loc[layer, f"{name}_step"]
        lo, hi = table.loc[layer, f"{name}_step_lo"], table.loc[layer, f"{name}_step_hi"]
        assert 90 <= step <= 125 and lo <= step <= hi, (name, step, lo, hi)
        assert table.loc[layer, f"{name}_reason"] == ""


def test_old_folders_load_unchanged_and_resume_what_they_hold(tmp_path):
    """tests/data/trajectory_v1 predates the head types: it loads with its four aggregates,
    a head type read from it says it was not recorded, and resuming a copy records what it
    holds."""
    import shutil

    data = Path(__file__).parents[1] / "data" / "trajectory_v1"
    old = Trajectory.load(data)
    assert list(old.values) == ["zbar", "c_hat", "entropy", "query_entropy"]
    with pytest.raises(NotRecorded, match="holds no induction"):
        old.induction  # noqa: B018
    assert not hasattr(old, "induction")
    with pytest.raises(ValueError, match="holds no induction"):
        head_type(old, "induction")
    shutil.copytree(data, tmp_path / "v1")
    manifest = json.loads((tmp_path / "v1" / "manifest.json").read_text())
    assert "aggregates" not in manifest
    sys.path.insert(0, str(data.parent))
    import make_trajectory_v1 as make

    extra = {**make.models(), 10**12 + 1: make.models()[10**12]}
    rec = Recorder(tmp_path / "v1", make.tokens(), QUIET)
    traj = rec.record(in_memory(extra))
    assert list(traj.values) == list(old.values) and traj.steps[-1] == 10**12 + 1
    with pytest.raises(ValueError, match="records the aggregates"):
        Recorder(
            tmp_path / "v1", make.tokens(), RecordingSettings(progress=False, aggregates=DEFAULT)
        ).record(in_memory({10**12 + 2: make.models()[0]}))


_CHILD = """
import os, signal, sys, runpy, torch
sys.path[:0] = {paths!r}
mod = runpy.run_path({test!r})
from scansnap_lens.models.checkpoints import Checkpoint, CheckpointSource
from scansnap_lens.recording.aggregates import DEFAULT
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
models, tokens = mod["_models"](), mod["_tokens"]()

def load(step):
    if step == {kill_at}:
        os.kill(os.getpid(), signal.SIGKILL)
    return models[step]

source = CheckpointSource("memory", [Checkpoint(s, f"memory@{{s}}", lambda s=s: load(s))
                                     for s in sorted(models)])
settings = RecordingSettings(queries="all", progress=False, aggregates=[*DEFAULT, mod["TWO_BACK"]])
Recorder({out!r}, tokens, settings).record(source)
"""


def _models():
    return {s: attention_only_model(V, d_model=16, n_heads=2, seed=s, positional=True)
            for s in (0, 1, 2, 3)}  # fmt: skip


def _tokens():
    return torch.randint(0, V, (5, 12), generator=torch.Generator().manual_seed(9))


def test_a_users_aggregate_records_resumes_after_sigkill_bit_identically_and_loads(tmp_path):
    """The aggregate defined at the top of this file: a recording killed (SIGKILL) while
    loading its third checkpoint resumes into the trajectory an uninterrupted recording
    writes, bit for bit; resuming without the aggregate's definition is refused by name."""
    here = Path(__file__)
    child = _CHILD.format(paths=[str(here.parent.parent), str(here.parent.parent.parent)],
                          test=str(here), kill_at=2, out=str(tmp_path / "killed"))  # fmt: skip
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    assert done.returncode == -9, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "killed" / "manifest.json").read_text())
    assert [c["step"] for c in manifest["checkpoints"]] == [0, 1]
    assert [e["name"] for e in manifest["aggregates"]][-1] == "two_back"
    with pytest.raises(ValueError, match=r"aggregates \['two_back'\] of your own"):
        Recorder(tmp_path / "killed", _tokens(), QUIET)
    resumed = Recorder(
        tmp_path / "killed",
        _tokens(),
        RecordingSettings(progress=False, aggregates=[*DEFAULT, TWO_BACK]),
    ).record(in_memory(_models()))
    whole = Recorder(
        tmp_path / "whole",
        _tokens(),
        RecordingSettings(queries="all", progress=False, aggregates=[*DEFAULT, TWO_BACK]),
    ).record(in_memory(_models()))
    assert resumed.steps.tolist() == whole.steps.tolist() == [0, 1, 2, 3]
    assert list(resumed.values) == list(whole.values)
    for name in whole.values:
        assert torch.equal(resumed.values[name].full(), whole.values[name].full()), name
    loaded = Trajectory.load(tmp_path / "killed")
    assert loaded.aggregates["two_back"].doc == TWO_BACK.doc
    assert loaded.two_back.shape == (4, 1, 2, 5)
    m = head_type(loaded, "two_back").final()  # any rows aggregate is a head type to measure
    assert m["two_back"].between(0, 1).all()


def test_the_table_refuses_what_it_cannot_record():
    with pytest.raises(ValueError, match="axis must be one of"):
        Aggregate("x", axis="tokens", positions=lambda x: x)
    with pytest.raises(ValueError, match="needs positions"):
        Aggregate("x", axis="rows")
    with pytest.raises(ValueError, match="needs gather and count"):
        Aggregate("x", axis="pairs")
    with pytest.raises(ValueError, match="given twice"):
        Recorder("unused", _tokens(), RecordingSettings(aggregates=[TWO_BACK, TWO_BACK]))
    model = tiny_model()
    tokens = _tokens()
    bad = Aggregate("bad", axis="rows", positions=lambda x: (torch.tensor([0]),
                    torch.tensor([x.shape[1]]), torch.tensor([0])))  # fmt: skip
    with pytest.raises(ValueError, match="outside the batch"):
        record_checkpoint(model, tokens, plan_recording(tokens, V), progress=False,
                          aggregates=[bad])  # fmt: skip


def test_the_induction_fallback_needs_the_rows_an_interval_needs():
    from scansnap_lens.measures.head_types import MIN_ROWS
    from scansnap_lens.recording.aggregates import ROWS_NEEDED

    assert ROWS_NEEDED == MIN_ROWS  # recording may not import measures: one value, tested


@pytest.mark.parametrize("name", ["steps", "plan", "layers", "meta", "values", "step",
                                  "__class__", "__dict__", "__init__", "_arrays"])  # fmt: skip
def test_a_name_a_trajectory_uses_is_refused_when_defined_and_in_a_manifest(name, tmp_path):
    """An aggregate called like a field of Trajectory or CheckpointRecord, or like any of
    Python's own attributes, would record a whole run that no command can load: refused
    where it is defined, and where a manifest names it."""
    import dataclasses
    import inspect

    from scansnap_lens.recording.aggregates import RESERVED, CheckpointRecord

    fields = set(inspect.signature(Trajectory.__init__).parameters) - {"self", "values"}
    public = {n for n in dir(Trajectory) if not n.startswith("_")}
    record = {f.name for f in dataclasses.fields(CheckpointRecord)}
    assert fields | public | record | {"values"} <= RESERVED
    with pytest.raises(ValueError, match=f"cannot be called {name!r}"):
        Aggregate(name, axis="rows", positions=TWO_BACK.positions)
    tokens = _tokens()
    folder = tmp_path / "t"
    with Recorder(
        folder, tokens, RecordingSettings(aggregates=[TWO_BACK], progress=False)
    ) as recorder:
        recorder.on_checkpoint(0, tiny_model())
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["aggregates"]:
        if entry["name"] == "two_back":
            entry["name"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"cannot be called {name!r}"):
        Trajectory.load(folder)
