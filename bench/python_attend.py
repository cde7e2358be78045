"""How much calling kvq through Python costs: KVCache.attend at 32k tokens from Python against the C++
decode benchmark (bench/bench_decode.cpp, same layer shape, codecs, context and threads), in one run.

    python bench/python_attend.py                # needs `pip install .` and the C++ build (scripts/build.sh)
    python bench/python_attend.py --tokens 4096 --threads 2 --key q8_0 --value q8_0

Prints per-call times (min and median over repetitions, each repetition the mean of a batch of calls) and
two ratios Python / C++ (1.00 = no overhead):
- against kvq_bench's decode benchmark (another process; Python batches run before and after it, so drift
  on a shared machine hits both sides alike);
- against a C++ loop over the very same cache in this process (KVCache._time_attend), batches alternated
  with the Python ones: the cleanest measure of what the Python call adds.
Then the fixed cost of one call on a 1-token cache, and the speed-up of two Python threads attending two
sequences at once over one after the other (the GIL is released inside attend).
"""

import argparse
import json
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

import kvq

KV_HEADS, HEADS, HEAD_DIM = 8, 32, 128  # Llama 3 8B, as in bench_decode.cpp
CHUNK = 4096


def llama3_layer(args, tokens, n_sequences=1):
    cache = kvq.KVCache(1, KV_HEADS, HEAD_DIM, HEADS, args.key, args.value, threads=args.threads)
    rng = np.random.default_rng(42)
    k = rng.standard_normal((CHUNK, KV_HEADS, HEAD_DIM), dtype=np.float32)
    v = rng.standard_normal((CHUNK, KV_HEADS, HEAD_DIM), dtype=np.float32)
    seqs = [cache.add_sequence() for _ in range(n_sequences)]
    for seq in seqs:
        for start in range(0, tokens, CHUNK):
            n = min(CHUNK, tokens - start)
            cache.append(0, k[:n], v[:n], seq=seq)
    return cache, seqs


def batch_means(call, repetitions, batch):
    """Mean seconds per call of `batch` consecutive calls, `repetitions` times: (wall, cpu of this thread)."""
    call()  # warm-up
    wall, cpu = [], []
    for _ in range(repetitions):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(batch):
            call()
        wall.append((time.perf_counter() - t0) / batch)
        cpu.append((time.thread_time() - c0) / batch)
    return wall, cpu


