"""Sweeps over hub revisions with the real `huggingface_hub` client against a hub-shaped
server on the loopback (`testing.LoopbackHub`): the disk bound at every moment, revisions
cached before the sweep survive, downloads overlap recording, a SIGKILL resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from _backends import requires_hooked

from scansnap_lens.models import checkpoints, hub
from scansnap_lens.recording import sweep
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.trajectory import Trajectory
from scansnap_lens.testing import LoopbackHub, saved_revisions

NAME = "EleutherAI/pythia-14m"  # TransformerLens's labels of Pythia: step0, 1, 2, 4, 8, ...
REVISIONS = ["step0", "step1", "step2", "step4", "step8"]
STEPS = [0, 1, 2, 4, 8]
MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256}


@pytest.fixture(scope="module")
def revisions(tmp_path_factory):
    return saved_revisions(tmp_path_factory.mktemp("hub"), REVISIONS, **MODEL)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    return folder


def _tokens():
    generator = torch.Generator().manual_seed(3)
    return torch.randint(1, MODEL["vocab_size"], (4, 24), generator=generator)


def _bytes_on_disk(cache: Path) -> int:
    blobs = cache / ("models--" + NAME.replace("/", "--")) / "blobs"
    total = 0
    if blobs.is_dir():
        for entry in os.scandir(blobs):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:  # renamed or deleted while we looked
                pass
    return total


def _checkpoints(out: Path) -> list[dict]:
    return json.loads((out / "manifest.json").read_text())["checkpoints"]


def _revision_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _precache(hub_server, revision: str) -> Path:
    """`revision` downloaded into the cache before any sweep, as a user's earlier load would."""
    from huggingface_hub import snapshot_download

    with hub_server.use():
        return Path(snapshot_download(NAME, revision=revision, cache_dir=hub.cache_dir()))


class Watch:
    """The cache's bytes after every chunk the server sends: the peak over the sweep."""

    def __init__(self, cache: Path):
        self.cache, self.peak, self.first_byte = cache, 0, {}

    def __call__(self, repo, revision, file, sent, size):
        self.peak = max(self.peak, _bytes_on_disk(self.cache))
        self.first_byte.setdefault(revision, time.time())


def test_sweep_holds_the_bound_keeps_precached_revisions_and_overlaps(revisions, cache, tmp_path):
    watch = Watch(cache)
    server = LoopbackHub({NAME: revisions}, bandwidth=5e5, on_chunk=watch)
    with server:
        kept = _precache(server, "step2")
        before = {p.name: p.read_bytes() for p in kept.iterdir()}
        base = _bytes_on_disk(cache)
        with server.use():
            source = checkpoints.pretrained(NAME, steps=STEPS, backend="bridge")
            assert [c.revision for c in source] == REVISIONS
            out = tmp_path / "sweep"
            traj = Recorder(out, _tokens(), progress=False).record(source, on_disk=2)
    assert traj.steps.tolist() == STEPS
    one = max(_revision_bytes(f) for f in revisions.values())
    assert watch.peak <= base + 2 * one, (watch.peak, base, one)
    # the pre-cached revision is whole, and the only one left
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before
    snapshots = cache / ("models--" + NAME.replace("/", "--")) / "snapshots"
    assert [p.name for p in snapshots.iterdir()] == [kept.name]
    assert hub.cached_commit(NAME, "step2") == kept.name
    assert all(hub.cached_commit(NAME, r) is None for r in REVISIONS if r != "step2")
    assert json.loads((out / "downloads.json").read_text())["revisions"] == []
    # each weight file crossed the link once (step2's before the sweep)
    weights = revisions["step0"] / "model.safetensors"
    for revision in REVISIONS:
        assert server.sent[(NAME, revision, "model.safetensors")] == weights.stat().st_size
    # step8's download began while step4 recorded (the sweep asked for its files first)
    written = {e["step"]: (out / e["file"]).stat().st_mtime for e in _checkpoints(out)}
    asked = min(t for _, path, _, t in server.requests if path.endswith("/revision/step8"))
    assert asked < written[4]


def test_sweep_records_what_the_revisions_hold(revisions, cache, tmp_path):
    """Downloaded, recorded and deleted as it goes, or all kept and recorded one by one:
    the same trajectory, and keep_checkpoints deletes nothing."""
    with LoopbackHub({NAME: revisions}) as server, server.use():
        swept = Recorder(tmp_path / "a", _tokens(), progress=False).record(
            checkpoints.pretrained(NAME, steps=STEPS[:3], backend="bridge")
        )
        kept = Recorder(tmp_path / "b", _tokens(), progress=False).record(
            checkpoints.pretrained(NAME, steps=STEPS[:3], backend="bridge"),
            on_disk=1,
            keep_checkpoints=True,
        )
    for name in ("zbar", "c_hat", "previous_token"):
        torch.testing.assert_close(
            torch.as_tensor(getattr(swept, name)[:]), torch.as_tensor(getattr(kept, name)[:]),
            rtol=0, atol=0,
        )  # fmt: skip
    assert all(hub.cached_commit(NAME, r) is not None for r in REVISIONS[:3])


