#!/usr/bin/env bash
# All tests: installs what is missing, builds incrementally, runs the C++ suite (ctest).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
