#!/usr/bin/env bash
# All tests: installs what is missing, builds incrementally, runs the C++ suite (ctest), then builds the
# out-of-tree consumer against an installed copy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
"$root/scripts/test_consumer.sh"
