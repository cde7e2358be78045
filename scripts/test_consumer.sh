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

pc_dir=$(dirname "$(find "$prefix" -name kvq.pc)")
cc -std=c11 -Wall -Wextra -Werror "$root/examples/consumer/consumer.c" -o "$tmp/consumer_pc" \
  $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs kvq) -lm \
  -Wl,-rpath,"$(PKG_CONFIG_PATH="$pc_dir" pkg-config --variable=libdir kvq)"
"$tmp/consumer_pc" >/dev/null
echo "consumer: built and ran against $prefix (CMake package and pkg-config)"
