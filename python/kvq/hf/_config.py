"""What kvq.hf reads from a model: the attention shape of its text config (layers, heads, head size, sliding
windows), its scale and soft-cap, and the keyword its forward takes a cache under; and the codec specs a
KVQCache is given ('KEY/VALUE' pairs, '+center' keys)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Mapping

from .._pairs import split_pair


def split_key_spec(spec: str) -> tuple[str, bool]:
    """'q4_0+rot+center' -> ('q4_0+rot', True): the codec name and whether keys are centered."""
    parts = spec.split("+")
    center = "center" in parts[1:]
    name = "+".join([parts[0]] + [p for p in parts[1:] if p != "center"])
    return name, center


def _pair(spec: str | tuple[str, str]) -> tuple[str, str]:
    if isinstance(spec, str):
        return split_pair(spec)
    k, v = spec
    return str(k), str(v)


def _layer_pairs(key_codec: str, value_codec: str, layer_codecs: Mapping[int, Any] | None,
                 n_layers: int) -> list[tuple[str, str]]:
    """Per layer: the (key, value) codec pair, key_codec/value_codec unless layer_codecs names the layer."""
    overrides = {int(l): _pair(p) for l, p in (layer_codecs or {}).items()}
    for l in overrides:
        if not 0 <= l < n_layers:
            raise ValueError(f"kvq.hf.KVQCache: layer_codecs names layer {l}; the model has {n_layers} layers")
    return [overrides.get(l, (key_codec, value_codec)) for l in range(n_layers)]


def _layer_windows(text_config) -> list[int]:
    """Per layer: 0 (full attention) or the sliding window in tokens, from layer_types/sliding_window."""
    n = text_config.num_hidden_layers
    types = getattr(text_config, "layer_types", None)
    window = getattr(text_config, "sliding_window", None)
    if getattr(text_config, "attention_chunk_size", None):
        raise ValueError("kvq.hf: chunked attention (attention_chunk_size) is not supported: kvq windows slide")
    if types is None:
        # Mistral and Qwen2 style: one sliding_window for all layers (None = full), Qwen2 only below
        # max_window_layers when use_sliding_window is set.
        if not window:
            return [0] * n
        if hasattr(text_config, "use_sliding_window") and not text_config.use_sliding_window:
            return [0] * n
        return [int(window)] * n
    if len(types) != n:
        raise ValueError(f"kvq.hf: config has {len(types)} layer_types for {n} layers")
    out = []
    for i, t in enumerate(types):
        if t == "full_attention":
            out.append(0)
        elif t == "sliding_attention":
            if not window:
                raise ValueError(f"kvq.hf: layer {i} is sliding_attention but the config has no sliding_window")
            out.append(int(window))
        else:
            raise ValueError(f"kvq.hf: layer {i} is of type {t!r}; kvq handles full_attention and sliding_attention")
    return out


@dataclass
class _AttentionShape:
    """The attention of a text config as kvq stores it: one window per layer (0 = full attention)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    windows: list[int]

    @classmethod
    def of(cls, text_config) -> "_AttentionShape":
        n_layers = int(text_config.num_hidden_layers)
        n_heads = int(text_config.num_attention_heads)
        n_kv = int(getattr(text_config, "num_key_value_heads", None) or n_heads)
        head_dim = int(getattr(text_config, "head_dim", None) or text_config.hidden_size // n_heads)
        windows = _layer_windows(text_config)
        if getattr(text_config, "kv_sharing_modes", None) or getattr(text_config, "num_kv_shared_layers", 0):
            raise ValueError("kvq.hf: models that share KV between layers are not supported")
        return cls(n_layers, n_heads, n_kv, head_dim, windows)


def _scale_and_softcap(text_config, head_dim: int, scale: float | None, softcap: float | None) -> tuple[float, float]:
    """The attention scale and logit soft-cap: the ones given, else the model's (Gemma's
    query_pre_attn_scalar, Gemma 2's attn_logit_softcapping), else 1/sqrt(head_dim) and none."""
    if scale is None:
        pre = getattr(text_config, "query_pre_attn_scalar", None)
        scale = float(pre) ** -0.5 if pre else head_dim ** -0.5
    if softcap is None:
        softcap = float(getattr(text_config, "attn_logit_softcapping", None) or 0.0)
    return scale, softcap


def cache_keyword(model) -> str:
    """The name under which this transformers version's forward/generate take a cache: ``cache`` (5.x; the old
    ``past_key_values`` is deprecated) or ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
