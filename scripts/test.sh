#!/usr/bin/env bash
# All tests: installs what is missing, builds incrementally, runs the C++ suite (ctest), then every SIMD
# level's code whatever this CPU lacks (scripts/simd_levels.sh: ctest ran the levels the CPU has; on an
# AVX512-VNNI CPU the avx512 level's build without VNNI runs natively; neon is cross-compiled and run
# under qemu-aarch64; an x86 level the CPU lacks runs under qemu-x86_64 where qemu emulates it, AVX2 yes,
# AVX-512 no, and a level nothing here runs is reported "not tested on this machine", never as passed),
# llama.cpp's test-backend-ops on kvq's ggml plugin (scripts/llama_cpp.sh test), builds the out-of-tree
# consumer against an installed copy, installs the Python package and runs its tests (pytest) and kvq-lmcache's
# (LMCache 0.5.6 and a redis-server, installed for them only: integrations/lmcache), then the
# sanitizer runs (scripts/sanitize.sh: the suite under ASan+UBSan, the concurrency tests under TSan) and a
# short run of every libFuzzer target (scripts/fuzz.sh, KVQ_FUZZ_SECONDS each, 20 here). KVQ_SANITIZE_ALL=0
# skips the sanitizer and fuzz runs (a quick local run; CI runs them).
# The Python tests include kvq.hf on tiny random transformers models and one test on the real Gemma 3 270M
# GGUF model (pytest marker real_model, ~1-2 min; KVQ_PYTEST_ARGS='-m "not real_model"' leaves it out).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
# Each phase's wall time goes to stderr (CI's log shows where the minutes go).
phase_start=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)" >&2; phase_start=$SECONDS; }
# The test set: the main job's base set plus what only these phases need (scripts/setup.sh).
"$root/scripts/setup.sh" test
export KVQ_SETUP_DONE=1  # later phases skip the checks
"$root/scripts/build.sh"
phase build

# The TSan build compiles at the lowest priority while the tests below run (pytest leaves most of a
# core idle); the TSan phase waits for it. Its output goes to the log printed if it fails.
prebuild=""
if [ "${KVQ_SANITIZE_ALL:-1}" = 1 ]; then
  # Its own session (setsid), so that it is stopped with its compilers if a phase fails before the wait.
  # A new session is a new scheduling autogroup on Linux, where nice only ranks processes within their
  # group: the group's own nice (/proc/self/autogroup) is what lowers it against the tests.
  KVQ_SANITIZE_BUILD_ONLY=1 setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' \
    _ "$root/scripts/sanitize.sh" tsan >"$build/tsan-prebuild.log" 2>&1 &
  prebuild=$!
  trap 'kill -- "-$prebuild" 2>/dev/null || true' EXIT
fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
phase ctest
# ~20 s when the cross-compiled objects are built or in ccache (first time: ~2-5 min of compiling).
"$root/scripts/simd_levels.sh"
phase levels
# kvq's ggml backend plugin in a stock llama.cpp (the pinned llama-cpp-python sdist's, built with ccache):
# llama.cpp's own test-backend-ops compares its flash attention with ggml's CPU backend
# (scripts/llama_cpp.sh, docs/llama-cpp.md).
"$root/scripts/llama_cpp.sh" test
phase llama-cpp
"$root/scripts/test_consumer.sh"
phase consumer

# The Python package goes into a virtual environment inside the build directory (it sees the system's
# numpy, pytest and torch), so testing never changes the user's site-packages (scripts/python_env.sh).
venv=$("$root/scripts/python_env.sh")
phase python-install
(cd "$root" && PATH="$venv/bin:$PATH" eval "\"$venv/bin/python\" -m pytest tests/python ${KVQ_PYTEST_ARGS:-}")
phase pytest

# kvq-lmcache (integrations/lmcache, docs/lmcache.md) against LMCache 0.5.6 and a redis-server its tests
# start on 127.0.0.1: a venv of its own (LMCache pins an older numpy), kvq installed into it from the same
# build, both installed by scripts/setup.sh's test-only part.
lmvenv=$build/venv-lmcache
[ -x "$lmvenv/bin/python" ] || "${PYTHON:-python3}" -m venv --system-site-packages "$lmvenv"
KVQ_LMCACHE_VENV=$lmvenv "$root/scripts/setup.sh"
"$lmvenv/bin/python" -m pip install -q --no-build-isolation --no-deps \
  --config-settings=build-dir="$build/py-linked-{wheel_tag}" \
  --config-settings=cmake.define.KVQ_PYTHON_KVQ_PREFIX="$build/prefix" "$root" >&2
"$lmvenv/bin/python" -m pip install -q --no-build-isolation --no-deps -e "$root/integrations/lmcache" >&2
(cd "$root/integrations/lmcache" && "$lmvenv/bin/python" -m pytest)
phase pytest-lmcache

if [ "${KVQ_SANITIZE_ALL:-1}" = 1 ]; then
  "$root/scripts/sanitize.sh" asan
  phase asan
  if ! wait "$prebuild"; then
    cat "$build/tsan-prebuild.log" >&2
    echo "test.sh: the TSan build failed (log above)" >&2
    exit 1
  fi
  trap - EXIT
  "$root/scripts/sanitize.sh" tsan
  phase tsan
  KVQ_FUZZ_SECONDS=${KVQ_FUZZ_SECONDS:-20} "$root/scripts/fuzz.sh"
  phase fuzz
fi
