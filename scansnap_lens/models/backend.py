"""The few calls that differ between TransformerLens 3.x and 4.x, in one place.

Two backends build and hold models:

- ``"hooked"``: ``HookedTransformer`` (transformer-lens 3.x only; 4.x removed it);
- ``"bridge"``: ``TransformerBridge``: around a Hugging Face model
  (``boot_transformers``), or around TransformerLens's own native transformer built from a
  config (``boot_native``, present in 3.9 and 4.x).

The installed major picks the default (`default_backend`): ``"hooked"`` on 3.x, ``"bridge"``
on 4.x.  Everything else in the package asks this module, never ``transformer_lens`` directly,
which major it is on.

Weights of TransformerLens models come in two layouts, told apart by their keys:

- ``"tl"``: HookedTransformer's ``state_dict`` (``blocks.0.attn.W_Q`` of shape
  [n_heads, d_model, d_head], ...);
- ``"native"``: the native bridge's (``blocks.0.attn.q.weight`` of shape
  [n_heads * d_head, d_model], ...).

`tl_to_native` converts the first into the second, so a HookedTransformer checkpoint loads
on 4.x.

>>> state_layout({"embed.W_E": None, "blocks.0.attn.W_Q": None})
'tl'
>>> state_layout({"embed.weight": None, "blocks.0.attn.q.weight": None})
'native'
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import einops
import torch
from torch import nn

if TYPE_CHECKING:
    from scansnap_lens.inputs.tokens import TokenizerLike

__all__ = [
    "BACKENDS",
    "BackendError",
    "HookedModel",
    "build_model",
    "default_backend",
    "hf_bridge",
    "is_bridge",
    "is_hf_model",
    "load_weights",
    "make_config",
    "scratch_dir",
    "state_layout",
    "tl_major",
    "tl_to_native",
]

BACKENDS = ("hooked", "bridge")


@runtime_checkable
class HookedModel(Protocol):
    """What the recorder and the trainer use of a model: a HookedTransformer (3.x) or a
    TransformerBridge (3.9+ and 4.x) satisfies it; a Hugging Face causal LM is wrapped in a
    bridge first (`hf_bridge`).

    ``cfg`` carries ``n_layers``, ``n_heads``, ``d_head``, ``d_vocab`` (and, where set, the
    attention scale); hooks are named ``blocks.{L}.attn.hook_attn_scores`` /
    ``hook_pattern`` / ``hook_q`` / ``hook_k``.
    """

    cfg: Any

    def run_with_hooks(
        self,
        *model_args: Any,
        fwd_hooks: Sequence[tuple[str, Any]] = (),
        **model_kwargs: Any,
    ) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...


class BackendError(RuntimeError):
    """The installed TransformerLens cannot do what was asked; the message says what can."""


def tl_version() -> str:
    try:
        return version("transformer-lens")
    except PackageNotFoundError:  # an editable checkout without metadata
        import transformer_lens

        return getattr(transformer_lens, "__version__", "0")


def tl_major() -> int:
    """The installed TransformerLens major version (3 or 4)."""
    return int(re.match(r"\d+", tl_version()).group())


def default_backend() -> str:
    """``"hooked"`` on transformer-lens 3.x, ``"bridge"`` on 4.x (no HookedTransformer)."""
    return "hooked" if tl_major() < 4 else "bridge"


def resolve_backend(backend: str | None) -> str:
    """`backend`, or the installed major's default; a clear error for what it cannot do."""
    if backend is None:
        return default_backend()
    if backend not in BACKENDS:
        raise BackendError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "hooked" and tl_major() >= 4:
        raise BackendError(
            f"backend 'hooked' needs HookedTransformer, which transformer-lens {tl_version()}"
            " no longer has: use backend='bridge' (the default on 4.x), or"
            " install"
            " transformer-lens 3.x"
        )
    return backend


# ------------------------------------------------------------------ configs
def _dtype(value):
    if isinstance(value, str):
        name = value.removeprefix("torch.")
        if not isinstance(getattr(torch, name, None), torch.dtype):
            raise ValueError(f"unknown dtype {value!r}")
        return getattr(torch, name)
    return value


def config_fields(cfg_or_model) -> dict[str, Any]:
    """The JSON-able fields of a model's TransformerLens config (dtypes as strings)."""
    cfg = getattr(cfg_or_model, "cfg", cfg_or_model)
    raw = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
    out = {}
    for key, value in raw.items():
        if isinstance(value, torch.dtype):
            value = str(value).removeprefix("torch.")
        elif isinstance(value, torch.device):
            continue
        try:
            json.dumps(value)
        except TypeError:
            continue
        out[key] = value
    return out


# Fields a config computes itself, or that name a place rather than the model.
_DERIVED = ("n_params", "tokenizer_prepends_bos", "device", "n_devices", "model_name")


