"""No write through a link: every file the package writes goes through `_io`'s one writer (a
unique temporary made with O_EXCL, a rename, links refused), and a folder from someone else
with links planted at the names the commands write cannot make them write anywhere else.

The names are found by listing what each command writes into a clean folder (for the report,
one of each kind: its many CSVs and figures share one writer each), then a link to a file
outside is planted at each of them (and at the fixed temporary names the writers used
to open, NAME.tmp) in a folder holding that command's output, and the command run again:
it refuses, naming the link or what it read through it (exit 2, no traceback), or succeeds
without following it; the file outside never changes and nothing appears outside the
folder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from scansnap_lens import _io
from scansnap_lens.cli import main
from scansnap_lens.inputs.tokens import save_tokens
from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium
from scansnap_lens.models.training import attention_only_model, train

PACKAGE = Path(__file__).resolve().parents[1] / "scansnap_lens"
# the only module that opens files for writing
WRITERS = {"_io.py"}
PRIVATE = "# into its own mkdtemp folder"
WRITING = re.compile(
    r"open\([^)]*[\"'][wax+][bt+]?[\"']|\.write_(text|bytes)\(|\.mkdir\(|(?<!`)torch\.save\(|"
    r"np\.save\(|shutil\.(copy|move)|save_pretrained\(|\.savefig\((?!buffer)|\.save\(str\("
)


def test_every_writer_of_the_package_is_the_one_safe_writer():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in WRITERS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.rstrip().endswith(PRIVATE):  # into a folder it made itself (mkdtemp)
                continue
            if WRITING.search(line) and not line.lstrip().startswith(("#", ">>>", "...")):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not found, "writes that bypass scansnap_lens._io:\n" + "\n".join(found)


def test_the_writer_refuses_links_and_leaves_no_temporary(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("mine")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.json").symlink_to(outside)
    with pytest.raises(ValueError, match=r"a\.json is a symbolic link"):
        _io.write_text(folder / "a.json", "{}")
    (folder / "linked").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="linked is a symbolic link"):
        _io.write_text(folder / "linked" / "b.json", "{}")
    with pytest.raises(ValueError, match="symbolic link"):
        _io.make_folder(folder / "linked")
    (folder / "lock").symlink_to(outside)
    with pytest.raises(ValueError, match="lock is a symbolic link"):
        _io.open_lock(folder / "lock")
    (folder / "c.json.tmp").symlink_to(outside)  # the old fixed temporary name: not opened
    _io.write_text(folder / "c.json", "{}")
    assert outside.read_text() == "mine" and (folder / "c.json").read_text() == "{}"
    assert sorted(p.name for p in folder.iterdir()) == ["a.json", "c.json", "c.json.tmp",
                                                        "linked", "lock"]  # fmt: skip
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        _io.write_text(folder, "x")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A user's run: checkpoints, a training corpus and evaluation tokens."""
    root = tmp_path_factory.mktemp("links")
    classes = syn_medium(1)
    sample = sequence_sampler(classes, seq_len=16)
    model = attention_only_model(classes.vocab_size, d_model=16, n_ctx=24, seed=0)
    train(model, sample, num_steps=10, lr_y=0.1, lr_z=3.0, batch_size=16, save_steps=[0, 10],
          out=root / "ckpt", loss_on="last", progress=False)  # fmt: skip
    save_tokens(root / "corpus.safetensors", sample(64, torch.Generator().manual_seed(1)))
    save_tokens(root / "eval.safetensors", sample(8, torch.Generator().manual_seed(2)))
    (root / "text.txt").write_text("one two three four five six seven eight nine ten\n" * 20)
    from scansnap_lens.inputs.text import word_level_tokenizer

    words = word_level_tokenizer(["one two three four five six seven eight nine ten"])
    (root / "tokenizer.json").write_text(words.to_str())
    return root, classes.vocab_size


