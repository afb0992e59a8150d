"""Sweeps over hub revisions with the real `huggingface_hub` client against a hub-shaped
server on the loopback (`_hub.LoopbackHub`): the disk bound at every moment, the user's
hub cache byte-identical after every sweep (revisions cached by name or pinned by hash, a
mirror's, a colleague's bookkeeping, an earlier kept run, two sweeps at once), downloads
overlap recording, a SIGKILL resumes and leaves nothing behind."""

from __future__ import annotations

import contextlib
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
from _hub import LoopbackHub, saved_revisions
from _tiny import QUIET

from scansnap_lens.cli import cli_message
from scansnap_lens.models import checkpoints, hub
from scansnap_lens.recording import sweep
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.trajectory import Trajectory

pytestmark = pytest.mark.tl  # builds or runs TransformerLens models: both majors run it

NAME = "EleutherAI/pythia-14m"  # TransformerLens's labels of Pythia: step0, 1, 2, 4, 8, ...
REVISIONS = ["step0", "step1", "step2", "step4", "step8"]
STEPS = [0, 1, 2, 4, 8]
MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256}


@pytest.fixture(scope="module")
def revisions(tmp_path_factory):
    return saved_revisions(tmp_path_factory.mktemp("hub"), REVISIONS, **MODEL)


@pytest.fixture(scope="module")
def kept(revisions, tmp_path_factory):
    """Every step recorded one revision at a time, everything kept, from a cache of its own:
    what each sweep below must equal."""
    folder = tmp_path_factory.mktemp("kept")
    saved = os.environ.get("HF_HUB_CACHE")
    os.environ["HF_HUB_CACHE"] = str(folder / "cache")
    try:
        with LoopbackHub({NAME: revisions}) as server, server.use():
            source = checkpoints.pretrained(NAME, steps=STEPS, backend="bridge")
            keep = QUIET.replace(on_disk=1, keep_checkpoints=True)
            return Recorder(folder / "out", _tokens(), keep).record(source)
    finally:
        if saved is None:
            os.environ.pop("HF_HUB_CACHE", None)
        else:
            os.environ["HF_HUB_CACHE"] = saved


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


def _contents(folder: Path) -> dict[str, str]:
    """Every file and link under `folder`: a link's target, a file's sha256."""
    import hashlib

    out = {}
    for path in sorted(folder.rglob("*")) if folder.exists() else ():
        key = path.relative_to(folder).as_posix()
        if path.is_symlink():
            out[key] = "-> " + os.readlink(path)
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[key] = "dir"
    return out


def _snapshots(cache: Path, name: str = NAME) -> list[str]:
    folder = cache / ("models--" + name.replace("/", "--")) / "snapshots"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _checkpoints(out: Path) -> list[dict]:
    return json.loads((out / "manifest.json").read_text())["checkpoints"]


def _revision_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _precache(hub_server, revision: str, name: str = NAME) -> Path:
    """`revision` downloaded into the cache before any sweep, as a user's earlier load would
    (a commit hash: pinned, as from_pretrained(revision=sha) leaves it, with no ref)."""
    from huggingface_hub import snapshot_download

    with hub_server.use():
        return Path(snapshot_download(name, revision=revision, cache_dir=hub.cache_dir()))


class Watch:
    """The cache's bytes after every chunk the server sends: the peak over the sweep."""

    def __init__(self, cache: Path):
        self.cache, self.peak, self.first_byte = cache, 0, {}

    def __call__(self, repo, revision, file, sent, size):
        self.peak = max(self.peak, _bytes_on_disk(self.cache))
        self.first_byte.setdefault(revision, time.time())


def test_sweep_holds_the_bound_reads_the_users_cache_and_overlaps(revisions, cache, tmp_path, kept):
    out = tmp_path / "sweep"
    own = out / sweep.CACHE
    watch = Watch(own)
    server = LoopbackHub({NAME: revisions}, bandwidth=5e5, on_chunk=watch)
    with server:
        precached = _precache(server, "step2")
        before = _contents(cache)
        with server.use():
            source = checkpoints.pretrained(NAME, steps=STEPS, backend="bridge")
            assert [c.revision for c in source] == REVISIONS
            traj = Recorder(out, _tokens(), QUIET.replace(on_disk=2)).record(source)
    _same_trajectory(traj, kept)
    one = max(_revision_bytes(f) for f in revisions.values())
    assert 0 < watch.peak <= 2 * one, (watch.peak, one)
    assert _contents(cache) == before  # the user's cache: byte-identical
    assert hub.cached_commit(NAME, "step2") == precached.name
    assert not own.exists()  # every download deleted once recorded, and the folder with them
    # each weight file crossed the link once: step2's before the sweep (the user's download),
    # never again, as the sweep read it from the user's cache
    weights = revisions["step0"] / "model.safetensors"
    for revision in REVISIONS:
        assert server.sent[(NAME, revision, "model.safetensors")] == weights.stat().st_size
    # step8's download began while step4 recorded (snapshot_download asks for the revision
    # first; the sweep's listing asked before anything was recorded)
    written = {e["step"]: (out / e["file"]).stat().st_mtime for e in _checkpoints(out)}
    asked = [t for _, path, _, t in server.requests if path.endswith("/revision/step8")]
    assert len(asked) == 2 and asked[0] < written[0] and asked[1] < written[4]


