#!/usr/bin/env bash
# The main job: installs what is missing, builds the Python package incrementally (into build/venv, the
# environment scripts/test.sh uses too), and prints `kvq table`: the accuracy-vs-compression table on the
# built-in data (gaussian and llm). Arguments go to `kvq table` (e.g. --format csv, --plot table.png).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$root/scripts/python_env.sh")
"$venv/bin/kvq" table "$@"
