#!/usr/bin/env bash
# The neon level under qemu-aarch64, for x86 machines (installs g++-aarch64-linux-gnu and qemu-user when
# missing): the quantizers and block-codec scores against the specification (tests/neon/quantize_parity.cpp,
# tests/neon/score_parity.cpp), then the engine library cross-compiled whole and kvq::selftest() run on it
# (tests/neon/selftest.cpp: every codec at the neon level, the softmax, the primitives' contracts, cache
# attention). Exits non-zero if anything differs from the specification.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq g++-aarch64-linux-gnu qemu-user >/dev/null
fi
work=${TMPDIR:-/tmp}/kvq_neon
mkdir -p "$work/include"
ln -sfn /usr/include/xsimd "$work/include/xsimd"  # header-only; the host's other headers stay out
flags=(-O2 -std=c++20 -ffp-contract=off -DKVQ_SIMD_NEON -I "$root/include" -I "$root/lib" -isystem "$work/include")
for t in quantize_parity score_parity; do
  aarch64-linux-gnu-g++ -static "${flags[@]}" "$root/tests/neon/$t.cpp" "$root/lib/ref/ggml_quant.cpp" -o "$work/$t"
  qemu-aarch64 "$work/$t"
done
# The engine library's sources (not eval: Eigen and the research tools are not needed here), compiled in
# parallel, then linked with the selftest driver.
sources=("$root"/lib/ref/*.cpp "$root"/lib/codec/*.cpp "$root"/lib/rotation/*.cpp "$root"/lib/attention/*.cpp "$root"/lib/cache/*.cpp
         "$root"/lib/check/*.cpp "$root"/lib/simd/dispatch.cpp "$root"/lib/simd/cpu_levels.cpp "$root"/lib/simd/selfcheck.cpp
         "$root"/lib/simd/level_check.cpp "$root"/lib/simd/level_neon.cpp)
objects=()
for src in "${sources[@]}"; do
  obj="$work/$(echo "${src#$root/}" | tr / _).o"
  objects+=("$obj")
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$(find "$root/lib" "$root/include" -newer "$obj" -name '*.hpp' -print -quit)" ]; then
    echo "aarch64 $src"
    aarch64-linux-gnu-g++ "${flags[@]}" -c "$src" -o "$obj" &
    while [ "$(jobs -r | wc -l)" -ge "$(nproc)" ]; do wait -n; done
  fi
done
wait
aarch64-linux-gnu-g++ -static "${flags[@]}" "$root/tests/neon/selftest.cpp" "${objects[@]}" -lpthread -o "$work/selftest"
qemu-aarch64 "$work/selftest"
