"""Key channel weights from a model's weights (KVQCache(key_scales=...)): where the queries look, the keys'
rounding error should be small. A model that RMS-normalizes queries and keys per head (Gemma 3, Qwen 3,
OLMo 2: q_norm and k_norm) gives each channel j a query gain g_q,j and a key gain g_k,j; with
s_j = (g_q,j² / g_k,j²)^(1/4) the keys are stored as k ⊙ s and the queries attend as q ⊘ s, which balances
the channels' shares of q·k's error as the second moments E[q_j²] / E[k_j²] would (the gains stand for them,
no calibration text). RoPE rotates channel pairs (j, j + d/2) into each other, so a pair shares one weight
(the squared gains averaged over the pair) and the scaling commutes with it. The same definition as
scripts/experiments/format_study.py's +qkw."""

from __future__ import annotations

import numpy as np


def _gain(norm) -> np.ndarray | None:
    w = getattr(norm, "weight", None)
    if w is None:
        return None
    w = w.detach().float().cpu().numpy().astype(np.float64)
    # Gemma's RMSNorm multiplies by (1 + weight); the others (Qwen 3, OLMo 2) by the weight.
    return 1.0 + w if "gemma" in type(norm).__name__.lower() else w


def key_scales_from_norms(model) -> list[np.ndarray]:
    """Per layer an (n_kv_heads, head_dim) float32 array s for KVQCache(key_scales=...), from the layer's
    q_norm and k_norm weights; ValueError for a model without them."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None and hasattr(model, "model"):
        layers = getattr(getattr(model.model, "language_model", None), "layers", None)
    if layers is None:
        raise ValueError("key_scales_from_norms: no decoder layers found on the model")
    n_kv = int(config.num_key_value_heads)
    out = []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        gq, gk = _gain(getattr(attn, "q_norm", None)), _gain(getattr(attn, "k_norm", None))
        if gq is None or gk is None:
            raise ValueError(f"key_scales_from_norms: layer {i} has no q_norm and k_norm (per-head query and key "
                             "norms): the weights say nothing of the channels' shares")
        if gq.shape != gk.shape or gq.ndim != 1 or gq.size % 2:
            raise ValueError(f"key_scales_from_norms: layer {i}'s q_norm and k_norm are not one per-head vector")
        # Squared gains averaged over each RoPE pair, the ratio floored (a gain of 0 is a channel that is always
        # 0, or never looked at), s normalized to a geometric mean of 1.
        half = gq.size // 2
        pair = lambda g2: np.tile(0.5 * (g2[:half] + g2[half:]), 2)
        s = (np.maximum(pair(gq**2), 1e-12) / np.maximum(pair(gk**2), 1e-12)) ** 0.25
        s = s / np.exp(np.mean(np.log(s)))
        out.append(np.tile(s.astype(np.float32), (n_kv, 1)))
    return out
