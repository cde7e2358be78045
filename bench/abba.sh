#!/usr/bin/env bash
# Two builds of kvq_bench compared in one run, interleaved A B B A (so that a machine whose speed drifts
# favours neither): prints, per benchmark, each side's best real time and the ratio new ÷ base (< 1:
# new is faster).
#
#   bench/abba.sh BASE_BENCH NEW_BENCH [FILTER]
#   e.g. bench/abba.sh /tmp/base/build/bench/kvq_bench build/bench/kvq_bench '^decode/(f16/f16|q8_0/q4_0)/(4k|32k)/'
set -euo pipefail
base=$1
new=$2
filter=${3:-'^decode/(f16/f16|q8_0/q4_0|tcq3\+center\+ks/tcq3|turbo4\+center\+ks/turbo4)/(4k|32k)/'}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
i=0
for who in base new new base; do
  bin=$base; [ "$who" = new ] && bin=$new
  "$bin" --benchmark_filter="$filter" --benchmark_format=json --benchmark_repetitions=1 >"$out/$i-$who.json" 2>/dev/null
  i=$((i + 1))
done
python3 - "$out" <<'EOF'
import glob, json, os, sys
best = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    who = path.rsplit("-", 1)[1][:-5]
    for b in json.load(open(path))["benchmarks"]:
        key = (b["name"], who)
        best[key] = min(best.get(key, float("inf")), b["real_time"])
names = sorted({n for n, _ in best}, key=lambda n: n)
print(f"{'benchmark':<60} {'base':>10} {'new':>10} {'new/base':>9}")
for n in names:
    a, b = best[(n, "base")], best[(n, "new")]
    print(f"{n.replace('/min_time:0.300/real_time', ''):<60} {a:>10.1f} {b:>10.1f} {b / a:>9.3f}")
EOF
