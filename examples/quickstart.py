"""kvq in a minute: quantize K/V rows, and measure what it costs attention.

Run after `pip install .`:  python examples/quickstart.py
"""

import numpy as np

import kvq

rng = np.random.default_rng(0)
head_dim, n_tokens = 128, 2048

# Rows of a KV cache: one token, one kv head, head_dim values each.
k = rng.standard_normal((n_tokens, head_dim), dtype=np.float32)
v = rng.standard_normal((n_tokens, head_dim), dtype=np.float32)
q = 2 * rng.standard_normal((8, head_dim), dtype=np.float32)

# Keys as ggml block_q8_0 rows (8.5 bits per value), values as block_q4_0 rows (4.5 bits per value).
k_codes = kvq.quantize(k, "q8_0")
v_codes = kvq.quantize(v, "q4_0")
print(f"codecs: {', '.join(kvq.codecs())} (any may take +rot); SIMD: {kvq.simd_level()}")
print(f"keys   {k.nbytes:>8} B float32 -> {k_codes.nbytes:>7} B q8_0 {k_codes.shape}")
print(f"values {v.nbytes:>8} B float32 -> {v_codes.nbytes:>7} B q4_0 {v_codes.shape}")
k_back = kvq.dequantize(k_codes, "q8_0", head_dim)
print(f"q8_0 round trip: relative RMSE {np.linalg.norm(k_back - k) / np.linalg.norm(k):.4f}")

# What the compression does to attention, against the FP32 reference.
reference = kvq.reference_attention(q, k, v)
for key_codec, value_codec in [("q8_0", "q4_0"), ("q4_0", "q4_0"), ("q4_0+rot", "q4_0+rot")]:
    e = kvq.attention_error(q, k, v, key_codec, value_codec)
    print(f"K {key_codec:9} V {value_codec:9}: KL {e['kl']['mean']:.2e} (worst {e['kl']['worst']:.2e}), "
          f"output rel. L2 {e['output_l2']['mean']:.4f}, top-8 agreement {e['topk']['mean']:.3f}")
print(f"reference output: {reference.shape} {reference.dtype}")
