"""The analysis scripts' quick modes run end to end and write what their docstrings promise."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

# `pytest -m "not slow"` leaves these out; both TransformerLens majors run them (`-m tl`)
pytestmark = [pytest.mark.slow, pytest.mark.tl]

REPO = Path(__file__).resolve().parents[1]


def test_wikitext_authors_setup_quick(shared_dir, tmp_path):
    """`--quick` of the authors' WikiText setting: every figure and table, entropies that start
    at the uniform map's (the tutorial's initial attention is near uniform over each row), and
    both class variants measured."""
    out = tmp_path / "authors"
    script = REPO / "analyses" / "wikitext_authors_setup.py"
    cmd = [sys.executable, str(script), "--quick", "--out", str(out), "--shared", str(shared_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ["1layer", "3layer"]:
        for file in [f"fig7_{name}.png", f"fig7_{name}.html", f"entropy_{name}.png"]:
            assert (out / file).stat().st_size > 0, file
        assert (out / "reports" / name / "report.html").is_file()
    for file in ["fig10.png", "fig11.png", "fig12.png", "fig10.csv", "fig11.csv", "fig12.csv"]:
        assert (out / file).stat().st_size > 0, file

    runs = pd.read_csv(out / "runs.csv").set_index("run")
    assert list(runs.index) == ["1layer", "3layer"]
    # rows of 35 positions: a uniform row T over T + 1 positions has entropy ln(T + 1)
    uniform = sum(math.log(t + 1) for t in range(35)) / 35
    assert (runs["entropy@0"] <= uniform + 1e-9).all() and (runs["entropy@0"] > uniform - 0.1).all()
    for column in ["bias_paper", "auroc_paper", "bias_guarded", "auroc_guarded", "final_loss"]:
        assert runs[column].notna().all(), column
    assert (runs["predicted_snap"] > 0).all()

    sure = pd.read_csv(out / "uncertainty.csv")  # every head of both runs, both class variants
    assert len(sure) == 2 * (1 + 3) and set(sure["classes"]) == {"paper", "guarded"}
    p, too_few = sure["bias_p"], sure["verdict"].str.startswith("too few units")
    assert (p.between(0, 1) | (p.isna() & too_few)).all() and sure["scans"].dtype == bool
    assert (sure["heads"] == sure["run"].map({"1layer": 1, "3layer": 3})).all()
    assert runs["verdict_paper"].notna().all() and runs["scans_paper"].dtype == bool

    scan = pd.read_csv(out / "scan.csv")
    assert set(scan["classes"]) == {"paper", "guarded"}
    assert scan["step"].max() == 40 and set(scan["run"]) == {"1layer", "3layer"}
    entropy = pd.read_csv(out / "entropy.csv")
    assert len(entropy) == 2 * 5  # two runs, checkpoints 0, 10, ..., 40
    for column in ["entropy_with_self", "entropy_without_self"]:
        assert entropy[column].between(0, uniform + 1e-9).all()

    fig10 = pd.read_csv(out / "fig10.csv")
    assert list(fig10["lr"]) == [1.0, 5.0] and (fig10["seeds"] == 2).all()
    per_seed = pd.read_csv(out / "fig10_per_seed.csv")
    mean = per_seed.groupby("lr")["entropy_with_self"].mean()
    assert fig10.set_index("lr")["entropy_with_self_mean"].to_dict() == mean.to_dict()
    recall = pd.read_csv(out / "fig11.csv")
    assert recall["recall"].between(0, 1).all() and set(recall["ratio"]) == {1.0, 2.0, 5.0, 10.0}
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["iterations"] == 40 and meta["vocab"] == 4000
