"""A suite recorded in one command (issue 75): three repositories of the test hub under
PolyPythias' names, killed mid-way and resumed with the identical command, equal to
uninterrupted recordings; the report on the suite folder is the runs page."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch
from _hub import LoopbackHub, saved_revisions
from safetensors.torch import save_file

from scansnap_lens.cli import main
from scansnap_lens.models import checkpoints
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.recording.suite import SUITE_FILE, Suite, expand
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.statistics.corpus import cooccurrence

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

PATTERN = "EleutherAI/pythia-14m-seed{1..3}"
NAMES = expand([PATTERN])
REVISIONS = ["step0", "step1", "step2"]
MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 2, "vocab_size": 64}


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    return {name: saved_revisions(root / name.split("/")[1], REVISIONS, seed=k, **MODEL)
            for k, name in enumerate(NAMES, 1)}  # fmt: skip


def _tokens():
    generator = torch.Generator().manual_seed(3)
    return torch.randint(1, MODEL["vocab_size"], (4, 24), generator=generator)


def test_a_suite_killed_and_resumed_equals_uninterrupted_recordings(repos, tmp_path):
    killed = threading.Event()

    def on_chunk(repo, revision, file, sent, size):  # the second run, mid-way
        if repo == NAMES[1] and revision == "step1" and file == "model.safetensors":
            killed.set()

    tokens = tmp_path / "tokens.safetensors"
    save_file({"tokens": _tokens()}, tokens)
    out = tmp_path / "suite"
    server = LoopbackHub(repos, bandwidth=1e6, on_chunk=on_chunk)
    with server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_OFFLINE": "0",
               "HF_HUB_CACHE": str(tmp_path / "cache")}  # fmt: skip
        command = [sys.executable, "-m", "scansnap_lens.cli", "record", "--model", PATTERN,
                   "--backend", "bridge", "--steps", "0,1,2", "--tokens", str(tokens),
                   "--out", str(out), "--prompt-length", "0"]  # fmt: skip
        first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert killed.wait(timeout=180), first.communicate()[0].decode()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait()
        suite = Suite(out)
        assert suite.runs() == NAMES  # written before the first run began
        assert (
            list(suite.recorded())
            == ["pythia-14m-seed1", "pythia-14m-seed2"][: len(suite.recorded())]
        )
        assert not (out / "pythia-14m-seed3").exists()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # what each run gives uninterrupted, recorded alone through the library
        with server.use():
            alone = {}
            for name in NAMES:
                source = checkpoints.pretrained(name, steps=[0, 1, 2], backend="bridge")
                quiet = RecordingSettings(progress=False, prompt_length=0)
                folder = tmp_path / "alone" / name.split("/")[1]
                alone[name] = Recorder(folder, _tokens(), quiet).record(source)
    assert json.loads((out / SUITE_FILE).read_text())["runs"] == NAMES
    for name in NAMES:
        traj = Trajectory.load(out / name.split("/")[1])
        assert traj.steps.tolist() == [0, 1, 2]
        assert torch.equal(traj.c_hat[:], alone[name].c_hat[:])
        assert torch.equal(traj.zbar[:], alone[name].zbar[:])
    # the runs differ (three initialisations), so the comparison has something to compare
    first_run = Trajectory.load(out / "pythia-14m-seed1")
    assert not torch.equal(first_run.c_hat[:], Trajectory.load(out / "pythia-14m-seed2").c_hat[:])

    # the report on the suite folder is the runs page, which reads the names' seeds
    stats = cooccurrence(_tokens(), MODEL["vocab_size"])
    stats.save(tmp_path / "stats.safetensors")
    assert main(["report", str(out), "--stats", str(tmp_path / "stats.safetensors"),
                 "--no-theory"]) == 0  # fmt: skip
    page = (out / "report" / "runs.html").read_text()
    assert all(name.split("/")[1] in page for name in NAMES)
    design = (out / "report" / "design.csv").read_text()
    assert "hub name" in design and "seed3" in design


def test_suite_names_and_folders_are_checked(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        expand(["a/m-seed{1..2}", "a/m-seed2"])
    with pytest.raises(ValueError, match="share a folder"):
        Suite(tmp_path / "p").start(["a/m", "b/m"])
    with pytest.raises(ValueError, match="not a repository name"):
        Suite(tmp_path / "p").start(["a/.."])
    (tmp_path / "p2").mkdir()
    (tmp_path / "p2" / SUITE_FILE).write_text('{"runs": "pythia"}')
    with pytest.raises(ValueError, match="list of names"):
        Suite(tmp_path / "p2").runs()
    # a suite grows: the runs it listed stay
    suite = Suite(tmp_path / "p3")
    suite.start(["a/m-seed1"])
    suite.start(["a/m-seed2"])
    assert suite.runs() == ["a/m-seed1", "a/m-seed2"]
