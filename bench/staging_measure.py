# Float32 against float16 staging of the open block (CacheConfig::staging), in one run: attention output
# error against exact float64 attention, attend time and bytes_used, on a context that is all open block
# (31 tokens) and one that is mostly sealed (4127). Run: build/venv/bin/python bench/staging_measure.py
import time, numpy as np, kvq
rng = np.random.default_rng(0)
KV, H, D = 8, 32, 128
def exact(k, v, q):
    g = H // KV; out = np.zeros((H, D))
    for h in range(H):
        s = k[:, h // g].astype(np.float64) @ q[h] / np.sqrt(D); w = np.exp(s - s.max()); w /= w.sum()
        out[h] = w @ v[:, h // g]
    return out
for n in (31, 4096 + 31):
    k = rng.standard_normal((n, KV, D), dtype=np.float32); v = rng.standard_normal((n, KV, D), dtype=np.float32)
    q = rng.standard_normal((H, D), dtype=np.float32) * 2
    ref = exact(k, v, q); res = {}
    for st in ("f32", "f16"):
        c = kvq.KVCache(1, KV, D, H, staging=st); c.add_sequence(); c.append(0, k, v)
        out = c.attend(0, q)
        t = time.perf_counter(); [c.attend(0, q) for _ in range(200)]; dt = (time.perf_counter() - t) / 200
        res[st] = (np.linalg.norm(out - ref) / np.linalg.norm(ref), dt, c.bytes_used())
    print(f"n={n}: " + "  ".join(f"{s}: out rel L2 {e:.2e}, attend {dt*1e6:.0f} us, bytes {b}" for s, (e, dt, b) in res.items())
          + f"  f16/f32 time {res['f16'][1]/res['f32'][1]:.2f}x")
