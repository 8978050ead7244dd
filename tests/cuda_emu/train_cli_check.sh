#!/usr/bin/env bash
# `untied train` on the CPU and `untied_emu train --device cuda` (the same command line on
# emulated GPUs) with the same arguments: every step's loss must agree to RTOL of itself.
# Usage: train_cli_check.sh UNTIED UNTIED_EMU RTOL untied-train-args...
# UNTIED_LAUNCH, when set, is put before both commands (e.g. "mpirun -np 2").
set -euo pipefail
untied="$1" emu="$2" rtol="$3"
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck disable=SC2086  # UNTIED_LAUNCH is a command and its arguments
${UNTIED_LAUNCH:-} "$untied" train --device cpu "$@" --metrics "$dir/cpu.jsonl"
# shellcheck disable=SC2086
${UNTIED_LAUNCH:-} "$emu" train --device cuda "$@" --metrics "$dir/gpu.jsonl"
losses() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$1"; }
paste <(losses "$dir/cpu.jsonl") <(losses "$dir/gpu.jsonl") | awk -v rtol="$rtol" '
  { n++; d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1;
    printf "step %d: cpu %s emulated gpu %s\n", n, $1, $2;
    if ($2 == "" || d > rtol * a || $2 != $2 + 0) bad++ }
  END { if (n == 0) { print "no steps in the metrics"; exit 1 }
        if (bad) { print bad " step(s) differ by more than " rtol " of the loss"; exit 1 }
        print n " steps agree to " rtol }'
