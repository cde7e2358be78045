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

# The README's pkg-config command, as the README prints it (its /opt/kvq prefix and engine.c replaced by
# this install and the consumer), must build a binary that starts: the README says how it finds
# libkvq.so.0 (an rpath), so a command that cannot work fails here.
pc_dir=$(dirname "$(find "$prefix" -name kvq.pc)")
[ "$pc_dir" = "$prefix/lib/pkgconfig" ] || { echo "consumer: kvq.pc is in $pc_dir, not where the README says" >&2; exit 1; }
readme_cmd=$(sed -n '/^cc engine.c \$(PKG_CONFIG_PATH=/,/-o engine$/p' "$root/README.md" | sed 's/\\$//' | tr '\n' ' ')
[ -n "$readme_cmd" ] || { echo "consumer: no pkg-config command in README.md" >&2; exit 1; }
readme_cmd=${readme_cmd//\/opt\/kvq/$prefix}
readme_cmd=${readme_cmd/cc engine.c/cc -std=c11 -Wall -Wextra -Werror $root/examples/consumer/consumer.c}
readme_cmd=${readme_cmd/-o engine/-o $tmp/consumer_pc}
(cd "$tmp" && eval "$readme_cmd")
"$tmp/consumer_pc" >/dev/null
# And the README's other way: without the rpath, LD_LIBRARY_PATH (the binary does not start without it).
cc -std=c11 -Wall -Wextra -Werror "$root/examples/consumer/consumer.c" -o "$tmp/consumer_pc_norpath" \
  $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs kvq) -lm
if env -u LD_LIBRARY_PATH "$tmp/consumer_pc_norpath" >/dev/null 2>&1; then
  echo "consumer: a binary without rpath started without LD_LIBRARY_PATH (is $prefix/lib in the loader's path?)" >&2
  exit 1
fi
LD_LIBRARY_PATH="$prefix/lib" "$tmp/consumer_pc_norpath" >/dev/null
echo "consumer: built and ran against $prefix (CMake package; pkg-config as the README says, rpath and LD_LIBRARY_PATH)"
