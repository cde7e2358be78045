"""Storage: LMCache's StorageManager (L1 in host memory, one L2 adapter) with a blocking store/load of
KV chunks, configured with the arguments `lmcache server` takes. For tests, benchmarks, and a process
that shares prefixes without an engine (docs/lmcache.md)."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time

import torch
from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
from lmcache.v1.distributed.config import parse_args
from lmcache.v1.distributed.internal_api import L2AdapterListener
from lmcache.v1.distributed.storage_manager import StorageManager

from . import register


def chunk_key(chunk_hash: bytes, model_name: str, kv_rank: int = 0) -> ObjectKey:
    return ObjectKey(chunk_hash=chunk_hash, model_name=model_name, kv_rank=kv_rank)

_pools = itertools.count()


class _Stored(L2AdapterListener):
    """The keys the L2 adapter reports stored, with the bytes it stored for each."""

    def __init__(self) -> None:
        self.sizes: dict[ObjectKey, int] = {}
        self.lock = threading.Lock()

    def on_l2_keys_stored(self, keys, sizes):
        with self.lock:
            self.sizes.update(zip(keys, sizes))

    def on_l2_keys_accessed(self, keys):
        pass

    def on_l2_keys_deleted(self, keys):
        with self.lock:
            for k in keys:
                self.sizes.pop(k, None)


class Storage:
    """adapter: the --l2-adapter JSON object (e.g. {"type": "resp", "host": ..., "port": ..., "serde": {"type": "kvq",
    ...}}); l1_gb: host memory of the L1 tier."""

    def __init__(self, adapter: dict, *, l1_gb: float = 1.0, timeout: float = 60.0) -> None:
        register()
        self.timeout = timeout
        config = parse_args(["--l1-size-gb", str(l1_gb), "--no-l1-use-lazy", "--eviction-policy", "LRU",
                             "--l2-adapter", json.dumps(adapter)])
        # The L1 pool's shared-memory name is per process by default: one per Storage here.
        config.l1_manager_config.memory_config.shm_name = f"kvq_lmcache_l1_{os.getpid()}_{next(_pools)}"
        self.manager = StorageManager(config)
        self._stored = _Stored()
        self.manager.register_l2_listener(self._stored)

    def stored_bytes(self, key: ObjectKey) -> int | None:
        """What the L2 adapter reported storing for key (None: not stored)."""
        with self._stored.lock:
            return self._stored.sizes.get(key)

    def store(self, keys: list[ObjectKey], chunks: list[torch.Tensor]) -> None:
        """Writes the chunks to L1 and waits until the L2 adapter has stored them (serialized by its serde)."""
        layout = MemoryLayoutDesc(shapes=[chunks[0].shape], dtypes=[chunks[0].dtype])
        reserved = self.manager.reserve_write(keys, layout)
        if len(reserved) != len(keys):
            raise RuntimeError(f"L1 reserved {len(reserved)} of {len(keys)} chunks")
        for k, c in zip(keys, chunks):
            reserved[k].tensor.view(c.shape).copy_(c)
        self.manager.finish_write(keys)
        self._wait(lambda: all(self.stored_bytes(k) is not None for k in keys), "store")

    def drop_l1(self) -> None:
        self.manager.clear(force=True)

    def load(self, keys: list[ObjectKey], like: torch.Tensor) -> list[torch.Tensor | None]:
        """Prefetches keys from L2 (deserialized by the serde) into L1 and returns copies of the chunks: the
        leading run of hits, then None from the first miss on (LMCache serves prefixes)."""
        layout = MemoryLayoutDesc(shapes=[like.shape], dtypes=[like.dtype])
        spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys, keys[0].object_group_id, layout)])
        handle = self.manager.submit_prefetch_task(spec)
        result = self._wait(lambda: self.manager.query_prefetch_status(handle), "prefetch")
        hits = result.hit_cells[0].count_leading_ones()
        out: list[torch.Tensor | None] = [None] * len(keys)
        if hits:
            with self.manager.read_prefetched_results(keys[:hits]) as objs:
                for i, obj in enumerate(objs):
                    out[i] = obj.tensor.view(like.shape).clone()
            self.manager.finish_read_prefetched(keys[:hits])
        return out

    def _wait(self, predicate, what: str):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            r = predicate()
            if r:
                return r
            time.sleep(0.002)
        raise TimeoutError(f"LMCache {what} did not finish in {self.timeout} s")

    def close(self) -> None:
        self.manager.close()
