"""A recording run's settings as one frozen value: what is tracked, what is watched, the
budget, how to run.

    settings = RecordingSettings(layers=(0, 1), max_checkpoint_bytes=32_000_000)
    Recorder("out/traj", tokens, settings).record(source)

The value is checked once, when it is made, and saved in the trajectory's manifest
(``"settings"``), so a folder says how it was recorded.  The command line builds it from its
options, whose help is each field's (`options`); library messages name the fields
(``on_disk=``) and the command line adds its flags (`RecordingSettings.options`).

>>> RecordingSettings(layers=[1, 0]).layers
(1, 0)
>>> RecordingSettings(on_error="ignore")
Traceback (most recent call last):
ValueError: on_error must be one of ('raise', 'skip'), got 'ignore'
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scansnap_lens._settings import Settings, count, ints, options, positive, setting
from scansnap_lens.recording.budget import CHECKPOINT_BUDGET, RUN_BUDGET

__all__ = ["DUPLICATES", "LOSS_ON", "ON_DISK", "RecordingSettings"]

ON_DISK = 2  # revisions of a hub sweep on disk at once: the one recording, the next
DUPLICATES = ("refuse", "skip", "record")
LOSS_ON = ("all", "last")  # the positions a loss averages over (`models.training.train`)


PROMPT_LENGTH = 64  # tokens of the example prompt of a new recording


def read_queries(text: str):
    """`queries` as an option gives it: all, a share of events covered (0 < q <= 1), or
    comma-separated token ids."""
    if text == "all":
        return text
    if "," not in text and "." in text:
        return float(text)
    return ints(text)


def read_device(text: str) -> str:
    """`device` as an option gives it: a torch device that exists here."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"not a device: {text!r} (cpu, cuda, cuda:1, mps)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this machine has no CUDA device (use cpu)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: this machine has no MPS device (use cpu)")
    return text


TRACKED, WATCHED, BUDGET, RUNNING = (
    "what is tracked",
    "what is watched",
    "the budget",
    "how to run",
)


