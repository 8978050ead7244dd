#!/usr/bin/env bash
# The main job on its built-in default: builds untied, then benchmarks the kernels on 2 MPI
# ranks (flash attention forward/backward next to this machine's GEMM rate, and the all-to-all).
# Extra arguments go to `untied bench kernels`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
source scripts/env.sh
mpirun -np 2 build/untied bench kernels "$@"
