#!/usr/bin/env bash
# Installs what is missing (tools tested by their commands, gtest by its headers or CMake package;
# the CUTLASS headers from PyPI), then configures and builds epmoe into ./build. Safe to run again:
# it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# Each tool is tested for by what the build uses (a command, or gtest's headers or CMake package),
# not by a Debian package name: cmake and ninja may come from pip, gtest from a source install.
# Only what is missing is installed, with apt-get (named packages) when there is apt-get.
have_gtest() {  # the headers, or an installed CMake package (GTestConfig.cmake)
  local d
  for d in /usr/include /usr/local/include ${CPATH:+${CPATH//:/ }}; do
    [ -f "$d/gtest/gtest.h" ] && return 0
  done
  for d in /usr/lib /usr/local/lib ${CMAKE_PREFIX_PATH:+${CMAKE_PREFIX_PATH//:/ }}; do
    compgen -G "$d/cmake/GTest/GTestConfig.cmake" >/dev/null || compgen -G "$d/*/cmake/GTest/GTestConfig.cmake" \
      >/dev/null || compgen -G "$d/lib/cmake/GTest/GTestConfig.cmake" >/dev/null && return 0
  done
  return 1
}
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v ccache >/dev/null 2>&1 || need+=(ccache)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
have_gtest || need+=(libgtest-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: missing ${need[*]}"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: no apt-get here; install these (Debian package names) and run again" >&2
    exit 1
  fi
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

# The Python package's build and test requirements (nanobind, scikit-build-core, numpy, pytest),
# from PyPI when missing; without them the Python package is not built (said, not hidden).
py_args=()
if ! python3 -c "import nanobind, scikit_build_core, numpy, pytest" >/dev/null 2>&1; then
  echo "setup: installing the Python build requirements (nanobind, scikit-build-core, numpy, pytest)"
  # A Debian-managed python3 refuses plain installs (PEP 668): then into the user's site.
  python3 -m pip install -q nanobind scikit-build-core numpy pytest >/dev/null 2>&1 ||
    python3 -m pip install -q --user --break-system-packages nanobind scikit-build-core numpy pytest >/dev/null 2>&1 ||
    echo "setup: could not install them; the Python package is skipped" >&2
fi
if python3 -c "import nanobind, scikit_build_core, numpy, pytest" >/dev/null 2>&1; then
  py_args+=(-DEPMOE_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$(command -v python3)")
  # Where PyTorch is installed with its own NCCL (device-API headers included), build against that
  # copy: one process loads one NCCL, and torch must keep the one it was built for.
  if [ -z "${EPMOE_NCCL_ROOT:-}" ]; then
    torch_nccl=$(python3 -c "import importlib.util as u, os; s = u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0] if s and u.find_spec('torch') else '')" 2>/dev/null || true)
    [ -n "$torch_nccl" ] && [ -f "$torch_nccl/include/nccl_device.h" ] && py_args+=("-DEPMOE_NCCL_ROOT=$torch_nccl")
  fi
fi

jobs=${EPMOE_JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${py_args[@]}" ${EPMOE_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "$jobs"
