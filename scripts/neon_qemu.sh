#!/usr/bin/env bash
# The neon level's quantizers and block-codec scores under qemu-aarch64 (tests/neon/quantize_parity.cpp,
# tests/neon/score_parity.cpp), for x86 machines that have aarch64-linux-gnu-g++ and qemu-user. Exits
# non-zero if any block or score differs from the specification.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
for t in quantize_parity score_parity; do
  out=${TMPDIR:-/tmp}/kvq_neon_$t
  aarch64-linux-gnu-g++ -static -O2 -std=c++20 -ffp-contract=off -DKVQ_SIMD_NEON -I "$root/include" -I "$root/lib" \
    "$root/tests/neon/$t.cpp" "$root/lib/codec/ggml_quant.cpp" -o "$out"
  qemu-aarch64 "$out"
done
