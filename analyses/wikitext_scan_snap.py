"""Scan and snap on WikiText-2 (the paper's Figs. 7 and 10, on models trained here).

    python analyses/wikitext_scan_snap.py --out out/wikitext [--quick] [--shared ../shared]

Word-level models (the most frequent words plus <unk>) are trained with plain SGD (no
momentum) on the valid split, with log-spaced checkpoints recorded in the training loop: a
1-layer and a 3-layer transformer (standard positional embeddings, MLPs) at several learning
rates, and the theory's model, a 1-layer attention-only transformer without positional
embeddings, at eta_Y = 0.2 with eta_Z = 0.2 and 6 (W_Q, W_K get eta_Z).  Evaluation
text is the test split.  Classes come from the co-occurrence statistics of the training text
(local classification, whole-row window), in two variants: "paper" (the paper's definition,
a token seen with one next token of the query only, with a floor of 2 co-occurrences and
purity 0.9, no binomial guard) and "guarded" (purity 1 and the binomial guard against rare
look-alikes: far fewer classes, but each more trustworthy).  The tracked queries are
mid-frequency words (frequency ranks 20 to 119): the most frequent words ("the", ",", ".")
co-occur with so many next tokens that no context token is distinct for them.  Snap steps use
the attention of every tracked class.

Writes to --out: summary.csv (one row per model, lr, layer, head; "paper" classes),
scan.csv (discriminative and frequency bias per step, both class variants), sparsity.csv,
fig10_entropy_vs_lr.png (first-layer attention entropy at the end of training against the
learning rate of W_Q, W_K), theory.csv (each head against the theory: Theorem 3's bounds with
rho0 from the data, and the population dynamics integrated on the training statistics at the
run's rates), fig7_attention_<model>.png (the first-layer attention of one test
sequence over checkpoints), bias_over_steps_<run>.png, one trajectory folder per run under
trajectories/ and its HTML report under reports/.
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
from scansnap_lens.inputs.tokens import rows_of
from scansnap_lens.models.backend import build_model as backend_model
from scansnap_lens.models.training import attention_only_model, train
from scansnap_lens.reading.analysis import Analysis
from scansnap_lens.recording.plan import plan_recording
from scansnap_lens.recording.recorder import Recorder
from scansnap_lens.recording.settings import RecordingSettings
from scansnap_lens.report import write_report
from scansnap_lens.statistics.corpus import cooccurrence
from scansnap_lens.statistics.groups import TokenGroups

FULL = {
    "vocab": 2000,
    "n_ctx": 64,
    "d_model": 128,
    "steps": 1200,
    "batch": 32,
    # model name -> (eta_Y, eta_Z) of each run; "attn-nopos" is the theory's model: attention
    # only, no positional embeddings, its own rate for W_Q and W_K
    "runs": {
        "1layer": [(0.1, 0.1), (0.4, 0.4)],
        "3layer": [(0.1, 0.1), (0.4, 0.4)],
        "1layer-attn-nopos": [(0.2, 0.2), (0.2, 6.0)],
    },
    "eval_rows": 512,
    "checkpoints": "log:10",
    "query_ranks": (20, 120),
}
QUICK = {
    "vocab": 2000,
    "n_ctx": 32,
    "d_model": 64,
    "steps": 100,
    "batch": 16,
    "runs": {
        "1layer": [(0.1, 0.1), (0.3, 0.3)],
        "3layer": [(0.1, 0.1), (0.3, 0.3)],
        "1layer-attn-nopos": [(0.2, 0.2), (0.2, 6.0)],
    },
    "eval_rows": 512,
    "checkpoints": "log:6",
    "query_ranks": (20, 120),
}


THEORY = ["layer", "head", "snap_step", "predicted_snap", "population_snap", "snap_ratio",
          "rank_agreement", "dz_corr", "bound_ratio", "inside"]  # fmt: skip


def build_model(cfg: dict, name: str, seed: int):
    if name.endswith("attn-nopos"):
        return attention_only_model(
            cfg["vocab"], cfg["d_model"], n_heads=4, n_ctx=cfg["n_ctx"], positional=False, seed=seed
        )
    n_layers = int(name[0])
    torch.manual_seed(seed)
    return backend_model(  # HookedTransformer on transformer-lens 3.x, the bridge on 4.x
        dict(
            n_layers=n_layers,
            d_model=cfg["d_model"],
            n_heads=4,
            d_head=cfg["d_model"] // 4,
            d_mlp=4 * cfg["d_model"],
            d_vocab=cfg["vocab"],
            n_ctx=cfg["n_ctx"],
            act_fn="gelu",
            seed=seed,
        )
    )


def main() -> None:
    p = parser(__doc__, "out/wikitext")
    p.add_argument("--quick", action="store_true", help="a reduced run of about a minute")
    p.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = QUICK if args.quick else FULL
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()

    data = args.shared / "data" / "wikitext-2"
    train_docs = wikitext_documents(data / "valid.txt")
    test_docs = wikitext_documents(data / "test.txt")
    tok = word_level_tokenizer(train_docs, max_vocab=cfg["vocab"])
    train_rows = rows_of(encode_documents(tok, train_docs), cfg["n_ctx"] + 1, join=True)
    eval_rows = rows_of(encode_documents(tok, test_docs), cfg["n_ctx"], cfg["eval_rows"], join=True)
    V = tok.get_vocab_size()

    # word-level ids are frequency ranks (0 is <unk>)
    plan = plan_recording(
        eval_rows, V, queries=list(range(*cfg["query_ranks"])), exclude_bos=False, tokenizer=tok
    )
    queries = plan.queries.tolist()
    stats = cooccurrence(train_rows, V, queries=queries)
    variants = {
        "paper": {"guard": False, "purity": 0.9, "min_support": 2},
        "guarded": {},
    }
    all_groups = {
        name: TokenGroups.from_statistics(stats, min_distinct=1, **options)
        for name, options in variants.items()
    }
    groups = all_groups["paper"]
    print(
        f"vocab {V}, train rows {len(train_rows)}, eval rows {len(eval_rows)}, tracked queries"
        f" {len(queries)} ({', '.join(tok.id_to_token(q) for q in queries[:12])} ...)"
    )
    for name, g in all_groups.items():
        print(
            f"  {name} classes: {g.num_classes} with distinct tokens,"
            f" {sum(d.numel() for d in g.distinct)} distinct tokens,"
            f" {sum(d.numel() >= 2 for d in g.distinct)} classes with two or more"
        )
    words = [tok.id_to_token(int(t)) for t in eval_rows[0]]  # the recorder's example prompt
    # The theory's prediction runs on the tracked classes seen at least 5 times in training
    # (over 90 % of their events; the rarer ones add cost, little weight)
    events = dict(zip(zip(stats.query.tolist(), stats.next_token.tolist()), stats.events.tolist()))
    fit_classes = [
        c for c in zip(plan.class_query.tolist(), plan.class_next.tolist()) if events.get(c, 0) >= 5
    ]

    summaries, scans, sparsities, theories = [], [], [], []
    for name, runs in cfg["runs"].items():
        for lr, lr_attention in runs:
            run = f"{name}_lr{lr}" + (f"_lrz{lr_attention}" if lr_attention != lr else "")
            model = build_model(cfg, name, args.seed)
            folder = out / "trajectories" / run
            shutil.rmtree(folder, ignore_errors=True)  # a fresh run, not a resumed one
            recorder = Recorder(
                folder,
                eval_rows,
                RecordingSettings(progress=False),
                plan=plan,
                meta={"model": name},
            )
            result = train(
                model,
                train_rows,
                num_steps=cfg["steps"],
                lr_y=lr,
                lr_z=lr_attention,
                momentum=0.0,
                batch_size=cfg["batch"],
                save_steps=cfg["checkpoints"],
                seed=args.seed,
                progress=False,
                on_checkpoint=recorder.on_checkpoint,
            )
            traj = recorder.trajectory()
            loss = float(np.mean(result.loss[-20:]))
            print(f"{run}: final loss {loss:.3f} ({time.time() - start:.0f} s)")
            tag = {"model": name, "lr": lr, "lr_attention": lr_attention}
            checks = {
                "theory_fit": measures.theory_fit(traj, stats, groups, classes=fit_classes),
                "growth_bounds": measures.growth_bounds(traj, groups, stats),
            }
            analysis = Analysis.of(traj, groups, results=checks)
            summary = analysis.summary
            summaries.append(summary.assign(**tag, final_loss=loss))
            theories.append(summary[THEORY].assign(**tag))
            for variant, g in all_groups.items():
                disc = measure_or_nan(measures.discriminative_bias, traj, g, ["bias", "auroc"])
                freq = measure_or_nan(
                    measures.frequency_bias, traj, g, ["spearman", "spearman_classes"]
                )
                part = disc.merge(freq, on=["step", "layer", "head"]).assign(classes=variant)
                scans.append(part.assign(**tag))
                if variant == "paper":
                    scan = part
            write_report(
                analysis,
                out / "reports" / run,
                title=f"WikiText-2, {name}, SGD eta_Y {lr}, eta_Z {lr_attention}",
                token_strings=words,
            )
            sparsity = measure_or_nan(measures.sparsity, traj, groups, ["entropy"])
            entropy = traj.entropy_dataframe()
            attn_entropy = (
                entropy.assign(w=entropy["events"] * entropy["entropy"])
                .groupby(["step", "layer", "head"])[["w", "events"]]
                .sum()
            )
            attn_entropy = (attn_entropy["w"] / attn_entropy["events"]).rename("attn_entropy")
            sparsities.append(
                sparsity.merge(attn_entropy.reset_index(), on=["step", "layer", "head"]).assign(
                    **tag
                )
            )
            viz.plot_over_steps(
                scan,
                "bias",
                snaps=measures.snapping(traj).table,
                title=f"{run}: discriminative bias (dotted: snap)",
                path=out / f"bias_over_steps_{run}.png",
            )
            if (lr, lr_attention) == runs[-1]:
                picks = np.linspace(0, traj.num_steps - 1, 4).round().astype(int)
                viz.plot_attention_maps(
                    [traj.prompt_pattern[i, 0, 0, :24, :24].numpy() for i in picks],
                    traj.steps[picks].tolist(),
                    words[:24],
                    title=f"{run}: layer 0 head 0 on a test sequence",
                    path=out / f"fig7_attention_{name}.png",
                )

    summary = pd.concat(summaries, ignore_index=True)
    scan = pd.concat(scans, ignore_index=True)
    sparsity = pd.concat(sparsities, ignore_index=True)
    theory = pd.concat(theories, ignore_index=True)
    theory.to_csv(out / "theory.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    scan.to_csv(out / "scan.csv", index=False)
    sparsity.to_csv(out / "sparsity.csv", index=False)

    keys = ["model", "lr", "lr_attention"]
    final = sparsity[sparsity["step"] == sparsity.groupby(keys)["step"].transform("max")]
    first_layer = final[final["layer"] == 0]
    fig10 = first_layer.groupby(keys)[["attn_entropy", "entropy"]].mean().reset_index()
    fig10.to_csv(out / "fig10_entropy_vs_lr.csv", index=False)
    _plot_fig10(fig10, out / "fig10_entropy_vs_lr.png")
    columns = ["snap_step", "bias", "auroc", "spearman", "entropy", "final_loss"]
    table = summary.reindex(columns=[*keys, *columns]).groupby(keys).mean()
    print(table.round(3).to_string())
    print(theory.round(3).to_string(index=False))
    print(fig10.round(3).to_string(index=False))
    meta = {"config": cfg, "seconds": round(time.time() - start, 1), "vocab": V}
    (out / "run.json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {out} in {time.time() - start:.0f} s")


def _plot_fig10(table: pd.DataFrame, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.4))
    ax = fig.subplots()
    for model, part in table.groupby("model"):
        line = ax.plot(part["lr_attention"], part["attn_entropy"], marker="o", label=model)[0]
        ax.plot(part["lr_attention"], part["entropy"], marker="s", ls="--", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel(r"SGD rate of $W_Q, W_K$ ($\eta_Z$; $= \eta_Y$ but for attn-nopos)")
    ax.set_ylabel("first-layer attention entropy (nats)")
    ax.set_title(
        "Fig. 10 analogue at the end of training\nsolid: all context, dashed: distinct tokens",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
