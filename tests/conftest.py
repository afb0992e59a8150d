from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from _built_once import built_once
from _runs import syn_data, train_run

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SCANSNAP_SHARED", REPO.parent / "shared"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def shared_dir() -> Path:
    if not (SHARED / "data" / "wikitext-2").is_dir():
        pytest.skip(f"shared data not found at {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def fake_hub():
    """A hub cache holding EleutherAI/pythia-14m revisions step0, step1000, step2000."""
    from _hub import fake_hub_model

    cache = os.environ["HF_HUB_CACHE"]
    fake_hub_model(cache, "EleutherAI/pythia-14m", revisions=["step0", "step1000", "step2000"])
    return cache


@pytest.fixture(scope="session")
def demo_out(tmp_path_factory):
    """`scansnap demo` run once for the test run: (output folder, what it printed)."""

    def demo(out):
        import contextlib
        import io

        from scansnap_lens.cli import main

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["demo", "--out", str(out)]) == 0
        return printed.getvalue()

    return built_once(tmp_path_factory, "demo", demo)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    _, result = train_run(out=out)
    eval_tokens = syn_data(8, torch.Generator().manual_seed(7))
    return out, result, eval_tokens
