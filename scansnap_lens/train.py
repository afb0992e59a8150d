"""Train small TransformerLens models with the paper's two learning rates, saving checkpoints.

The attention logits (W_Q, W_K and their biases) learn at ``lr_attention`` (the paper's eta_Z)
and everything else at ``lr`` (eta_Y).  Checkpoints go to ``out/step_000000100.safetensors``
with the *global* step in the name (TransformerLens's own trainer restarts its counter every
epoch and overwrites files) and the model's ``config.json`` beside them, the layout
`checkpoints.folder` reads back.

>>> model = attention_only_model(vocab_size=34, d_model=32, n_heads=1, n_ctx=16)
>>> schedule(100, "log:5")
[0, 2, 9, 31, 100]
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor
from tqdm.auto import tqdm

from .checkpoints import config_to_json

__all__ = ["TrainResult", "attention_only_model", "schedule", "train"]


def attention_only_model(
    vocab_size: int,
    d_model: int = 64,
    n_heads: int = 1,
    n_layers: int = 1,
    n_ctx: int = 128,
    positional: bool = False,
    seed: int = 0,
    **cfg_kwargs,
):
    """An attention-only HookedTransformer; ``positional=False`` zeroes and freezes W_pos."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_head=cfg_kwargs.pop("d_head", d_model // n_heads),
        d_vocab=vocab_size,
        n_ctx=n_ctx,
        attn_only=True,
        act_fn=cfg_kwargs.pop("act_fn", "relu"),
        normalization_type=cfg_kwargs.pop("normalization_type", "LN"),
        seed=seed,
        **cfg_kwargs,
    )
    model = HookedTransformer(cfg)
    if not positional:
        remove_positions(model)
    return model


def remove_positions(model) -> None:
    """Zero W_pos and freeze it: the model then sees a bag of tokens, as in the paper."""
    with torch.no_grad():
        model.pos_embed.W_pos.zero_()
    model.pos_embed.W_pos.requires_grad_(False)


def schedule(steps: int, every: int | str | Iterable[int] = "log:20") -> list[int]:
    """Checkpoint steps in [0, steps]: every k steps, "log:n" (about n log-spaced), or a list.

    Step 0 (the initial weights) and the last step are always included.
    """
    if isinstance(every, int):
        if every < 1:
            raise ValueError(f"checkpoint interval must be >= 1, got {every}")
        chosen = set(range(0, steps + 1, every))
    elif isinstance(every, str):
        match = re.fullmatch(r"log:(\d+)", every)
        if not match:
            raise ValueError(f"schedule must be an int, 'log:N' or a list, got {every!r}")
        n = max(int(match.group(1)), 2)
        chosen = {round(math.exp(i * math.log(steps + 1) / (n - 1))) - 1 for i in range(n)}
    else:
        chosen = {int(s) for s in every}
        bad = [s for s in chosen if not 0 <= s <= steps]
        if bad:
            raise ValueError(f"checkpoint steps {sorted(bad)} lie outside [0, {steps}]")
    return sorted(chosen | {0, steps})


@dataclass
class TrainResult:
    """Losses of every step and the checkpoints written (step -> file)."""

    loss: list[float]
    checkpoints: dict[int, str] = field(default_factory=dict)
    out: str | None = None

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame({"step": range(1, len(self.loss) + 1), "loss": self.loss})


def _param_groups(model, lr: float, lr_attention: float, weight_decay: float):
    attention, rest = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_qk = re.search(r"attn\.(W_Q|W_K|b_Q|b_K|_W_K|_W_Q|_b_K|_b_Q)$", name)
        (attention if is_qk else rest).append(param)
    if not attention:
        raise ValueError("the model has no W_Q / W_K parameters to give the attention rate")
    return [
        {"params": attention, "lr": lr_attention, "weight_decay": weight_decay},
        {"params": rest, "lr": lr, "weight_decay": weight_decay},
    ]


