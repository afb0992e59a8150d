"""The ``scansnap`` command line: a thin layer over the library.

    scansnap demo [--out DIR]                         the main job, end to end
    scansnap stats CORPUS... --out stats.safetensors  co-occurrence statistics of a corpus
    scansnap tokens TEXT --tokenizer T --out eval.safetensors   evaluation tokens from text
    scansnap record --checkpoints DIR --tokens FILE --out TRAJ   attention over checkpoints
    scansnap report TRAJ --stats STATS --out DIR      measurements, figures, circuitsvis views
    scansnap theory --K 2 --M 33 --lr-y 0.1 --lr-z 3  the theory's transition and B_n curve

Exit codes: 0 done, 2 bad input (the message names it), 130 interrupted (a recording keeps
what it has; run the same command again to resume).
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

from scansnap_lens import _settings as _readers

__all__ = ["build_parser", "cli_message", "main"]

# pandas and torch are imported inside the commands: an interrupt while they load is
# then caught like any other (exit 130), and --help answers at once.


def _print_summary(analysis) -> None:
    from scansnap_lens.measures.catalog import columns as shown
    from scansnap_lens.report import number, with_intervals

    table = with_intervals(analysis.summary, shown("key", analysis.entries))
    print(table.to_string(index=False, float_format=number))
    print("findings:")  # below the table: the last lines a terminal shows
    for line in analysis.findings:
        print(f"  {line}")


# ------------------------------------------------------------------ demo
def _demo(args: argparse.Namespace) -> int:
    from scansnap_lens.demo import run_demo

    start = time.perf_counter()
    result = run_demo(
        args.out, data=args.data, num_steps=args.num_steps, seed=args.seed, overwrite=args.overwrite
    )
    print(
        f"Trained a 1-layer attention-only transformer (no positions) on {args.data} for"
        f" {args.num_steps} steps: loss {result.training.loss[0]:.3f} ->"
        f" {result.training.loss[-1]:.4f}"
    )
    print(f"recorded {result.trajectory.num_steps} checkpoints; classes from the training corpus")
    _print_summary(result.analysis)
    print(
        "bias > 0: distinct tokens gained on common ones (scan); spearman > 0: frequency bias;"
        " snap_step: when the attention's rate of movement fell to half its peak"
    )
    print(f"report: {result.report.path.resolve()} ({time.perf_counter() - start:.1f} s)")
    return 0


# ------------------------------------------------------------------ stats
def _stats(args: argparse.Namespace) -> int:
    from scansnap_lens._io import check_writable
    from scansnap_lens.inputs.corpus import Corpus
    from scansnap_lens.statistics.context import Context
    from scansnap_lens.statistics.corpus import count_corpus

    check_writable(args.out)  # before the corpus is read
    corpus = Corpus.of(
        args.inputs,
        dataset=args.dataset,
        split=args.split,
        column=args.column,
        text_column=args.text_column,
        tokenizer=args.tokenizer,
        documents=args.documents,
        max_vocab=args.max_vocab,
        vocab_size=args.vocab_size,
    )
    if corpus.built_tokenizer:
        from scansnap_lens._io import write_text

        path = Path(args.out).with_suffix(".tokenizer.json")
        write_text(path, corpus.tokenizer.to_str())  # never through a link at that name
        print(f"word-level tokenizer ({corpus.vocab_size} words) saved to {path}")
    execute = None
    if args.ray is not None:
        from functools import partial

        from scansnap_lens.distributed import ray_cooccurrence

        execute = partial(ray_cooccurrence, address=args.ray or None)
    stats = count_corpus(
        corpus,
        Context(args.window, args.exclude_bos),
        queries=args.queries,
        min_count=args.min_count,
        execute=execute,
        shards=args.shards,
        progress=True,
    )
    if corpus.kind == "indexed" and args.vocab_size is None:
        print(
            f"vocabulary: {stats.vocab_size} (1 + the largest id; give --vocab-size for the"
            " model's)"
        )
    stats.save(args.out)
    print(
        f"{int(stats.events.sum())} events, {stats.num_classes} classes (m, n),"
        f" {stats.num_triples} co-occurrences over a vocabulary of {stats.vocab_size}"
    )
    print(f"statistics: {Path(args.out).resolve()}")
    return 0


# ------------------------------------------------------------------ record
SEQ_LEN = 64  # the rows record --text cuts, by default
MAX_ROWS = 64  # and how many: rows x checkpoints drive a recording's time
BUDGET = 40  # checkpoints record --steps auto records, by default


def _eval_tokens(args: argparse.Namespace):
    from scansnap_lens.inputs.text import text_rows
    from scansnap_lens.inputs.tokens import load_tokenizer, read_tokens

    if bool(args.tokens) == bool(args.text):
        raise ValueError("give the evaluation tokens with either --tokens FILE or --text FILE")
    if args.tokens:
        if args.seq_len is not None:
            raise ValueError(
                "--seq-len sets the row length of --text; a token file holds its rows already"
                " (cut them when you write it: scansnap tokens --seq-len)"
            )
        tokens = read_tokens(args.tokens)
        rows = MAX_ROWS if args.max_rows is None else args.max_rows or len(tokens)
        if rows < len(tokens):
            print(
                f"rows: the first {rows:,} of {len(tokens):,} in {args.tokens}"
                " (--max-rows N or all for more)",
                file=sys.stderr,
            )
        return tokens[:rows]
    spec = args.tokenizer or args.model
    if not spec:
        raise ValueError("--text needs --tokenizer (a tokenizer.json or a hub name)")
    tokenizer = load_tokenizer(spec)
    seq_len = SEQ_LEN if args.seq_len is None else args.seq_len
    rows = MAX_ROWS if args.max_rows is None else args.max_rows or None
    return text_rows(args.text, tokenizer, seq_len, args.documents, rows)


# ------------------------------------------------------------------ tokens
def _tokens(args: argparse.Namespace) -> int:
    from scansnap_lens._io import check_writable
    from scansnap_lens.inputs.text import text_rows
    from scansnap_lens.inputs.tokens import load_tokenizer, save_tokens

    check_writable(args.out)
    tokens = text_rows(
        args.text, load_tokenizer(args.tokenizer), args.seq_len, args.documents, args.max_rows
    )
    save_tokens(args.out, tokens)
    print(f"{tokens.shape[0]} rows of {tokens.shape[1]} tokens: {Path(args.out).resolve()}")
    return 0


def _record(args: argparse.Namespace) -> int:
    from scansnap_lens.models import checkpoints
    from scansnap_lens.recording.recorder import Recorder
    from scansnap_lens.recording.settings import RecordingSettings

    if bool(args.checkpoints) == bool(args.model):
        raise ValueError("give either --checkpoints DIR or --model NAME")
    if args.model:
        from scansnap_lens.recording.suite import expand

        models = expand(args.model if isinstance(args.model, list) else [args.model])
        if len(models) > 1:
            return _record_suite(args, models)
        args.model = models[0]
    if args.power is not None:  # every option checked before anything is loaded
        _check_power(args)
    tokens = _eval_tokens(args) if args.power is None else None  # --power chooses the rows
    auto = args.steps == "auto"
    steps = None if auto else args.steps
    if args.budget is not None and not auto:
        raise ValueError("--budget chooses how many checkpoints --steps auto records: give both")
    if args.checkpoints:
        source = checkpoints.folder(
            args.checkpoints,
            steps=steps,
            trust_pickle=args.trust_pickle,
            device=args.device,
            backend=args.backend,
        )
    else:
        source = checkpoints.pretrained(
            args.model, steps=steps, backend=args.backend, device=args.device
        )
    if len(source) == 0:
        raise ValueError(f"{source.name}: no checkpoint selected")
    stats = None
    if args.stats is not None:
        from scansnap_lens.statistics.corpus import CooccurrenceStats

        stats = CooccurrenceStats.load(args.stats)
    on_plan = None
    if args.power is not None:
        tokens = _rows_for_power(args, tokens, stats, source)
    if stats is not None:
        on_plan = _say_power(stats)
    # plans from the first checkpoint it loads (its vocabulary)
    settings = _settings(args, RecordingSettings)
    recorder = Recorder(args.out, tokens, settings, stats=stats, on_plan=on_plan)
    before = len(recorder.done)
    execute = None
    if args.ray is not None:
        from scansnap_lens.distributed import ray_execute

        execute = ray_execute(address=args.ray or None)
    if auto:
        from scansnap_lens.planning.placement import PLACEMENT_FILE, record_placed

        budget = BUDGET if args.budget is None else args.budget
        traj = record_placed(recorder, source, budget, execute=execute)
        print(
            f"--steps auto: {traj.num_steps} of {len(source)} checkpoints (budget {budget});"
            f" each step and why: {Path(args.out).resolve() / PLACEMENT_FILE}"
        )
    else:
        traj = recorder.record(source, execute=execute)
    print(
        f"{traj.num_steps} checkpoints recorded ({traj.num_steps - before} new,"
        f" {len(traj.skipped)} skipped), layers {traj.layers}, heads {traj.heads},"
        f" {traj.plan.num_queries} queries, {traj.plan.num_classes} classes"
    )
    print(f"trajectory: {Path(args.out).resolve()}")
    return 0


def _record_suite(args: argparse.Namespace, models: list[str]) -> int:
    """Each model into its own folder of the suite folder --out, one after the other."""
    from scansnap_lens.recording.suite import Suite

    if args.power is not None:
        raise ValueError(
            "--power chooses one run's rows: run it on one repository, then"
            " record the suite with its --max-rows (the same rows in every"
            " run)"
        )
    if args.steps == "auto":
        raise ValueError(
            "--steps auto places each run's own checkpoints: a suite records"
            " the same steps in every run (all, every k, log:N or a"
            " list)"
        )
    suite = Suite(args.out)
    runs = suite.start(models)
    print(
        f"a suite of {len(runs)} runs in {Path(args.out).resolve()}, one after the other,"
        " each its own sweep (the same command resumes each where it stopped)"
    )
    for k, (name, folder) in enumerate(runs, 1):
        print(f"[{k}/{len(runs)}] {name} -> {folder}")
        one = argparse.Namespace(**vars(args))
        one.model, one.out = name, folder
        _record(one)
    print(f"suite: {Path(args.out).resolve()} (scansnap report on it: the runs page)")
    return 0


def _groups_or_none(stats):
    from scansnap_lens.statistics.groups import TokenGroups

    try:
        return TokenGroups.from_statistics(stats)
    except ValueError:  # nothing classified distinct: no verdict to plan for
        return None


def _say_power(stats):
    """What the recorder calls with its plan: the scan verdict's planned power, said once."""

    def say(plan, heads: int) -> None:
        from scansnap_lens.planning.power import planned_mde

        groups = _groups_or_none(stats)  # the plan's own (made once)
        mde = math.nan if groups is None else planned_mde(plan, groups, heads)
        where = f"{plan.num_queries:,} queries, {heads} heads"
        if mde != mde:
            said = "no query has distinct and common tokens whose counts tell frequency apart"
        elif mde > 1:
            said = "not even an AUROC of 1 would be detected"
        else:
            said = f"it could see AUROC >= {mde:.3g}"
        print(
            f"power: the scan verdict on {where}: {said} (planned for a head whose spread is"
            " like the calibration lab's; --power AUROC chooses the rows)",
            file=sys.stderr,
        )

    return say