def _commands(root: Path, vocab: int, out: Path) -> dict[str, list[str]]:
    return {
        "stats": ["stats", str(root / "corpus.safetensors"), "--vocab-size", str(vocab),
                  "--out", str(out / "stats.safetensors")],
        "tokens": ["tokens", str(root / "text.txt"), "--out", str(out / "eval.safetensors"),
                   "--seq-len", "8", "--tokenizer", str(root / "tokenizer.json")],
        "theory": ["theory", "--K", "2", "--M", "33", "--lr-y", "0.1", "--lr-z", "3",
                   "--csv", str(out / "theory.csv")],
        "record": ["record", "--checkpoints", str(root / "ckpt"), "--tokens",
                   str(root / "eval.safetensors"), "--out", str(out / "traj"),
                   "--prompt-length", "8"],
        "report": ["report", str(root / "traj"), "--stats", str(root / "stats.safetensors"),
                   "--out", str(out / "report")],
    }  # fmt: skip


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["stats", "tokens", "theory", "record", "report"])
@pytest.mark.tl
def test_no_command_writes_through_a_link_planted_at_any_name_it_writes(
    run, command, tmp_path, capsys
):
    root, vocab = run
    for needed in ("record", "stats"):  # the report reads a trajectory and statistics
        if not (root / ("traj" if needed == "record" else "stats.safetensors")).exists():
            assert main(_commands(root, vocab, root)[needed]) == 0
    clean = tmp_path / "clean"
    assert main(_commands(root, vocab, clean)[command]) == 0
    names = sorted(_files(clean))
    assert names, "the command wrote nothing"
    if command == "report":  # its many files share a few writers: one name of each kind
        names = sorted({n.suffix: n for n in reversed(names)}.values())
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    folders = sorted({p.relative_to(clean) for p in clean.rglob("*") if p.is_dir()})
    # the fixed temporary names no writer opens now (report: its one writer is checked above)
    old = [] if command == "report" else [n.with_name(n.name + ".tmp") for n in names]
    planted = [*names, *old, *folders]
    for i, name in enumerate(planted):
        folder = tmp_path / f"planted{i}"
        shutil.copytree(clean, folder, symlinks=True)  # a folder with the command's output
        victim.write_text("untouched")
        target = folder / name
        if target.is_dir():  # a folder the command writes into: a link to one outside
            shutil.rmtree(target)
            target.symlink_to(outside, target_is_directory=True)
        else:
            target.unlink(missing_ok=True)
            target.symlink_to(victim)
        again = [_commands(root, vocab, folder)[command]]
        if command == "record":  # resuming, and replacing the folder's trajectory
            again.append(again[0] + ["--overwrite"])
        for argv in again:
            capsys.readouterr()
            code = main(argv)
            err = capsys.readouterr().err
            assert code in (0, 2), (name, code, err)
            if code == 2:  # refused, naming the link (or what it read through it)
                assert f"scansnap {command}: error: " in err and "Traceback" not in err, err
            assert victim.read_text() == "untouched", name
            assert sorted(p.name for p in outside.iterdir()) == ["victim"], name


def test_the_librarys_saves_refuse_a_planted_link(tmp_path):
    """`Trajectory.save`, `CooccurrenceStats.save` and `save_tokens` go through the one writer."""
    from scansnap_lens.lab.calibration import Scenario, crossed_run
    from scansnap_lens.statistics.corpus import cooccurrence

    outside = tmp_path / "outside"
    outside.write_text("mine")
    traj, _, _ = crossed_run(Scenario(queries=3), heads=1)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "manifest.json").symlink_to(outside)
    rows = torch.tensor([[1, 2, 3, 4]])
    (tmp_path / "s.safetensors").symlink_to(outside)
    (tmp_path / "k.safetensors").symlink_to(outside)
    for save in (lambda: traj.save(tmp_path / "t"),
                 lambda: cooccurrence(rows, 5).save(tmp_path / "s.safetensors"),
                 lambda: save_tokens(tmp_path / "k.safetensors", rows)):  # fmt: skip
        with pytest.raises(ValueError, match="is a symbolic link"):
            save()
    assert outside.read_text() == "mine"


def test_a_stage_is_seen_by_its_name_only_once_locked_so_a_kill_leaves_one_to_remove(
    tmp_path, monkeypatch
):
    """A kill between a stage's making and its lock left a `.partial` without a lock, kept
    for a minute by its age (a report killed at that moment under load left it beside the
    folder): the stage takes its name once locked, and a lockless one, from a kill before
    that, goes by its age."""
    import os
    import time

    out = tmp_path / "r"
    seen = []
    real = _io.open_lock

    def watching(path):
        seen.append(sorted(p.name for p in tmp_path.glob(".r.*.partial")))
        return real(path)

    monkeypatch.setattr(_io, "open_lock", watching)
    with _io.staged_folder(out) as stage:
        assert stage.suffix == ".partial" and (stage / _io.STAGE_LOCK).is_file()
        (stage / "a.txt").write_text("a")
    assert seen == [[]] and (out / "a.txt").read_text() == "a"
    monkeypatch.setattr(_io, "open_lock", real)
    # what a kill leaves: one locked stage (named), one before its lock (unnamed, old)
    killed, early = tmp_path / ".r.k1.partial", tmp_path / ".r.k2.new"
    killed.mkdir()
    (killed / _io.STAGE_LOCK).write_text(json.dumps({"made_by": _io.STAGE_MARK}))
    early.mkdir()
    os.utime(early, (time.time() - 120, time.time() - 120))
    young = tmp_path / ".r.k3.new"  # another process's, a moment old: kept
    young.mkdir()
    marked = tmp_path / ".r.k4.new"  # another's, marked and not yet locked: kept
    marked.mkdir()
    (marked / _io.STAGE_LOCK).write_text(json.dumps({"made_by": _io.STAGE_MARK}))
    with _io.staged_folder(out):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [".r.k3.new", ".r.k4.new", "r"]
    os.utime(marked, (time.time() - 120, time.time() - 120))  # a kill's, in that moment
    with _io.staged_folder(out):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [".r.k3.new", "r"]


