#!/usr/bin/env bash
# libFuzzer runs: builds every fuzz target (fuzz/fuzz_*.cpp) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in build-asan/ (scripts/asan_build.sh, shared with sanitize.sh), then runs
# each for KVQ_FUZZ_SECONDS seconds (default 60), as many at once as there are cores (KVQ_JOBS).
# The corpus grows in build-asan/corpus/<target>/ (kept between runs); a failing input is saved as
# build-asan/artifacts/<target>-crash-*, and the run fails with the command that reproduces it.
# Usage: scripts/fuzz.sh [target...]      (default: every target)
#        KVQ_FUZZ_SECONDS=3600 scripts/fuzz.sh fuzz_cache_ops      (a long run; see docs/reliability.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${KVQ_FUZZ_DIR:-$root/build-asan}
seconds=${KVQ_FUZZ_SECONDS:-60}
jobs=${KVQ_JOBS:-$(nproc)}

"$root/scripts/setup.sh" test-debs  # the test set's Debian packages (clang, cross compiler, qemu)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for src in "$root"/fuzz/fuzz_*.cpp; do targets+=("$(basename "$src" .cpp)"); done
fi
KVQ_JOBS=$jobs "$root/scripts/asan_build.sh" "$dir" "${targets[@]}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target per core at a time (a libFuzzer run uses one core).
run_target() {
  local t=$1 corpus=$dir/corpus/$1 seeds=()
  mkdir -p "$corpus" "$dir/artifacts"
  [ -d "$root/fuzz/seeds/$t" ] && seeds=("$root/fuzz/seeds/$t")
  echo "fuzz: $t for ${seconds}s" >&2
  if ! "$dir/fuzz/$t" "$corpus" "${seeds[@]}" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 \
      -max_len=8192 -print_final_stats=1 -artifact_prefix="$dir/artifacts/$t-" 2>"$dir/$t.log"; then
    tail -n 60 "$dir/$t.log" >&2
    echo "fuzz: $t FAILED; reproduce with: $dir/fuzz/$t $dir/artifacts/$t-<crash file>" >&2
    return 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$dir/$t.log" | sed "s/^/fuzz: $t /" >&2 || true
}
passed=0 failed=0
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  pids=()
  for t in "${targets[@]:i:jobs}"; do
    run_target "$t" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    if wait "$pid"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" = 0 ]
