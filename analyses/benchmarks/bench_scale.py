"""Counting statistics at growing corpus sizes: one process against Ray with 1 and 2 workers.

A Zipfian corpus (V = 50,000, exponent 1.1, rows of 1,024 tokens, seeded) of each size is
written to a .npy file; every counter reads its rows from that file (the Ray workers their own
ranges, as they read ranges of an indexed dataset).  W = 64; the tracked queries are the most
frequent tokens (``--queries``, default 10: with every query tracked the distinct triples
outgrow this machine's memory before 10 M tokens, see docs/scale.md).

    python analyses/benchmarks/bench_scale.py [--sizes 1e6,5e6,2e7,5e7] [--shards 4]

Prints one JSON line per size and counter: seconds, tokens per second, distinct triples, the
statistics' bytes, the peak resident memory of the process (one process) or the largest of
the workers (Ray), the merge time, and the speed against the single process measured in the
same run.  Results are checked to be identical (sizes,
counts, fingerprints) across the three counters.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from functools import partial
from itertools import pairwise
from pathlib import Path

import numpy as np

V, W, ROW = 50_000, 64, 1024


def zipf_corpus(path: Path, num_tokens: int, seed: int = 0) -> None:
    p = 1.0 / np.arange(1, V + 1) ** 1.1
    rng = np.random.default_rng(seed)
    rows = num_tokens // ROW
    np.save(path, rng.choice(V, size=(rows, ROW), p=p / p.sum()).astype(np.int32))


def read_rows(path: str, start: int, stop: int):
    return np.load(path, mmap_mode="r")[start:stop].astype(np.int64)


def stats_bytes(stats) -> int:
    return sum(t.numel() * t.element_size()
               for t in (stats.query, stats.next_token, stats.events, stats.offsets, stats.token,
                         stats.count))  # fmt: skip


SINGLE = """
import json, resource, sys, time, numpy as np, torch
from scansnap_lens.statistics.corpus import cooccurrence
path, queries = sys.argv[1], int(sys.argv[2])
rows = torch.from_numpy(np.load(path).astype(np.int64))
start = time.perf_counter()
stats = cooccurrence(rows, {V}, window={W}, queries=list(range(queries)))
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "triples": stats.num_triples, "events":
    int(stats.events.sum()), "count": int(stats.count.sum()), "fingerprint": stats.fingerprint,
    "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}}))
"""


def single_process(path: Path, queries: int) -> dict:
    """The plain library call in a fresh process (its peak memory is its own)."""
    code = SINGLE.format(V=V, W=W)
    out = subprocess.run([sys.executable, "-c", code, str(path), str(queries)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def on_ray(path: Path, queries: int, workers: int, num_shards: int) -> dict:
    import ray

    from scansnap_lens import distributed

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        rows = np.load(path, mmap_mode="r").shape[0]
        edges = np.linspace(0, rows, num_shards + 1).round().astype(int)
        shards = [partial(read_rows, str(path), int(a), int(b)) for a, b in pairwise(edges)]
        timings: dict = {}
        start = time.perf_counter()
        stats = distributed.ray_cooccurrence(shards, V, window=W, queries=list(range(queries)),
                                             timings=timings)  # fmt: skip
        seconds = time.perf_counter() - start
    finally:
        ray.shutdown()
    return {"seconds": seconds, "triples": stats.num_triples, "events": int(stats.events.sum()),
            "count": int(stats.count.sum()), "fingerprint": stats.fingerprint,
            "bytes": stats_bytes(stats), "count_s": timings["count_s"],
            "merge_s": timings["merge_s"],
            "worker_peak": max(timings["worker_peak_bytes"])}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="1e6,5e6,2e7,5e7", help="corpus sizes in tokens")
    p.add_argument("--queries", type=int, default=10, help="the most frequent tokens tracked")
    p.add_argument("--shards", type=int, default=4, help="Ray tasks per size")
    args = p.parse_args()
    mib = 2**20
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(float(s)) for s in args.sizes.split(",")):
            path = Path(tmp) / f"zipf_{size}.npy"
            zipf_corpus(path, size)
            one = single_process(path, args.queries)
            line = {"tokens": size, "counter": "one process", "seconds": round(one["seconds"], 2),
                    "tokens_per_s": round(size / one["seconds"]), "triples": one["triples"],
                    "peak_mib": round(one["peak"] / mib)}  # fmt: skip
            print(json.dumps(line), flush=True)
            for workers in (1, 2):
                r = on_ray(path, args.queries, workers, args.shards)
                same = all(r[k] == one[k] for k in ("triples", "events", "count", "fingerprint"))
                if not same:
                    raise SystemExit(f"Ray with {workers} workers counted differently: {r}")
                print(json.dumps({
                    "tokens": size, "counter": f"ray, {workers} worker(s), {args.shards} shards",
                    "seconds": round(r["seconds"], 2), "count_s": round(r["count_s"], 2),
                    "merge_s": round(r["merge_s"], 2), "tokens_per_s": round(size / r["seconds"]),
                    "speed_vs_one_process": round(one["seconds"] / r["seconds"], 2),
                    "triples": r["triples"], "stats_mib": round(r["bytes"] / mib),
                    "bytes_per_triple": round(r["bytes"] / r["triples"], 1),
                    "worker_peak_mib": round(r["worker_peak"] / mib), "identical": same,
                }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
