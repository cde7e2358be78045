#!/usr/bin/env python3
"""Tables of scripts/llama_cpp.sh's comparisons (stock llama.cpp vs the kvq plugin), in Markdown.

  llama_cpp_table.py bench results/bench.jsonl   llama-bench tokens/s and the plugin/stock ratios
  llama_cpp_table.py kld results/kld.txt         llama-perplexity KL divergence against stock f16
"""
import json
import re
import sys


def bench(path):
    rows = {}
    order = []
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        pair = f"{r['type_k']}/{r['type_v']}"
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']} @ d{r['n_depth']}"
        key = (pair, test)
        if key not in rows:
            rows[key] = {}
            order.append(key)
        rows[key][r["who"]] = (r["avg_ts"], r["stddev_ts"])
    print("| K/V | test | stock t/s | kvq t/s | kvq / stock |")
    print("| --- | --- | ---: | ---: | ---: |")
    for key in order:
        s, k = rows[key].get("stock"), rows[key].get("kvq")
        fmt = lambda v: f"{v[0]:.1f} ± {v[1]:.1f}" if v else "-"
        ratio = f"{k[0] / s[0]:.2f}" if s and k else "-"
        print(f"| {key[0]} | {key[1]} | {fmt(s)} | {fmt(k)} | {ratio} |")
    # The targets, where the runs have them.
    def ts(pair, test, who):
        v = rows.get((pair, test), {}).get(who)
        return v[0] if v else None
    for depth, base, factor_q in (("16384", "f16/f16", 1.5), ("32768", "f16/f16", None)):
        test = f"tg32 @ d{depth}"
        k = ts("q8_0/q4_0", test, "kvq")
        if k is None:
            continue
        f16 = ts(base, test, "stock")
        q = ts("q8_0/q4_0", test, "stock")
        parts = [f"depth {depth}: kvq q8_0/q4_0 {k:.1f} t/s"]
        if f16:
            parts.append(f"{k / f16:.2f}x stock f16 ({f16:.1f})")
        if q and factor_q:
            parts.append(f"{k / q:.2f}x stock q8_0/q4_0 ({q:.1f})")
        print("\n" + ", ".join(parts))


def kld(path):
    print("| K/V | run | PPL | mean KLD vs stock f32 (-fa 0, f32 KV) | same top token |")
    print("| --- | --- | ---: | ---: | ---: |")
    for line in open(path):
        pair, who, log = line.split()
        text = open(log, errors="replace").read()
        def grab(label):
            m = re.search(re.escape(label) + r"\s*:\s*([-\d.]+)\s*±\s*([-\d.]+)", text)
            return f"{float(m.group(1)):.6g} ± {float(m.group(2)):.2g}" if m else "?"
        print(f"| {pair} | {who} | {grab('Mean PPL(Q)')} | {grab('Mean    KLD')} | {grab('Same top p')} % |")


if __name__ == "__main__":
    {"bench": bench, "kld": kld}[sys.argv[1]](sys.argv[2])
