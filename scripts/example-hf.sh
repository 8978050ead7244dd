#!/usr/bin/env bash
# The user's job end to end, on a CPU, with nothing downloaded: text in, a model in the Hugging
# Face layout in, a longer-context fine-tune, the model out again for transformers.
#   1. prepare: this machine's Python standard library sources (one document per file), tokenized
#      with a Llama-3-style tokenizer.json (reference/fixtures/tokenizers/llama3_style; ids as the
#      tokenizers library gives them);
#   2. a small model to start from: untied's `small` preset trained 200 steps at S = 256 and
#      written as a Hugging Face directory (base/): it stands in for a pretrained checkpoint, as
#      no pretrained Llama or Qwen checkpoint can be had from Debian or PyPI;
#   3. eval of base/ at S = 1024, four times the context it was trained at: loss, perplexity and
#      the loss by position (before.json);
#   4. fine-tune at S = 1024 (UPipe over the ranks), written out as long/ (bf16, as published
#      checkpoints are), and evaluated again; loss.svg plots both curves.
# With a real checkpoint, put its directory in place of base/ (see the README). About 5 minutes
# on 2 cores. Usage: bash scripts/example-hf.sh [WORKDIR] (default /tmp/untied-example).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
source scripts/env.sh
work=${1:-/tmp/untied-example}
mkdir -p "$work"
u=build/untied
ranks=2

stdlib=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
mapfile -t files < <(find "$stdlib" -maxdepth 1 -name '*.py' -size +8k | sort)
$u prepare --tokenizer reference/fixtures/tokenizers/llama3_style --split file --output "$work/code.tok" \
    --no-progress "${files[@]}"

rm -rf "$work/base" "$work/long"
$u train --preset small --data tokens --data-path "$work/code.tok" --seq 256 --steps 200 --batch 8 --warmup 20 \
    --ranks $ranks --no-progress --save-hf "$work/base"

$u eval --hf-model "$work/base" --data tokens --data-path "$work/code.tok" --seq 1024 --samples 32 --buckets 8 \
    --ranks $ranks --label "base (trained at S=256)" --json > "$work/before.json"
mpirun -np $ranks $u train --hf-model "$work/base" --data tokens --data-path "$work/code.tok" --seq 1024 \
    --steps 50 --batch 2 --warmup 5 --lr 1e-3 --strategy upipe --no-progress \
    --save-hf "$work/long" --save-hf-dtype bf16
mpirun -np $ranks $u eval --hf-model "$work/long" --data tokens --data-path "$work/code.tok" --seq 1024 \
    --samples 32 --buckets 8 --label "after 50 steps at S=1024" --json \
    --svg "$work/loss.svg" --compare "$work/before.json" > "$work/after.json"
python3 - "$work/before.json" "$work/after.json" <<'PY'
import json, sys
before, after = (json.load(open(f)) for f in sys.argv[1:3])
print(f"eval at S=1024, {after['samples']} sequences, {after['tokens']} predicted tokens:")
print(f"  {'':18} {'loss':>8} {'perplexity':>11}")
for name, j in (("before", before), ("after", after)):
    print(f"  {name + ' fine-tune':18} {j['loss']:8.4f} {j['perplexity']:11.2f}")
print(f"  loss by position in the {'document' if after.get('loss_by') == 'doc-position' else 'window'}"
      "     before    after")
for b, a in zip(before["loss_by_position"], after["loss_by_position"]):
    if b["loss"] is None or a["loss"] is None:
        continue
    end = "..." if b["end"] is None else b["end"]
    print(f"  [{b['begin']:5}, {end:>5})   {b['loss']:8.4f} {a['loss']:8.4f}")
print(f"  tokens/s (forward, {after['ranks']} ranks): {after['tokens_per_s']}")
PY
echo "files: $work/{code.tok,base/,long/,before.json,after.json,loss.svg}"
