"""The kvq serde inside LMCache's StorageManager, through the resp adapter on a real redis-server and through
the fs adapter: round trips, stored size = the estimate, corrupted/foreign frames as misses, threads."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from conftest import LMCACHE_MISSING

pytest.importorskip("lmcache", reason=LMCACHE_MISSING)

import kvq_lmcache  # noqa: E402
from conftest import kv_chunk  # noqa: E402
from kvq_lmcache import ChunkCodec, Geometry  # noqa: E402
from kvq_lmcache.serde import key_digest  # noqa: E402
from kvq_lmcache.storage import chunk_key  # noqa: E402

MODEL = "test/model"
SERDE = {"spec": "q8_0/q4_0", "head_dim": 128}


def expected(kv, key, **serde):
    """What a load must give: the chunk after this codec's own encode and decode."""
    codec = kvq_lmcache.serde.make_codec({**SERDE, **serde})
    frame = np.zeros(codec.frame_bytes(Geometry(*kv.shape[1:], kv.dtype)), np.uint8)
    codec.encode(kv, frame, model_name=key.model_name, key_digest=key_digest(key))
    out = torch.empty_like(kv)
    codec.decode(frame, out, model_name=key.model_name, key_digest=key_digest(key))
    return out, frame.size


def keys_of(n, model=MODEL, first=0):
    return [chunk_key(bytes([first + i]) * 32, model) for i in range(n)]


def redis_name(key):
    return f"{key.model_name}@{key.kv_rank:08x}@{key.object_group_id:x}@{key.chunk_hash.hex()}".encode()


@pytest.mark.parametrize("spec", ["q8_0/q4_0", "q4_0+rot+center/q4_0", "chan3/polar:budget=3"])
def test_resp_round_trip_and_stored_size(storage, resp_adapter, redis_client, spec):
    s = storage(resp_adapter(**{**SERDE, "spec": spec}))
    chunks = [kv_chunk(layers=4, tokens=256, seed=i) for i in range(3)]
    keys = keys_of(3)
    s.store(keys, chunks)
    s.drop_l1()
    loaded = s.load(keys, chunks[0])
    for key, kv, got in zip(keys, chunks, loaded):
        want, size = expected(kv, key, spec=spec)
        assert got is not None and torch.equal(got, want)
        assert s.stored_bytes(key) == size == redis_client.strlen(redis_name(key))


def test_fs_round_trip_and_stored_size(storage, tmp_path):
    s = storage({"type": "fs", "base_path": str(tmp_path), "serde": {"type": "kvq", **SERDE}})
    chunks = [kv_chunk(layers=4, tokens=256, seed=i, dtype=torch.float16) for i in range(2)]
    keys = keys_of(2)
    s.store(keys, chunks)
    s.drop_l1()
    for key, kv, got in zip(keys, chunks, s.load(keys, chunks[0])):
        want, size = expected(kv, key)
        assert got is not None and torch.equal(got, want)
        assert s.stored_bytes(key) == size
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 2 and all(p.stat().st_size == size for p in files)


def corrupt(redis_client, key, how, other=None):
    name = redis_name(key)
    value = bytearray(redis_client.get(name))
    if how == "bit flip":
        value[len(value) // 3] ^= 0x10
    elif how == "truncation":
        value = value[:-64]
    elif how == "wrong key":
        value = bytearray(redis_client.get(redis_name(other)))
    redis_client.set(name, bytes(value))


@pytest.mark.parametrize("how", ["bit flip", "truncation", "wrong key"])
def test_a_damaged_frame_in_redis_is_a_miss(storage, resp_adapter, redis_client, how):
    s = storage(resp_adapter(**SERDE))
    chunks = [kv_chunk(layers=2, tokens=256, seed=i) for i in range(2)]
    keys = keys_of(2)
    s.store(keys, chunks)
    s.drop_l1()
    corrupt(redis_client, keys[0], how, other=keys[1])
    before = sum(kvq_lmcache.rejections().values())
    assert s.load(keys[:1], chunks[0]) == [None]
    if how != "truncation":  # a short value may already fail the adapter's load (a miss before the serde)
        assert sum(kvq_lmcache.rejections().values()) == before + 1
    # the undamaged chunk still loads
    got = s.load(keys[1:], chunks[1])[0]
    assert got is not None and torch.equal(got, expected(chunks[1], keys[1])[0])


def test_another_models_frame_is_a_miss(storage, resp_adapter):
    writer = storage(resp_adapter(**SERDE, fingerprint="gemma-3-270m@abc"))
    reader = storage(resp_adapter(**SERDE, fingerprint="gemma-3-270m@def"))
    kv, keys = kv_chunk(layers=2, tokens=128), keys_of(1)
    writer.store(keys, [kv])
    before = kvq_lmcache.rejections().get("other model", 0)
    assert reader.load(keys, kv) == [None]
    assert kvq_lmcache.rejections().get("other model", 0) == before + 1
    same = storage(resp_adapter(**SERDE, fingerprint="gemma-3-270m@abc"))
    assert torch.equal(same.load(keys, kv)[0], expected(kv, keys[0])[0])


def test_another_format_is_a_miss(storage, resp_adapter):
    writer = storage(resp_adapter(**SERDE))
    reader = storage(resp_adapter(**{**SERDE, "spec": "q8_0/q8_0"}))
    kv, keys = kv_chunk(layers=2, tokens=128), keys_of(1)
    writer.store(keys, [kv])
    assert reader.load(keys, kv) == [None]


def test_concurrent_stores_and_loads(storage, resp_adapter):
    """Stores from several threads at once, then (L1 dropped, so every chunk comes from redis) loads."""
    s = storage(resp_adapter(**SERDE, max_workers=4))
    n_threads, per_thread = 4, 3
    keys = [keys_of(per_thread, first=10 * t) for t in range(n_threads)]
    chunks = [[kv_chunk(layers=4, tokens=256, seed=100 * t + i) for i in range(per_thread)] for t in range(n_threads)]
    errors = []

    def in_threads(work):
        def guarded(t):
            try:
                work(t)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=guarded, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors

    def load(t):
        for _ in range(2):
            for key, kv, got in zip(keys[t], chunks[t], s.load(keys[t], chunks[t][0])):
                assert got is not None and torch.equal(got, expected(kv, key)[0])
            s.manager.delete_l1_keys(keys[t])

    in_threads(lambda t: s.store(keys[t], chunks[t]))
    s.drop_l1()
    in_threads(load)


def test_encrypted_at_rest(storage, resp_adapter, redis_client, monkeypatch):
    pytest.importorskip("cryptography")
    monkeypatch.setenv("KVQ_TEST_KEY", os.urandom(32).hex())
    s = storage(resp_adapter(**SERDE, encryption_key_env="KVQ_TEST_KEY"))
    kv, keys = kv_chunk(layers=2, tokens=128), keys_of(1)
    s.store(keys, [kv])
    s.drop_l1()
    got = s.load(keys, kv)[0]
    assert got is not None and torch.equal(got, expected(kv, keys[0])[0])
    monkeypatch.setenv("KVQ_TEST_KEY", os.urandom(32).hex())
    other = storage(resp_adapter(**SERDE, encryption_key_env="KVQ_TEST_KEY"))
    assert other.load(keys, kv) == [None]