def test_sweep_records_what_the_revisions_hold(revisions, cache, tmp_path):
    """Downloaded, recorded and deleted as it goes, or all kept and recorded one by one:
    the same trajectory; keep_checkpoints downloads into the user's cache and keeps them."""
    with LoopbackHub({NAME: revisions}) as server, server.use():
        swept = Recorder(tmp_path / "a", _tokens(), QUIET).record(
            checkpoints.pretrained(NAME, steps=STEPS[:3], backend="bridge")
        )
        assert _contents(cache) == {}
        kept = Recorder(
            tmp_path / "b", _tokens(), QUIET.replace(on_disk=1, keep_checkpoints=True)
        ).record(
            checkpoints.pretrained(NAME, steps=STEPS[:3], backend="bridge"),
        )
    _same_trajectory(swept, kept)
    assert all(hub.cached_commit(NAME, r) is not None for r in REVISIONS[:3])
    assert not (tmp_path / "b" / sweep.CACHE).exists()


def _same_trajectory(a, b) -> None:
    """`a` equals `b` at `a`'s steps, bit for bit."""
    b = b.select(steps=a.steps.tolist())
    assert a.steps.tolist() == b.steps.tolist()
    for name in ("zbar", "c_hat", "previous_token"):
        torch.testing.assert_close(
            torch.as_tensor(getattr(a, name)[:]), torch.as_tensor(getattr(b, name)[:]),
            rtol=0, atol=0,
        )  # fmt: skip