def _check_power(args: argparse.Namespace) -> None:
    """--power's own value and the options it needs, before any model or text is read."""
    if not 0.5 < args.power <= 1:
        raise ValueError(f"--power is the AUROC to detect, in (0.5, 1]; got {args.power:g}")
    if args.stats is None:
        raise ValueError("--power plans the rows from the statistics: give --stats too")
    if args.max_rows is not None:
        raise ValueError("--power chooses how many rows to record: give it without --max-rows")


def _watched_heads(args: argparse.Namespace, source) -> int:
    """How many heads the recording watches, from the first checkpoint: a hub revision's
    config.json alone (its weights are the sweep's to download, into its own cache), a
    local checkpoint loaded."""
    from types import SimpleNamespace

    from scansnap_lens.models import hub
    from scansnap_lens.recording.hooks import watched

    first = next(iter(source))
    if first.revision is not None:
        n_layers, n_heads = hub.model_shape(source.name, first.revision)
        model = SimpleNamespace(cfg=SimpleNamespace(n_layers=n_layers, n_heads=n_heads))
    else:
        model = first.load()
    layers, heads = watched(model, args.layers, args.heads)
    return len(layers) * len(heads)


def _rows_for_power(args: argparse.Namespace, tokens, stats, source):
    """The first rows of the evaluation text that give the scan verdict `args.power`."""
    from scansnap_lens.planning.power import rows_for_power

    groups = _groups_or_none(stats)
    if groups is None:
        raise ValueError(
            "--power: the statistics classify no token distinct, so there is no"
            " scan verdict to plan for (see scansnap stats, --min-count)"
        )
    args.max_rows = 0  # every row of the text, to choose from
    every = _eval_tokens(args)
    heads = _watched_heads(args, source)  # they set the correction over heads
    rows, mde, tried = rows_for_power(
        every, stats.vocab_size, groups, args.power, heads, context=stats.context
    )
    for r, m, df in tried:
        print(
            f"--power {args.power:g}: {r:,} rows -> AUROC >= {m:.3g} (its t reference's"
            f" degrees of freedom {df:.2g})",
            file=sys.stderr,
        )
    if mde <= args.power:
        print(
            f"--power {args.power:g}: recording the first {rows:,} of {len(every):,} rows",
            file=sys.stderr,
        )
    else:
        why = (
            "no plan holds pairs whose counts tell frequency apart"
            if mde != mde
            else f"the least is AUROC >= {mde:.3g} at {rows:,} rows; where more rows raise it, they"
            " gather the figure on a few distinct tokens shared by many queries, whose"
            " spread one text cannot tell (the degrees of freedom fall)"
        )
        print(
            f"--power {args.power:g}: not reached with any of the first rows of the"
            f" {len(every):,} ({why}): more evaluation text would; recording the first"
            f" {rows:,}",
            file=sys.stderr,
        )
    return every[:rows]


