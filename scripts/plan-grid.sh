#!/usr/bin/env bash
# `untied plan` against the rehearsal over a grid of configurations: prints a Markdown table of
# the planned and rehearsed peak per rank and the error, and exits 1 when any error is over 2%.
# Usage: scripts/plan-grid.sh [UNTIED] [--quick]
#   UNTIED: the untied binary (default build/untied); --quick: a short grid (the CLI test's).
set -euo pipefail
cd "$(dirname "$0")/.."
UNTIED=build/untied
QUICK=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    *) UNTIED="$a" ;;
  esac
done

LLAMA="--preset llama3-8b --vocab 128256"
QWEN="--preset qwen3-32b"
rows=()
if [ "$QUICK" = 1 ]; then
  rows+=("$LLAMA --layers 4 --ranks 8 --strategy upipe --offload-inputs --dtype bf16 --seq 1M"
         "$LLAMA --layers 4 --ranks 8 --strategy ulysses --dtype bf16 --seq 512K"
         "$LLAMA --layers 4 --ranks 8 --strategy ring --offload-inputs --dtype f32 --seq 256K"
         "$LLAMA --layers 4 --ranks 8 --strategy upipe --ring 2 --offload-inputs --dtype f32 --seq 1M"
         "$QWEN --layers 2 --ranks 8 --strategy upipe --offload-inputs --keep-inputs 1 --dtype bf16 --seq 512K"
         "--preset small --ranks 3 --strategy ring --dtype bf16 --seq 30000"
         "--preset small --ranks 2 --strategy upipe --dtype f32 --seq 8192 --threads 2"
         "$LLAMA --layers 4 --ranks 8 --strategy upipe --offload-inputs --no-tiled-dx --dtype bf16 --seq 2M"
         "$LLAMA --layers 4 --ranks 8 --strategy upipe --offload-inputs --overlap on --dtype f32 --seq 2M"
         "$LLAMA --layers 4 --ranks 8 --strategy upipe --offload-inputs --no-grads-on-host --no-dh-on-host --no-attn-out-on-host --dtype bf16 --seq 1M"
         "$LLAMA --layers 4 --ranks 8 --strategy upipe --offload-inputs --upipe-keep-last on --dtype bf16 --seq 1M"
         "$QWEN --layers 2 --ranks 8 --strategy upipe --ring 2 --overlap on --upipe-keep-last on --dtype bf16 --seq 256K"
         "--preset llama3-70b --layers 2 --ranks 8 --no-tiled-dx --upipe-keep-last on --dtype bf16 --seq 1M")
else
  for st in "upipe" "ulysses" "ring" "upipe --ring 2" "ulysses --ring 2"; do
    for off in "--offload-inputs" ""; do
      for dt in bf16 f32; do
        for S in 256K 2M 8M; do
          [ "$S" = 8M ] && [ -z "$off" ] && continue
          rows+=("$LLAMA --ranks 8 --strategy $st $off --dtype $dt --seq $S")
        done
      done
    done
  done
  rows+=("$LLAMA --ranks 16 --strategy upipe --ring 2 --offload-inputs --dtype bf16 --seq 12M"
         "$LLAMA --ranks 16 --strategy ulysses --ring 2 --offload-inputs --dtype bf16 --seq 8M"
         "$LLAMA --ranks 8 --upipe-heads 16 --offload-inputs --dtype bf16 --seq 4M"
         "$LLAMA --ranks 8 --attn-tile -1 --no-early-delta --no-refetch-inputs --offload-inputs --dtype bf16 --seq 4M"
         "$LLAMA --ranks 8 --offload-inputs --keep-inputs 4 --offload-every 3 --dtype bf16 --seq 2M"
         "$LLAMA --ranks 8 --no-tiled-dx --offload-inputs --dtype bf16 --seq 8M"
         "$LLAMA --ranks 8 --no-grads-on-host --no-dh-on-host --no-attn-out-on-host --offload-inputs --dtype bf16 --seq 8M"
         "$LLAMA --ranks 8 --strategy ulysses --no-dh-on-host --offload-inputs --dtype bf16 --seq 4M"
         "$LLAMA --ranks 8 --overlap on --no-grads-on-host --offload-inputs --dtype bf16 --seq 8M"
         "$LLAMA --ranks 8 --no-attn-out-on-host --offload-inputs --dtype f32 --seq 4M"
         "$LLAMA --ranks 8 --offload-inputs --dtype bf16 --seq 24M"
         "$QWEN --ranks 16 --strategy upipe --offload-inputs --dtype bf16 --seq 16M"
         "$LLAMA --ranks 8 --overlap on --offload-inputs --dtype bf16 --seq 8M"
         "$LLAMA --ranks 8 --overlap on --offload-inputs --dtype f32 --seq 2M"
         "$LLAMA --ranks 8 --overlap on --upipe-heads 16 --offload-inputs --dtype bf16 --seq 4M"
         "$LLAMA --ranks 16 --strategy upipe --ring 2 --overlap on --offload-inputs --dtype bf16 --seq 8M"
         "$QWEN --ranks 16 --strategy upipe --overlap on --offload-inputs --dtype bf16 --seq 4M"
         "$LLAMA --ranks 8 --strategy ulysses --no-tiled-dx --offload-inputs --dtype f32 --seq 4M"
         "$QWEN --ranks 16 --strategy upipe --no-tiled-dx --offload-inputs --dtype bf16 --seq 4M"
         "$LLAMA --ranks 8 --threads 4 --loss-chunk 4096 --dtype bf16 --seq 512K"
         "$LLAMA --ranks 4 --strategy ring --dtype bf16 --seq 64K"
         "$QWEN --ranks 16 --strategy upipe --offload-inputs --dtype bf16 --seq 4M"
         "$QWEN --ranks 16 --strategy ulysses --offload-inputs --dtype bf16 --seq 2M"
         "$QWEN --ranks 16 --strategy upipe --ring 2 --offload-inputs --dtype bf16 --seq 4M"
         "$QWEN --ranks 16 --strategy ring --offload-inputs --dtype bf16 --seq 1M"
         "--preset small --ranks 2 --dtype bf16 --seq 8192"
         "--preset small --ranks 2 --dtype f32 --seq 8192"
         "--preset small --ranks 3 --strategy ring --dtype bf16 --seq 30000"
         "--preset small --ranks 4 --strategy ulysses --dtype f32 --seq 32768 --mlp-tile 512 --attn-tile 300")
fi

echo "| configuration | planned | rehearsed | error | peak at |"
echo "|---|---|---|---|---|"
worst=0
fail=0
for r in "${rows[@]}"; do
  # shellcheck disable=SC2086
  out=$("$UNTIED" plan $r --check 2>&1) || fail=1
  planned=$(sed -n 's/^check against the rehearsal: planned \(.*\), rehearsed .*/\1/p' <<<"$out")
  rehearsed=$(sed -n 's/^check against the rehearsal: .*, rehearsed \(.*\), error .*/\1/p' <<<"$out")
  err=$(sed -n 's/^check against the rehearsal: .*, error \([^ ]*\) .*/\1/p' <<<"$out")
  at=$(sed -n 's/^peak per rank: .* at the \(.*\)$/\1/p' <<<"$out" | sed 's/ (--mem-budget.*//')
  if [ -z "$err" ]; then
    echo "| \`${r}\` | - | - | failed: $(tail -1 <<<"$out") | |"
    fail=1
    continue
  fi
  echo "| \`${r}\` | ${planned} | ${rehearsed} | ${err} | ${at} |"
done
exit $fail
