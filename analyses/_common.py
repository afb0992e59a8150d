"""Shared argument parsing for the analysis scripts."""

from __future__ import annotations

import argparse
from pathlib import Path


def parser(description: str, default_out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=Path(default_out), help="output folder")
    return p
