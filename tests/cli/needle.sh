#!/usr/bin/env bash
# Needle in a haystack (eval --needle): the same scores (every cell's accuracy and exact share, the
# key log-likelihood to fp32 order) on 1 rank, UPipe on 4 in-process ranks and ring on 3 MPI ranks;
# the multi-key variant; a haystack from a token file with the model's tokenizer; the heatmap SVG
# with one cell per (length, depth), two panels with --compare; lengths too short refused.
# Usage: needle.sh UNTIED MPIRUN FIXTURES (reference/fixtures)
set -u
untied=$1
mpirun=$2
fx=$3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() { echo "$*"; exit 1; }
grid=(--needle --needle-lengths 192,256,384 --needle-depths 0,50,100 --needle-trials 2 --seed 3 --json)
# A byte-level model (the preset's initial weights) over the built-in filler.
"$untied" eval --preset tiny "${grid[@]}" > "$d/one.json" 2> "$d/err" || { cat "$d/err"; fail "1 rank failed"; }
"$untied" eval --preset tiny "${grid[@]}" --ranks 4 --strategy upipe > "$d/upipe4.json" 2> "$d/err" || { cat "$d/err"; fail "upipe on 4 ranks failed"; }
"$mpirun" --oversubscribe -np 3 "$untied" eval --preset tiny "${grid[@]}" --strategy ring > "$d/ring3.json" 2> "$d/err" ||
  { cat "$d/err"; fail "ring on 3 MPI ranks failed"; }
python3 - "$d/one.json" "$d/upipe4.json" "$d/ring3.json" <<'PY' || fail "the layouts disagree"
import json, sys
tables = [json.load(open(p)) for p in sys.argv[1:]]
one = tables[0]
assert len(one["cells"]) == 9, len(one["cells"])
worst = 0.0
for t in tables[1:]:
    for a, b in zip(one["cells"], t["cells"]):
        assert (a["length"], a["depth"]) == (b["length"], b["depth"])
        assert a["key_tokens"] == b["key_tokens"] and a["key_tokens"] > 0, (a, b)
        assert a["accuracy"] == b["accuracy"] and a["exact"] == b["exact"], (a, b)
        rel = abs(a["loglik"] - b["loglik"]) / abs(a["loglik"])
        assert rel < 1e-5, (a, b, rel)
        worst = max(worst, rel)
print(f"needle: 9 cells equal on 1 rank, upipe on 4 ranks and ring on 3 MPI ranks (key log-likelihood within "
      f"{worst:.1e} relative), mean accuracy {one['accuracy']:.3f}")
PY
# Multi-key, and the heatmap with a comparison panel.
"$untied" eval --preset tiny "${grid[@]}" --needle-lengths 384,512,768 --needle-keys 4 --needle-key word --svg "$d/h.svg" --compare "$d/one.json" \
  > "$d/multi.json" 2> "$d/err" || { cat "$d/err"; fail "multi-key failed"; }
[ "$(grep -o '<rect x=' "$d/h.svg" | wc -l)" -eq 18 ] || fail "the heatmap has $(grep -o '<rect x=' "$d/h.svg" | wc -l) cells, not 2 x 9"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['keys'] == 4 and j['key_kind'] == 'word', j" "$d/multi.json" ||
  fail "multi-key table"
# A token file as the haystack, with a Hugging Face tokenizer.
tok=$fx/tokenizers/llama3_style
"$untied" prepare --tokenizer "$tok" --output "$d/hay.tok" --no-progress "$tok/sample.txt" > /dev/null || fail "prepare"
"$untied" eval --preset tiny --vocab 3750 --data-path "$d/hay.tok" --tokenizer "$tok" "${grid[@]}" > "$d/hay.json" 2> "$d/err" ||
  { cat "$d/err"; fail "token-file haystack failed"; }
# The kv task's needle (its answers by the depth of their pair): equal on 1 rank and ring on 3 MPI ranks.
kvgrid=(--preset tiny --vocab 87 --needle --data kv --needle-lengths 128,256 --needle-depths 0,50,100 --needle-trials 2 --json)
"$untied" eval "${kvgrid[@]}" > "$d/kv1.json" 2> "$d/err" || { cat "$d/err"; fail "kv needle failed"; }
"$mpirun" --oversubscribe -np 3 "$untied" eval "${kvgrid[@]}" --strategy ring > "$d/kv3.json" 2> "$d/err" ||
  { cat "$d/err"; fail "kv needle on 3 MPI ranks failed"; }
python3 - "$d/kv1.json" "$d/kv3.json" <<'PY' || fail "the kv needle differs between layouts"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert len(a["cells"]) == 6 and all(c["key_tokens"] > 0 for c in a["cells"]), a["cells"]
for x, y in zip(a["cells"], b["cells"]):
    assert x["accuracy"] == y["accuracy"] and abs(x["loglik"] - y["loglik"]) <= 1e-5 * abs(x["loglik"]), (x, y)
PY
# Too short: refused with the reason.
"$untied" eval --preset tiny --needle --needle-lengths 128 --needle-keys 4 > "$d/short" 2>&1 && fail "a 128-token needle with 4 keys ran"
grep -q "tokens of haystack beside the needles" "$d/short" || { cat "$d/short"; fail "no reason given"; }
echo "needle: multi-key (4 words), a token-file haystack, the kv task by depth (1 rank = ring on 3 MPI ranks), the heatmap with --compare (18 cells), short lengths refused"
