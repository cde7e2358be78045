"""kvq as LMCache's serde, measured (docs/lmcache.md): bytes per chunk against raw bf16 and LMCache's fp8
serde, serialize/deserialize throughput on one core (GB/s of bf16 input) against fp8's, store/load of a
4k-token prefix through a redis-server on loopback, and a prefix stored by one process and loaded by another.

    build/venv-lmcache/bin/python bench/lmcache_serde.py      # after scripts/test.sh (LMCache 0.5.6, redis-server)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import warnings

warnings.simplefilter("ignore", FutureWarning)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import kvq  # noqa: E402
import kvq_lmcache  # noqa: E402
from kvq_lmcache import ChunkCodec, Geometry  # noqa: E402
from kvq_lmcache.frame import digest16  # noqa: E402

CHUNK = 256  # LMCache's default chunk size (tokens)
# docs/eval.md, kvq eval --budget on Gemma 3 270M (18 layers): the 4.5- and 3.5-bit per-layer proposals.
GEMMA_45 = ("chan3/polar:budget=3;q4_0+rot+center/q4_0;q5_0+rot+center/q4_0;q4_0+rot+center/q4_0;"
            "q5_0+rot+center/q4_0*2;chan3/polar:budget=3;q4_0+rot+center/q4_0;q5_0+rot+center/q4_0;"
            "q4_0+rot+center/q4_0;q5_0+rot+center/q4_0;q8_0/q4_0;q4_0+rot+center/q4_0;chan3/polar:budget=3*5")
GEMMA_35 = "chan3/polar:budget=3*4;q5_0+rot+center/polar:budget=3;chan3/polar:budget=3*11;chan2/polar:budget=3*2"
MODELS = {  # name: (layers, kv heads, head_dim, {label: spec})
    "Gemma 3 270M": (18, 1, 256, {"q8_0/q4_0": "q8_0/q4_0", "4.5-bit proposal": GEMMA_45, "3.5-bit proposal": GEMMA_35}),
    "Llama-3-8B shape": (32, 8, 128, {"q8_0/q4_0": "q8_0/q4_0", "4.5 bits (q5_0+rot+center/polar:budget=3)":
                                      "q5_0+rot+center/polar:budget=3", "3.5 bits (chan3/polar:budget=3)":
                                      "chan3/polar:budget=3"}),
}


class Obj:
    """What LMCache's serdes read of a MemoryObj."""

    def __init__(self, t):
        self.tensor = t


def chunk(layers, heads, d, tokens=CHUNK, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, layers, tokens, heads * d, generator=g).to(torch.bfloat16)


def best_of(f, n=5):
    f()
    return min((lambda t0: (f(), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(n))


def codec_rows():
    from lmcache.v1.distributed.serde.fp8 import Fp8QuantizationDeserializer, Fp8QuantizationSerializer

    torch.set_num_threads(1)
    print("## Bytes per 256-token chunk and one core's throughput (GB/s of bf16 input)\n")
    print("| model | format | bytes/chunk | × bf16 | serialize GB/s | deserialize GB/s |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (layers, heads, d, specs) in MODELS.items():
        kv = chunk(layers, heads, d)
        raw = kv.numel() * 2
        fp8_s, fp8_d = Fp8QuantizationSerializer(), Fp8QuantizationDeserializer()
        buf, back = torch.empty(kv.numel(), dtype=torch.uint8), torch.empty_like(kv)
        ts = best_of(lambda: fp8_s.serialize(Obj(kv), Obj(buf), None))
        td = best_of(lambda: fp8_d.deserialize(Obj(buf), Obj(back), None))
        print(f"| {name} | bf16 (raw) | {raw} | 1.000 | | |")
        print(f"| {name} | LMCache fp8 | {kv.numel()} | 0.500 | {raw / ts / 1e9:.2f} | {raw / td / 1e9:.2f} |")
        for label, spec in specs.items():
            codec = ChunkCodec(spec, head_dim=d)
            n = codec.frame_bytes(Geometry(layers, CHUNK, heads * d, torch.bfloat16))
            out, key = np.empty(n, np.uint8), digest16(b"k")
            ts = best_of(lambda: codec.encode(kv, out, model_name="m", key_digest=key))
            td = best_of(lambda: codec.decode(out, back, model_name="m", key_digest=key))
            print(f"| {name} | kvq {label} | {n} | {n / raw:.3f} | {raw / ts / 1e9:.2f} | {raw / td / 1e9:.2f} |")
    torch.set_num_threads(os.cpu_count() or 1)


def start_redis():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([shutil.which("redis-server"), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    import redis

    for _ in range(100):
        try:
            redis.Redis(port=port).ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def redis_rows(port):
    from kvq_lmcache.storage import Storage, chunk_key

    print("\n## A 4k-token prefix (16 chunks of 256) stored and loaded through redis-server on 127.0.0.1\n")
    print("| model | serde | stored bytes | store s | load s | codec alone s (one core) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, (layers, heads, d, specs) in MODELS.items():
        chunks = [chunk(layers, heads, d, seed=i) for i in range(16)]
        for label, serde in [("fp8", {"type": "fp8"}), ("kvq q8_0/q4_0", {"type": "kvq", "spec": "q8_0/q4_0", "head_dim": d}),
                             ("kvq " + list(specs)[2], {"type": "kvq", "spec": list(specs.values())[2], "head_dim": d})]:
            s = Storage({"type": "resp", "host": "127.0.0.1", "port": port, "serde": serde}, l1_gb=2)
            keys = [chunk_key(os.urandom(32), name.replace(" ", "-")) for _ in chunks]
            t0 = time.perf_counter()
            s.store(keys, chunks)
            t_store = time.perf_counter() - t0
            s.drop_l1()
            t0 = time.perf_counter()
            got = s.load(keys, chunks[0])
            t_load = time.perf_counter() - t0
            assert all(g is not None for g in got), f"{label}: a chunk missed"
            stored = sum(s.stored_bytes(k) for k in keys)
            codec_s = ""
            if serde["type"] == "kvq":
                codec = kvq_lmcache.serde.make_codec({k: v for k, v in serde.items() if k != "type"})
                out = np.empty(codec.frame_bytes(Geometry(layers, CHUNK, heads * d, torch.bfloat16)), np.uint8)
                torch.set_num_threads(1)
                t = best_of(lambda: [codec.encode(c, out, model_name="m", key_digest=b"k" * 16) for c in chunks], 1)
                torch.set_num_threads(os.cpu_count() or 1)
                codec_s = f"{t:.3f}"
            print(f"| {name} | {label} | {stored} | {t_store:.3f} | {t_load:.3f} | {codec_s} |")
            s.close()


if __name__ == "__main__":
    print(f"kvq {kvq.__version__ if hasattr(kvq, '__version__') else ''} SIMD level {kvq.simd_level()}; "
          f"torch {torch.__version__}; {os.cpu_count()} CPUs\n")
    codec_rows()
    proc, port = start_redis()
    try:
        redis_rows(port)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from lmcache_prefix import two_processes

        two_processes(port)
    finally:
        proc.terminate()
        proc.wait()