def make_config(fields: Mapping[str, Any], backend: str | None = None):
    """A HookedTransformerConfig ("hooked") or TransformerBridgeConfig ("bridge") from fields.

    Accepts what people write: ``cfg.to_dict()`` dumped with ``default=str`` (dtypes as
    ``"torch.float32"``), our own config files, or a hand-written dict of the main fields.
    Fields the target config does not have are dropped; a missing required field is an error
    that names it.
    """
    backend = resolve_backend(backend)
    data = {k: v for k, v in dict(fields).items() if k not in _DERIVED}
    if "dtype" in data:
        data["dtype"] = _dtype(data["dtype"])
    missing = [k for k in ("n_layers", "d_model", "n_ctx", "d_vocab") if data.get(k) is None]
    if "d_head" not in data and "n_heads" not in data:
        missing.append("d_head or n_heads")
    if missing:
        raise ValueError(f"the model config lacks {', '.join(missing)}")
    if backend == "hooked":
        from transformer_lens import HookedTransformerConfig

        known = {f.name for f in dataclasses.fields(HookedTransformerConfig) if f.init}
        return HookedTransformerConfig(**{k: v for k, v in data.items() if k in known})
    from transformer_lens.config import TransformerBridgeConfig

    data.setdefault("d_head", data["d_model"] // data.get("n_heads", 1))
    data.setdefault("n_heads", data["d_model"] // data["d_head"])
    data["architecture"] = "TransformerLensNative"
    if data.get("attn_only"):
        data["d_mlp"] = None
    return TransformerBridgeConfig.from_dict(data)


def build_model(fields: Mapping[str, Any], backend: str | None = None):
    """A freshly initialised model of this config: HookedTransformer or the native bridge."""
    backend = resolve_backend(backend)
    cfg = make_config(fields, backend)
    if backend == "hooked":
        from transformer_lens import HookedTransformer

        return HookedTransformer(cfg, move_to_device=False)
    import transformer_lens.model_bridge.sources.native  # noqa: F401  (attaches boot_native)
    from transformer_lens.model_bridge import TransformerBridge

    model = TransformerBridge.boot_native(cfg)
    _trainable_unembedding_bias(model)
    return model


def _trainable_unembedding_bias(model) -> None:
    """Make the native bridge's unembedding bias a parameter, as HookedTransformer's b_U is.

    TransformerLens 3.9 does so itself; 4.3 keeps a fixed zero bias (a buffer) where the
    native head has none, so the same config would train another model on each major (the
    demo's AUROC: 0.895 on 3.9, 0.885 on 4.3).  The state dict keeps its keys either way.
    """
    head = model.unembed.original_component
    bias = head._buffers.pop("bias", None)
    if bias is not None:
        head.bias = nn.Parameter(bias)


def state_layout(state: Mapping[str, Any]) -> str:
    """``"tl"`` (HookedTransformer keys), ``"native"`` (native bridge keys) or ``"other"``."""
    keys = list(state)
    if any(k.endswith((".W_Q", "._W_K", ".W_K", "embed.W_E")) for k in keys):
        return "tl"
    if any(re.search(r"blocks\.\d+\.attn\.q\.weight$", k) for k in keys):
        return "native"
    return "other"


_TL_TO_NATIVE = [  # old suffix, new suffix, einops pattern or None (as is) or "T"
    (".W_Q", ".q.weight", "h m d -> (h d) m"),
    ("._W_K", ".k.weight", "h m d -> (h d) m"),
    ("._W_V", ".v.weight", "h m d -> (h d) m"),
    (".W_K", ".k.weight", "h m d -> (h d) m"),
    (".W_V", ".v.weight", "h m d -> (h d) m"),
    (".W_O", ".o.weight", "h d m -> m (h d)"),
    (".b_Q", ".q.bias", "h d -> (h d)"),
    ("._b_K", ".k.bias", "h d -> (h d)"),
    ("._b_V", ".v.bias", "h d -> (h d)"),
    (".b_K", ".k.bias", "h d -> (h d)"),
    (".b_V", ".v.bias", "h d -> (h d)"),
    (".b_O", ".o.bias", None),
    (".W_in", ".in.weight", "T"),
    (".b_in", ".in.bias", None),
    (".W_out", ".out.weight", "T"),
    (".b_out", ".out.bias", None),
    (".W_gate", ".gate.weight", "T"),
    (".W_U", ".weight", "T"),
    (".b_U", ".bias", None),
    (".W_E", ".weight", None),
    (".W_pos", ".weight", None),
    (".w", ".weight", None),
    (".b", ".bias", None),
]


def tl_to_native(state: Mapping[str, torch.Tensor], strict: bool = True) -> dict[str, torch.Tensor]:
    """HookedTransformer weights in the native bridge's layout (causal-mask buffers dropped).

    strict: an unknown key is an error; otherwise it is kept as it is (to be reported).

    >>> W_Q = torch.arange(12.0).reshape(2, 3, 2)  # [n_heads, d_model, d_head]
    >>> tl_to_native({"blocks.0.attn.W_Q": W_Q})["blocks.0.attn.q.weight"].shape
    torch.Size([4, 3])
    """
    out = {}
    for key, tensor in state.items():
        if key.endswith(CONSTANT_BUFFERS):
            continue
        for old, new, pattern in _TL_TO_NATIVE:
            if key.endswith(old):
                if pattern == "T":
                    tensor = tensor.T.contiguous()
                elif pattern is not None:
                    tensor = einops.rearrange(tensor, pattern).contiguous()
                out[key[: -len(old)] + new] = tensor
                break
        else:
            if strict:
                raise ValueError(f"no native-bridge counterpart for the weight {key!r}")
            out[key] = tensor
    return out


def _key_summary(keys, limit: int = 8) -> str:
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def load_weights(
    model: HookedModel, state: Mapping[str, torch.Tensor], source: str = "checkpoint"
) -> None:
    """Load TL- or native-layout weights into a HookedTransformer or native bridge, strictly.

    A mismatch raises ValueError listing the missing and unexpected keys and the first shape
    that differs, not torch's whole message.
    """
    # Constants a model computes from its config, which files of TransformerLens 1.x-2.x carry
    # (the causal mask at [n_ctx, n_ctx] where 3.x keeps an empty one): the model's own count.
    state = {k: v for k, v in state.items() if not k.endswith(CONSTANT_BUFFERS)}
    if is_bridge(model) and state_layout(state) == "tl":
        state = tl_to_native(state, strict=False)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k}: {tuple(state[k].shape)} in the file, {tuple(own[k].shape)} in the model"
        for k in own
        if k in state and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    missing = [k for k in missing if not k.endswith(CONSTANT_BUFFERS)]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys: {_key_summary(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_key_summary(unexpected)}")
        if shapes:
            parts.append(f"shapes differ: {shapes[0]}")
        raise ValueError(f"{source}: the weights do not fit the model ({'; '.join(parts)})")
    model.load_state_dict(state, strict=False)


CONSTANT_BUFFERS = (".mask", ".IGNORE", ".rotary_sin", ".rotary_cos")


# ------------------------------------------------------------------ Hugging Face models
def is_bridge(model: object) -> bool:
    """A TransformerBridge (of either major), not a HookedTransformer."""
    return any(c.__name__ == "TransformerBridge" for c in type(model).__mro__)


def is_hf_model(model: object) -> bool:
    """A Hugging Face ``PreTrainedModel`` (not yet wrapped in a bridge)."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(model, PreTrainedModel)


def hf_bridge(
    hf_model: torch.nn.Module, tokenizer: TokenizerLike | None = None, name: str | None = None
) -> HookedModel:
    """A TransformerBridge around a Hugging Face causal LM.

    Booting rewrites the module in place, so pass a copy of a model you keep training.
    """
    from transformer_lens.model_bridge import TransformerBridge

    if tokenizer is None:
        tokenizer = _placeholder_tokenizer(hf_model.config.vocab_size)
    name = name or getattr(hf_model.config, "_name_or_path", "") or hf_model.config.model_type
    return TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=tokenizer)


def _placeholder_tokenizer(vocab_size: int):
    """A word-level tokenizer ``<0> .. <V-1>``: the bridge wants one, a recording needs none."""
    import tokenizers
    import transformers
    from tokenizers.models import WordLevel

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<0>", eos_token="<0>", unk_token="<0>"
    )
    # The bridge re-creates tokenizers from their saved name later, so keep one on disk.
    if vocab_size not in _PLACEHOLDER_DIRS:
        _PLACEHOLDER_DIRS[vocab_size] = scratch_dir("scansnap_tok_")
        fast.save_pretrained(_PLACEHOLDER_DIRS[vocab_size])  # into its own mkdtemp folder
    return transformers.AutoTokenizer.from_pretrained(_PLACEHOLDER_DIRS[vocab_size])


_PLACEHOLDER_DIRS: dict[int, str] = {}


def scratch_dir(prefix: str) -> str:
    """A temporary folder that lives as long as the process (removed at exit, not left in the
    user's temp folder)."""
    import atexit
    import shutil

    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def attention_logit_parameters(model: nn.Module) -> tuple[list, list]:
    """(parameters that form the attention logits: W_Q, W_K and their biases; the rest).

    Works on HookedTransformer names (``attn.W_Q``), the native bridge's (``attn...q...``)
    and Hugging Face bridges with separate projections (``q_proj``, ``k_proj``).
    """
    qk, rest = [], []
    pattern = re.compile(
        r"attn\.(_?[Wb]_[QK])$"  # HookedTransformer
        r"|attn(\._original_component)?\.(q|k)(\._original_component)?\.(weight|bias)$"
        r"|\.(q_proj|k_proj)(\._original_component)?\.(weight|bias)$"
    )
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (qk if pattern.search(name) else rest).append(param)
    return qk, rest


def positional_parameter(model: nn.Module) -> nn.Parameter | None:
    """The learned positional embedding (W_pos), or None when the model has none."""
    for name, param in model.named_parameters():
        if re.search(r"(^|\.)(pos_embed\.W_pos|pos(\._original_component)?\.weight)$", name):
            return param
    return None
