"""Save and load from Python: round trips that attend bit for bit alike (several codec pairs, forks, open
blocks, windows, one sequence), loading into a live cache, and every bad input (wrong magic, newer version,
truncated, corrupted, other configuration, missing file, full pool, failing write) raising its error with
the cache's contents and accounting unchanged."""
import os
import pathlib
import resource
import signal

import numpy as np
import pytest

import kvq

D = 64


def fill(cache, seq, n, seed):
    rng = np.random.default_rng(seed)
    for layer in range(cache.n_layers):
        k, v = rng.standard_normal((2, n, cache.n_kv_heads, cache.head_dim), dtype=np.float32)
        cache.append(layer, k, v, seq=seq)


def outputs(cache, ids=None):
    q = np.random.default_rng(99).standard_normal((cache.n_heads, cache.head_dim), dtype=np.float32)
    return [cache.attend(layer, q, seq=s).tobytes() + bytes([cache.n_tokens(s, layer) % 256])
            for s in (cache.sequences() if ids is None else ids) for layer in range(cache.n_layers)]


def snapshot(cache):
    return cache.dump(), cache.bytes_used(), cache.pool_stats(), outputs(cache)


def populated(key="q8_0", value="q4_0", **kw):
    cache = kvq.KVCache(2, 2, D, n_heads=4, key_codec=key, value_codec=value, block_tokens=8, **kw)
    a = cache.add_sequence()
    fill(cache, a, 21, 1)
    b = cache.fork(a)
    fill(cache, b, 4, 2)
    fill(cache, cache.add_sequence(), 3, 3)
    return cache


@pytest.mark.parametrize("key,value,kw", [
    ("q8_0", "q4_0", {}),
    ("f16", "f16", {}),
    ("q4_0+rot", "q4_0", {"seed": 7}),
    ("polar", "q4_0", {}),
    ("turbo3", "q8_0", {}),
    ("tcq3", "tcq3", {}),
    ("q8_0", "q4_0", {"center_keys": True}),
    ("q8_0", "q4_0", {"seal": "on_append"}),
    ("q8_0", "q4_0", {"sliding_window": [8, 0]}),
])
def test_round_trip_is_bit_exact(tmp_path, key, value, kw):
    cache = populated(key, value, **kw)
    cache.save(tmp_path / "c.kvq")  # os.PathLike
    loaded = kvq.KVCache.load(str(tmp_path / "c.kvq"))  # str
    assert loaded.sequences() == [0, 1, 2]
    assert outputs(loaded) == outputs(cache)
    assert loaded.bytes_used() == cache.bytes_used()
    stats, loaded_stats = cache.pool_stats(), loaded.pool_stats()
    assert loaded_stats["blocks_used"] == stats["blocks_used"]
    assert loaded_stats["blocks_shared"] == stats["blocks_shared"] > 0
    assert {k: loaded.config[k] for k in ("seed", "center_keys", "seal", "sliding_window", "block_tokens")} == \
        {k: cache.config[k] for k in ("seed", "center_keys", "seal", "sliding_window", "block_tokens")}
    loaded.save(os.fsencode(tmp_path / "again.kvq"))  # bytes
    assert (tmp_path / "again.kvq").read_bytes() == (tmp_path / "c.kvq").read_bytes()


def test_one_sequence_and_load_into_a_live_cache(tmp_path):
    src = populated()
    src.save(tmp_path / "one.kvq", seq=1)
    live = populated()
    fill(live, 0, 5, 11)
    before = outputs(live)
    stats = live.pool_stats()
    ids = live.load_into(tmp_path / "one.kvq")
    assert ids == [3]
    assert outputs(live, [0, 1, 2]) == before
    assert outputs(live, ids) == outputs(src, [1])
    assert live.pool_stats()["blocks_used"] > stats["blocks_used"]
    fill(live, 3, 2, 12)  # a loaded sequence is an ordinary one
    live.remove(3)
    assert live.pool_stats()["blocks_used"] == stats["blocks_used"]


