"""ChunkCodec: an LMCache KV chunk, (2, layers, tokens, kv_heads·head_dim) in bf16/fp16/fp32, to a kvq frame
(frame.py) and back. Knows nothing of LMCache's classes (serde.py adapts it), so that tests and benchmarks
can call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
import os
import zlib

import numpy as np
import torch

import kvq
from kvq._pairs import check_spec, format_layer_pairs, layer_pairs, split_pair

from .formats import side_format
from .frame import (FLAG_ENCRYPTED, NONCE_BYTES, TAG_BYTES, TRAILER, Encryption, FrameRejected, Header, digest16,
                    frame_bytes, read_header)

DTYPES = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}


@dataclass(frozen=True)
class Geometry:
    n_layers: int
    n_tokens: int
    hidden: int
    dtype: torch.dtype


class _Plan:
    """Per-layer formats and byte offsets of one chunk geometry (shared by the chunks of that shape)."""

    def __init__(self, codec: "ChunkCodec", g: Geometry) -> None:
        if g.hidden % codec.head_dim:
            raise ValueError(f"kvq serde: the chunk's last dimension ({g.hidden}) is not a multiple of head_dim "
                             f"({codec.head_dim}); set head_dim to the model's")
        if g.dtype not in DTYPES:
            raise ValueError(f"kvq serde: chunk dtype {g.dtype} is not bfloat16, float16 or float32")
        self.n_kv_heads = g.hidden // codec.head_dim
        windows = codec.windows if codec.windows is not None else [0] * g.n_layers
        if len(windows) != g.n_layers:
            raise ValueError(f"kvq serde: {len(windows)} windows given for a chunk of {g.n_layers} layers")
        pairs = layer_pairs(codec.spec, windows)
        self.spec = format_layer_pairs(pairs)
        sides = [[split_pair(p)[s] for p in pairs] for s in (0, 1)]
        self.formats = [[side_format(c, codec.head_dim, codec.block_tokens, codec.seed, key=s == 0) for c in side]
                        for s, side in enumerate(sides)]
        # Layers of one side with one format are encoded in one call.
        self.groups = []
        for s, side in enumerate(sides):
            by_spec: dict[str, list[int]] = {}
            for layer, c in enumerate(side):
                by_spec.setdefault(c, []).append(layer)
            self.groups += [(s, layers, self.formats[s][layers[0]]) for layers in by_spec.values()]
        self.offsets, at = [[0] * g.n_layers for _ in (0, 1)], 0
        for s in (0, 1):
            for layer in range(g.n_layers):
                self.offsets[s][layer] = at
                at += self.formats[s][layer].nbytes(g.n_tokens, self.n_kv_heads)
        self.plain_bytes = at
        self.payload_bytes = at + (NONCE_BYTES + TAG_BYTES if codec.encryption else 0)
        self.frame_bytes = frame_bytes(self.spec, self.payload_bytes)

    def side_bytes(self, payload: np.ndarray, s: int) -> np.ndarray:
        """A side's bytes as (layers, bytes per layer), when its layers have one format."""
        end = self.offsets[1][0] if s == 0 else self.plain_bytes
        return payload[self.offsets[s][0] : end].reshape(len(self.offsets[s]), -1)

    def layer_bytes(self, s: int, layer: int) -> slice:
        start = self.offsets[s][layer]
        end = self.offsets[s][layer + 1] if layer + 1 < len(self.offsets[s]) else (
            self.offsets[1][0] if s == 0 else self.plain_bytes)
        return slice(start, end)


