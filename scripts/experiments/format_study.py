#!/usr/bin/env python3
"""One-off experiment (issue 39, "Formats studied by fake quantization" in docs/eval-log.md): which K/V formats
would close the distance to issue 39's targets, measured on the model by fake quantization (quantize, then
dequantize, in torch) before any of them is built in C++. Not a permanent tool and not a cache format: it
emulates formats.

    build/venv/bin/python scripts/experiments/format_study.py gemma3-270m \
        --text /usr/share/common-licenses/GPL-3 --ctx 1024 --max-chunks 2 \
        --calib /usr/share/common-licenses/GPL-2 \
        --pairs 'q4_0+rot+center/q4_0,q4_0+rot+center+qk/lm4+rot+g256' --json build/eval/formats.json
    build/venv/bin/python scripts/experiments/format_study.py --self-check   # the quantizers, no model
    # one key and one value format per layer within a budget (docs/eval-log.md has the candidates used):
    build/venv/bin/python scripts/experiments/format_study.py gemma3-270m --text ... --calib ... \
        --budget 3.5,4.5 --budget-keys K1,K2,... --budget-values V1,V2,... --sensitivity-chunks 1 --json out.json
    # the same allocations on other chunks, another calibration text or another seed, without re-measuring:
    ... --sensitivity out.json --first-chunk 2 --max-chunks 4

It runs `kvq eval`'s prefill-mode evaluation (chunks of ctx tokens, BOS first, the second half scored, KL
against the model on a kvq f32/f32 cache, as scripts/experiments/sink_tokens.py does) with its own attention
function: softmax(scaling * scores + mask) @ values in torch, where the keys and values of the whole chunk
are quantized and dequantized by the formats below, per block of 32 tokens (every block of a 1024-token
chunk is full, so, as in kvq's prefill, every key and value a query sees is quantized).

A pair is 'KEY/VALUE', each a base format and modifiers joined by '+':

  base   f32 | q8_0 | q5_0 | q4_0 | q4_0s | q3_0 | q3_0s | iq4_nl | iq4_nls | lm4 | lm3 | lm2 | tcq3 | tcq2 | chan4 | chan3
         | chan2
         q8_0, q5_0, q4_0: ggml's reference rounding (x = d·q, d = max/−2^(b−1) or amax/127, fp16 d, groups of
         32 values of a row); q3_0: q4_0's rule at 3 bits (d = max/−4, codes 0..7); iq4_nl: ggml's table
         −127..113 and its reference rounding as kvq has it (d = max/−127, no scale search, the x²-weighted
         least-squares scale); iq4_nls: the same table with ggml's scale search (ntry 7); q4_0s, q3_0s: q4_0's (q3_0's) layout with
         a scale search (q_search: least squared error over 16 trial scales, least-squares refit); lmB: the
         Lloyd-Max levels of a
         standard Gaussian at B bits, one fp16 scale per group, the least-squares scale of the nearest codes
         after a search over 16 trial scales; tcqB: kvq's tcqB trellis (8 states, scripts/experiments/tcq_alphabet.py)
         on the group over its RMS, the least-squares fp16 scale (with +rot+g256 on Gemma: kvq's tcqB); chanB: kvq's chanB (KIVI: per channel over the block's tokens,
         fp16 minimum and step, B-bit codes; not with +rot/+center).
  +rot   kvq's seeded randomized Hadamard (its signs: SplitMix64 from kvq's default seed), before rounding
  +center (keys) kvq's centering: the fp16 mean per channel over the block's 32 tokens subtracted first, q·mean
         added back exactly; +center64, +center128, +center256: the mean over 64, 128, 256 tokens;
         +ccenter64/128/256: the mean of the span's first 32 tokens, used for the whole span (causal: known when
         the first block seals)
  +g64, +g128, +g256  one scale per 64, 128 or 256 values of a row instead of per 32
  +kn    (keys, KVarN-like) per block and channel, the fp16 RMS over the block's tokens (after centering)
         divides the channel before rotation and rounding, and multiplies it back (folded into the query)
  +qk    (keys) a static per-layer channel weight s_j = (E[q_j²] / E[k_j²])^(1/4), from a calibration text
         (--calib), multiplies channel j before rotation and rounding, 1/s_j is folded into the query: the
         key error lands where the queries do not look. E[k_j²] of the centered keys with +center.
  +qkw   (keys) +qk from the weights alone, no calibration: E[q_j²] / E[k_j²] replaced by the squared gains of
         Gemma's q_norm and k_norm (1 + weight), averaged over RoPE's channel pairs (j, j + d/2)
  +ks    (keys) static s_j = E[k_j²]^(-1/2) (KVarN's per-channel normalization, static)
  +wo    (values) static s_j = (W_j / E[v_j²])^(1/4), W_j = Σ over the kv head's query heads of the squared norm
         of o_proj's column for channel j: the value error lands where o_proj does not read
  +fq    (keys) the query in float; by default it goes through q8_0 after rotation and scaling, as kvq's
         ggml-block kernels score (the emulation of q4_0+rot+center then is kvq's)
  +centerN on values: the same span means subtracted before rounding and added back (measured: worse)
  +klt   (keys with lmB, or values) a calibrated transform instead of the rotation: per layer and kv head the
         eigenbasis of A·Sx·A (A = Sq^½ for keys, the score error being ‖A e‖²; A = (o_proj's Gram matrix)^½
         for values), each coefficient over its calibrated σ, bit widths by greedy integer water-filling on
         Lloyd-Max's Gaussian distortions (B·d bits a row, 0 to 8 each; +klt1, +klt2: at least 1 or 2),
         one least-squares fp16 scale per row; keys' +qk is then implied. Needs --calib. (Measured: worse.)
  +s1    (with +klt) the chunk's first token (BOS) kept in fp16

bits/value counts everything stored per value: base bits + 16/group (the fp16 scale; chanB: 32/32, minimum
and step), +center 16/32 (+center64 16/64), +kn 16/32. +qk, +ks and +wo are per-layer constants (256 fp16 per
layer and kv head, 0.5 KiB a layer), counted as 0: they are calibrated once, not stored per token. Every
layer counts alike (kvq's bits_per_value), so the mean bits/value is (key bits + value bits) / 2.

--budget: the per-layer KL of each key format (values f32) and of each value format (keys f32) with only that
layer quantized (--sensitivity-chunks chunks), a pair's per-layer KL taken as the sum of its key's and its
value's, and kvq.model_eval.allocate_budget's exact choice of one pair per layer with mean bits/value <= the
budget; the choice is then evaluated with the --pairs.

Checks: --self-check tests the quantizers against kvq's own codecs on random rows (q8_0, q5_0, q4_0, iq4_nl,
rotation), and the "fake f32/f32" row (no quantization through this attention function) is the plumbing's
floor against the kvq f32/f32 cache. The anchor: q4_0+rot+center/q4_0 here against `kvq eval`'s 0.0376 on
the same text and chunks (docs/eval-log.md). As sink_tokens.py found, the emulation differs from the cache by
float rounding (~1e-7), which moves later layers' values across rounding boundaries: a realization noise of
~5-10% per chunk that the ± (per-token standard error) does not include. --seed changes the rotation's signs
(another realization).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np
import torch

ATTN = "kvq_format_study"
KVQ_SEED = 0x6B76715F726F7421  # kDefaultSeed, include/kvq/codec.hpp
IQ4NL = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.float32)
BT = 32  # block of tokens (kvq's default block_tokens)


# --- building blocks ----------------------------------------------------------------------------------------

def splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & (2**64 - 1)
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return state, z ^ (z >> 31)


def rotation(d: int, seed: int = KVQ_SEED) -> torch.Tensor:
    """kvq's Rotation(d, seed) as a matrix R (y = R x): normalized Walsh-Hadamard (fwht order) times the signs.
    d a power of two here."""
    assert d & (d - 1) == 0
    signs = np.empty(d, np.float32)
    state, bits = seed, 0
    for j in range(d):
        if j % 64 == 0:
            state, bits = splitmix64(state)
        signs[j] = -1.0 if (bits >> (j % 64)) & 1 else 1.0
    h = np.array([[1.0]], np.float64)
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])  # Sylvester: the fwht's butterfly order
    return torch.from_numpy((h / math.sqrt(d) * signs[None, :]).astype(np.float32))


def f16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


def _signed_max(x: torch.Tensor) -> torch.Tensor:
    """Per group (last dim): the value of largest magnitude, sign kept (ggml's 'max'), first of ties."""
    i = x.abs().argmax(dim=-1, keepdim=True)
    return x.gather(-1, i)


def q_sym(x: torch.Tensor, bits: int) -> torch.Tensor:
    """ggml q4_0 / q5_0 rounding at `bits` (q3_0: the same rule at 3): groups along the last dim."""
    half = 2 ** (bits - 1)
    d = _signed_max(x) / -half
    idv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.clamp(torch.trunc(x * idv + (half + 0.5)), max=2 * half - 1)
    return (q - half) * f16(d)


def q_search(x: torch.Tensor, bits: int) -> torch.Tensor:
    """q4_0's (q3_0's, q5_0's) layout, a better encoder: over 16 trial scales max/−(2^(b−1) − t), t in
    0..1.5, the codes round(x/d) clamped to the levels, their least-squares scale (fp16), and the trial of least
    squared error. Decodes with the same kernel as q_sym."""
    half = 2 ** (bits - 1)
    mx = _signed_max(x)
    safe = torch.where(mx != 0, mx, torch.ones_like(mx))
    best_err = best_out = None
    for t in np.linspace(0.0, 1.5, 16):
        d = safe / -(half - float(t))
        q = torch.clamp(torch.round(x / d), -half, half - 1)
        d2 = f16((q * x).sum(-1, keepdim=True) / (q * q).sum(-1, keepdim=True).clamp_min(1e-30))
        out = q * d2
        err = (out - x).pow(2).sum(-1, keepdim=True)
        if best_err is None:
            best_err, best_out = err, out
        else:
            m = err < best_err
            best_err, best_out = torch.where(m, err, best_err), torch.where(m, out, best_out)
    return torch.where(mx != 0, best_out, torch.zeros_like(x))


def q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=-1, keepdim=True) / 127
    idv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    y = x * idv
    q = torch.sign(y) * torch.floor(y.abs() + 0.5)  # roundf
    return q * f16(d)


