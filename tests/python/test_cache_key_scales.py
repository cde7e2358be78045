"""kvq.KVCache(key_scales=s): the cache stores k ⊙ s and attends with q ⊘ s (s of each query head's kv head),
exactly what kvq.hf used to do in torch around a plain cache; f32 keys attend as without scales; the scales
are in config, survive save and load, and a file of other scales does not load into a cache; bad scales are
refused."""
import numpy as np
import pytest

import kvq

L, KV, H, D = 2, 2, 4, 64


def scales(seed=1):
    return np.exp(np.random.default_rng(seed).normal(0, 0.7, (L, KV, D))).astype(np.float32)


def pair(key_codec, s, **kw):
    return (kvq.KVCache(L, KV, D, H, key_codec, "q4_0", block_tokens=8, key_scales=s, **kw),
            kvq.KVCache(L, KV, D, H, key_codec, "q4_0", block_tokens=8, **kw))


def test_the_cache_folds_the_scales_as_the_old_torch_path_did():
    s = scales()
    inv = np.repeat((1.0 / s.astype(np.float64)).astype(np.float32), H // KV, axis=1)  # per query head
    rng = np.random.default_rng(2)
    k, v = rng.standard_normal((2, 30, KV, D), dtype=np.float32)
    q = rng.standard_normal((5, H, D), dtype=np.float32)
    for seal in ("on_block_full", "on_append"):
        scaled, plain = pair("q4_0+rot", s, seal=seal)
        for cache in (scaled, plain):
            for _ in range(2):
                cache.add_sequence()
        for layer in range(L):
            for seq, n in ((0, 30), (1, 21)):
                scaled.append(layer, k[:n], v[:n], seq=seq)
                plain.append(layer, k[:n] * s[layer], v[:n], seq=seq)
            qs = q * inv[layer]
            assert np.array_equal(scaled.attend(layer, q[0], seq=0), plain.attend(layer, qs[0], seq=0))
            assert np.array_equal(scaled.attend_prefill(layer, q, seq=1), plain.attend_prefill(layer, qs, seq=1))
            assert np.array_equal(scaled.attend_batch(layer, q[:2], seqs=[0, 1]),
                                  plain.attend_batch(layer, qs[:2], seqs=[0, 1]))


def test_f32_keys_attend_as_without_scales_and_half_keys_too():
    scaled, plain = pair("f32", scales(3))
    rng = np.random.default_rng(4)
    k, v = rng.standard_normal((2, 19, KV, D), dtype=np.float32)
    q = rng.standard_normal((H, D), dtype=np.float32)
    for dtype in (np.float32, np.float16):
        a, b = scaled.add_sequence(), plain.add_sequence()
        for layer in range(L):
            scaled.append(layer, k.astype(dtype), v.astype(dtype), seq=a)
            plain.append(layer, k.astype(dtype), v.astype(dtype), seq=b)
            np.testing.assert_allclose(scaled.attend(layer, q, seq=a), plain.attend(layer, q, seq=b), atol=1e-5)


def test_scales_in_config_saved_and_checked_by_load_into(tmp_path):
    s = scales(5)
    scaled, plain = pair("q8_0", s)
    assert plain.config["key_scales"] is None
    assert np.array_equal(scaled.config["key_scales"], s)
    seq = scaled.add_sequence()
    rng = np.random.default_rng(6)
    for layer in range(L):
        k, v = rng.standard_normal((2, 13, KV, D), dtype=np.float32)
        scaled.append(layer, k, v, seq=seq)
    path = tmp_path / "scaled.kvq"
    scaled.save(path)
    loaded = kvq.KVCache.load(path)
    assert np.array_equal(loaded.config["key_scales"], s)
    q = rng.standard_normal((H, D), dtype=np.float32)
    for layer in range(L):
        assert np.array_equal(loaded.attend(layer, q, seq=0), scaled.attend(layer, q, seq=seq))
    with pytest.raises(kvq.ConfigMismatch, match="key_scales"):
        plain.load_into(path)
    assert plain.sequences() == []


@pytest.mark.parametrize("bad, match", [
    (np.ones((L, KV, D + 1), np.float32), "head_dim"),
    (np.zeros((L, KV, D), np.float32), "positive and finite"),
    (np.full((L, KV, D), np.nan, np.float32), "positive and finite"),
    (np.full((L, KV, D), 1e-45, np.float32), "reciprocal"),
])
def test_bad_scales_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        kvq.KVCache(L, KV, D, H, key_scales=bad)
