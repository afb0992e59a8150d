"""Writes tests/data/trajectory_v1/: a trajectory folder as this version of scansnap_lens
writes it (format scansnap_lens.Trajectory/1), checked in so that a change of the disk format
that would strand users' folders fails `tests/recording/test_storage.py`.

    python tests/data/make_trajectory_v1.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from scansnap_lens.models.checkpoints import in_memory
from scansnap_lens.models.training import attention_only_model
from scansnap_lens.recording.recorder import record_trajectory
from scansnap_lens.recording.settings import RecordingSettings

OUT = Path(__file__).parent / "trajectory_v1"
V = 12


def models() -> dict:
    return {s: attention_only_model(V, d_model=8, n_heads=2, n_ctx=16, seed=i)
            for i, s in enumerate((0, 10, 10**12))}  # fmt: skip


def tokens() -> torch.Tensor:
    return torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(0))


if __name__ == "__main__":
    shutil.rmtree(OUT, ignore_errors=True)
    record_trajectory(
        in_memory(models()),
        tokens(),
        OUT,
        RecordingSettings(queries=[1, 2, 3], window=4, prompt_length=6, progress=False),
        meta={"lr_y": 0.1, "lr_z": 3.0},
    )
    (OUT / ".recording.lock").unlink(missing_ok=True)
    (OUT / ".lock").unlink(missing_ok=True)
    print(f"wrote {OUT}")