# ------------------------------------------------------------------ report
def _report(args: argparse.Namespace) -> int:
    from scansnap_lens._io import check_writable
    from scansnap_lens.measures.settings import AnalysisSettings
    from scansnap_lens.models.training import Rates
    from scansnap_lens.reading.analysis import Analysis
    from scansnap_lens.recording.trajectory import Trajectory
    from scansnap_lens.report import write_report
    from scansnap_lens.statistics.corpus import CooccurrenceStats
    from scansnap_lens.statistics.groups import Classification, check_vocabulary

    if (args.lr_y is None) != (args.lr_z is None):
        raise ValueError("--lr-y and --lr-z go together: give both or neither")
    from scansnap_lens.recording.suite import Suite

    given = []
    for path in args.trajectory:  # a suite folder: its recorded runs
        if Suite.holds(path):
            recorded = Suite(path).recorded()
            if not recorded:
                raise ValueError(f"{path}: no run of the suite is recorded yet")
            given += list(recorded.values())
            if args.out is None and len(args.trajectory) == 1:
                args.out = Path(path) / "report"
        else:
            given.append(Path(path))
    args.trajectory = given
    runs = [Path(p).resolve() if Path(p).is_symlink() else Path(p) for p in args.trajectory]
    seen: dict[Path, str] = {}
    for given, path in zip(args.trajectory, runs):
        if path.resolve() in seen:
            raise ValueError(
                f"{seen[path.resolve()]} and {given} are the same run ({path.resolve()}): give"
                " each run once"
            )
        seen[path.resolve()] = str(given)
    if len(args.stats) not in (1, len(runs)):
        raise ValueError(
            f"give one --stats for every run, or one for each of the {len(runs)} runs"
            f" (got {len(args.stats)})"
        )
    if len(runs) > 1 and args.out is None:
        raise ValueError("several runs need --out, the folder of their comparison")
    if len(runs) == 1 and args.design is not None:
        raise ValueError("--design says which of several runs share what: give several runs")
    out = args.out or Path(runs[0]) / "report"
    check_writable(out)
    trajs = {name: Trajectory.load(path) for name, path in zip(_run_names(runs), runs)}
    stats_of = [CooccurrenceStats.load(p) for p in args.stats]
    training = _settings(args, Rates) if args.lr_y is not None else None
    settings = _settings(args, AnalysisSettings).replace(
        classification=_settings(args, Classification), training=training
    )
    for i, traj in enumerate(trajs.values()):  # before anything is measured
        check_vocabulary(stats_of[i if len(stats_of) > 1 else 0].vocab_size, traj.plan)
    analyses = {}
    for i, (name, path) in enumerate(zip(trajs, runs)):
        stats = stats_of[i if len(stats_of) > 1 else 0]
        analysis = Analysis.of(
            trajs[name], source=stats, settings=settings, cache=path / "analysis"
        )
        if analysis.reused:
            print(f"{name}: the analysis saved in {path / 'analysis'} (same inputs and settings)")
        elif analysis.remeasured:
            print(f"{name}: {analysis.remeasured}")
        analyses[name] = analysis
    if len(trajs) > 1:
        return _report_runs(args, analyses, out)
    analysis = next(iter(analyses.values()))
    report = write_report(analysis, out, title=args.title)
    _print_summary(analysis)
    for what, reason in report.not_measured.items():
        print(f"not measured: {what}: {cli_text(reason)}")
    print(f"report: {report.path.resolve()}")
    return 0


