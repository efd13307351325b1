#!/usr/bin/env bash
# Set up, build, and run the main job: `epmoe run` on its defaults (all visible GPUs, or the CPU
# reference with simulated ranks when there is none). Extra arguments go to `epmoe run`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/epmoe run "$@"
