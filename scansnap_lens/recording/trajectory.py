"""Recorded attention over checkpoints: `Trajectory`, the object a notebook holds.

A trajectory loaded from its folder (`Trajectory.load`; the format is `recording.storage`)
reads its checkpoints lazily: its tensors are `storage.StepStack`s, memory-mapped, so
measurements that take some slots or one step at a time never hold every checkpoint in
memory.  One built in memory (`from_records`, the lab) holds tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens.recording.hooks import CheckpointRecord
from scansnap_lens.recording.plan import RecordPlan
from scansnap_lens.recording.storage import (
    _FIELDS,
    StepStack,
    TrajectoryWriter,
    _read_manifest,
    _read_plan,
    read_steps,
)

__all__ = ["Trajectory"]


@dataclass
class Trajectory:
    """Aggregates of S checkpoints, L layers and H heads (`recording.hooks` defines each).

    steps: [S] ascending, in ``step_unit`` ("steps" or "tokens").
    zbar: [S, L, H, Pz] mean attention logit of each pair (m, l); c_hat: [S, L, H, Pc] the
    paper's c-hat, the attention of class (m, n) on token l; entropy: [S, L, H, K];
    query_entropy: [S, L, H, Q].
    skipped: checkpoints that could not be read: dicts with step, source and error.
    prompt: [T] ids of an example prompt, and prompt_pattern [S, L, H, T, T] its attention
    weights at every checkpoint (None where no prompt was recorded).
    """

    plan: RecordPlan
    steps: Tensor
    layers: list[int]
    heads: list[int]
    zbar: Tensor | StepStack
    c_hat: Tensor | StepStack
    entropy: Tensor | StepStack
    query_entropy: Tensor | StepStack
    step_unit: str = "steps"
    skipped: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    prompt: Tensor | None = None
    prompt_pattern: Tensor | StepStack | None = None

    @property
    def num_steps(self) -> int:
        return self.steps.numel()

    def __repr__(self) -> str:
        steps = self.steps.tolist()
        span = f"{steps[0]} to {steps[-1]}" if steps else "none"
        return (
            f"Trajectory({len(steps)} checkpoints ({self.step_unit} {span}), layers"
            f" {self.layers}, heads {self.heads}, {self.plan.describe()})"
        )

    @classmethod
    def from_records(
        cls, plan: RecordPlan, records: list[CheckpointRecord], layers, heads, **kwargs
    ) -> Trajectory:
        if not records:
            raise ValueError("a trajectory needs at least one recorded checkpoint")
        records = sorted(records, key=lambda r: r.step)
        stacked = {k: torch.stack([getattr(r, k) for r in records]) for k in _FIELDS}
        steps = torch.tensor([r.step for r in records], dtype=torch.long)
        patterns = [r.prompt_pattern for r in records]
        if kwargs.get("prompt") is not None and all(p is not None for p in patterns):
            kwargs["prompt_pattern"] = torch.stack(patterns)
        else:
            kwargs["prompt"] = None
        return cls(plan, steps, list(layers), list(heads), **stacked, **kwargs)

    # -- lookups ---------------------------------------------------------------------
    def class_slot(self, query: int, next_token: int) -> int | None:
        """Index of the class (query, next_token) in the plan, None if it is not tracked."""
        return self.plan.class_slot(query, next_token)

    def class_attention(self, c: int, tokens: Tensor) -> Tensor:
        """c_hat [S, L, H, n] (float64) of class slot `c` for `tokens`; 0 where a token never
        occurred in the context of the class."""
        slot = self.plan.triple_slot(c, tokens)
        held = slot >= 0
        out = torch.zeros(*self.c_hat.shape[:3], slot.numel(), dtype=torch.float64)
        out[..., held] = self.c_hat[..., slot[held]].double()
        return out

    def attention(self, query: int, next_token: int, tokens) -> Tensor:
        """[S, L, H, n] (float64) the attention that class (query, next_token) puts on each of
        `tokens` (c_hat: per event, the weights on the token's context positions, summed and
        renormalised over the context; averaged over events); 0 where a token never occurred
        in the class's contexts.  KeyError where the class is not tracked."""
        c = self.plan.class_slot(query, next_token)
        if c is None:
            raise KeyError(f"class (query {query}, next token {next_token}) is not tracked")
        return self.class_attention(c, torch.as_tensor(tokens))

    def logits(self, query: int, tokens) -> Tensor:
        """[S, L, H, n] (float64) the mean attention logit zbar of `query` on each of `tokens`
        (over every event of the query); NaN where a token never occurred in its context."""
        slot = self.plan.pair_slot(query, tokens)
        held = slot >= 0
        out = torch.full((*self.zbar.shape[:3], slot.numel()), math.nan, dtype=torch.float64)
        out[..., held] = self.zbar[..., slot[held]].double()
        return out

    # -- selection -------------------------------------------------------------------
    def select(self, steps=None, layers=None, heads=None, queries=None) -> Trajectory:
        """A sub-trajectory: given step values, layer and head ids, and query tokens."""
        s = _positions(self.steps.tolist(), steps, "step")
        lay = _positions(self.layers, layers, "layer")
        hd = _positions(self.heads, heads, "head")

        def cut(x: Tensor) -> Tensor:
            return x[s][:, lay][:, :, hd]

        out = {k: cut(getattr(self, k)) for k in _FIELDS}
        plan = self.plan
        if queries is not None:
            plan, keep = plan.for_queries(torch.as_tensor(list(queries)))
            out = {k: v[..., keep[k]] for k, v in out.items()}
        return Trajectory(
            plan,
            self.steps[s],
            [self.layers[i] for i in lay],
            [self.heads[i] for i in hd],
            **out,
            step_unit=self.step_unit,
            skipped=list(self.skipped),
            meta=dict(self.meta),
            prompt=self.prompt,
            prompt_pattern=None if self.prompt_pattern is None else cut(self.prompt_pattern),
        )

    # -- tables ----------------------------------------------------------------------
    def to_dataframe(self, decode: bool = False) -> pd.DataFrame:
        """Long format: one row per (step, layer, head, query, next, token) of the tracked classes.

        Columns: step, layer, head, query, next, token, zbar, c_hat, count (C(m, n, l)),
        events (N(m, n)), pair_count (positions averaged in zbar); with ``decode`` also the
        token strings.
        """
        plan = self.plan
        _S, _L, _H, Pc = self.c_hat.shape
        pair = plan.triple_pair()
        idx = pd.MultiIndex.from_product(
            [self.steps.tolist(), self.layers, self.heads, range(Pc)],
            names=["step", "layer", "head", "slot"],
        )
        frame = idx.to_frame(index=False)
        slot = frame.pop("slot").to_numpy()
        cls = plan.triple_class.numpy()[slot]
        frame["query"] = plan.class_query.numpy()[cls]
        frame["next"] = plan.class_next.numpy()[cls]
        frame["token"] = plan.triple_token.numpy()[slot]
        frame["zbar"] = self.zbar[..., pair].reshape(-1).numpy()
        frame["c_hat"] = self.c_hat.reshape(-1).numpy()
        frame["count"] = plan.triple_count.numpy()[slot]
        frame["events"] = plan.class_events.numpy()[cls]
        frame["pair_count"] = plan.pair_count[pair].numpy()[slot]
        if decode:
            for col in ("query", "next", "token"):
                frame[col + "_str"] = [plan.decode(t) for t in frame[col]]
        return frame

    def entropy_dataframe(self) -> pd.DataFrame:
        """One row per (step, layer, head, query, next) with the mean attention entropy."""
        _S, _L, _H, C = self.entropy.shape
        idx = pd.MultiIndex.from_product(
            [self.steps.tolist(), self.layers, self.heads, range(C)],
            names=["step", "layer", "head", "cls"],
        ).to_frame(index=False)
        cls = idx.pop("cls").to_numpy()
        idx["query"] = self.plan.class_query.numpy()[cls]
        idx["next"] = self.plan.class_next.numpy()[cls]
        idx["events"] = self.plan.class_events.numpy()[cls]
        idx["entropy"] = self.entropy.reshape(-1).numpy()
        return idx

    # -- files -----------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the folder format (see the module docstring)."""
        writer = TrajectoryWriter(
            path,
            self.plan,
            self.layers,
            self.heads,
            self.step_unit,
            self.meta,
            resume=False,
            prompt=self.prompt,
        )
        for i, step in enumerate(self.steps.tolist()):
            pattern = None if self.prompt_pattern is None else self.prompt_pattern[i]
            writer.write(CheckpointRecord(step, *(getattr(self, k)[i] for k in _FIELDS), pattern))
        for item in self.skipped:
            writer.skip(item["step"], item["source"], item["error"])
        writer.finish()
        return writer.path

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        """The trajectory of a folder, its checkpoints memory-mapped (read when used)."""
        path = Path(path)
        manifest = _read_manifest(path)
        plan = _read_plan(path / manifest.get("plan", "plan.safetensors"))
        if not manifest["checkpoints"]:
            raise ValueError(f"{path}: no checkpoint has been recorded yet")
        stacks = read_steps(path, manifest, plan)
        pattern = stacks.pop("prompt_pattern")
        prompt = _prompt_tensor(manifest.get("prompt"))
        return cls(
            plan,
            torch.tensor([c["step"] for c in manifest["checkpoints"]], dtype=torch.long),
            list(manifest["layers"]),
            list(manifest["heads"]),
            **stacks,
            step_unit=manifest["step_unit"],
            skipped=manifest["skipped"],
            meta=manifest["meta"],
            prompt=prompt if pattern is not None else None,
            prompt_pattern=pattern,
        )


def _prompt_tensor(ids: list[int] | None) -> Tensor | None:
    return None if ids is None else torch.tensor(ids, dtype=torch.long)


def _positions(values: list, wanted, name: str) -> list[int]:
    if wanted is None:
        return list(range(len(values)))
    wanted = [wanted] if isinstance(wanted, int) else list(wanted)
    missing = [w for w in wanted if w not in values]
    if missing:
        raise KeyError(f"{name}s {missing} are not in this trajectory (it has {values})")
    return [values.index(w) for w in wanted]
