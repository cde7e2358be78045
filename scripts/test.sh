#!/usr/bin/env bash
# All tests: installs what is missing, builds incrementally, runs the C++ suite (ctest), builds the
# out-of-tree consumer against an installed copy, then the sanitizer runs (scripts/sanitize.sh: the
# suite under ASan+UBSan, the concurrency tests under TSan).
# KVQ_QUICK=1 skips the sanitizer runs (for a quick local check; CI runs everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
"$root/scripts/test_consumer.sh"
if [ "${KVQ_QUICK:-0}" != 1 ]; then
  "$root/scripts/sanitize.sh" all
fi
