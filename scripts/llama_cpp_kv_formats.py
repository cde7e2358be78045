#!/usr/bin/env python3
"""Checks KVQ_KV_FORMATS (docs/llama-cpp.md, "kvq's formats in llama.cpp") on the pinned llama.cpp's tools
and a real model: called by scripts/llama_cpp.sh kv-formats (and test).

usage: llama_cpp_kv_formats.py BIN_DIR PLUGIN MODEL OUT_DIR [FORMATS]

1. every quantized layer's K and V slot says which kvq format it holds, and greedy generation runs;
2. KL divergence on a short text (llama-perplexity, 4 sequences of 512 tokens decoded together) against
   stock llama.cpp's f32 attention: stock q4_0/q4_0 and the mode in the q4_0 slots, the mode's within a
   bound;
3. what the mode cannot compute is refused, not computed wrong: attention without flash attention (-fa off
   with q4_0 keys and f16 values) fails with the plugin's message;
4. a state saved in the mode and loaded in the mode gives the same generation (llama-completion
   --prompt-cache).
"""
import os
import re
import subprocess
import sys

bin_dir, plugin, model, out = sys.argv[1:5]
formats = sys.argv[5] if len(sys.argv) > 5 else "turbo4"
os.makedirs(out, exist_ok=True)
failures = []


def run(name, args, kvq_formats=None, plugin_loaded=True):
    env = {k: v for k, v in os.environ.items() if k not in ("GGML_BACKEND_PATH", "KVQ_KV_FORMATS")}
    if plugin_loaded:
        env["GGML_BACKEND_PATH"] = plugin
    if kvq_formats:
        env["KVQ_KV_FORMATS"] = kvq_formats
    p = subprocess.run([f"{bin_dir}/{args[0]}", "-m", model, "-t", "2"] + args[1:], env=env, capture_output=True, text=True)
    with open(f"{out}/{name}.log", "w") as f:
        f.write(p.stderr)
    return p


def check(ok, what):
    print(f"{'ok' if ok else 'FAILED'}: {what}")
    if not ok:
        failures.append(what)


# 1. generation in the mode, and the log's per-layer formats
gen = ["llama-completion", "-p", "The history of the printing press", "-n", "32", "--temp", "0", "-no-cnv",
       "--no-display-prompt", "-s", "1", "-fa", "on", "-ctk", "q4_0", "-ctv", "q4_0", "-c", "1024"]
p = run("gen-kvq", gen, formats)
layers = re.findall(r"KVQ_KV_FORMATS: layer (\d+) ([KV]) \(.*?\): (\S+),", p.stderr)
import gguf  # noqa: E402  (the hf set's; the model's layer count)
reader = gguf.GGUFReader(model)
arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
n_layers = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
check(p.returncode == 0 and len(p.stdout.split()) >= 8, f"generation with KVQ_KV_FORMATS={formats} (-ctk q4_0 -ctv q4_0 -fa on)")
named = {(int(l), kv) for l, kv, _ in layers}  # a context made twice (llama.cpp's parameter fitting) logs twice
check(n_layers > 0 and named == {(l, kv) for l in range(n_layers) for kv in "KV"},
      f"the log names a format for each layer's K and V ({len(named)} of {2 * n_layers})")
print("   kvq mode:", " ".join(p.stdout.split()[:24]))
stock = run("gen-stock", gen, plugin_loaded=False)
print("   stock   :", " ".join(stock.stdout.split()[:24]))

# 2. KL divergence against stock's f32 attention (-fa off, f32 cache)
text = f"{out}/kv-formats-text.txt"
if not os.path.exists(text):
    with open(text, "w") as f:  # license texts: not a text the docs' accuracy runs tuned on
        for name in ("Apache-2.0", "MPL-2.0"):
            f.write(open(f"/usr/share/common-licenses/{name}").read())
ppl = ["llama-perplexity", "-f", text, "-c", "512", "--chunks", "8", "-b", "2048", "--kl-divergence-base", f"{out}/kv-formats-base.kld"]
base = run("kld-base", ppl + ["-fa", "off", "-ctk", "f32", "-ctv", "f32"], plugin_loaded=False)
check(base.returncode == 0, "the f32 base logits")


def kld(name, args, kvq_formats=None, plugin_loaded=True):
    p = run(name, ppl + ["--kl-divergence"] + args, kvq_formats, plugin_loaded)
    m = re.search(r"Mean\s+KLD:\s+([0-9.]+)\s+±\s+([0-9.]+)", p.stdout + p.stderr)
    top = re.search(r"Same top p:\s+([0-9.]+)", p.stdout + p.stderr)
    return (float(m.group(1)), float(m.group(2)), float(top.group(1)) if top else float("nan")) if m else None


q4 = ["-fa", "on", "-ctk", "q4_0", "-ctv", "q4_0"]
stock_q4 = kld("kld-stock-q4_0", q4, plugin_loaded=False)
mode_q4 = kld("kld-kvq-q4_0", q4, formats)
print(f"   KLD stock q4_0/q4_0: {stock_q4}; kvq mode ({formats}) in the q4_0 slots: {mode_q4}")
check(stock_q4 is not None and mode_q4 is not None, "KL divergence measured")
# The bound: the mode may not be worse than stock's q4_0 (the formats fit the same bytes).
check(mode_q4 is not None and stock_q4 is not None and mode_q4[0] <= stock_q4[0] + 2 * stock_q4[1],
      "the mode's KL in the q4_0 slots is at most stock q4_0's")

# 3. refused, not wrong: attention without flash attention reads the K cache with MUL_MAT
p = run("refuse-fa-off", ["llama-completion", "-p", "Hello", "-n", "4", "-no-cnv", "-fa", "off", "-ctk", "q4_0", "-ctv", "f16"], formats)
check(p.returncode != 0 and "KVQ_KV_FORMATS: refused" in p.stderr, "-fa off in the mode fails with the plugin's refusal")
print("   " + next((l for l in p.stderr.splitlines() if "refused" in l), "(no refusal message)")[:200])

# 4. state save and load in the mode: the second run loads the first's KV cache and generates the same
cache = f"{out}/kv-formats-state.bin"
if os.path.exists(cache):
    os.remove(cache)
state = gen[:2] + ["The history of the printing press in Europe began in", "-n", "16"] + gen[5:] + ["--prompt-cache", cache]
first = run("state-save", state, formats)
second = run("state-load", state, formats)
loaded = "loaded a session" in second.stderr or "attempting to load saved session" in second.stderr
check(first.returncode == 0 and second.returncode == 0 and loaded and first.stdout == second.stdout,
      "a state saved in the mode loads in the mode and generates the same tokens")

print(f"kv-formats: {len(failures)} failed" + (": " + "; ".join(failures) if failures else ""))
sys.exit(1 if failures else 0)
