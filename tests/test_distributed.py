"""Statistics on a local Ray instance (2 CPUs, no dashboard): identical to one process."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import QUIET

from scansnap_lens.cli import main
from scansnap_lens.inputs.text import encode_documents, wikitext_documents, word_level_tokenizer
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.statistics.corpus import CooccurrenceStats, cooccurrence

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` leaves these out (docs/contributing.md)

ray = pytest.importorskip("ray")

FIELDS = ("query", "next_token", "events", "offsets", "token", "count")


@pytest.fixture(scope="module")
def local_ray():
    from scansnap_lens.distributed import connect

    started = not ray.is_initialized()
    connect(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


def assert_identical(a: CooccurrenceStats, b: CooccurrenceStats) -> None:
    a, b = a.canonical(), b.canonical()
    for name in FIELDS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.fingerprint, a.num_tokens, a.num_rows) == (b.fingerprint, b.num_tokens, b.num_rows)


def test_sharded_wikitext_equals_one_process(local_ray, shared_dir):
    from scansnap_lens.distributed import ray_cooccurrence
    from scansnap_lens.inputs.corpus import Corpus
    from scansnap_lens.statistics.context import Context
    from scansnap_lens.statistics.corpus import count_corpus

    docs = wikitext_documents(shared_dir / "data" / "wikitext-2" / "test.txt")[:60]
    tok = word_level_tokenizer(docs)
    rows = encode_documents(tok, docs)
    V = tok.get_vocab_size()
    one = cooccurrence(rows, V, window=32, min_count=2)
    corpus = Corpus.of(rows=rows, vocab_size=V)
    for shards, arity in ((5, 2), (3, 3)):  # uneven shards, a merge tree of 2 and of 3
        execute = partial(ray_cooccurrence, merge_arity=arity)
        many = count_corpus(corpus, Context(window=32), min_count=2, execute=execute,
                            shards=shards)  # fmt: skip
        assert_identical(one, many)


def test_ray_stats_on_an_indexed_corpus_through_the_command_line(local_ray, tmp_path):
    """`scansnap stats data.bin --ray`: the workers read their own ranges of documents."""
    from scansnap_lens.inputs.indexed import IndexedTokens

    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    g = np.random.default_rng(0)
    docs = [g.integers(0, 50, size=g.integers(3, 40)) for _ in range(50)]
    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "d.bin"), dtype=np.uint16)
    for d in docs:
        builder.add_document(torch.from_numpy(d.astype(np.int64)), [len(d)])
    builder.finalize(str(tmp_path / "d.idx"))
    assert IndexedTokens(tmp_path / "d").num_documents == 50
    for extra in ([], ["--ray", "--shards", "4"]):
        out = tmp_path / f"s{len(extra)}.safetensors"
        args = ["stats", str(tmp_path / "d.bin"), "--out", str(out), "--window", "8"]
        assert main([*args, "--vocab-size", "50", *extra]) == 0
    assert_identical(
        CooccurrenceStats.load(tmp_path / "s0.safetensors"),
        CooccurrenceStats.load(tmp_path / "s3.safetensors"),
    )
    assert_identical(cooccurrence(docs, 50, window=8),
                     CooccurrenceStats.load(tmp_path / "s3.safetensors"))  # fmt: skip


# ------------------------------------------------------------------ recording on Ray
def _slow(seconds: float, loader):
    """A checkpoint that takes `seconds` to load (so that later steps finish first)."""
    import time

    time.sleep(seconds)
    return loader()


def _killed_mid_write(marker: str, loader):
    """The first worker to load this checkpoint dies halfway through writing its file."""
    import os
    import signal
    from pathlib import Path

    import scansnap_lens.recording.storage as trajectory

    if not Path(marker).exists():
        Path(marker).touch()

        def half_then_die(path, tensors, metadata):
            Path(str(path) + ".half").write_bytes(b"\0" * 100)  # the write it was doing
            os.kill(os.getpid(), signal.SIGKILL)

        trajectory.write_tensors = half_then_die
    return loader()


@pytest.fixture(scope="module")
def own_checkpoints(tmp_path_factory):
    """Five checkpoints of a small run, evaluation tokens, a plan, and the trajectory the
    sequential recorder writes."""
    import sys

    from scansnap_lens.models import checkpoints
    from scansnap_lens.recording.plan import plan_recording
    from scansnap_lens.recording.recorder import Recorder

    sys.path.insert(0, str(Path(__file__).parent))
    from _runs import syn_data, train_run

    root = tmp_path_factory.mktemp("ray_run")
    train_run(out=root / "ckpt")
    tokens = syn_data(8, torch.Generator().manual_seed(7))
    plan = plan_recording(tokens, 34)
    source = checkpoints.folder(root / "ckpt")
    sequential = Recorder(root / "seq", tokens, QUIET, plan=plan).record(source)
    return root, tokens, plan, sequential


def assert_same_trajectory(a, b) -> None:
    assert a.steps.tolist() == b.steps.tolist() and a.meta == b.meta
    assert list(a.values) == list(b.values) and a.rows == b.rows
    for name in (*a.values, "prompt_pattern"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.tl
def test_record_on_ray_out_of_order_with_a_killed_worker_equals_sequential(
    local_ray, own_checkpoints, tmp_path
):
    """Workers finish in reverse step order and the first to record step 10 is killed halfway
    through its file: Ray runs that task again, and the trajectory is the sequential one."""
    from ray import cloudpickle

    from scansnap_lens.distributed import ray_record
    from scansnap_lens.models import checkpoints
    from scansnap_lens.recording.recorder import Recorder

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    root, tokens, plan, sequential = own_checkpoints
    source = checkpoints.folder(root / "ckpt")
    for i, c in enumerate(source.checkpoints):
        c.loader = partial(_slow, 0.4 * (len(source) - i), c.loader)
        if c.step == 10:
            c.loader = partial(_killed_mid_write, str(tmp_path / "killed"), c.loader)
    recorder = Recorder(
        tmp_path / "t",
        tokens,
        RecordingSettings(layers=[0], heads=[0, 1], progress=False),
        plan=plan,
    )
    traj = ray_record(recorder, source)
    assert (tmp_path / "t" / "checkpoints" / "step_000000000010.safetensors.half").exists()
    assert_same_trajectory(traj, sequential)
    files = sorted((tmp_path / "t" / "checkpoints").glob("step_*.safetensors"),
                   key=lambda f: f.stat().st_mtime_ns)  # fmt: skip
    assert [int(f.name[5:17]) for f in files] != sorted(traj.steps.tolist())  # out of order


@pytest.mark.tl
def test_record_on_ray_resumes_and_skips(local_ray, own_checkpoints, tmp_path, capsys):
    """Two steps recorded in one process, the rest on Ray (the layers and heads fixed by the
    first checkpoint, recorded by the driver); an unreadable checkpoint is skipped or stops."""
    from scansnap_lens.distributed import ray_record
    from scansnap_lens.models import checkpoints
    from scansnap_lens.models.formats import CheckpointError
    from scansnap_lens.recording.recorder import Recorder

    root, tokens, plan, sequential = own_checkpoints
    partial_source = checkpoints.folder(root / "ckpt", steps=[0, 20])
    Recorder(tmp_path / "t", tokens, QUIET, plan=plan).record(partial_source)
    traj = ray_record(Recorder(tmp_path / "t", tokens, QUIET, plan=plan),
                      checkpoints.folder(root / "ckpt"))  # fmt: skip
    assert_same_trajectory(traj, sequential)

    broken = tmp_path / "broken"
    broken.mkdir()
    for f in (root / "ckpt").iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "step_000000005.safetensors").write_bytes(b"truncated")
    with pytest.raises(CheckpointError, match="step_000000005"):
        ray_record(Recorder(tmp_path / "u", tokens, QUIET, plan=plan),
                   checkpoints.folder(broken))  # fmt: skip
    skip = QUIET.replace(on_error="skip")
    traj = ray_record(Recorder(tmp_path / "v", tokens, skip, plan=plan), checkpoints.folder(broken))
    assert traj.steps.tolist() == [0, 10, 20, 30]
    assert [s["step"] for s in traj.skipped] == [5]


@pytest.mark.tl
def test_record_ray_through_the_command_line(local_ray, own_checkpoints, tmp_path, capsys):
    root, tokens, _, _ = own_checkpoints
    from scansnap_lens.inputs.tokens import save_tokens

    save_tokens(tmp_path / "eval.safetensors", tokens)
    args = ["record", "--checkpoints", str(root / "ckpt"), "--tokens"]
    args += [str(tmp_path / "eval.safetensors")]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b"), "--ray"]) == 0
    assert "5 checkpoints recorded (5 new" in capsys.readouterr().out
    from scansnap_lens.recording.trajectory import Trajectory

    a, b = Trajectory.load(tmp_path / "a"), Trajectory.load(tmp_path / "b")
    assert_same_trajectory(a, b)


def test_ray_stats_of_a_dataset_on_disk_through_the_command_line(local_ray, shared_dir, tmp_path):
    """`scansnap stats --dataset DIR --ray`: each worker opens the saved dataset and reads its
    own contiguous part, of a token column or of a text column it encodes itself."""
    import datasets

    docs = wikitext_documents(shared_dir / "data" / "wikitext-2" / "valid.txt")[:40]
    tok = word_level_tokenizer(docs)
    tok.save(str(tmp_path / "tok.json"))
    ids = [list(map(int, r)) for r in encode_documents(tok, docs)]
    datasets.Dataset.from_dict({"input_ids": ids, "text": docs}).save_to_disk(tmp_path / "ds")
    V = str(tok.get_vocab_size())
    runs = {
        "ids": ["--vocab-size", V],
        "ids_ray": ["--vocab-size", V, "--ray", "--shards", "3"],
        "text_ray": ["--text-column", "text", "--tokenizer", str(tmp_path / "tok.json"),
                     "--ray", "--shards", "4"],
    }  # fmt: skip
    for name, extra in runs.items():
        args = ["stats", "--dataset", str(tmp_path / "ds"), "--out", str(tmp_path / name)]
        assert main([*args, "--window", "16", *extra]) == 0, name
    one = CooccurrenceStats.load(tmp_path / "ids")
    assert_identical(one, cooccurrence(encode_documents(tok, docs), tok.get_vocab_size(),
                                       window=16))  # fmt: skip
    for name in ("ids_ray", "text_ray"):
        assert_identical(one, CooccurrenceStats.load(tmp_path / name))
