"""reference_attention against numpy, and attention_error's metrics for codec pairs."""

import numpy as np
import pytest

import kvq


def numpy_attention(q, k, v, scale):
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    return w @ v, w


def gaussian_inputs(rng, n_q=6, n=300, d=64):
    q = 2 * rng.standard_normal((n_q, d), dtype=np.float32)
    return q, rng.standard_normal((n, d), dtype=np.float32), rng.standard_normal((n, d), dtype=np.float32)


def test_reference_attention_equals_softmax_attention_in_numpy(rng):
    q, k, v = gaussian_inputs(rng)
    for scale in (None, 0.3):
        out, w = kvq.reference_attention(q, k, v, scale, return_weights=True)
        expected, expected_w = numpy_attention(q, k, v, scale or 1 / np.sqrt(q.shape[1]))
        assert out.shape == (6, 64) and w.shape == (6, 300) and out.dtype == np.float32
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(w, expected_w, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(kvq.reference_attention(q, k, v), kvq.reference_attention(q, k, v, None))


def test_reference_attention_rejects_mismatched_shapes_nan_and_bad_scale(rng):
    q, k, v = gaussian_inputs(rng)
    with pytest.raises(ValueError, match=r"k: expected .* shape \(n, head_dim=64\), got a float32 array of shape \(300, 32\)"):
        kvq.reference_attention(q, k[:, :32].copy(), v)
    with pytest.raises(ValueError, match=r"v: expected .* shape \(n=300, head_dim=64\)"):
        kvq.reference_attention(q, k, v[:10])
    with pytest.raises(ValueError, match=r"q: expected .* shape \(n_q, head_dim\), got a float32 array of shape \(64,\)"):
        kvq.reference_attention(q[0], k, v)
    with pytest.raises(ValueError, match="must not be empty"):
        kvq.reference_attention(q, k[:0], v[:0])
    k[17, 3] = np.nan
    with pytest.raises(ValueError, match="k: element 1091 .* not finite"):
        kvq.reference_attention(q, k, v)
    with pytest.raises(ValueError, match="scale must be positive"):
        kvq.reference_attention(q, v, v, -1.0)


def test_attention_error_is_zero_for_f32_and_grows_as_bits_shrink(rng):
    q, k, v = gaussian_inputs(rng, d=128)
    exact = kvq.attention_error(q, k, v, "f32", "f32")
    assert exact["queries"] == 6 and exact["key_bits_per_value"] == 32
    assert exact["kl"]["worst"] < 1e-6 and exact["output_l2"]["worst"] < 1e-5 and exact["topk"]["worst"] == 1
    default = kvq.attention_error(q, k, v, "q8_0", "q4_0")
    assert (default["key_bits_per_value"], default["value_bits_per_value"]) == (8.5, 4.5)
    assert 0 < default["kl"]["mean"] <= default["kl"]["worst"] < 1e-3
    assert 0.9 < default["cosine"]["worst"] <= default["cosine"]["mean"] < 1
    four_bit_keys = kvq.attention_error(q, k, v, "q4_0", "q4_0")
    assert four_bit_keys["kl"]["mean"] > 5 * default["kl"]["mean"]
    for metric in ("kl", "score_rmse", "topk", "output_l2", "cosine"):
        assert set(default[metric]) == {"mean", "worst"}


def test_attention_error_rejects_nan_and_bad_arguments(rng):
    q, k, v = gaussian_inputs(rng)
    with pytest.raises(ValueError, match="top_k"):
        kvq.attention_error(q, k, v, "q8_0", "q4_0", top_k=0)
    with pytest.raises(ValueError, match="unknown codec"):
        kvq.attention_error(q, k, v, "q8_0", "q2_0")
    q[0, 0] = np.inf
    with pytest.raises(ValueError, match="q: element 0 .* not finite"):
        kvq.attention_error(q, k, v)


def masked_numpy_attention(q, k, v, scale, causal=False, window=None):
    """q (n_q, H, d), k/v (n, KV, d): per head in float64, GQA by h // (H // KV), queries the last n_q tokens."""
    n_q, heads, d = q.shape
    n, kv_heads = k.shape[:2]
    g = heads // kv_heads
    out = np.zeros((n_q, heads, d))
    weights = np.zeros((n_q, heads, n))
    for i in range(n_q):
        p = n - n_q + i
        lo, hi = (max(0, p + 1 - window) if window else 0, p + 1) if causal else (0, n)
        for h in range(heads):
            s = k[lo:hi, h // g].astype(np.float64) @ q[i, h].astype(np.float64) * scale
            w = np.exp(s - s.max())
            w /= w.sum()
            weights[i, h, lo:hi] = w
            out[i, h] = w @ v[lo:hi, h // g]
    return out, weights


def multi_head_inputs(rng, n_q=5, heads=6, kv_heads=2, n=40, d=32):
    return (rng.standard_normal((n_q, heads, d), dtype=np.float32), rng.standard_normal((n, kv_heads, d), dtype=np.float32),
            rng.standard_normal((n, kv_heads, d), dtype=np.float32))


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 7)])
def test_reference_attention_multi_head_gqa_causal_window(rng, causal, window):
    q, k, v = multi_head_inputs(rng)
    out, w = kvq.reference_attention(q, k, v, 0.2, return_weights=True, causal=causal, window=window)
    expected, expected_w = masked_numpy_attention(q, k, v, 0.2, causal, window)
    assert out.shape == (5, 6, 32) and w.shape == (5, 6, 40) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w, expected_w, rtol=1e-4, atol=1e-7)
    if window:
        assert (w[0, :, : 40 - 5 + 1 - 7] == 0).all() and (w[0, :, 36:] == 0).all()
    # float64 input is converted; the result is the float32 one.
    np.testing.assert_array_equal(kvq.reference_attention(q.astype(np.float64), k.astype(np.float64), v, 0.2,
                                                          causal=causal, window=window), out)