def _run_names(paths: list[Path]) -> list[str]:
    """Each run's name: its folder's name, or the folder above where those repeat
    (seed0/trajectory, seed1/trajectory), or the whole path."""
    for names in ([Path(p).name for p in paths], [Path(p).resolve().parent.name for p in paths]):
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


def _report_runs(args, analyses, out) -> int:
    from scansnap_lens.reading.findings import runs_findings_of
    from scansnap_lens.reading.runs import measure_runs
    from scansnap_lens.report import number, write_runs_report

    design = None
    if args.design is not None:
        import pandas as pd

        try:
            design = pd.read_csv(args.design, dtype=str, keep_default_na=False, na_values=[""])
        except (OSError, ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"--design {args.design}: cannot read it as a CSV ({err})") from None
    comparison = measure_runs(analyses, design=design)
    report = write_runs_report(comparison, out, title=args.title)
    table = comparison.table
    shown = [
        "layer",
        "head",
        "scans_runs",
        "bias_mean",
        "bias_lo",
        "bias_hi",
        "bias_within",
        "auroc_mean",
        "auroc_lo",
        "auroc_hi",
        "auroc_within",
        "snap_step_mean",
    ]
    print(f"{len(comparison.runs)} runs: {', '.join(comparison.runs)}")
    if comparison.layers is not None:
        layers = comparison.layers
        print("per layer, mean over runs (with the interval over runs on the page):")
        print(
            layers[["layer", *[c for c in layers if c.endswith("_mean")]]].to_string(
                index=False, float_format=number
            )
        )
    matched = "by index" if comparison.matching is None else "by their attention"
    print(f"per head (matched {matched}):")
    print(table[[c for c in shown if c in table]].to_string(index=False, float_format=number))
    print("across the runs:")
    for line in runs_findings_of(comparison):
        print(f"  {cli_text(line)}")
    for name, analysis in analyses.items():
        if "token groups" in analysis.not_measured:
            reason = analysis.not_measured["token groups"]
            print(f"not measured in {name}: token groups: {cli_text(reason)}")
    for what, reason in report.not_measured.items():
        print(f"not drawn: {what}: {cli_text(reason)}")
    print(f"report: {report.path.resolve()}")
    return 0


