#!/usr/bin/env bash
# `untied attn --overlap on` against `--overlap off`: every dumped tensor (outputs and gradients)
# must be the same bytes, since overlap only moves when the exchanges run.
# Usage: overlap_bits.sh UNTIED untied-attn-args...
# UNTIED_LAUNCH, when set, is put before the command (e.g. "mpirun -np 3").
set -euo pipefail
untied="$1"
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for o in off on; do
  # shellcheck disable=SC2086  # UNTIED_LAUNCH is a command and its arguments
  ${UNTIED_LAUNCH:-} "$untied" attn "$@" --overlap "$o" --dump "$dir/$o" > "$dir/$o.txt"
done
grep -q "overlapped" "$dir/on.txt" || { echo "FAIL: --overlap on did not overlap:"; cat "$dir/on.txt"; exit 1; }
n=0
for f in "$dir"/off/*.npy; do
  cmp "$f" "$dir/on/$(basename "$f")" || { echo "FAIL: $(basename "$f") differs with --overlap on"; exit 1; }
  n=$((n + 1))
done
[ "$n" -ge 10 ] || { echo "FAIL: only $n tensors dumped"; exit 1; }
echo "PASS: $n tensors bitwise equal with and without --overlap"
