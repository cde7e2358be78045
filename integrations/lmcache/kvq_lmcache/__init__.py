"""kvq's codecs as LMCache's KV serde: `import kvq_lmcache` registers the serde type "kvq" (docs/lmcache.md)."""

from .codec import ChunkCodec, Geometry
from .frame import FrameRejected
from .serde import SERDE_TYPE, register, rejections

register()

__all__ = ["ChunkCodec", "FrameRejected", "Geometry", "SERDE_TYPE", "register", "rejections"]
