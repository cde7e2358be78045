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
for key_codec, value_codec in [("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_0", "q4_0")]:
    e = kvq.attention_error(q, k, v, key_codec, value_codec)
    print(f"K {key_codec:9} V {value_codec:9}: KL {e['kl']['mean']:.2e} (worst {e['kl']['worst']:.2e}), "
          f"output rel. L2 {e['output_l2']['mean']:.4f}, top-8 agreement {e['topk']['mean']:.3f}")
print(f"reference output: {reference.shape} {reference.dtype}")

# A paged cache for a Llama-3-8B-shaped layer stack (GQA: 32 query heads share 8 kv heads).
cache = kvq.KVCache(n_layers=2, n_kv_heads=8, head_dim=128, n_heads=32, key_codec="q8_0", value_codec="q4_0")
seq = cache.add_sequence()
prompt_k = rng.standard_normal((500, 8, 128), dtype=np.float32)  # (tokens, n_kv_heads, head_dim)
prompt_v = rng.standard_normal((500, 8, 128), dtype=np.float32)
for layer in range(cache.n_layers):
    cache.append(layer, prompt_k, prompt_v, seq=seq)
q_step = rng.standard_normal((32, 128), dtype=np.float32)           # (n_heads, head_dim)
out = cache.attend(0, q_step, seq=seq)                                # attention on the quantized bytes
ref = np.stack([kvq.reference_attention(q_step[h:h + 1], np.ascontiguousarray(prompt_k[:, h // 4]),
                                        np.ascontiguousarray(prompt_v[:, h // 4]))[0] for h in range(32)])
draft = cache.fork(seq)                                               # shares the full blocks
print(f"cache: {cache.n_tokens(seq)} tokens, {cache.bytes_per_token():.0f} B/token "
      f"(f16 would be {2 * 2 * 8 * 128 * cache.n_layers} B), {cache.bytes_used()} B used, "
      f"{cache.pool_stats()['blocks_shared']} blocks shared after fork")
print(f"cache.attend vs FP32 reference: output rel. L2 {np.linalg.norm(out - ref) / np.linalg.norm(ref):.4f}")
cache.remove(draft)
