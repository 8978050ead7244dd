#!/usr/bin/env bash
# The metrics line's op_ms (CPU ranks): rank 0's own time in each kernel op of the step, named as
# the kernels layer names them. Checks that the ops a training step must run are there, every
# time is a number >= 0, and that together they fit inside the step (they exclude communication
# and glue, and no op's time counts twice: the loss's gemms are the gemm's).
set -euo pipefail
untied=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$untied" train --steps 2 --seq 128 --batch 1 --no-progress --ranks 2 --metrics "$tmp/m.jsonl" > /dev/null
python3 - "$tmp/m.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 2, lines
for j in lines:
    ops = {k: float(v) for k, v in j["op_ms"].items()}
    for need in ("gemm", "attention_forward", "attention_backward", "rmsnorm_forward", "rope", "lm_head_loss", "adamw_step"):
        assert need in ops, f"op_ms lacks {need}: {sorted(ops)}"
    assert all(v >= 0 for v in ops.values()), ops
    total = sum(ops.values())
    step = float(j["step_ms"])
    assert 0 < total <= step * 1.01, f"ops {total} ms against the step's {step} ms"
    print(f"step {j['step']}: {len(ops)} ops, {total:.2f} of {step:.2f} ms")
PY
