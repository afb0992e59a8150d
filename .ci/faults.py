"""Deliberate faults the test suite must catch: a check of the suite itself.

    python .ci/faults.py [--rev HEAD] [--python .venv/bin/python] [--only NAME ...]

Each fault is one small change to the library (a bug someone could write: a guard dropped,
a sign, a bound, an escape).  The revision's tracked files are exported to a scratch folder
(the working tree is never touched, ``../shared`` is linked beside it); there the named test
files run once as they are (they must pass), then once per fault with the fault applied
(they must fail: ``pytest -x``, stopping at the first failing test).  One JSON line per
fault: whether the suite caught it, the test that did and the seconds; the last line the
count.  Exit 1 where a fault went uncaught.  Run it on the old and the new revision to show
that a change of the suite lost nothing it caught (docs/contributing.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# name: (file, what it says, what the fault makes it say, the test files that must catch it)
FAULTS = {
    "recording: the eager path's logits halved": (
        "scansnap_lens/recording/hooks.py",
        "zbar=self.at_heads(scores, self.batch.zbar_flat)",
        "zbar=0.5 * self.at_heads(scores, self.batch.zbar_flat)",
        ["tests/recording/test_hooks.py", "tests/recording/test_fused.py"],
    ),
    "recording: the fused path's weights not normalised by their row": (
        "scansnap_lens/recording/hooks.py",
        "s.sub_(self.at_heads(where.row_lse(lse), where.plan_row))",
        "s.sub_(0.0)",
        ["tests/recording/test_fused.py"],
    ),
    "statistics: the context window one token short": (
        "scansnap_lens/statistics/_counting.py",
        "first = lo if window <= 0 else max(lo, t - window)",
        "first = lo if window <= 0 else max(lo, t - window + 1)",
        ["tests/statistics/test_corpus.py"],
    ),
    "kinds: distinct at half the purity asked": (
        "scansnap_lens/statistics/kinds.py",
        "share >= purity - 1e-12",
        "share >= purity / 2",
        ["tests/statistics/test_kinds.py"],
    ),
    "verdict: matched within 4x the frequency, not sqrt(2)": (
        "scansnap_lens/measures/discriminative.py",
        "MATCH_RATIO = 2**0.5",
        "MATCH_RATIO = 4.0",
        ["tests/measures/test_uncertainty.py"],
    ),
    "verdict: one frequency control passed is enough": (
        "scansnap_lens/measures/uncertainty.py",
        "elif len(passed) == len(controls):",
        "elif passed:",
        ["tests/measures/test_uncertainty.py"],
    ),
    "verdict: the frequency bias's sign reversed (rarer tokens gaining more is the signature)": (
        "scansnap_lens/measures/frequency.py",
        "z = mean * total.sqrt()",
        "z = -mean * total.sqrt()",
        ["tests/measures/test_uncertainty.py"],
    ),
    "verdict: no correction over the heads (Holm dropped)": (
        "scansnap_lens/measures/resampling.py",
        "adjusted = torch.cummax(values * (m - rank + 1), 0).values",
        "adjusted = values",
        ["tests/measures/test_uncertainty.py"],
    ),
    "intervals: no CR2 leverage correction": (
        "scansnap_lens/measures/resampling.py",
        "room = (1 - leverage.double()).clamp_min(1e-12)",
        "room = torch.ones_like(leverage.double())",
        ["tests/measures/test_uncertainty.py"],
    ),
    "snap: a fall before the peak counts as the snap": (
        "scansnap_lens/measures/snap.py",
        "crossed = after & (r <= level[:, None])",
        "crossed = r <= level[:, None]",
        ["tests/measures/test_snap.py"],
    ),
    "report: token strings shown as HTML in the views": (
        "scansnap_lens/viz/views.py",
        'return token.replace("&", "&" + JOINER).replace("<", "<" + JOINER)',
        "return token",
        ["tests/test_report.py"],
    ),
    "report: the page's title not escaped": (
        "scansnap_lens/report.py",
        'body = [\n        f"<h1>{html.escape(title)}</h1>",\n        _findings("Findings"',
        'body = [\n        f"<h1>{title}</h1>",\n        _findings("Findings"',
        ["tests/test_report.py"],
    ),
    "sweep: its folders removed with what the user put in them": (
        "scansnap_lens/recording/sweep.py",
        "                        path.rmdir()",
        "                        shutil.rmtree(path)",
        ["tests/recording/test_sweep.py"],
    ),
    "writes: the one writer follows a planted link": (
        "scansnap_lens/_io.py",
        "    refuse_link(path)\n    if path.is_dir():",
        "    if path.is_dir():",
        ["tests/test_safe_writes.py"],
    ),
    "resume: steps already recorded are recorded again": (
        "scansnap_lens/recording/recorder.py",
        "todo = [c for c in source if c.step not in self.done]",
        "todo = list(source)",
        ["tests/recording/test_recorder.py", "tests/test_user_run.py"],
    ),
}


def export(rev: str, into: Path) -> Path:
    """The revision's tracked files in `into`/p, with ../shared linked beside them."""
    tree = into / "p"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (into / "shared").symlink_to(shared, target_is_directory=True)
    return tree


