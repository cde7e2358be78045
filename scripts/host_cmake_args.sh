#!/usr/bin/env bash
# CMake arguments for a build that only runs on this host (the sanitizer builds): prints
# -DKVQ_SIMD_AVX512=OFF on an x86-64 host without AVX-512 F, BW, VL and DQ, where the avx512 level cannot
# run (kvq reports it as not compiled, and the suite tests the levels the host runs). Elsewhere nothing.
set -euo pipefail
[ "$(uname -m)" = x86_64 ] || exit 0
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
for f in avx512f avx512bw avx512vl avx512dq; do
  if ! grep -qw "$f" <<<"$flags"; then
    echo "-DKVQ_SIMD_AVX512=OFF"
    exit 0
  fi
done
