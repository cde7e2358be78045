"""Hostile input through kvq.KVCache (issue #15): C's argument order for truncate, a FIFO or a path with a
NUL byte given as a cache file, pool limits for a loaded cache, and configurations beyond the bounds."""

import os
import threading
import time

import numpy as np
import pytest

import kvq


def small_cache(**kw):
    return kvq.KVCache(n_layers=1, n_kv_heads=2, head_dim=64, n_heads=4, block_tokens=16, **kw)


def fill(cache, seq, n, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n, 2, 64), dtype=np.float32)
    cache.append(0, k, k, seq=seq)


def test_truncate_takes_seq_by_keyword_only():
    cache = small_cache()
    a, b = cache.add_sequence(), cache.add_sequence()
    fill(cache, a, 20)
    fill(cache, b, 5)
    # C's order, kvq_cache_truncate(cache, seq, n_tokens), meaning "sequence b to 0 tokens": it used to
    # truncate sequence 0 (a) to b = 1 token, silently. Now it is a TypeError and nothing changes.
    assert (a, b) == (0, 1)
    with pytest.raises(TypeError):
        cache.truncate(b, 0)
    assert cache.n_tokens(a) == 20 and cache.n_tokens(b) == 5
    cache.truncate(10, seq=a)
    assert cache.n_tokens(a) == 10 and cache.n_tokens(b) == 5


def test_load_of_a_fifo_fails_at_once(tmp_path):
    fifo = tmp_path / "a_fifo"
    os.mkfifo(fifo)

    # Without the fix, open() blocks until a writer comes: this one comes after 3 s, so the test ends.
    def writer():
        time.sleep(3)
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    start = time.monotonic()
    with pytest.raises(kvq.FileIOError, match="FIFO"):
        kvq.KVCache.load(fifo)
    with pytest.raises(kvq.FileIOError, match="FIFO"):
        small_cache().load_into(str(fifo))
    assert time.monotonic() - start < 2
    t.join()


def test_a_path_with_a_nul_byte_is_an_error(tmp_path):
    cache = small_cache()
    fill(cache, cache.add_sequence(), 20)
    bad = str(tmp_path / "a") + "\0b.kvq"
    for path in (bad, os.fsencode(bad)):
        with pytest.raises(ValueError, match="NUL"):
            cache.save(path)
        with pytest.raises(ValueError, match="NUL"):
            kvq.KVCache.load(path)
        with pytest.raises(ValueError, match="NUL"):
            cache.load_into(path)
    assert list(tmp_path.iterdir()) == []  # not ".../a"
    assert cache.sequences() == [0]


def test_load_takes_pool_limits_and_threads(tmp_path):
    cache = small_cache()
    fill(cache, cache.add_sequence(), 50)  # 3 sealed blocks, 2 staged tokens
    path = tmp_path / "c.kvq"
    cache.save(path)
    loaded = kvq.KVCache.load(path)
    assert loaded.pool_stats()["blocks_total"] == 3  # exactly the file's blocks, not grow_blocks = 64
    with pytest.raises(kvq.PoolExhausted, match="more than max_blocks = 2"):
        kvq.KVCache.load(path, max_blocks=2)
    staging = loaded.pool_stats()["blocks_reserved"]  # the open block's float staging, in blocks' worth
    assert staging > 0
    with pytest.raises(kvq.PoolExhausted, match="staging holding"):
        kvq.KVCache.load(path, max_blocks=3 + staging - 1)
    capped = kvq.KVCache.load(path, max_blocks=3 + staging, threads=2)
    assert capped.pool_stats()["max_blocks"] == 3 + staging and capped.config["threads"] == 2
    q = np.ones((4, 64), np.float32)
    assert np.array_equal(capped.attend(0, q), cache.attend(0, q))
    with pytest.raises(ValueError, match="threads"):
        kvq.KVCache.load(path, threads=0)
    with pytest.raises(ValueError, match="max_blocks"):
        kvq.KVCache.load(path, max_blocks=-1)


def test_configurations_are_bounded_and_sequences_counted():
    with pytest.raises(ValueError, match="n_layers must be in 1..65536"):
        kvq.KVCache(n_layers=10**8, n_kv_heads=1, head_dim=64)
    cache = kvq.KVCache(n_layers=65536, n_kv_heads=1, head_dim=64)
    assert cache.bytes_used() == 0
    cache.add_sequence()
    assert cache.bytes_used() == cache.metadata_bytes() >= 65536 * 64
