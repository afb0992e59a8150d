"""Saving trajectories: atomic re-saves, nothing deleted outside the folder's own files, and
manifests that name foreign files refused."""

from __future__ import annotations

import json

import pytest
import torch

from scansnap_lens import _io
from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.models.training import attention_only_model
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import record_trajectory
from scansnap_lens.recording.trajectory import Trajectory

V = 20


@pytest.fixture(scope="module")
def trajectories(tmp_path_factory):
    """Two different trajectories (4 and 3 checkpoints) of the same plan."""
    root = tmp_path_factory.mktemp("trajs")
    tokens = torch.randint(0, V, (4, 10), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, V)
    models = {s: attention_only_model(V, d_model=8, n_ctx=16, seed=s) for s in range(4)}
    a = record_trajectory(in_memory(models), tokens, root / "a", plan=plan, progress=False)
    b = record_trajectory(
        in_memory({s + 10: m for s, m in models.items() if s < 3}), tokens, root / "b",
        plan=plan, progress=False,
    )  # fmt: skip
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

    monkeypatch.setattr("scansnap_lens.recording.trajectory.write_tensors", crash_on_third)
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

    from scansnap_lens.recording.hooks import CheckpointRecord
    from scansnap_lens.recording.trajectory import TrajectoryWriter

    a, _ = trajectories
    writers = [
        TrajectoryWriter(tmp_path / "t", a.plan, a.layers, a.heads, prompt=a.prompt)
        for _ in range(2)
    ]
    record = CheckpointRecord(0, a.zbar[0], a.chat[0], a.entropy[0], a.query_entropy[0])

    def write(writer, steps):
        for step in steps:
            record.step = step
            writer.write(CheckpointRecord(step, record.zbar, record.chat, record.entropy,
                                          record.query_entropy))  # fmt: skip

    threads = [
        threading.Thread(target=write, args=(w, range(i, 40, 2))) for i, w in enumerate(writers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Trajectory.load(tmp_path / "t").steps.tolist() == list(range(40))


def test_a_recorder_with_other_rates_is_refused_and_overwrite_replaces(tmp_path):
    from scansnap_lens.recording.recorder import Recorder

    tokens = torch.randint(0, V, (4, 10), generator=torch.Generator().manual_seed(0))
    plan = plan_recording(tokens, V)
    model = attention_only_model(V, d_model=8, n_ctx=16, seed=0)
    first = Recorder(tmp_path / "t", tokens, plan, progress=False)
    first.on_checkpoint(0, model, training={"lr_y": 0.1, "lr_z": 1.0})
    again = Recorder(tmp_path / "t", tokens, plan, progress=False)  # the same run: resumes
    again.on_checkpoint(1, model, training={"lr_y": 0.1, "lr_z": 1.0})
    edited = Recorder(tmp_path / "t", tokens, plan, progress=False)
    with pytest.raises(ValueError, match=r"another run \(lr_y 0.1 there, 0.2 here\).*overwrite"):
        edited.on_checkpoint(2, model, training={"lr_y": 0.2, "lr_z": 1.0})
    assert Trajectory.load(tmp_path / "t").steps.tolist() == [0, 1]  # nothing lost
    fresh = Recorder(tmp_path / "t", tokens, plan, progress=False, overwrite=True)
    fresh.on_checkpoint(5, model, training={"lr_y": 0.2, "lr_z": 1.0})
    replaced = Trajectory.load(tmp_path / "t")
    assert replaced.steps.tolist() == [5] and replaced.meta["lr_y"] == 0.2


def test_a_recorder_plans_for_queries_from_the_first_model_and_resumes_without_one(tmp_path):
    """`Recorder(queries=)`: the plan is built from the first model recorded (its vocabulary)
    and equals `plan_recording`'s; a recorder resuming the folder reads its plan back; other
    queries are refused by name."""
    from scansnap_lens.recording.recorder import Recorder

    tokens = torch.randint(0, V, (4, 10), generator=torch.Generator().manual_seed(0))
    models = [attention_only_model(V, d_model=8, n_ctx=16, seed=s) for s in range(3)]
    planned = Recorder(tmp_path / "q", tokens, queries=[3, 5, 7], progress=False)
    planned.on_checkpoint(0, models[0])
    Recorder(tmp_path / "q", tokens, progress=False).on_checkpoint(1, models[1])  # resumes
    Recorder(tmp_path / "q", tokens, queries=[7, 5, 3], progress=False).on_checkpoint(2, models[2])
    explicit = plan_recording(tokens, V, queries=[3, 5, 7])
    reference = record_trajectory(in_memory(dict(enumerate(models))), tokens, tmp_path / "p",
                                  plan=explicit, progress=False)  # fmt: skip
    got = Trajectory.load(tmp_path / "q")
    assert got.plan.queries.tolist() == [3, 5, 7] and got.steps.tolist() == [0, 1, 2]
    for name in ("zbar", "chat", "entropy", "query_entropy"):
        assert torch.equal(getattr(got, name), getattr(reference, name)), name
    with pytest.raises(ValueError, match="another plan"):
        Recorder(tmp_path / "q", tokens, queries=[3, 5], progress=False)
    with pytest.raises(ValueError, match="another plan"):  # another context convention
        Recorder(tmp_path / "q", tokens, exclude_bos=True, progress=False)
    with pytest.raises(ValueError, match="give a plan, or queries"):
        Recorder(tmp_path / "r", tokens, explicit, queries=[3], progress=False)
    traj = record_trajectory(in_memory({0: models[0]}), tokens, tmp_path / "s", queries=[5],
                             progress=False)  # fmt: skip
    assert traj.plan.queries.tolist() == [5]


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
