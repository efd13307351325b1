#!/usr/bin/env bash
# `pip wheel .` on a machine taken as having no CUDA (-DEPMOE_ENABLE_CUDA=OFF: the CPU backends only),
# the wheel installed into a temporary folder, and the Python quick start run from it.
#   wheel_test.sh <python3> <source dir>
set -euo pipefail
py=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# No build isolation: the build requirements (scikit-build-core, nanobind) are installed by
# scripts/setup.sh, and CI may not reach an index for an isolated environment.
# Its own build directory: the default one (build/python/<tag>) belongs to a user's `pip install .`,
# which must not inherit this CPU-only configuration from CMake's cache.
CMAKE_ARGS="-DEPMOE_ENABLE_CUDA=OFF" "$py" -m pip wheel --no-build-isolation --no-deps -q -w "$tmp/wheel" \
  -C build-dir="$src/build/python-cpu-wheel" "$src" \
  > "$tmp/wheel.log" 2>&1 || { tail -40 "$tmp/wheel.log"; echo "FAIL: pip wheel"; exit 1; }
whl=$(ls "$tmp"/wheel/epmoe-*.whl)
echo "built $(basename "$whl")"
"$py" -m pip install -q --no-deps --target "$tmp/site" "$whl"
(cd "$tmp" && PYTHONPATH="$tmp/site" "$py" -c "import epmoe, sys; assert not epmoe.with_cuda; print('epmoe', epmoe.__version__, 'from', epmoe.__file__)")
(cd "$tmp" && PYTHONPATH="$tmp/site" "$py" "$src/examples/python/quickstart.py")
echo "PASS: CPU wheel built, installed and run"