# ------------------------------------------------------------------ theory
def _theory(args: argparse.Namespace) -> int:
    from scansnap_lens.theory.transition import PhaseTransition

    theory = PhaseTransition(args.K, args.M, args.lr_y, args.lr_z, args.rho0)
    print(f"K={args.K} M={args.M} eta_Y={args.lr_y:g} eta_Z={args.lr_z:g}")
    print(f"scanning ends   t0'  = K ln M / eta_Y           = {theory.t0_prime:.2f}")
    print(
        f"snap            t0   = 2(1+delta') K ln M / eta_Y = {theory.t0:.2f}"
        f" (delta'={theory.delta:.4f})"
    )
    import numpy as np

    t = np.unique(np.concatenate([np.logspace(0, np.log10(args.t_max), args.points), [theory.t0]]))
    frame = theory.to_dataframe(t)
    if args.csv:
        from scansnap_lens._io import make_folder, write_text

        make_folder(Path(args.csv).parent)
        write_text(args.csv, frame.to_csv(index=False))
        print(f"B_n(t) curve written to {args.csv}")
    else:
        print(
            frame[["t", "B", "B_integral", "xi", "chi_upper"]].to_string(
                index=False, float_format="%.4g"
            )
        )
    return 0


# ------------------------------------------------------------------ parser
_ints, _count, _count_or_all = _readers.ints, _readers.count, _readers.count_or_all
_positive_float = _readers.positive


def _steps(text: str):
    if text in ("all", "auto"):
        return text
    if text.startswith("log:"):
        if not text[4:].isdigit() or int(text[4:]) < 2:
            raise argparse.ArgumentTypeError(f"log:N needs an integer N >= 2, got {text!r}")
        return text
    values = _ints(text)
    return values[0] if len(values) == 1 and "," not in text else values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scansnap",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _demo_command(sub)
    _stats_command(sub)
    _tokens_command(sub)
    _record_command(sub)
    _report_command(sub)
    _theory_command(sub)
    return parser


def _documents_option(command) -> None:
    from scansnap_lens.inputs.text import DOCUMENT_SPLITS

    command.add_argument(
        "--documents",
        choices=DOCUMENT_SPLITS,
        default="paragraph",
        help="how a text file splits into documents, which co-occurrences and rows never"
        " cross: paragraph (blank lines; default), wikitext (articles), line, or document (the"
        " file)",
    )


def _demo_command(sub) -> None:
    demo = sub.add_parser(
        "demo",
        help="train a small transformer, record, measure and report scan and snap",
        description="The main job on an embedded default (15 to 30 s on 2 cores): a 1-layer"
        " attention-only HookedTransformer without positions trained on synthetic sequence"
        " classes, recorded at log-spaced checkpoints, token kinds from the training corpus,"
        " measurements and a self-contained HTML report.",
    )
    demo.add_argument(
        "--out", type=Path, default=Path("demo_out"), help="output folder (default: %(default)s)"
    )
    demo.add_argument(
        "--data",
        choices=["syn-medium", "syn-small"],
        default="syn-medium",
        help="Syn-Medium (1 query, 2 next tokens; default) or Syn-Small (each query its own"
        " next token: the residual stream solves it and attention barely moves)",
    )
    demo.add_argument(
        "--num-steps", type=_count(1, 10**7), default=250, help="training steps (default 250)"
    )
    demo.add_argument(
        "--overwrite", action="store_true", help="replace a demo of other settings in --out"
    )
    demo.add_argument(
        "--seed", type=int, default=0, help="seed of the model and data (default: %(default)s)"
    )
    demo.set_defaults(func=_demo)


def _stats_command(sub) -> None:
    stats = sub.add_parser(
        "stats",
        help="co-occurrence statistics of a corpus (text, token files or a datasets dataset)",
        description="Count events (m, n) and co-occurrences C(m, n, l) of a corpus and save"
        " them (safetensors). Text files are split into documents (--documents) and tokenised"
        " with --tokenizer, or by a word-level tokenizer built from them (saved beside --out).",
    )
    stats.add_argument(
        "inputs",
        nargs="*",
        help=".txt files, token files (.safetensors/.npy/.pt), or indexed datasets (Pythia's"
        " .bin + .idx: their documents, read lazily)",
    )
    stats.add_argument("--out", type=Path, required=True, help="statistics file (.safetensors)")
    stats.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="count in Ray tasks: a local instance, or the cluster at ADDRESS (pip install"
        " 'scansnap-lens[ray]')",
    )
    stats.add_argument(
        "--shards", type=_count(1, 100_000), default=8, help="Ray tasks (default: %(default)s)"
    )
    stats.add_argument(
        "--dataset", help="a datasets dataset: a name, or a folder from save_to_disk"
    )
    stats.add_argument("--split", default="train", help="dataset split (default train)")
    stats.add_argument(
        "--column", default="input_ids", help="dataset column of token ids (default: %(default)s)"
    )
    stats.add_argument("--text-column", help="dataset column of text (needs --tokenizer)")
    stats.add_argument("--tokenizer", help="tokenizer.json or a Hugging Face tokenizer name")
    stats.add_argument("--max-vocab", type=int, help="size of the word-level tokenizer built")
    _documents_option(stats)
    stats.add_argument(
        "--vocab-size", type=_count(1, 2**31 - 1), help="vocabulary size of token ids"
    )
    stats.add_argument("--window", type=_count(1), help="most context positions before the query")
    stats.add_argument(
        "--exclude-bos",
        action="store_true",
        help="keep position 0 out of context (a BOS token; record with the same flag)",
    )
    stats.add_argument("--queries", type=_ints, help="count only these query ids (a,b,c)")
    stats.add_argument(
        "--min-count",
        type=_count(1),
        default=1,
        help="prune rarer co-occurrences (default: %(default)s)",
    )
    stats.set_defaults(func=_stats)


