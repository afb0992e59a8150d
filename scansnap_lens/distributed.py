"""Ray: corpus statistics counted in shards and merged in a tree; checkpoints recorded in
parallel into one trajectory folder (what it costs: docs/scale.md).

    pip install "scansnap-lens[ray]"

    corpus = Corpus.of(["pile/document.bin"], vocab_size=50304)   # inputs.corpus
    stats = count_corpus(corpus, Context(window=64), execute=ray_cooccurrence, shards=64)

    traj = Recorder("out/traj", tokens, settings).record(source, execute=ray_execute())

Counts add (`CooccurrenceStats.__add__`), so the merged statistics equal one process's on the
whole corpus (tested); pruning (`min_count`) runs once, after the last merge.  Shards
(`Corpus.shards`) read their own data, so a worker never receives a file-backed corpus
through the driver.  `ray_execute` runs one task per checkpoint, each fetching its checkpoint
as the sweep would and recording it with the recorder's one step (`RecordingRun.record`) into
the folder every worker must see; files are atomic and the manifest is updated under the
folder's lock, so workers may finish in any order or die mid-write (Ray runs the task again).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace

import torch
from tqdm.auto import tqdm

from scansnap_lens.models.checkpoints import CheckpointSource
from scansnap_lens.models.formats import CheckpointError
from scansnap_lens.statistics.corpus import CooccurrenceStats, cooccurrence

__all__ = ["connect", "ray_cooccurrence", "ray_execute", "ray_record"]


def _ray():
    try:
        import ray
    except ImportError:
        raise ImportError(
            "Ray is not installed: pip install 'scansnap-lens[ray]' (or pip install ray)"
        ) from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None):
    """Ray, initialised: the running instance, the cluster at `address`, or a local one."""
    ray = _ray()
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return ray


def _count(shard: Callable, vocab_size: int, options: dict) -> tuple[CooccurrenceStats, int]:
    """A shard's statistics and the worker's peak resident memory (bytes) so far."""
    import resource
    import sys

    stats = cooccurrence(shard(), vocab_size, **options)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return stats, peak * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB else


def _merge(*parts: CooccurrenceStats) -> CooccurrenceStats:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _owned(stats: CooccurrenceStats) -> CooccurrenceStats:
    """A copy in the driver's own memory (Ray's store hands out read-only buffers)."""
    tensors = {f.name: getattr(stats, f.name) for f in fields(stats)}
    return replace(stats, **{k: v.clone() for k, v in tensors.items() if torch.is_tensor(v)})


def ray_cooccurrence(
    shards: Sequence[Callable],
    vocab_size: int,
    window: int | None = None,
    exclude_bos: bool = False,
    queries=None,
    next_tokens=None,
    min_count: int = 1,
    address: str | None = None,
    num_cpus: int | None = None,
    merge_arity: int = 2,
    progress: bool = False,
    timings: dict | None = None,
    context=None,
) -> CooccurrenceStats:
    """`corpus.cooccurrence` of the shards' rows, one Ray task per shard, merged in a tree of
    `merge_arity`.  `address`: a Ray cluster (default: the running instance, else a local one
    with `num_cpus`).  `timings`, a dict, receives ``count_s`` (until the last shard is
    counted), ``merge_s`` (the merges after it) and ``worker_peak_bytes`` (per shard, the
    peak resident memory so far of the worker that counted it: Ray reuses workers, so this
    bounds the shard's own peak from above).  context: the window and position-0 convention as
    one value (`statistics.context.Context`), instead of `window` and `exclude_bos`."""
    import time

    from scansnap_lens.statistics.context import Context

    context = Context.given(context, window, exclude_bos)
    window, exclude_bos = context.window, context.exclude_bos
    if not shards:
        raise ValueError("no shard to count")
    if merge_arity < 2:
        raise ValueError(f"merge_arity must be >= 2, got {merge_arity}")
    ray = connect(address, num_cpus)
    options = {
        "window": window,
        "exclude_bos": exclude_bos,
        "queries": queries,
        "next_tokens": next_tokens,
        "num_proc": 1,
    }
    count = ray.remote(_count).options(num_returns=2)
    merge = ray.remote(_merge)
    start = time.perf_counter()
    level, peaks = zip(*[count.remote(shard, vocab_size, options) for shard in shards])
    level = list(level)
    bar = tqdm(total=len(level), desc="shards", unit="shard", disable=not progress)
    pending = list(level)
    while pending:  # progress as shards finish, in any order
        done, pending = ray.wait(pending, num_returns=1)
        bar.update(len(done))
    bar.close()
    counted = time.perf_counter()
    while len(level) > 1:
        level = [
            merge.remote(*level[i : i + merge_arity]) for i in range(0, len(level), merge_arity)
        ]
    stats = _owned(ray.get(level[0]))
    if timings is not None:
        timings.update(
            count_s=counted - start,
            merge_s=time.perf_counter() - counted,
            worker_peak_bytes=ray.get(list(peaks)),
        )
    return stats.prune(min_count) if min_count > 1 else stats


def _record_task(checkpoint, run, fetcher) -> tuple | None:
    """In a worker: fetch, record and write one checkpoint with the run's one step
    (`RecordingRun.record`), then delete what was fetched; None, or (step, source, error)
    where it could not be read."""
    try:
        if fetcher is not None:
            fetcher.fetch(checkpoint)
        run.record(checkpoint, run.writer())
    except CheckpointError as err:
        return (checkpoint.step, checkpoint.source, str(err))
    finally:
        if fetcher is not None:
            fetcher.release(checkpoint)
            fetcher.close()
    return None


def ray_execute(address: str | None = None, num_cpus: int | None = None, max_retries: int = 3):
    """A `Recorder.record` executor: one Ray task per checkpoint (one GPU each where the
    cluster has GPUs), writing into the recording folder, which every worker must see.

    Everything the sequential recording honours holds: each worker fetches its revision by
    the sweep's rules (`recording.sweep`), at most on_disk recording at once (each holds its
    one revision); an unreadable checkpoint stops the recording or is noted (on_error);
    duplicates are found before any task starts.  A task whose worker dies runs again
    (`max_retries`).

    >>> # Recorder(out, tokens, settings).record(source, execute=ray_execute())
    """

    def execute(run, todo: list, fetcher, note_skip) -> None:
        if not isinstance(run.tokens, torch.Tensor):
            raise ValueError("recording on Ray needs the evaluation tokens as one [N, T] tensor")
        ray = connect(address, num_cpus)
        _fan_out(ray, run, todo, fetcher, note_skip, max_retries)

    return execute


def ray_record(
    recorder,
    source: CheckpointSource,
    address: str | None = None,
    num_cpus: int | None = None,
    max_retries: int = 3,
):
    """`Recorder.record` with one Ray task per checkpoint (`ray_execute`); the same
    trajectory."""
    return recorder.record(source, execute=ray_execute(address, num_cpus, max_retries))


def _fan_out(ray, run, todo: list, fetcher, note_skip, max_retries: int) -> None:
    from dataclasses import replace

    from scansnap_lens.recording.sweep import HubRevisions

    progress = run.settings.progress
    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    quiet = run.settings.replace(progress=False, **({"device": "cuda"} if gpus else {}))
    run = replace(run, settings=quiet)
    hub = isinstance(fetcher, HubRevisions)  # local files: each worker reads its own
    at_once = fetcher.on_disk if hub else len(todo)  # each task holds its one revision
    run_ref, fetcher_ref = ray.put(run), ray.put(fetcher if hub else None)
    task = ray.remote(_record_task).options(num_gpus=gpus, max_retries=max_retries)
    waiting, pending = list(todo), {}
    bar = tqdm(total=len(todo), desc="checkpoints (ray)", unit="ckpt", disable=not progress)
    try:
        while waiting or pending:
            while waiting and len(pending) < at_once:
                checkpoint = waiting.pop(0)
                pending[task.remote(checkpoint, run_ref, fetcher_ref)] = checkpoint.step
            done, _ = ray.wait(list(pending), num_returns=1)
            step = pending.pop(done[0])
            try:
                skipped = ray.get(done[0])
            except ray.exceptions.RayError as err:
                raise ChildProcessError(
                    f"recording step {step} failed in its Ray worker ({type(err).__name__},"
                    f" after {max_retries} retries): what was recorded is kept; run again to"
                    " resume"
                ) from err
            if skipped is not None:
                note_skip(*skipped)
            bar.update(1)
    finally:
        for ref in pending:  # stopped early: the checkpoints not yet recorded stay to do
            ray.cancel(ref)
        bar.close()
