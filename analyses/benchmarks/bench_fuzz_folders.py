"""The folder fuzz test (tests/test_fuzz_folders.py) in its longer mode: many crafted
recording, analysis, stage and sweep folders, each read as the commands read them.

    python analyses/benchmarks/bench_fuzz_folders.py                 # 2,000 folders, minutes
    python analyses/benchmarks/bench_fuzz_folders.py --examples 20   # the CI's size is 25

One JSON line: the folders crafted, the seconds, and whether every one held (only errors the
command line says, no hang, the user's folder beside them unchanged).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="3 folders: it runs, no goal")
    args = parser.parse_args()
    examples = 3 if args.quick else args.examples
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
         str(ROOT / "tests" / "test_fuzz_folders.py")],
        cwd=ROOT, env={**os.environ, "SCANSNAP_FUZZ_EXAMPLES": str(examples)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        print(done.stdout[-4000:], done.stderr[-2000:], file=sys.stderr)
    print(json.dumps({"bench": "fuzz_folders", "examples": examples,
                      "seconds": round(time.perf_counter() - start, 1),
                      "held": done.returncode == 0}))  # fmt: skip
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
