"""The `kvq` serde of LMCache's distributed storage: kvq's codecs on every chunk an L2 adapter stores.

LMCache has no plugin discovery for serdes: `register()` (run by `import kvq_lmcache`) must run in the
process before its storage starts; an adapter then names it: `"serde": {"type": "kvq", "spec": "q8_0/q4_0",
"head_dim": 128}`. A frame that fails its checks raises FrameRejected from deserialize: LMCache's
AsyncSerdeProcessor marks the load failed and the serde wrapper reports its keys as misses.
"""

from __future__ import annotations

from collections import Counter
import logging
import os
import threading

import kvq
import torch
from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
from lmcache.v1.distributed.serde import (AsyncSerdeProcessor, Deserializer, SerdeProcessor, Serializer,
                                          get_registered_serde_types, register_serde_factory)
from lmcache.v1.memory_management import MemoryObj

from .codec import ChunkCodec, Geometry
from .frame import FrameRejected, digest16

logger = logging.getLogger("kvq_lmcache")
SERDE_TYPE = "kvq"
_rejected: Counter[str] = Counter()
_rejected_lock = threading.Lock()


def rejections() -> dict[str, int]:
    """Loads refused in this process, by reason ('corrupted', 'truncated', 'wrong key', 'other model', ...)."""
    with _rejected_lock:
        return dict(_rejected)


def key_digest(key: ObjectKey) -> bytes:
    return digest16(key.chunk_hash, key.model_name, key.kv_rank, key.object_group_id, key.cache_salt)


def geometry(layout: MemoryLayoutDesc) -> Geometry:
    if len(layout.shapes) != 1 or len(layout.shapes[0]) != 4 or layout.shapes[0][0] != 2:
        raise ValueError(f"kvq serde: expected one KV group of shape [2, layers, tokens, kv_heads*head_dim], "
                         f"got {[tuple(s) for s in layout.shapes]}")
    _, n_layers, n_tokens, hidden = (int(d) for d in layout.shapes[0])
    return Geometry(n_layers, n_tokens, hidden, layout.dtypes[0])


class KvqSerializer(Serializer):
    def __init__(self, codec: ChunkCodec) -> None:
        self.codec = codec

    def estimate_serialized_size(self, layout_desc: MemoryLayoutDesc) -> int:
        # Exact, not an upper bound: a frame shorter than the buffer LMCache loads into would miss.
        return self.codec.frame_bytes(geometry(layout_desc))

    def serialize(self, src: MemoryObj, dst: MemoryObj, key: ObjectKey) -> int:
        kv, out = src.tensor, dst.tensor
        if kv is None or out is None:
            raise ValueError("kvq serde: src and dst need tensors")
        n = self.codec.encode(kv.view(src.get_shapes()[0]), out.view(-1).numpy(), model_name=key.model_name,
                              key_digest=key_digest(key))
        if n != out.numel():
            raise RuntimeError(f"kvq serde: wrote {n} bytes into a buffer of {out.numel()}, the estimate")
        return n


class KvqDeserializer(Deserializer):
    def __init__(self, codec: ChunkCodec) -> None:
        self.codec = codec

    def deserialize(self, src: MemoryObj, dst: MemoryObj, key: ObjectKey) -> None:
        frame, kv = src.tensor, dst.tensor
        if frame is None or kv is None:
            raise ValueError("kvq serde: src and dst need tensors")
        try:
            self.codec.decode(frame.view(-1).view(torch.uint8).numpy(), kv.view(dst.get_shapes()[0]),
                              model_name=key.model_name, key_digest=key_digest(key))
        except FrameRejected as e:
            with _rejected_lock:
                _rejected[str(e).split(":")[0]] += 1
            logger.warning("kvq serde: cache miss for %s (chunk %s): %s", key.model_name, key.chunk_hash.hex()[:16], e)
            raise


_KWARGS = {"spec", "head_dim", "block_tokens", "seed", "fingerprint", "windows", "encryption_key_env", "max_workers"}


def make_codec(kwargs: dict[str, object]) -> ChunkCodec:
    """The ChunkCodec of an adapter's "serde" settings (every key but "type")."""
    unknown = set(kwargs) - _KWARGS
    if unknown:
        raise ValueError(f"kvq serde: unknown settings {sorted(unknown)}; known: {sorted(_KWARGS)}")
    if "head_dim" not in kwargs:
        raise ValueError('kvq serde: "head_dim" (the model\'s attention head size) is required')
    key = None
    if kwargs.get("encryption_key_env"):
        name = str(kwargs["encryption_key_env"])
        hexkey = os.environ.get(name)
        if not hexkey:
            raise ValueError(f"kvq serde: encryption_key_env names {name}, which is not set")
        key = bytes.fromhex(hexkey)
    windows = kwargs.get("windows")
    return ChunkCodec(str(kwargs.get("spec", "q8_0/q4_0")), head_dim=int(kwargs["head_dim"]),
                      block_tokens=int(kwargs.get("block_tokens", 32)),
                      seed=int(kwargs.get("seed", kvq.DEFAULT_SEED)),
                      fingerprint=str(kwargs["fingerprint"]) if kwargs.get("fingerprint") is not None else None,
                      windows=[int(w) for w in windows] if windows is not None else None, encryption_key=key)


def create_kvq_serde(kwargs: dict[str, object]) -> SerdeProcessor:
    codec = make_codec(kwargs)
    return AsyncSerdeProcessor(KvqSerializer(codec), KvqDeserializer(codec), max_workers=int(kwargs.get("max_workers", 1)))


def register() -> None:
    """Makes "kvq" a serde type of this process's LMCache (again: nothing)."""
    if SERDE_TYPE not in get_registered_serde_types():
        register_serde_factory(SERDE_TYPE, create_kvq_serde)
