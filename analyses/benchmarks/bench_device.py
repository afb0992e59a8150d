"""The recorder against the TransformerLens forward on one device (a GPU where there is one),
at Pythia-70m's and -160m's shapes.

    python analyses/benchmarks/bench_device.py [--device cuda] [--quick]

A GPT-NeoX of Pythia's shape (rotary on a quarter of each head, parallel residual, untied,
d_vocab 50304) with random weights (the cost does not depend on them), bridged as the recorder
bridges a Hugging Face checkpoint; evaluation rows of Zipf-distributed token ids (64 x 512 for
70m, 16 x 2048 for 160m); the plan `scansnap record` makes by default without statistics for
that many heads (the most frequent queries that fit 64 MB per checkpoint).  Timed on the
device, synchronised, the best of `--rounds` taking turns: the TransformerLens forward without
hooks stopped after the last layer (`run_until`), the Hugging Face body of the same shape with
its default (SDPA) attention, and `record_checkpoint` with every default aggregate (the
scan's and the head types': reads, sums, the copy of the sums back to the host) as it runs
by default, with fused attention at every length (`recording.fused`) and eagerly, each
after a first checkpoint of the run has decided what a run decides once (`RunState`).  Prints
one JSON line per shape with the times, their ratios, and on a GPU how often each made the
host wait for the device (`torch.cuda.set_sync_debug_mode`).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

SHAPES = {  # hidden, layers, heads, intermediate; rows, row length
    "70m": (512, 6, 8, 2048, 64, 512),
    "160m": (768, 12, 12, 3072, 16, 2048),
}
D_VOCAB = 50304


def hf_model_of(shape: str, device: str, quick: bool):
    """A GPT-NeoX of `shape` with random weights, with Hugging Face's default attention."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    hidden, layers, heads, inter, _, _ = SHAPES[shape]
    if quick:
        hidden, layers, inter = hidden // 8, 2, inter // 8
    torch.manual_seed(0)
    cfg = GPTNeoXConfig(
        vocab_size=D_VOCAB, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=inter, rotary_pct=0.25,
        max_position_embeddings=2048, use_parallel_residual=True, tie_word_embeddings=False,
    )  # fmt: skip
    return GPTNeoXForCausalLM(cfg).eval().to(device)


def model_of(shape: str, device: str, quick: bool):
    """That model bridged as the recorder bridges a Hugging Face checkpoint."""
    from scansnap_lens.models.backend import hf_bridge

    return hf_bridge(hf_model_of(shape, "cpu", quick)).to(device).eval()  # ids only


def tokens_of(rows: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    weights = 1.0 / torch.arange(1, D_VOCAB + 1, dtype=torch.float64)
    return torch.multinomial(weights, rows * length, replacement=True, generator=g).reshape(
        rows, length
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="small models and rows, to try it out")
    args = p.parse_args()

    for shape in SHAPES:
        print(json.dumps(time_shape(shape, args)), flush=True)


def time_shape(shape: str, args) -> dict:
    """The best times of the forward and of `record_checkpoint` at one shape."""
    from scansnap_lens.recording import fused
    from scansnap_lens.recording.budget import BYTES_PER_VALUE, CHECKPOINT_BUDGET
    from scansnap_lens.recording.hooks import RunState, record_checkpoint, run_until
    from scansnap_lens.recording.plan import plan_recording

    _, layers, heads, _, rows, length = SHAPES[shape]
    if args.quick:
        rows, length, layers = 4, 128, 2
    model = model_of(shape, args.device, args.quick)
    tokens = tokens_of(rows, length)
    rows_slots = 3 * rows  # the head types: one value per row each
    max_slots = CHECKPOINT_BUDGET // (BYTES_PER_VALUE * layers * heads) - 64**2 - rows_slots
    plan = plan_recording(tokens, D_VOCAB, max_slots=max_slots)
    batches = tokens.split(args.batch_size)
    last = int(model.cfg.n_layers) - 1

    hf = hf_model_of(shape, args.device, args.quick)

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    @torch.no_grad()
    def forward_passes():
        for x in batches:
            run_until(model, x.to(args.device), last, [])

    @torch.no_grad()
    def hf_passes():
        for x in batches:
            hf.gpt_neox(input_ids=x.to(args.device))

    # what a Recorder decides once, kept: per way to record (defaults, forced fused, eager)
    states = {way: RunState() for way in ("default", "fused", "eager")}

    def record_passes(way: str = "default"):
        shortest = fused.GPU_MIN_POSITIONS
        fused.ENABLED, fused.GPU_MIN_POSITIONS = way != "eager", 0 if way == "fused" else shortest
        try:
            record_checkpoint(model, tokens, plan, batch_size=args.batch_size,
                              device=args.device, progress=False, state=states[way])  # fmt: skip
        finally:
            fused.ENABLED, fused.GPU_MIN_POSITIONS = True, shortest

    timed = {"forward": forward_passes, "hf_forward": hf_passes, "record": record_passes,
             "record_fused": lambda: record_passes("fused"),
             "record_eager": lambda: record_passes("eager")}  # fmt: skip
    for fn in timed.values():  # warm: the first passes allocate and compile
        fn(), sync()
    syncs = {name: count_syncs(fn, args.device) for name, fn in timed.items()}
    times = {name: [] for name in timed}
    for _ in range(args.rounds):
        for name, fn in timed.items():
            start = time.perf_counter()
            fn(), sync()
            times[name].append(time.perf_counter() - start)
    best = {name: min(t) for name, t in times.items()}
    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    return {
        "shape": shape, "device": device, "rows": rows, "seq_len": length,
        "batch_size": args.batch_size, "heads": layers * heads,
        "fused_layers": len(fused.fusable_layers(model, last, args.device, length)),
        "plan": {"queries": plan.num_queries, "pairs": plan.num_pairs,
                 "triples": plan.num_triples},
        **{f"{name}_s": round(t, 4) for name, t in best.items()},
        "record_over_forward": round(best["record"] / best["forward"], 3),
        "record_over_hf_forward": round(best["record"] / best["hf_forward"], 3),
        "record_fused_over_forward": round(best["record_fused"] / best["forward"], 3),
        "record_eager_over_forward": round(best["record_eager"] / best["forward"], 3),
        **{f"host_waits_{name}": n for name, n in syncs.items()},
    }  # fmt: skip


def count_syncs(fn, device: str) -> int | None:
    """The times `fn` makes the host wait for the GPU (PyTorch's sync debug mode warns at
    each); None off a GPU."""
    import warnings

    if not device.startswith("cuda"):
        return None
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


if __name__ == "__main__":
    main()