def _nearest(table: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Index of the nearest entry of a sorted table, ties to the lower one (ggml's best_index_int8)."""
    mid = (table[1:] + table[:-1]) / 2
    return torch.bucketize(y, mid, right=False)


def iq4_nl(x: torch.Tensor) -> torch.Tensor:
    """ggml's quantize_row_iq4_nl_ref on groups of 32, as kvq has it (lib/ref/ggml_quant.cpp: ntry = −1, no
    scale search): d = max/−127, the nearest codes, then d = their least-squares scale weighted by x²."""
    v = IQ4NL
    w = x * x
    mx = _signed_max(x)
    ok = mx.abs() >= 1e-15
    idv = 1.0 / torch.where(ok, mx / v[0], torch.ones_like(mx))
    qv = v[_nearest(v, idv * x)]
    d = (w * qv * x).sum(-1, keepdim=True) / (w * qv * qv).sum(-1, keepdim=True).clamp_min(1e-38)
    return torch.where(ok, qv * f16(d), torch.zeros_like(x))


def iq4_nls(x: torch.Tensor, ntry: int = 7) -> torch.Tensor:
    """iq4_nl's table with ggml's scale search (quantize_row_iq4_nl_impl with ntry = 7, weights x², as ggml
    quantizes weights), the codes recomputed at the fp16 scale."""
    v = IQ4NL
    w = x * x
    mx = _signed_max(x)
    ok = mx.abs() >= 1e-15
    safe = torch.where(ok, mx, torch.ones_like(mx))
    qv = v[_nearest(v, x / (-safe / v[0]))]
    sqx, sq2 = (w * qv * x).sum(-1, keepdim=True), (w * qv * qv).sum(-1, keepdim=True).clamp_min(1e-38)
    d = sqx / sq2
    best = d * sqx
    for itry in range(-ntry, ntry + 1):
        qv = v[_nearest(v, x * ((itry + v[0]) / safe))]
        a, b = (w * qv * x).sum(-1, keepdim=True), (w * qv * qv).sum(-1, keepdim=True)
        better = (b > 0) & (a * a > best * b)
        dd = a / b.clamp_min(1e-38)
        d, best = torch.where(better, dd, d), torch.where(better, dd * a, best)
    d16 = f16(d)
    idv = torch.where(d16 != 0, 1.0 / d16, torch.zeros_like(d16))
    return torch.where(ok, v[_nearest(v, x * idv)] * d16, torch.zeros_like(x))


def lloyd_max(bits: int) -> torch.Tensor:
    """The Lloyd-Max levels of a standard Gaussian at `bits` bits (numerical, converged to 1e-9)."""
    from scipy.stats import norm

    n = 2 ** bits
    lv = norm.ppf((np.arange(n) + 0.5) / n)
    for _ in range(2000):
        b = np.concatenate([[-np.inf], (lv[1:] + lv[:-1]) / 2, [np.inf]])
        p = norm.cdf(b[1:]) - norm.cdf(b[:-1])
        new = (norm.pdf(b[:-1]) - norm.pdf(b[1:])) / p
        if np.abs(new - lv).max() < 1e-12:
            break
        lv = new
    return torch.tensor(lv, dtype=torch.float32)


_LM: dict[int, torch.Tensor] = {}


def lm(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Lloyd-Max Gaussian levels, one fp16 scale per group: over 16 trial scales (0.6..1.4 × the group's RMS)
    the nearest codes, their least-squares scale, the best of the trials (least squared error)."""
    if bits not in _LM:
        _LM[bits] = lloyd_max(bits)
    v = _LM[bits]
    rms = x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
    best_err = best_out = None
    for f in np.linspace(0.6, 1.4, 16):
        qv = v[_nearest(v, x / (rms * float(f)))]
        d = f16((qv * x).sum(-1, keepdim=True) / (qv * qv).sum(-1, keepdim=True).clamp_min(1e-30))
        out = qv * d
        err = (out - x).pow(2).sum(-1, keepdim=True)
        if best_err is None:
            best_err, best_out = err, out
        else:
            m = err < best_err
            best_err, best_out = torch.where(m, err, best_err), torch.where(m, out, best_out)
    return best_out


# kvq's tcqB alphabets (lib/ref/tcq.hpp; scripts/experiments/tcq_alphabet.py): 2^(B+1) levels in units of σ.
TCQ_INTS = {2: [-127, -73, -41, -13, 13, 41, 73, 127],
            3: [-127, -94, -72, -56, -42, -29, -17, -6, 6, 17, 29, 42, 56, 72, 94, 127]}
TCQ_MAX = {2: 1.8763, 3: 2.5702}


def tcq(x: torch.Tensor, bits: int) -> torch.Tensor:
    """kvq's tcqB on rows (the last axis): the 8-state trellis (subset s_j = 2·(u_j ^ u_j-1 ^ u_j-3) + u_j-2,
    rank 4·f_j + s_j), Viterbi on the row in σ units (RMS), then the least-squares fp16 scale."""
    lv = torch.tensor(TCQ_INTS[bits], dtype=torch.float64) * (TCQ_MAX[bits] / 127)
    shape = x.shape
    xr = x.reshape(-1, shape[-1]).double()
    n, d = xr.shape
    rms = xr.pow(2).mean(-1, keepdim=True).sqrt()
    t = xr / torch.where(rms > 0, rms, torch.ones_like(rms))
    sub = [2 * ((w ^ (w >> 1) ^ (w >> 3)) & 1) + ((w >> 2) & 1) for w in range(16)]  # w bit i = u_(j-i)
    subsets = [lv[s::4] for s in range(4)]
    cost = torch.full((n, 8), float("inf"), dtype=torch.float64)
    cost[:, 0] = 0
    back = torch.zeros((d, n, 8), dtype=torch.long)
    best_rank = torch.zeros((d, n, 4), dtype=torch.long)
    ar = torch.arange(n)
    for j in range(d):
        e = [(t[:, j:j + 1] - subsets[s]).pow(2).min(-1) for s in range(4)]
        bc = torch.stack([v.values for v in e], 1)  # (n, 4)
        best_rank[j] = 4 * torch.stack([v.indices for v in e], 1) + torch.arange(4)
        new = torch.full_like(cost, float("inf"))
        bk = torch.zeros((n, 8), dtype=torch.long)
        for st in range(8):
            for u in range(2):
                w = u | (st << 1)
                c = cost[:, st] + bc[:, sub[w]]
                ns = w & 7
                better = c < new[:, ns]
                new[:, ns] = torch.where(better, c, new[:, ns])
                bk[:, ns] = torch.where(better, torch.full_like(bk[:, ns], st), bk[:, ns])
        back[j] = bk
        cost = new
    st = cost.argmin(-1)
    ranks = torch.zeros((n, d), dtype=torch.long)
    for j in range(d - 1, -1, -1):
        prev = back[j][ar, st]
        w = (st & 1) | (prev << 1)
        ranks[:, j] = best_rank[j][ar, torch.tensor(sub)[w]]
        st = prev
    c = lv[ranks]
    scale = f16(((c * xr).sum(-1, keepdim=True) / (c * c).sum(-1, keepdim=True).clamp_min(1e-300)).float())
    return (c.float() * scale).reshape(shape)


def grouped(fn, x: torch.Tensor, g: int) -> torch.Tensor:
    s = x.shape
    return fn(x.reshape(*s[:-1], s[-1] // g, g)).reshape(s)


ROW_BASE = {"q8_0": (8, q8_0), "q5_0": (5, lambda x: q_sym(x, 5)), "q4_0": (4, lambda x: q_sym(x, 4)),
            "q3_0": (3, lambda x: q_sym(x, 3)), "iq4_nl": (4, iq4_nl), "iq4_nls": (4, iq4_nls),
            "q4_0s": (4, lambda x: q_search(x, 4)), "q3_0s": (3, lambda x: q_search(x, 3)), "lm4": (4, lambda x: lm(x, 4)),
            "lm3": (3, lambda x: lm(x, 3)), "lm2": (2, lambda x: lm(x, 2)),
            "tcq3": (3, lambda x: tcq(x, 3)), "tcq2": (2, lambda x: tcq(x, 2))}


def chan(x: torch.Tensor, bits: int) -> torch.Tensor:
    """kvq's chanB on (tokens, kv heads, d), per block of BT tokens: fp16 minimum and step per channel."""
    t, h, d = x.shape
    b = x.reshape(t // BT, BT, h, d)
    lo, hi = f16(b.amin(1, keepdim=True)), b.amax(1, keepdim=True)
    step = f16((hi - lo) / (2 ** bits - 1))
    code = torch.clamp(torch.round((b - lo) / torch.where(step > 0, step, torch.ones_like(step))), 0, 2 ** bits - 1)
    return (lo + step * code).reshape(t, h, d)


def block_mean(x: torch.Tensor, tokens: int) -> torch.Tensor:
    """(tokens, kv heads, d) -> the fp16 mean per channel over each block of `tokens` tokens, per token."""
    t, h, d = x.shape
    m = f16(x.reshape(t // tokens, tokens, h, d).double().mean(1, keepdim=True).float())
    return m.expand(t // tokens, tokens, h, d).reshape(t, h, d)


# --- formats -------------------------------------------------------------------------------------------------

class Format:
    """One side's format: base and modifiers (module docstring)."""

    MODS = {"rot", "center", "center64", "center128", "center256", "ccenter64", "ccenter128", "ccenter256", "g64", "g128", "g256", "kn", "qk", "qkw", "ks",
            "wo", "fq", "klt", "klt1", "klt2", "s1"}

    def __init__(self, spec: str, side: str):
        parts = spec.split("+")
        self.spec, self.side, self.base, self.mods = spec, side, parts[0], set(parts[1:])
        bad = self.mods - self.MODS
        if bad:
            raise ValueError(f"{spec}: unknown modifiers {sorted(bad)}")
        if self.base not in ROW_BASE and not self.base.startswith("chan") and self.base not in ("f32", "f16"):
            raise ValueError(f"{spec}: unknown base {self.base}")
        centers = [m for m in self.mods if "center" in m]
        if len(centers) > 1:
            raise ValueError(f"{spec}: one centering at most")
        self.causal = bool(centers) and centers[0].startswith("ccenter")  # +ccenterN: the span's first block's mean
        self.center = (int(centers[0].split("center")[1] or BT)) if centers else 0
        groups = [int(m[1:]) for m in self.mods if m.startswith("g")]
        if len(groups) > 1:
            raise ValueError(f"{spec}: one group size at most")
        if side == "v" and (self.causal or self.mods & {"kn", "qk", "qkw", "ks"}):
            raise ValueError(f"{spec}: key modifiers on values")
        if side == "k" and "wo" in self.mods:
            raise ValueError(f"{spec}: +wo is a value modifier")
        self.group = groups[0] if groups else 32

    def bits(self) -> float:
        if self.base == "f32":
            return 32.0
        if self.base == "f16":
            return 16.0
        if self.base.startswith("chan"):
            b = int(self.base[4:]) + 32 / BT
        else:
            b = ROW_BASE[self.base][0] + 16 / self.group
        if self.center:
            b += 16 / self.center
        if "kn" in self.mods:
            b += 16 / BT
        return b

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """The base rounding of rows (tokens, kv heads, d) in its own domain."""
        if self.base == "f32":
            return x
        if self.base == "f16":
            return f16(x)
        if self.base.startswith("chan"):
            return chan(x, int(self.base[4:]))
        return grouped(ROW_BASE[self.base][1], x, self.group)


class Study:
    """The formats of the current run and the calibration statistics."""

    def __init__(self, d: int, seed: int = KVQ_SEED):
        self.R = rotation(d, seed)
        self.kf: list[Format] = []  # per layer
        self.vf: list[Format] = []
        self.calib: dict[int, dict] = {}  # layer -> {"q2", "k2", "kc2", "v2", "wo"}: per-channel statistics
        self.record = False  # calibration pass: attention in float, statistics recorded
        self.weight_scale: dict[int, torch.Tensor] = {}  # layer -> +qkw's scales (kv heads, d)
        self.klt: dict[tuple, list] = {}  # (layer, side, centered, bits) -> +klt's transform per kv head


S: Study | None = None


def static_scale(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """s_j = (num_j / den_j)^(1/4), geometric mean 1 (num, den: (kv heads, d))."""
    s = (num.clamp_min(1e-12) / den.clamp_min(1e-12)).pow(0.25)
    return s / s.log().mean(-1, keepdim=True).exp()


# Lloyd-Max distortion of a unit Gaussian at 0..8 bits (D(0) = 1: the coefficient dropped).
LM_MSE = [1.0, 0.3634, 0.1175, 0.03454, 0.009497, 0.002499, 0.000642, 0.000163, 0.0000411]


def _sym_pow(m: torch.Tensor, p: float) -> torch.Tensor:
    e, u = torch.linalg.eigh(m.double())
    e = e.clamp_min(e.max() * 1e-8)
    return ((u * e.pow(p)) @ u.T).float()


def klt_transform(layer: int, side: str, centered: bool, bits: int, floor: int = 0) -> tuple:
    """+klt: per kv head the calibrated basis T (z = x·T), its inverse, each coefficient's standard deviation
    and bit width. Keys: the error weighted by the queries' second moments (A = Sq^½, the score error is
    ‖A e‖²), values by o_proj's Gram matrix (the output error); then the eigenbasis of A·Sx·A (KLT) and bit
    widths by greedy integer water-filling on Lloyd-Max's Gaussian distortions, bits·d in all."""
    key = (layer, side, centered, bits, floor)
    if key in S.klt:
        return S.klt[key]
    c = S.calib[layer]
    w = c["Sq"] if side == "k" else c["Wv"]
    sx = (c["Sk128"] if centered else c["Sk"]) if side == "k" else c["Sv"]
    out = []
    for h in range(w.shape[0]):
        a, ai = _sym_pow(w[h], 0.5), _sym_pow(w[h], -0.5)
        mu, u = torch.linalg.eigh((a @ sx[h] @ a).double())
        mu, u = mu.float().clamp_min(0), u.float()
        b = torch.full((mu.shape[0],), floor, dtype=torch.long)  # +kltF: at least F bits per coefficient
        for _ in range((bits - floor) * mu.shape[0]):
            gain = mu * (torch.tensor(LM_MSE)[b] - torch.tensor(LM_MSE + [0.0])[(b + 1).clamp_max(8)])
            gain[b >= 8] = -1
            b[int(gain.argmax())] += 1
        out.append((a @ u, u.T @ ai, mu.sqrt(), b))
    S.klt[key] = out
    return out


def klt_round(x: torch.Tensor, tr: list) -> torch.Tensor:
    """x (tokens, kv heads, d) through +klt: z = x·T, each coefficient over its σ with the Lloyd-Max levels of its
    width, one least-squares fp16 scale per row (over the coded coefficients), back with T⁻¹."""
    out = torch.empty_like(x)
    for h, (t, ti, sd, b) in enumerate(tr):
        z = x[:, h] @ t
        w = z / sd.clamp_min(1e-30)
        coded = b > 0
        rms = w[:, coded].pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
        c = torch.zeros_like(w)
        for bits in b[coded].unique().tolist():
            if bits not in _LM:
                _LM[bits] = lloyd_max(bits)
            m = b == bits
            c[:, m] = _LM[bits][_nearest(_LM[bits], w[:, m] / rms)]
        cs = c * sd
        scale = f16((cs * z).sum(-1, keepdim=True) / cs.pow(2).sum(-1, keepdim=True).clamp_min(1e-30))
        out[:, h] = (cs * scale) @ ti
    return out


def key_scores(layer: int, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q (queries, heads, d), k (tokens, kv heads, d) -> scores (heads, queries, tokens) on the key format."""
    f = S.kf[layer]
    nh, kvh = q.shape[1], k.shape[1]
    g = nh // kvh
    if f.base == "f32":
        return torch.einsum("qhd,thd->hqt", q, k.repeat_interleave(g, 1))
    m = None
    r = k
    if f.center and f.causal:
        # the mean of each span's first block of BT tokens, reused for the span's other blocks (what a cache
        # sealing every BT tokens can know when it seals them)
        t, h, d = k.shape
        m = block_mean(k, BT).reshape(t // f.center, f.center, h, d)[:, :1].expand(t // f.center, f.center, h, d)
        m = m.reshape(t, h, d)
    elif f.center:
        m = block_mean(k, f.center)
    if m is not None:
        r = k - m
    klt = [x for x in f.mods if x.startswith("klt")]
    if klt:
        kh = klt_round(r, klt_transform(layer, "k", m is not None, ROW_BASE[f.base][0], int(klt[0][3:] or 0)))
        kh = kh + m if m is not None else kh
        if "s1" in f.mods:  # the chunk's first token (BOS) kept in fp16
            kh[0] = f16(k[0])
        return torch.einsum("qhd,thd->hqt", q, kh.repeat_interleave(g, 1))
    s = None  # per-channel multiplier, (kv heads, d) static or (tokens, kv heads, d) per block
    if "qk" in f.mods:
        c = S.calib[layer]
        s = static_scale(c["q2"], c["kc2"] if m is not None else c["k2"])
    elif "qkw" in f.mods:
        s = S.weight_scale[layer]
    elif "ks" in f.mods:
        c = S.calib[layer]
        s = (c["kc2"] if m is not None else c["k2"]).clamp_min(1e-12).pow(-0.5)
    elif "kn" in f.mods:
        t, h, d = r.shape
        rms = f16(r.reshape(t // BT, BT, h, d).pow(2).mean(1, keepdim=True).sqrt())
        rms = torch.where(rms > 0, rms, torch.ones_like(rms))
        s = (1.0 / rms).expand(t // BT, BT, h, d).reshape(t, h, d)
    x = r * s if s is not None else r
    rot = "rot" in f.mods
    if rot:
        x = x @ S.R.T
    xq = f.round(x)
    static = s is None or s.dim() == 2
    if static and f.base not in ("f16",) and not f.base.startswith("chan") and "fq" not in f.mods:
        # the scores as kvq's ggml-block kernels compute them: the query (rotated, scaled) through q8_0
        qe = q / s.repeat_interleave(g, 0) if s is not None else q
        if rot:
            qe = qe @ S.R.T
        qe = grouped(q8_0, qe, 32)
        sc = torch.einsum("qhd,thd->hqt", qe, xq.repeat_interleave(g, 1))
    else:
        kh = xq @ S.R if rot else xq
        if s is not None:
            kh = kh / s
        sc = torch.einsum("qhd,thd->hqt", q, kh.repeat_interleave(g, 1))
    if m is not None:
        sc = sc + torch.einsum("qhd,thd->hqt", q, m.repeat_interleave(g, 1))
    return sc


def values(layer: int, v: torch.Tensor) -> torch.Tensor:
    f = S.vf[layer]
    if f.base == "f32":
        return v
    s = None
    if "wo" in f.mods:
        c = S.calib[layer]
        s = static_scale(c["wo"], c["v2"])
    klt = [x for x in f.mods if x.startswith("klt")]
    if klt:
        vh = klt_round(v, klt_transform(layer, "v", False, ROW_BASE[f.base][0], int(klt[0][3:] or 0)))
        if "s1" in f.mods:
            vh[0] = f16(v[0])
        return vh
    m = block_mean(v, f.center) if f.center else None  # +centerN on values: the span's fp16 mean added back
    x = v - m if m is not None else v
    x = x * s if s is not None else x
    if "rot" in f.mods:
        x = f.round(x @ S.R.T) @ S.R
    else:
        x = f.round(x)
    x = x / s if s is not None else x
    return x + m if m is not None else x


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
               softcap=None, **kwargs):
    if softcap:
        raise ValueError("soft-capped attention is not emulated here")
    if query.shape[0] != 1:
        raise ValueError("batch 1 only")
    layer = module.layer_idx
    q = query[0].transpose(0, 1).float().contiguous()  # (queries, heads, d)
    k = key[0].transpose(0, 1).float().contiguous()  # (tokens, kv heads, d)
    v = value[0].transpose(0, 1).float().contiguous()
    nq, nh, d = q.shape
    t, kvh, _ = k.shape
    if t % BT:
        raise ValueError(f"the chunk's {t} tokens are not whole blocks of {BT}")
    if layer not in S.weight_scale:
        S.weight_scale[layer] = _weight_scale(module, kvh, d)
    if S.record:
        _record(module, layer, q, k, v)
        sc, vd = torch.einsum("qhd,thd->hqt", q, k.repeat_interleave(nh // kvh, 1)), v
    else:
        sc, vd = key_scores(layer, q, k), values(layer, v)
    logits = sc * float(scaling if scaling is not None else d ** -0.5)
    if attention_mask is None:
        allow = torch.ones(nq, t, dtype=torch.bool).tril(t - nq)
    else:
        allow = attention_mask[0, 0] if attention_mask.dtype == torch.bool else attention_mask[0, 0] == 0
    logits = logits.masked_fill(~allow[None], float("-inf"))
    w = torch.softmax(logits, dim=-1)
    out = torch.matmul(w, vd.repeat_interleave(nh // kvh, 1).transpose(0, 1)).transpose(0, 1).contiguous()
    return out[None].to(query.dtype), None


def _record(module, layer: int, q, k, v):
    """Per channel, per kv head: E[q²] (over queries and the head's query heads), E[k²], E[(k − block mean)²],
    E[v²]; and o_proj's squared column norms summed over the kv head's query heads."""
    nh, kvh, d = q.shape[1], k.shape[1], q.shape[2]
    g = nh // kvh
    c = S.calib.setdefault(layer, {"n": 0})
    kc = k - block_mean(k, BT)
    st = {"q2": q.pow(2).reshape(-1, kvh, g, d).mean((0, 2)), "k2": k.pow(2).mean(0), "kc2": kc.pow(2).mean(0),
          "v2": v.pow(2).mean(0)}
    n = c["n"]
    for name, x in st.items():
        c[name] = x if n == 0 else (c[name] * n + x) / (n + 1)
    c["n"] = n + 1
    w = module.o_proj.weight.detach().float()  # (hidden, heads·d)
    c["wo"] = w.pow(2).sum(0).reshape(kvh, g, d).sum(1)
    # +klt's second moments (kv head, d, d): queries of the head's group, keys centered over 128 tokens and not,
    # values, and o_proj's Gram matrix of the group's columns
    qg = q.reshape(-1, kvh, g, d).transpose(1, 2).reshape(-1, kvh, d)
    k128 = k - block_mean(k, 128) if k.shape[0] % 128 == 0 else k
    wg = w.reshape(w.shape[0], kvh, g, d)
    full = {"Sq": torch.einsum("nhd,nhe->hde", qg, qg) / qg.shape[0], "Sk": torch.einsum("nhd,nhe->hde", k, k) / k.shape[0],
            "Sk128": torch.einsum("nhd,nhe->hde", k128, k128) / k.shape[0],
            "Sv": torch.einsum("nhd,nhe->hde", v, v) / v.shape[0], "Wv": torch.einsum("xhgd,xhge->hde", wg, wg)}
    for name, x in full.items():
        c[name] = x if n == 0 else (c[name] * n + x) / (n + 1)


def _weight_scale(module, kvh: int, d: int) -> torch.Tensor:
    """+qkw: s_j = (g_q,j² / g_k,j²)^(1/4) from the weights alone, g = 1 + the q_norm / k_norm weight (Gemma's
    RMSNorm gain per channel), the squared gains averaged over RoPE's channel pairs (j, j + d/2: rotate_half),
    which RoPE mixes; geometric mean 1."""
    gq = (1 + module.q_norm.weight.detach().float()).pow(2)
    gk = (1 + module.k_norm.weight.detach().float()).pow(2)
    pair = lambda x: ((x + x.roll(d // 2)) / 2)
    return static_scale(pair(gq)[None].expand(kvh, d), pair(gk)[None].expand(kvh, d))


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN, _attention)
    AttentionMaskInterface.register(ATTN, sdpa_mask)


# --- checks --------------------------------------------------------------------------------------------------

def self_check() -> bool:
    """The quantizers against kvq's own codecs (kvq.Codec quantize/dequantize) on random rows of 256."""
    import kvq

    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 256)) * rng.uniform(0.1, 3, (64, 1))).astype(np.float32)
    x[:, 5] += 4.0  # an outlier channel
    ok = True
    R = rotation(256)
    for name, fn in [("q8_0", lambda t: grouped(q8_0, t, 32)), ("q5_0", lambda t: grouped(lambda u: q_sym(u, 5), t, 32)),
                     ("q4_0", lambda t: grouped(lambda u: q_sym(u, 4), t, 32)), ("iq4_nl", lambda t: grouped(iq4_nl, t, 32)),
                     ("q4_0+rot", lambda t: grouped(lambda u: q_sym(u, 4), t @ R.T, 32) @ R),
                     ("tcq3", lambda t: tcq(t @ R.T, 3) @ R), ("tcq2", lambda t: tcq(t @ R.T, 2) @ R)]:
        ref = np.asarray(kvq.dequantize(kvq.quantize(x, name), name, 256))
        got = fn(torch.from_numpy(x)).numpy()
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        exact = float(np.mean(np.isclose(got, ref, rtol=1e-5, atol=1e-6)))
        ok &= exact > 0.999
        print(f"{name:10} max |fake − kvq| / max|x| {err:.2g}, values equal {100 * exact:.2f}%")
    for b in (3, 4):
        lv = lloyd_max(b)
        print(f"Lloyd-Max {b} bits: {np.round(lv.numpy(), 4).tolist()}")
    print("self-check", "passed" if ok else "FAILED")
    return ok


# --- the run -------------------------------------------------------------------------------------------------

def layer_specs(spec: str, n: int) -> list[str]:
    """'K/V' for every layer, or one pair per layer: 'P0;P1*3;...' (a run of n layers as PAIR*n), as kvq's."""
    out = []
    for part in spec.split(";"):
        p, _, rep = part.partition("*")
        out += [p] * (int(rep) if rep else 1)
    if len(out) == 1:
        out *= n
    if len(out) != n:
        raise ValueError(f"{spec}: {len(out)} layers, the model has {n}")
    return out


def compact(specs: list[str]) -> str:
    out = []
    for p in specs:
        if out and out[-1][0] == p:
            out[-1][1] += 1
        else:
            out.append([p, 1])
    return ";".join(p if n == 1 else f"{p}*{n}" for p, n in out)


class Run:
    """One evaluation: per layer a key and a value Format; `layer` set for a sensitivity run (that layer alone)."""

    def __init__(self, label: str, specs: list[str], layer: int | None = None):
        self.label, self.specs, self.layer = label, specs, layer
        self.kf = [Format(p.split("/")[0], "k") for p in specs]
        self.vf = [Format(p.split("/")[1], "v") for p in specs]

    def bits(self) -> tuple[float, float]:
        """Mean key and value bits over the layers (a sensitivity run: its layer's)."""
        idx = [self.layer] if self.layer is not None else range(len(self.specs))
        return (float(np.mean([self.kf[l].bits() for l in idx])), float(np.mean([self.vf[l].bits() for l in idx])))


def evaluate(model, tok, runs: list[Run], tokens, a, kl_stats) -> list[dict]:
    from kvq import hf

    bos, ctx = tok.bos_token_id, a.ctx
    body, first = ctx - 1, ctx // 2
    keep = ctx - first
    cache_kw = hf.cache_keyword(model)
    n_chunks = min(len(tokens) // body - a.first_chunk, a.max_chunks)
    acc = {i: {"kl": [], "nll": [], "same": 0} for i in range(len(runs))}
    base_nll = []
    for c in range(n_chunks):
        at = (a.first_chunk + c) * body
        ids = torch.tensor([[bos] + tokens[at:at + body]])
        targets = ids[0, first + 1:]
        model.set_attn_implementation(hf.ATTN_IMPLEMENTATION)
        cache = hf.KVQCache(model.config, "f32", "f32", max_batch_size=1)
        logits = model(ids, use_cache=True, logits_to_keep=keep, **{cache_kw: cache}).logits[0, :-1]
        base = torch.log_softmax(logits.float(), dim=-1)
        base_nll.append((-base.gather(1, targets[:, None])[:, 0]).numpy().astype(np.float64))
        base_top = base.argmax(-1)
        del cache, logits
        model.set_attn_implementation(ATTN)
        for i, run in enumerate(runs):
            t1 = time.time()
            S.kf, S.vf = run.kf, run.vf
            logits = model(ids, use_cache=False, logits_to_keep=keep).logits[0, :-1]
            lp = torch.log_softmax(logits.float(), dim=-1)
            kl = (base.exp() * (base - lp)).sum(-1).clamp_min(0).numpy().astype(np.float64)
            acc[i]["kl"].append(kl)
            acc[i]["nll"].append((-lp.gather(1, targets[:, None])[:, 0]).numpy().astype(np.float64))
            acc[i]["same"] += int((lp.argmax(-1) == base_top).sum())
            print(f"chunk {c + 1}/{n_chunks} {run.label}" + (f" layer {run.layer}" if run.layer is not None else "")
                  + f": KL {kl.mean():.4g} ({time.time() - t1:.0f} s)", file=sys.stderr, flush=True)
    base_ppl = math.exp(np.concatenate(base_nll).mean())
    rows = []
    for i, run in enumerate(runs):
        kl = np.concatenate(acc[i]["kl"])
        nll = np.concatenate(acc[i]["nll"])
        kb, vb = run.bits()
        rows.append({"pair": run.label, "layer": run.layer, "key_bits": kb, "value_bits": vb,
                     "bits_per_value": (kb + vb) / 2, **kl_stats(kl),
                     "kl_chunks": [float(x.mean()) for x in acc[i]["kl"]],
                     "same_top": 100.0 * acc[i]["same"] / kl.size, "ppl_ratio": math.exp(nll.mean()) / base_ppl,
                     "scored": int(kl.size), "chunks": [a.first_chunk + 1, a.first_chunk + n_chunks]})
    return rows


def print_rows(rows: list[dict]) -> None:
    print("| K/V | key bits | value bits | bits/value | KL mean ± se | per chunk | KL p99 | same top % | PPL ratio |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        ch = " / ".join(f"{x:.4g}" for x in r["kl_chunks"])
        print(f"| {r['pair']} | {r['key_bits']:.4g} | {r['value_bits']:.4g} | {r['bits_per_value']:.4g} | "
              f"{r['kl_mean']:.4g} ± {r['kl_mean_se']:.2g} | {ch} | {r['kl_p99']:.4g} | {r['same_top']:.2f} | "
              f"{r['ppl_ratio']:.4f} |", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--self-check", action="store_true")
    ap.add_argument("--text")
    ap.add_argument("--calib", help="text for the static statistics of +qk, +ks, +wo (its first chunk)")
    ap.add_argument("--calib-chunks", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--max-chunks", type=int, default=2)
    ap.add_argument("--first-chunk", type=int, default=0)
    ap.add_argument("--seed", type=lambda s: int(s, 0), default=KVQ_SEED)
    ap.add_argument("--pairs", default="", help="comma-separated KEY/VALUE pairs of this script's formats (or "
                                                "per-layer lists 'P0;P1*3;...')")
    ap.add_argument("--budget", help="comma-separated bits/value: allocate one key format of --budget-keys and "
                                     "one value format of --budget-values per layer (kvq.model_eval."
                                     "allocate_budget on per-layer KLs) and evaluate the allocation")
    ap.add_argument("--budget-keys", help="comma-separated candidate key formats for --budget")
    ap.add_argument("--budget-values", help="comma-separated candidate value formats for --budget")
    ap.add_argument("--sensitivity-chunks", type=int, help="chunks of the per-layer runs (default --max-chunks)")
    ap.add_argument("--sensitivity", help="JSON of an earlier --budget run: its per-layer rows, not measured again")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.self_check:
        return 0 if self_check() else 1
    global S
    from kvq.cli import _model_path
    from kvq.model_eval import allocate_budget, kl_stats, load_model

    _register()
    t0 = time.time()
    model, tok = load_model(_model_path(a.model))
    tc = model.config.get_text_config(decoder=True)
    n = tc.num_hidden_layers
    S = Study(tc.head_dim, a.seed)
    print(f"model loaded in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    torch.set_grad_enabled(False)
    if a.calib:
        body = a.ctx - 1
        ctoks = tok(open(a.calib, encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
        model.set_attn_implementation(ATTN)
        S.record = True
        for c in range(a.calib_chunks):
            model(torch.tensor([[tok.bos_token_id] + ctoks[c * body:(c + 1) * body]]), use_cache=False,
                  logits_to_keep=1)
        S.record = False
    tokens = tok(open(a.text, encoding="utf-8").read(), add_special_tokens=False)["input_ids"]
    runs = [Run("fake f32/f32", ["f32/f32"] * n)] + [Run(p, layer_specs(p, n)) for p in a.pairs.split(",") if p]
    sens, proposals = [], []
    if a.budget:
        keys = [p for p in a.budget_keys.split(",") if p]
        vals = [p for p in a.budget_values.split(",") if p]
        sides = [f"{k}/f32" for k in keys] + [f"f32/{v}" for v in vals]
        if a.sensitivity:
            sens = [r for r in json.load(open(a.sensitivity))["per_layer"] if r["pair"] in sides]
        else:
            srun = [Run(p, ["f32/f32"] * l + [p] + ["f32/f32"] * (n - l - 1), l) for p in sides for l in range(n)]
            sa = argparse.Namespace(**vars(a))
            sa.max_chunks = a.sensitivity_chunks or a.max_chunks
            sens = evaluate(model, tok, srun, tokens, sa, kl_stats)
        table = {(r["pair"], r["layer"]): r for r in sens}
        # Candidates: every key format with every value format; the per-layer KL of a pair is its key's KL
        # (values f32) plus its value's (keys f32) on that layer (the two add: docs/eval-log.md's table).
        cands = [f"{k}/{v}" for k in keys for v in vals]
        kl = [[table[f"{k}/f32", l]["kl_mean"] + table[f"f32/{v}", l]["kl_mean"] for k in keys for v in vals]
              for l in range(n)]
        bits = [[(Format(k, "k").bits() + Format(v, "v").bits()) / 2 for k in keys for v in vals] for _ in range(n)]
        for b in (float(x) for x in a.budget.split(",")):
            ch = allocate_budget(kl, bits, b)
            spec = compact([cands[c] for c in ch])
            proposals.append({"budget": b, "spec": spec, "kl_predicted": sum(kl[l][c] for l, c in enumerate(ch)),
                              "bits_per_value": float(np.mean([bits[l][c] for l, c in enumerate(ch)]))})
            print(f"budget {b}: {spec} (predicted KL {proposals[-1]['kl_predicted']:.4g})", file=sys.stderr)
            runs.append(Run(spec, layer_specs(spec, n)))
    rows = evaluate(model, tok, runs, tokens, a, kl_stats)
    print(f"ctx {a.ctx}, chunks {rows[0]['chunks']}, {rows[0]['scored']} scored tokens, seed {a.seed:#x}, "
          f"calibration {a.calib}; KL against the kvq f32/f32 cache\n")
    print_rows(rows)
    for p in proposals:
        r = next(r for r in rows if r["pair"] == p["spec"])
        p["kl_mean"], p["kl_mean_se"] = r["kl_mean"], r["kl_mean_se"]
        print(f"\nbudget {p['budget']}: {p['spec']}\n  bits/value {p['bits_per_value']:.4g}, predicted KL "
              f"{p['kl_predicted']:.4g}, measured {r['kl_mean']:.4g} ± {r['kl_mean_se']:.2g}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ctx": a.ctx, "first_chunk": a.first_chunk, "seed": a.seed, "text": a.text, "calib": a.calib,
                       "rows": rows, "per_layer": sens, "budget": proposals}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