def _tokens_command(sub) -> None:
    tokens = sub.add_parser(
        "tokens",
        help="write an evaluation token file [rows, positions] from a text file",
        description="Encode a text file's documents with a tokenizer and cut them into rows of"
        " --seq-len tokens (what record --text does), saved as a token file for record --tokens.",
    )
    tokens.add_argument("text", type=Path, help="a text file")
    tokens.add_argument("--tokenizer", required=True, help="tokenizer.json or a hub name")
    tokens.add_argument("--out", type=Path, required=True, help="token file (.safetensors)")
    tokens.add_argument(
        "--seq-len", type=_count(2, 1 << 20), default=64, help="row length (default: %(default)s)"
    )
    tokens.add_argument("--max-rows", type=_count(1), help="keep only the first rows")
    _documents_option(tokens)
    tokens.set_defaults(func=_tokens)


def _record_command(sub) -> None:
    record = sub.add_parser(
        "record",
        help="record attention over a model's checkpoints into a trajectory (resumable)",
        description="Record zbar, c_hat and attention entropy of every selected checkpoint on"
        " the evaluation tokens. Checkpoints come from a folder (step_*.safetensors, *.pt, with"
        " config.json) or TransformerLens checkpoint labels (--model, e.g."
        " EleutherAI/pythia-14m). Run the same command again to resume.",
    )
    record.add_argument(
        "--checkpoints",
        type=Path,
        help="folder of checkpoints, recognised from its layout: a Hugging Face Trainer's"
        " output (checkpoint-N/ folders with trainer_state.json, whose rates and schedule the"
        " trajectory keeps), TransformerLens state dicts (step_N.safetensors, model_N.pt)"
        " with a config.json, or nanoGPT's ckpt.pt",
    )
    record.add_argument(
        "--model",
        nargs="+",
        help="a TransformerLens model name with checkpoint labels; several, or a pattern"
        " ('EleutherAI/pythia-70m-seed{1..9}', quoted): a suite, each run into its own"
        " folder of --out, which scansnap report compares",
    )
    record.add_argument(
        "--backend",
        choices=["hooked", "bridge"],
        help="HookedTransformer (transformer-lens 3.x) or TransformerBridge; default: hooked"
        " on 3.x, bridge on 4.x",
    )
    record.add_argument(
        "--steps",
        type=_steps,
        default="all",
        help="all, every k-th (k), log:N, a,b,c (a single step: 'a,'), or auto: a coarse pass,"
        " then the checkpoints that place each head's snap and formation steps within 10 %%,"
        " --budget in all (default: %(default)s)",
    )
    record.add_argument(
        "--budget",
        type=_count(2, 10**6),
        help=f"checkpoints --steps auto records at most (default {BUDGET})",
    )
    record.add_argument("--tokens", type=Path, help="evaluation token file [rows, positions]")
    record.add_argument("--text", type=Path, help="evaluation text file (with --tokenizer)")
    _documents_option(record)
    record.add_argument(
        "--seq-len", type=_count(2, 1 << 20), help=f"row length for --text (default {SEQ_LEN})"
    )
    record.add_argument(
        "--max-rows",
        type=_count_or_all(1),
        help=f"use only the first rows, or all (default: {MAX_ROWS}, of --text or --tokens);"
        " rows x checkpoints drive the recording's time, which it estimates after one batch",
    )
    record.add_argument("--out", type=Path, required=True, help="trajectory folder")
    record.add_argument(
        "--power",
        type=float,
        metavar="AUROC",
        help="choose the evaluation rows (the first 64, 128, ... of --text or --tokens) that let"
        " the scan verdict detect this AUROC (with --stats; it says what each would give)",
    )
    record.add_argument(
        "--stats",
        type=Path,
        help="statistics (scansnap stats) that choose the default queries: those whose classes"
        " have distinct tokens, most frequent first",
    )
    from scansnap_lens.recording.settings import RecordingSettings

    _setting_options(record, RecordingSettings)
    record.add_argument(
        "--trust-pickle", action="store_true", help="allow pickled .pt files (trusted only)"
    )
    record.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="one Ray task per checkpoint (a GPU each where there are GPUs), all writing into"
        " --out: a local instance, or the cluster at ADDRESS (its workers must see --out)",
    )
    record.set_defaults(func=_record)