def test_sweep_refuses_a_disk_too_small_with_sizes(revisions, cache, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with LoopbackHub({NAME: revisions}) as server, server.use():
        source = checkpoints.pretrained(NAME, steps=STEPS, backend="bridge")
        with pytest.raises(sweep.DiskError, match=r"a revision is .*kB.*2 on disk.*1 kB free"):
            Recorder(tmp_path / "out", _tokens(), progress=False).record(source)
    assert server.sent == {}  # nothing downloaded
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_sigkill_mid_download_resumes_without_re_recording(revisions, cache, tmp_path):
    """A sweep killed while step4 downloads: the next run records step4 and step8 only,
    downloads no revision it had whole again, and removes the partial file the kill left
    (huggingface_hub never resumes it); the bound holds through both runs and the
    pre-cached step1 survives."""
    killed = threading.Event()
    watch = Watch(cache)

    def on_chunk(repo, revision, file, sent, size):
        watch(repo, revision, file, sent, size)
        if revision == "step4" and file == "model.safetensors" and sent >= size // 2:
            killed.set()

    tokens = tmp_path / "tokens.safetensors"
    from safetensors.torch import save_file

    save_file({"tokens": _tokens()}, tokens)
    out = tmp_path / "out"
    server = LoopbackHub({NAME: revisions}, bandwidth=1.5e5, on_chunk=on_chunk)
    with server:
        kept = _precache(server, "step1")
        base = _bytes_on_disk(cache)
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_OFFLINE": "0",
               "HF_HUB_CACHE": str(cache)}  # fmt: skip
        command = [sys.executable, "-m", "scansnap_lens.cli", "record", "--model", NAME,
                   "--backend", "bridge", "--steps", "0,1,2,4,8", "--tokens", str(tokens),
                   "--out", str(out), "--prompt-length", "0"]  # fmt: skip
        first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert killed.wait(timeout=120), first.communicate()[0].decode()[-3000:]
        first.send_signal(signal.SIGKILL)
        first.wait()
        recorded = _checkpoints(out)
        stamps = {e["step"]: (out / e["file"]).stat().st_mtime_ns for e in recorded}
        assert {0, 1, 2} <= set(stamps) and 4 not in stamps
        asked_before = len(server.requests)
        server.bandwidth = None
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traj = Trajectory.load(out)
    assert traj.steps.tolist() == STEPS
    for entry in _checkpoints(out):  # what was recorded was not recorded again
        if entry["step"] in stamps:
            assert (out / entry["file"]).stat().st_mtime_ns == stamps[entry["step"]]
    size = (revisions["step4"] / "model.safetensors").stat().st_size
    for revision in ("step0", "step2"):  # whole before the kill: never downloaded again
        assert server.sent[(NAME, revision, "model.safetensors")] == size
    # the killed download's partial file is gone; step4's weights were asked for once more
    cdn = {p for m, p, _, _ in server.requests[:asked_before] if p.startswith("/cdn/")}
    again = [p for m, p, _, _ in server.requests[asked_before:] if m == "GET" and p in cdn]
    assert len(again) == 1
    assert server.sent[(NAME, "step4", "model.safetensors")] <= 2 * size
    assert not list(cache.rglob("*.incomplete"))
    one = max(_revision_bytes(f) for f in revisions.values())
    assert watch.peak <= base + 2 * one, (watch.peak, base, one)
    assert hub.cached_commit(NAME, "step1") == kept.name  # cached before: kept
    assert all(hub.cached_commit(NAME, r) is None for r in REVISIONS if r != "step1")


class _Slow:
    """A fetcher that takes `seconds` per checkpoint and counts what is held at once."""

    writes = False

    def __init__(self, on_disk: int, seconds: float):
        self.on_disk, self.seconds = on_disk, seconds
        self.held, self.most, self.started = 0, 0, {}
        self._lock = threading.Lock()

    def prepare(self, todo, done, folder):
        pass

    def fetch(self, checkpoint):
        with self._lock:
            self.held += 1
            self.most = max(self.most, self.held)
        self.started[checkpoint.step] = time.perf_counter()
        time.sleep(self.seconds)

    def release(self, checkpoint):
        with self._lock:
            self.held -= 1


