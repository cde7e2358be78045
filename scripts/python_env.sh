#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh) and the Python package, incrementally, into build/venv (it
# sees the system's numpy, pytest and torch; pip compiles kvq._core in build/py-<wheel tag>). Prints the
# venv's directory. Used by scripts/main.sh, scripts/test.sh and scripts/eval.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" >&2
venv=$build/venv
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
  --config-settings=build-dir="$build/py-{wheel_tag}" "$root" >&2
echo "$venv"