@dataclass(frozen=True)
class RecordingSettings(Settings):
    """How a run is recorded (every field optional; the defaults are the command line's)."""

    queries: Any = setting(
        None,
        TRACKED,
        "all, a share of events covered by the most frequent queries (0.5), or ids (a,b,c);"
        " default: the queries that fit max_checkpoint_bytes= (with statistics, those whose"
        " classes have distinct tokens first, else the most frequent)",
        reads=read_queries,
    )
    window: int | None = setting(
        None,
        TRACKED,
        "most context positions before a query (default: the statistics' window, else the"
        " whole row)",
        reads=count(1),
    )
    exclude_bos: bool = setting(
        False,
        TRACKED,
        "keep position 0 out of context (as the statistics must have been counted)",
    )
    tokenizer: Any = setting(
        None,
        TRACKED,
        "tokenizer.json, a hub name or a tokenizer: the plan's token strings"
        " (default: the model's)",
    )
    aggregates: tuple | None = setting(
        None,
        TRACKED,
        "what each checkpoint records (names in aggregates.AGGREGATES, or your"
        " own Aggregate); default aggregates.DEFAULT, or what a resumed folder records",
        "",
    )
    prompt: tuple[int, ...] | None = setting(
        None,
        TRACKED,
        "token ids whose whole attention is kept at every checkpoint (default:"
        " the first prompt_length evaluation tokens)",
        "",
    )
    prompt_length: int | None = setting(
        None,
        TRACKED,
        "tokens of the example prompt whose whole attention is kept (0: none;"
        f" default {PROMPT_LENGTH}, or what a resumed folder keeps)",
        reads=count(0, 1 << 16),
    )
    loss_on: str | None = setting(
        None,
        TRACKED,
        "the positions the recorded evaluation loss averages over, as the training"
        " optimizes them: all (as language models train) or last (each row's final prediction;"
        " default: the training's own, as train passes it, else all)",
        choices=LOSS_ON,
    )
    layers: tuple[int, ...] | None = setting(
        None, WATCHED, "layers to watch (a,b); default all", reads=ints
    )
    heads: tuple[int, ...] | None = setting(
        None, WATCHED, "heads to watch (a,b); default all", reads=ints
    )
    max_checkpoint_bytes: int = setting(
        CHECKPOINT_BUDGET,
        BUDGET,
        "default queries: at most this many MB per checkpoint",
        "--max-checkpoint-mb",
        1e6,
        reads=positive,
    )
    max_run_bytes: int = setting(
        RUN_BUDGET,
        BUDGET,
        "refuse a recording that would write more than this many GB",
        "--max-run-gb",
        1e9,
        reads=positive,
    )
    batch_size: int = setting(8, RUNNING, "rows per forward pass", reads=count(1, 1 << 20))
    device: str | None = setting(
        None, RUNNING, "cpu, cuda, ... (default: the model's)", reads=read_device
    )
    step_unit: str = setting(
        "steps", RUNNING, "what a step counts: steps or tokens", "", choices=("steps", "tokens")
    )
    progress: bool = setting(True, RUNNING, "progress bars and estimates", "")
    overwrite: bool = setting(False, RUNNING, "replace a trajectory of another run in the folder")
    on_error: str = setting(
        "raise",
        RUNNING,
        "at an unreadable checkpoint: stop, or note it and go on",
        choices=("raise", "skip"),
    )
    on_disk: int = setting(
        ON_DISK,
        RUNNING,
        "hub revisions of the sweep on disk at once, the one recording included (on Ray: the"
        " checkpoints recording at once); each is deleted from the sweep's own cache once"
        " recorded, and revisions your hub cache holds are read from it, never changed",
        reads=count(1, 1 << 16),
    )
    keep_checkpoints: bool = setting(
        False, RUNNING, "download hub revisions into your hub cache (HF_HUB_CACHE) and keep them"
    )
    download_dir: str | None = setting(
        None,
        RUNNING,
        "the sweep's own cache: an empty or new folder apart from the"
        " recording's; it deletes there only what it downloaded (default: OUT/hub-cache)",
        reads=Path,
    )
    duplicates: str = setting(
        "refuse",
        RUNNING,
        "checkpoints whose weights files are identical under different steps (from the hashes"
        " the hub lists, or of local files): stop and say which, skip all but the last step"
        " of each group, or record them all",
        choices=DUPLICATES,
    )

    def __post_init__(self) -> None:
        fix = object.__setattr__
        for name in ("layers", "heads", "prompt"):
            value = getattr(self, name)
            if value is not None:
                fix(self, name, _indices(name, value, distinct=name != "prompt"))
        if self.aggregates is not None:
            fix(self, "aggregates", tuple(self.aggregates))
        queries = self.queries
        if isinstance(queries, str) and queries != "all":
            raise ValueError(f"queries must be None, 'all', a share, or token ids, not {queries!r}")
        if queries is not None and not isinstance(queries, (str, float)):
            fix(self, "queries", tuple(int(q) for q in _ids(queries)))
        if isinstance(queries, float) and not 0 < queries <= 1:
            raise ValueError(f"queries as a share must be in (0, 1], got {queries}")
        for name in ("max_checkpoint_bytes", "max_run_bytes", "batch_size", "on_disk"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
            fix(self, name, int(getattr(self, name)))
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be at least 1, got {self.window}")
        if self.prompt_length is not None and self.prompt_length < 0:
            raise ValueError(f"prompt_length must be 0 or more, got {self.prompt_length}")
        for f in dataclasses.fields(self):
            name, allowed = f.name, f.metadata["choices"]
            unset = f.default is None and getattr(self, name) is None
            if allowed is not None and not unset and getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.download_dir is not None:
            if self.keep_checkpoints:
                raise ValueError(
                    "download_dir= and keep_checkpoints=True: kept revisions download into your"
                    " hub cache (HF_HUB_CACHE), not the sweep's own; give one of them"
                )
            fix(self, "download_dir", str(self.download_dir))
        if self.device is not None:
            fix(self, "device", str(self.device))

    def to_dict(self) -> dict:
        """The settings as the manifest keeps them (a tokenizer or aggregate object by name)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "tokenizer" and value is not None and not isinstance(value, str):
                value = getattr(value, "name_or_path", None) or type(value).__name__
            if f.name == "aggregates" and value is not None:
                value = [a if isinstance(a, str) else a.name for a in value]
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def options(cls) -> list[dict]:
        """Each field the command line sets (`_settings.options`)."""
        return options(cls)


def _ids(values) -> list:
    import torch

    return torch.as_tensor(values).reshape(-1).tolist() if torch.is_tensor(values) else list(values)


def _indices(name: str, values, distinct: bool = True) -> tuple[int, ...]:
    """`values` as a tuple; ValueError naming them unless they are (distinct) non-negative
    integers."""
    values = _ids(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
        raise ValueError(f"{name} must be non-negative integers, got {values}")
    if distinct and len(set(values)) < len(values):
        twice = sorted({v for v in values if values.count(v) > 1})
        raise ValueError(f"{name} {values} name {twice} more than once: give each once")
    return tuple(values)
