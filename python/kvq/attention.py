"""kvq.reference_attention and kvq.attention_error on the shapes models have: several heads, grouped-query
attention, causal and sliding-window masks. The work is done by the 2-D kernels of kvq._core (one call per
kv head, or per kv head and query position when a mask makes the visible rows differ).

Shapes:
    2-D (as before): q (n_q, head_dim), k and v (n, head_dim): every query sees every row.
    3-D: q (n_q, n_heads, head_dim), k and v (n, n_kv_heads, head_dim); n_heads a multiple of n_kv_heads, query
         head h reads kv head h // (n_heads // n_kv_heads) (transformers' repeat_kv order).
causal=True: the queries are the last n_q of the n tokens (query i sits at position n - n_q + i, as in
KVCache.attend_prefill) and see the rows up to their own; window=W: only the last W of those (W tokens,
itself included). float64 (and float16) input is converted to float32; other dtypes raise ValueError.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from . import _core


def _as_float32(x, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype == np.float64:
        return np.ascontiguousarray(a, dtype=np.float32)
    if a.dtype in (np.float32, np.float16):
        return a
    raise ValueError(f"{name}: expected a float32, float16 or float64 array, got {a.dtype}")


def _shapes(fn: str, q, k, v):
    q, k, v = _as_float32(q, f"{fn}: q"), _as_float32(k, f"{fn}: k"), _as_float32(v, f"{fn}: v")
    if k.ndim != 3:  # the 2-D path: the kernels check the shapes, with their messages
        return q, k, v, False
    if k.ndim != 3 or q.ndim != 3 or v.ndim != 3:
        raise ValueError(f"{fn}: q, k and v must all be 2-D ((n_q, head_dim), (n, head_dim)) or all 3-D "
                         f"((n_q, n_heads, head_dim), (n, n_kv_heads, head_dim)); got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    if v.shape != k.shape:
        raise ValueError(f"{fn}: v has shape {v.shape}, k has {k.shape}; they must be equal")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{fn}: q's head_dim {q.shape[2]} differs from k's {k.shape[2]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{fn}: n_heads={q.shape[1]} is not a multiple of n_kv_heads={k.shape[1]}")
    return q, k, v, True


def _require_2d(fn: str, q, k, v) -> None:
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2:
        raise ValueError(f"{fn}: q, k and v must all be 2-D ((n_q, head_dim), (n, head_dim)) or all 3-D; got q "
                         f"{q.shape}, k {k.shape}, v {v.shape}")


def _visible(n: int, n_q: int, causal: bool, window: Optional[int], fn: str):
    """Per query: the half-open row range [lo, hi) it sees, or None when all see all."""
    if window is not None and window < 1:
        raise ValueError(f"{fn}: window must be a positive number of tokens (or None), got {window}")
    if not causal and window is None:
        return None
    if not causal:
        raise ValueError(f"{fn}: window needs causal=True (a window counts back from each query's position)")
    if n_q > n:
        raise ValueError(f"{fn}: causal with {n_q} queries needs at least as many rows, got {n}")
    ranges = []
    for i in range(n_q):
        p = n - n_q + i
        ranges.append((max(0, p + 1 - window) if window else 0, p + 1))
    return ranges


def _per_head(fn, q, k, v, multi, causal, window):
    """The 3-D form of the inputs (2-D ones as one head), the GQA group size, and each query's visible
    rows (None: all of them)."""
    if not multi:
        _require_2d(fn, q, k, v)
        q, k, v = q[:, None], k[:, None], v[:, None]
    g = q.shape[1] // k.shape[1]
    return q, k, v, g, _visible(k.shape[0], q.shape[0], causal, window, fn)


def reference_attention(q, k, v, scale: Optional[float] = None, *, return_weights: bool = False,
                        causal: bool = False, window: Optional[int] = None):
    """FP32 attention softmax(scale * q @ k.T) @ v on unquantized rows (Eigen), per head. 2-D or 3-D shapes
    (module docstring); scale None means 1/sqrt(head_dim). Returns the output of q's shape, float32, and with
    return_weights the attention weights too: (n_q, n) or (n_q, n_heads, n), zero for rows a mask hides."""
    fn = "reference_attention"
    q, k, v, multi = _shapes(fn, q, k, v)
    if not multi and not causal and window is None:
        return _core.reference_attention(q, k, v, scale, return_weights=return_weights)
    q, k, v, g, ranges = _per_head(fn, q, k, v, multi, causal, window)
    n_q, n_heads, d = q.shape
    n, n_kv = k.shape[0], k.shape[1]
    out = np.zeros((n_q, n_heads, d), dtype=np.float32)
    weights = np.zeros((n_q, n_heads, n), dtype=np.float32) if return_weights else None
    for kv in range(n_kv):
        heads = slice(kv * g, (kv + 1) * g)
        kh, vh = np.ascontiguousarray(k[:, kv]), np.ascontiguousarray(v[:, kv])
        if ranges is None:
            qh = np.ascontiguousarray(q[:, heads]).reshape(n_q * g, d)
            r = _core.reference_attention(qh, kh, vh, scale, return_weights=return_weights)
            o, w = r if return_weights else (r, None)
            out[:, heads] = o.reshape(n_q, g, d)
            if return_weights:
                weights[:, heads] = w.reshape(n_q, g, n)
            continue
        for i, (lo, hi) in enumerate(ranges):
            r = _core.reference_attention(np.ascontiguousarray(q[i, heads]), kh[lo:hi], vh[lo:hi], scale,
                                          return_weights=return_weights)
            o, w = r if return_weights else (r, None)
            out[i, heads] = o
            if return_weights:
                weights[i, heads, lo:hi] = w
    if not multi:
        out = out[:, 0]
        weights = weights[:, 0] if return_weights else None
    return (out, weights) if return_weights else out


_AGREEMENTS = ("topk", "cosine")  # worst = min; the others are errors, worst = max
_METRICS = ("kl", "score_rmse", "topk", "output_l2", "cosine")


def attention_error(q, k, v, key_codec: str = "q8_0", value_codec: str = "q4_0", scale: Optional[float] = None,
                    top_k: int = 8, *, seed: int = _core.DEFAULT_SEED, causal: bool = False,
                    window: Optional[int] = None) -> dict:
    """Quantizes k and v with the codecs, runs attention on the codes and compares it per query and head with
    reference_attention. 2-D or 3-D shapes, causal and window as in the module docstring. Returns a dict: kl,
    score_rmse, topk, output_l2, cosine (each {'mean', 'worst'} over every query and head; worst is the max of
    errors, the min of agreements), queries (query-head pairs compared), top_k, key/value_bits_per_value."""
    fn = "attention_error"
    q, k, v, multi = _shapes(fn, q, k, v)
    if not multi and not causal and window is None:
        return _core.attention_error(q, k, v, key_codec, value_codec, scale, top_k, seed=seed)
    q, k, v, g, ranges = _per_head(fn, q, k, v, multi, causal, window)
    n_q, n_heads, d = q.shape
    n, n_kv = k.shape[0], k.shape[1]
    parts = []
    for kv in range(n_kv):
        heads = slice(kv * g, (kv + 1) * g)
        kh, vh = np.ascontiguousarray(k[:, kv]), np.ascontiguousarray(v[:, kv])
        if ranges is None:
            qh = np.ascontiguousarray(q[:, heads]).reshape(n_q * g, d)
            parts.append(_core.attention_error(qh, kh, vh, key_codec, value_codec, scale, top_k, seed=seed))
            continue
        for i, (lo, hi) in enumerate(ranges):
            # Rows are quantized one by one, so a prefix of the rows quantizes as the whole would.
            parts.append(_core.attention_error(np.ascontiguousarray(q[i, heads]), kh[lo:hi], vh[lo:hi], key_codec,
                                               value_codec, scale, top_k, seed=seed))
    total = sum(p["queries"] for p in parts)
    result = {}
    for m in _METRICS:
        mean = sum(p[m]["mean"] * p["queries"] for p in parts) / total
        worsts = [p[m]["worst"] for p in parts]
        result[m] = {"mean": mean, "worst": min(worsts) if m in _AGREEMENTS else max(worsts)}
    result["queries"] = total
    result["top_k"] = top_k
    result["key_bits_per_value"] = parts[0]["key_bits_per_value"]
    result["value_bits_per_value"] = parts[0]["value_bits_per_value"]
    return result
