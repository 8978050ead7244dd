#!/usr/bin/env bash
# A job started without mpirun, as srun (no MPI) or torchrun start one: 4 local processes with
# Slurm's or torchrun's variables meet in the rendezvous directory and agree on their ranks and
# the NCCL id (`untied ranks`); a missing rank, a wrong world size, a rank given twice and a
# bad variable are refused within the rendezvous timeout, every process ending; the CPU backend
# says it needs MPI; a batch script's environment (no srun step) is one process.
# Usage: launch_env.sh UNTIED
set -u
untied=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
export UNTIED_RENDEZVOUS_DIR=$d/rdv UNTIED_RENDEZVOUS_TIMEOUT=4
fail() { echo "FAIL: $*"; for f in "$d"/*.out; do echo "== $f"; cat "$f"; done; exit 1; }

# start NAME N ENVFN ARGS...: N processes, rank r with the variables `ENVFN r` prints; waits for
# all, and writes each one's output to $d/NAME.r.out and exit status to $d/NAME.r.rc.
start() {
  local name=$1 n=$2 envfn=$3
  shift 3
  local pids=()
  for ((r = 0; r < n; r++)); do
    (env $($envfn "$r") "$untied" "$@" > "$d/$name.$r.out" 2>&1; echo $? > "$d/$name.$r.rc") &
    pids+=($!)
  done
  wait "${pids[@]}"
}
slurm() { echo "SLURM_JOB_ID=77 SLURM_STEP_ID=$job SLURM_PROCID=$1 SLURM_NTASKS=4 SLURM_LOCALID=$1 SLURM_NNODES=1 SLURM_TASKS_PER_NODE=4 SLURM_NODEID=0"; }
torch() { echo "RANK=$1 WORLD_SIZE=4 LOCAL_RANK=$1 LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29$job TORCHELASTIC_RUN_ID=t$job"; }
rcs() { cat "$d/$1".*.rc | tr '\n' ' '; }

# 1. The ranks agree, with either launcher's variables.
for launcher in slurm torch; do
  job=1$RANDOM
  start "$launcher" 4 "$launcher" ranks
  [ "$(rcs "$launcher")" = "0 0 0 0 " ] || fail "$launcher: exit statuses $(rcs "$launcher")"
  out=$d/$launcher.0.out
  grep -q "^4 ranks" "$out" || fail "$launcher: no table"
  for r in 0 1 2 3; do grep -qE "^$r +[^ ]+ +[0-9]+ +$r/4 " "$out" || fail "$launcher: rank $r's line (local rank $r of 4)"; done
  if grep -q "same NCCL id" "$out"; then
    ids=$(awk '$1 ~ /^[0-3]$/ {print $6}' "$out" | sort -u | wc -l)
    [ "$ids" = 1 ] || fail "$launcher: $ids different NCCL ids"
  fi
  echo "$launcher: 4 ranks met; $(tail -n 1 "$out")"
done
# The same NCCL id named by NCCL_COMM_ID: every rank makes its own, and they agree.
if grep -q "same NCCL id" "$d/slurm.0.out"; then
  job=2$RANDOM
  NCCL_COMM_ID=127.0.0.1:29555 start commid 4 slurm ranks
  [ "$(rcs commid)" = "0 0 0 0 " ] && grep -q "same NCCL id" "$d/commid.0.out" || fail "NCCL_COMM_ID: $(rcs commid)"
  echo "NCCL_COMM_ID: every rank's own id agrees"
fi

# 2. Refusals, each within the timeout (4 s) plus start-up, every process ending.
refused() {  # name, seconds taken, the message rank 0 (or any rank) must print
  local name=$1 took=$2 want=$3
  for f in "$d/$name".*.rc; do [ "$(cat "$f")" = 2 ] || fail "$name: exit statuses $(rcs "$name"), not all 2"; done
  cat "$d/$name".*.out | grep -qE "$want" || fail "$name: no '$want'"
  [ "$took" -le 20 ] || fail "$name: took $took s"
  echo "$name: refused by every rank in $took s: $(cat "$d/$name".*.out | grep -m1 -E "$want" | cut -c1-160)"
}
job=3$RANDOM; t0=$(date +%s)
start missing 3 slurm ranks  # ranks 0..2 of 4: rank 3 never comes
refused missing $(($(date +%s) - t0)) "missing.*3"
job=4$RANDOM; t0=$(date +%s)
wrong() { if [ "$1" = 2 ]; then slurm "$1" | sed 's/SLURM_NTASKS=4/SLURM_NTASKS=3/'; else slurm "$1"; fi; }
start wrongsize 4 wrong ranks
refused wrongsize $(($(date +%s) - t0)) "size|world"
job=5$RANDOM; t0=$(date +%s)
twice() { if [ "$1" = 3 ]; then torch 1; else torch "$1"; fi; }  # two processes say RANK=1; none says 3
start twice 4 twice ranks
refused twice $(($(date +%s) - t0)) "rank 1.*(twice|already|joined)|missing.*3"
job=6$RANDOM
slurm_bad() { echo "SLURM_JOB_ID=77 SLURM_STEP_ID=$job SLURM_PROCID=x$1 SLURM_NTASKS=2"; }
start badvar 2 slurm_bad ranks
refused badvar 0 "SLURM_PROCID='x0' is not a rank"
slurm2() { echo "SLURM_JOB_ID=77 SLURM_STEP_ID=$job SLURM_PROCID=$1 SLURM_NTASKS=2 SLURM_LOCALID=$1 SLURM_NNODES=1"; }
job=8$RANDOM; t0=$(date +%s)
start cpu 2 slurm2 train --steps 2 --batch 1 --seq 64 --no-progress
refused cpu $(($(date +%s) - t0)) "CPU backend moves its ranks' buffers over MPI"
[ "$(cat "$d"/cpu.*.out | grep -c "over MPI")" = 1 ] || fail "cpu: the reason printed $(cat "$d"/cpu.*.out | grep -c "over MPI") times, not once"

# 3. A batch script's environment (SLURM_PROCID without an srun step) is one process, as before.
env SLURM_JOB_ID=77 SLURM_PROCID=0 SLURM_NTASKS=4 "$untied" train --steps 2 --batch 1 --seq 64 --no-progress > "$d/batch.out" 2>&1 ||
  fail "batch-script environment: $(cat "$d/batch.out")"
grep -q "trained steps 1..2" "$d/batch.out" || fail "batch-script environment did not train"
echo "a batch script's environment trains in one process"
