"""Shared pieces of the analysis scripts: argument parsing, measurements that may be missing."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def parser(description: str, default_out: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=Path(default_out), help="output folder")
    return p


def measure_or_nan(measurement, traj, groups, columns) -> pd.DataFrame:
    """`measurement(traj, groups).table`, or NaN `columns` over every (step, layer, head) where
    the evaluation text lacks what it needs (say, no distinct token of a query occurs in its
    evaluation contexts); the reason is printed."""
    try:
        return measurement(traj, groups).table
    except ValueError as err:
        print(f"  {measurement.__name__}: {err}")
        idx = pd.MultiIndex.from_product(
            [traj.steps.tolist(), traj.layers, traj.heads], names=["step", "layer", "head"]
        ).to_frame(index=False)
        return idx.assign(**{c: np.nan for c in columns})
