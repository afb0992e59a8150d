"""Recorder cost against plain forward passes and against run_with_cache + aggregation.

    python analyses/benchmarks/bench_record.py [--shared ../shared] [--batch-size 16]

Model: 2 layers, 8 heads, d_model 256, d_mlp 1024, n_ctx 256, vocabulary 5000 (random
weights: cost does not depend on them).  Data: 64 sequences of 256 word-level WikiText-2 ids,
words outside the 4999 most frequent mapped to <unk>.  Tracked: the query tokens covering half
of the events.  Each mode runs in subprocesses of its own, so that its peak resident memory
(the most while it ran, minus the memory after setup) is its own: once for its time, as a
user's process runs, and once for its memory, with glibc's malloc told to hand every block
of 128 KiB or more back to the system when it is freed (``MALLOC_MMAP_THRESHOLD_``), so that
the peak is what the mode holds at once, not what the allocator's moving threshold kept
(with the default the same mode's peak moved by up to 2x between runs).  Prints one JSON
line with forward_s, record_s, cache_s, the peaks (``*_peak_mb``, and as the default
allocator left them, ``*_peak_mb_default_malloc``) and the ratios against the goals
(record_s <= 1.5 forward_s; cache_peak_mb >= 4 record_peak_mb; record_peak_mb <= 1.5
forward_peak_mb).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

QUICK = os.environ.get("SCANSNAP_BENCH_QUICK") == "1"  # small shapes: the code runs, no goal
VOCAB, N_SEQ, SEQ = (500, 8, 32) if QUICK else (5000, 64, 256)


def build_model():
    from scansnap_lens.models.backend import build_model as backend_model

    torch.manual_seed(0)
    cfg = dict(
        n_layers=2,
        n_heads=8,
        d_model=256,
        d_head=32,
        d_mlp=1024,
        n_ctx=SEQ,
        d_vocab=VOCAB,
        act_fn="gelu",
        seed=0,
    )
    return backend_model(cfg).eval()  # HookedTransformer on 3.x, the bridge on 4.x


def setup(shared: Path, folder: Path) -> None:
    """Tokens, model weights and plan, saved so each mode's process starts light."""
    from safetensors.torch import save_file

    from scansnap_lens.inputs.text import encode_documents, wikitext_documents, word_level_tokenizer
    from scansnap_lens.recording.plan import plan_recording

    docs = wikitext_documents(shared / "data" / "wikitext-2" / "test.txt")
    tok = word_level_tokenizer(docs, max_vocab=VOCAB)
    ids = torch.cat([torch.as_tensor(r) for r in encode_documents(tok, docs)])
    tokens = ids[: N_SEQ * SEQ].reshape(N_SEQ, SEQ).clamp_max(VOCAB - 1).contiguous()
    plan = plan_recording(tokens, VOCAB, queries=0.5)
    save_file({"tokens": tokens}, folder / "tokens.safetensors")
    save_file(plan.tensors(), folder / "plan.safetensors")
    (folder / "plan.json").write_text(json.dumps(plan.metadata()))
    save_file(build_model().state_dict(), folder / "model.safetensors")