def _as_from_a_terminal() -> None:
    """Ctrl-C at its default, as a terminal gives it (run in the background, this script and
    its children would ignore it, and the command line's interrupt tests test nothing)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_tests(python: str, tree: Path, tests: list[str]) -> tuple[int, str, float]:
    """pytest -x on `tests` in `tree` (its package first on the path, in subprocesses too):
    (exit code, the first failing test, seconds)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    done = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                           *tests], cwd=tree, env=env, capture_output=True, text=True,
                          preexec_fn=_as_from_a_terminal)  # fmt: skip
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.M)
    (tree.parent / "last.log").write_text(done.stdout + done.stderr)
    return done.returncode, failed[0] if failed else "", time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the revision to check (default HEAD)")
    parser.add_argument("--python", default=sys.executable, help="the environment's python")
    parser.add_argument("--only", nargs="*", help="faults whose name holds one of these")
    parser.add_argument("--tests", nargs="*", help="these test files (or ids) for every fault")
    args = parser.parse_args()
    python = os.path.abspath(args.python)  # the tests run in the exported tree, not here
    faults = {n: f for n, f in FAULTS.items() if not args.only or any(o in n for o in args.only)}
    if args.tests:
        faults = {n: (*f[:3], args.tests) for n, f in faults.items()}
    caught = 0
    with tempfile.TemporaryDirectory(prefix="faults_") as scratch:
        tree = export(args.rev, Path(scratch))
        for tests in sorted({tuple(f[3]) for f in faults.values()}):
            code, failed, seconds = run_tests(python, tree, list(tests))
            if code != 0:  # once more: a test that fails now and then is named, not fatal
                print(json.dumps({"flaky": failed}), flush=True)
                code, failed, seconds = run_tests(python, tree, list(tests))
            if code != 0:
                print((tree.parent / "last.log").read_text()[-3000:], file=sys.stderr)
                sys.exit(f"{' '.join(tests)} fails without a fault ({failed}): fix that first")
        for name, (file, good, bad, tests) in faults.items():
            path = tree / file
            text = path.read_text()
            if text.count(good) != 1:
                sys.exit(f"fault {name!r} does not apply: {file} holds {good!r}"
                         f" {text.count(good)} times")  # fmt: skip
            path.write_text(text.replace(good, bad))
            try:
                code, failed, seconds = run_tests(python, tree, tests)
            finally:
                path.write_text(text)
            caught += code == 1
            print(json.dumps({"fault": name, "caught": code == 1, "by": failed,
                              "exit": code, "s": round(seconds, 1)}), flush=True)  # fmt: skip
    print(json.dumps({"rev": args.rev, "faults": len(faults), "caught": caught}))
    return 0 if caught == len(faults) else 1


if __name__ == "__main__":
    sys.exit(main())
