"""A run that looks like what users analyse, on the text we have: a small GPT-NeoX with
Pythia's architecture trained by `transformers.Trainer`, recorded on Pythia's schedule.

    python analyses/pythia_like_run.py --out out/pythia_like                 # minutes (run.json)
    python analyses/pythia_like_run.py --out out/pythia_like_quick --quick   # a few minutes

- Text: WikiText-2 valid and the first 90 % of test's articles train; the last 10 % of test's
  articles are held out for recording.  A byte-level BPE tokenizer (4096 tokens) is trained on
  the training text; the model's vocabulary is padded to a multiple of 128, as Pythia's is.
- Model: GPT-NeoX, 4 layers, 8 heads, d_model 128 (rotary on a quarter of each head,
  parallel residual, untied unembedding), from a seeded random start: what trains in minutes
  on 2 cores.
- Training: `transformers.Trainer`, AdamW (lr 1e-3, weight decay 0.1, betas 0.9/0.95), 5 %
  linear warmup then cosine decay, 8 rows of 128 tokens a step, 2000 steps (300 with
  ``--quick``).
- Recording: `trainer_callback(recorder, steps=...)` at Pythia's schedule (0, 1, 2, 4, ...,
  512, then every 250 steps), every layer and head, the queries the training text's
  statistics (window 128) give distinct tokens, as many as fit the default budget.
- Report: `write_report` with the statistics as the source (token kinds with the binomial
  guard, the theory's checks at the run's optimizer; the population dynamics of the 256 most
  frequent tracked classes), whose head atlas gives every head's verdict with its interval;
  ``atlas.csv`` and ``run.json`` (times, settings) beside it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from scansnap_lens.inputs.corpus import Corpus
from scansnap_lens.inputs.text import read_documents
from scansnap_lens.inputs.tokens import encode, rows_of
from scansnap_lens.measures import theory_fit
from scansnap_lens.reading import atlas
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.recorder import Recorder, trainer_callback
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.report import write_report
from scansnap_lens.statistics.context import Context
from scansnap_lens.statistics.corpus import count_corpus
from scansnap_lens.statistics.groups import TokenGroups

SEQ_LEN = 128
BPE_VOCAB = 4096


def pythia_steps(num_steps: int, every: int) -> list[int]:
    """Pythia's checkpoint schedule scaled down: 0, then powers of two to 512, then every
    `every` steps, up to `num_steps` (always included).

    >>> pythia_steps(1000, 250)
    [0, 1, 2, 4, 8, 16, 32, 64, 128, 250, 256, 500, 512, 750, 1000]
    """
    steps = {0, num_steps} | {2**i for i in range(10) if 2**i <= num_steps}
    steps |= set(range(every, num_steps + 1, every))
    return sorted(steps)


def train_tokenizer(docs: list[str], path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(docs, trainer)
    tok.save(str(path))
    return tok


def model_config(vocab_size: int):
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=-(-vocab_size // 128) * 128,  # padded, as Pythia's 50304 for 50277
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=8,
        intermediate_size=512,
        rotary_pct=0.25,
        rotary_emb_base=10000,
        max_position_embeddings=SEQ_LEN,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        bos_token_id=0,
        eos_token_id=0,
    )


def prepare(out: Path, shared: Path):
    """(tokenizer, training rows, evaluation rows, statistics) of the recipe, the tokenizer
    and statistics saved in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    wiki = shared / "data" / "wikitext-2"
    test = read_documents(wiki / "test.txt", "wikitext")
    held = max(1, len(test) // 10)
    train_docs = read_documents(wiki / "valid.txt", "wikitext") + test[:-held]
    tok = train_tokenizer(train_docs, out / "tokenizer.json")
    train_ids = encode(tok, train_docs)
    rows = rows_of(train_ids, SEQ_LEN, join=True)
    eval_rows = rows_of(encode(tok, test[-held:]), SEQ_LEN, max_rows=64, join=True)
    stats = count_corpus(Corpus.of(rows=train_ids), Context(window=SEQ_LEN), progress=True)
    stats.tokenizer = str(out / "tokenizer.json")
    stats.save(out / "stats.safetensors")
    return tok, rows, eval_rows, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/pythia_like"))
    parser.add_argument("--shared", type=Path, default=Path("../shared"))
    parser.add_argument("--quick", action="store_true", help="300 steps instead of 2000")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from transformers import GPTNeoXForCausalLM, Trainer, TrainingArguments

    start = time.perf_counter()
    tok, rows, eval_rows, stats = prepare(args.out, args.shared)

    num_steps = 300 if args.quick else 2000
    every = 50 if args.quick else 250
    lr = 1e-3
    torch.manual_seed(args.seed)
    model = GPTNeoXForCausalLM(model_config(tok.get_vocab_size()))
    meta = {"model": "GPT-NeoX 4 layers x 8 heads, d_model 128 (Pythia's architecture)",
            "lr_y": lr, "lr_z": lr, "optimizer": "adam", "momentum": 0.0,
            "lr_schedule": "5 % warmup, cosine", "loss_on": "all"}  # fmt: skip
    recorder = Recorder(
        args.out / "trajectory",
        eval_rows,
        RecordingSettings(tokenizer=tok, overwrite=True),
        stats=stats,
        meta=meta,
    )
    data = [{"input_ids": r, "labels": r} for r in rows]
    training = TrainingArguments(
        output_dir=str(args.out / "trainer"),
        max_steps=num_steps,
        save_strategy="no",  # the recorder records at Pythia's steps, no weights are written
        per_device_train_batch_size=8,
        learning_rate=lr,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        warmup_steps=max(1, num_steps // 20),
        lr_scheduler_type="cosine",
        report_to=[],
        logging_steps=50,
        use_cpu=True,
        seed=args.seed,
        disable_tqdm=False,
    )
    schedule = pythia_steps(num_steps, every)
    trainer = Trainer(model=model, args=training, train_dataset=data,
                      callbacks=[trainer_callback(recorder, steps=schedule)])  # fmt: skip
    trained = time.perf_counter()
    trainer.train()
    traj = recorder.trajectory()
    recorded = time.perf_counter()
    groups, why = None, None
    try:
        groups = TokenGroups.from_statistics(stats, queries=traj.plan.queries.tolist())
    except ValueError as err:
        why = str(err)
    # the population dynamics of the 256 most frequent tracked classes (all of them take
    # minutes: each class is integrated at the run's own optimizer)
    plan = traj.plan
    top = plan.class_events.argsort(descending=True)[:256]
    fit_classes = list(zip(plan.class_query[top].tolist(), plan.class_next[top].tolist()))
    results = {}
    try:
        results["theory_fit"] = theory_fit(traj, stats, groups, classes=fit_classes)
    except ValueError as err:
        print(f"theory_fit: {err}")
    title = "Pythia-like run: GPT-NeoX 4x8, d 128, on WikiText-2, AdamW"
    analysis = Analysis.of(traj, groups, source=stats, groups_reason=why, results=results)
    report = write_report(analysis, args.out / "report", title=title)
    table = atlas(report.summary)
    table.to_csv(args.out / "atlas.csv", index=False)
    done = time.perf_counter()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    info = {
        "num_steps": num_steps, "checkpoints": traj.num_steps, "heads": len(table),
        "queries": traj.plan.num_queries, "classes": traj.plan.num_classes,
        "train_rows": len(rows), "eval_rows": int(eval_rows.shape[0]),
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "prepare_s": round(trained - start, 1), "train_and_record_s": round(recorded - trained, 1),
        "report_s": round(done - recorded, 1), "total_s": round(done - start, 1),
        "scanning_heads": int(table["scans"].sum()) if "scans" in table else None,
        "not_measured": report.not_measured,
    }  # fmt: skip
    (args.out / "run.json").write_text(json.dumps(info, indent=1))
    shown = ("layer", "head", "verdict", "bias", "bias_lo", "bias_hi", "auroc", "auroc_lo",
             "auroc_hi", "auroc_n_eff", "auroc_mde", "matched_auroc", "frequency_control",
             "snap", "induction", "induction_step", "previous_token", "previous_token_step",
             "first_token", "first_token_step", "rank_agreement", "attention_entropy")  # fmt: skip
    cols = [c for c in shown if c in table]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(json.dumps(info))
    print(f"report: {report.path.resolve()}")


if __name__ == "__main__":
    main()
