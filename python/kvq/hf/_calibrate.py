"""Key channel weights from a calibration prompt (KVQCache(key_scales=...)): one prefill of the prompt on an
f32 cache records, per layer, kv head and channel, the second moments of the queries and of the keys as
attention sees them (after RoPE); the weight s_j = (E[q_j²] / E[k_j²])^(1/4) then puts the keys' rounding
error where the queries look least: keys are stored as k ⊙ s and queries attend as q ⊘ s, the same scores.
After a rotation the rounding error is white, so a score's error is ∝ |k ⊙ s|²·|q ⊘ s|², smallest
(Cauchy–Schwarz) at this s. A centered key format rounds k minus its block's mean: its moment is E[(k − mean)²]
over the same blocks (``centered=True``). The statistics are model- and layer-specific, not text-specific:
docs/eval.md measured two calibration texts of different kinds within a few percent of each other.
kvq.hf.key_scales_from_norms gives a weights-only stand-in without a prompt (about half the gain on
Gemma 3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._cache import KVQCache


class KeyMoments:
    """Per layer, (n_kv_heads, head_dim) float64 means of q² (over the kv head's query heads), k² and
    (k − block mean)² (full blocks of ``block_tokens`` only), and the token counts behind them."""

    def __init__(self, n_layers: int, block_tokens: int):
        self.block_tokens = block_tokens
        self.q2: list[np.ndarray | None] = [None] * n_layers
        self.k2: list[np.ndarray | None] = [None] * n_layers
        self.kc2: list[np.ndarray | None] = [None] * n_layers
        self.tokens = [0] * n_layers
        self.centered_tokens = [0] * n_layers

    def add(self, layer: int, q: np.ndarray, k: np.ndarray) -> None:
        """q (tokens, heads, d) and k (tokens, kv heads, d) of one sequence, in order from its first token."""
        t, h, d = q.shape
        kv = k.shape[1]
        q2 = (q.astype(np.float64) ** 2).reshape(t, kv, h // kv, d).sum(axis=(0, 2)) / (h // kv)
        k64 = k.astype(np.float64)
        k2 = (k64**2).sum(axis=0)
        full = t // self.block_tokens * self.block_tokens
        blocks = k64[:full].reshape(-1, self.block_tokens, kv, d)
        kc2 = ((blocks - blocks.mean(axis=1, keepdims=True)) ** 2).sum(axis=(0, 1))
        n, nc = self.tokens[layer], self.centered_tokens[layer]
        merge = lambda old, s, m, add: s / add if old is None or m == 0 else (old * m + s) / (m + add)
        self.q2[layer] = merge(self.q2[layer], q2, n, t)
        self.k2[layer] = merge(self.k2[layer], k2, n, t)
        if full:
            self.kc2[layer] = merge(self.kc2[layer], kc2, nc, full)
        self.tokens[layer], self.centered_tokens[layer] = n + t, nc + full

    def scales(self, centered: bool) -> list[np.ndarray | None]:
        """Per layer the (n_kv_heads, head_dim) float32 s for KVQCache(key_scales=...) — from (k − block mean)²
        for a centered key format, else from k² — normalized to a geometric mean of 1 per kv head; None for a
        layer without statistics. Moments below 1e-12 are floored (a channel never looked at, or constant)."""
        out: list[np.ndarray | None] = []
        for q2, k2 in zip(self.q2, self.kc2 if centered else self.k2):
            if q2 is None or k2 is None:
                out.append(None)
                continue
            s = (np.maximum(q2, 1e-12) / np.maximum(k2, 1e-12)) ** 0.25
            s = s / np.exp(np.mean(np.log(s), axis=-1, keepdims=True))
            out.append(s.astype(np.float32))
        return out


class _MomentCache(KVQCache):
    """An f32/f32 KVQCache that records the moments of what each layer appends (the real attention path)."""

    def __init__(self, config, moments: KeyMoments, **cache_config: Any):
        super().__init__(config, "f32", "f32", max_batch_size=1, block_tokens=moments.block_tokens, **cache_config)
        self._moments = moments

    def _append_and_attend(self, layer, group, qn, kn, vn, valid_new):
        for row in range(qn.shape[0]):
            idx = np.flatnonzero(valid_new[row])
            if idx.size:
                self._moments.add(layer.index, qn[row, idx], kn[row, idx])
        return super()._append_and_attend(layer, group, qn, kn, vn, valid_new)


def key_moments(model, input_ids, *, block_tokens: int = 32, moments: KeyMoments | None = None) -> KeyMoments:
    """Runs ``model`` (attn_implementation="kvq") once over ``input_ids`` (1-D, or (1, tokens)) on an f32
    cache and returns the query and key moments of every layer (added to ``moments`` if given: several
    prompts, one call each). No gradients; the model is not changed."""
    from ._config import cache_keyword

    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise ValueError(f"kvq.hf.key_moments: input_ids must be one sequence of tokens, got shape {tuple(ids.shape)}")
    config = model.config
    n_layers = config.get_text_config(decoder=True).num_hidden_layers
    if moments is None:
        moments = KeyMoments(n_layers, block_tokens)
    elif len(moments.q2) != n_layers:
        raise ValueError(f"kvq.hf.key_moments: moments of {len(moments.q2)} layers, the model has {n_layers}")
    from ._attention import ATTN_IMPLEMENTATION

    before = getattr(config, "_attn_implementation", None)
    if before != ATTN_IMPLEMENTATION:  # the moments are recorded by kvq's attention path; restored after
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    try:
        cache = _MomentCache(config, moments)
        with torch.no_grad():
            model(ids, use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache})
    finally:
        if before is not None and before != ATTN_IMPLEMENTATION:
            model.set_attn_implementation(before)
    return moments


def calibrate_key_scales(model, input_ids, *, centered: bool = True, block_tokens: int = 32) -> list[np.ndarray]:
    """Per layer an (n_kv_heads, head_dim) float32 s for KVQCache(key_scales=...) from one prefill of
    ``input_ids`` (a calibration prompt of a few hundred tokens or more); ``centered``: for key codecs
    ending in +center (means over blocks of ``block_tokens``, the cache's block size)."""
    scales = key_moments(model, input_ids, block_tokens=block_tokens).scales(centered)
    if any(s is None for s in scales):
        raise ValueError(f"kvq.hf.calibrate_key_scales: the prompt is too short for statistics of every layer "
                         f"({'a centered format needs at least one full block of ' + str(block_tokens) if centered else 'no tokens'})")
    return scales


class KeyScalesByFormat:
    """Calibrated key scales for a cache whose layers mix key formats: called with every layer's key spec, it
    returns per layer the scales of (k − block mean)² for a +center spec and of k² otherwise
    (kvq.model_eval.eval_model's ``key_scales`` may be such a callable; ``description`` goes into its info)."""

    def __init__(self, moments: KeyMoments, description: str = "calibrated"):
        self.centered, self.plain = moments.scales(True), moments.scales(False)
        if any(s is None for s in self.centered + self.plain):
            raise ValueError("kvq.hf.KeyScalesByFormat: the calibration prompt is too short for statistics of "
                             f"every layer (at least one full block of {moments.block_tokens} tokens)")
        self.description = description

    def __call__(self, key_specs) -> list[np.ndarray]:
        from ._config import split_key_spec

        if len(key_specs) != len(self.plain):
            raise ValueError(f"kvq.hf.KeyScalesByFormat: {len(key_specs)} key specs for {len(self.plain)} layers")
        return [(self.centered if split_key_spec(k)[1] else self.plain)[l] for l, k in enumerate(key_specs)]
