"""The frame a chunk is stored as: a fixed header, the format spec, the payload, a CRC-32 trailer.

| bytes        | what                                                                                    |
|--------------|-----------------------------------------------------------------------------------------|
| 0..7         | magic `KVQLMC\\r\\n` (a text transfer that rewrites line ends breaks it)                  |
| 8..9, 10..11 | version (1), header bytes (HEADER.size)                                                 |
| 12..15       | flags: bit 0 = payload encrypted (AES-256-GCM, a 12-byte nonce before it, a 16-byte tag after) |
| 16..39       | dtype code, layers, tokens, kv heads, head_dim, block_tokens (u32 each)                 |
| 40..47       | seed of the rotated codecs                                                              |
| 48..55       | payload bytes (as stored, nonce and tag included)                                       |
| 56..71       | fingerprint: BLAKE2b-128 of the model/layout fingerprint                                 |
| 72..87       | key digest: BLAKE2b-128 of the LMCache ObjectKey the frame was stored under              |
| 88..89       | spec bytes n, then n bytes: the per-layer K/V pair spec (kvq's `_pairs` form)            |
| ...          | payload: per side (K, then V), per layer, that layer side's format bytes                 |
| last 4       | CRC-32 (zlib) of everything before it                                                    |

Everything is little-endian. The checksum catches corruption; the key digest catches a frame copied or
renamed under another key; the fingerprint a frame of another model; encryption (optional) adds
authenticity with a key the reader must hold.
"""

from __future__ import annotations

from dataclasses import dataclass
import hashlib
import struct
import zlib

MAGIC = b"KVQLMC\r\n"
VERSION = 1
FLAG_ENCRYPTED = 1
HEADER = struct.Struct("<8sHHI6IQQ16s16sH")
TRAILER = struct.Struct("<I")
NONCE_BYTES, TAG_BYTES = 12, 16


class FrameRejected(Exception):
    """A frame that must not be decoded: the load is a cache miss. str() is the reason."""


def digest16(*parts: bytes | str | int) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=b"kvq-lmcache")
    for p in parts:
        b = p.encode() if isinstance(p, str) else p.to_bytes(8, "little", signed=True) if isinstance(p, int) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


@dataclass(frozen=True)
class Header:
    flags: int
    dtype: int
    n_layers: int
    n_tokens: int
    n_kv_heads: int
    head_dim: int
    block_tokens: int
    seed: int
    payload_bytes: int
    fingerprint: bytes
    key_digest: bytes
    spec: str

    def pack(self) -> bytes:
        spec = self.spec.encode()
        fixed = HEADER.pack(MAGIC, VERSION, HEADER.size, self.flags, self.dtype, self.n_layers, self.n_tokens,
                            self.n_kv_heads, self.head_dim, self.block_tokens, self.seed, self.payload_bytes,
                            self.fingerprint, self.key_digest, len(spec))
        return fixed + spec


def frame_bytes(spec: str, payload_bytes: int) -> int:
    return HEADER.size + len(spec.encode()) + payload_bytes + TRAILER.size


def read_header(buf: memoryview) -> Header:
    """The header of a frame whose checksum is right; FrameRejected (with the reason) otherwise."""
    if len(buf) < HEADER.size + TRAILER.size:
        raise FrameRejected(f"truncated: {len(buf)} bytes, less than a header")
    magic, version, header_size, *rest = HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise FrameRejected("foreign: not a kvq frame (bad magic)")
    if version != VERSION or header_size != HEADER.size:
        raise FrameRejected(f"version {version} (header {header_size} bytes); this reader knows {VERSION}")
    h = Header(*rest[:-1], spec="")
    end = HEADER.size + rest[-1] + h.payload_bytes + TRAILER.size
    if end > len(buf):
        raise FrameRejected(f"truncated: the header says {end} bytes, the buffer has {len(buf)}")
    (crc,) = TRAILER.unpack_from(buf, end - TRAILER.size)
    if zlib.crc32(buf[: end - TRAILER.size]) != crc:
        raise FrameRejected("corrupted: checksum mismatch")
    spec = bytes(buf[HEADER.size : HEADER.size + rest[-1]]).decode("utf-8", errors="replace")
    return Header(*rest[:-1], spec=spec)


class Encryption:
    """AES-256-GCM of the payload with the `cryptography` package; the header is its associated data."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # LMCache depends on cryptography

        if len(key) != 32:
            raise ValueError(f"the encryption key is 32 bytes (AES-256), got {len(key)}")
        self._aead = AESGCM(key)

    def seal(self, nonce: bytes, plain: bytes, header: bytes) -> bytes:
        return nonce + self._aead.encrypt(nonce, plain, header)

    def open(self, sealed: memoryview, header: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:]), header)
        except InvalidTag:
            raise FrameRejected("not authentic: AES-GCM tag mismatch (another key, or altered)") from None