@pytest.fixture
def small(tmp_path):
    src = kvq.KVCache(1, 1, 32, block_tokens=4)
    fill(src, src.add_sequence(), 6, 5)
    src.save(tmp_path / "small.kvq")
    live = kvq.KVCache(1, 1, 32, block_tokens=4)
    fill(live, live.add_sequence(), 9, 6)
    return (tmp_path / "small.kvq").read_bytes(), live


def test_bad_files_raise_and_change_nothing(tmp_path, small):
    good, live = small
    before = snapshot(live)
    bad = tmp_path / "bad.kvq"

    def rejected(data, match=None):
        bad.write_bytes(data)
        with pytest.raises(kvq.BadCacheFile, match=match):
            live.load_into(bad)
        assert snapshot(live) == before

    rejected(b"X" + good[1:], "magic")
    rejected(good[:8] + b"\x07" + good[9:], "format version 7 is not supported")
    rejected(good + b"\0", "data after the end")
    for n in list(range(0, 40)) + list(range(40, len(good), 97)):
        rejected(good[:n], "truncated|less than a header")
    for i in range(0, len(good), 13):
        rejected(good[:i] + bytes([good[i] ^ (1 << (i % 8))]) + good[i + 1:])
    assert issubclass(kvq.BadCacheFile, ValueError)
    with pytest.raises(ValueError, match="CRC32C"):
        bad.write_bytes(good[:4100] + bytes([good[4100] ^ 1]) + good[4101:])
        kvq.KVCache.load(bad)


def test_missing_file_mismatch_and_full_pool(tmp_path, small):
    good, live = small
    (tmp_path / "f.kvq").write_bytes(good)
    before = snapshot(live)
    with pytest.raises(OSError, match="No such file"):
        live.load_into(tmp_path / "missing.kvq")
    with pytest.raises(kvq.FileIOError, match="missing.kvq"):
        kvq.KVCache.load(tmp_path / "missing.kvq")
    with pytest.raises(TypeError):
        live.load_into(42)
    assert snapshot(live) == before

    other = kvq.KVCache(1, 1, 32, block_tokens=4, seed=3)
    with pytest.raises(kvq.ConfigMismatch, match="seed"):
        other.load_into(tmp_path / "f.kvq")
    with pytest.raises(ValueError, match="block_tokens"):
        kvq.KVCache(1, 1, 32, block_tokens=8).load_into(tmp_path / "f.kvq")
    assert other.sequences() == []

    # 3 blocks, and the open block's float staging, which counts against max_blocks in blocks' worth
    units = kvq.KVCache(1, 1, 32, block_tokens=4)
    fill(units, units.add_sequence(), 1, 9)
    staging = units.pool_stats()["blocks_reserved"]
    full = kvq.KVCache(1, 1, 32, block_tokens=4, max_blocks=3 + staging)
    fill(full, full.add_sequence(), 12, 9)
    before = snapshot(full)
    with pytest.raises(kvq.PoolExhausted):
        full.load_into(tmp_path / "f.kvq")
    assert snapshot(full) == before


def test_failed_save_leaves_the_old_file(tmp_path):
    cache = populated()
    path = tmp_path / "c.kvq"
    kvq.KVCache(2, 2, D, n_heads=4, block_tokens=8).save(path)
    old = path.read_bytes()
    with pytest.raises(OSError, match="No such file"):
        cache.save(tmp_path / "no" / "dir.kvq")
    (tmp_path / "d").mkdir()
    with pytest.raises(kvq.FileIOError, match="rename"):
        cache.save(tmp_path / "d")
    with pytest.raises(ValueError, match="no sequence with id 9"):
        cache.save(path, seq=9)
    # write() fails mid-file once the file size limit is reached (it holds for root too).
    saved = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, saved[1]))
        with pytest.raises(OSError, match="cannot write"):
            cache.save(path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, saved)
        signal.signal(signal.SIGXFSZ, handler)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.kvq", "d"]
    cache.save(pathlib.Path(path))
    assert kvq.KVCache.load(path).sequences() == [0, 1, 2]
