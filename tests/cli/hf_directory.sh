#!/usr/bin/env bash
# A complete Hugging Face directory out: --save-hf and `untied export` copy the source model's
# tokenizer files (byte for byte) and store the tensors in the source model's dtype by default;
# the checkpoint directory keeps the tokenizer, so an export of any step (--step N) is complete
# too. Usage: hf_directory.sh UNTIED FIXTURES (reference/fixtures)
set -u
untied=$1
fixtures=$2
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "$*"; exit 1; }
# The dtype of the first tensor of a safetensors file (its JSON header).
st_dtype() { python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n)); print(next(v['dtype'] for k,v in h.items() if k!='__metadata__'))" "$1"; }
json_key() { python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c.get('torch_dtype') or c.get('dtype'))" "$1"; }
tokenizer_files="tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json chat_template.jinja"
same_files() {  # same_files FROM TO: every tokenizer file of FROM is in TO, byte for byte
  for f in $tokenizer_files; do
    cmp -s "$1/$f" "$2/$f" || fail "$2/$f is not $1/$f"
  done
}

for model in hf_qwen3_tiny:qwen_style:BF16:bfloat16 hf_llama_tiny:llama3_style:F32:float32; do
  IFS=: read -r fixture tok want_dtype want_torch <<< "$model"
  m=$d/$fixture
  cp -r "$fixtures/$fixture" "$m"
  cp "$fixtures/tokenizers/$tok/tokenizer.json" "$fixtures/tokenizers/$tok/tokenizer_config.json" "$m/"
  printf '{"bos_token": "<s>", "eos_token": "</s>"}\n' > "$m/special_tokens_map.json"
  printf '{%% for m in messages %%}{{ m.role }}: {{ m.content }}\n{%% endfor %%}' > "$m/chat_template.jinja"
  [ -f "$m/generation_config.json" ] || fail "$fixture has no generation_config.json"
  "$untied" train --hf-model "$m" --kv-keys 4 --kv-values 4 --seq 48 --steps 4 --save-every 2 --batch 1 --ranks 2 \
    --no-progress --checkpoint-dir "$d/ck_$fixture" --save-hf "$d/out_$fixture" > "$d/train.out" 2>&1 ||
    { cat "$d/train.out"; fail "$fixture: train failed"; }
  same_files "$m" "$d/out_$fixture"
  same_files "$m" "$d/ck_$fixture"
  [ "$(st_dtype "$d/out_$fixture/model.safetensors")" = "$want_dtype" ] || fail "$fixture: --save-hf wrote $(st_dtype "$d/out_$fixture/model.safetensors"), not the source's $want_dtype"
  [ "$(json_key "$d/out_$fixture/config.json")" = "$want_torch" ] || fail "$fixture: --save-hf config.json says $(json_key "$d/out_$fixture/config.json")"
  [ "$(json_key "$d/ck_$fixture/config.json")" = "$want_torch" ] || fail "$fixture: the checkpoint's config.json says $(json_key "$d/ck_$fixture/config.json")"
  # Export of an older step, and of the newest: complete, in the source's dtype.
  out=$("$untied" export --checkpoint-dir "$d/ck_$fixture" --out "$d/e2_$fixture" --step 2) || fail "$fixture: export --step 2 failed: $out"
  echo "$out" | grep -q "wrote step 2 to .*($want_dtype), tokenizer.json" || fail "$fixture: export said: $out"
  same_files "$m" "$d/e2_$fixture"
  [ "$(st_dtype "$d/e2_$fixture/model.safetensors")" = "$want_dtype" ] || fail "$fixture: export wrote $(st_dtype "$d/e2_$fixture/model.safetensors")"
  out=$("$untied" export --checkpoint-dir "$d/ck_$fixture" --out "$d/e4_$fixture" --dtype f16) || fail "$fixture: export failed: $out"
  echo "$out" | grep -q "wrote step 4 to .*(F16)" || fail "$fixture: export said: $out"
  cmp -s "$d/e2_$fixture/model.safetensors" "$d/e4_$fixture/model.safetensors" && fail "$fixture: steps 2 and 4 exported the same weights"
  # The exported directory is a model untied loads again, and a step that was never saved is refused.
  "$untied" train --hf-model "$d/e2_$fixture" --kv-keys 4 --kv-values 4 --seq 48 --steps 1 --batch 1 --no-progress > /dev/null ||
    fail "$fixture: the export of step 2 does not train"
  "$untied" export --checkpoint-dir "$d/ck_$fixture" --out "$d/e3_$fixture" --step 3 > "$d/e3.out" 2>&1 && fail "$fixture: export --step 3 (never saved) succeeded"
  grep -q "step" "$d/e3.out" || { cat "$d/e3.out"; fail "$fixture: export --step 3 gave no reason"; }
  echo "$fixture: --save-hf, the checkpoint and export --step 2 hold the 5 tokenizer files byte for byte, tensors $want_dtype by default; step 3 refused: $(head -1 "$d/e3.out")"
done
