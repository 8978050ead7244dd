#!/usr/bin/env bash
# Did the context extension work? The needle-in-a-haystack heatmap of a small model before and
# after a long-context fine-tune, on a CPU with nothing downloaded:
#   1. passkey data: haystacks of English and multilingual text (the Llama-3-style tokenizer's
#      sample), a needle "The special magic number is: N." at a random depth, the question at the
#      end; written as prompt/completion JSONL and tokenized by `untied prepare --format
#      prompt-completion` (trained on the key only), short documents (up to ~230 tokens) and long
#      ones (up to ~1,900);
#   2. the `small` preset trained at S = 256 on the short ones (base/);
#   3. eval --needle of base/ at 256..2048 tokens (before.json): it finds the key only as far as it
#      was trained;
#   4. fine-tuned at S = 2048 (UPipe over 2 ranks, RoPE base raised) on the long ones (long/);
#   5. eval --needle again (after.json) and the two heatmaps side by side (needle.svg, and
#      needle.png when rsvg-convert is installed).
# The keys, depths and haystacks of the evaluation differ from the training's (another seed, the
# built-in filler). Usage: bash scripts/needle-demo.sh [WORKDIR] (default /tmp/untied-needle).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
source scripts/env.sh
work=${1:-/tmp/untied-needle}
mkdir -p "$work"
u=build/untied
tok=reference/fixtures/tokenizers/llama3_style
steps_short=${NEEDLE_STEPS_SHORT:-1200}
steps_long=${NEEDLE_STEPS_LONG:-300}

python3 - "$tok/sample.txt" "$work" <<'PY'
import json, random, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
sentences = [s.strip() for s in re.split(r"(?<=[.!?。！？])\s+", text) if len(s.strip()) > 20]
rng = random.Random(7)
def sample(chars):
    hay, n = [], 0
    while n < chars:
        s = rng.choice(sentences)
        hay.append(s)
        n += len(s) + 1
    key = str(rng.randrange(1000000, 10000000))
    at = rng.randrange(len(hay) + 1)
    needle = f"\n\nThe special magic number is: {key}.\n\n"
    prompt = " ".join(hay[:at]) + needle + " ".join(hay[at:]) + \
             "\n\nWhat is the special magic number? The special magic number is: "
    return {"prompt": prompt, "completion": key}
for name, lo, hi, count in (("short", 150, 420, 6000), ("long", 300, 4400, 2500)):
    with open(f"{sys.argv[2]}/{name}.jsonl", "w") as f:
        for _ in range(count):
            f.write(json.dumps(sample(rng.randrange(lo, hi)), ensure_ascii=False) + "\n")
PY
for name in short long; do
  $u prepare --tokenizer "$tok" --format prompt-completion --eos no --output "$work/$name.tok" --no-progress \
      "$work/$name.jsonl"
done

rm -rf "$work/base" "$work/long"
$u train --preset small --vocab 3750 --data tokens --data-path "$work/short.tok" --seq 256 --steps "$steps_short" \
    --batch 8 --lr 2e-3 --warmup 50 --shuffle --ranks 2 --no-progress --save-hf "$work/base"
needle=(--needle --tokenizer "$tok" --seq 2048 --needle-lengths 256,512,1024,2048 --needle-depths 0,25,50,75,100
        --needle-trials 4 --seed 11 --ranks 2)
$u eval --hf-model "$work/base" "${needle[@]}" --label "trained at S=256" --json > "$work/before.json"
$u train --hf-model "$work/base" --data tokens --data-path "$work/long.tok" --seq 2048 --rope-theta 80000 \
    --steps "$steps_long" --batch 2 --lr 1e-3 --warmup 20 --shuffle --strategy upipe --ranks 2 --no-progress \
    --save-hf "$work/long"
$u eval --hf-model "$work/long" "${needle[@]}" --label "fine-tuned at S=2048" --svg "$work/needle.svg" \
    --compare "$work/before.json"
if command -v rsvg-convert > /dev/null; then rsvg-convert -o "$work/needle.png" "$work/needle.svg"; fi
echo "files: $work/{before.json,needle.svg$(command -v rsvg-convert > /dev/null && echo ,needle.png)}"
