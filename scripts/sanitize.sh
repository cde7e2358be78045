#!/usr/bin/env bash
# Sanitizer runs, each in its own build directory beside build/:
#   asan  the whole C++ suite and the C API tests under AddressSanitizer + UndefinedBehaviorSanitizer
#         (+ LeakSanitizer), built with clang (scripts/asan_build.sh; the fuzzers share the build); the
#         first finding fails the run (-fno-sanitize-recover)                  -> build-asan/
#   tsan  the concurrency tests (tests/test_concurrency*.cpp, test_cache_threads*.cpp) under ThreadSanitizer
#                                                                              -> build-tsan/
# Usage: scripts/sanitize.sh [asan|tsan|all]   (default: all). Extra doctest arguments may follow,
# e.g. scripts/sanitize.sh asan -tc='*cache*'. Builds are incremental. KVQ_SANITIZE_BUILD_ONLY=1 builds
# and runs nothing (scripts/test.sh compiles the TSan build that way while the Python tests run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
parent=${KVQ_SANITIZE_DIR:-$root}
jobs=${KVQ_JOBS:-$(nproc)}
what=${1:-all}
[ $# -gt 0 ] && shift

"$root/scripts/setup.sh" test-debs  # the test set's Debian packages (clang, cross compiler, qemu)

# Both builds leave out the SIMD levels this host cannot run (scripts/host_cmake_args.sh).
# ThreadSanitizer with GCC. Debug keeps Eigen's and the standard library's assertions on; -O1 keeps it fast.
build() {
  local dir=$1 sanitize=$2
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 \
      -DKVQ_SANITIZE="$sanitize" -DKVQ_BUILD_BENCH=OFF -DKVQ_BUILD_TOOLS=OFF $("$root/scripts/host_cmake_args.sh") >/dev/null
  fi
  cmake --build "$dir" -j "$jobs" --target "${@:3}"
}

c_tests=()
for src in "$root"/tests/c/test_*.c; do c_tests+=("kvq_$(basename "$src" .c)"); done
passed=0
run_asan() {
  KVQ_JOBS=$jobs "$root/scripts/asan_build.sh" "$parent/build-asan" kvq_tests "${c_tests[@]}"
  [ "${KVQ_SANITIZE_BUILD_ONLY:-0}" = 1 ] && return
  echo "sanitize: AddressSanitizer + UndefinedBehaviorSanitizer, whole suite (C++ and C)" >&2
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:strict_init_order=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # The cache-attention tests at the default level only (their every-level repetition is for the
  # kernels, which kvq::selftest runs at every level under ASan here too). The suite runs as two
  # halves at once where there are cores for them (one doctest process uses one core): the same
  # shuffled order in both, each taking its range of the test cases; the C tests (a third of a half's
  # time, most of it test_capi_simd's self-check at every level) follow the first half.
  local tests="$parent/build-asan/tests/kvq_tests" n half
  n=$("$tests" --count "$@" | sed -n 's/.*passing the current filters: \([0-9]*\).*/\1/p')
  shard() {
    KVQ_TEST_DEFAULT_LEVEL_ONLY=1 "$tests" --no-intro --order-by=rand --rand-seed=7 --first="$1" --last="$2" "${@:3}"
  }
  c_suite() {
    for t in "${c_tests[@]}"; do "$parent/build-asan/tests/c/$t" || return; done
  }
  if [ "$jobs" -gt 1 ] && [ "${n:-0}" -gt 1 ]; then
    half=$(((n + 1) / 2))
    (shard 1 "$half" "$@" && c_suite) &
    local first=$!
    shard $((half + 1)) "$n" "$@" &
    local second=$! rc1=0 rc2=0
    wait "$first" || rc1=$?
    wait "$second" || rc2=$?
    if [ "$rc1" != 0 ] || [ "$rc2" != 0 ]; then
      echo "sanitize: AddressSanitizer run failed (first half and the C tests: exit $rc1; second half: exit $rc2)" >&2
      exit 1
    fi
  else
    shard 1 "${n:-1000000}" "$@"
    c_suite
  fi
  passed=$((passed + 1))
}
run_tsan() {
  build "$parent/build-tsan" thread kvq_concurrency_tests
  [ "${KVQ_SANITIZE_BUILD_ONLY:-0}" = 1 ] && return
  echo "sanitize: ThreadSanitizer, the concurrency tests (tests/test_concurrency*.cpp, test_cache_threads*.cpp)" >&2
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    "$parent/build-tsan/tests/kvq_concurrency_tests" --no-intro "$@"
  passed=$((passed + 1))
}

case $what in
  asan) run_asan "$@" ;;
  tsan) run_tsan "$@" ;;
  all) run_asan "$@"; run_tsan "$@" ;;
  *) echo "usage: $0 [asan|tsan|all] [doctest arguments]" >&2; exit 2 ;;
esac
[ "${KVQ_SANITIZE_BUILD_ONLY:-0}" = 1 ] && exit 0
echo "sanitize: $passed passed, 0 failed"