def test_sweep_refuses_a_disk_too_small_with_sizes(revisions, cache, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with LoopbackHub({NAME: revisions}) as server, server.use():
        source = checkpoints.pretrained(NAME, steps=STEPS, backend="bridge")
        with pytest.raises(sweep.DiskError, match=r"a revision is .*kB.*2 on disk.*1 kB free:"
                           r".*one on disk at a time \(on_disk=\).*download_dir"):  # fmt: skip
            Recorder(tmp_path / "out", _tokens(), QUIET).record(source)
        # keeping every revision: what helps is keeping fewer, not --on-disk 1
        keeping = r"5 on disk \(keep_checkpoints keeps every one\).*HF_HUB_CACHE.*without"
        with pytest.raises(sweep.DiskError, match=keeping + r" keep_checkpoints.*at most 2"):
            Recorder(tmp_path / "out", _tokens(), QUIET.replace(keep_checkpoints=True)).record(
                source
            )
    assert server.sent == {}  # nothing downloaded
    assert not (tmp_path / "out" / "manifest.json").exists()
    assert not (tmp_path / "out" / sweep.CACHE).exists()


@pytest.mark.slow  # sweeps in subprocesses (two interpreters, the hub): 20-25 s
def test_sigkill_mid_download_resumes_without_re_recording(revisions, cache, tmp_path):
    """A sweep killed while step4 downloads: the next run records step4 and step8 only,
    downloads no revision it had whole again, and removes the partial file the kill left
    (huggingface_hub never resumes it); the bound holds through both runs and the
    pre-cached step1 survives."""
    killed = threading.Event()
    out = tmp_path / "out"
    watch = Watch(out / sweep.CACHE)

    def on_chunk(repo, revision, file, sent, size):
        watch(repo, revision, file, sent, size)
        if revision == "step4" and file == "model.safetensors" and sent >= size // 2:
            killed.set()

    tokens = tmp_path / "tokens.safetensors"
    from safetensors.torch import save_file

    save_file({"tokens": _tokens()}, tokens)
    server = LoopbackHub({NAME: revisions}, bandwidth=1.5e5, on_chunk=on_chunk)
    with server:
        kept = _precache(server, "step1")
        before = _contents(cache)
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
    assert not list(tmp_path.rglob("*.incomplete"))
    one = max(_revision_bytes(f) for f in revisions.values())
    assert 0 < watch.peak <= 2 * one, (watch.peak, one)
    assert _contents(cache) == before  # step1, cached before, read from there: untouched
    assert hub.cached_commit(NAME, "step1") == kept.name
    assert not (out / sweep.CACHE).exists()  # nothing of the sweep's left


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
    from scansnap_lens.models.checkpoints import Checkpoint
    from scansnap_lens.models.formats import CheckpointError

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
    from _hub import word_tokenizer
    from safetensors.torch import save_file

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
        pinned = _precache(server, server.commit(NAME, "step1"))  # the user's, by hash
        before = _contents(cache)
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
    # TransformerLens read step0's config and tokenizer from the sweep's cache, step1's from
    # the user's: nothing written there, and the sweep's downloads are gone
    assert _contents(cache) == before and pinned.is_dir()
    assert server.sent.get((NAME, "step1", "model.safetensors"), 0) == (
        (folders["step1"] / "model.safetensors").stat().st_size  # the user's download only
    )
    assert not (out / sweep.CACHE).exists()


def _sweep(server, out, steps, **kwargs):
    with server.use():
        source = checkpoints.pretrained(NAME, steps=steps, backend="bridge")
        return Recorder(out, _tokens(), QUIET.replace(**kwargs)).record(source)


def _watched(repos, out: Path, **kwargs):
    """A hub whose every chunk sent samples the blobs of `out`'s sweep cache (``watch``)."""
    watch = Watch(out / sweep.CACHE)
    server = LoopbackHub(repos, on_chunk=watch, **kwargs)
    server.watch = watch
    return server


def _bound(server, revisions) -> None:
    one = max(_revision_bytes(f) for f in revisions.values())
    assert server.watch.peak <= 2 * one, (server.watch.peak, one)


def test_placed_steps_sweep_within_the_bound_and_leave_the_users_cache(
    revisions, cache, tmp_path, kept
):
    """`record --steps auto` over hub revisions (`placement.record_placed`): each round is a
    sweep of its own steps, within the disk bound, reading the user's cached revision and
    deleting its own downloads; the values equal the kept recording's at the steps chosen,
    at most the budget, each with why."""
    from scansnap_lens.planning.placement import PLACEMENT_FILE, record_placed

    out = tmp_path / "placed"
    server = _watched({NAME: revisions}, out)
    with server:
        _precache(server, "step2")
        before = _contents(cache)
        with server.use():
            source = checkpoints.pretrained(NAME, steps=STEPS, backend="bridge")  # the hub's
            recorder = Recorder(out, _tokens(), QUIET.replace(on_disk=1))
            traj = record_placed(recorder, source, budget=4)
    steps = traj.steps.tolist()
    assert 3 <= len(steps) <= 4 and set(steps) <= set(STEPS) and {0, 8} <= set(steps)
    _same_trajectory(traj, kept.select(steps=steps))
    assert server.watch.peak <= max(_revision_bytes(f) for f in revisions.values())
    assert _contents(cache) == before
    assert not (out / sweep.CACHE).exists()
    why = json.loads((out / PLACEMENT_FILE).read_text())["steps"]
    assert sorted(map(int, why)) == steps


def test_a_revision_pinned_by_hash_is_read_from_the_users_cache(revisions, cache, tmp_path, kept):
    """snapshot_download(revision=<sha>) leaves no ref: the sweep finds the commit from the
    hub's listing, reads it where it is, downloads it no second time and deletes nothing."""
    with _watched({NAME: revisions}, tmp_path / "out") as server:
        pinned = _precache(server, server.commit(NAME, "step4"))
        assert not (pinned.parents[1] / "refs" / "step4").exists()
        before = _contents(cache)
        traj = _sweep(server, tmp_path / "out", STEPS)
    size = (revisions["step4"] / "model.safetensors").stat().st_size
    assert server.sent[(NAME, "step4", "model.safetensors")] == size  # the user's download
    assert _contents(cache) == before
    _same_trajectory(traj, kept)
    _bound(server, revisions)


def test_bookkeeping_from_elsewhere_deletes_nothing(revisions, cache, tmp_path, kept):
    """A recording folder from a colleague (or an archive, or an older version) whose
    downloads.json names this very cache and the user's revisions: nothing is read from it;
    the user's cache is byte-identical.  A link as the download folder is refused."""
    out = tmp_path / "theirs"
    with _watched({NAME: revisions}, out) as server:
        for revision in ("step0", "step1"):
            _precache(server, revision)
        before = _contents(cache)
        out.mkdir()
        (out / "downloads.json").write_text(json.dumps(
            {"repo": NAME, "cache": str(hub.cache_dir()), "revisions": ["step0", "step1"]}
        ))  # fmt: skip
        traj = _sweep(server, out, STEPS)
        assert _contents(cache) == before
        _same_trajectory(traj, kept)
        _bound(server, revisions)
        linked = tmp_path / "linked"
        linked.mkdir()
        (linked / sweep.CACHE).symlink_to(cache, target_is_directory=True)
        with pytest.raises(ValueError, match=r"hub-cache is a symbolic link"):
            _sweep(server, linked, [0, 1, 2])
        with pytest.raises(ValueError, match=r"is \(or holds, or is inside\) your hub cache"):
            _sweep(server, tmp_path / "other", [0, 2], download_dir=cache / "sub")
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("keep me")
        with pytest.raises(ValueError, match=r"holds files the sweep did not put there"):
            _sweep(server, tmp_path / "other", [0, 2], download_dir=tmp_path / "mine")
        # a marked cache from elsewhere (an older version's mark, another recording's id):
        # not this recording's, so neither used nor cleaned
        prepared = tmp_path / "prepared" / sweep.CACHE
        repo = "models--" + NAME.replace("/", "--")
        (prepared / repo).mkdir(parents=True)
        (prepared / sweep.SweepCache.MARK).write_text("{}")
        with pytest.raises(ValueError, match=r"is the download folder of another sweep"):
            _sweep(server, tmp_path / "prepared", [0, 2])
        # this recording's own cache (its id on both sides), whose blobs folder links into
        # the user's cache: nothing downloads or deletes through it
        (prepared / sweep.SweepCache.MARK).write_text(json.dumps({"id": "ours"}))
        (prepared.parent / sweep.SweepCache.ID).write_text("ours\n")
        (prepared / repo / "blobs").symlink_to(cache / repo / "blobs", target_is_directory=True)
        with pytest.raises(ValueError, match=r"or a folder in it, is a symbolic link"):
            _sweep(server, tmp_path / "prepared", [0, 2])
    assert _contents(cache) == before
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_kept_then_resumed_without_keeping_deletes_nothing_kept(revisions, cache, tmp_path, kept):
    with _watched({NAME: revisions}, tmp_path / "out") as server:
        _sweep(server, tmp_path / "out", [0, 1], keep_checkpoints=True)
        after_keep = _contents(cache)
        assert len(_snapshots(cache)) == 2
        traj = _sweep(server, tmp_path / "out", STEPS)
    assert _contents(cache) == after_keep
    _same_trajectory(traj, kept)
    _bound(server, revisions)
    assert not (tmp_path / "out" / sweep.CACHE).exists()


def test_a_mirror_with_the_same_commits_is_never_touched(revisions, cache, tmp_path, kept):
    """`git push --mirror` keeps commit hashes: the user's mirror holds the very commits the
    sweep downloads and deletes; deletion is by repository and revision, in the sweep's own
    cache, so the mirror's snapshots stay whole."""
    mirror = "someone/pythia-14m-mirror"
    repos = {NAME: revisions, mirror: revisions}
    with _watched(repos, tmp_path / "out", mirrors={mirror: NAME}) as server:
        for revision in ("step0", "step1"):
            _precache(server, revision, name=mirror)
        assert _snapshots(cache, mirror) == sorted(
            server.commit(NAME, r) for r in ("step0", "step1")
        )
        before = _contents(cache)
        traj = _sweep(server, tmp_path / "out", STEPS)
    assert _contents(cache) == before
    _same_trajectory(traj, kept)
    _bound(server, revisions)


def test_a_kill_after_the_last_record_is_cleaned_up_by_the_rerun(
    revisions, cache, tmp_path, monkeypatch
):
    """Killed after the last checkpoint was recorded and before its revision was deleted:
    the rerun has nothing to record and still deletes it, and the folder with it."""
    out = tmp_path / "out"
    with LoopbackHub({NAME: revisions}) as server:
        with monkeypatch.context() as patch:  # as if killed before each release
            patch.setattr(sweep.HubRevisions, "release", lambda self, checkpoint: None)
            patch.setattr(sweep.SweepCache, "close", lambda self, **kw: None)
            _sweep(server, out, [0, 1, 2])
        assert len(_snapshots(out / sweep.CACHE)) == 3
        traj = _sweep(server, out, [0, 1, 2])
    assert traj.steps.tolist() == [0, 1, 2]
    assert not (out / sweep.CACHE).exists() and _contents(cache) == {}


@contextlib.contextmanager
def _small_disk(folder: Path, size: int):
    """A tmpfs of `size` bytes at `folder` where this process may mount one (root on
    Linux), else `folder` on the disk it is on: yields whether it is a disk of its own."""
    folder.mkdir(parents=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
    ).returncode == 0  # fmt: skip
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _used(folder: Path) -> int:
    stat = os.statvfs(folder)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


@pytest.mark.parametrize("on_disk", [1, 2])
def test_the_disk_bound_counts_what_is_in_use(revisions, cache, tmp_path, on_disk, kept):
    """The bound is on the disk's space in use, sampled (statvfs) at every chunk sent, not
    on the files one can see: a recorded revision's space is free before the next download
    (its model released first), so `on_disk` revisions fit a disk that holds just them."""
    one = max(_revision_bytes(f) for f in revisions.values())
    folder = tmp_path / "small"
    with _small_disk(folder, on_disk * one + (256 << 10)) as own_disk:
        base, peak = _used(folder), [0]

        def on_chunk(repo, revision, file, sent, size):
            peak[0] = max(peak[0], _used(folder) - base)

        with LoopbackHub({NAME: revisions}, on_chunk=on_chunk) as server:
            traj = _sweep(server, tmp_path / "out", STEPS, on_disk=on_disk, download_dir=folder)
        _same_trajectory(traj, kept)
        # a tmpfs gives each small file (config, tokenizer, ref, lock, link) a page of its own,
        # for the revisions held and the next one's first files; elsewhere others' writes count
        files = max(sum(p.is_file() for p in f.iterdir()) for f in revisions.values()) + 3
        slack = (on_disk + 1) * files * 4096 if own_disk else one // 2
        assert 0 < peak[0] <= on_disk * one + slack, (peak[0], one, own_disk)


def test_a_snapshot_is_trusted_only_with_the_listed_content(
    revisions, cache, tmp_path, monkeypatch, kept
):
    """The user's snapshot of step2 whose weights link to step1's blob: not read (step2 is
    downloaded into the sweep's own cache and recorded as itself), not touched, and with
    keep_checkpoints refused, saying which file; in the sweep's own cache, a snapshot that
    links to another revision's snapshot is refused, nothing downloaded or deleted through
    it."""
    with LoopbackHub({NAME: revisions}) as server:
        one, two = _precache(server, "step1"), _precache(server, "step2")
        weights = two / "model.safetensors"
        weights.unlink()
        weights.symlink_to(os.readlink(one / "model.safetensors"))
        before = _contents(cache)
        traj = _sweep(server, tmp_path / "out", [0, 1, 2])
        _same_trajectory(traj, kept)
        assert server.sent[(NAME, "step2", "model.safetensors")] == 2 * (
            revisions["step2"] / "model.safetensors").stat().st_size  # fmt: skip
        assert _contents(cache) == before
        with pytest.raises(checkpoints.CheckpointError, match=r"model\.safetensors unlike"):
            _sweep(server, tmp_path / "kept", [2], keep_checkpoints=True)
        assert _contents(cache) == before
        out = tmp_path / "linked"
        _killed_sweep(server, out, [0, 1], monkeypatch)
        own = out / sweep.CACHE / ("models--" + NAME.replace("/", "--")) / "snapshots"
        planted = own / server.commit(NAME, "step2")
        planted.symlink_to(one, target_is_directory=True)
        with pytest.raises(ValueError, match=r"or a folder in it, is a symbolic link"):
            _sweep(server, out, [0, 1, 2])
    assert _contents(cache) == before


def _killed_sweep(server, out, steps, monkeypatch, **kwargs):
    """A sweep killed after recording `steps` and before deleting any download."""
    with monkeypatch.context() as patch:
        patch.setattr(sweep.HubRevisions, "release", lambda self, checkpoint: None)
        patch.setattr(sweep.SweepCache, "close", lambda self, **kw: None)
        _sweep(server, out, steps, **kwargs)


def test_the_sweep_deletes_only_what_it_made(revisions, cache, tmp_path, monkeypatch, kept):
    """The sweep's cache holds the user's files too: a download folder inside the recording
    (or holding it) is refused before anything is recorded; a scratch folder the user
    filled after a killed sweep keeps their files when the identical command resumes and
    ends; a folder that was empty before stays; another recording's marked folder is
    refused, not cleaned."""
    out = tmp_path / "o4"
    with LoopbackHub({NAME: revisions}) as server:
        for inside in (out / "checkpoints", out):  # o4/checkpoints: the recording's own
            with pytest.raises(ValueError, match=r"inside\) the recording folder .*o4"):
                _sweep(server, out, [0, 1], download_dir=inside)
        with pytest.raises(ValueError, match=r"holds, or is inside\) the recording folder"):
            _sweep(server, tmp_path / "outer" / "o4", [0, 1], download_dir=tmp_path / "outer")
        assert not list(tmp_path.rglob("manifest.json"))
        scratch = tmp_path / "scratch"
        _killed_sweep(server, out, [0, 1], monkeypatch, download_dir=scratch)
        assert len(_snapshots(scratch)) == 2
        (scratch / "notes.txt").write_text("mine")
        (scratch / "models--EleutherAI--pythia-14m" / "mine.txt").write_text("mine too")
        (scratch / "empty").mkdir()
        traj = _sweep(server, out, STEPS, download_dir=scratch)  # as the docs say: resume
        _same_trajectory(traj, kept)
        assert sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*")) == [
            "empty", "models--EleutherAI--pythia-14m",
            "models--EleutherAI--pythia-14m/mine.txt", "notes.txt",
        ]  # fmt: skip
        assert not (out / sweep.SweepCache.ID).exists()
        given = tmp_path / "given"
        given.mkdir()
        _sweep(server, tmp_path / "o5", [0, 1], download_dir=given)
        assert given.is_dir() and not any(given.iterdir())
        # someone else's killed sweep: its downloads are theirs to resume
        theirs = tmp_path / "theirs"
        _killed_sweep(server, tmp_path / "o6", [0, 1], monkeypatch, download_dir=theirs)
        before = _contents(theirs)
        with pytest.raises(ValueError, match=r"download folder of another sweep .*o6"):
            _sweep(server, tmp_path / "o7", [0, 1, 2], download_dir=theirs)
        assert _contents(theirs) == before
    assert _contents(cache) == {}


