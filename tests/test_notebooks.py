"""The example notebooks, executed by ``jupyter nbconvert --execute`` in a fresh kernel, in a
reduced form: a cell after each one's ``parameters`` cell sets smaller sizes and output
folders, and a last cell checks results.  Each run's time is printed (``pytest -s``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

# `pytest -m "not slow"` leaves these out; both TransformerLens majors run them (`-m tl`)
pytestmark = [pytest.mark.slow, pytest.mark.tl]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def execute(name: str, overrides: str, checks: str, cwd: Path) -> nbformat.NotebookNode:
    book = nbformat.read(EXAMPLES / name, as_version=4)
    at = next(i for i, c in enumerate(book.cells) if "parameters" in c.metadata.get("tags", []))
    book.cells.insert(at + 1, nbformat.v4.new_code_cell(overrides))
    book.cells.append(nbformat.v4.new_code_cell(checks))
    cwd.mkdir(parents=True, exist_ok=True)
    nbformat.write(book, cwd / name)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", name,
         "--output", "executed_" + name, "--ExecutePreprocessor.timeout=300",
         "--ExecutePreprocessor.kernel_name=python3"],
        cwd=cwd, capture_output=True, text=True,
    )  # fmt: skip
    print(f"{name}: {time.perf_counter() - start:.1f} s under jupyter nbconvert --execute")
    assert done.returncode == 0, done.stderr[-4000:]
    return nbformat.read(cwd / ("executed_" + name), as_version=4)


def _outputs(book, kind: str) -> list:
    return [o for c in book.cells for o in c.get("outputs", []) if kind in o.get("data", {})]


def test_quick_start(tmp_path):
    """Run from a relative output folder in a fresh kernel: the report renders, the views and
    the matplotlib figures show inline (not as '<Figure size ...>')."""
    book = execute(
        "01_quick_start.ipynb",
        "OUT = 'qs'  # relative, as a user writes it",
        "s = ss.measures.summarize(traj, groups).iloc[0]  # the demo's numbers (README)\n"
        "assert abs(s['bias'] - 3.365) < 5e-4 and abs(s['snap_step'] - 125.2) < 0.05\n"
        "assert report.path.is_file()",
        tmp_path,
    )
    assert (tmp_path / "qs" / "report" / "report.html").is_file()
    html = _outputs(book, "text/html")
    assert any("AttentionHeads" in o["data"]["text/html"] for o in html)  # circuitsvis views
    assert any("Report: <a href='file://" in o["data"]["text/html"] for o in html)
    assert _outputs(book, "image/png"), "matplotlib figures did not display inline"
    bare = [o for o in _outputs(book, "text/plain") if "image/png" not in o["data"]]
    assert not any(o["data"]["text/plain"].startswith("<Figure size") for o in bare)


def synthetic_text(folder: Path) -> Path:
    """valid.txt and test.txt in the words of the local hub's tokenizer (w1 .. w63): Syn-Medium
    sequences, one article each, so that distinct and common tokens exist."""
    import torch

    from scansnap_lens.lab.synthetic import sequence_sampler, syn_medium

    sample = sequence_sampler(syn_medium(1), seq_len=11)  # + label + 4 header words = 16
    folder.mkdir()
    for name, seed in (("valid.txt", 1), ("test.txt", 2)):
        rows = sample(200, torch.Generator().manual_seed(seed)) + 1  # id 0 is BOS there
        lines = [
            f" = Article {i} = \n" + " ".join(f"w{t}" for t in row.tolist())
            for i, row in enumerate(rows)
        ]
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def test_your_checkpoints_against_a_local_hub(fake_hub, tmp_path):
    text = synthetic_text(tmp_path / "text")
    execute(
        "02_your_checkpoints.ipynb",
        f"STEPS = [0, 1000, 2000]\nSEQ_LEN = 16\nEVAL_ROWS = 32\n"
        "OUT = 'own'\n"
        f"SHARED = {str(text)!r}",
        "assert traj.steps.tolist() == [0, 1000, 2000] and traj.layers == [0]\n"
        "assert len(summary) == 4 and summary['bias'].notna().all()  # 4 heads, measured",
        tmp_path,
    )


def test_your_checkpoints_offline(tmp_path):
    """The offline route: CHECKPOINTS names a folder of checkpoints (a Trainer's output here),
    TOKENIZER its tokenizer; no hub."""
    from _hub import tiny_hf_model, word_tokenizer

    text = synthetic_text(tmp_path / "text")
    run = tmp_path / "run"
    for step in (0, 10):
        tiny_hf_model("gpt_neox", seed=step).save_pretrained(run / f"checkpoint-{step}")
    word_tokenizer(64).save_pretrained(tmp_path / "tokenizer")
    execute(
        "02_your_checkpoints.ipynb",
        f"CHECKPOINTS = {str(run)!r}\nTOKENIZER = {str(tmp_path / 'tokenizer')!r}\n"
        f"STEPS = 'all'\nSEQ_LEN = 16\nEVAL_ROWS = 32\nOUT = 'offline'\nSHARED = {str(text)!r}",
        "assert traj.steps.tolist() == [0, 10] and len(summary) == 4  # 4 heads of layer 0",
        tmp_path,
    )


def test_wikitext(shared_dir, tmp_path):
    execute(
        "03_wikitext.ipynb",
        "VOCAB = 1000\nN_CTX = 32\nD_MODEL = 16\nSTEPS = 20\nEVAL_ROWS = 256\n"
        f"OUT = 'wiki'\nSHARED = {str(shared_dir / 'data' / 'wikitext-2')!r}",
        "assert traj.steps.tolist()[-1] == STEPS and result.loss[-1] < result.loss[0]",
        tmp_path,
    )


def test_watch_training(tmp_path):
    """A Trainer reporting to TensorBoard, watched by `Live`: the metrics are in TensorBoard
    at each recorded step (read with its own reader), the events were logged, and the
    report of the run is written."""
    book = execute(
        "04_watch_training.ipynb",
        "STEPS = 60\nOUT = 'watch'",
        "assert sorted(live.metrics) == traj.steps.tolist()\n"
        "logged = [e.step for e in board.Scalars('train/scansnap/layer0/auroc')]\n"
        "assert logged == traj.steps.tolist()\n"
        "assert report.path.is_file()",
        tmp_path,
    )
    assert any("scansnap/layer0/rate" in str(o.get("data", {}).get("text/plain", ""))
               for c in book.cells for o in c.get("outputs", []))  # fmt: skip
