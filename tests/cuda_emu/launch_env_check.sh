#!/usr/bin/env bash
# A GPU job started from a launcher's environment (torchrun's variables; no MPI world of
# untied's) on emulated GPUs: the ranks meet in the rendezvous directory, take their local
# rank's GPU, make NCCL over that bootstrap and carry the world's agreements over it; the losses
# equal those of the same run under mpirun, bit for bit. (The processes are mpirun's only
# because the emulated NCCL moves its bytes over MPI.) Usage: launch_env_check.sh UNTIED_EMU MPIRUN NP
set -u
emu=$1
mpirun=$2
np=$3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
run=(train --device cuda --preset tiny --seq 96 --steps 4 --batch 1 --no-progress)
export UNTIED_EMU_GPUS=$np
"$mpirun" --oversubscribe -np "$np" "$emu" "${run[@]}" --metrics "$d/mpi.jsonl" > "$d/mpi.out" 2>&1 ||
  { echo "the mpirun run failed:"; cat "$d/mpi.out"; exit 1; }
as_torchrun='exec env UNTIED_LAUNCHER=torchrun RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE "$0" "$@"'
UNTIED_RENDEZVOUS_DIR=$d/rdv "$mpirun" --oversubscribe -np "$np" bash -c "$as_torchrun" "$emu" ranks > "$d/ranks.out" 2>&1 ||
  { echo "untied ranks failed:"; cat "$d/ranks.out"; exit 1; }
cat "$d/ranks.out"
grep -q "torchrun-style environment, file backend" "$d/ranks.out" || { echo "not launched from the environment"; exit 1; }
for ((r = 0; r < np; r++)); do
  grep -qE "^$r +[^ ]+ +[0-9]+ +$r/$np +$r of $np " "$d/ranks.out" || { echo "rank $r does not take GPU $r"; exit 1; }
done
UNTIED_RENDEZVOUS_DIR=$d/rdv "$mpirun" --oversubscribe -np "$np" bash -c "$as_torchrun" "$emu" "${run[@]}" \
  --metrics "$d/env.jsonl" > "$d/env.out" 2>&1 || { echo "the run from the environment failed:"; cat "$d/env.out"; exit 1; }
python3 - "$d/mpi.jsonl" "$d/env.jsonl" <<'PY' || exit 1
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == 4 and a == b, f"losses under mpirun {a}, from the environment {b}"
print(f"losses of 4 steps equal under mpirun and from the environment: {b}")
PY
