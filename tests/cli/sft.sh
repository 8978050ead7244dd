#!/usr/bin/env bash
# Supervised fine-tuning data against transformers and TRL (reference/fixtures/sft, written by
# reference/make_sft_fixtures.py): for a Llama-3-style and a Qwen3 model directory,
#   - prepare --format prompt-completion gives TRL's input_ids and completion mask, sample by sample
#     (seam merges included);
#   - prepare --format messages gives apply_chat_template's ids and the assistant-turn mask (TRL's
#     completion mask on the single-turn conversations);
#   - eval of the packed samples gives transformers' loss with the prompt's labels at -100 (the mean
#     over every target token of every sample) and its token count, on 1 rank and on 4 MPI ranks,
#     and so does training's first step over the same sequences.
# Usage: sft.sh UNTIED MPIRUN FIXTURES (reference/fixtures)
set -u
untied=$1
mpirun=$2
fx=$3/sft
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "$*"; exit 1; }
for model in llama qwen3; do
  "$untied" prepare --tokenizer "$fx/$model" --format prompt-completion --output "$d/$model.pc.tok" --no-progress \
    "$fx/samples_pc.jsonl" > "$d/pc.out" 2>&1 || { cat "$d/pc.out"; fail "$model: prepare prompt-completion failed"; }
  "$untied" prepare --tokenizer "$fx/$model" --format messages --output "$d/$model.chat.tok" --no-progress \
    "$fx/samples_chat.jsonl" > "$d/chat.out" 2>&1 || { cat "$d/chat.out"; fail "$model: prepare messages failed"; }
  python3 - "$fx/expected.json" "$model" "$d/$model.pc.tok" "$d/$model.chat.tok" <<'PY' || fail "$model: the token files differ from the reference"
import json, struct, sys
expected, model, pc, chat = json.load(open(sys.argv[1]))["models"][sys.argv[2]], *sys.argv[2:5]

def read(path):  # token_file.h, version 3: tokens, document index, loss mask
    b = open(path, "rb").read()
    version, width, n, _ = struct.unpack("<IIQQ", b[8:32])
    assert version == 3, version
    fmt = "<%d%s" % (n, "H" if width == 2 else "I")
    tokens = list(struct.unpack(fmt, b[32:32 + n * width]))
    at = 32 + n * width
    m = struct.unpack("<Q", b[at:at + 8])[0]
    starts = list(struct.unpack("<%dQ" % m, b[at + 8:at + 8 + 8 * m])) + [n]
    at += 8 + 8 * m
    mask = [(b[at + i // 8] >> (i % 8)) & 1 for i in range(n)]
    return [(tokens[s:e], mask[s:e]) for s, e in zip(starts, starts[1:])]

docs = read(pc)
want = expected["prompt_completion"]["samples"]
assert len(docs) == len(want), (len(docs), len(want))
for i, ((ids, mask), w) in enumerate(zip(docs, want)):
    assert ids == w["input_ids"], (i, ids, w["input_ids"])
    assert mask == w["completion_mask"], (i, mask, w["completion_mask"])
merged = [i for i, w in enumerate(want) if w["seam_merged"]]
docs = read(chat)
want = expected["messages"]["samples"]
assert len(docs) == len(want), (len(docs), len(want))
agree = 0
for i, ((ids, mask), w) in enumerate(zip(docs, want)):
    assert ids == w["input_ids"], (i, ids, w["input_ids"])
    assert mask == w["mask"], (i, mask, w["mask"])
    if w["trl"] is not None:
        assert ids == w["trl"]["input_ids"] and mask == w["trl"]["completion_mask"], i
        agree += 1
print(f"{model}: {len(expected['prompt_completion']['samples'])} prompt-completion samples equal TRL's ids and masks "
      f"(seam merges in {merged}); {len(want)} conversations equal apply_chat_template's ids, {agree} single-turn ones "
      f"TRL's completion masks")
PY
  for data in pc chat; do
    key=$([ $data = pc ] && echo prompt_completion || echo messages)
    for launch in one mpi4; do
      run=("$untied")
      [ $launch = mpi4 ] && run=("$mpirun" --oversubscribe -np 4 "$untied")
      "${run[@]}" eval --hf-model "$fx/$model" --data-path "$d/$model.$data.tok" --seq 256 --json > "$d/eval.json" 2> "$d/eval.err" ||
        { cat "$d/eval.err"; fail "$model $data $launch: eval failed"; }
      python3 - "$fx/expected.json" "$model" "$key" "$d/eval.json" "$launch" <<'PY' || fail "$model $data $launch: the loss differs"
import json, sys
ref = json.load(open(sys.argv[1]))["models"][sys.argv[2]][sys.argv[3]]["loss"]
got = json.load(open(sys.argv[4]))
assert got["tokens"] == ref["count"], (got["tokens"], ref["count"])
rel = abs(got["loss"] - ref["mean"]) / ref["mean"]
# fp32 forwards in another summation order (and packed positions: RoPE sees only offsets)
assert rel < 2e-6, (got["loss"], ref["mean"], rel)
print(f"  {sys.argv[2]} {sys.argv[3]}, {sys.argv[5]}: loss {got['loss']:.7f} over {got['tokens']} target tokens, "
      f"transformers {ref['mean']:.7f} (relative difference {rel:.1e})")
PY
    done
    # Training counts the same loss: step 1 over every packed sequence (before any update), on 4 ranks.
    samples=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples'])" "$d/eval.json")
    "$mpirun" --oversubscribe -np 4 "$untied" train --hf-model "$fx/$model" --data tokens --data-path "$d/$model.$data.tok" \
      --seq 256 --steps 1 --batch "$samples" --no-progress --metrics "$d/train.jsonl" > /dev/null 2>&1 || fail "$model $data: train failed"
    python3 - "$fx/expected.json" "$model" "$key" "$d/train.jsonl" <<'PY' || fail "$model $data: the training loss differs"
import json, sys
ref = json.load(open(sys.argv[1]))["models"][sys.argv[2]][sys.argv[3]]["loss"]["mean"]
got = json.loads(open(sys.argv[4]).readline())["loss"]
assert abs(got - ref) <= 1e-6 * ref + 5e-7, (got, ref)  # the metrics line's 6 decimals
print(f"  {sys.argv[2]} {sys.argv[3]}, train step 1 on 4 MPI ranks: loss {got} (transformers {ref:.7f})")
PY
  done
done
