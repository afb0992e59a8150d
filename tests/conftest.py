from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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
