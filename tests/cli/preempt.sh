#!/usr/bin/env bash
# Preemption: a signal ends the run after the step in progress on every rank, with a checkpoint,
# and exit status 75; the resumed run's losses equal an uninterrupted run's bitwise. Under mpirun
# with SIGUSR1 (which mpirun forwards: Slurm's --signal), in one process with SIGTERM; without a
# checkpoint directory the exit status is the signal's (128 + n) and nothing is saved; the same
# signal twice ends the process at once. Usage: preempt.sh UNTIED MPIRUN
set -u
untied=$1
mpirun=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
# A long schedule (the learning rate follows --steps), cut by --stop-after where a run must end.
run=(train --steps 100000 --batch 1 --seq 64 --kv-keys 8 --no-progress)
losses() { python3 -c "import json,sys; print(' '.join(str(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
# Starts "$@" in the background (its pid in $pid), waits for 5 metrics lines in $1 (the first arg).
start() {
  local metrics=$1
  shift
  "$@" > "$d/out" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    [ "$(lines "$metrics")" -ge 5 ] && return 0
    kill -0 $pid 2>/dev/null || { echo "the run ended before it could be signalled:"; cat "$d/out"; exit 1; }
    sleep 0.05
  done
  echo "no 5 steps in 30 s"; kill -9 $pid; exit 1
}

"$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" --stop-after 30 --metrics "$d/full.jsonl" > /dev/null ||
  { echo "the uninterrupted run failed"; exit 1; }
want=$(losses "$d/full.jsonl")

# mpirun -np 4, SIGUSR1 to mpirun.
start "$d/mpi.jsonl" "$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" --checkpoint-dir "$d/ck" --metrics "$d/mpi.jsonl"
kill -USR1 $pid
wait $pid
code=$?
[ $code -eq 75 ] || { echo "mpirun: exit $code after SIGUSR1, not 75:"; cat "$d/out"; exit 1; }
grep -q "stopped by SIGUSR1 after step .*: checkpoint saved in $d/ck" "$d/out" || { echo "no stop message:"; cat "$d/out"; exit 1; }
k=$(lines "$d/mpi.jsonl")
[ "$(cat "$d/ck/latest")" = "$(printf 'step_%08d' "$k")" ] || { echo "latest is $(cat "$d/ck/latest") after $k steps"; exit 1; }
"$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" --stop-after 30 --checkpoint-dir "$d/ck" --metrics "$d/mpi.jsonl" \
  --resume > /dev/null || { echo "the resume failed"; exit 1; }
got=$(losses "$d/mpi.jsonl")
[ "$got" = "$want" ] || { echo "mpirun: losses differ after the resume: '$got' against '$want'"; exit 1; }
echo "mpirun -np 4, SIGUSR1: stopped after step $k with a checkpoint, exit 75; resumed to step 30 with the same losses"

# mpirun -np 4, SIGTERM to mpirun (what scancel and the end of a job's time send to a batch step).
# Open MPI 4.1's mpirun answers SIGTERM by sending its ranks SIGCONT, then SIGTERM T seconds later,
# then SIGKILL another T seconds later (T = odls_base_sigkill_timeout, 1 by default), and exits 1
# whatever the ranks return: the ranks' own stop message and checkpoint are what can be asserted,
# and T must cover a step and a save (docs/training.md).
start "$d/term.jsonl" env OMPI_MCA_odls_base_sigkill_timeout=3 "$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" \
  --checkpoint-dir "$d/ckt" --metrics "$d/term.jsonl"
t0=$(date +%s.%N)
kill -TERM $pid
wait $pid
code=$?
took=$(echo "$(date +%s.%N) - $t0" | bc)
[ $code -ne 0 ] || { echo "mpirun: exit 0 after SIGTERM:"; cat "$d/out"; exit 1; }
grep -q "stopped by SIGTERM after step .*: checkpoint saved in $d/ckt" "$d/out" || { echo "no stop message:"; cat "$d/out"; exit 1; }
k=$(lines "$d/term.jsonl")
[ "$(cat "$d/ckt/latest")" = "$(printf 'step_%08d' "$k")" ] || { echo "latest is $(cat "$d/ckt/latest") after $k steps"; exit 1; }
"$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" --stop-after $((k + 20)) --checkpoint-dir "$d/ckt" --metrics "$d/term.jsonl" \
  --resume > /dev/null || { echo "the resume failed"; exit 1; }
"$mpirun" --oversubscribe -np 4 "$untied" "${run[@]}" --stop-after $((k + 20)) --metrics "$d/full2.jsonl" > /dev/null ||
  { echo "the uninterrupted run to step $((k + 20)) failed"; exit 1; }
got=$(losses "$d/term.jsonl")
[ "$got" = "$(losses "$d/full2.jsonl")" ] || { echo "mpirun SIGTERM: losses differ after the resume"; exit 1; }
printf 'mpirun -np 4, SIGTERM to mpirun (sigkill timeout 3 s): the ranks stopped after step %s with a checkpoint (mpirun exit %s), %.1f s from the signal to the exit; resumed to step %s with the same losses\n' "$k" "$code" "$took" $((k + 20))

# In one process (2 ranks), SIGTERM.
start "$d/inproc.jsonl" "$untied" "${run[@]}" --ranks 2 --checkpoint-dir "$d/ck2" --metrics "$d/inproc.jsonl"
kill -TERM $pid
wait $pid
code=$?
[ $code -eq 75 ] || { echo "in process: exit $code after SIGTERM, not 75:"; cat "$d/out"; exit 1; }
[ -f "$d/ck2/latest" ] || { echo "in process: no checkpoint"; exit 1; }
echo "2 in-process ranks, SIGTERM: stopped with a checkpoint, exit 75"

# No checkpoint directory: the signal's own status, and it says so.
start "$d/none.jsonl" "$untied" "${run[@]}" --ranks 2 --metrics "$d/none.jsonl"
kill -TERM $pid
wait $pid
code=$?
[ $code -eq 143 ] || { echo "without a checkpoint directory: exit $code, not 143"; exit 1; }
grep -q "no --checkpoint-dir was given, so nothing was saved" "$d/out" || { echo "no message:"; cat "$d/out"; exit 1; }
echo "no --checkpoint-dir, SIGTERM: exit 143, nothing saved, said so"

# The same signal twice: at once (the default action), even inside a long step; the checkpoint
# of the step before stays intact (a save cut short never replaces it).
slow=(train --steps 100000 --batch 1 --seq 8192 --kv-keys 8 --no-progress --ranks 2)
"$untied" "${slow[@]}" --checkpoint-dir "$d/ck3" --save-every 1 --metrics "$d/twice.jsonl" > "$d/out" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do [ "$(lines "$d/twice.jsonl")" -ge 1 ] && break; sleep 0.05; done
kill -INT $pid
sleep 0.3
kill -INT $pid
wait $pid
code=$?
[ $code -eq 130 ] || { echo "SIGINT twice: exit $code, not 130 (killed by the second SIGINT)"; cat "$d/out"; exit 1; }
"$untied" "${slow[@]}" --stop-after 1 --checkpoint-dir "$d/ck3" --resume > /dev/null 2>&1 ||
  { echo "SIGINT twice: the checkpoint left behind does not resume"; exit 1; }
echo "SIGINT twice: exit 130 at once; the checkpoint left behind resumes"
