"""Train small TransformerLens models with the paper's two learning rates, saving checkpoints.

The attention logits (W_Q, W_K and their biases) learn at ``lr_z`` (the paper's eta_Z) and
everything else at ``lr_y`` (eta_Y).  Checkpoints go to ``out/step_000000100.safetensors``
with the *global* step in the name (TransformerLens's own trainer restarts its counter every
epoch and overwrites files) and the model's ``config.json`` beside them, the layout
`checkpoints.folder` reads back.

>>> model = attention_only_model(vocab_size=34, d_model=32, n_heads=1, n_ctx=16)
>>> schedule(100, "log:5")
[0, 2, 9, 31, 100]
"""

from __future__ import annotations

import inspect
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
from torch import Tensor
from tqdm.auto import tqdm

from scansnap_lens._io import make_folder, write_tensors, write_text
from scansnap_lens._settings import Settings, fraction, positive, setting
from scansnap_lens.models.backend import (
    HookedModel,
    attention_logit_parameters,
    build_model,
    config_fields,
    is_bridge,
    load_weights,
    positional_parameter,
)
from scansnap_lens.models.steps import select_steps

__all__ = ["Rates", "TrainResult", "attention_only_model", "schedule", "train"]


def attention_only_model(
    vocab_size: int,
    d_model: int = 64,
    n_heads: int = 1,
    n_layers: int = 1,
    n_ctx: int = 128,
    positional: bool = False,
    seed: int = 0,
    backend: str | None = None,
    **cfg_kwargs,
):
    """An attention-only transformer; ``positional=False`` zeroes and freezes W_pos.

    backend: "hooked" (a HookedTransformer, transformer-lens 3.x) or "bridge" (a
    TransformerBridge around TransformerLens's native transformer, 3.9+ and 4.x); default: the
    installed major's (`backend.default_backend`).  The two compute the same function of the
    same weights (tested).  They differ in:

    - nothing in the weights: both start from `initial_weights` for the seed;
    - the bridge's ``hook_attn_scores`` carries the softmax pattern; the recorder rebuilds
      the scores from ``hook_q`` and ``hook_k`` (same values, one more hook per layer);
    - the bridge's weights are saved in the native layout (``blocks.0.attn.q.weight``), the
      HookedTransformer's in TransformerLens's (``blocks.0.attn.W_Q``); both load on both.
    """
    fields = dict(
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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(fields, backend)
    load_weights(model, initial_weights(fields, seed), "initial weights")
    if not positional:
        remove_positions(model)
    return model


def initial_weights(fields: dict, seed: int) -> dict[str, Tensor]:
    """HookedTransformer's "gpt2" initialisation of an attention-only model, in its layout.

    Every W_* is Normal(0, 0.8 / sqrt(d_model)), biases are 0 and LayerNorm scales 1, drawn in
    HookedTransformer's own order from a generator seeded with `seed`: the weights that
    ``HookedTransformer(cfg)`` with ``cfg.seed = seed`` starts from, on either backend.
    """
    V, D, T = fields["d_vocab"], fields["d_model"], fields["n_ctx"]
    H, d = fields["n_heads"], fields["d_head"]
    g = torch.Generator().manual_seed(seed)
    std = 0.8 / math.sqrt(D)

    def normal(*shape):
        return torch.empty(*shape).normal_(std=std, generator=g)

    state = {"embed.W_E": normal(V, D), "pos_embed.W_pos": normal(T, D)}
    with_ln = fields.get("normalization_type") == "LN"
    for i in range(fields["n_layers"]):
        attn = f"blocks.{i}.attn"
        state[f"{attn}.W_Q"], state[f"{attn}.W_O"] = normal(H, D, d), normal(H, d, D)
        state[f"{attn}.W_K"], state[f"{attn}.W_V"] = normal(H, D, d), normal(H, D, d)
        for name in ("b_Q", "b_K", "b_V"):
            state[f"{attn}.{name}"] = torch.zeros(H, d)
        state[f"{attn}.b_O"] = torch.zeros(D)
        if with_ln:
            state[f"blocks.{i}.ln1.w"], state[f"blocks.{i}.ln1.b"] = torch.ones(D), torch.zeros(D)
    if with_ln:
        state["ln_final.w"], state["ln_final.b"] = torch.ones(D), torch.zeros(D)
    state["unembed.W_U"], state["unembed.b_U"] = normal(D, V), torch.zeros(V)
    return state


def remove_positions(model: HookedModel) -> None:
    """Zero W_pos and freeze it: the model then sees a bag of tokens, as in the paper."""
    pos = positional_parameter(model)
    if pos is None:
        raise ValueError("the model has no learned positional embedding to remove")
    with torch.no_grad():
        pos.zero_()
    pos.requires_grad_(False)


def schedule(num_steps: int, every: int | str | Iterable[int] = "log:20") -> list[int]:
    """The steps in [0, num_steps] at which training saves a checkpoint, chosen by
    `steps.select_steps` among 0..num_steps: every k-th (an int k: every k steps), "log:N" or a
    list.  Step 0 (the initial weights) and the last step are always included."""
    return sorted(set(select_steps(range(num_steps + 1), every)) | {0, num_steps})


CONFIG_FORMAT = "scansnap_lens.model/2"
TRAINING_FILE = "training.json"  # the rates, optimizer and momentum, beside the checkpoints


def _accepts_training(callback) -> bool:
    try:
        return "training" in inspect.signature(callback).parameters
    except (TypeError, ValueError):
        return False


def model_config_json(model: HookedModel) -> dict:
    """What `checkpoints.folder` needs to rebuild `model`: its config fields and weight layout."""
    return {
        "format": CONFIG_FORMAT,
        "layout": "native" if is_bridge(model) else "tl",
        "config": config_fields(model),
    }


@dataclass
class TrainResult:
    """Losses of every step and the checkpoints written (step -> file)."""

    loss: list[float]
    checkpoints: dict[int, str] = field(default_factory=dict)
    out: str | None = None

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame({"step": range(1, len(self.loss) + 1), "loss": self.loss})


def _param_groups(
    model, lr_y: float, lr_z: float, weight_decay: float, lr_by_name: dict[str, float] | None = None
):
    """Optimizer groups: eta_Z for the attention logits' parameters, eta_Y for the rest, and
    for parameters whose name matches a pattern of `lr_by_name` (``re.search``, the first
    pattern that matches) that pattern's rate.  Names are the model's state-dict keys, those
    its checkpoints are saved under (``blocks.0.mlp.W_in`` on a HookedTransformer,
    ``blocks.0.mlp.in.weight`` on a bridge)."""
    attention, rest = attention_logit_parameters(model)
    if not attention:
        raise ValueError("the model has no W_Q / W_K parameters to give the attention rate")
    groups = [{"params": attention, "lr": lr_z}, {"params": rest, "lr": lr_y}]
    if lr_by_name:
        names = {id(p): n for n, p in model.named_parameters()}
        names.update(  # a bridge's state-dict keys differ from its module paths
            {id(v): k for k, v in model.state_dict(keep_vars=True).items() if id(v) in names}
        )
        chosen: dict[str, list] = {pattern: [] for pattern in lr_by_name}
        for group in groups:
            kept = []
            for param in group["params"]:
                pattern = next((q for q in lr_by_name if re.search(q, names[id(param)])), None)
                (chosen[pattern] if pattern is not None else kept).append(param)
            group["params"] = kept
        unused = [q for q, params in chosen.items() if not params]
        if unused:
            some = ", ".join(list(names.values())[:6])
            raise ValueError(
                f"lr_by_name: no parameter name matches {unused} (names look like {some}, ...)"
            )
        groups += [{"params": chosen[q], "lr": float(lr)} for q, lr in lr_by_name.items()]
    return [{**g, "weight_decay": weight_decay} for g in groups if g["params"]]


OPTIMIZERS = ("sgd", "adam")
TRAINING = "how the run was trained (the theory's rates; lr_y= and lr_z= go together)"


@dataclass(frozen=True)
class Rates(Settings):
    """How a model was trained, as far as the theory needs it: the paper's eta_Y (``lr_y``:
    every parameter but W_Q, W_K), eta_Z (``lr_z``: W_Q, W_K), the optimizer and SGD's
    momentum.  The one value that `train` writes (``training.json``, the trajectory's meta),
    the command line's ``--lr-y``/``--lr-z`` build, and `measures.rates` reads.

    >>> Rates.of_meta({"lr_y": 0.1, "lr_z": 3, "loss_on": "last"}).to_dict()
    {'lr_y': 0.1, 'lr_z': 3.0, 'optimizer': 'sgd', 'momentum': 0.0}
    >>> Rates.of_meta({"lr_y": "fast", "lr_z": 3}, where="training.json")
    Traceback (most recent call last):
    ValueError: training.json: lr_y must be a finite number >= 0, got 'fast'
    """

    lr_y: float = setting(
        group=TRAINING,
        help="the training's rate of all but W_Q, W_K (eta_Y; default: what the"
        " trajectory recorded)",
        reads=positive,
    )
    lr_z: float = setting(
        group=TRAINING, help="the training's rate of W_Q, W_K (eta_Z)", reads=positive
    )
    optimizer: str = setting("sgd", TRAINING, "the training's optimizer", choices=OPTIMIZERS)
    momentum: float = setting(0.0, TRAINING, "SGD momentum in [0, 1)", reads=fraction)

    def __post_init__(self) -> None:
        _checked_rates(
            {f: getattr(self, f) for f in ("lr_y", "lr_z", "optimizer", "momentum")}, "Rates"
        )

    @classmethod
    def of(
        cls,
        lr_y=None,
        lr_z=None,
        optimizer: str = "sgd",
        momentum: float = 0.0,
        default_y: float = 1.0,
        default_z: float | None = None,
    ) -> Rates:
        """``lr_y`` (default `default_y`) and ``lr_z`` (default `default_z`, else eta_Y);
        momentum counts for SGD only."""
        lr_y = default_y if lr_y is None else lr_y
        lr_z = default_z if lr_z is None else lr_z
        momentum = float(momentum) if optimizer == "sgd" else 0.0
        return cls(float(lr_y), float(lr_y if lr_z is None else lr_z), optimizer, momentum)

    @classmethod
    def of_meta(cls, values: dict, where: str = "training") -> Rates:
        """The rates a run's description holds (a trajectory's meta, ``training.json``): its
        ``lr_y`` and ``lr_z`` (needed), optimizer and momentum, the rest of it left aside;
        ValueError naming `where` and the field for anything else."""
        return cls(*_checked_rates(values, where))


def _checked_rates(values: dict, where: str) -> tuple[float, float, str, float]:
    missing = [k for k in ("lr_y", "lr_z") if k not in values]
    if missing:
        raise ValueError(f"{where}: needs {' and '.join(missing)} (the paper's eta_Y, eta_Z)")
    rates = []
    for key in ("lr_y", "lr_z"):
        value = values[key]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:  # 0 freezes those weights
            raise ValueError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
        rates.append(float(value))
    optimizer = values.get("optimizer", "sgd")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"{where}: optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    momentum = values.get("momentum", 0.0)
    number = isinstance(momentum, int | float) and not isinstance(momentum, bool)
    if not number or not 0 <= momentum < 1:
        raise ValueError(f"{where}: momentum must lie in [0, 1), got {momentum!r}")
    return rates[0], rates[1], optimizer, float(momentum)


def _stream_batches(stream: Tensor, batch_size: int, bptt: int) -> Callable[[], Tensor]:
    """The PyTorch tutorial's batching of a token stream [L]: cut into `batch_size` columns
    read in parallel, each step the next `bptt` + 1 positions of every column (the last of
    one window is the first of the next), from the start again after an epoch."""
    columns = stream.numel() // batch_size
    if columns < bptt + 1:
        raise ValueError(
            f"a stream of {stream.numel()} tokens in {batch_size} columns leaves {columns}"
            f" positions each, fewer than bptt + 1 = {bptt + 1}"
        )
    grid = stream[: columns * batch_size].reshape(batch_size, columns)  # batchify
    starts = range(0, columns - bptt, bptt)
    position = iter(())

    def sample():
        nonlocal position
        start = next(position, None)
        if start is None:  # a new epoch
            position = iter(starts)
            start = next(position)
        return grid[:, start : start + bptt + 1]

    return sample


def _sampler(
    data, batch_size: int, generator: torch.Generator, bptt: int | None = None
) -> Callable[[], Tensor]:
    if bptt is not None:
        stream = torch.as_tensor(data)
        if stream.ndim != 1:
            raise ValueError(f"bptt batching reads a 1-D token stream, got {tuple(stream.shape)}")
        return _stream_batches(stream, batch_size, bptt)
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


def _check_training(loss_on: str, optimizer: str, clip_grad_norm, bptt) -> None:
    if loss_on not in ("all", "last"):
        raise ValueError(f"loss_on must be 'all' or 'last', got {loss_on!r}")
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
    if clip_grad_norm is not None and not clip_grad_norm > 0:
        raise ValueError(f"clip_grad_norm must be positive, got {clip_grad_norm}")
    if bptt is not None and bptt < 1:
        raise ValueError(f"bptt must be >= 1, got {bptt}")


def _step(model, opt, tokens: Tensor, loss_on: str, clip_grad_norm: float | None) -> float:
    """One optimizer step of next-token prediction on `tokens` [B, T]; its loss."""
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
    if clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
    opt.step()
    return loss.item()


def _checkpointer(
    model, out, on_checkpoint, training: dict, result: TrainResult
) -> Callable[[int], None]:
    """What `train` calls at a scheduled step: the weights saved in `out` (with the model's
    config and `training` once, now) and `on_checkpoint` called."""
    if out is not None:
        out = Path(out)
        make_folder(out)
        write_text(out / "config.json", json.dumps(model_config_json(model), indent=1))
        write_text(out / TRAINING_FILE, json.dumps(training, indent=1))
    pass_training = on_checkpoint is not None and _accepts_training(on_checkpoint)

    def checkpoint(step: int) -> None:
        if out is not None:
            file = out / f"step_{step:09d}.safetensors"
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            write_tensors(file, state, {"step": str(step)})
            result.checkpoints[step] = str(file)
        if on_checkpoint is not None:
            if pass_training:
                on_checkpoint(step, model, training=training)
            else:
                on_checkpoint(step, model)
            model.train()

    return checkpoint


def train(
    model: HookedModel,
    data,
    num_steps: int,
    out: str | Path | None = None,
    lr_y: float | None = None,
    lr_z: float | None = None,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    batch_size: int = 32,
    save_steps: int | str | Iterable[int] = "log:20",
    loss_on: str = "all",
    seed: int = 0,
    device=None,
    progress: bool = True,
    on_checkpoint: Callable[[int, object], None] | None = None,
    clip_grad_norm: float | None = None,
    lr_by_name: dict[str, float] | None = None,
    bptt: int | None = None,
) -> TrainResult:
    r"""Train `model` for `num_steps` steps of next-token prediction, saving checkpoints.

    data: token tensor [N, T] (rows sampled with replacement), a `datasets.Dataset` with a
        ``tokens`` or ``input_ids`` column, or a callable ``(batch_size, generator) -> [B, T]``.
    lr_y, lr_z: eta_Y (all parameters but W_Q, W_K; default 1) and eta_Z (W_Q, W_K; default
        eta_Y).
    optimizer: "sgd" (with `momentum`) or "adam".
    loss_on: "all" positions, or "last": only the prediction of the final token (the paper's
        setup, where the final token is the next token n of the query before it).
    save_steps: the steps to save (see `schedule`); step 0 is the initial model.  Or an object
        that chooses as training goes (``wants(step) -> bool``, e.g.
        `planning.placement.AdaptiveSchedule`, also passed as `on_checkpoint`).
    clip_grad_norm: clip the gradients' global norm to this before each step.
    lr_by_name: {name pattern: rate} for parameters whose name matches (``re.search``; the
        first pattern wins), beyond the eta_Y / eta_Z split, e.g. ``{r"mlp\.W_in": 10.0}``.
    seed: the batches' order, kept as ``data_seed`` in the trajectory's meta with the model's
        ``cfg.seed`` as ``init_seed`` (the runs page reads which runs share what from them).
    bptt: `data` is one token stream [L], read as the PyTorch tutorial reads it: `batch_size`
        contiguous columns, `bptt` positions a step (see `_stream_batches`).
    Dropout is on while training wherever the model has it (bridges over Hugging Face
    models; TransformerLens's own models have none) and off while recording.
    on_checkpoint: called as ``on_checkpoint(step, model)`` at every scheduled step, e.g.
        ``Recorder.on_checkpoint`` to record without saving weights; a callback with a
        ``training`` parameter also gets the rates (``lr_y``, ``lr_z``), optimizer and momentum,
        which the recorder keeps in the trajectory's meta (and `out` gets ``training.json``).
    """
    _check_training(loss_on, optimizer, clip_grad_norm, bptt)
    rates = Rates.of(lr_y, lr_z, optimizer, momentum)
    device = device or next(model.parameters()).device
    model.to(device)
    groups = _param_groups(model, rates.lr_y, rates.lr_z, weight_decay, lr_by_name)
    opt = (
        torch.optim.SGD(groups, momentum=momentum)
        if optimizer == "sgd"
        else torch.optim.Adam(groups)
    )
    generator = torch.Generator().manual_seed(seed)
    sample = _sampler(data, batch_size, generator, bptt)
    chooses = hasattr(save_steps, "wants")
    save_at = set() if chooses else set(schedule(num_steps, save_steps))
    result = TrainResult(loss=[], out=None if out is None else str(out))
    training = {
        **rates.to_dict(),
        "loss_on": loss_on,  # which positions the loss averages over (`fit.theory_fit`)
        "data_seed": seed,  # the batches' order; with init_seed, what runs share (runs page)
    }
    init_seed = getattr(getattr(model, "cfg", None), "seed", None)
    if isinstance(init_seed, int) and not isinstance(init_seed, bool):
        training["init_seed"] = init_seed
    extras = {"clip_grad_norm": clip_grad_norm, "lr_by_name": lr_by_name, "bptt": bptt}
    training.update({k: v for k, v in extras.items() if v is not None})
    checkpoint = _checkpointer(model, out, on_checkpoint, training, result)
    model.train()
    if 0 in save_at or chooses:
        checkpoint(0)
    bar = tqdm(range(1, num_steps + 1), desc="train", unit="step", disable=not progress)
    for step in bar:
        result.loss.append(_step(model, opt, sample().to(device), loss_on, clip_grad_norm))
        if step % 10 == 0:
            bar.set_postfix(loss=f"{result.loss[-1]:.3f}")
        if step in save_at or (chooses and save_steps.wants(step)):
            checkpoint(step)
    model.eval()
    return result
