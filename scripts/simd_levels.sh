#!/usr/bin/env bash
# Every SIMD level's code, whatever this machine's CPU lacks (the test command's "levels" phase; needs
# scripts/build.sh's build). For each level it runs or says:
#   a level this CPU runs        natively, by ctest (the parity tests and kvq::selftest at every level the
#                                CPU runs); not run again here
#   avx512, its other build      the level has two builds (lib/simd/cpu_levels.cpp): where the CPU has
#                                AVX512-VNNI, the selftest of the plain one, natively with KVQ_AVX512_VNNI=0
#   an x86 level the CPU lacks   its selftest (build/tests/kvq_level_selftest LEVEL: kvq::selftest() at that
#                                level) under qemu-x86_64 -cpu max, which emulates AVX2, FMA and F16C
#   neon on x86-64               scripts/neon_qemu.sh: cross-compiled, its parity programs and selftest
#                                under qemu-aarch64
#   what nothing here runs       "level X: not tested on this machine (why)": qemu 7.2's TCG emulates no
#                                AVX-512, so an x86-64 CPU without it leaves the avx512 level untested
# Each level run here also compares its kernel table with its listing in tests/data/kernels
# (kvq_level_selftest --kernels; ctest does it for the levels the CPU runs). Exits non-zero if any run fails. KVQ_EMULATE_LEVELS="avx2 ..." also runs those x86 levels under qemu when
# the CPU has them (to try that path on a machine that needs no emulation); KVQ_NEON_QEMU=0 leaves the
# neon run out (and says so).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" test-debs  # the test set's Debian packages (clang, cross compiler, qemu)
driver=$build/tests/kvq_level_selftest
[ -x "$driver" ] || { echo "simd_levels.sh: $driver is missing (scripts/build.sh builds it)" >&2; exit 1; }
status=0
summary=()
say() { summary+=("$1"); }

if [ "$(uname -m)" = x86_64 ]; then
  host=" $("$driver" --list) "
  emulated=" "
  command -v qemu-x86_64 >/dev/null && emulated=" $(qemu-x86_64 -cpu max "$driver" --list) "
  force=" ${KVQ_EMULATE_LEVELS:-} "
  under_qemu=()
  for l in sse2 avx2 avx512; do
    if [[ $host == *" $l "* && $force != *" $l "* ]]; then
      say "level $l: native (ctest)"
    elif [[ $emulated == *" $l "* ]]; then
      under_qemu+=("$l")
    elif [[ $host == *" $l "* ]]; then
      say "level $l: native (ctest); not under qemu-x86_64 as KVQ_EMULATE_LEVELS asked: its -cpu max lacks it"
    elif ! command -v qemu-x86_64 >/dev/null; then
      say "level $l: not tested on this machine (this CPU lacks it and qemu-x86_64 is not installed)"
    else
      say "level $l: not tested on this machine (this CPU lacks it, and qemu-x86_64's TCG does not emulate AVX-512)"
    fi
  done
  if [[ $host == *" avx512 "* ]]; then
    if grep -qw avx512_vnni /proc/cpuinfo; then
      # ctest checked the VNNI build, the one kvq uses here; the plain build is what CPUs without VNNI get.
      echo "simd_levels.sh: avx512's build without VNNI, natively (KVQ_AVX512_VNNI=0)"
      if KVQ_AVX512_VNNI=0 "$driver" avx512 && KVQ_AVX512_VNNI=0 "$driver" --kernels "$root/tests/data/kernels" avx512; then
        say "level avx512, build without VNNI: passed natively (KVQ_AVX512_VNNI=0); its VNNI build: native (ctest)"
      else
        say "level avx512, build without VNNI: FAILED natively (KVQ_AVX512_VNNI=0)"; status=1
      fi
    else
      say "level avx512, its AVX512-VNNI build: not tested on this machine (this CPU lacks AVX512-VNNI, and qemu emulates no AVX-512)"
    fi
  fi
  if [ ${#under_qemu[@]} -gt 0 ]; then
    echo "simd_levels.sh: ${under_qemu[*]} under qemu-x86_64 -cpu max"
    if qemu-x86_64 -cpu max "$driver" "${under_qemu[@]}" &&
       qemu-x86_64 -cpu max "$driver" --kernels "$root/tests/data/kernels" "${under_qemu[@]}"; then
      for l in "${under_qemu[@]}"; do say "level $l: passed under qemu-x86_64 -cpu max (kvq::selftest)"; done
    else
      for l in "${under_qemu[@]}"; do say "level $l: FAILED under qemu-x86_64 -cpu max (output above)"; done
      status=1
    fi
  fi
  if [ "${KVQ_NEON_QEMU:-1}" = 0 ]; then
    say "level neon: not tested on this machine (KVQ_NEON_QEMU=0)"
  elif "$root/scripts/neon_qemu.sh"; then
    say "level neon: passed under qemu-aarch64 (parity programs and kvq::selftest)"
  else
    say "level neon: FAILED under qemu-aarch64 (output above)"; status=1
  fi
elif [ "$(uname -m)" = aarch64 ]; then
  say "level neon: native (ctest)"
  say "levels sse2, avx2, avx512: not tested on this machine (an arm64 host; this script emulates x86 only on x86-64)"
else
  say "no SIMD level but scalar is compiled for $(uname -m): nothing to test here"
fi

echo "simd_levels.sh: what the test command ran for each SIMD level on this machine:"
printf '  %s\n' "${summary[@]}"
exit $status