def _report_command(sub) -> None:
    report = sub.add_parser(
        "report",
        help="measure a trajectory (or several runs) against corpus statistics and write an"
        " HTML report",
        description="Classify context tokens from the statistics, measure scan and snap, and"
        " write report.html (offline, self-contained), summary.json, CSVs and PNG figures."
        " Several trajectories (runs of one recipe: seeds, deduped or not, two rates) are"
        " compared head by head in runs.html: each run's verdict, and bias, AUROC and snap"
        " step with an interval over runs beside the within-run one.",
    )
    report.add_argument(
        "trajectory",
        type=Path,
        nargs="+",
        help="trajectory folder (scansnap record); several: runs of one plan, compared",
    )
    report.add_argument(
        "--stats",
        type=Path,
        nargs="+",
        required=True,
        help="statistics (scansnap stats): one for all runs, or one per run",
    )
    report.add_argument(
        "--out",
        type=Path,
        help="report folder (default TRAJECTORY/report; several runs need it)",
    )
    report.add_argument("--title", help="the page's title (default: the trajectory's source)")
    report.add_argument(
        "--design",
        type=Path,
        metavar="CSV",
        help="several runs: which share initial weights and data order, a CSV with columns"
        " run, init, data (run: the run's folder name; default: the seeds the recordings"
        " kept, or PolyPythias' names)",
    )
    from scansnap_lens.measures.settings import AnalysisSettings
    from scansnap_lens.models.training import Rates
    from scansnap_lens.statistics.groups import Classification

    _setting_options(report, AnalysisSettings, Classification, Rates)
    report.set_defaults(func=_report)


def _theory_command(sub) -> None:
    theory = sub.add_parser("theory", help="predicted transition times and the B_n(t) curve")
    theory.add_argument("--K", type=_count(1, 10**6), required=True, help="number of next tokens")
    theory.add_argument("--M", type=_count(3, 10**9), required=True, help="vocabulary size")
    theory.add_argument("--lr-y", type=_positive_float, required=True, help="decoder rate eta_Y")
    theory.add_argument("--lr-z", type=_positive_float, required=True, help="attention rate eta_Z")
    theory.add_argument(
        "--rho0",
        type=_positive_float,
        default=1.0,
        help="normalisation constant rho_0 (default: %(default)s)",
    )
    theory.add_argument(
        "--t-max",
        type=_positive_float,
        default=1e5,
        help="last time of the curve (default: %(default)s)",
    )
    theory.add_argument(
        "--points",
        type=_count(2, 100_000),
        default=25,
        help="points of the curve (default: %(default)s)",
    )
    theory.add_argument("--csv", type=Path, help="write the curve to this CSV instead")
    theory.set_defaults(func=_theory)


def _setting_options(parser: argparse.ArgumentParser, *settings: type) -> None:
    """One option per field of each settings value the command line sets (`_settings.options`),
    grouped and explained as the value's fields are."""
    from scansnap_lens._settings import options

    every = [o for cls in settings for o in options(cls)]
    kinds = {True: "storefalse", False: "storetrue"}
    flags = {o["name"]: (o["flag"], kinds.get(o["default"], "store")) for o in every}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in every:
        title = flag_text(option["group"], help=True, flags=flags)
        group = groups.get(title) or parser.add_argument_group(title)
        groups[title] = group
        help_text, default = flag_text(option["help"], help=True, flags=flags), option["default"]
        kwargs = {"dest": option["name"], "help": help_text}
        if isinstance(default, bool):
            kwargs["action"] = f"store_{str(not default).lower()}"
        else:
            if option["choices"] is None:
                kwargs["metavar"] = option["flag"][2:].upper().replace("-", "_")
            kwargs["type"] = option["reads"]
            kwargs["choices"] = option["choices"]
            scale = option["scale"]
            kwargs["default"] = default / scale if scale != 1 and default is not None else default
            if default is not None:
                kwargs["help"] += (
                    " (default: %(default)g)" if option["scale"] != 1 else " (default: %(default)s)"
                )
        group.add_argument(option["flag"], **kwargs)


def _settings(args: argparse.Namespace, cls: type):
    """The settings value `cls` its options give (`_setting_options`)."""
    from scansnap_lens._settings import options

    values = {}
    for option in options(cls):
        value = getattr(args, option["name"])
        if value is not None and option["scale"] != 1:
            value = int(value * option["scale"])
        values[option["name"]] = value
    return cls(**values)


@functools.cache
def _flags() -> dict[str, tuple[str, str]]:
    """{field: (flag, how it is given)} of every option of every command: what a library
    message's ``name=`` is on the command line."""
    out = {}
    commands = build_parser()._subparsers._group_actions[0].choices.values()
    for action in (a for command in commands for a in command._actions):
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in ("help",) and action.dest not in out:
            kind = type(action).__name__.removeprefix("_").removesuffix("Action").lower()
            out[action.dest] = (longs[0], kind)
    return out


