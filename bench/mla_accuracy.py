"""Accuracy of a latent cache (DeepSeek's MLA) on a synthetic latent with DeepSeek V3's shapes.

No MLA model ships in a package here, so the latent is synthetic: per token a 512-value latent c_kv
(channels of log-normal scale, as a low-rank projection's are uneven) and 64 rope values of a larger
norm; 128 absorbed query heads over one latent per token (hsk 576, hsv 512), DeepSeek's softmax scale
1/sqrt(192). For each key codec, a kvq.KVCache(latent_values=True) holds one row per token and attends;
the float reference is softmax(q·k / sqrt(192))·c_kv on the exact latents. Prints the attention weights'
KL (scores from the codec's rows as it reads them back) and the output's relative L2 error, with the
bytes per token and layer. `kvq table --data mla` measures the same in C++ (its data set draws by this
recipe, lib/eval/mla_data.cpp: keep the two alike).

    build/venv/bin/python bench/mla_accuracy.py [--tokens 4096] [--seed 0]
"""
import argparse

import numpy as np

import kvq

HEADS, DK, DV = 128, 576, 512
SCALE = 1.0 / np.sqrt(192.0)  # DeepSeek V3: (qk_nope_head_dim + qk_rope_head_dim) ** -0.5


def synthetic(tokens: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    channel = np.exp(rng.normal(0.0, 0.5, DV)).astype(np.float32)
    latent = rng.standard_normal((tokens, DV), dtype=np.float32) * channel
    rope = 3.0 * rng.standard_normal((tokens, DK - DV), dtype=np.float32)
    k = np.concatenate([latent, rope], axis=1)
    # Queries along a few of the keys' directions, so that the softmax has peaks to get right.
    anchors = k[rng.integers(0, tokens, HEADS)]
    q = (0.08 * anchors + 0.05 * rng.standard_normal((HEADS, DK), dtype=np.float32)).astype(np.float32)
    return k, q


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    k, q = synthetic(args.tokens, rng)
    w_ref = softmax((q.astype(np.float64) @ k.T.astype(np.float64)) * SCALE)
    out_ref = w_ref @ k[:, :DV].astype(np.float64)
    print(f"DeepSeek V3 shapes: {HEADS} query heads on one {DK}-value latent row per token (values its first {DV}), "
          f"{args.tokens} tokens, seed {args.seed}\n")
    print("| key codec (the latent) | bytes/token/layer | bits/value | weights KL | output rel. L2 |")
    print("|---|--:|--:|--:|--:|")
    for codec in ["f16", "q8_0", "q5_1", "q5_0", "iq4_nl", "q4_1", "q4_0"]:
        cache = kvq.KVCache(1, 1, DK, n_heads=HEADS, key_codec=codec, value_codec="", head_dim_v=DV,
                            latent_values=True, scale=SCALE, block_tokens=256, seal="on_append")
        seq = cache.add_sequence()
        cache.append(0, k[:, None, :], None, seq=seq)
        out = cache.attend(0, q, seq=seq).astype(np.float64)
        rows = kvq.dequantize(kvq.quantize(k, codec), codec, DK).astype(np.float64)
        w = softmax((q.astype(np.float64) @ rows.T) * SCALE)
        kl = float(np.mean(np.sum(w_ref * (np.log(w_ref + 1e-30) - np.log(w + 1e-30)), axis=1)))
        rel = float(np.linalg.norm(out - out_ref) / np.linalg.norm(out_ref))
        bpt = cache.bytes_per_token()
        print(f"| {codec} | {bpt:.0f} | {8 * bpt / DK:.2f} | {kl:.2e} | {rel:.2e} |")


if __name__ == "__main__":
    main()
