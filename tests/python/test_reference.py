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
