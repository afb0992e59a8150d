"""A report's time on a user's own run, against the recording's: a researcher's second day.

    python analyses/benchmarks/bench_report.py                # about 20 minutes on 2 cores
    python analyses/benchmarks/bench_report.py --case words   # one of the two runs
    python analyses/benchmarks/bench_report.py --quick        # small: it runs, no goal

Two runs of the shapes new users' first Trainer runs have, each trained with the Hugging Face
Trainer on WikiText-2 valid with a tokenizer of its own, rows of 128 tokens, 800 steps, 12
checkpoints:

- ``first-day``: GPT-NeoX (2 layers x 4 heads, d_model 128), a byte-level BPE of 4,096 tokens
  (the rehearsal's shape);
- ``words``: GPT-2 (3 layers x 2 heads, d_model 128), a word-level tokenizer of every word of
  WikiText-2 valid (thousands of classes recorded).

Then statistics of WikiText-2 valid (window 64), evaluation tokens of WikiText-2 test,
`record` of 256 rows with `--stats`, and `report` through the command line, each timed as its
own process.  One JSON line per run: the seconds of each, the classes recorded and fit, the
theory fit's estimate said before it started against the seconds it took (the goal: within
2x), report / record, and the seconds of the same report again with another title
(``rerender_s``: the analysis saved beside the run is reloaded, nothing measured).  The goals
on 2 cores: each report within 60 s, each page drawn again within 10 s.  Measured on 2 cores
with the fit limited to 20 s (`--theory-seconds`): first-day record 34.3 s, report 37.4 s (54
classes fit, 18.1 s said, 11.1 s taken), drawn again 4.5 s; words record 33.3 s, report 31.9 s
(32 of 13,560 classes fit, 19.1 s said, 12.5 s taken), drawn again 4.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[3] / "shared"
SAVE_AT = (1, 10, 25, 50, 80, 120, 170, 240, 330, 450, 600, 800)


def train(out: Path, tokenizer: Path, data: Path, steps: int, case: str,
          rows_seq: int = 128) -> None:  # fmt: skip
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from scansnap_lens.inputs.text import word_level_tokenizer

    text = (data / "valid.txt").read_text()
    if case == "words":
        tok = word_level_tokenizer(text.splitlines())
    else:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train([str(data / "valid.txt")], trainers.BpeTrainer(
            vocab_size=4096, special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        ))  # fmt: skip
    tok.save(str(tokenizer))
    ids = tok.encode(text).ids
    n = len(ids) // rows_seq
    rows = torch.tensor(ids[: n * rows_seq]).view(n, rows_seq)
    torch.manual_seed(0)
    if case == "words":
        config = transformers.GPT2Config(
            vocab_size=tok.get_vocab_size(), n_embd=128, n_layer=3, n_head=2,
            n_positions=rows_seq, bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    else:
        config = transformers.GPTNeoXConfig(
            vocab_size=tok.get_vocab_size(), hidden_size=128, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=512, max_position_embeddings=rows_seq,
            rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config)
    save_at = sorted({s for s in SAVE_AT if s <= steps} | {steps})

    class SaveAt(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_save = state.global_step in save_at

    args = transformers.TrainingArguments(
        str(out), max_steps=steps, per_device_train_batch_size=16, learning_rate=1e-3,
        warmup_steps=min(40, steps // 10), lr_scheduler_type="cosine", weight_decay=0.01,
        save_strategy="steps", save_steps=10**9, save_only_model=True, logging_steps=10,
        report_to=[], use_cpu=True, disable_tqdm=True, seed=0, data_seed=0,
    )  # fmt: skip
    dataset = [{"input_ids": r, "labels": r} for r in rows]
    transformers.Trainer(model=model, args=args, train_dataset=dataset,
                         callbacks=[SaveAt()]).train()  # fmt: skip


def timed(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "scansnap_lens.cli", *args],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"scansnap {args[0]} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def bench(case: str, steps: int, rows: int, data: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        tok, stats, ev = root / "tokenizer.json", root / "stats.safetensors", root / "eval"
        start = time.perf_counter()
        train(root / "run", tok, data, steps, case)
        train_s = time.perf_counter() - start
        words = ["--documents", "wikitext", "--tokenizer", str(tok)]
        timed("stats", str(data / "valid.txt"), *words, "--out", str(stats), "--window", "64")
        timed("tokens", str(data / "test.txt"), *words, "--seq-len", "128", "--out",
              f"{ev}.safetensors")  # fmt: skip
        record_s = timed("record", "--checkpoints", str(root / "run"), "--tokens",
                         f"{ev}.safetensors", "--out", str(root / "traj"), "--tokenizer",
                         str(tok), "--stats", str(stats), "--max-rows", str(rows))  # fmt: skip
        report_s = timed("report", str(root / "traj"), "--stats", str(stats), "--out",
                         str(root / "report"))  # fmt: skip
        # the page again with another title: the analysis saved beside the run is reloaded
        rerender_s = timed("report", str(root / "traj"), "--stats", str(stats), "--out",
                           str(root / "report"), "--title", "again")  # fmt: skip
        manifest = json.loads((root / "traj" / "manifest.json").read_text())
        saved = json.loads((root / "traj" / "analysis" / "analysis.json").read_text())
        fit = saved["measurements"].get("theory_fit")
        fit_s = (fit or {}).get("attrs", {}).get("fit_seconds") or {}
        fit_classes = None
        if fit is not None:
            import pandas as pd

            table = pd.read_parquet(root / "traj" / "analysis" / "theory_fit.parquet")
            fit_classes = int(table["fit_classes"].iloc[0])
        from scansnap_lens.recording.trajectory import Trajectory

        traj = Trajectory.load(root / "traj")
        estimate, took = fit_s.get("estimate"), fit_s.get("took")
        return {
            "bench": "report", "case": case, "steps": steps,
            "layers_heads": [len(traj.layers), len(traj.heads)],
            "checkpoints": len(manifest["checkpoints"]), "rows": rows,
            "classes": traj.plan.num_classes, "fit_classes": fit_classes,
            "fit_estimate_s": None if estimate is None else round(estimate, 1),
            "fit_s": None if took is None else round(took, 1),
            "fit_took_over_estimate": round(took / estimate, 2) if estimate and took else None,
            "fit_not_measured": saved["not_measured"].get("theory_fit"),
            "train_s": round(train_s, 1), "record_s": round(record_s, 1),
            "report_s": round(report_s, 1), "report_over_record": round(report_s / record_s, 2),
            "rerender_s": round(rerender_s, 1),
        }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="10 steps, 8 rows: it runs")
    parser.add_argument("--case", choices=["first-day", "words", "both"], default="both")
    parser.add_argument("--shared", type=Path, default=SHARED)
    args = parser.parse_args()
    steps, rows = (10, 8) if args.quick else (800, 256)
    data = args.shared / "data" / "wikitext-2"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for case in ["first-day", "words"] if args.case == "both" else [args.case]:
        print(json.dumps(bench(case, steps, rows, data)), flush=True)


if __name__ == "__main__":
    main()
