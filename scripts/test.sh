#!/usr/bin/env bash
# Set up, build, and run the whole test suite. On a machine without a GPU the GPU tests are
# compiled and reported as skipped (with the reason), never as passed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd build
ctest --output-on-failure -j "${EPMOE_JOBS:-$(nproc)}" "$@"
