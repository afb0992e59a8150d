"""Folders made by someone else: every file the tool reads from a recording, a saved analysis,
a report's stage or a sweep's download folder crafted by `hypothesis` (bytes, JSON of any
shape, links out of the folder, FIFOs, huge sparse files, folders in place of files), then
read the way the commands read them.  Nothing outside the tool's own files changes, nothing
raises but the errors the command line turns into a message (exit 2), nothing hangs.

    SCANSNAP_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz_folders.py   # the longer run
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from _tiny import QUIET, V, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scansnap_lens import _io
from scansnap_lens.models.backend import BackendError
from scansnap_lens.models.formats import CheckpointError
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.sweep import CACHE, SweepCache
from scansnap_lens.recording.trajectory import Trajectory

pytestmark = pytest.mark.tl

EXAMPLES = int(os.environ.get("SCANSNAP_FUZZ_EXAMPLES", "25"))
# what the command line turns into "error: ..." and exit 2 (`cli._main`)
SAID = (ValueError, KeyError, OSError, CheckpointError, BackendError, ImportError)
HANG_S = 20  # one reader, at most
REPO, COMMIT = "EleutherAI/pythia-14m", "a" * 40
SECRET = '{"accuracy": 0.9}'  # the user's file beside the folder: never changed, never read


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A recording of two checkpoints with its saved analysis, a sweep's download folder
    holding one noted revision, and a user's folder beside them (the sentinel): each as
    the tool's own writers make them."""
    root = tmp_path_factory.mktemp("made")
    tokens = torch.randint(0, V, (6, 12), generator=torch.Generator().manual_seed(0))
    run = root / "run"
    recorder = Recorder(run, tokens, QUIET, plan_recording(tokens, V))
    for step, seed in ((0, 0), (10, 1)):
        recorder.on_checkpoint(step, tiny_model(seed=seed))
    recorder.close()
    traj = Trajectory.load(run)
    analysis = Analysis.of(traj, cache=run / "analysis")
    (root / "heads.png").write_bytes(b"\x89PNG a kept figure")
    analysis.keep_figures({"heads": root / "heads.png"}, {"loss": "no loss was recorded"})
    cache = SweepCache(run / CACHE, run).open()
    cache.note(REPO, "step0", COMMIT)
    snapshot = run / CACHE / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    cache._handle.close()  # as a killed sweep leaves it: marked, noted, unlocked
    sentinel = root / "user"
    (sentinel / "results").mkdir(parents=True)
    (sentinel / "results.json").write_text(SECRET)
    (sentinel / "results" / ".gitkeep").write_text("")
    (sentinel / "results" / "__init__.py").write_text("")
    return {"root": root, "run": run, "tokens": tokens, "sentinel": sentinel}


def _targets(run: Path) -> list[str]:
    """Every file of the recording folder the tool reads, relative to it."""
    out = [p.relative_to(run).as_posix() for p in sorted(run.rglob("*")) if p.is_file()]
    return [*out, "../.out.mine.partial/.scansnap-staging.lock", "analysis/extra.json"]


def _digest(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.rglob("*")):
        key = path.relative_to(folder).as_posix()
        out[key] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
    return out


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=4),
    max_leaves=12,
)  # fmt: skip
# values a crafted note or manifest puts where the tool expects a name, an id or a count
HOSTILE = st.sampled_from(["/", "..", "../../..", "/tmp", "a" * 40, "../user/results", "", -1,
                           2**70, 1e308, None, [], {}, "step0", REPO, "\x00",
                           ["../../../user/results"]])  # fmt: skip


@st.composite
def crafts(draw, targets: list[str]):
    target = draw(st.sampled_from(targets))
    kind = draw(st.sampled_from(["bytes", "json", "hostile json", "edited json", "link out",
                                 "link to folder", "fifo", "huge", "folder", "removed",
                                 "empty"]))  # fmt: skip
    if kind == "bytes":
        return target, kind, draw(st.binary(max_size=256))
    if kind == "json":
        return target, kind, draw(JSON)
    if kind == "hostile json":
        keys = st.sampled_from(["repo", "revision", "commit", "id", "checkpoints", "step",
                                "file", "layers", "heads", "plan", "made_folder", "recording",
                                "format", "vocab_size", "loss_on", "meta", "settings",
                                "drawn", "failed", "key"])  # fmt: skip
        return target, kind, draw(st.dictionaries(keys, HOSTILE | JSON, max_size=6))
    if kind == "edited json":  # the tool's own file, one value changed (its key kept)
        return target, kind, (draw(st.lists(st.integers(0, 63), min_size=1, max_size=3)),
                              draw(HOSTILE))  # fmt: skip
    return target, kind, None


