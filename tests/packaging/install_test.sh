#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then a project outside the tree (examples/consumer)
# finds the package with find_package(epmoe), links epmoe::epmoe alone and runs.
#   install_test.sh <build dir> <source dir>
set -euo pipefail
build=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
test -f "$tmp/prefix/include/epmoe/epmoe.h" || { echo "FAIL: headers not installed"; exit 1; }
ls "$tmp"/prefix/lib*/cmake/epmoe/epmoeConfig.cmake > /dev/null || { echo "FAIL: no CMake package"; exit 1; }
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$src/examples/consumer" -B "$tmp/consumer" "${gen[@]}" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" > "$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
"$tmp/consumer/consumer" | tee "$tmp/run.log"
grep -q "epmoe consumer: out\[0\]" "$tmp/run.log"
echo "PASS: installed package found, linked and run"