def cpp_decode_seconds(args):
    name = f"decode/{args.key}/{args.value}/{args.tokens >> 10}k/threads:{args.threads}/"
    cmd = [str(args.bench), f"--benchmark_filter=^{name}", f"--benchmark_repetitions={args.repetitions}",
           "--benchmark_format=json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    runs = [b for b in json.loads(done.stdout)["benchmarks"] if b.get("run_type") == "iteration"]
    if not runs:
        raise SystemExit(f"{args.bench} has no benchmark {name} (its contexts are 4k, 32k and 128k)")
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    return ([b["real_time"] * scale[b["time_unit"]] for b in runs],
            [b["cpu_time"] * scale[b["time_unit"]] for b in runs], runs[0].get("x_floor"))


def two_threads_speedup(args):
    cache, (a, b) = llama3_layer(args, args.tokens, n_sequences=2)
    q = np.random.default_rng(7).standard_normal((HEADS, HEAD_DIM), dtype=np.float32)
    n = max(2, args.batch // 2)

    def serial():
        for _ in range(n):
            cache.attend(0, q, seq=a)
            cache.attend(0, q, seq=b)

    def parallel():
        threads = [threading.Thread(target=lambda s=s: [cache.attend(0, q, seq=s) for _ in range(n)]) for s in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    t_serial = min(batch_means(serial, 3, 1)[0])
    t_parallel = min(batch_means(parallel, 3, 1)[0])
    return t_serial / t_parallel


def main():
    root = Path(__file__).resolve().parents[1]
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=32 << 10, help="context length (4096, 32768 or 131072)")
    p.add_argument("--threads", type=int, default=1, choices=(1, 2))
    p.add_argument("--key", default="q8_0")
    p.add_argument("--value", default="q4_0")
    p.add_argument("--repetitions", type=int, default=5)
    p.add_argument("--batch", type=int, default=10, help="calls per Python repetition")
    p.add_argument("--bench", type=Path, default=root / "build" / "bench" / "kvq_bench")
    p.add_argument("--no-threads-demo", action="store_true", help="skip the two-thread measurement")
    args = p.parse_args()

    cache, (seq,) = llama3_layer(args, args.tokens)
    q = np.random.default_rng(7).standard_normal((HEADS, HEAD_DIM), dtype=np.float32)
    attend = lambda: cache.attend(0, q, seq=seq)  # noqa: E731
    half = max(1, args.repetitions // 2)
    py, py_cpu = batch_means(attend, half, args.batch)
    cpp, cpp_cpu, x_floor = cpp_decode_seconds(args) if args.bench.exists() else (None, None, None)
    more, more_cpu = batch_means(attend, args.repetitions - half, args.batch)
    py, py_cpu = py + more, py_cpu + more_cpu

    # Same cache, same query: a Python batch, then a C++ loop of as many calls, alternately.
    pairs = []
    for _ in range(args.repetitions):
        py_mean = batch_means(attend, 1, args.batch)[0][0]
        pairs.append((py_mean, cache._time_attend(0, q, seq=seq, calls=args.batch)))

    tiny, (tiny_seq,) = llama3_layer(args, 1)
    tiny_py = min(batch_means(lambda: tiny.attend(0, q, seq=tiny_seq), 5, 2000)[0])
    tiny_cpp = min(tiny._time_attend(0, q, seq=tiny_seq, calls=2000) for _ in range(5))
    overhead = max(tiny_py - tiny_cpp, 0.0)

    ms = lambda s: f"{s * 1e3:8.3f} ms"  # noqa: E731
    print(f"kvq {kvq.__version__}, SIMD {kvq.simd_level()}: one decode step of a Llama-3-8B layer "
          f"({HEADS} heads, {KV_HEADS} kv heads, head_dim {HEAD_DIM}), K {args.key} / V {args.value}, "
          f"{args.tokens} tokens, {args.threads} thread(s), {cache.bytes_per_token() * args.tokens / 1e6:.1f} MB read")
    print(f"Python KVCache.attend : min {ms(min(py))}, median {ms(statistics.median(py))} "
          f"({len(py)} x {args.batch} calls)")
    if cpp is None:
        print(f"C++ benchmark not found at {args.bench}: build it with scripts/build.sh (KVQ_BUILD_BENCH=ON)")
    else:
        print(f"C++ KVCache::attend   : min {ms(min(cpp))}, median {ms(statistics.median(cpp))} "
              f"(kvq_bench decode, {len(cpp)} repetitions; {x_floor:.2f} x the bandwidth floor)")
        print(f"ratio Python / C++    : min {min(py) / min(cpp):.3f}, median {statistics.median(py) / statistics.median(cpp):.3f}")
        if args.threads == 1:  # CPU time of the calling thread: steadier than wall time on a busy machine
            print(f"CPU time per call     : Python {ms(statistics.median(py_cpu))}, C++ {ms(statistics.median(cpp_cpu))}, "
                  f"ratio {statistics.median(py_cpu) / statistics.median(cpp_cpu):.3f} (medians)")
    in_process = [p / c for p, c in pairs]
    print(f"same cache, C++ loop  : median {ms(statistics.median(c for _, c in pairs))}; Python median "
          f"{ms(statistics.median(p for p, _ in pairs))}; ratio Python / C++ median {statistics.median(in_process):.3f} "
          f"(min {min(in_process):.3f}, max {max(in_process):.3f}, {len(pairs)} alternated batches)")
    print(f"cost of the Python call itself (1-token cache: {tiny_py * 1e6:.1f} us from Python, "
          f"{tiny_cpp * 1e6:.1f} us from C++): {overhead * 1e6:.1f} us = {overhead / min(py) * 100:.4f}% of the "
          f"{args.tokens}-token call")
    if not args.no_threads_demo:
        print(f"two Python threads on two sequences: {two_threads_speedup(args):.2f}x the speed of one after the other "
              f"(GIL released; 2.0 is the limit with 2 free cores)")


if __name__ == "__main__":
    main()
