"""The bytes of one side (keys or values) of one layer of a chunk, for every K/V format kvq stores.

A chunk side of a layer is (tokens, n_kv_heads, head_dim) floats. Three kinds of format:

| format            | bytes of a layer side                                                                |
|-------------------|--------------------------------------------------------------------------------------|
| row codec (`q8_0`, `q4_0+rot`, `turbo3.5`, `polar:budget=3`, ...) | `kvq.quantize`'s rows, token-major: T·H·row_bytes |
| `X+center` (keys) | per block of `block_tokens` tokens, H·d fp16 means; then X's rows of k − mean         |
| `chanB` (keys)    | per block, H·d fp16 minimums then H·d fp16 steps; then T·H·d·B/8 bytes of B-bit codes |

Row codecs are kvq's own bytes (`kvq.quantize`; ggml's blocks for q8_0, q4_0, ...). Centering and chanB
keys are kvq's arithmetic (lib/codec/centering.cpp, lib/codec/channel_keys.cpp: fp16 means and ranges per
block, codes packed little-endian back to back), done here in numpy because kvq's bindings expose only its
row codecs; centered rows are still quantized by kvq. Every size depends only on the geometry, so a
frame's size is known before anything is encoded (LMCache stores exactly the size it estimated).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import kvq

CENTER = "+center"


def _blocks(n_tokens: int, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The first token and the token count of each block of block_tokens tokens (the last may be short)."""
    starts = np.arange(0, n_tokens, block_tokens)
    counts = np.minimum(block_tokens, n_tokens - starts)
    return starts, counts


@dataclass(frozen=True)
class RowFormat:
    """A codec of kvq's table: each (token, head) row of head_dim values is quantized on its own."""

    spec: str
    head_dim: int
    seed: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "row_bytes", kvq.codec_info(self.spec, self.head_dim, seed=self.seed)["row_bytes"])

    def nbytes(self, n_tokens: int, n_heads: int) -> int:
        return n_tokens * n_heads * self.row_bytes

    def encode(self, x: np.ndarray) -> np.ndarray:
        """x: float32 (L, T, H, d) -> uint8 (L, nbytes)."""
        return kvq.quantize(x, self.spec, seed=self.seed).reshape(x.shape[0], -1)

    def decode(self, b: np.ndarray, n_tokens: int, n_heads: int) -> np.ndarray:
        """uint8 (L, nbytes) -> float32 (L, T, H, d)."""
        rows = b.reshape(b.shape[0], n_tokens, n_heads, self.row_bytes)
        return kvq.dequantize(rows, self.spec, self.head_dim, seed=self.seed)


@dataclass(frozen=True)
class CenteredFormat:
    """Keys minus their per-block, per-channel fp16 mean, then a row codec (kvq's +center)."""

    inner: RowFormat
    block_tokens: int

    def _means_bytes(self, n_tokens: int, n_heads: int) -> int:
        return len(_blocks(n_tokens, self.block_tokens)[0]) * n_heads * self.inner.head_dim * 2

    def nbytes(self, n_tokens: int, n_heads: int) -> int:
        return self._means_bytes(n_tokens, n_heads) + self.inner.nbytes(n_tokens, n_heads)

    def encode(self, x: np.ndarray) -> np.ndarray:
        n_layers, n_tokens, n_heads, _ = x.shape
        starts, counts = _blocks(n_tokens, self.block_tokens)
        # Summed in double and rounded to fp16 before it is subtracted, as center_block does: adding the
        # stored mean back restores exactly what was taken off.
        sums = np.add.reduceat(x, starts, axis=1, dtype=np.float64)
        means = (sums / counts[None, :, None, None]).astype(np.float32).astype(np.float16)
        centered = x - np.repeat(means.astype(np.float32), counts, axis=1)
        rows = self.inner.encode(centered)
        return np.concatenate([means.view(np.uint8).reshape(n_layers, -1), rows], axis=1)

    def decode(self, b: np.ndarray, n_tokens: int, n_heads: int) -> np.ndarray:
        starts, counts = _blocks(n_tokens, self.block_tokens)
        m = self._means_bytes(n_tokens, n_heads)
        means = np.ascontiguousarray(b[:, :m]).view(np.float16).reshape(b.shape[0], len(starts), n_heads, -1)
        x = self.inner.decode(np.ascontiguousarray(b[:, m:]), n_tokens, n_heads)
        x += np.repeat(means.astype(np.float32), counts, axis=1)
        return x


