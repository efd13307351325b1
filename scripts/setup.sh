#!/usr/bin/env bash
# Installs what is missing (Debian packages, the CUTLASS headers from PyPI), then configures and
# builds epmoe into ./build. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

need=()
for pkg in cmake ninja-build g++ libgtest-dev ccache python3-pip unzip; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
fi

# CUTLASS/CuTe headers (grouped GEMMs of the CUDA runner) come from the nvidia-cutlass wheel, which
# ships them; only the headers are unpacked, nothing is installed into Python.
CUTLASS_VERSION=4.2.0.0
if command -v nvcc >/dev/null 2>&1 && [ ! -f .deps/cutlass/include/cutlass/cutlass.h ]; then
  echo "setup: fetching CUTLASS headers (nvidia-cutlass==$CUTLASS_VERSION)"
  mkdir -p .deps/wheels
  python3 -m pip download -q --no-deps -d .deps/wheels "nvidia-cutlass==$CUTLASS_VERSION"
  rm -rf .deps/cutlass.tmp && mkdir -p .deps/cutlass.tmp
  unzip -q -o .deps/wheels/nvidia_cutlass-"$CUTLASS_VERSION"-*.whl 'cutlass_library/source/include/*' -d .deps/cutlass.tmp
  rm -rf .deps/cutlass && mkdir -p .deps/cutlass
  mv .deps/cutlass.tmp/cutlass_library/source/include .deps/cutlass/include
  rm -rf .deps/cutlass.tmp
fi

jobs=${EPMOE_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${EPMOE_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$jobs"