class ChunkCodec:
    """spec: a kvq K/V pair spec ('q8_0/q4_0'; per layer 'q8_0/q4_0*4;chan3/polar:budget=3*14'; 'K/V|K2/V2'
    with windows, per layer 0 or the sliding window); head_dim: the model's; fingerprint: what identifies
    the model and its weights (None: the key's model_name); encryption_key: 32 bytes for AES-256-GCM."""

    def __init__(self, spec: str = "q8_0/q4_0", *, head_dim: int, block_tokens: int = 32, seed: int = kvq.DEFAULT_SEED,
                 fingerprint: str | None = None, windows: list[int] | None = None,
                 encryption_key: bytes | None = None) -> None:
        check_spec(spec)
        if "|" in spec and windows is None:
            raise ValueError(f"kvq serde: spec {spec!r} pairs sliding-window layers apart; give windows (per layer)")
        if head_dim <= 0 or block_tokens <= 0:
            raise ValueError("kvq serde: head_dim and block_tokens must be positive")
        self.spec, self.head_dim, self.block_tokens, self.seed = spec, head_dim, block_tokens, seed
        self.fingerprint, self.windows = fingerprint, windows
        self.encryption = Encryption(encryption_key) if encryption_key is not None else None
        self._plans: dict[Geometry, _Plan] = {}

    def plan(self, g: Geometry) -> _Plan:
        p = self._plans.get(g)
        if p is None:  # a race builds it twice, the same way
            p = self._plans[g] = _Plan(self, g)
        return p

    def frame_bytes(self, g: Geometry) -> int:
        return self.plan(g).frame_bytes

    def _header(self, plan: _Plan, g: Geometry, model_name: str, key_digest: bytes) -> Header:
        return Header(FLAG_ENCRYPTED if self.encryption else 0, DTYPES[g.dtype], g.n_layers, g.n_tokens,
                      plan.n_kv_heads, self.head_dim, self.block_tokens, self.seed, plan.payload_bytes,
                      digest16("model", self.fingerprint if self.fingerprint is not None else model_name),
                      key_digest, plan.spec)

    def encode(self, kv: torch.Tensor, out: np.ndarray, *, model_name: str, key_digest: bytes) -> int:
        """Writes the frame of kv (2, L, T, hidden) into out (uint8, at least frame_bytes); returns its size."""
        _, n_layers, n_tokens, hidden = kv.shape
        g = Geometry(n_layers, n_tokens, hidden, kv.dtype)
        plan = self.plan(g)
        if out.size < plan.frame_bytes:
            raise ValueError(f"kvq serde: a {out.size}-byte buffer for a {plan.frame_bytes}-byte frame")
        head = self._header(plan, g, model_name, key_digest).pack()
        at = len(head)
        plain = out[at : at + plan.plain_bytes] if not self.encryption else np.empty(plan.plain_bytes, np.uint8)
        # A layer at a time: its float32 copy (what kvq quantizes) stays in cache, where a whole chunk's
        # (64 MiB for 256 tokens of a Llama-3-8B chunk) made serialize wait on memory.
        for s, layers, fmt in plan.groups:
            for layer in layers:
                x = kv[s, layer].float().numpy().reshape(1, n_tokens, plan.n_kv_heads, self.head_dim)
                plain[plan.layer_bytes(s, layer)] = fmt.encode(x)[0]
        if self.encryption:
            out[at : at + plan.payload_bytes] = np.frombuffer(self.encryption.seal(os.urandom(NONCE_BYTES), plain, head),
                                                             np.uint8)
        out[: len(head)] = np.frombuffer(head, np.uint8)
        end = at + plan.payload_bytes
        TRAILER.pack_into(out, end, zlib.crc32(out[:end]))
        return end + TRAILER.size

    def decode(self, frame: np.ndarray, kv: torch.Tensor, *, model_name: str, key_digest: bytes) -> None:
        """Checks the frame and fills kv (2, L, T, hidden) from it; FrameRejected, kv untouched, if it is not
        the frame this codec would have written for kv's shape under this key and model."""
        _, n_layers, n_tokens, hidden = kv.shape
        g = Geometry(n_layers, n_tokens, hidden, kv.dtype)
        plan = self.plan(g)
        h = read_header(memoryview(frame))
        want = self._header(plan, g, model_name, key_digest)
        if h.key_digest != want.key_digest:
            raise FrameRejected("wrong key: the frame was stored under another key")
        if h.fingerprint != want.fingerprint:
            raise FrameRejected("other model: the frame's model fingerprint is not this one's")
        for field in ("spec", "dtype", "n_layers", "n_tokens", "n_kv_heads", "head_dim", "block_tokens", "seed", "flags",
                      "payload_bytes"):
            if getattr(h, field) != getattr(want, field):
                raise FrameRejected(f"mismatch: the frame's {field} is {getattr(h, field)!r}, "
                                    f"this codec's {getattr(want, field)!r}")
        at = len(want.pack())
        payload = frame[at : at + plan.payload_bytes]
        if self.encryption:
            payload = np.frombuffer(self.encryption.open(memoryview(payload), bytes(frame[:at])), np.uint8)
        decoded = []
        for s, layers, fmt in plan.groups:  # all decoded before kv is written: a failure leaves kv untouched
            codes = (plan.side_bytes(payload, s) if len(layers) == n_layers
                     else np.stack([payload[plan.layer_bytes(s, layer)] for layer in layers]))
            decoded.append((s, layers, torch.from_numpy(fmt.decode(codes, n_tokens, plan.n_kv_heads))))
        for s, layers, x in decoded:
            if len(layers) == n_layers:
                kv[s].copy_(x.reshape(n_layers, n_tokens, hidden))
            else:
                for i, layer in enumerate(layers):
                    kv[s, layer].copy_(x[i].reshape(n_tokens, hidden))