@pytest.mark.slow  # sweeps in subprocesses (two interpreters, the hub): 20-25 s
def test_two_sweeps_at_once_leave_nothing_and_share_no_download_folder(
    revisions, cache, tmp_path, kept
):
    """Two sweeps of one repository at the same time, from one user's cache (step1 in it):
    each downloads into its own folder and deletes only there, so neither deletes what the
    other loads, and nothing is left; a second sweep naming a download folder in use is
    refused, with nothing of the first one's lost."""
    from safetensors.torch import save_file

    tokens = tmp_path / "tokens.safetensors"
    save_file({"tokens": _tokens()}, tokens)
    with LoopbackHub({NAME: revisions}, bandwidth=4e5) as server:
        _precache(server, "step1")
        before = _contents(cache)
        env = {**os.environ, "HF_ENDPOINT": server.endpoint, "HF_HUB_OFFLINE": "0",
               "HF_HUB_CACHE": str(cache)}  # fmt: skip

        def command(out, *extra):
            return [sys.executable, "-m", "scansnap_lens.cli", "record", "--model", NAME,
                    "--backend", "bridge", "--steps", "0,1,2,4,8", "--tokens", str(tokens),
                    "--out", str(out), "--prompt-length", "0", *extra]  # fmt: skip

        runs = [subprocess.Popen(command(tmp_path / f"run{i}"), env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                for i in range(2)]  # fmt: skip
        while not any((tmp_path / "run0" / sweep.CACHE).glob("models--*/blobs/*")):
            time.sleep(0.05)
            assert runs[0].poll() is None, runs[0].communicate()[0][-3000:]
        shared = command(tmp_path / "run2", "--download-dir", str(tmp_path / "run0" / sweep.CACHE))
        refused = subprocess.run(shared, env=env, capture_output=True, text=True, timeout=300)
        outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "is the download folder of a sweep running now" in refused.stderr
    for run, output in zip(runs, outputs):
        assert run.returncode == 0, output[-3000:]
    for i in range(2):
        _same_trajectory(Trajectory.load(tmp_path / f"run{i}"), kept)
    assert _contents(cache) == before
    assert not any((tmp_path / f"run{i}" / sweep.CACHE).exists() for i in range(2))


def test_a_truncated_revision_is_a_checkpoint_error_and_skipped(revisions, cache, tmp_path):
    """A hub revision that serves a truncated model.safetensors (an upload cut short): the
    sweep names the file, and on_error="skip" records the others; nothing is left behind."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(revisions["step1"], broken)
    with open(broken / "model.safetensors", "r+b") as handle:
        handle.truncate((broken / "model.safetensors").stat().st_size // 2)
    served = {**{r: revisions[r] for r in REVISIONS[:3]}, "step1": broken}
    with LoopbackHub({NAME: served}) as server:
        with pytest.raises(checkpoints.CheckpointError, match=r"model\.safetensors is truncated"):
            _sweep(server, tmp_path / "a", [0, 1, 2])
        traj = _sweep(server, tmp_path / "b", [0, 1, 2], on_error="skip")
    assert traj.steps.tolist() == [0, 2] and [s["step"] for s in traj.skipped] == [1]
    assert "model.safetensors is truncated or corrupt" in traj.skipped[0]["error"]
    assert not (tmp_path / "b" / sweep.CACHE).exists() and _contents(cache) == {}


def test_step_names_that_serve_one_weights_file_are_found_before_any_download(
    revisions, cache, tmp_path
):
    """A public suite's fault: several step branches serve the final-era weights file.  The
    hashes the hub lists find them before a byte of weights is downloaded: refused by
    default, saying which; "skip" records the last step of each group and notes the rest."""
    served = {r: revisions["step8"] for r in ("step0", "step1", "step2")}
    served.update(step4=revisions["step4"], step8=revisions["step8"])
    with LoopbackHub({NAME: served}) as server:
        with pytest.raises(sweep.DuplicateWeightsError) as refused:
            _sweep(server, tmp_path / "a", STEPS)
        assert not [k for k in server.sent if k[2] == "model.safetensors"]
        assert not (tmp_path / "a" / "manifest.json").exists()
        skipped = _sweep(server, tmp_path / "b", STEPS, duplicates="skip")
        resumed = _sweep(server, tmp_path / "b", STEPS, duplicates="skip")  # nothing new
        everything = _sweep(server, tmp_path / "c", STEPS, duplicates="record")
    message = str(refused.value)
    assert "3 of 5 checkpoints serve weights identical to another step's" in message
    assert "steps 0, 1, 2 (3) serve the weights of step 8" in message
    assert "duplicates='skip'" in message
    assert "--duplicates skip" in cli_message(refused.value)  # the command line's spelling
    assert skipped.steps.tolist() == resumed.steps.tolist() == [4, 8]
    assert [s["step"] for s in resumed.skipped] == [0, 1, 2]
    assert "serves the same weights as step 8" in resumed.skipped[0]["error"]
    assert everything.steps.tolist() == STEPS
    assert _contents(cache) == {}


@pytest.mark.slow
def test_a_ray_sweep_over_two_workers_equals_the_sequential_one(revisions, cache, tmp_path, kept):
    """`record --ray`: one task per revision on a local Ray instance (2 CPUs), each worker
    fetching its revision as the sweep does: the user's step2 read from their cache (its
    weights never sent again), the others downloaded into the sweep's own cache and deleted
    there by the worker once recorded, at most on_disk=2 recording at once (the bound held,
    sampled at every chunk sent), the user's cache byte-identical, the trajectory the
    sequential sweep's, the sweep's cache gone at the end."""
    ray = pytest.importorskip("ray")
    from scansnap_lens.distributed import connect, ray_execute

    out = tmp_path / "out"
    with _watched({NAME: revisions}, out, bandwidth=2e6) as server:
        precached = _precache(server, "step2")
        before = _contents(cache)
        sent_before = dict(server.sent)
        if ray.is_initialized():
            ray.shutdown()  # workers start with this environment: the hub, the user's cache
        with server.use(), _env(HF_ENDPOINT=server.endpoint, HF_HUB_OFFLINE="0"):
            connect(num_cpus=2)
            try:
                source = checkpoints.pretrained(NAME, steps=STEPS, backend="bridge")
                traj = Recorder(out, _tokens(), QUIET.replace(on_disk=2)).record(
                    source, execute=ray_execute()
                )
            finally:
                ray.shutdown()
    _same_trajectory(traj, kept)
    assert traj.steps.tolist() == STEPS
    _bound(server, revisions)
    assert server.watch.peak > 0  # the workers' downloads were seen
    assert _contents(cache) == before and hub.cached_commit(NAME, "step2") == precached.name
    assert not (out / sweep.CACHE).exists()
    weights = (revisions["step0"] / "model.safetensors").stat().st_size
    key = (NAME, "step2", "model.safetensors")
    # the user's own download may have resumed once under load (a Range request re-sends its
    # tail); what matters is that the sweep sent none of it again
    assert server.sent[key] == sent_before[key] >= weights


@contextlib.contextmanager
def _env(**values):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_duplicates_compare_content_and_trust_names_only_of_hub_blobs(tmp_path):
    """Checkpoints linked in from run folders are all called model.safetensors: compared by
    content, three different ones are three; a copy under another name is found; links into
    a hub cache's blobs are compared by the blob's name (content-addressed), unread."""
    links = {}
    for step in (0, 5, 10):
        run = tmp_path / f"run{step}"
        run.mkdir()
        (run / "model.safetensors").write_bytes(os.urandom(3000) + bytes([step]))
        link = tmp_path / "linked" / f"checkpoint-{step}" / "model.safetensors"
        link.parent.mkdir(parents=True)
        link.symlink_to(run / "model.safetensors")
        links[step] = [link]
    assert sweep.same_weights(sweep.local_weights_ids(links)) == []
    copy = tmp_path / "copy.bin"
    copy.write_bytes((tmp_path / "run5" / "model.safetensors").read_bytes())
    assert sweep.same_weights(sweep.local_weights_ids({**links, 7: [copy]})) == [[5, 7]]
    blobs = tmp_path / "cache" / "models--a--b" / "blobs"
    blobs.mkdir(parents=True)
    sha = "ab" * 32
    (blobs / sha).write_bytes(b"weights")
    snapped = {}
    for step, commit in ((1, "c" * 40), (2, "d" * 40)):
        file = blobs.parent / "snapshots" / commit / "model.safetensors"
        file.parent.mkdir(parents=True)
        file.symlink_to(f"../../blobs/{sha}")
        snapped[step] = [file]
    assert sweep.local_weights_ids(snapped) == {1: (f"blob:{sha}",), 2: (f"blob:{sha}",)}


def test_a_crafted_note_names_nothing_to_delete(tmp_path):
    """A killed sweep's folder from elsewhere, whose notes name a path as their commit
    (absolute or climbing out), a path as their repository or revision, or a list: each note
    is left with a warning naming it; the user's files outside (a results file, the empty
    files of a package) stay, and the sweep's own folder is closed without a traceback."""
    me = tmp_path / "me"
    (me / "results").mkdir(parents=True)
    (me / "results.json").write_text("mine")
    (me / "results" / "__init__.py").write_text("")
    before = _contents(me)
    cache = sweep.SweepCache(tmp_path / "downloads").open()
    made = cache.folder / sweep.SweepCache.MADE
    made.mkdir()
    crafted = [
        {"repo": NAME, "revision": "step0", "commit": str(me / "results")},
        {"repo": NAME, "revision": "step0", "commit": "../../../me/results"},
        {"repo": "../../me", "revision": "step0", "commit": "a" * 40},
        {"repo": NAME, "revision": "../../../me", "commit": "a" * 40},
        {"repo": [NAME], "revision": "step0"},
    ]
    for i, note in enumerate(crafted):
        (made / f"{i}.json").write_text(json.dumps(note))
    with pytest.warns(UserWarning, match=r"is not a note the sweep wrote") as said:
        cache.close(repos={NAME})
    assert len(said) == len(crafted)
    assert "is not a commit id" in str(said[0].message) and "0.json" in str(said[0].message)
    assert "is not a hub repository name" in str(said[4].message)
    assert _contents(me) == before


