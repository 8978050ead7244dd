#!/usr/bin/env bash
# Datasets in: two token files mixed 3:1 and shuffled, with a seed; a run stopped at step 6 and
# resumed reads the sequences an uninterrupted run reads (the same losses, bitwise); the data's wrap is printed with its pass and logged; data
# shorter than a sequence is refused unless --data-repeat. Usage: data_mix.sh UNTIED TOKENIZER_DIR
set -u
untied=$1
tok=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "$*"; exit 1; }
losses() { python3 -c "import json,sys; print(' '.join(str(json.loads(l)['loss']) for l in open(sys.argv[1])))" "$1"; }
"$untied" prepare --tokenizer "$tok" --output "$d/a.tok" --no-progress "$tok/sample.txt" > /dev/null || fail "prepare a"
"$untied" prepare --tokenizer "$tok" --output "$d/b.tok" --no-progress "$tok/docs.jsonl" > /dev/null || fail "prepare b"
run=(train --data tokens --data-path "$d/a.tok,$d/b.tok" --data-weights 3,1 --shuffle --seed 5 --seq 64 --steps 12
     --batch 2 --lr 1e-3 --warmup 2 --no-progress --ranks 2)
"$untied" "${run[@]}" --metrics "$d/full.jsonl" > /dev/null 2> "$d/full.err" || { cat "$d/full.err"; fail "the uninterrupted run failed"; }
grep -q "untied train: data: $d/b.tok wrapped: pass 2 of it begins in step" "$d/full.err" || { cat "$d/full.err"; fail "no wrap line"; }
python3 - "$d/full.jsonl" "$d/a.tok" "$d/b.tok" <<'PY' || fail "metrics"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
last = lines[-1]["data_passes"]
assert set(last) == {sys.argv[2], sys.argv[3]}, last
assert last[sys.argv[3]] > 1, last   # b.tok (192 tokens) is past its first pass after 24 sequences
print(f"after 12 steps of 2 sequences: passes {last}")
PY
"$untied" "${run[@]}" --stop-after 6 --checkpoint-dir "$d/ck" --metrics "$d/resumed.jsonl" > /dev/null 2>&1 || fail "the first half failed"
"$untied" "${run[@]}" --checkpoint-dir "$d/ck" --resume --metrics "$d/resumed.jsonl" > /dev/null 2>&1 || fail "the resume failed"
[ "$(losses "$d/resumed.jsonl")" = "$(losses "$d/full.jsonl")" ] || fail "the resumed run's losses differ: $(losses "$d/resumed.jsonl") against $(losses "$d/full.jsonl")"
echo "3:1 mix, shuffled: stopped at step 6 and resumed, the 12 losses equal the uninterrupted run's"
# 8 tokens at S = 4096: refused, then accepted with --data-repeat.
python3 -c "
import struct
open('$d/eight.tok','wb').write(b'UNTIEDTK' + struct.pack('<IIQQ', 1, 2, 8, 100) + struct.pack('<8H', *range(8)))"
"$untied" train --data tokens --data-path "$d/eight.tok" --seq 4096 --steps 1 --no-progress > "$d/short.out" 2>&1 && fail "8 tokens at S = 4096 trained"
grep -q "holds 8 tokens, fewer than one sequence of --seq 4096" "$d/short.out" || { cat "$d/short.out"; fail "no reason given"; }
"$untied" train --data tokens --data-path "$d/eight.tok" --seq 64 --steps 1 --data-repeat --no-progress > /dev/null 2>&1 || fail "--data-repeat refused"
echo "8 tokens at S = 4096 refused: $(grep -o 'the data .*' "$d/short.out" | head -1)"
