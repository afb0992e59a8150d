"""Trajectories: save, load, select, the accessors of given tokens; atomic re-saves, nothing
deleted outside the folder's own files, foreign or hand-edited files refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from _hand import hand_trajectory
from _runs import V as RUN_V
from _tiny import QUIET

from scansnap_lens import _io
from scansnap_lens.lab.synthetic import syn_small
from scansnap_lens.models import checkpoints
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.models.training import attention_only_model
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder, record_trajectory
from scansnap_lens.recording.trajectory import Trajectory

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

V = 20


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    """Two different trajectories (4 and 3 checkpoints) of the same plan."""
    root = tmp_path_factory.mktemp("trajs")
    tokens = torch.randint(0, V, (4, 10), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, V)
    models = {s: attention_only_model(V, d_model=8, n_ctx=16, seed=s) for s in range(4)}
    a = record_trajectory(in_memory(models), tokens, root / "a", QUIET, plan=plan)
    b = record_trajectory(
        in_memory({s + 10: m for s, m in models.items() if s < 3}),
        tokens,
        root / "b",
        QUIET,
        plan=plan,
    )
    return a, b


def test_resave_replaces_the_old_trajectory_and_only_its_files(trajectories, tmp_path):
    a, b = trajectories
    folder = a.save(tmp_path / "t")
    (folder / "report").mkdir()
    (folder / "report" / "report.html").write_text("the user's report")
    (folder / "checkpoints" / "notes.txt").write_text("the user's notes")
    old_files = set((folder / "checkpoints").glob("step_*.safetensors"))
    b.save(folder)
    loaded = Trajectory.load(folder)
    assert loaded.steps.tolist() == [10, 11, 12] and torch.equal(loaded.zbar, b.zbar)
    assert not any(f.exists() for f in old_files)  # the old checkpoints are gone
    assert len(list((folder / "checkpoints").glob("step_*.safetensors"))) == 3
    assert (folder / "report" / "report.html").read_text() == "the user's report"
    assert (folder / "checkpoints" / "notes.txt").exists()


def test_a_crash_in_the_middle_of_a_resave_keeps_the_old_trajectory(
    trajectories, tmp_path, monkeypatch
):
    a, b = trajectories
    folder = a.save(tmp_path / "t")
    calls = {"n": 0}
    real = _io.write_tensors

    def crash_on_third(path, tensors, metadata):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(path, tensors, metadata)

    monkeypatch.setattr("scansnap_lens.recording.storage.write_tensors", crash_on_third)
    with pytest.raises(OSError, match="disk full"):
        b.save(folder)
    loaded = Trajectory.load(folder)  # still the whole old trajectory
    assert loaded.steps.tolist() == [0, 1, 2, 3] and torch.equal(loaded.zbar, a.zbar)


@pytest.mark.parametrize(
    "bad_file", ["../outside.txt", "/tmp/elsewhere.safetensors", "checkpoints/../../x"]
)
def test_manifests_naming_foreign_files_are_refused_and_nothing_is_deleted(
    trajectories, tmp_path, bad_file
):
    a, b = trajectories
    folder = a.save(tmp_path / "t")
    victim = tmp_path / "outside.txt"
    victim.write_text("keep me")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["checkpoints"][0]["file"] = bad_file
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="not a file of this folder"):
        Trajectory.load(folder)
    with pytest.raises(ValueError, match="not a file of this folder"):
        b.save(folder)
    assert victim.read_text() == "keep me"


def test_duplicated_or_relabelled_entries_are_refused(trajectories, tmp_path):
    a, _ = trajectories
    folder = a.save(tmp_path / "t")
    original = json.loads((folder / "manifest.json").read_text())
    for edit, message in [
        (lambda m: m["checkpoints"].append(dict(m["checkpoints"][0])), "listed twice"),
        (lambda m: m["checkpoints"][1].update(step=7), "another step"),
        (lambda m: m["checkpoints"][0].update(step=2**63), "no valid step"),
        (lambda m: m.update(layers=[0, 1, 2]), r"shape \(1, 1, \d+\).*say \(3, 1,"),
        (lambda m: m.update(heads=[0, 1]), "hand-edited manifest, or a file of another run"),
        (lambda m: m.update(layers="0"), "has no list as 'layers'"),
        (lambda m: m.pop("meta"), "lacks 'meta'"),
    ]:
        manifest = json.loads(json.dumps(original))
        edit(manifest)
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ValueError, match=message):
            Trajectory.load(folder)


def test_writers_on_one_folder_lose_no_step(trajectories, tmp_path):
    """Two recorders (threads here, processes alike: the lock is the folder's) interleave."""
    import threading

    from scansnap_lens.recording.aggregates import CheckpointRecord
    from scansnap_lens.recording.storage import TrajectoryWriter

    a, _ = trajectories
    entries = a.entries()
    writers = [
        TrajectoryWriter(
            tmp_path / "t", a.plan, a.layers, a.heads, prompt=a.prompt, aggregates=entries
        )
        for _ in range(2)
    ]
    values = {k: torch.as_tensor(v[0]) for k, v in a.values.items()}

    def write(writer, steps):
        for step in steps:
            writer.write(CheckpointRecord(step, values))

    threads = [
        threading.Thread(target=write, args=(w, range(i, 40, 2))) for i, w in enumerate(writers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Trajectory.load(tmp_path / "t").steps.tolist() == list(range(40))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda t: t.update(pair_token=t["pair_token"] + 100), "pair_token ids lie outside"),
        (lambda t: t.update(triple_class=t["triple_class"] + 50), "outside the classes"),
        (lambda t: t.update(pair_count=t["pair_count"][1:]), "pairs tensors differ in length"),
        (lambda t: t.update(pair_query=t["pair_query"].flip(0)), "not sorted and unique"),
        (lambda t: t.pop("class_next"), "is not a recording plan"),
    ],
)
def test_hand_edited_plans_are_refused_by_name(edit, message, trajectories, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    a, _ = trajectories
    folder = a.save(tmp_path / "t")
    plan_file = folder / json.loads((folder / "manifest.json").read_text())["plan"]
    with safe_open(str(plan_file), "pt") as handle:
        header = handle.metadata()
    tensors = load_file(str(plan_file))
    edit(tensors)
    save_file(tensors, str(plan_file), metadata=header)
    with pytest.raises(ValueError, match=message):
        Trajectory.load(folder)


def test_trajectory_save_load_select_dataframe(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, RUN_V, queries=syn_small().query.tolist())
    traj = Recorder(tmp_path / "t", tokens, QUIET, plan=plan).record(checkpoints.folder(out))
    copy = Trajectory.load(traj.save(tmp_path / "copy"))
    assert torch.equal(copy.c_hat, traj.c_hat) and copy.plan.same_as(traj.plan)
    q = int(plan.queries[0])
    sub = traj.select(steps=[5, 30], heads=[1], queries=[q])
    assert sub.steps.tolist() == [5, 30] and sub.heads == [1]
    assert set(sub.plan.class_query.tolist()) == {q}
    frame = sub.to_dataframe()
    assert set(frame["query"]) == {q}
    row = frame[(frame.step == 30)].iloc[0]
    j = int(
        (
            (traj.plan.class_query[traj.plan.triple_class] == row["query"])
            & (traj.plan.class_next[traj.plan.triple_class] == row["next"])
            & (traj.plan.triple_token == row["token"])
        ).nonzero()[0]
    )
    assert row["c_hat"] == pytest.approx(float(traj.c_hat[-1, 0, 1, j]))
    # c_hat of each (step, class) sums to one
    sums = frame.groupby(["step", "query", "next"])["c_hat"].sum()
    assert sums.to_numpy() == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(KeyError, match="steps"):
        traj.select(steps=[7])


def test_trajectory_files_that_cannot_be_read(trained, tmp_path):
    out, _, tokens = trained
    plan = plan_recording(tokens, RUN_V, queries=syn_small().query.tolist())
    with pytest.raises(FileNotFoundError, match=r"manifest\.json is missing"):
        Trajectory.load(tmp_path)
    Recorder(tmp_path / "t", tokens, QUIET, plan=plan).record(checkpoints.folder(out))
    first = sorted((tmp_path / "t" / "checkpoints").iterdir())[0]
    first.write_bytes(first.read_bytes()[:40])
    with pytest.raises(ValueError, match=f"{first.name}.*corrupt or truncated"):
        Trajectory.load(tmp_path / "t")
    (tmp_path / "t" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt manifest"):
        Trajectory.load(tmp_path / "t")


def test_trajectory_logits_and_attention_of_given_tokens():
    """The public accessors read the slots the plan holds: values where held, NaN (logits) or
    0 (attention) where a token never met the query, KeyError for an untracked class."""
    traj = hand_trajectory(
        [0, 10],
        {(0, 1): [0.5, 1.5], (0, 3): [1.0, 0.0], (2, 1): [7.0, 8.0]},
        {(0, 5): {1: [0.25, 0.75], 3: [0.75, 0.25]}},
        heads=2,
    )
    z = traj.logits(0, [3, 2, 1])
    assert z.shape == (2, 1, 2, 3) and z.dtype == torch.float64
    assert z[:, 0, 1, 0].tolist() == [1.0, 0.0] and z[:, 0, 0, 2].tolist() == [0.5, 1.5]
    assert z[..., 1].isnan().all()
    assert traj.logits(2, torch.tensor([1]))[:, 0, 0, 0].tolist() == [7.0, 8.0]
    a = traj.attention(0, 5, [1, 4, 3])
    assert a[:, 0, 0].tolist() == [[0.25, 0.0, 0.75], [0.75, 0.0, 0.25]]
    with pytest.raises(KeyError, match="query 0, next token 6"):
        traj.attention(0, 6, [1])
    assert traj.plan.pair_slot(0, [1, 2, 3]).tolist() == [0, -1, 1]
    assert traj.plan.class_slot(0, 5) == 0 and traj.plan.class_slot(2, 5) is None


def test_c_hat_is_chat_in_files(trajectories, tmp_path):
    """Files name c_hat ``chat`` (its `aggregates.AGGREGATES` entry: the one place of the key),
    so every folder written loads and resumes."""
    from safetensors import safe_open

    traj = trajectories[0]
    traj.save(tmp_path / "t")
    first = next((tmp_path / "t" / "checkpoints").glob("step_*.safetensors"))
    with safe_open(str(first), framework="pt") as handle:
        keys = set(handle.keys())
    assert {"zbar", "chat", "entropy", "query_entropy"} <= keys and "c_hat" not in keys, keys


def test_a_link_to_a_trajectory_folder_reads_where_it_points(trajectories, tmp_path):
    """Only writes refuse links: a run reached through a link (a shared drive, a
    colleague's folder linked into yours) loads; a link *inside* the folder is still refused."""
    a, _ = trajectories
    folder = a.save(tmp_path / "t")
    (tmp_path / "link").symlink_to(folder, target_is_directory=True)
    loaded = Trajectory.load(tmp_path / "link")
    assert loaded.steps.tolist() == a.steps.tolist()
    assert torch.equal(torch.as_tensor(loaded.zbar[:]), torch.as_tensor(a.zbar[:]))


def test_a_manifest_that_is_no_regular_file_is_refused_by_name(trajectories, tmp_path):
    """A FIFO would block the reader for ever, /dev/zero or a sparse file fill its memory
    (issue 79): refused naming the file, before any byte is read."""
    import os

    from scansnap_lens._io import NotAFile

    a, _ = trajectories
    folder = a.save(tmp_path / "t")
    (folder / "manifest.json").unlink()
    os.mkfifo(folder / "manifest.json")
    with pytest.raises(NotAFile, match=r"manifest\.json should be the recording's manifest"):
        Trajectory.load(folder)
    (folder / "manifest.json").unlink()
    with open(folder / "manifest.json", "wb") as sparse:  # 100 MB of nothing, no disk used
        sparse.truncate(100 << 20)
    with pytest.raises(NotAFile, match="at most 67,108,864 bytes"):
        Trajectory.load(folder)
