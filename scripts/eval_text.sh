#!/usr/bin/env bash
# Writes the evaluation text of docs/eval.md to $1 (default build/eval/python-tutorial.txt): the reST sources
# of the Python 3.11 tutorial as Debian's python3.11-doc package ships them
# (/usr/share/doc/python3.11/html/_sources/tutorial/), chapters in the tutorial's own order, concatenated.
# Installs python3.11-doc with apt-get when it is missing. Nothing else is downloaded.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/eval/python-tutorial.txt}
src=/usr/share/doc/python3.11/html/_sources/tutorial
if [ ! -d "$src" ]; then
  echo "eval_text: installing python3.11-doc" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3.11-doc >/dev/null
fi
mkdir -p "$(dirname "$out")"
: > "$out"
for ch in appetite interpreter introduction controlflow datastructures modules inputoutput errors classes \
          stdlib stdlib2 venv whatnow interactive floatingpoint appendix; do
  cat "$src/$ch.rst.txt" >> "$out"
  printf '\n' >> "$out"
done
echo "eval_text: $(wc -c < "$out") bytes in $out (sha256 $(sha256sum "$out" | cut -c1-16))" >&2