@dataclass(frozen=True)
class ChannelFormat:
    """chanB keys (KIVI): per block and channel an fp16 minimum and step (max − min)/(2^B − 1), B-bit codes."""

    bits: int
    head_dim: int
    block_tokens: int

    def _params_bytes(self, n_tokens: int, n_heads: int) -> int:
        return len(_blocks(n_tokens, self.block_tokens)[0]) * n_heads * self.head_dim * 4

    def nbytes(self, n_tokens: int, n_heads: int) -> int:
        return self._params_bytes(n_tokens, n_heads) + n_tokens * n_heads * self.head_dim * self.bits // 8

    def encode(self, x: np.ndarray) -> np.ndarray:
        n_layers, n_tokens, n_heads, d = x.shape
        starts, counts = _blocks(n_tokens, self.block_tokens)
        top = float((1 << self.bits) - 1)
        lo = np.minimum.reduceat(x, starts, axis=1)
        hi = np.maximum.reduceat(x, starts, axis=1)
        with np.errstate(over="ignore"):
            mn16, step16 = lo.astype(np.float16), ((hi - lo) / np.float32(top)).astype(np.float16)
        if not (np.isfinite(mn16).all() and np.isfinite(step16).all()):
            raise ValueError(f"chan{self.bits} keys: a minimum or step beyond fp16 (keys not finite, or a range over 65504)")
        mn, step = mn16.astype(np.float32), step16.astype(np.float32)
        inv = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
        t = (x - np.repeat(mn, counts, axis=1)) * np.repeat(inv, counts, axis=1)
        codes = np.clip(np.floor(t + 0.5), 0, top).astype(np.uint8)
        # Code j of a row at bit j·B, little-endian (lib/ref/bit_codes.hpp).
        bits = np.unpackbits(codes[..., None], axis=-1, bitorder="little")[..., : self.bits]
        packed = np.packbits(bits.reshape(n_layers, -1), axis=-1, bitorder="little")
        params = np.stack([mn16, step16], axis=3)  # (L, blocks, H, 2, d): minimums, then steps
        return np.concatenate([params.view(np.uint8).reshape(n_layers, -1), packed], axis=1)

    def decode(self, b: np.ndarray, n_tokens: int, n_heads: int) -> np.ndarray:
        n_layers, d = b.shape[0], self.head_dim
        starts, counts = _blocks(n_tokens, self.block_tokens)
        p = self._params_bytes(n_tokens, n_heads)
        params = np.ascontiguousarray(b[:, :p]).view(np.float16).reshape(n_layers, len(starts), n_heads, 2, d)
        bits = np.unpackbits(b[:, p:], axis=-1, bitorder="little").reshape(n_layers, n_tokens, n_heads, d, self.bits)
        codes = (bits << np.arange(self.bits, dtype=np.uint8)).sum(axis=-1, dtype=np.uint8).astype(np.float32)
        mn = np.repeat(params[:, :, :, 0].astype(np.float32), counts, axis=1)
        step = np.repeat(params[:, :, :, 1].astype(np.float32), counts, axis=1)
        return mn + step * codes


def side_format(spec: str, head_dim: int, block_tokens: int, seed: int, *, key: bool):
    """The format of one side under a codec spec ('q8_0', 'q5_0+rot+center', 'chan3', ...)."""
    if spec.startswith("chan"):
        bits = spec[4:]
        if not key or not bits.isdigit() or not 2 <= int(bits) <= 8:
            raise ValueError(f"'{spec}': per-channel keys are chan2 .. chan8, and keys only")
        if head_dim % 8:
            raise ValueError(f"'{spec}': head_dim must be a multiple of 8, got {head_dim}")
        return ChannelFormat(int(bits), head_dim, block_tokens)
    if spec.endswith(CENTER):
        if not key:
            raise ValueError(f"'{spec}': +center applies to keys only")
        return CenteredFormat(RowFormat(spec[: -len(CENTER)], head_dim, seed), block_tokens)
    return RowFormat(spec, head_dim, seed)