def flag_text(message: str, help: bool = False, flags: dict | None = None) -> str:
    """A library message with the command line's flag beside each field it names as
    ``name=`` or ``name=value`` (``on_disk=`` becomes ``on_disk=, --on-disk``,
    ``duplicates='skip'`` becomes ``duplicates='skip', --duplicates skip`` and
    ``guard=False`` ``guard=False, --no-guard``; in help, the flag alone); an unquoted value
    (``K=40``) is words, not an option; a flag the message names already is not added again.
    flags: {field: (flag, how it is given)} (default: every command's, `_flags`)."""
    flags = _flags() if flags is None else flags

    def spelled(match):
        name, value = match.group(1), match.group(3)
        flag, kind = flags[name]
        switch = (value == "True" and kind == "storetrue") or (
            value == "False" and kind == "storefalse"
        )
        if value and not switch and not match.group(2):  # K=40: a value in words, not an option
            return match.group(0)
        on_line = flag if value == "" or switch else f"{flag} {value}"
        if match.string[match.end() :].lstrip(", ").startswith(flag):
            return match.group(0)
        return on_line if help else f"{match.group(0)}, {on_line}"

    names = "|".join(sorted(flags, key=len, reverse=True))
    return re.sub(rf"\b({names})=(['\"]?)([^\s,)'\"]*?)\2(?=[,)\s.:;]|$)", spelled, message)


def cli_message(exc: BaseException) -> str:
    """An exception's message as the command line prints it (see `cli_text`)."""
    return cli_text(str(exc.args[0] if isinstance(exc, KeyError) and exc.args else exc))


def cli_text(message: str) -> str:
    """A library message as the command line prints it: with the flags of the settings it
    names (`flag_text`), without terminal escapes."""
    return flag_text(re.sub(r"\x1b\[[0-9;]*m", "", message))


class _Interrupts:
    """Whether Ctrl-C was pressed: an interrupt that lands inside a C extension's import
    surfaces as that import's error (matplotlib's "initialization failed"), not as
    KeyboardInterrupt, and must still read as an interrupt."""

    seen = False
    # torch's import calls back into Python from C++ (pybind11): an exception raised there
    # aborts the process (SIGABRT), so while it loads, Ctrl-C is noted and raised after
    deferred = False

    @classmethod
    def handler(cls, signum, frame):
        cls.seen = True
        if not cls.deferred:
            raise KeyboardInterrupt

    @classmethod
    def load_libraries(cls) -> None:
        """Import torch with Ctrl-C held until it is in (then raised)."""
        cls.deferred = True
        try:
            import torch  # noqa: F401
        finally:
            cls.deferred = False
        if cls.seen:
            raise KeyboardInterrupt


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A library's warning as the command line says it: one line, its flags, no source."""
    print(f"scansnap: warning: {cli_text(str(message))}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    taken: dict[int, object] = {}  # the signals this command handles: what they were before
    try:  # from the first line: Ctrl-C at any moment of the command is an interrupt
        if threading.current_thread() is threading.main_thread():
            _Interrupts.seen = False
            # Ctrl-C where it would raise KeyboardInterrupt (a background job's is ignored, and
            # stays so); SIGTERM (timeout, a scheduler, systemctl stop, kill) where it would end
            # the process: it ends the command as Ctrl-C does, what is half written removed,
            # what is recorded kept
            for sig, usual in (
                (signal.SIGINT, signal.default_int_handler),
                (signal.SIGTERM, signal.SIG_DFL),
            ):
                if signal.getsignal(sig) == usual:
                    taken[sig] = signal.signal(sig, _Interrupts.handler)
        with warnings.catch_warnings():
            # said as the command line says things, unless someone records them (pytest)
            if getattr(warnings._showwarnmsg_impl, "__module__", None) == "warnings":
                warnings.showwarning = _show_warning
                # each of ours said every time (two corrupt files: two lines, not one)
                warnings.filterwarnings("always", category=UserWarning, module=r"scansnap_lens\.")
            return _main(argv)
    except KeyboardInterrupt:  # before a command ran (while the libraries load)
        print("scansnap: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (scansnap theory ... | head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception:
        if not _Interrupts.seen:
            raise
        print("scansnap: interrupted", file=sys.stderr)  # whatever error Ctrl-C left behind
        return 130
    finally:
        for sig, before in taken.items():
            signal.signal(sig, before)


def _main(argv: list[str] | None) -> int:
    _Interrupts.load_libraries()
    args = build_parser().parse_args(argv)
    from scansnap_lens.models.backend import BackendError
    from scansnap_lens.models.formats import CheckpointError

    try:
        return args.func(args)
    except BrokenPipeError:
        raise
    except (
        ValueError,
        FileNotFoundError,
        KeyError,
        CheckpointError,
        BackendError,
        ImportError,
        OSError,
    ) as exc:
        if _Interrupts.seen:  # the error an interrupt left behind, not bad input
            raise KeyboardInterrupt from exc
        print(f"scansnap {args.command}: error: {cli_message(exc)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(
            f"scansnap {args.command}: error: not enough memory for this input (a very large"
            " --vocab-size, token ids or corpus?); nothing beyond what was recorded is kept",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        left = _AFTER_INTERRUPT.get(args.command, "")
        print(f"scansnap {args.command}: interrupted; {left}".rstrip("; "), file=sys.stderr)
        return 130


# what an interrupted command leaves, said when it is interrupted
_AFTER_INTERRUPT = {
    "record": "what was recorded is kept (run again to resume)",
    "report": "the report folder is as it was (nothing of this run moved in)",
}


if __name__ == "__main__":
    sys.exit(main())
