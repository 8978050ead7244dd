#!/usr/bin/env bash
# A mixture of experts end to end under mpirun: the tiny Qwen3-MoE (8 experts) trains 3 steps on
# one rank, on 4 MPI ranks with its experts spread over them (2 each; the tokens cross in
# MPI_Alltoallv) and on 4 with every expert on every rank: the same losses, the metrics carry the
# router's loss, the tokens per expert and the bytes sent (none without expert parallelism); the
# model written by --save-hf under expert parallelism evaluates to the same loss on 1 and 4 ranks.
# Usage: moe.sh UNTIED MPIEXEC FIXTURE (reference/fixtures/hf_qwen3moe_tiny)
set -u
untied=$1
mpiexec=$2
fixture=$3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "$*"; exit 1; }
common=(--hf-model "$fixture" --kv-keys 4 --kv-values 4 --seq 48 --steps 3 --batch 2 --lr 1e-3 --warmup 0 --no-progress)
"$untied" train "${common[@]}" --metrics "$d/one.jsonl" > "$d/out" 2>&1 || { cat "$d/out"; fail "1 rank failed"; }
"$mpiexec" --oversubscribe -np 4 "$untied" train "${common[@]}" --metrics "$d/ep.jsonl" --save-hf "$d/hf" > "$d/out" 2>&1 ||
  { cat "$d/out"; fail "4 ranks with expert parallelism failed"; }
"$mpiexec" --oversubscribe -np 4 "$untied" train "${common[@]}" --metrics "$d/rep.jsonl" --no-expert-parallel > "$d/out" 2>&1 ||
  { cat "$d/out"; fail "4 ranks without expert parallelism failed"; }
python3 - "$d" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
def steps(name):
    return [json.loads(l) for l in open(f"{d}/{name}.jsonl") if '"step"' in l and '"loss"' in l]
one, ep, rep = steps("one"), steps("ep"), steps("rep")
assert len(one) == len(ep) == len(rep) == 3, (len(one), len(ep), len(rep))
for a, b, c in zip(one, ep, rep):
    for other in (b, c):
        assert abs(float(a["loss"]) - float(other["loss"])) <= 1e-5 * float(a["loss"]), (a["loss"], other["loss"])
        assert a["expert_load"] == other["expert_load"], (a["expert_load"], other["expert_load"])
        assert abs(float(a["router_aux_loss"]) - float(other["router_aux_loss"])) <= 1e-5 * float(a["router_aux_loss"])
    assert set(a["expert_load"]) == {"0", "2"}, a["expert_load"]  # layer 1 is dense (mlp_only_layers)
    assert int(b["moe_all_to_all_bytes_per_rank"]) > 0 and int(c["moe_all_to_all_bytes_per_rank"]) == 0
    assert int(one[0]["moe_all_to_all_bytes_per_rank"]) == 0
print("losses %s on 1 rank, 4 with expert parallelism (%d bytes sent a step) and 4 without: equal"
      % ([round(float(x["loss"]), 6) for x in one], int(ep[0]["moe_all_to_all_bytes_per_rank"])))
PY
# The fixture's own tokens as a token file (token_file.h, version 1, 16-bit ids).
python3 -c "import json,struct,sys; e=json.load(open(sys.argv[1]+'/expected.json')); t=e['tokens']*2; f=open(sys.argv[2],'wb'); f.write(b'UNTIEDTK'+struct.pack('<IIQQ',1,2,len(t),72)); f.write(struct.pack('<%dH'%len(t),*t))" "$fixture" "$d/t.tok"
"$untied" eval --hf-model "$d/hf" --data tokens --data-path "$d/t.tok" --seq 48 > "$d/e1" 2>&1 || { cat "$d/e1"; fail "eval on 1 rank failed"; }
"$mpiexec" --oversubscribe -np 4 "$untied" eval --hf-model "$d/hf" --data tokens --data-path "$d/t.tok" --seq 48 > "$d/e4" 2>&1 ||
  { cat "$d/e4"; fail "eval on 4 ranks failed"; }
l1=$(grep -o 'loss [0-9.]*' "$d/e1" | head -1)
l4=$(grep -o 'loss [0-9.]*' "$d/e4" | head -1)
[ -n "$l1" ] && [ "$l1" = "$l4" ] || fail "the saved model's eval: '$l1' on 1 rank, '$l4' on 4"
echo "the model saved under expert parallelism evaluates to $l1 on 1 and 4 ranks"
