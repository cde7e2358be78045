"""A prefix stored by one process and loaded by another (bench/lmcache_serde.py runs it; alone:
`python bench/lmcache_prefix.py PORT` with a redis-server on 127.0.0.1:PORT).

The K/V are kvq's synthetic LLM-like data (`kvq.dataset("llm")`: outlier channels, key bias, RoPE, a sink;
layer 0: 8 kv heads of 128, 2048 tokens, 4 queries of 32 heads), in bf16 as an engine holds them, in 8 chunks of 256.
The writer stores them with the kvq serde and measures the attention of the 4 queries on its own
round trip (encode, decode); the reader, another process, loads them from redis and measures the same.
Both print the KL of the attention weights and the relative L2 of the attention output against the bf16
K/V (FP32 math, kvq.reference_attention for the outputs); they must print the same numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

warnings.simplefilter("ignore", FutureWarning)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvq  # noqa: E402

SPEC, MODEL, TOKENS, CHUNK = "q8_0/q4_0", "kvq-bench/llm-like", 2048, 256


def data():
    d = kvq.dataset("llm", seed=0)
    k, v, q = (torch.from_numpy(np.asarray(a)[0]) for a in (d.k, d.v, d.q))  # (T, H, d), (n_q, n_heads, d)
    return k.to(torch.bfloat16), v.to(torch.bfloat16), q.float()


def chunks_of(k, v):
    kv = torch.stack([k.reshape(TOKENS, -1), v.reshape(TOKENS, -1)])[:, None]  # (2, 1 layer, T, H·d)
    return [kv[:, :, i : i + CHUNK].contiguous() for i in range(0, TOKENS, CHUNK)]


def measure(k_hat, v_hat, k, v, q):
    """KL of the attention weights (mean over query heads) and relative L2 of the output, vs the bf16 K/V."""
    n_heads, h = q.shape[1], k.shape[1]
    kl = []
    for head in range(n_heads):
        kv_head = head // (n_heads // h)
        p = torch.softmax(q[:, head] @ k[:, kv_head].float().T / k.shape[-1] ** 0.5, -1).double()
        p_hat = torch.softmax(q[:, head] @ k_hat[:, kv_head].float().T / k.shape[-1] ** 0.5, -1).double()
        kl.append((p * (p.log() - p_hat.log())).sum(-1).mean().item())
    ref = kvq.reference_attention(q.numpy(), k.float().numpy(), v.float().numpy())
    out = kvq.reference_attention(q.numpy(), k_hat.float().numpy(), v_hat.float().numpy())
    return {"kl": float(np.mean(kl)), "output_rel_l2": float(np.linalg.norm(out - ref) / np.linalg.norm(ref))}


def keys():
    from kvq_lmcache.storage import chunk_key

    return [chunk_key(bytes([i]) * 32, MODEL) for i in range(TOKENS // CHUNK)]


def storage(port):
    from kvq_lmcache.storage import Storage

    return Storage({"type": "resp", "host": "127.0.0.1", "port": port,
                    "serde": {"type": "kvq", "spec": SPEC, "head_dim": 128}}, l1_gb=0.5)


def writer(port):
    import kvq_lmcache
    from kvq_lmcache import Geometry
    from kvq_lmcache.serde import key_digest

    k, v, q = data()
    chunks = chunks_of(k, v)
    s = storage(port)
    s.store(keys(), chunks)
    codec = kvq_lmcache.serde.make_codec({"spec": SPEC, "head_dim": 128})
    own = []
    for key, c in zip(keys(), chunks):
        frame = np.empty(codec.frame_bytes(Geometry(1, CHUNK, c.shape[-1], c.dtype)), np.uint8)
        codec.encode(c, frame, model_name=MODEL, key_digest=key_digest(key))
        back = torch.empty_like(c)
        codec.decode(frame, back, model_name=MODEL, key_digest=key_digest(key))
        own.append(back)
    kv = torch.cat(own, dim=2)[:, 0]
    r = measure(kv[0].reshape(k.shape), kv[1].reshape(v.shape), k, v, q)
    r["kvq_attention_error_kl"] = kvq.attention_error(q.numpy(), k.float().numpy(), v.float().numpy(),
                                                       *SPEC.split("/"))["kl"]["mean"]
    s.close()
    print(json.dumps(r))


def two_processes(port):
    out = subprocess.run([sys.executable, __file__, str(port), "--writer"], capture_output=True, text=True, check=True)
    first = json.loads(out.stdout.strip().splitlines()[-1])
    k, v, q = data()
    s = storage(port)
    got = s.load(keys(), chunks_of(k, v)[0])
    assert all(g is not None for g in got), "the other process's prefix missed"
    kv = torch.cat(got, dim=2)[:, 0]
    second = measure(kv[0].reshape(k.shape), kv[1].reshape(v.shape), k, v, q)
    s.close()
    print(f"\n## A prefix stored by one process, loaded by another ({SPEC}, {TOKENS} tokens of kvq.dataset('llm'))\n")
    print("| process | KL of attention weights vs bf16 | output relative L2 |")
    print("|---|---:|---:|")
    print(f"| writer, its own round trip | {first['kl']:.3e} | {first['output_rel_l2']:.3e} |")
    print(f"| reader, loaded from redis | {second['kl']:.3e} | {second['output_rel_l2']:.3e} |")
    print(f"\nkvq.attention_error's KL for {SPEC} on the same data (attention on the codes): "
          f"{first['kvq_attention_error_kl']:.3e}; same numbers in both processes: "
          f"{first['kl'] == second['kl'] and first['output_rel_l2'] == second['output_rel_l2']}")


if __name__ == "__main__":
    if sys.argv[2:] == ["--writer"]:
        writer(int(sys.argv[1]))
    else:
        two_processes(int(sys.argv[1]))
