"""KVCache with values of their own head size and DeepSeek's latent cache (MLA) from Python."""
import numpy as np
import pytest

import kvq


def test_values_of_another_head_size_come_back_in_their_size():
    rng = np.random.default_rng(0)
    cache = kvq.KVCache(n_layers=1, n_kv_heads=2, head_dim=192, n_heads=8, head_dim_v=128)
    assert cache.head_dim_v == 128 and cache.config["head_dim_v"] == 128
    seq = cache.add_sequence()
    k = rng.standard_normal((50, 2, 192), dtype=np.float32)
    v = rng.standard_normal((50, 2, 128), dtype=np.float32)
    cache.append(0, k, v, seq=seq)
    q = rng.standard_normal((8, 192), dtype=np.float32)
    assert cache.attend(0, q, seq=seq).shape == (8, 128)
    assert cache.attend_prefill(0, np.stack([q, q]), seq=seq).shape == (2, 8, 128)
    assert cache.attend_batch(0, q[None], seqs=[seq]).shape == (1, 8, 128)
    with pytest.raises(ValueError, match="head_dim_v"):
        cache.append(0, k, k, seq=seq)  # values of the keys' size
    with pytest.raises(ValueError, match="latent"):
        cache.append(0, k, None, seq=seq)


def test_latent_cache_stores_one_row_and_reads_values_from_it():
    rng = np.random.default_rng(1)
    cache = kvq.KVCache(n_layers=1, n_kv_heads=1, head_dim=576, n_heads=16, key_codec="q8_0", value_codec="",
                        head_dim_v=512, latent_values=True, seal="on_append", block_tokens=256)
    assert cache.latent_values and cache.value_codec == "q8_0"
    assert cache.bytes_per_token() == kvq.codec_info("q8_0", 576)["row_bytes"]
    seq = cache.add_sequence()
    k = rng.standard_normal((300, 1, 576), dtype=np.float32)
    cache.append(0, k, None, seq=seq)
    q = (0.05 * rng.standard_normal((16, 576))).astype(np.float32)
    out = cache.attend(0, q, seq=seq)
    assert out.shape == (16, 512)
    # The float reference over the rows as q8_0 stores them, values their first 512 values.
    rows = kvq.dequantize(kvq.quantize(k[:, 0], "q8_0"), "q8_0", 576)
    s = (q @ rows.T) / np.sqrt(576)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    ref = (w / w.sum(axis=1, keepdims=True)) @ rows[:, :512]
    np.testing.assert_allclose(out, ref, atol=2e-3)  # q8_0's rounding of the queries
    with pytest.raises(ValueError, match="v=None"):
        cache.append(0, k, k[:, :, :512], seq=seq)


def test_latent_cache_refuses_what_it_cannot_hold():
    with pytest.raises(kvq.BadParams, match="leading values"):
        kvq.KVCache(n_layers=1, n_kv_heads=1, head_dim=576, key_codec="turbo4", value_codec="",
                    head_dim_v=512, latent_values=True)
    with pytest.raises(kvq.BadParams, match="at most head_dim"):
        kvq.KVCache(n_layers=1, n_kv_heads=1, head_dim=512, key_codec="q8_0", value_codec="",
                    head_dim_v=576, latent_values=True)
