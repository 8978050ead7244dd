#!/usr/bin/env bash
# Builds untied and runs every test (unit tests, and distributed tests under mpirun at 1-4 ranks).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
source scripts/env.sh
cd build
ctest --output-on-failure --timeout 600 "$@"
