#!/usr/bin/env bash
# The main job: installs what is missing, builds the Python package incrementally (into build/venv, the
# environment scripts/test.sh uses too), and prints `kvq table`: the accuracy-vs-compression table on the
# built-in data (gaussian, llm and mla, a latent of DeepSeek V3's shapes). Arguments go to `kvq table` (e.g.
# --format csv, --plot table.png).
# It installs only what that needs (scripts/setup.sh's base set; matplotlib too with --plot), and says so in
# a line or two on stderr; the table is all that goes to stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
for arg in "$@"; do
  case $arg in --plot | --plot=*) export KVQ_SETUP="${KVQ_SETUP:-} plot" ;; esac
done
venv=$("$root/scripts/python_env.sh")
"$venv/bin/kvq" table "$@"
