#!/usr/bin/env bash
# The AddressSanitizer + UndefinedBehaviorSanitizer build shared by scripts/sanitize.sh (the C++ and C
# suites) and scripts/fuzz.sh (the libFuzzer targets): one clang build directory, so CI compiles the
# library once for both. Debug keeps Eigen's and the standard library's assertions; -O1 keeps it fast.
# Usage: scripts/asan_build.sh DIR TARGET...   (incremental)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$1
shift
# A directory configured otherwise (an older GCC-only build-asan/) is configured anew.
if [ -f "$dir/CMakeCache.txt" ] && ! grep -q '^KVQ_BUILD_FUZZ:BOOL=ON' "$dir/CMakeCache.txt"; then
  rm -rf "$dir"
fi
if [ ! -f "$dir/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_C_FLAGS=-O1 -DKVQ_SANITIZE=address,undefined -DKVQ_BUILD_FUZZ=ON -DKVQ_BUILD_BENCH=OFF \
    -DKVQ_BUILD_TOOLS=OFF -DKVQ_BUILD_EXAMPLES=OFF $("$root/scripts/host_cmake_args.sh") >/dev/null
fi
cmake --build "$dir" -j "${KVQ_JOBS:-$(nproc)}" --target "$@"