def _craft(run: Path, sentinel: Path, target: str, kind: str, value) -> None:
    path = run / target
    if kind == "edited json":
        if path.is_symlink() or not path.is_file():
            return  # a link or FIFO crafted before: editing would write where it points, or wait
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # not a JSON file of the tool's: nothing to edit
        route, hostile = value  # a value at some depth (a setting, a checkpoint's entry)
        inner = data
        for depth, index in enumerate(route):
            if isinstance(inner, dict) and inner:
                key = sorted(inner)[index % len(inner)]
            elif isinstance(inner, list) and inner:
                key = index % len(inner)
            else:
                break
            if depth == len(route) - 1 or not isinstance(inner[key], dict | list):
                inner[key] = hostile
                break
            inner = inner[key]
        path.write_text(json.dumps(data))
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):  # a file, a link or a FIFO (writing to one would block)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "bytes":
        path.write_bytes(value)
    elif kind in ("json", "hostile json"):
        path.write_text(json.dumps(value))
    elif kind == "link out":
        path.symlink_to(sentinel / "results.json")
    elif kind == "link to folder":
        path.symlink_to(sentinel / "results", target_is_directory=True)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        with open(path, "wb") as handle:
            handle.truncate(1 << 33)  # 8 GB, sparse
    elif kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")


@contextlib.contextmanager
def _at_most(seconds: int):
    def hung(signum, frame):
        raise TimeoutError(f"hung for {seconds} s")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def _reads(run: Path, tokens) -> list[str]:
    """Each way a command reads the folder, in turn: what each raised (only `SAID` errors
    may; anything else, or a hang, fails the test)."""
    said = []

    def load_analysis():
        analysis = Analysis.load(run / "analysis", Trajectory.load(run))
        kept = analysis.drawn_figures()  # what a report would put in its page
        assert not any(SECRET.encode() in (v if isinstance(v, bytes) else v.encode())
                       for v in kept.values()), "a file outside the folder was read"  # fmt: skip

    def resume():
        Recorder(run, tokens, QUIET).close()

    def sweep_cleanup():
        cache = SweepCache(run / CACHE, run).open()
        try:
            for note in cache.noted():
                cache.delete(note["repo"], note["revision"])
        finally:
            cache.close(repos=[REPO])

    readers = {"load": lambda: Trajectory.load(run), "analysis": load_analysis,
               "resume": resume, "sweep": sweep_cleanup,
               "stages": lambda: _io._remove_stale_stages(run.parent / "out")}  # fmt: skip
    for name, read in readers.items():
        try:
            with _at_most(HANG_S):
                read()
        except TimeoutError as err:
            raise AssertionError(f"{name} hung: {err}") from None
        except SAID as err:
            said.append(f"{name}: {type(err).__name__}")
        except MemoryError as err:
            raise AssertionError(f"{name} took all memory: a size was not bounded") from err
    return said


def test_every_file_a_folder_holds_crafted_by_someone_else(made, tmp_path_factory):
    """`EXAMPLES` crafted folders (one to three files each): only said errors, no hang,
    and the user's folder beside the recording never changes."""
    targets = _targets(made["run"])
    before = _digest(made["sentinel"])

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.function_scoped_fixture])  # fmt: skip
    @given(st.lists(crafts(targets), min_size=1, max_size=3))
    def crafted(changes):
        work = tmp_path_factory.mktemp("crafted")
        run, sentinel = work / "run", work / "user"  # "../user/results" from the run reaches it
        shutil.copytree(made["run"], run, symlinks=True)
        shutil.copytree(made["sentinel"], sentinel)
        for target, kind, value in changes:
            _craft(run, sentinel, target, kind, value)
        try:
            _reads(run, made["tokens"])
            assert _digest(sentinel) == before, changes
        finally:
            shutil.rmtree(work, ignore_errors=True)

    crafted()
