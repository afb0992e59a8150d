"""Pythia-shaped models end to end through the command line, with default options.

    python analyses/benchmarks/bench_pythia.py --shape 70m [--seq-len 512] [--rows 64]

The model is a GPT-NeoX of Pythia's shape (rotary on a quarter of each head, parallel
residual, untied unembedding, d_vocab 50304), trained from a seeded random start by
`transformers.Trainer` (AdamW, warmup) for a few steps on WikiText-2 valid, which saves
real ``checkpoint-N/`` folders.  The tokenizer is a byte-level BPE of about 26k tokens
trained on WikiText-2 (Pythia's own cannot be downloaded here), so the model's vocabulary is
padded beyond its tokenizer's as Pythia's is (50304 against 50277).

Then, each in its own process (its peak resident memory is its own):
``scansnap stats`` (WikiText-2 valid, window 64), ``scansnap record`` (64 rows of test.txt,
default options), ``scansnap report``.  In this process, on the last checkpoint's model as
the recorder loads it: the TransformerLens forward pass without hooks, stopped after the
last layer (`run_until`), the plain Hugging Face forward of the same rows (the GPT-NeoX body,
no unembedding), and one `record_checkpoint` of the default plan, on the same rows and
threads; and the `Recorder`'s whole per-checkpoint call (recorded and written, the load
aside) after its first checkpoint.  Prints one JSON line: per stage the seconds and peak RSS
(the record's also the most RSS while each checkpoint was recorded: flat over checkpoints or
not, and the seconds from one checkpoint's file to the next: what each checkpoint of a long
sweep costs once the start is paid), the bytes per checkpoint, and the ratios to both forward
passes of the whole command per checkpoint, of its later checkpoints and of the recorder's
calls in wall and CPU time.
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

from scansnap_lens.recording.settings import RecordingSettings

SHAPES = {  # Pythia's configs (hidden, layers, heads, intermediate)
    "70m": (512, 6, 8, 2048),
    "160m": (768, 12, 12, 3072),
    "410m": (1024, 24, 16, 4096),
}
D_VOCAB = 50304
BPE_VOCAB = 26000


def gpt_neox_config(shape: str):
    from transformers import GPTNeoXConfig

    hidden, layers, heads, inter = SHAPES[shape]
    return GPTNeoXConfig(
        vocab_size=D_VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inter,
        rotary_pct=0.25,
        rotary_emb_base=10000,
        max_position_embeddings=2048,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        bos_token_id=0,
        eos_token_id=0,
    )


def quick_shared(shared: Path, work: Path, lines: int = 400) -> Path:
    """A stand-in for ``shared`` holding the first `lines` lines of WikiText-2 valid and test
    (the benchmarks' quick mode: the code runs, nothing is measured)."""
    out = work / "quick_shared" / "data" / "wikitext-2"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("valid.txt", "test.txt"):
        text = (shared / "data" / "wikitext-2" / name).read_text().splitlines(keepends=True)
        (out / name).write_text("".join(text[:lines]))
    return work / "quick_shared"


def train_tokenizer(shared: Path, out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=["<|endoftext|>"])
    wiki = shared / "data" / "wikitext-2"
    tok.train([str(wiki / "valid.txt"), str(wiki / "test.txt")], trainer)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def train_checkpoints(shape: str, shared: Path, tokenizer: Path, out: Path, steps: int) -> Path:
    """`steps` AdamW steps of the Trainer, a checkpoint folder after each."""
    from tokenizers import Tokenizer
    from transformers import GPTNeoXForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(gpt_neox_config(shape))
    tok = Tokenizer.from_file(str(tokenizer))
    ids = tok.encode((shared / "data" / "wikitext-2" / "valid.txt").read_text()).ids
    seq = 128
    rows = torch.tensor(ids[: (len(ids) // seq) * seq]).reshape(-1, seq)[:64]
    data = [{"input_ids": r, "labels": r} for r in rows]
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_steps=1,
        save_only_model=True,  # Pythia's released checkpoints hold the weights only
        per_device_train_batch_size=8,
        learning_rate=6e-4,
        warmup_steps=1,
        lr_scheduler_type="cosine",
        weight_decay=0.1,
        report_to=[],
        logging_steps=1,
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=data).train()
    return out


def run_stage(name: str, argv: list[str], log: Path, watch: Path | None = None) -> dict:
    """One `scansnap` command in its own process: seconds and its own peak RSS; with `watch`
    (the folder its checkpoints' files appear in) the most RSS sampled while each checkpoint
    was recorded (``rss_mb_by_checkpoint``: memory flat over checkpoints or not) and the
    seconds between its first checkpoint's file and its last, per checkpoint
    (``s_between_checkpoints``)."""
    code = (
        "import sys\n"
        "from scansnap_lens.cli import main\n"
        f"rc = main({argv!r})\n"
        # VmHWM, not ru_maxrss: exec keeps the parent's ru_maxrss, a new process image not
        "peak = [int(l.split()[1]) for l in open('/proc/self/status')\n"
        "        if l.startswith('VmHWM')][0] / 1024\n"
        "print(f'PEAK_MB={peak:.0f}', file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    start = time.perf_counter()
    with open(log, "w") as sink:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=sink, stderr=sink,
                                   text=True)  # fmt: skip
        by_checkpoint, appeared, most, written = [], [], 0.0, 0
        while process.poll() is None:
            time.sleep(0.1)
            if watch is None:
                continue
            try:
                status = Path(f"/proc/{process.pid}/status").read_text().splitlines()
                rss = next(int(x.split()[1]) for x in status if x.startswith("VmRSS"))
                most = max(most, rss)
            except (OSError, StopIteration):
                continue
            files = len(list(watch.glob("*.safetensors"))) if watch.is_dir() else 0
            if files > written:
                by_checkpoint += [round(most / 1024)] * (files - written)
                appeared += [time.perf_counter()] * (files - written)
                most, written = 0.0, files
    if watch is not None and watch.is_dir():  # written after the last sample
        files = len(list(watch.glob("*.safetensors")))
        by_checkpoint += [round(most / 1024)] * (files - written)
    seconds = time.perf_counter() - start
    text = log.read_text()
    if process.returncode != 0:
        raise SystemExit(f"{name} failed ({process.returncode}); see {log}:\n{text[-3000:]}")
    peak = [line for line in text.splitlines() if line.startswith("PEAK_MB=")]
    result = {"s": round(seconds, 1), "peak_mb": int(peak[-1].split("=")[1])}
    if watch is not None:
        result["rss_mb_by_checkpoint"] = by_checkpoint
        if len(appeared) >= 2:  # what each checkpoint after the first costs: a long sweep's
            result["s_between_checkpoints"] = round(
                (appeared[-1] - appeared[0]) / (len(appeared) - 1), 1
            )
    return result


def best_of(functions: dict, rounds: int = 3) -> dict[str, dict[str, float]]:
    """The least wall and CPU seconds (this process's, all threads) of each function over
    `rounds`, the functions taking turns so that a slow spell of the machine falls on all of
    them alike."""
    times: dict[str, dict[str, list[float]]] = {n: {"wall": [], "cpu": []} for n in functions}
    for _ in range(rounds):
        for name, fn in functions.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            times[name]["cpu"].append(time.process_time() - cpu)
            times[name]["wall"].append(time.perf_counter() - wall)
    return {name: {k: min(v) for k, v in t.items()} for name, t in times.items()}


@torch.no_grad()
def forward_baselines(checkpoint: Path, tokens: torch.Tensor, batch_size: int, plan,
                      work: Path, rounds: int = 3, stats=None) -> dict:  # fmt: skip
    """On the same rows: the TransformerLens forward without hooks (stopped after the last
    layer), the plain Hugging Face forward (the GPT-NeoX body), `record_checkpoint` on its own
    (it decides anew what a run decides once: the probe of the scores hook, the rows of the
    induction score), and the `Recorder`'s whole per-checkpoint call (`on_checkpoint`: record
    and write the file, its load aside) once its first checkpoint has decided those; and
    that call through `reading.live.Live` (its metrics; with `stats`, the scan's too), and
    Live's look at the snap as the report reads it (`snap.snapping` over the folder)."""
    from transformers import GPTNeoXForCausalLM

    from scansnap_lens.models import checkpoints
    from scansnap_lens.recording.hooks import _HookAggregator, record_checkpoint, run_until
    from scansnap_lens.recording.recorder import Recorder

    model = checkpoints.folder(checkpoint.parent, steps=[int(checkpoint.name.split("-")[1])])
    model = next(iter(model)).load().eval()
    last = int(model.cfg.n_layers) - 1
    # the rows the recorder runs together (its bound on one attention tensor's bytes)
    per_row = 4 * int(model.cfg.n_heads) * tokens.shape[1] ** 2
    rows = min(batch_size, max(1, _HookAggregator.MAX_ATTENTION_BYTES // per_row))
    batches = tokens.split(rows)

    def tl_forward():
        for x in batches:
            run_until(model, x, last, [])

    hf = GPTNeoXForCausalLM.from_pretrained(checkpoint).eval()

    def hf_forward():
        for x in batches:
            hf.gpt_neox(input_ids=x)

    def record():
        record_checkpoint(model, tokens, plan, batch_size=batch_size, progress=False)

    recorder = Recorder(
        work / "timed",
        tokens,
        RecordingSettings(batch_size=batch_size, progress=False, overwrite=True),
        plan=plan,
    )
    steps = iter(range(1, 10**6))
    recorder.on_checkpoint(0, model)  # the run's first checkpoint decides once

    def per_checkpoint():
        recorder.on_checkpoint(next(steps), model)

    from scansnap_lens.reading.live import Live, LiveSettings

    watched = Recorder(work / "live", tokens, RecordingSettings(  # planned as `record` plans
        batch_size=batch_size, progress=False, overwrite=True),
        plan=None if stats is not None else plan, stats=stats)  # fmt: skip
    live = Live(watched, LiveSettings(per_head=True, say=False))
    live_steps = iter(range(1, 10**6))
    live.on_checkpoint(0, model)

    def live_checkpoint():
        live.on_checkpoint(next(live_steps), model)

    def snap_look():  # every checkpoint of the folder read, as `Live._snaps` reads them
        live._snaps(list(watched.run.layers), 10**6)

    tl_forward()  # warm: the first pass allocates
    times = best_of({"tl_forward": tl_forward, "hf_forward": hf_forward,
                     "record_checkpoint": record, "per_checkpoint_call": per_checkpoint,
                     "live_checkpoint_call": live_checkpoint}, rounds)  # fmt: skip
    times.update(best_of({"live_snap_look": snap_look}, 1))
    recorder.close()
    watched.close()
    out = {"live_checkpoints_looked_at": len(live.steps)}
    for name, t in times.items():
        out[f"{name}_s"], out[f"{name}_cpu_s"] = round(t["wall"], 4), round(t["cpu"], 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="70m")
    parser.add_argument("--shared", type=Path, default=Path(__file__).parents[3] / "shared")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--checkpoints", type=int, default=4, help="Trainer steps (one each)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (least is kept)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and text: it runs")
    parser.add_argument("--no-stats", action="store_true",
                        help="record without --stats (the whole row as context, most frequent"
                        " queries) instead of the statistics' window and queries")  # fmt: skip
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix=f"bench_pythia_{args.shape}_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.quick:
        global BPE_VOCAB
        SHAPES[args.shape], BPE_VOCAB = (64, 2, 4, 128), 2000
        args.shared = quick_shared(args.shared, work)
        args.rows, args.seq_len, args.checkpoints, args.rounds = 4, 32, 1, 1
    wiki = args.shared / "data" / "wikitext-2"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result: dict = {"shape": args.shape, "rows": args.rows, "seq_len": args.seq_len,
                    "record_with_stats": not args.no_stats,
                    "threads": torch.get_num_threads()}  # fmt: skip

    start = time.perf_counter()
    tokenizer = train_tokenizer(args.shared, work)
    runs = train_checkpoints(args.shape, args.shared, tokenizer, work / "run", args.checkpoints)
    result["setup_s"] = round(time.perf_counter() - start, 1)

    stats = work / "stats.safetensors"
    result["stats"] = run_stage("stats", [
        "stats", str(wiki / "valid.txt"), "--tokenizer", str(tokenizer), "--documents",
        "wikitext", "--window", "64", "--out", str(stats)], work / "stats.log")  # fmt: skip
    traj = work / "trajectory"
    result["record"] = run_stage("record", [
        "record", "--checkpoints", str(runs), "--text", str(wiki / "test.txt"), "--tokenizer",
        str(tokenizer), "--documents", "wikitext", "--seq-len", str(args.seq_len),
        "--max-rows", str(args.rows), "--batch-size", str(args.batch_size), "--out",
        str(traj), *([] if args.no_stats else ["--stats", str(stats)])],
        work / "record.log", watch=traj / "checkpoints")  # fmt: skip
    files = sorted((traj / "checkpoints").glob("*.safetensors"))
    result["checkpoints"] = len(files)
    result["bytes_per_checkpoint"] = int(sum(f.stat().st_size for f in files) / len(files))
    result["record"]["s_per_checkpoint"] = round(result["record"]["s"] / len(files), 1)
    result["report"] = run_stage("report", ["report", str(traj), "--stats", str(stats)],
                                 work / "report.log")  # fmt: skip

    from scansnap_lens.recording.storage import TrajectoryFolder

    plan = TrajectoryFolder(traj).plan()
    result["plan"] = {"queries": plan.num_queries, "classes": plan.num_classes,
                      "pairs": plan.num_pairs, "triples": plan.num_triples}  # fmt: skip
    from scansnap_lens.inputs.text import read_documents
    from scansnap_lens.inputs.tokens import encode, load_tokenizer, rows_of

    docs = read_documents(wiki / "test.txt", "wikitext")
    tokens = rows_of(encode(load_tokenizer(str(tokenizer)), docs), args.seq_len)[: args.rows]
    last = max(runs.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    from scansnap_lens.statistics.corpus import CooccurrenceStats

    read = None if args.no_stats else CooccurrenceStats.load(stats)
    timing = forward_baselines(last, tokens, args.batch_size, plan, work, args.rounds, read)
    result.update(timing)
    # what Live adds to a recorded checkpoint: its metrics, and at most its looks at the snap
    # (each reads every checkpoint so far, within LOOK_READS checkpoint reads per checkpoint)
    from scansnap_lens.reading.live import LOOK_READS

    base = timing["per_checkpoint_call_s"]
    result["live_metrics_cost"] = round(timing["live_checkpoint_call_s"] / base - 1, 3)
    per_read = timing["live_snap_look_s"] / max(timing["live_checkpoints_looked_at"], 1)
    result["live_snap_look_cost_at_most"] = round(LOOK_READS * per_read / base, 3)
    result["live_cost_at_most"] = round(
        result["live_metrics_cost"] + result["live_snap_look_cost_at_most"], 3
    )
    for name in ("tl", "hf"):  # the whole command against the forward, and its later checkpoints
        forward = timing[f"{name}_forward_s"]
        result[f"record_command_over_{name}_forward"] = round(
            result["record"]["s_per_checkpoint"] / forward, 2
        )
        if "s_between_checkpoints" in result["record"]:
            result[f"record_later_checkpoints_over_{name}_forward"] = round(
                result["record"]["s_between_checkpoints"] / forward, 2
            )
    for what in ("record_checkpoint", "per_checkpoint_call"):
        for name in ("tl", "hf"):
            for clock in ("", "_cpu"):
                ratio = timing[f"{what}{clock}_s"] / timing[f"{name}_forward{clock}_s"]
                result[f"{what}_over_{name}_forward{clock}"] = round(ratio, 2)
    result["peak_mb_here"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result["work"] = str(work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
