#!/usr/bin/env python3
"""Where the tcq2 and tcq3 alphabets (lib/ref/tcq.hpp) come from: Lloyd iterations of the 8-state trellis
quantizer on standard Gaussian samples (the coordinates of a rotated row over its RMS), symmetrized, rounded
to an int8 grid whose largest level is 127. Also prints the mean squared error per unit variance of the
trellis against scalar Lloyd-Max at the same bits, and of the other tap choices (--taps), which is how the
taps were chosen (all within 1%; the one kvq uses is the first).

    build/venv/bin/python scripts/experiments/tcq_alphabet.py [--rows 1500] [--taps]

The trellis (kvq's format): the state is (u_j-1, u_j-2, u_j-3), one stored bit u_j per value picks the branch,
the subset of the sorted 2^(B+1)-level alphabet is s_j = 2·parity(w & m1) + parity(w & m0) with w's bit i =
u_j-i (kvq: m1 = 0b1011, m0 = 0b0100), and B−1 more bits f_j pick the level 4·f_j + s_j within it.
Minutes on one core with the default rows.
"""
from __future__ import annotations

import argparse

import numpy as np


def lloyd_max(n: int, x: np.ndarray, iters: int = 300) -> np.ndarray:
    c = np.quantile(x, (np.arange(n) + 0.5) / n)
    for _ in range(iters):
        idx = np.searchsorted((c[1:] + c[:-1]) / 2, x)
        c = np.array([x[idx == k].mean() for k in range(n)])
    return c


def parity(v: int) -> int:
    return bin(v).count("1") & 1


def viterbi(x: np.ndarray, levels: np.ndarray, m1: int, m0: int) -> tuple[float, np.ndarray]:
    """Least-squares trellis path of every row of x: (mean squared error, ranks)."""
    n, d = x.shape
    sub = np.array([2 * parity(w & m1) + parity(w & m0) for w in range(16)])
    cost = np.full((n, 8), np.inf)
    cost[:, 0] = 0
    back = np.zeros((d, n, 8), np.int8)
    pick = np.zeros((d, n, 4), np.int64)
    for j in range(d):
        bc = np.empty((n, 4))
        for s in range(4):
            e = (x[:, j:j + 1] - levels[s::4][None, :]) ** 2
            pick[j, :, s] = e.argmin(1)
            bc[:, s] = e.min(1)
        new = np.full((n, 8), np.inf)
        bk = np.zeros((n, 8), np.int8)
        for st in range(8):
            for u in range(2):
                w = u | (st << 1)
                c = cost[:, st] + bc[:, sub[w]]
                better = c < new[:, w & 7]
                new[better, w & 7] = c[better]
                bk[better, w & 7] = st
        back[j] = bk
        cost = new
    ranks = np.zeros((n, d), np.int64)
    st = cost.argmin(1)
    rows = np.arange(n)
    for j in range(d - 1, -1, -1):
        prev = back[j][rows, st].astype(np.int64)
        s = sub[(st & 1) | (prev << 1)]
        ranks[:, j] = 4 * pick[j][rows, s] + s
        st = prev
    return float(cost.min(1).sum() / x.size), ranks


def train(bits: int, x: np.ndarray, m1: int, m0: int, sample: np.ndarray, iters: int = 12) -> tuple[float, np.ndarray]:
    levels = lloyd_max(2 ** (bits + 1), sample)
    for _ in range(iters):
        _, ranks = viterbi(x, levels, m1, m0)
        for k in range(len(levels)):
            hit = ranks == k
            if hit.any():
                levels[k] = x[hit].mean()
        levels = np.sort(levels)
        levels = (levels - levels[::-1]) / 2
    mse, _ = viterbi(x, levels, m1, m0)
    return mse, levels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1500)
    ap.add_argument("--taps", action="store_true", help="also train the other tap choices")
    a = ap.parse_args()
    rng = np.random.default_rng(2)
    sample = np.sort(rng.standard_normal(400_000))
    x = rng.standard_normal((a.rows, 256))
    taps = [(0b1011, 0b0100)] + ([(0b1111, 0b0100), (0b1011, 0b0110)] if a.taps else [])
    for bits in (2, 3):
        scalar = lloyd_max(2 ** bits, sample)
        lm = float(((x - scalar[np.searchsorted((scalar[1:] + scalar[:-1]) / 2, x)]) ** 2).mean())
        for m1, m0 in taps:
            mse, levels = train(bits, x, m1, m0, sample)
            top = float(np.abs(levels).max())
            ints = np.round(levels / top * 127).astype(int).tolist()
            print(f"tcq{bits} taps m1={m1:#06b} m0={m0:#06b}: mse {mse:.5f} (Lloyd-Max {lm:.5f}, "
                  f"ratio {mse / lm:.3f}); largest level {top:.4f} sigma; ints {ints}")


if __name__ == "__main__":
    main()