def _sampler(data, batch_size: int, generator: torch.Generator) -> Callable[[], Tensor]:
    if callable(data):
        return lambda: data(batch_size, generator)
    if not isinstance(data, Tensor):
        column = "tokens" if "tokens" in getattr(data, "column_names", []) else "input_ids"
        data = torch.as_tensor(np.stack(data.with_format("numpy")[column]))
    if data.ndim != 2 or data.shape[0] == 0:
        raise ValueError(
            f"training tokens must be a non-empty [N, T] tensor, got {tuple(data.shape)}"
        )

    def sample():
        rows = torch.randint(0, data.shape[0], (batch_size,), generator=generator)
        return data[rows]

    return sample


def train(
    model,
    data,
    steps: int,
    out: str | Path | None = None,
    lr: float = 1.0,
    lr_attention: float | None = None,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    batch_size: int = 32,
    checkpoints: int | str | Iterable[int] = "log:20",
    loss_on: str = "all",
    seed: int = 0,
    device=None,
    progress: bool = True,
    on_checkpoint: Callable[[int, object], None] | None = None,
) -> TrainResult:
    """Train `model` for `steps` steps of next-token prediction, saving checkpoints.

    data: token tensor [N, T] (rows sampled with replacement), a `datasets.Dataset` with a
        ``tokens`` or ``input_ids`` column, or a callable ``(batch_size, generator) -> [B, T]``.
    lr, lr_attention: eta_Y (all parameters but W_Q, W_K) and eta_Z (W_Q, W_K); equal by default.
    optimizer: "sgd" (with `momentum`) or "adam".
    loss_on: "all" positions, or "last": only the prediction of the final token (the paper's
        setup, where the final token is the next token n of the query before it).
    checkpoints: schedule of steps to save (see `schedule`); step 0 is the initial model.
    on_checkpoint: called as ``on_checkpoint(step, model)`` at every scheduled step, e.g.
        ``Recorder.on_checkpoint`` to record without saving weights.
    """
    if loss_on not in ("all", "last"):
        raise ValueError(f"loss_on must be 'all' or 'last', got {loss_on!r}")
    lr_attention = lr if lr_attention is None else lr_attention
    device = device or next(model.parameters()).device
    model.to(device)
    groups = _param_groups(model, lr, lr_attention, weight_decay)
    if optimizer == "sgd":
        opt = torch.optim.SGD(groups, momentum=momentum)
    elif optimizer == "adam":
        opt = torch.optim.Adam(groups)
    else:
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    generator = torch.Generator().manual_seed(seed)
    sample = _sampler(data, batch_size, generator)
    save_at = set(schedule(steps, checkpoints))
    result = TrainResult(loss=[], out=None if out is None else str(out))
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(config_to_json(model.cfg), indent=1))

    def checkpoint(step: int) -> None:
        if out is not None:
            file = out / f"step_{step:09d}.safetensors"
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            tmp = file.with_name(file.name + ".tmp")
            save_file(state, str(tmp), metadata={"step": str(step)})
            tmp.replace(file)
            result.checkpoints[step] = str(file)
        if on_checkpoint is not None:
            on_checkpoint(step, model)
            model.train()

    model.train()
    if 0 in save_at:
        checkpoint(0)
    bar = tqdm(range(1, steps + 1), desc="train", unit="step", disable=not progress)
    for step in bar:
        tokens = sample().to(device)
        if int(tokens.max()) >= model.cfg.d_vocab or int(tokens.min()) < 0:
            raise ValueError(
                f"training token ids must lie in [0, {model.cfg.d_vocab}), got"
                f" {int(tokens.min())}..{int(tokens.max())}"
            )
        logits = model(tokens[:, :-1], return_type="logits")
        if loss_on == "last":
            loss = F.cross_entropy(logits[:, -1].float(), tokens[:, -1])
        else:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        result.loss.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{result.loss[-1]:.3f}")
        if step in save_at:
            checkpoint(step)
    model.eval()
    return result
