#!/usr/bin/env bash
# Installs the build to a temporary prefix and builds the out-of-tree consumer in examples/consumer
# against it, twice: with CMake (find_package(kvq CONFIG)) and with a pkg-config command line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KVQ_BUILD_DIR:-$root/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$root/examples/consumer" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer_c"
"$tmp/build/consumer_cpp"
"$tmp/build/consumer_cpp_shared" >/dev/null
"$tmp/build/consumer_research"

# The pkg-config commands of docs/c-api.md, as it prints them (its /opt/kvq prefix and engine.c replaced by
# this install and the consumer), must build binaries that start: the page says how the shared one finds
# libkvq.so.0 (an rpath), so a command that cannot work fails here.
doc=$root/docs/c-api.md
pc_dir=$(dirname "$(find "$prefix" -name kvq.pc)")
[ "$pc_dir" = "$prefix/lib/pkgconfig" ] || { echo "consumer: kvq.pc is in $pc_dir, not where $doc says" >&2; exit 1; }
# doc_cmd PATTERN: the command of the page that starts with PATTERN (a line and its continuation lines).
doc_cmd() {
  local cmd
  cmd=$(awk -v p="$1" 'index($0, p) == 1 {on = 1} on {print; if ($0 !~ /\\$/) exit}' "$doc" | sed 's/\\$//' | tr '\n' ' ')
  [ -n "$cmd" ] || { echo "consumer: no command starting with '$1' in $doc" >&2; exit 1; }
  echo "${cmd//\/opt\/kvq/$prefix}"
}
cmd=$(doc_cmd 'cc engine.c $(PKG_CONFIG_PATH=/opt/kvq/lib/pkgconfig pkg-config --cflags --libs kvq) ')
cmd=${cmd/cc engine.c/cc -std=c11 -Wall -Wextra -Werror $root/examples/consumer/consumer.c}
cmd=${cmd/-o engine/-o $tmp/consumer_pc}
(cd "$tmp" && eval "$cmd")
"$tmp/consumer_pc" >/dev/null
# kvq-static: libkvq.a, so the binary needs no libkvq.so (kvq.pc's -lkvq took the shared library even with
# pkg-config --static).
cmd=$(doc_cmd 'cc engine.c $(PKG_CONFIG_PATH=/opt/kvq/lib/pkgconfig pkg-config --cflags --libs kvq-static)')
cmd=${cmd/cc engine.c/cc -std=c11 -Wall -Wextra -Werror $root/examples/consumer/consumer.c}
cmd=${cmd/-o engine/-o $tmp/consumer_pc_static}
(cd "$tmp" && eval "$cmd")
if readelf -d "$tmp/consumer_pc_static" | grep -q 'libkvq'; then
  echo "consumer: the kvq-static build links libkvq.so" >&2; exit 1
fi
env -u LD_LIBRARY_PATH "$tmp/consumer_pc_static" >/dev/null
# kvq-research: the research library through pkg-config.
cmd=$(doc_cmd 'c++ -std=c++20 research.cpp $(PKG_CONFIG_PATH=/opt/kvq/lib/pkgconfig')
cmd=${cmd/research.cpp/$root/examples/consumer/consumer_research.cpp}
cmd=${cmd/-o research/-o $tmp/consumer_research_pc}
(cd "$tmp" && eval "$cmd")
"$tmp/consumer_research_pc" >/dev/null
# And the page's other way: without the rpath, LD_LIBRARY_PATH (the binary does not start without it).
cc -std=c11 -Wall -Wextra -Werror "$root/examples/consumer/consumer.c" -o "$tmp/consumer_pc_norpath" \
  $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs kvq) -lm
if env -u LD_LIBRARY_PATH "$tmp/consumer_pc_norpath" >/dev/null 2>&1; then
  echo "consumer: a binary without rpath started without LD_LIBRARY_PATH (is $prefix/lib in the loader's path?)" >&2
  exit 1
fi
LD_LIBRARY_PATH="$prefix/lib" "$tmp/consumer_pc_norpath" >/dev/null
echo "consumer: built and ran against $prefix (CMake package; pkg-config as docs/c-api.md says: kvq with rpath and LD_LIBRARY_PATH, kvq-static, kvq-research)"
