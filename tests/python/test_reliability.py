"""Bad input from Python: NaN/Inf and values beyond a codec's fp16 range raise ValueError and leave the
cache exactly as it was, or (nan_policy="propagate") are stored and read back as NaN."""
import numpy as np
import pytest

import kvq

D = 64


def snapshot(cache, q):
    return (cache.dump(), cache.bytes_used(), [cache.attend(0, q, seq=s).tobytes() for s in cache.sequences()])


@pytest.mark.parametrize("bad", [np.nan, np.inf, 3e38])
def test_append_of_bad_rows_raises_and_changes_nothing(bad):
    rng = np.random.default_rng(1)
    cache = kvq.KVCache(1, 2, D, n_heads=4, key_codec="q8_0", value_codec="q4_0", block_tokens=8)
    seq = cache.add_sequence()
    k, v = rng.standard_normal((2, 12, 2, D), dtype=np.float32)
    cache.append(0, k[:5], v[:5], seq=seq)
    q = rng.standard_normal((4, D), dtype=np.float32)
    before = snapshot(cache, q)
    bad_k = k.copy()
    bad_k[7, 1, 3] = bad
    with pytest.raises(ValueError, match="token 7, kv head 1"):
        cache.append(0, bad_k, v, seq=seq)
    bad_q = q.copy()
    bad_q[2, 0] = bad if not np.isfinite(bad) else np.nan
    with pytest.raises(ValueError):
        cache.attend(0, bad_q, seq=seq)
    with pytest.raises(ValueError):
        cache.append(1, k, v, seq=seq)  # no layer 1
    with pytest.raises(ValueError):
        cache.append(0, k[:, :, :32], v[:, :, :32], seq=seq)  # wrong head size
    assert snapshot(cache, q) == before


def test_propagate_stores_bad_rows_and_reads_nan_for_their_heads():
    rng = np.random.default_rng(2)
    cache = kvq.KVCache(1, 2, D, n_heads=4, nan_policy="propagate")
    seq = cache.add_sequence()
    k, v = rng.standard_normal((2, 10, 2, D), dtype=np.float32)
    k[4, 1, 0] = 1e30  # beyond q8_0's range: counts as non-finite
    cache.append(0, k, v, seq=seq)
    out = cache.attend(0, rng.standard_normal((4, D), dtype=np.float32), seq=seq)
    assert np.isfinite(out[:2]).all() and np.isnan(out[2:]).all()


def test_quantize_nan_policy():
    x = np.ones((2, D), np.float32)
    x[1, 5] = np.nan
    with pytest.raises(ValueError, match="not finite"):
        kvq.quantize(x, "q4_0")
    codes = kvq.quantize(x, "q4_0", nan_policy="propagate")
    back = kvq.dequantize(codes, "q4_0", D)
    assert np.isfinite(back[0]).all() and np.isnan(back[1, :32]).all() and np.isfinite(back[1, 32:]).all()
    with pytest.raises(ValueError, match="nan_policy"):
        kvq.quantize(x, "q4_0", nan_policy="ignore")