@pytest.mark.parametrize("on_disk", [1, 2, 3])
def test_ahead_fetches_while_recording_and_never_holds_more_than_on_disk(on_disk):
    from scansnap_lens.models.checkpoints import Checkpoint

    todo = [Checkpoint(s, f"c{s}", lambda: None) for s in range(6)]
    fetcher = _Slow(on_disk, 0.05)
    ended = {}
    start = time.perf_counter()
    with sweep.Ahead(todo, fetcher) as ahead:
        for checkpoint, error in ahead:
            assert error is None
            time.sleep(0.05)  # recording
            ended[checkpoint.step] = time.perf_counter()
            ahead.done(checkpoint)
    took = time.perf_counter() - start
    assert fetcher.most <= on_disk
    if on_disk == 1:  # one after the other: each fetch after the last recording ended
        assert all(fetcher.started[s + 1] >= ended[s] for s in range(5))
        assert took >= 12 * 0.05
    else:  # the next fetched while this one records
        assert all(fetcher.started[s + 1] < ended[s] for s in range(5))


def test_read_ahead_reads_a_folder_checkpoint_and_a_fetch_error_reaches_the_recorder(tmp_path):
    from scansnap_lens.models.checkpoints import Checkpoint, CheckpointError

    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "checkpoint-1" / "model.safetensors").write_bytes(b"x" * 100)
    reader = sweep.ReadAhead()
    reader.fetch(Checkpoint(1, "c", lambda: None, path=tmp_path / "checkpoint-1"))  # reads

    class Failing(_Slow):
        def fetch(self, checkpoint):
            raise CheckpointError(f"no such revision {checkpoint.step}")

    todo = [Checkpoint(s, f"c{s}", lambda: None) for s in range(2)]
    with sweep.Ahead(todo, Failing(2, 0)) as ahead:
        errors = [str(error) for _, error in ahead]
    assert errors == ["no such revision 0", "no such revision 1"]


@requires_hooked
def test_a_hooked_sweep_loads_through_transformer_lens(tmp_path, cache):
    """TL 3's default for Pythia: the sweep fetches each revision, HookedTransformer's
    from_pretrained loads it from the cache (with Pythia-14m's own config, so the model has
    its shapes), and the revision is deleted after; the one ``main`` shares stays."""
    import transformers
    from safetensors.torch import save_file

    from scansnap_lens.testing import word_tokenizer

    config = transformers.GPTNeoXConfig(
        vocab_size=50304, hidden_size=128, num_hidden_layers=6, num_attention_heads=4,
        intermediate_size=512, max_position_embeddings=2048, rotary_pct=0.25,
        use_parallel_residual=True, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False,
    )  # fmt: skip
    folders = {}
    for i, revision in enumerate(["step0", "step1"]):
        torch.manual_seed(i)
        folders[revision] = tmp_path / "hub" / revision
        transformers.GPTNeoXForCausalLM(config).save_pretrained(folders[revision])
        word_tokenizer(64).save_pretrained(folders[revision])
    save_file({"tokens": _tokens() % 64}, tmp_path / "tokens.safetensors")
    out = tmp_path / "out"
    with LoopbackHub({NAME: folders}) as server:
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_OFFLINE": "0",
               "HF_HUB_CACHE": str(cache)}  # fmt: skip
        command = [sys.executable, "-m", "scansnap_lens.cli", "record", "--model", NAME,
                   "--backend", "hooked", "--steps", "0,1", "--tokens",
                   str(tmp_path / "tokens.safetensors"), "--out", str(out),
                   "--prompt-length", "0"]  # fmt: skip
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 checkpoints recorded (2 new" in done.stdout
    traj = Trajectory.load(out)
    assert traj.steps.tolist() == [0, 1] and traj.layers == list(range(6))
    assert hub.cached_commit(NAME, "step0") is None  # recorded, then deleted
    # TransformerLens read its config and tokenizer at `main`, which is step1 here: kept
    assert hub.cached_commit(NAME, "step1") == hub.cached_commit(NAME, "main") is not None


def test_a_downloads_file_from_elsewhere_deletes_nothing(revisions, cache, tmp_path):
    """A recording folder someone else prepared: its downloads.json names a revision cached
    here before, for another cache; the sweep keeps it.  A link there is refused."""
    with LoopbackHub({NAME: revisions}) as server:
        kept = _precache(server, "step0")
        out = tmp_path / "theirs"
        out.mkdir()
        (out / "downloads.json").write_text(
            json.dumps({"repo": NAME, "cache": "/elsewhere", "revisions": ["step0"]})
        )
        with server.use():
            source = checkpoints.pretrained(NAME, steps=[0, 1], backend="bridge")
            traj = Recorder(out, _tokens(), progress=False).record(source)
        assert traj.steps.tolist() == [0, 1]
        assert hub.cached_commit(NAME, "step0") == kept.name  # cached before: kept
        assert hub.cached_commit(NAME, "step1") is None  # the sweep's own: deleted
        linked = tmp_path / "linked"
        linked.mkdir()
        (linked / "downloads.json").symlink_to(out / "downloads.json")
        with server.use(), pytest.raises(ValueError, match=r"downloads\.json is a symbolic link"):
            Recorder(linked, _tokens(), progress=False).record(
                checkpoints.pretrained(NAME, steps=[0, 1], backend="bridge")
            )