def test_reference_attention_multi_head_equals_the_cache_prefill(rng):
    """The causal, windowed reference is what KVCache.attend_prefill computes on an f32 cache."""
    q, k, v = multi_head_inputs(rng, n_q=12, n=50)
    cache = kvq.KVCache(n_layers=1, n_kv_heads=2, head_dim=32, n_heads=6, key_codec="f32", value_codec="f32",
                        sliding_window=9)
    seq = cache.add_sequence()
    cache.append(0, k[:38], v[:38], seq=seq)
    cache.append(0, k[38:], v[38:], seq=seq)
    got = cache.attend_prefill(0, q, seq=seq)
    np.testing.assert_allclose(got, kvq.reference_attention(q, k, v, causal=True, window=9), rtol=1e-5, atol=1e-6)


def test_attention_error_multi_head_aggregates_the_per_head_errors(rng):
    q, k, v = multi_head_inputs(rng, d=64)
    exact = kvq.attention_error(q, k, v, "f32", "f32")
    assert exact["queries"] == 5 * 6 and exact["kl"]["worst"] < 1e-6
    err = kvq.attention_error(q, k, v, "q4_0", "q4_0")
    per_head = [kvq.attention_error(np.ascontiguousarray(q[:, h]), np.ascontiguousarray(k[:, h // 3]),
                                    np.ascontiguousarray(v[:, h // 3]), "q4_0", "q4_0") for h in range(6)]
    # (float rounding differs between one call per kv head and one per head: rel 1e-6 measured)
    assert err["kl"]["mean"] == pytest.approx(np.mean([p["kl"]["mean"] for p in per_head]), rel=1e-4)
    assert err["kl"]["worst"] == pytest.approx(max(p["kl"]["worst"] for p in per_head), rel=1e-4)
    assert err["cosine"]["worst"] == pytest.approx(min(p["cosine"]["worst"] for p in per_head), rel=1e-6)
    causal = kvq.attention_error(q, k, v, "q4_0", "q4_0", causal=True, window=10)
    assert causal["queries"] == 30 and 0 < causal["kl"]["mean"] and causal["key_bits_per_value"] == 4.5
    assert kvq.attention_error(q, k, v, "f32", "f32", causal=True, window=10)["output_l2"]["worst"] < 1e-5
    # 2-D input with float64 works as before.
    two_d = kvq.attention_error(q[:, 0].astype(np.float64), k[:, 0].copy(), v[:, 0].copy(), "q8_0", "q4_0")
    assert two_d["queries"] == 5


def test_multi_head_shapes_are_checked(rng):
    q, k, v = multi_head_inputs(rng)
    with pytest.raises(ValueError, match="n_heads=5 is not a multiple of n_kv_heads=2"):
        kvq.reference_attention(q[:, :5], k, v)
    with pytest.raises(ValueError, match="must all be 2-D"):
        kvq.reference_attention(q[:, 0], k, v)  # 2-D q, 3-D k
    with pytest.raises(ValueError, match="window needs causal=True"):
        kvq.reference_attention(q, k, v, window=4)
    with pytest.raises(ValueError, match="window must be a positive"):
        kvq.attention_error(q, k, v, causal=True, window=0)
    with pytest.raises(ValueError, match="causal with 5 queries needs at least as many rows, got 3"):
        kvq.reference_attention(q, k[:3], v[:3], causal=True)
    with pytest.raises(ValueError, match="v has shape"):
        kvq.attention_error(q, k, v[:, :1])
    with pytest.raises(ValueError, match="got int64"):
        kvq.reference_attention(q.astype(np.int64), k, v)
