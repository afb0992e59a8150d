"""The Y/Z model of Lemma 1, the paper's own 1-layer transformer, and its trainer.

Two M x M matrices per run:
  * ``Z[m, l]``: attention logit of query token m on context token l.  Attention is a softmax
    of Z[x_T, x_t] over the context positions t < T (no scaling, no positions, the query's own
    position excluded).
  * ``Y[n, l]``: decoder.  f = sum_t b_t e_{x_t}, normalised to unit L2 norm, and the logits
    over all M tokens are ``Y @ f`` (the paper's Y is this matrix transposed).

Many runs train at once in one batched computation: every tensor carries a leading run
dimension R, each run with its own rates, initialisation and data stream (its own seed), so a
run gives the same numbers whether it is trained alone or inside a grid.

``population=True`` trains on the T -> infinity limit (Lemma 2), the exact setting of the
theorems: the attention of class n is c_n = P(.|n) exp(z_m) normalised (Eq. 5) and each step
uses the expected gradient over the classes, with no sampling.

>>> run = train_yz(syn_small(), lr_z=1.0, ratio=1.0, num_steps=5, seeds=[0, 1])
>>> run.Z.shape  # [snapshots, runs, V, V]
torch.Size([6, 2, 34, 34])
>>> round(run.loss[0, 0].item(), 4) == round(math.log(34), 4)  # zero init: uniform prediction
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens._io import make_folder, read_tensors, write_tensors
from scansnap_lens.lab.synthetic import SequenceClasses, syn_small
from scansnap_lens.statistics.kinds import TokenKind
from scansnap_lens.theory.population import held_steps

__all__ = [
    "YZRun",
    "per_token_attention",
    "sample_attention_output",
    "train_yz",
    "yz_loss",
]


def per_token_attention(Z: Tensor, classes: SequenceClasses) -> Tensor:
    """Eq. 5: c[l|n] = P(l|n) exp(Z[m_n, l]) / sum_l' P(l'|n) exp(Z[m_n, l']).

    Z: [..., V, V] -> [..., K, V].  Computed in log space, so large logits do not overflow.
    """
    logp = classes.probs.to(Z).log()  # -inf off the support
    logits = Z[..., classes.query, :] + logp
    return torch.softmax(logits, dim=-1)


def sample_attention_output(Z: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Attention over the context of sampled sequences.

    Z: [R, V, V], tokens: [R, B, T] (context then query).  Returns the attention weights
    b [R, B, T-1] and the attended one-hot mixture X^T b [R, B, V].
    """
    context, query = tokens[..., :-1], tokens[..., -1]
    vocab = Z.shape[-1]
    rows = torch.gather(Z, 1, query[..., None].expand(-1, -1, vocab))  # [R, B, V]
    weights = torch.softmax(torch.gather(rows, 2, context), dim=-1)
    mixture = torch.zeros_like(rows).scatter_add_(2, context, weights)
    return weights, mixture


def yz_loss(
    Y: Tensor,
    Z: Tensor,
    classes: SequenceClasses,
    tokens: Tensor | None = None,
    labels: Tensor | None = None,
) -> Tensor:
    """Cross-entropy per run, [R].  Sampled batch if ``tokens`` [R, B, T] and ``labels``
    [R, B] are given, otherwise the population loss (mean over the classes)."""
    if tokens is None:
        mixture = per_token_attention(Z, classes)  # [R, K, V]
        labels = classes.next_token.expand(Z.shape[0], -1)
    else:
        _, mixture = sample_attention_output(Z, tokens)
    f = mixture / mixture.norm(dim=-1, keepdim=True)
    logits = torch.einsum("rbl,rnl->rbn", f, Y)
    ce = F.cross_entropy(
        rearrange(logits, "r b n -> (r b) n"), labels.reshape(-1), reduction="none"
    )
    return rearrange(ce, "(r b) -> r b", r=Z.shape[0]).mean(1)


@dataclass
class YZRun:
    """Snapshots of a batch of Y/Z runs.

    Attributes:
        classes: the sequence classes trained on.
        steps: [S] the step of each snapshot (0 is the initialisation).
        Z, Y: [S, R, V, V] the weights at those steps.
        loss: [steps, R] the training loss of each step, before its update.
        lr_z, ratio, seeds: [R] eta_Z, eta_Y / eta_Z and the seed of each run.
        config: settings shared by the runs (optimizer, momentum, init, batch, ...).
    """

    classes: SequenceClasses
    steps: Tensor
    Z: Tensor
    Y: Tensor
    loss: Tensor
    lr_z: Tensor
    ratio: Tensor
    seeds: Tensor
    config: dict = field(default_factory=dict)

    @property
    def num_runs(self) -> int:
        return self.Z.shape[1]

    @property
    def lr_y(self) -> Tensor:
        return self.lr_z * self.ratio

    def attention(self) -> Tensor:
        """[S, R, K, V] the per-token attention c_n (Eq. 5) at every snapshot."""
        return per_token_attention(self.Z, self.classes)

    def to_trajectory(self):
        """The Z snapshots as a `Trajectory`: one layer, one "head" per run.

        zbar[m, l] = Z[m, l] exactly, c_hat = Eq. 5's c[l|n]; nothing else (the attention over
        positions, behind the entropies and the head types, is not the population model's).
        Steps are the snapshot steps.
        """
        from scansnap_lens.recording.plan import RecordPlan
        from scansnap_lens.recording.trajectory import Trajectory

        classes, M = self.classes, self.classes.vocab_size
        k_idx, l_idx = classes.support().nonzero(as_tuple=True)  # each class's context tokens
        ones = torch.ones(classes.num_classes, dtype=torch.long)
        # the counts a text of a million context positions per class would hold
        counts = torch.round(classes.probs[k_idx, l_idx].double() * 1e6).long().clamp_min(1)
        plan = RecordPlan.from_counts(
            M,
            classes.query,
            classes.next_token,
            ones,
            k_idx,
            l_idx,
            counts,
            token_strings=dict(enumerate(classes.token_labels())),
        )
        R = self.Z.shape[1]
        zbar = self.Z[..., plan.pair_query, plan.pair_token]  # [S, R, Pz]
        order = torch.argsort(classes.query * M + classes.next_token)  # the plan's class order
        c_hat = self.attention()[:, :, order][:, :, plan.triple_class, plan.triple_token]
        return Trajectory(
            plan,
            self.steps.clone(),
            layers=[0],
            heads=list(range(R)),
            zbar=zbar[:, None].float(),
            c_hat=c_hat[:, None].float(),
            meta={
                "source": "yz",
                "lr_z": self.lr_z.tolist(),
                "ratio": self.ratio.tolist(),
                "seeds": self.seeds.tolist(),
                "optimizer": self.config.get("optimizer", "sgd"),
                "momentum": float(self.config.get("momentum", 0.0)),
            },
        )

    def attention_dataframe(self) -> pd.DataFrame:
        """c_n in long form: one row per (step, run, class, context token of the class)."""
        attention = self.attention()  # [S, R, K, V]
        s, r, k, m = torch.nonzero(self.classes.support().expand_as(attention), as_tuple=True)
        common = self.classes.common_mask()[m]
        return pd.DataFrame(
            {
                "step": self.steps[s].numpy(),
                "run": r.numpy(),
                "class": k.numpy(),
                "token": m.numpy(),
                "kind": pd.Categorical(
                    np.where(common.numpy(), TokenKind.COMMON.word, TokenKind.DISTINCT.word),
                    categories=[TokenKind.COMMON.word, TokenKind.DISTINCT.word],
                ),
                "p_context": self.classes.probs[k, m].numpy(),
                "attention": attention[s, r, k, m].numpy(),
            }
        )

    def to_dataframe(self) -> pd.DataFrame:
        """Loss curve in long form: one row per (step, run)."""
        steps, runs = self.loss.shape
        return pd.DataFrame(
            {
                "step": torch.arange(steps).repeat_interleave(runs).numpy(),
                "run": torch.arange(runs).repeat(steps).numpy(),
                "lr_z": self.lr_z.repeat(steps).numpy(),
                "ratio": self.ratio.repeat(steps).numpy(),
                "seed": self.seeds.repeat(steps).numpy(),
                "loss": self.loss.reshape(-1).numpy(),
            }
        )

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (safetensors, atomically) holding the tensors and the JSON settings."""
        path = Path(path)
        make_folder(path.parent)
        tensors = {
            "steps": self.steps,
            "Z": self.Z,
            "Y": self.Y,
            "loss": self.loss,
            "lr_z": self.lr_z,
            "ratio": self.ratio,
            "seeds": self.seeds,
            "probs": self.classes.probs,
            "query": self.classes.query,
            "next_token": self.classes.next_token,
        }
        meta = {"format": "scansnap_lens.YZRun/1", "config": json.dumps(self.config)}
        return write_tensors(path, {k: v.contiguous() for k, v in tensors.items()}, meta)

    @classmethod
    def load(cls, path: str | Path) -> YZRun:
        meta, t = read_tensors(path, "scansnap_lens.YZRun/1", "Y/Z run file")
        classes = SequenceClasses(t["probs"], t["query"], t["next_token"])
        return cls(
            classes,
            t["steps"],
            t["Z"],
            t["Y"],
            t["loss"],
            t["lr_z"],
            t["ratio"],
            t["seeds"],
            json.loads(meta["config"]),
        )


def _per_run(value: float | Sequence[float] | Tensor, runs: int, name: str) -> Tensor:
    t = torch.as_tensor(value, dtype=torch.float32).flatten()
    if t.numel() == 1:
        t = t.expand(runs)
    if t.numel() != runs:
        raise ValueError(f"{name} has {t.numel()} values for {runs} runs")
    if (t <= 0).any():
        raise ValueError(f"{name} must be positive, got {t.tolist()}")
    return t.clone()


def _check_yz(runs: int, num_steps: int, init: str, optimizer: str) -> None:
    if runs < 1:
        raise ValueError("need at least one seed")
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if init not in ("zero", "uniform"):
        raise ValueError(f"init must be 'zero' or 'uniform', got {init!r}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")


def _rates(lr_z, ratio, lr_y, runs: int) -> tuple[Tensor, Tensor]:
    """[R] eta_Z and [R] eta_Y / eta_Z of each run."""
    if ratio is not None and lr_y is not None:
        raise ValueError("give eta_Y as lr_y or as ratio = lr_y / lr_z, not both")
    lr_z_t = _per_run(lr_z, runs, "lr_z")
    if lr_y is None:
        return lr_z_t, _per_run(1.0 if ratio is None else ratio, runs, "ratio")
    return lr_z_t, _per_run(lr_y, runs, "lr_y") / lr_z_t


def _initial(init: str, vocab: int, gens: list[torch.Generator]) -> Tensor:
    """[R, M, M] each run's initial weights: zero, or nn.Linear's U(-1/sqrt M, 1/sqrt M)."""
    if init == "zero":
        return torch.zeros(len(gens), vocab, vocab)
    bound = 1.0 / math.sqrt(vocab)
    return torch.stack(
        [torch.empty(vocab, vocab).uniform_(-bound, bound, generator=g) for g in gens]
    )


def train_yz(
    classes: SequenceClasses | None = None,
    lr_z: float | Sequence[float] | Tensor = 1.0,
    ratio: float | Sequence[float] | Tensor | None = None,
    *,
    lr_y: float | Sequence[float] | Tensor | None = None,
    seeds: Sequence[int] | Tensor = (0,),
    init_seeds: Sequence[int] | Tensor | None = None,
    optimizer: Literal["sgd", "adam"] = "sgd",
    momentum: float = 0.9,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    init: Literal["zero", "uniform"] = "zero",
    batch_size: int = 128,
    seq_len: int = 128,
    num_steps: int = 100,
    snapshot_every: int = 1,
    population: bool = False,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> YZRun:
    """Train R = len(seeds) Y/Z runs at once with separate rates for Y and Z.

    Args:
        classes: the data (default Syn-Small).
        lr_z: eta_Z, one value or one per run.
        ratio: eta_Y / eta_Z, one value or one per run (the axis of Fig. 6; default 1); or
        lr_y: eta_Y itself, one value or one per run.
        seeds: one seed per run: it draws the run's initialisation and its data stream.
        init_seeds: one per run where the initialisation has its own seed (runs that share
            initial weights and differ in their data, or the other way round); with
            ``init="zero"`` every run starts alike whatever its seed.
        optimizer: "sgd" (PyTorch's SGD with ``momentum``, no weight decay) or "adam".
        init: "zero" (Y = Z = 0) or "uniform" (PyTorch's nn.Linear default, U(-1/sqrt M, 1/sqrt M)).
        batch_size, seq_len: sequences per step and their length (context + query).
        snapshot_every: keep Y and Z every k steps (0: only the initial and final weights).
        population: train on the T -> infinity limit (expected gradient, no sampling).
    """
    classes = classes if classes is not None else syn_small()
    seeds_t = torch.as_tensor(seeds, dtype=torch.long).flatten()
    runs, vocab = seeds_t.numel(), classes.vocab_size
    _check_yz(runs, num_steps, init, optimizer)
    lr_z_t, ratio_t = _rates(lr_z, ratio, lr_y, runs)
    device = torch.device(device)
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds_t]
    starts = gens
    if init_seeds is not None:
        init_t = torch.as_tensor(init_seeds, dtype=torch.long).flatten()
        if init_t.numel() != runs:
            raise ValueError(f"{init_t.numel()} init_seeds for {runs} seeds")
        starts = [torch.Generator().manual_seed(int(s)) for s in init_t]
    # Y first, as nn.Linear K1 then K2
    Y, Z = _initial(init, vocab, starts).to(device), _initial(init, vocab, starts).to(device)
    params = [Y.requires_grad_(), Z.requires_grad_()]
    lr = [(lr_z_t * ratio_t).to(device)[:, None, None], lr_z_t.to(device)[:, None, None]]
    state = [[torch.zeros_like(p), torch.zeros_like(p)] for p in params]
    cls_dev = SequenceClasses(
        classes.probs.to(device), classes.query.to(device), classes.next_token.to(device)
    )

    snap_steps, snaps_y, snaps_z = [0], [Y.detach().cpu().clone()], [Z.detach().cpu().clone()]
    losses = torch.empty(num_steps, runs)
    for step in tqdm(range(1, num_steps + 1), desc="train Y/Z", disable=not progress):
        if population:
            loss = yz_loss(Y, Z, cls_dev)
        else:
            batches = [classes.sample(batch_size, seq_len, g) for g in gens]
            tokens = torch.stack([b[0] for b in batches]).to(device)
            labels = torch.stack([b[1] for b in batches]).to(device)
            loss = yz_loss(Y, Z, cls_dev, tokens, labels)
        losses[step - 1] = loss.detach().cpu()
        grads = torch.autograd.grad(loss.sum(), params)
        with torch.no_grad():
            for p, g, rate, moments in zip(params, grads, lr, state):
                p.sub_(rate * held_steps(optimizer, moments, g, step - 1, 1, momentum, betas, eps))
        if (snapshot_every and step % snapshot_every == 0) or step == num_steps:
            snap_steps.append(step)
            snaps_y.append(Y.detach().cpu().clone())
            snaps_z.append(Z.detach().cpu().clone())

    config = dict(
        optimizer=optimizer,
        momentum=momentum,
        betas=list(betas),
        eps=eps,
        init=init,
        init_seeds=None if init_seeds is None else init_t.tolist(),
        batch_size=batch_size,
        seq_len=seq_len,
        num_steps=num_steps,
        snapshot_every=snapshot_every,
        population=population,
    )
    return YZRun(
        classes,
        torch.tensor(snap_steps),
        torch.stack(snaps_z),
        torch.stack(snaps_y),
        losses,
        lr_z_t,
        ratio_t,
        seeds_t,
        config,
    )
