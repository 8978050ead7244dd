#!/usr/bin/env bash
# A checkpoint written by mpirun -np 4 (upipe) resumes on 2 MPI ranks, on 3 (ring), on 8
# in-process ranks (upipe across 2 ring groups) and on 4 with ulysses: each continues the
# uninterrupted 4-rank run's losses for the next 20 steps within 1e-5 relative (fp32 summation
# order). Usage: reshard.sh UNTIED MPIRUN
set -u
untied=$1
mpirun=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
run=(train --steps 30 --batch 1 --seq 64 --kv-keys 8 --no-progress)
"$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" --metrics "$d/full.jsonl" > /dev/null || { echo "full run failed"; exit 1; }
"$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" --stop-after 10 --checkpoint-dir "$d/ck" > /dev/null ||
  { echo "the first 10 steps failed"; exit 1; }
check() {  # name, the launcher's words, then the flags that change: resumes into $d/$name.jsonl
  local name=$1 launcher=$2
  shift 2
  cp -r "$d/ck" "$d/ck_$name"
  $launcher "${run[@]}" "$@" --checkpoint-dir "$d/ck_$name" --resume --metrics "$d/$name.jsonl" > "$d/$name.out" 2>&1 ||
    { echo "$name: the resume failed:"; cat "$d/$name.out"; exit 1; }
  python3 - "$d/full.jsonl" "$d/$name.jsonl" "$name" <<'PY' || exit 1
import json, sys
full = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
steps = [g["step"] for g in got]
assert steps == list(range(11, 31)), f"{sys.argv[3]}: steps {steps}"
worst = max(abs(float(g["loss"]) - float(full[g["step"] - 1]["loss"])) / float(full[g["step"] - 1]["loss"]) for g in got)
assert worst <= 1e-5, f"{sys.argv[3]}: losses differ by {worst:.2e} relative"
print(f"{sys.argv[3]}: steps 11..30, largest relative difference from the uninterrupted run {worst:.1e}")
PY
}
check np2 "$mpirun --oversubscribe -np 2 $untied"
check np3_ring "$mpirun --oversubscribe -np 3 $untied" --strategy ring
check inproc8_ring2 "$untied" --ranks 8 --ring 2
check np4_ulysses "$mpirun --oversubscribe -np 4 $untied" --strategy ulysses
grep -q "resharded from 4 ranks onto 2" "$d/np2.out" || { echo "no word of the resharding"; cat "$d/np2.out"; exit 1; }
