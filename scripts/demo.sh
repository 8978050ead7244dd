#!/usr/bin/env bash
# The main job on its built-in default: builds untied, then
#   1. benchmarks the kernels on 2 MPI ranks (flash attention forward/backward next to this
#      machine's GEMM rate, and the all-to-all between the ranks);
#   2. runs one attention block with the Llama3-8B head shapes on 4 MPI ranks, Ulysses and then
#      UPipe, and prints time and memory per rank for both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
source scripts/env.sh
echo
mpirun -np 2 build/untied bench kernels --seqs 1K,2K,4K
for strategy in ulysses upipe; do
  echo
  mpirun -np 4 build/untied attn --heads-like llama3-8b --dtype bf16 --seq 4K --strategy "$strategy"
done