def test_power_with_a_hub_model_reads_its_config_alone_and_downloads_nothing_of_its_own(
    revisions, cache, tmp_path, capsys
):
    """`record --model --power` counts the watched heads from the first revision's
    config.json (fetched into a temporary folder, not the user's hub cache), so the weights
    are downloaded once, by the sweep, into its own cache and deleted there; a --power out
    of range is refused before anything is asked of the hub (it downloaded a revision into
    the user's cache first, and kept it)."""
    from scansnap_lens.cli import main
    from scansnap_lens.inputs.tokens import save_tokens
    from scansnap_lens.lab.calibration import CorpusScenario, corpus_text

    scenario = CorpusScenario(vocab=MODEL["vocab_size"], rows=600, seq_len=24, tied=True)
    text, queries = corpus_text(scenario, seed=0)
    save_tokens(tmp_path / "corpus.safetensors", text[128:])
    save_tokens(tmp_path / "eval.safetensors", text[:128])
    stats = tmp_path / "stats.safetensors"
    assert main(["stats", str(tmp_path / "corpus.safetensors"), "--out", str(stats),
                 "--vocab-size", str(MODEL["vocab_size"]), "--window", "16", "--queries",
                 ",".join(map(str, queries.tolist()))]) == 0  # fmt: skip
    args = ["record", "--model", NAME, "--steps", "0,1", "--tokens",
            str(tmp_path / "eval.safetensors"), "--stats", str(stats),
            "--download-dir", str(tmp_path / "downloads")]  # fmt: skip
    with LoopbackHub({NAME: revisions}) as server, server.use():
        assert main([*args, "--out", str(tmp_path / "far"), "--power", "2"]) == 2
        assert server.requests == [] and _contents(cache) == {}
        assert "--power is the AUROC to detect, in (0.5, 1]" in capsys.readouterr().err
        assert main([*args, "--out", str(tmp_path / "a"), "--power", "0.8"]) == 0
    err = capsys.readouterr().err
    assert "--power 0.8: " in err and " rows -> AUROC >= " in err
    assert _contents(cache) == {}  # nothing of it in the user's hub cache
    weights = [p for _, p, _, _ in server.requests if p.endswith("model.safetensors")]
    configs = [p for m, p, _, _ in server.requests if p.endswith("config.json") and m == "GET"]
    assert len(weights) == 2, weights  # step0 and step1, each once, by the sweep
    assert configs, server.requests
    assert Trajectory.load(tmp_path / "a").steps.tolist() == [0, 1]
    assert not any((tmp_path / "downloads").rglob("*.safetensors"))  # deleted once recorded


