"""Scan and snap on WikiText-2 in the authors' own setting (the paper's Figs. 7, 10, 11-12).

    python analyses/wikitext_authors_setup.py --out out/authors [--quick] [--shared ../shared]
    python analyses/wikitext_authors_setup.py --out out/long --parts fig7 --runs 1layer \
        --iterations 6000      # past the theory's t0 (about 4,100 iterations here)

The model is the PyTorch transformer tutorial's (`tutorial.tutorial_model`: embedding 200,
1 head, feed-forward 200, ReLU, post-LN, sinusoidal positions, dropout 0.3, 0.2 for 3 layers),
trained as the authors' Fig. 7 notebook trains it: SGD without momentum at lr 5, the first
feed-forward layer at lr 10, gradient norm clipped at 0.5, 20 columns of 35 tokens read
contiguously through the corpus (the tutorial's batchify / bptt), 2000 iterations with a
checkpoint every 100, recorded in the training loop.  Text: word-level and lowercased (the
tutorial's basic_english), every word of the training text in the vocabulary.  The training
split is not in ../shared, so the model trains on valid.txt plus the first 80 % of the
articles of test.txt and is evaluated on the rest (words unseen in training read <unk>).

Fig. 7: the 1- and 3-layer runs, their first layer's attention on a held-out sequence at
iterations 0, 500, 1000, 1500 (PNG and a circuitsvis view), the entropy of the first layer
over iterations (every held-out position, the query's own position included as the authors
measured it, and left out as the library's recorder measures it), the snap step of the
library's estimator (`measures.snapping`), discriminative and frequency bias on two class
variants, and the report.  Fig. 10: the 1-layer model at one learning rate for all
parameters, several rates and seeds, the first layer's entropy at the end.  Figs. 11-12: the
recall of distinct tokens against a threshold near 1/M on Syn-Medium (the Y/Z lab).

Writes to --out: runs.csv (one row per Fig. 7 run), entropy.csv (entropy per checkpoint of
every run), scan.csv (biases per checkpoint, both class variants), uncertainty.csv (every
head's intervals, p-values and `scans` verdict at the last checkpoint, both class variants),
fig7_<run>.png and fig7_<run>.html, entropy_<run>.png, fig10.csv / fig10_per_seed.csv /
fig10.png, fig11.csv / fig11.png, fig12.csv / fig12.png, reports/<run>/, trajectories/<run>/,
run.json.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _common import measure_or_nan, parser

from scansnap_lens import measures, viz
from scansnap_lens.inputs.text import encode_documents, wikitext_documents, word_level_tokenizer
from scansnap_lens.lab import FIG6_NUM_LAST, recall_sweep
from scansnap_lens.measures.entropy import position_entropy
from scansnap_lens.models.training import train
from scansnap_lens.models.tutorial import FIRST_FEED_FORWARD, tutorial_model
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.report import write_report
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import TokenGroups

FULL = {
    "max_vocab": None,  # every word of the training text
    "d_model": 200,
    "bptt": 35,
    "batch": 20,
    "iterations": 2000,
    "every": 100,
    "fig7": {"1layer": (1, 0.3), "3layer": (3, 0.2)},  # name -> (layers, dropout)
    "lr": 5.0,
    "lr_first_ff": 10.0,
    "clip": 0.5,
    "map_steps": (0, 500, 1000, 1500),
    "record_rows": 512,  # held-out rows the recorder tracks classes on
    "query_ranks": (20, 120),
    "sweep_lrs": (0.5, 1.0, 2.0, 5.0),
    "sweep_seeds": 3,
    "sweep_iterations": 200,
    "sweep_every": 50,
    "recall_seeds": 10,
}
QUICK = {
    **FULL,
    "max_vocab": 4000,
    "d_model": 64,
    "iterations": 40,
    "every": 10,
    "map_steps": (0, 10, 20, 30),
    "record_rows": 64,
    "sweep_lrs": (1.0, 5.0),
    "sweep_seeds": 2,
    "sweep_iterations": 20,
    "sweep_every": 10,
    "recall_seeds": 2,
}
ENTROPY = ["entropy_with_self", "entropy_without_self"]
# `measures.scan_uncertainty` columns runs.csv carries for the first layer, per class variant
SURE = ["verdict", "bias_lo", "bias_hi", "bias_p", "bias_n_eff", "bias_baseline", "auroc_lo",
        "auroc_hi", "auroc_p", "auroc_mde", "auroc_baseline", "matched_auroc",
        "frequency_control", "spearman_lo", "spearman_hi", "spearman_p", "spearman_n_eff",
        "scans"]  # fmt: skip
PARTS = ["fig7", "fig10", "fig11-12"]


def split(shared: Path) -> tuple[list[str], list[str]]:
    """(training articles: valid.txt and the first 80 % of test.txt's, held-out articles)."""
    data = shared / "data" / "wikitext-2"
    valid = wikitext_documents(data / "valid.txt")
    test = wikitext_documents(data / "test.txt")
    cut = round(0.8 * len(test))
    lower = str.lower  # the tutorial's basic_english tokenizer lowercases
    return [lower(d) for d in valid + test[:cut]], [lower(d) for d in test[cut:]]


def stream_of(tok, docs: list[str]) -> torch.Tensor:
    return torch.from_numpy(np.concatenate(encode_documents(tok, docs))).long()


def bptt_rows(stream: torch.Tensor, batch: int, bptt: int) -> torch.Tensor:
    """[N, bptt] the inputs the model sees in training (`train(bptt=)`'s windows, less the
    last position each, which only serves as a target): the co-occurrence statistics are
    counted on exactly these contexts."""
    columns = stream.numel() // batch
    grid = stream[: columns * batch].reshape(batch, columns)
    return torch.cat([grid[:, s : s + bptt] for s in range(0, columns - bptt, bptt)])


def entropies(model, rows: torch.Tensor) -> dict[str, float]:
    """The first layer's mean attention entropy over every held-out position, both ways."""
    with_self = position_entropy(model, rows, layers=[0], include_self=True)
    without = position_entropy(model, rows, layers=[0], include_self=False)
    return {ENTROPY[0]: float(with_self.mean()), ENTROPY[1]: float(without.mean())}


def run_fig7(name, layers, dropout, cfg, data, out, seed) -> tuple[dict, pd.DataFrame, list]:
    """One Fig. 7 run: train, record, measure, draw, report."""
    tok, train_stream, eval_rows, plan, variants = data
    V = tok.get_vocab_size()
    # dropout draws from the global generator: each run starts from the seed, so that a run
    # gives the same model alone (--runs) as after another
    torch.manual_seed(seed)
    model = tutorial_model(V, n_layers=layers, d_model=cfg["d_model"], d_mlp=cfg["d_model"],
                           n_ctx=cfg["bptt"], dropout=dropout, seed=seed)  # fmt: skip
    folder = out / "trajectories" / name
    shutil.rmtree(folder, ignore_errors=True)  # a fresh run, not a resumed one
    meta = {"model": name, "setting": "authors"}
    recorder = Recorder(
        folder,
        eval_rows[: cfg["record_rows"]],
        RecordingSettings(progress=False, prompt=eval_rows[0]),
        plan=plan,
        meta=meta,
    )
    curve = []

    def on_checkpoint(step, model, training):
        recorder.on_checkpoint(step, model, training=training)
        curve.append({"run": name, "step": step, **entropies(model, eval_rows)})

    result = train(model, train_stream, num_steps=cfg["iterations"], lr_y=cfg["lr"],
                   lr_by_name={FIRST_FEED_FORWARD: cfg["lr_first_ff"]},
                   clip_grad_norm=cfg["clip"], batch_size=cfg["batch"], bptt=cfg["bptt"],
                   save_steps=cfg["every"], seed=seed, progress=False,
                   on_checkpoint=on_checkpoint)  # fmt: skip
    traj = recorder.trajectory()
    curve = pd.DataFrame(curve)
    words = [tok.id_to_token(int(t)) for t in eval_rows[0]]

    picks = [traj.steps.tolist().index(s) for s in cfg["map_steps"]]
    viz.plot_attention_maps([traj.prompt_pattern[i, 0, 0, :24, :24].numpy() for i in picks],
                            cfg["map_steps"], words[:24],
                            title=f"{name}: first layer on a held-out sequence (lr {cfg['lr']})",
                            path=out / f"fig7_{name}.png")  # fmt: skip
    viz.attention_over_checkpoints(traj, layer=0, steps=list(cfg["map_steps"]),
                                   token_strings=words).save(out / f"fig7_{name}.html")  # fmt: skip
    snaps = measures.snapping(traj).table
    first = snaps[snaps["layer"] == 0].iloc[0]
    viz.plot_over_steps(curve.assign(layer=0, head=0), ENTROPY[0],
                        snaps=snaps[snaps["layer"] == 0],
                        title=f"{name}: first-layer entropy, all held-out positions (dotted: snap)",
                        path=out / f"entropy_{name}.png")  # fmt: skip

    scans, sure = [], []
    for variant, groups in variants.items():
        disc = measure_or_nan(measures.discriminative_bias, traj, groups, ["bias", "auroc"])
        freq = measure_or_nan(
            measures.frequency_bias, traj, groups, ["spearman", "spearman_classes"]
        )
        scans.append(disc.merge(freq, on=["step", "layer", "head"]).assign(classes=variant))
        try:  # intervals, p-values and the verdict at the last checkpoint, every head
            table = measures.scan_uncertainty(traj, groups, seed=seed).table
            sure.append(table.assign(classes=variant, run=name, heads=len(table)))
        except ValueError as err:
            print(f"  scan_uncertainty ({variant}): {err}")
    scan = pd.concat(scans, ignore_index=True).assign(run=name)
    write_report(Analysis.of(traj, variants["paper"]), out / "reports" / name, token_strings=words,
                 title=f"WikiText-2, the authors' {name} model, SGD lr {cfg['lr']}")  # fmt: skip

    at = curve.set_index("step")
    row = {
        "run": name,
        "final_loss": float(np.mean(result.loss[-20:])),
        **{
            f"entropy@{s}": at[ENTROPY[0]].get(s, np.nan)
            for s in (*cfg["map_steps"], cfg["iterations"])
        },
        f"entropy_without_self@{cfg['iterations']}": at[ENTROPY[1]].iloc[-1],
        "snap_step": first["snap_step"],
        "snap_reason": first["snap_reason"],
        "rate_peak_step": first["rate_peak_step"],
        "predicted_snap": measures.predicted_snap(traj)[0],
    }
    final = scan[(scan["step"] == scan["step"].max()) & (scan["layer"] == 0)]
    for variant, part in final.groupby("classes"):
        for column in ("bias", "auroc", "spearman", "spearman_classes"):
            row[f"{column}_{variant}"] = part[column].iloc[0]
    for table in sure:  # the first layer's intervals and verdict, per class variant
        first_layer = table[table["layer"] == 0].iloc[0]
        for column in SURE:
            row[f"{column}_{first_layer['classes']}"] = first_layer[column]
    if sure:  # over the tracked classes: the same for both variants
        row["snap_step_lo"], row["snap_step_hi"] = sure[0].iloc[0][["snap_step_lo", "snap_step_hi"]]
    row = {k: float(v) if isinstance(v, np.floating) else v for k, v in row.items()}
    return row, curve, [scan], sure


def run_sweep(cfg, data, out) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fig. 10: the 1-layer model, one rate for every parameter, entropy after training."""
    tok, train_stream, eval_rows, _, _ = data
    rows, curves = [], []
    for lr in cfg["sweep_lrs"]:
        for seed in range(cfg["sweep_seeds"]):
            model = tutorial_model(tok.get_vocab_size(), d_model=cfg["d_model"],
                                   d_mlp=cfg["d_model"], n_ctx=cfg["bptt"], seed=seed)  # fmt: skip

            def on_checkpoint(step, model, lr=lr, seed=seed):
                curves.append({"lr": lr, "seed": seed, "step": step, **entropies(model, eval_rows)})

            result = train(model, train_stream, num_steps=cfg["sweep_iterations"], lr_y=lr,
                           clip_grad_norm=cfg["clip"], batch_size=cfg["batch"], bptt=cfg["bptt"],
                           save_steps=cfg["sweep_every"], seed=seed, progress=False,
                           on_checkpoint=on_checkpoint)  # fmt: skip
            rows.append({"lr": lr, "seed": seed, **{k: curves[-1][k] for k in ENTROPY},
                         "final_loss": float(np.mean(result.loss[-20:]))})  # fmt: skip
            print(f"  fig10 lr {lr} seed {seed}: {rows[-1]}")
    per_seed = pd.DataFrame(rows)
    summary = per_seed.groupby("lr")[[*ENTROPY, "final_loss"]].agg(["mean", "std"])
    summary.columns = [f"{a}_{b}" for a, b in summary.columns]
    summary = summary.reset_index().assign(seeds=cfg["sweep_seeds"])
    per_seed.to_csv(out / "fig10_per_seed.csv", index=False)
    pd.DataFrame(curves).to_csv(out / "fig10_entropy_over_steps.csv", index=False)
    summary.to_csv(out / "fig10.csv", index=False)
    _plot_fig10(summary, cfg, out / "fig10.png")
    return per_seed, summary


def run_recall(cfg, out) -> None:
    """Figs. 11-12 on Syn-Medium: recall against threshold, varying eta_Y / eta_Z at eta_Z = 1
    (Fig. 11) and eta_Z at eta_Y / eta_Z = 2 (Fig. 12), for each number of queries."""
    figures = {"fig11": ({"lr_z": (1.0,), "ratio": (1.0, 2.0, 5.0, 10.0)}, "ratio"),
               "fig12": ({"lr_z": (0.5, 1.0, 2.0, 3.0), "ratio": (2.0,)}, "lr_z")}  # fmt: skip
    for name, (grid, varied) in figures.items():
        tables = [recall_sweep(**grid, num_last=q, seeds=cfg["recall_seeds"], progress=False)
                  for q in FIG6_NUM_LAST]  # fmt: skip
        per_seed = pd.concat(tables, ignore_index=True)
        mean = per_seed.groupby(["num_last", varied, "threshold"])["recall"].mean().reset_index()
        mean.to_csv(out / f"{name}.csv", index=False)
        _plot_recall(mean, varied, name, out / f"{name}.png")


def main() -> None:
    p = parser(__doc__, "out/authors")
    p.add_argument("--quick", action="store_true", help="a reduced run of about a minute")
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--parts", nargs="+", choices=PARTS, default=PARTS, help="what to run")
    p.add_argument("--runs", nargs="+", choices=list(FULL["fig7"]), help="Fig. 7 runs to train")
    p.add_argument("--iterations", type=int, help="the Fig. 7 runs' length (default 2000)")
    args = p.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    if args.runs:
        cfg["fig7"] = {name: cfg["fig7"][name] for name in args.runs}
    if args.iterations is not None:
        if args.iterations < max(cfg["map_steps"]) or args.iterations % cfg["every"]:
            p.error(f"--iterations: a multiple of {cfg['every']} from {max(cfg['map_steps'])}")
        cfg["iterations"] = args.iterations
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    torch.manual_seed(args.seed)

    train_docs, eval_docs = split(args.shared)
    tok = word_level_tokenizer(train_docs, max_vocab=cfg["max_vocab"])
    V = tok.get_vocab_size()
    train_stream = stream_of(tok, train_docs)
    eval_stream = stream_of(tok, eval_docs)
    n = eval_stream.numel() // cfg["bptt"] * cfg["bptt"]
    eval_rows = eval_stream[:n].reshape(-1, cfg["bptt"])
    unk = float((eval_stream == 0).double().mean())
    # word-level ids are frequency ranks (0 is <unk>): track mid-frequency queries, whose
    # contexts can hold distinct tokens (the most frequent words follow nearly everything)
    plan = plan_recording(eval_rows[: cfg["record_rows"]], V,
                          queries=list(range(*cfg["query_ranks"])), tokenizer=tok)  # fmt: skip
    stats = cooccurrence(bptt_rows(train_stream, cfg["batch"], cfg["bptt"]), V,
                         queries=plan.queries.tolist())  # fmt: skip
    variants = {
        "paper": {"guard": False, "purity": 0.9, "min_support": 2},
        "guarded": {},
    }
    variants = {k: TokenGroups.from_statistics(stats, min_distinct=1, **options)
                for k, options in variants.items()}  # fmt: skip
    print(f"vocabulary {V}, training tokens {train_stream.numel()}, held-out rows"
          f" {len(eval_rows)} ({unk:.1%} <unk>), tracked queries {plan.num_queries}")  # fmt: skip
    data = (tok, train_stream, eval_rows, plan, variants)

    rows, curves, scans, sure = [], [], [], []
    for name, (layers, dropout) in cfg["fig7"].items() if "fig7" in args.parts else ():
        row, curve, scan, intervals = run_fig7(name, layers, dropout, cfg, data, out, args.seed)
        rows.append(row), curves.append(curve), scans.extend(scan), sure.extend(intervals)
        print(f"{name}: {({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})}"
              f" ({time.time() - start:.0f} s)")  # fmt: skip
    if rows:
        runs = pd.DataFrame(rows)
        runs.to_csv(out / "runs.csv", index=False)
        pd.concat(curves, ignore_index=True).to_csv(out / "entropy.csv", index=False)
        pd.concat(scans, ignore_index=True).to_csv(out / "scan.csv", index=False)
        if sure:
            pd.concat(sure, ignore_index=True).to_csv(out / "uncertainty.csv", index=False)
        print(runs.T.to_string())
    if "fig10" in args.parts:
        _, fig10 = run_sweep(cfg, data, out)
        print(fig10.round(4).to_string(index=False))
    if "fig11-12" in args.parts:
        run_recall(cfg, out)
    seconds = round(time.time() - start, 1)
    meta = {"config": cfg, "seconds": seconds, "vocab": V, "held_out_unk": unk,
            "training_tokens": int(train_stream.numel()),
            "threads": torch.get_num_threads()}  # fmt: skip
    (out / "run.json").write_text(json.dumps(meta, indent=1, default=str))
    print(f"wrote {out} in {seconds:.0f} s")


def _plot_fig10(summary: pd.DataFrame, cfg: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.4))
    ax = fig.subplots()
    for column, label in zip(
        ENTROPY, ["query's position included (authors)", "left out (recorder)"]
    ):
        ax.errorbar(summary["lr"], summary[f"{column}_mean"], yerr=summary[f"{column}_std"],
                    marker="o", capsize=3, label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(summary["lr"], [f"{v:g}" for v in summary["lr"]])
    ax.minorticks_off()
    ax.set_xlabel("SGD learning rate (every parameter)")
    ax.set_ylabel("first-layer attention entropy (nats)")
    ax.set_title(f"Fig. 10: after {cfg['sweep_iterations']} iterations,"
                 f" {cfg['sweep_seeds']} seeds (1 std)", fontsize=9)  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _plot_recall(mean: pd.DataFrame, varied: str, name: str, path: Path) -> None:
    from matplotlib.figure import Figure

    panels = sorted(mean["num_last"].unique())
    fig = Figure(figsize=(3.2 * len(panels), 3.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    symbol = {"ratio": r"$\eta_Y/\eta_Z$", "lr_z": r"$\eta_Z$"}[varied]
    for ax, q in zip(axes, panels):
        part = mean[mean["num_last"] == q]
        for value, line in part.groupby(varied):
            ax.plot(line["threshold"], line["recall"], marker=".", label=f"{symbol} = {value:g}")
        ax.set_title(f"{q} quer{'y' if q == 1 else 'ies'}, 2 next tokens each", fontsize=9)
        ax.set_xlabel("threshold")
    axes[0].set_ylabel("recall of distinct tokens")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{name.replace('fig', 'Fig. ')} on Syn-Medium", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
