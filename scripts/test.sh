#!/usr/bin/env bash
# All tests: installs what is missing, builds incrementally, runs the C++ suite (ctest), builds the
# out-of-tree consumer against an installed copy, then the sanitizer runs (scripts/sanitize.sh: the
# suite under ASan+UBSan, the concurrency tests under TSan) and a short run of every libFuzzer target
# (scripts/fuzz.sh, KVQ_FUZZ_SECONDS each, 30 here).
# KVQ_QUICK=1 skips the sanitizer and fuzz runs (for a quick local check; CI runs everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
"$root/scripts/test_consumer.sh"
if [ "${KVQ_QUICK:-0}" != 1 ]; then
  "$root/scripts/sanitize.sh" all
  KVQ_FUZZ_SECONDS=${KVQ_FUZZ_SECONDS:-30} "$root/scripts/fuzz.sh"
fi
