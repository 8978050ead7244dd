#!/usr/bin/env bash
# plan --fit finds the S that train --rehearsal --fit-seq finds, with and without offload, and its
# --json and --svg outputs are what they say.
set -euo pipefail
UNTIED="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for extra in "--offload-inputs" "--strategy ulysses --offload-inputs" "--strategy upipe"; do
  # shellcheck disable=SC2086
  common="--preset llama3-8b --vocab 128256 --layers 4 --ranks 8 --dtype bf16 --mem-budget 24G $extra"
  # shellcheck disable=SC2086
  planned=$("$UNTIED" plan $common --fit | sed -n 's/^longest sequence that fits .*: S = \([0-9]*\),.*/\1/p')
  # shellcheck disable=SC2086
  rehearsed=$("$UNTIED" train $common --rehearsal --fit-seq | sed -n 's/^longest sequence .*: S = \([0-9]*\) .*/\1/p')
  echo "$extra: plan --fit S = $planned, train --fit-seq S = $rehearsed"
  [ -n "$planned" ] && [ "$planned" = "$rehearsed" ] || { echo "FAIL: they differ"; exit 1; }
done
"$UNTIED" plan --preset llama3-8b --vocab 128256 --ranks 8 --dtype bf16 --offload-inputs --seq 4M --json > "$tmp/plan.json"
python3 - "$tmp/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
peak = max(m["total_bytes"] for m in p["moments"])
assert p["peak_bytes"] == peak, (p["peak_bytes"], peak)
for m in p["moments"]:
    assert sum(i["bytes"] for i in m["items"]) == m["total_bytes"], m["name"]
    assert sum(m["by_tag"].values()) == m["total_bytes"], m["name"]
# 32 offloaded inputs (L, E), a block's dhm (L, E) and its kept gradients (L, H + 2 G, D), L = 4M / 8,
# in bf16 (the saved attention output (L, H D) is gone before the kept gradients come)
assert p["host_bytes_per_rank"] == (33 * 4096 + (32 + 2 * 8) * 128) * (4 << 20) // 8 * 2, p["host_bytes_per_rank"]
print("json: peak", p["peak_bytes"], "at", p["peak_moment"])
PY
"$UNTIED" plan --preset llama3-8b --vocab 128256 --ranks 8 --dtype bf16 --offload-inputs --seq 8M --mem-budget 80G \
  --svg "$tmp/plan.svg" > /dev/null
grep -q "<svg" "$tmp/plan.svg" && grep -q ">upipe, llama3-8b on 8 ranks, bf16<" "$tmp/plan.svg" && grep -q ">ring, " "$tmp/plan.svg"
echo "svg: $(grep -c '<polygon' "$tmp/plan.svg") areas"
