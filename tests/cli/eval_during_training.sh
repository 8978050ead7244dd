#!/usr/bin/env bash
# Evaluation while training (--eval-data, --eval-every): the metrics lines hold the eval loss at
# the given steps, equal to a separate `untied eval` of the checkpoint of that step (the newest,
# step 2 with --step 2, and step 2 through an export), for UPipe on 2 in-process ranks and ring on
# 3 MPI ranks.
# Usage: eval_during_training.sh UNTIED MPIRUN TOKENIZER_DIR
set -u
untied=$1
mpirun=$2
tok=$3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "$*"; exit 1; }
"$untied" prepare --tokenizer "$tok" --output "$d/train.tok" --no-progress "$tok/sample.txt" > /dev/null || fail "prepare"
"$untied" prepare --tokenizer "$tok" --output "$d/valid.tok" --no-progress "$tok/docs.jsonl" > /dev/null || fail "prepare"
metric() {  # metric FILE STEP KEY
  python3 -c "import json,sys; print(next(json.loads(l)[sys.argv[3]] for l in open(sys.argv[1]) if json.loads(l)['step'] == int(sys.argv[2])))" "$@"
}
eval_loss() { python3 -c "import json,sys; print(json.load(sys.stdin)['loss'])"; }
same() {  # same A B WHAT: equal to the metrics line's 6 decimals
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 5e-7 * max(1, abs(b)) else 1)" "$1" "$2" ||
    fail "$3: the run's eval loss $1, untied eval's $2"
}
for layout in "inproc:--ranks 2 --strategy upipe" "mpi:--strategy ring"; do
  name=${layout%%:*}
  flags=${layout#*:}
  launch=("$untied")
  [ "$name" = mpi ] && launch=("$mpirun" --oversubscribe -np 3 "$untied")
  # shellcheck disable=SC2086
  "${launch[@]}" train --data tokens --data-path "$d/train.tok" --eval-data "$d/valid.tok" --eval-every 2 --seq 96 \
    --steps 4 --batch 2 --lr 3e-3 --warmup 1 --save-every 2 $flags --no-progress --checkpoint-dir "$d/ck_$name" \
    --metrics "$d/$name.jsonl" > "$d/out" 2>&1 || { cat "$d/out"; fail "$name: train failed"; }
  grep -q "eval at step 2: loss" "$d/out" || { cat "$d/out"; fail "$name: no eval line"; }
  [ "$(metric "$d/$name.jsonl" 1 eval_loss 2>/dev/null)" = "" ] || fail "$name: step 1 was evaluated"
  # shellcheck disable=SC2086
  at4=$("${launch[@]}" eval --checkpoint-dir "$d/ck_$name" --data-path "$d/valid.tok" --seq 96 $flags --json | eval_loss) ||
    fail "$name: eval of the checkpoint failed"
  same "$(metric "$d/$name.jsonl" 4 eval_loss)" "$at4" "$name, step 4"
  "$untied" export --checkpoint-dir "$d/ck_$name" --out "$d/step2_$name" --step 2 > /dev/null || fail "$name: export"
  # shellcheck disable=SC2086
  at2=$("${launch[@]}" eval --hf-model "$d/step2_$name" --data-path "$d/valid.tok" --seq 96 $flags --json | eval_loss) ||
    fail "$name: eval of step 2 failed"
  same "$(metric "$d/$name.jsonl" 2 eval_loss)" "$at2" "$name, step 2"
  # shellcheck disable=SC2086
  at2c=$("${launch[@]}" eval --checkpoint-dir "$d/ck_$name" --step 2 --data-path "$d/valid.tok" --seq 96 $flags --json |
         eval_loss) || fail "$name: eval --step 2 failed"
  same "$(metric "$d/$name.jsonl" 2 eval_loss)" "$at2c" "$name, eval --checkpoint-dir --step 2"
  echo "$name ($flags): eval loss in the metrics at step 2 $(metric "$d/$name.jsonl" 2 eval_loss), step 4 $(metric "$d/$name.jsonl" 4 eval_loss); untied eval of those checkpoints: $at2, $at4"
done
