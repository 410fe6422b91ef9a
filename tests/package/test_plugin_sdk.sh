#!/usr/bin/env bash
# A policy plug-in built against an installed kvlens, as a researcher builds one: cmake --install
# into a throwaway prefix, then (1) examples/policies/standalone configured with
# find_package(kvlens) and built, (2) the same source compiled by hand with pkg-config's flags;
# each .so then runs through the installed kvlens-cli (a two-sample coref eval beside h2o).
# usage: tests/package/test_plugin_sdk.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cli="$work/prefix/bin/kvlens-cli"

cmake -S "$root/examples/policies/standalone" -B "$work/standalone" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/standalone" >/dev/null
"$cli" eval --model "$root/assets/models/demo" --task coref --samples 2 --policies h2o,h2o_c \
  --sparsity 0.5 --plugin "$work/standalone/h2o_plugin.so" | tee "$work/cmake.txt"
grep -q '^h2o_c ' "$work/cmake.txt"

pc=$(dirname "$(find "$work/prefix" -name kvlens.pc | head -1)")
flags=$(PKG_CONFIG_PATH="$pc" pkg-config --cflags kvlens)
cc -std=c11 -O2 -shared -fPIC -ffp-contract=off -fvisibility=hidden $flags \
  -I"$root/examples/policies" "$root/examples/policies/h2o.c" -o "$work/h2o_pkgconfig.so" -lm
"$cli" policies --plugin "$work/h2o_pkgconfig.so" | grep "h2o_c"
# Both builds of the plug-in give the built-in's numbers (the lines of the table match but the id).
sed -n 's/^h2o_c  *\([0-9. ]*\)/\1/p' "$work/cmake.txt" >"$work/plugin.line"
sed -n 's/^h2o  *\([0-9. ]*\)/\1/p' "$work/cmake.txt" >"$work/builtin.line"
cmp "$work/plugin.line" "$work/builtin.line"
echo "plug-in SDK: find_package(kvlens) and pkg-config builds load and match the built-in"
