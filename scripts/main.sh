#!/usr/bin/env bash
# The main job: installs what is missing, builds incrementally, prints the accuracy-vs-compression
# table on the built-in data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/build.sh" >&2
"$build/tools/kvq-cli" table "$@"
