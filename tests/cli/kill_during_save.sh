#!/usr/bin/env bash
# kill -9 during a checkpoint save, at each point of it, leaves the previous checkpoint loadable:
# the resumed run's losses equal the uninterrupted run's bitwise, and its metrics file holds
# every step exactly once. Usage: kill_during_save.sh UNTIED
set -u
untied=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
run=(train --ranks 2 --steps 6 --batch 1 --seq 64 --kv-keys 8 --no-progress --save-every 2)
"$untied" "${run[@]}" --metrics "$d/full.jsonl" > /dev/null || { echo "the uninterrupted run failed"; exit 1; }
losses() { python3 -c "import json,sys; print(' '.join(str(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
want=$(losses "$d/full.jsonl")
for point in save-begin save-rank-file save-before-latest save-latest-tmp; do
  ck=$d/ck_$point
  UNTIED_FAULT=kill:at=$point:step=4 "$untied" "${run[@]}" --checkpoint-dir "$ck" --metrics "$ck.jsonl" > /dev/null 2>&1
  code=$?
  [ $code -eq 137 ] || { echo "$point: the run was not killed (exit $code)"; exit 1; }
  [ "$(cat "$ck/latest")" = step_00000002 ] || { echo "$point: latest is $(cat "$ck/latest"), not step_00000002"; exit 1; }
  "$untied" "${run[@]}" --checkpoint-dir "$ck" --metrics "$ck.jsonl" --resume > /dev/null ||
    { echo "$point: resume failed"; exit 1; }
  steps=$(python3 -c "import json,sys; print(' '.join(str(json.loads(l)['step']) for l in open(sys.argv[1])))" "$ck.jsonl")
  [ "$steps" = "1 2 3 4 5 6" ] || { echo "$point: metrics steps are '$steps'"; exit 1; }
  got=$(losses "$ck.jsonl")
  [ "$got" = "$want" ] || { echo "$point: losses differ: '$got' against '$want'"; exit 1; }
  echo "$point: killed (exit 137), resumed from step 2, losses equal the uninterrupted run's: $got"
done