def test_two_sweeps_opening_one_new_download_folder_at_once_never_both_hold_it(
    tmp_path, monkeypatch
):
    """The second sweep opens the new folder while the first is making it (between its
    checks and its mark): one of them holds it, the other is refused by name.  The mark was
    written by a rename and locked after, so the first replaced the second's mark and both
    held a lock (4 of 30 tries from outside); now it is visible only once locked."""
    folder = tmp_path / "downloads"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first, second = (sweep.SweepCache(folder, tmp_path / name) for name in ("a", "b"))
    real, opened = sweep.make_folder, []

    def meanwhile(path):
        made = real(path)
        if not opened:  # once: the second sweep, in full, between the first's check and mark
            opened.append(None)
            opened[0] = second.open()
        return made

    monkeypatch.setattr(sweep, "make_folder", meanwhile)
    with pytest.raises(ValueError, match="download folder of a sweep running now"):
        first.open()
    assert opened[0]._handle is not None
    mark = json.loads((folder / sweep.SweepCache.MARK).read_text())
    assert mark["recording"] == str((tmp_path / "b").resolve())
    assert sorted(p.name for p in folder.iterdir()) == [sweep.SweepCache.MARK]  # no temp left
    opened[0].close()


@pytest.mark.parametrize("tamper", ["another step's bytes", "one bit flipped"])
def test_a_cached_file_whose_content_is_not_the_listed_one_is_refused_by_name(
    revisions, cache, tmp_path, monkeypatch, tamper
):
    """A blob named with step 2's listed sha256 but holding step 1's bytes (or step 2's
    with one bit flipped), linked from step 2's snapshot in the user's hub cache, was
    recorded as step 2: a linked file was checked by the name of the blob it lands on.  Its
    content is read now: online, against the hub's listing, it is said by name and not
    read (step 2 comes from the hub, into the sweep's own cache); offline, against the
    blob's own name, the recording refuses it naming the file; the cache is not changed."""
    from scansnap_lens.models.formats import CheckpointError

    with LoopbackHub({NAME: revisions}) as server, server.use():
        keep = QUIET.replace(on_disk=1, keep_checkpoints=True)
        Recorder(tmp_path / "kept", _tokens(), keep).record(
            checkpoints.pretrained(NAME, steps=[1, 2], backend="bridge")
        )
    snapshot = hub.repo_folder(NAME) / "snapshots"
    one, two = ((snapshot / hub.cached_commit(NAME, r) / "model.safetensors").resolve()
                for r in ("step1", "step2"))  # fmt: skip
    if tamper == "one bit flipped":
        data = bytearray(two.read_bytes())
        data[len(data) // 2] ^= 1
        two.write_bytes(bytes(data))
    else:
        two.write_bytes(one.read_bytes())
    before = _contents(cache)
    with LoopbackHub({NAME: revisions}) as server, server.use():
        with pytest.warns(UserWarning, match=r"model\.safetensors in your hub cache .* not read"):
            online = Recorder(tmp_path / "online", _tokens(), QUIET).record(
                checkpoints.pretrained(NAME, steps=[2], backend="bridge")
            )
        _same_trajectory(online, Recorder(tmp_path / "fresh", _tokens(), QUIET).record(
            checkpoints.pretrained(NAME, steps=[2], backend="bridge")))  # fmt: skip
    assert server.sent[(NAME, "step2", "model.safetensors")] >= 2 * two.stat().st_size
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "offline", lambda: True)
    with pytest.raises(CheckpointError, match=r"model\.safetensors in your hub cache"):
        Recorder(tmp_path / "offline", _tokens(), QUIET).record(
            checkpoints.pretrained(NAME, steps=[2], backend="bridge")
        )
    assert _contents(cache) == before