def test_a_writer_arriving_between_a_stages_mark_and_its_lock_leaves_it(tmp_path, monkeypatch):
    """Another writer of the same --out that looks for stale stages in the moment between a
    stage's mark and its lock (seen as a hang of two reports at once, when the other's
    stage was removed under it) leaves that stage alone."""
    out, real, looked = tmp_path / "r", _io.open_lock, []

    def another_writer_now(path):
        if not looked:
            looked.append(path)
            _io._remove_stale_stages(out)
        return real(path)

    monkeypatch.setattr(_io, "open_lock", another_writer_now)
    with _io.staged_folder(out) as stage:
        (stage / "a.txt").write_text("a")
    assert (out / "a.txt").read_text() == "a"


def test_a_users_folder_named_like_a_stage_is_never_removed(tmp_path):
    """Beside --out, `.r.mine.partial/` and `.r.backup.new/` of a user's, old and without
    the tool's lock, were removed whole with their contents by name and age alone; only a
    stage whose lock holds the tool's mark goes (and an empty one a kill left before it)."""
    import os
    import time

    out = tmp_path / "r"
    old = time.time() - 3600
    for name in (".r.mine.partial", ".r.backup.new", ".r.lock.partial"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "results.json").write_text("{}")
        os.utime(folder, (old, old))
    (tmp_path / ".r.lock.partial" / _io.STAGE_LOCK).write_text("mine")  # a lock not ours
    empty = tmp_path / ".r.k.new"  # a kill right after the stage was made: empty
    empty.mkdir()
    os.utime(empty, (old, old))
    with _io.staged_folder(out) as stage:
        (stage / "a.txt").write_text("a")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".r.backup.new",
        ".r.lock.partial",
        ".r.mine.partial",
        "r",
    ]
    for name in (".r.mine.partial", ".r.backup.new", ".r.lock.partial"):
        assert (tmp_path / name / "results.json").read_text() == "{}"


_KILLED_MID_MOVE = """
import os, sys
from pathlib import Path
from scansnap_lens import _io
out, after = Path(sys.argv[1]), int(sys.argv[2])
real, moved = os.replace, []
def replace(src, dst):
    real(src, dst)
    if Path(dst).parent == out and not str(dst).endswith("tmp"):
        moved.append(dst)
        if len(moved) == after:
            os.kill(os.getpid(), 9)  # SIGKILL: no handler, no finally
_io.os.replace = replace
with _io.staged_folder(out) as stage:
    for i in range(20):
        (stage / f"f{i:02d}.txt").write_text(f"new {i}")
    (stage / "only_new.txt").write_text("new")
"""


@pytest.mark.parametrize("after", [1, 5, 13])
def test_a_move_in_killed_at_any_file_is_rolled_back_by_the_next_writer(tmp_path, after):
    """SIGKILL during the move-in: it left 5 of 20 new files beside the old page, and the
    next report deleted the stage that kept the old files.  Now the stage's journal lets
    the next writer put every old file back (and take the new ones out) before it goes."""
    import subprocess
    import sys

    out = tmp_path / "r"
    out.mkdir()
    for i in range(20):
        (out / f"f{i:02d}.txt").write_text(f"old {i}")
    (out / "mine.txt").write_text("a user's")
    before = {p.name: p.read_text() for p in out.iterdir()}
    done = subprocess.run([sys.executable, "-c", _KILLED_MID_MOVE, str(out), str(after)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == -9, done.stderr
    mixed = {p.name: p.read_text() for p in out.iterdir()}
    assert mixed != before  # the kill landed inside the move-in
    with _io.staged_folder(tmp_path / "other"):  # a writer beside it: not its folder
        pass
    assert {p.name: p.read_text() for p in out.iterdir()} == mixed
    with _io.staged_folder(out):  # the next writer of this folder: rolled back, then nothing
        pass
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "r"]


def test_two_writers_into_one_folder_take_turns(tmp_path):
    """Two reports into one --out at once could fail with a raw [Errno 2] (one's move-in
    moving the other's backups): the move-ins take turns, and the folder ends as one of
    them wrote it, whole."""
    import threading

    out = tmp_path / "r"
    errors, barrier = [], threading.Barrier(2)

    def write(tag: str) -> None:
        try:
            with _io.staged_folder(out) as stage:
                for i in range(200):
                    (stage / f"f{i:03d}.txt").write_text(tag)
                barrier.wait(timeout=60)  # one that failed must not hang the other
        except Exception as err:
            errors.append(err)

    for _ in range(5):
        threads = [threading.Thread(target=write, args=(t,)) for t in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len({p.read_text() for p in out.iterdir()}) == 1
