"""The attention function registered as "kvq": it takes the keys a KVQCache's update handed on, checks that
the layer asks for what the cache was made with, and has the cache store them and attend on the codes."""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "kvq"

# update() hands a layer's new keys to the attention function through this table, keyed by the id of the
# key tensor the model passes on (it stays alive, so the id is unique until the entry is taken).
_PENDING: dict[int, tuple[Any, int, torch.Tensor]] = {}


def kvq_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                  sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """transformers attention function "kvq": stores the layer's new keys/values in the KVQCache that
    received them and computes attention on the stored codes. Returns (output (batch, q, heads, head_dim),
    None)."""
    entry = _PENDING.pop(id(key), None)
    if entry is None or entry[2] is not key:
        raise ValueError("kvq attention: these keys did not come from a kvq.hf.KVQCache; call generate() (which "
                         "makes one), or pass cache=kvq.hf.KVQCache(model.config, ...) with use_cache=True")
    cache, layer_idx, _ = entry
    if getattr(module, "layer_idx", layer_idx) != layer_idx:
        raise ValueError(f"kvq attention: module of layer {module.layer_idx} got the keys of layer {layer_idx}")
    try:
        if dropout and getattr(module, "training", False):
            raise ValueError("kvq attention: dropout / training is not supported (call model.eval())")
        if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
            raise ValueError("kvq attention: attention sinks (s_aux) are not supported")
        want = scaling if scaling is not None else cache.head_dim ** -0.5
        if not math.isclose(float(want), cache.scale, rel_tol=1e-6):
            raise ValueError(f"kvq attention: layer {layer_idx} asks for scaling {want}, the KVQCache was made with "
                             f"scale {cache.scale}; pass scale={want} to KVQCache")
        cap = float(softcap or 0.0)
        if not math.isclose(cap, cache.softcap, rel_tol=1e-6):
            raise ValueError(f"kvq attention: layer {layer_idx} asks for softcap {softcap}, the KVQCache has "
                             f"{cache.softcap}; pass softcap= to KVQCache")
        w = int(sliding_window or 0)
        if w != cache.windows[layer_idx]:
            raise ValueError(f"kvq attention: layer {layer_idx} asks for a sliding window of {sliding_window}, the "
                             f"KVQCache has {cache.windows[layer_idx] or None} from the config")
        out = cache._attend(layer_idx, query, key, value, attention_mask)
    except Exception as e:
        # This forward's earlier layers have stored their tokens, this one has not: the cache is out of step.
        cache._failed = cache._failed or f"{type(e).__name__}: {e}"
        raise
    finally:
        cache.layers[layer_idx].pending = None
    return out, None


def register() -> None:
    AttentionInterface.register(ATTN_IMPLEMENTATION, kvq_attention)
    # The boolean (batch, 1, q, kv) masks of sdpa; None when attention is plainly causal without padding.
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
