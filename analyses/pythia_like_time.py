"""Is the Pythia-like run's snap at step 311 the run's or the grid's?  One training of the
recipe (`pythia_like_run.py`, one seed) recorded three ways at once: at Pythia's schedule (19
checkpoints), by an `AdaptiveSchedule` with the same budget, and every 10 steps (the
reference; Pythia's steps added, so the schedule's trajectory is a subset of it).

    python analyses/pythia_like_time.py --seed 1 --out out/time/seed1   # ~10 minutes, 2 cores
    python analyses/pythia_like_time.py --seed 1 --out out/time/seed1b --no-dense  # ~3 minutes

Prints, per layer, each way's snap steps (median over the layer's heads) with the checkpoints
that bracket them, the straightness of the movement (`measures.straightness`: 1 for a drift,
0.71 for noise), and the previous-token formation steps where heads formed (every 10 steps
also seen every 50 and every 250); writes
``time.json`` and ``heads.csv`` (every head, every way) into --out.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd
import torch
from pythia_like_run import model_config, prepare, pythia_steps

from scansnap_lens.measures.head_types import head_type
from scansnap_lens.measures.snap import snap_step_interval, snapping
from scansnap_lens.models.steps import select_steps
from scansnap_lens.planning.placement import AdaptiveSchedule
from scansnap_lens.recording.recorder import Recorder, trainer_callback
from scansnap_lens.recording.settings import RecordingSettings

EVERY = 10


def heads_of(traj, way: str) -> pd.DataFrame:
    """Every head's snap step with its bracket, and its previous-token formation step."""
    snap = snapping(traj).table
    keep = ["layer", "head", "snap_step", "snap_step_grid_lo", "snap_step_grid_hi",
            "rate_peak_step", "rate_peak_step_grid_lo", "rate_peak_step_grid_hi",
            "straightness", "drift_checkpoints", "half_distance_step",
            "half_displacement_step", "snap_reason"]  # fmt: skip
    out = snap[keep].copy()
    interval = snap_step_interval(traj, generator=torch.Generator().manual_seed(0))
    for name in ("snap_step_lo", "snap_step_hi"):
        out[name] = interval[name].reshape(-1).numpy()
    final = head_type(traj, "previous_token").final()
    for c in ("previous_token_step", "previous_token_step_lo", "previous_token_step_hi"):
        out[c] = final[c].to_numpy()
    out.insert(0, "way", way)
    out["checkpoints"] = traj.num_steps
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/time/seed1"))
    parser.add_argument("--shared", type=Path, default=Path("../shared"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-steps", type=int, default=2000)
    parser.add_argument("--no-dense", action="store_true", help="leave out the every-10 run")
    args = parser.parse_args()
    from transformers import GPTNeoXForCausalLM, Trainer, TrainingArguments

    start = time.perf_counter()
    tok, rows, eval_rows, stats = prepare(args.out, args.shared)
    num_steps, lr = args.num_steps, 1e-3
    schedule = pythia_steps(num_steps, 250)
    dense = sorted(set(range(0, num_steps + 1, EVERY)) | set(schedule))
    settings = RecordingSettings(tokenizer=tok, overwrite=True, progress=False)
    meta = {"lr_y": lr, "lr_z": lr, "optimizer": "adam", "momentum": 0.0}
    ways = ("pythia", "adaptive") if args.no_dense else ("pythia", "adaptive", "dense")
    recorders = {way: Recorder(args.out / way, eval_rows, settings, stats=stats, meta=meta)
                 for way in ways}  # fmt: skip
    adaptive = AdaptiveSchedule(recorders["adaptive"], budget=len(schedule), last_step=num_steps)
    torch.manual_seed(args.seed)
    model = GPTNeoXForCausalLM(model_config(tok.get_vocab_size()))
    training = TrainingArguments(
        output_dir=str(args.out / "trainer"), max_steps=num_steps, save_strategy="no",
        per_device_train_batch_size=8, learning_rate=lr, weight_decay=0.1, adam_beta1=0.9,
        adam_beta2=0.95, warmup_steps=max(1, num_steps // 20), lr_scheduler_type="cosine",
        report_to=[], logging_steps=50, use_cpu=True, seed=args.seed, disable_tqdm=True,
    )  # fmt: skip
    callbacks = [trainer_callback(recorders["pythia"], steps=schedule),
                 trainer_callback(recorders["adaptive"], steps=adaptive)]  # fmt: skip
    if not args.no_dense:
        callbacks.append(trainer_callback(recorders["dense"], steps=dense))
    data = [{"input_ids": r, "labels": r} for r in rows]
    Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks).train()
    trained = time.perf_counter()
    trajs = {way: r.trajectory() for way, r in recorders.items()}
    if "dense" in trajs:
        every = trajs.pop("dense")
        for k in (EVERY, 50, 250):
            trajs[f"every_{k}"] = every.select(steps=list(range(0, num_steps + 1, k)))
        for n, apart in ((68, 5), (29, 20), (19, 40)):  # log-spaced, about `apart` % apart
            trajs[f"log_{apart}pct"] = every.select(steps=select_steps(every.steps.tolist(),
                                                                       f"log:{n}"))  # fmt: skip
    heads = pd.concat([heads_of(t, way) for way, t in trajs.items()], ignore_index=True)
    heads.to_csv(args.out / "heads.csv", index=False)
    layers = heads.groupby(["way", "layer"]).agg(
        checkpoints=("checkpoints", "first"), drift=("drift_checkpoints", "median"),
        snap=("snap_step", "median"), snap_lo=("snap_step_lo", "median"),
        snap_hi=("snap_step_hi", "median"), half_distance=("half_distance_step", "median"),
        snap_min=("snap_step", "min"), snap_max=("snap_step", "max"),
        bracket_lo=("snap_step_grid_lo", "median"), bracket_hi=("snap_step_grid_hi", "median"),
        peak=("rate_peak_step", "median"), straightness=("straightness", "median"),
        formed=("previous_token_step", "count"),
        formed_at=("previous_token_step", "median"),
    ).reset_index()  # fmt: skip
    pd.set_option("display.width", 250)
    print(layers.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    info = {"seed": args.seed, "num_steps": num_steps, "steps": {w: t.steps.tolist()
            for w, t in trajs.items() if w in ("pythia", "adaptive")},
            "adaptive_why": {str(k): v for k, v in adaptive.reasons.items()},
            "train_and_record_s": round(trained - start, 1),
            "total_s": round(time.perf_counter() - start, 1)}  # fmt: skip
    (args.out / "time.json").write_text(json.dumps(info, indent=1))
    print(json.dumps({k: v for k, v in info.items() if k != "adaptive_why"}))


if __name__ == "__main__":
    main()
