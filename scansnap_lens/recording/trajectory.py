"""Recorded attention over checkpoints: `Trajectory`, the object a notebook holds.

A trajectory loaded from its folder (`Trajectory.load`; the format is `recording.storage`)
reads its checkpoints lazily: its tensors are `storage.StepStack`s, memory-mapped, so
measurements that take some slots or one step at a time never hold every checkpoint in
memory.  One built in memory (`from_records`, the lab) holds tensors.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from scansnap_lens.recording.aggregates import (
    AGGREGATES,
    Aggregate,
    CheckpointRecord,
    aggregate_named,
)
from scansnap_lens.recording.plan import RecordPlan
from scansnap_lens.recording.storage import (
    RecordingLock,
    StepStack,
    TrajectoryWriter,
    _read_manifest,
    _read_plan,
    manifest_aggregates,
    read_steps,
)

__all__ = ["NotRecorded", "Trajectory"]

_KNOWN = {a.name for a in AGGREGATES}


class NotRecorded(AttributeError, ValueError):
    """An aggregate the trajectory does not hold (recorded before it existed, or not asked
    for); a ValueError too, so that a measurement that needs it says why it cannot be made."""


class Trajectory:
    """Aggregates of S checkpoints, L layers and H heads: each a [S, L, H, slots] tensor (or
    `storage.StepStack`) under its name (`aggregates.AGGREGATES` says what each one is):

    zbar: [S, L, H, Pz] mean attention logit of each pair (m, l); c_hat: [S, L, H, Pc] the
    paper's c-hat, the attention of class (m, n) on token l; entropy: [S, L, H, K];
    query_entropy: [S, L, H, Q]; previous_token, first_token, induction: [S, L, H, N] per
    evaluation row (or the aggregate's own rows).

    steps: [S] ascending, in ``step_unit`` ("steps" or "tokens").
    values: {name: tensor} of the aggregates held, each also an attribute (``traj.zbar``);
    aggregates: {name: `Aggregate`} of those, with ``rows`` {name: words} saying which rows a
    rows aggregate read.
    skipped: checkpoints that could not be read: dicts with step, source and error.
    prompt: [T] ids of an example prompt, and prompt_pattern [S, L, H, T, T] its attention
    weights at every checkpoint (None where no prompt was recorded).  loss: [S] the model's
    mean next-token loss on the first evaluation rows (`hooks.loss_rows`: about
    `hooks.LOSS_TOKENS` tokens), NaN where a checkpoint has none (folders written before it
    was recorded); loss_on: the positions it averages over, "all" or "last" (each row's final
    prediction, as `train(loss_on="last")` optimizes), "mixed" where checkpoints differ.
    recording: the pid of the process that was recording into the folder when it was loaded
    (the trajectory holds the checkpoints recorded so far), or None.
    """

    def __init__(
        self,
        plan: RecordPlan,
        steps: Tensor,
        layers: list[int],
        heads: list[int],
        step_unit: str = "steps",
        skipped: list[dict] | None = None,
        meta: dict | None = None,
        prompt: Tensor | None = None,
        prompt_pattern: Tensor | StepStack | None = None,
        aggregates: dict[str, Aggregate] | None = None,
        rows: dict[str, str] | None = None,
        loss: Tensor | None = None,
        loss_on: str = "all",
        recording: str | None = None,
        **values: Tensor | StepStack,
    ):
        self.plan, self.steps = plan, steps
        self.layers, self.heads = list(layers), list(heads)
        self.step_unit = step_unit
        self.skipped = [] if skipped is None else skipped
        self.meta = {} if meta is None else meta
        self.prompt, self.prompt_pattern = prompt, prompt_pattern
        # [S] the evaluation loss at each checkpoint (NaN where not recorded)
        self.loss = (
            torch.full((len(steps),), math.nan, dtype=torch.float64)
            if loss is None
            else torch.as_tensor(loss, dtype=torch.float64)
        )
        self.loss_on = loss_on
        self.recording = recording
        aggregates = dict(aggregates or {})
        for name in values:
            if name not in aggregates:
                aggregates[name] = aggregate_named(name)  # KeyError for an unknown name
        self.values = dict(values)
        self.aggregates = {name: aggregates[name] for name in values}
        self.rows = {
            n: (rows or {}).get(n, "evaluation rows")
            for n, a in self.aggregates.items()
            if a.axis == "rows"
        }

    def __getattr__(self, name: str):
        values = self.__dict__.get("values")
        if values is not None and name in values:
            return values[name]
        if values is not None and name in _KNOWN:
            raise NotRecorded(
                f"this trajectory holds no {name} (it holds {', '.join(values)}): record it"
                " (recorded by default since it exists; older folders lack it)"
            )
        raise AttributeError(name)

    def __getstate__(self) -> dict:
        return self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def replace(self, **changes) -> Trajectory:
        """A copy with some fields or aggregates changed (``traj.replace(zbar=...)``)."""
        fields = {
            "plan": self.plan,
            "steps": self.steps,
            "layers": self.layers,
            "heads": self.heads,
            "step_unit": self.step_unit,
            "skipped": self.skipped,
            "meta": self.meta,
            "prompt": self.prompt,
            "prompt_pattern": self.prompt_pattern,
            "aggregates": self.aggregates,
            "rows": self.rows,
            "loss": self.loss,
            "loss_on": self.loss_on,
            "recording": self.recording,
        }
        values = dict(self.values)
        for key, value in changes.items():
            (fields if key in fields else values)[key] = value
        return Trajectory(**fields, **values)

    def holds(self, name: str) -> bool:
        """Whether the trajectory holds aggregate `name`."""
        return name in self.values

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
        names = list(records[0].values)
        if any(list(r.values) != names for r in records):
            raise ValueError("the records hold different aggregates")
        stacked = {k: torch.stack([r.values[k] for r in records]) for k in names}
        steps = torch.tensor([r.step for r in records], dtype=torch.long)
        losses = [math.nan if r.loss is None else r.loss for r in records]
        kwargs.setdefault("loss", torch.tensor(losses, dtype=torch.float64))
        kwargs.setdefault("loss_on", _loss_on([r.loss_on for r in records if r.loss is not None]))
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

        out = {k: cut(v) for k, v in self.values.items()}
        plan = self.plan
        if queries is not None:
            plan, keep = plan.for_queries(torch.as_tensor(list(queries)))
            out = {
                k: v
                if self.aggregates[k].axis not in keep
                else v[..., keep[self.aggregates[k].axis]]
                for k, v in out.items()
            }
        return self.replace(
            plan=plan,
            steps=self.steps[s],
            layers=[self.layers[i] for i in lay],
            heads=[self.heads[i] for i in hd],
            skipped=list(self.skipped),
            meta=dict(self.meta),
            prompt_pattern=None if self.prompt_pattern is None else cut(self.prompt_pattern),
            loss=self.loss[s],
            **out,
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
            aggregates=self.entries(),
        )
        for i, step in enumerate(self.steps.tolist()):
            pattern = None if self.prompt_pattern is None else self.prompt_pattern[i]
            values = {k: torch.as_tensor(v[i]) for k, v in self.values.items()}
            loss = None if math.isnan(self.loss[i]) else float(self.loss[i])
            writer.write(CheckpointRecord(step, values, pattern, loss, self.loss_on))
        for item in self.skipped:
            writer.skip(item["step"], item["source"], item["error"])
        writer.finish()
        return writer.path

    @classmethod
    def load(cls, path: str | Path) -> Trajectory:
        """The trajectory of a folder, its checkpoints memory-mapped (read when used).  A
        link to the folder is read where it points (only writes refuse links)."""
        path = Path(path).resolve() if Path(path).is_symlink() else Path(path)
        recording = RecordingLock(path).holder()  # before the manifest: what it lists is done
        manifest = _read_manifest(path)
        plan = _read_plan(path / manifest.get("plan", "plan.safetensors"))
        if not manifest["checkpoints"]:
            raise ValueError(f"{path}: no checkpoint has been recorded yet")
        stacks = read_steps(path, manifest, plan)
        pattern = stacks.pop("prompt_pattern")
        prompt = _prompt_tensor(manifest.get("prompt"))
        entries = manifest_aggregates(manifest)
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
            aggregates={e["name"]: Aggregate.from_entry(e) for e in entries},
            rows={e["name"]: e["rows"] for e in entries if "rows" in e},
            loss=torch.tensor(
                [c.get("loss", math.nan) for c in manifest["checkpoints"]], dtype=torch.float64
            ),
            loss_on=_loss_on(
                [c.get("loss_on", "all") for c in manifest["checkpoints"] if "loss" in c]
            ),
            recording=recording,
        )

    def entries(self) -> list[dict]:
        """The manifest entries of the aggregates held (`Aggregate.entry`)."""
        return [
            agg.entry(self.values[name].shape[-1], self.rows.get(name))
            for name, agg in self.aggregates.items()
        ]


def _loss_on(each: list) -> str:
    """The positions a trajectory's losses average over, from each checkpoint's (a folder's
    values checked as strings): "mixed" where they differ."""
    found = {v if v in ("all", "last") else "mixed" for v in each}
    return found.pop() if len(found) == 1 else "all" if not found else "mixed"


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
