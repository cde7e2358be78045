#!/usr/bin/env bash
# The main job: installs what is missing, builds the Python package incrementally (into build/venv, the
# environment scripts/test.sh uses too), and prints `kvq table`: the accuracy-vs-compression table on the
# built-in data (gaussian and llm). Arguments go to `kvq table` (e.g. --format csv, --plot table.png).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" >&2
venv=$build/venv
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
  --config-settings=build-dir="$build/py-{wheel_tag}" "$root" >&2
"$venv/bin/kvq" table "$@"