def load(folder: Path):
    from safetensors.torch import load_file

    from scansnap_lens.recording.plan import RecordPlan

    model = build_model()
    model.load_state_dict(load_file(folder / "model.safetensors"))
    tokens = load_file(folder / "tokens.safetensors")["tokens"]
    meta = json.loads((folder / "plan.json").read_text())
    plan = RecordPlan.from_parts(meta, load_file(folder / "plan.safetensors"))
    return model, tokens, plan


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def reset_peak() -> bool:
    """Start the process's peak resident memory afresh (Linux: VmHWM), so that what setup
    held at once does not count; False where the system does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_mb() -> float:
    """The peak resident memory since `reset_peak` (else since the process started)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_mode(mode: str, folder: Path, batch_size: int, repeats: int) -> dict:
    from scansnap_lens.recording.aggregates import resolve
    from scansnap_lens.recording.hooks import _HookAggregator, record_checkpoint

    # the scan's aggregates (what a cache of scores and patterns gives), in both modes
    scan = [a for a in resolve(None) if a.axis != "rows"]
    model, tokens, plan = load(folder)
    torch.set_grad_enabled(False)
    base = rss_mb()
    reset_peak()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if mode == "forward":
            for i in range(0, N_SEQ, batch_size):
                model(tokens[i : i + batch_size])
        elif mode == "record":
            record_checkpoint(model, tokens, plan, batch_size=batch_size, progress=False,
                              aggregates=scan)  # fmt: skip
        elif mode == "cache":
            names = lambda n: n.endswith(("hook_attn_scores", "hook_pattern"))  # noqa: E731
            caches = [
                model.run_with_cache(tokens[i : i + batch_size], names_filter=names)[1]
                for i in range(0, N_SEQ, batch_size)
            ]
            rec = _HookAggregator(model, plan, range(2), range(8), "cpu", scan, N_SEQ)
            rec.scores_from_qk.update({0: False, 1: False})
            rec.fused = {}  # the hooks read the cache's tensors
            for j, cache in enumerate(caches):
                rows = tokens[j * batch_size : (j + 1) * batch_size]
                rec.batch, rec.positions, _ = rec._indices(rows)
                for layer in range(2):
                    rec.scores_hook(layer, layer)(cache[f"blocks.{layer}.attn.hook_attn_scores"])
                    rec.pattern_hook(layer, layer)(cache[f"blocks.{layer}.attn.hook_pattern"])
                rec.sums.flush()
            del caches
        times.append(time.perf_counter() - start)
    peak = peak_mb()
    return {
        "seconds": min(times),
        "peak_mb": peak - base,
        "queries": plan.num_queries,
        "pairs": plan.num_pairs,
        "triples": plan.num_triples,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[3] / "shared")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small shapes, to check that it runs")
    p.add_argument("--mode", choices=["forward", "record", "cache"], help=argparse.SUPPRESS)
    p.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick and not QUICK:  # again, with the small shapes (in this process's children too)
        os.environ["SCANSNAP_BENCH_QUICK"] = "1"
        argv = [a for a in sys.argv[1:] if a != "--quick"]
        sys.exit(subprocess.run([sys.executable, __file__, *argv, "--repeats", "1"]).returncode)
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.folder, args.batch_size, args.repeats)))
        return
    results, memory = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        setup(args.shared, Path(folder))
        for mode in ("forward", "record", "cache"):
            cmd = [sys.executable, __file__, "--mode", mode, "--folder", folder]
            cmd += ["--batch-size", str(args.batch_size), "--repeats", str(args.repeats)]
            results[mode] = _run(cmd, os.environ)
            held = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
            memory[mode] = results[mode] if QUICK else _run(cmd, held)  # quick: no second run
    for mode in results:
        results[mode]["peak_mb_default_malloc"] = results[mode]["peak_mb"]
        results[mode]["peak_mb"] = memory[mode]["peak_mb"]
    line = {
        "forward_s": round(results["forward"]["seconds"], 3),
        "record_s": round(results["record"]["seconds"], 3),
        "cache_s": round(results["cache"]["seconds"], 3),
        "forward_peak_mb": round(results["forward"]["peak_mb"], 1),
        "record_peak_mb": round(results["record"]["peak_mb"], 1),
        "cache_peak_mb": round(results["cache"]["peak_mb"], 1),
        "record_over_forward": round(
            results["record"]["seconds"] / results["forward"]["seconds"], 2
        ),
        "cache_over_record_memory": round(
            results["cache"]["peak_mb"] / max(results["record"]["peak_mb"], 1e-9), 1
        ),
        "record_over_forward_memory": round(
            results["record"]["peak_mb"] / max(results["forward"]["peak_mb"], 1e-9), 2
        ),
        **{
            f"{mode}_peak_mb_default_malloc": round(results[mode]["peak_mb_default_malloc"], 1)
            for mode in results
        },
        "tracked_queries": results["record"]["queries"],
        "pair_slots": results["record"]["pairs"],
        "triple_slots": results["record"]["triples"],
        "sequences": N_SEQ,
        "seq_len": SEQ,
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(line))


def _run(cmd: list[str], env) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
