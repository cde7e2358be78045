#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh) and the Python package, incrementally, into build/venv (it
# sees the system's numpy, pytest and torch). Prints the venv's directory. Used by scripts/main.sh,
# scripts/test.sh and scripts/eval.sh.
# The library is the release build's (build/, configured as scripts/build.sh does; only the library
# targets are built here), installed into build/prefix; pip compiles only kvq._core against it (in
# build/py-linked-<wheel tag>, apart from the build directory of a plain `pip install .`, which compiles
# the library into the module), so the tests' library and the module's are one build, compiled once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" >&2
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target kvq kvq_shared kvq_research >&2
cmake --install "$build" --prefix "$build/prefix" >/dev/null
venv=$build/venv
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
  --config-settings=build-dir="$build/py-linked-{wheel_tag}" \
  --config-settings=cmake.define.KVQ_PYTHON_KVQ_PREFIX="$build/prefix" "$root" >&2
echo "$venv"
