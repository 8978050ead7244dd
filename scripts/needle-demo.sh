#!/usr/bin/env bash
# Did the context extension work? The needle heatmap of the built-in tiny model before and after a
# long-context fine-tune, on a CPU with nothing downloaded (about 5 minutes on 2 cores):
#   1. the tiny preset trained on the kv task at S = 256 (the main job's task: pairs spread over
#      the sequence, queried at its end), 1,500 steps (base/);
#   2. eval --needle --data kv of base/ at 256..2048 tokens (before.json): each answer counted at
#      the depth of its pair, 16 samples per length: it answers at 256 and fails more the longer
#      and the further back;
#   3. fine-tuned at S = 2048 on the same task, 800 steps, UPipe over 2 ranks (long/);
#   4. eval --needle again (after.json) and the two heatmaps side by side (needle.svg, and
#      needle.png when rsvg-convert is installed).
# The evaluation's samples are not the training's (another seed). For a real model, the same eval
# hides a text needle in the user's own data (docs/models.md); a tiny model does not learn that
# retrieval in minutes on a CPU, the kv task it does.
# Usage: bash scripts/needle-demo.sh [WORKDIR] (default /tmp/untied-needle).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
source scripts/env.sh
work=${1:-/tmp/untied-needle}
mkdir -p "$work"
u=build/untied

rm -rf "$work/base" "$work/long"
$u train --seq 256 --steps 1500 --batch 4 --ranks 2 --no-progress --save-hf "$work/base"
needle=(--needle --data kv --seq 2048 --needle-lengths 256,512,1024,2048 --needle-depths 0,25,50,75,100
        --needle-trials 16 --ranks 2)
$u eval --hf-model "$work/base" "${needle[@]}" --label "trained at S=256" --json > "$work/before.json"
$u train --hf-model "$work/base" --seq 2048 --steps 800 --batch 2 --lr 1e-3 --warmup 40 --ranks 2 \
    --strategy upipe --no-progress --save-hf "$work/long"
$u eval --hf-model "$work/long" "${needle[@]}" --label "fine-tuned at S=2048" --json > "$work/after.json"
$u eval --hf-model "$work/long" "${needle[@]}" --label "fine-tuned at S=2048" --svg "$work/needle.svg" \
    --compare "$work/before.json"
if command -v rsvg-convert > /dev/null; then rsvg-convert -o "$work/needle.png" "$work/needle.svg"; fi
echo "files: $work/{before.json,after.json,needle.svg$(command -v rsvg-convert > /dev/null && echo ,needle.png)}"
