#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh) and the Python package, incrementally, into build/venv (it
# sees the system's numpy, pytest and torch). Prints the venv's directory. Used by scripts/main.sh,
# scripts/test.sh and scripts/eval.sh.
# The library is the release build's (build/, configured as scripts/build.sh does; only the library
# targets are built here), installed into build/prefix; pip compiles only kvq._core against it (in
# build/py-linked-<wheel tag>, apart from the build directory of a plain `pip install .`, which compiles
# the library into the module), so the tests' library and the module's are one build, compiled once.
# setup.sh installs its base set, plus the sets named in KVQ_SETUP (scripts/eval.sh: hf). The build's and
# pip's output goes to build/python_env.log; a failure prints the part of it that says why.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
log=$build/python_env.log
# shellcheck source=quietly.sh
. "$root/scripts/quietly.sh"
"$root/scripts/setup.sh" >&2
mkdir -p "$build" && : >"$log"
if [ ! -f "$build/CMakeCache.txt" ]; then
  quietly "$log" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
fi
venv=$build/venv
# A first build compiles the library for a few minutes; an up-to-date one takes seconds.
[ -x "$venv/bin/python" ] || echo "kvq: building the library and kvq._core into $build (a few minutes; log: $log)" >&2
quietly "$log" cmake --build "$build" -j "$(nproc)" --target kvq kvq_shared kvq_research >&2
quietly "$log" cmake --install "$build" --prefix "$build/prefix" >&2
[ -x "$venv/bin/python" ] || quietly "$log" "${PYTHON:-python3}" -m venv --system-site-packages "$venv" >&2
quietly "$log" "$venv/bin/python" -m pip install --no-build-isolation --no-deps \
  --config-settings=build-dir="$build/py-linked-{wheel_tag}" \
  --config-settings=cmake.define.KVQ_PYTHON_KVQ_PREFIX="$build/prefix" "$root" >&2
echo "$venv"
