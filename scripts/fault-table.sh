#!/usr/bin/env bash
# Tries every fault untied is meant to survive and prints one Markdown row each: the fault, the
# exit status, the seconds to exit, the first line of untied's message, whether it hung (killed
# after 120 s) and, where a checkpoint was involved, whether it was lost (the previous one still
# resumes). Usage: bash scripts/fault-table.sh [UNTIED] (default build/untied) > faults.md
set -u
cd "$(dirname "$0")/.."
u=$(realpath "${1:-build/untied}")
source scripts/env.sh >/dev/null 2>&1 || true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mpi=(mpirun --oversubscribe -np)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fix=reference/fixtures
small=(train --steps 4 --batch 1 --seq 64 --kv-keys 8 --no-progress)
n=0

# row NAME LOST_CHECK -- COMMAND...: runs COMMAND (120 s at most), prints the row. LOST_CHECK is a
# shell test of the checkpoint afterwards ("-" when none is involved).
row() {
  local name=$1 lost_check=$2
  shift 3
  local t0 t1 out code
  t0=$(date +%s.%N)
  out=$(timeout -s KILL 120 "$@" 2>&1)
  code=$?
  t1=$(date +%s.%N)
  local msg hung lost
  # (the first line that says what happened: not the stop notice the other ranks print when mpirun
  # ends a job with SIGTERM)
  msg=$(grep -v "stop asked for" <<<"$out" | grep -m1 -E "^untied|mpirun noticed|mpirun detected" | cut -c1-200 | sed 's/|/\\|/g')
  [ -n "$msg" ] || msg=$(head -1 <<<"$out" | cut -c1-200 | sed 's/|/\\|/g')
  [ -n "$msg" ] || [ $code -ne 137 ] || msg="(killed: SIGKILL)"
  hung=no
  [ $code -eq 137 ] && [ "$(echo "$t1 - $t0 > 110" | bc)" = 1 ] && hung=YES
  lost=-
  if [ "$lost_check" != - ]; then
    if eval "$lost_check"; then lost=no; else lost=YES; fi
  fi
  n=$((n + 1))
  printf '| %d | %s | %d | %.1f | %s | %s | %s |\n' "$n" "$name" "$code" "$(echo "$t1 - $t0" | bc)" "$msg" "$hung" "$lost"
}

resumes() {  # a copy of the checkpoint in $1 resumes and trains to the end
  rm -rf "$d/copy" && cp -r "$1" "$d/copy" && "$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/copy" --resume > /dev/null 2>&1
}

echo "| # | fault | exit | s | message | hung | lost |"
echo "|---|---|---|---|---|---|---|"
row "unknown command" - -- "$u" trian
row "unknown flag" - -- "$u" train --bogus 1
row "not an integer" - -- "$u" attn --seq abc
row "sequence length 0" - -- "$u" attn --seq 0
row "heads not divisible by the ranks (mpirun -np 3)" - -- "${mpi[@]}" 3 "$u" attn --seq 96
row "GQA: heads not a multiple of kv_heads" - -- "$u" attn --heads 6 --kv-heads 4
row "memory budget too small (mpirun -np 2)" - -- "${mpi[@]}" 2 "$u" attn --seq 1024 --mem-budget 2M
row "document lengths do not sum to S" - -- "$u" attn --seq 256 --docs 100,28,122
row "window 0" - -- "$u" train --window 0 --steps 1 --no-progress
row "ring degree not dividing the ranks" - -- "$u" attn --ranks 4 --seq 96 --strategy upipe --ring 3
row "--device cuda without a GPU" - -- "$u" attn --device cuda
row "missing token file" - -- "$u" "${small[@]}" --data tokens --data-path "$d/none.tok"
printf 'garbage bytes, not tokens' > "$d/bad.tok"
row "not a token file" - -- "$u" "${small[@]}" --data tokens --data-path "$d/bad.tok"
"$u" prepare --tokenizer $fix/tokenizers/llama3_style --output "$d/ok.tok" --no-progress $fix/tokenizers/llama3_style/sample.txt > /dev/null 2>&1
head -c 100 "$d/ok.tok" > "$d/short.tok"
row "truncated token file" - -- "$u" "${small[@]}" --data tokens --data-path "$d/short.tok"
"$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/ck" --stop-after 2 > /dev/null 2>&1
row "checkpoint dir in use, no --resume" "resumes $d/ck" -- "$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/ck"
row "resume without a checkpoint (mpirun -np 2)" - -- "${mpi[@]}" 2 "$u" "${small[@]}" --checkpoint-dir "$d/none" --resume
cp -r "$d/ck" "$d/ck_uly"
row "resume with another strategy (ulysses)" "resumes $d/ck" -- "$u" "${small[@]}" --ranks 2 --strategy ulysses --checkpoint-dir "$d/ck_uly" --resume
cp -r "$d/ck" "$d/ck_bad"
printf 'x' | dd of="$d/ck_bad/step_00000002/rank_00001.bin" bs=1 seek=200 conv=notrunc 2>/dev/null
row "a damaged checkpoint file (one byte)" "cmp -s $d/ck_bad/latest $d/ck/latest" -- "$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/ck_bad" --resume
row "metrics file not writable" - -- "$u" "${small[@]}" --metrics /nonexistent/dir/m.jsonl
row "Hugging Face dir missing" - -- "$u" train --hf-model /nonexistent/model --steps 1 --no-progress
cp -r $fix/hf_llama_tiny "$d/trunc" && truncate -s -8 "$d/trunc/model-00003-of-00005.safetensors"
row "truncated safetensors shard (mpirun -np 2)" - -- "${mpi[@]}" 2 "$u" train --hf-model "$d/trunc" --kv-keys 4 --kv-values 4 --seq 48 --steps 1 --no-progress
cp -r $fix/hf_qwen3_tiny "$d/arch" && sed -i 's/Qwen3ForCausalLM/GemmaForCausalLM/' "$d/arch/config.json"
row "unknown architecture" - -- "$u" eval --hf-model "$d/arch" --data-path x
cp -r $fix/hf_llama_tiny "$d/layers" && sed -i 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$d/layers/config.json"
row "missing tensor (config asks for a third layer)" - -- "$u" train --hf-model "$d/layers" --kv-keys 4 --kv-values 4 --seq 48 --steps 1 --no-progress
cp -r $fix/hf_qwen3_tiny "$d/lie"
python3 - "$d/lie/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); k = "model.norm.weight"; h[k]["data_offsets"][1] += 4096
s = json.dumps(h, separators=(",", ":")).encode(); s += b" " * (n - len(s)); open(p, "wb").write(b[:8] + s[:n] + b[8 + n:])
PY
row "safetensors header lies about offsets" - -- "$u" train --hf-model "$d/lie" --kv-keys 4 --kv-values 4 --seq 60 --steps 1 --no-progress
cp -r $fix/hf_qwen3_tiny "$d/dtype"
python3 - "$d/dtype/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h["model.norm.weight"]["dtype"] = "F8_E4M3"
s = json.dumps(h, separators=(",", ":")).encode(); s += b" " * (n - len(s)); open(p, "wb").write(b[:8] + s[:n] + b[8 + n:])
PY
row "safetensors tensor of a wrong dtype" - -- "$u" train --hf-model "$d/dtype" --kv-keys 4 --kv-values 4 --seq 60 --steps 1 --no-progress
echo '{not json' > "$d/tokenizer.json"
row "tokenizer.json not JSON" - -- "$u" prepare --tokenizer "$d/tokenizer.json" --output "$d/x.tok" $fix/tokenizers/llama3_style/sample.txt
printf '{"text": "fine"}\n{"text": 3}\n' > "$d/bad.jsonl"
row "JSONL line without a text string" - -- "$u" prepare --tokenizer $fix/tokenizers/llama3_style --output "$d/x.tok" --no-progress "$d/bad.jsonl"
row "eval data vocabulary larger than the model's (mpirun -np 2)" - -- "${mpi[@]}" 2 "$u" eval --hf-model $fix/hf_qwen3_tiny --data text --data-path README.md --seq 60
row "export of a directory that is not a checkpoint" - -- "$u" export --checkpoint-dir "$d" --out "$d/hf"
cp -r $fix/hf_qwen3_tiny "$d/over"
row "--save-hf over an existing model" "test -s $d/over/model.safetensors" -- "$u" train --hf-model "$d/over" --kv-keys 4 --kv-values 4 --seq 60 --steps 1 --no-progress --save-hf "$d/over"
"$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/nan" --stop-after 2 > /dev/null 2>&1
row "NaN gradient on rank 1 at step 3 (mpirun -np 2)" "test \$(cat $d/nan/latest) = step_00000002 && resumes $d/nan" -- env UNTIED_FAULT=nan-grad:step=3:rank=1:param=3 "${mpi[@]}" 2 "$u" "${small[@]}" --checkpoint-dir "$d/nan" --resume
row "NaN loss at step 2 with --skip-nonfinite 1 (trains on)" - -- env UNTIED_FAULT=nan-loss:step=2 "$u" "${small[@]}" --skip-nonfinite 1
row "rank 1 stalls at step 3 (mpirun -np 4, --collective-timeout 10)" - -- env UNTIED_FAULT=stall:step=3:rank=1 "${mpi[@]}" 4 "$u" "${small[@]}" --collective-timeout 10
row "rank 1 stalls at step 3 (in process, --collective-timeout 10)" - -- env UNTIED_FAULT=stall:step=3:rank=1 "$u" "${small[@]}" --ranks 2 --collective-timeout 10
row "rank 1 exits at step 3 (mpirun -np 4)" - -- env UNTIED_FAULT=exit:step=3:rank=1 "${mpi[@]}" 4 "$u" "${small[@]}"
row "rank 1 calls another collective (mpirun -np 4, --verify-schedule)" - -- env UNTIED_FAULT=barrier:step=3:rank=1 "${mpi[@]}" 4 "$u" "${small[@]}" --verify-schedule
# On GPUs (NCCL), run on emulated GPUs here when the CUDA build's untied_emu exists.
emu=build/emu/untied_emu
if [ -x "$emu" ]; then
  emu=$(realpath "$emu")
  row "rank 1 stalls before step 3's forward, NCCL (emulated GPUs, mpirun -np 2, --collective-timeout 10)" - -- env UNTIED_EMU_GPUS=2 UNTIED_FAULT=stall:step=3:rank=1:at=forward "${mpi[@]}" 2 "$emu" "${small[@]}" --device cuda --collective-timeout 10
  row "rank 1 calls another NCCL collective (emulated GPUs, mpirun -np 2, --verify-schedule)" - -- env UNTIED_EMU_GPUS=2 UNTIED_FAULT=barrier:step=3:rank=1:at=forward "${mpi[@]}" 2 "$emu" "${small[@]}" --device cuda --verify-schedule
fi
# Long jobs on shared clusters: signals, resuming elsewhere, one job per directory, what is never
# saved, inputs that are not files, sizes that cannot lie, outputs that fail.
# sig SIGNAL once|twice CHECKPOINT-DIR COMMAND...: starts a long run, signals it after 5 steps.
cat > "$d/sig" <<'SIG'
#!/usr/bin/env bash
signal=$1 who=$2 ck=$3 m=$(dirname "$0")/sig.jsonl
shift 3
rm -rf "$m" ${ck:+"$ck"}
"$@" --steps 100000 --batch 1 --seq 64 --kv-keys 8 --no-progress --metrics "$m" ${ck:+--checkpoint-dir "$ck"} &
pid=$!
for _ in $(seq 1 600); do [ "$(cat "$m" 2>/dev/null | wc -l)" -ge 5 ] && break; sleep 0.05; done
kill -"$signal" $pid
[ "$who" = twice ] && sleep 0.05 && kill -"$signal" $pid
wait $pid
SIG
chmod +x "$d/sig"
sig() { "$d/sig" "$@"; }
resumes_long() {  # a copy of the checkpoint in $1 resumes for one more step
  rm -rf "$d/copy" && cp -r "$1" "$d/copy" &&
    "$u" train --steps 100000 --batch 1 --seq 64 --kv-keys 8 --no-progress --ranks 2 --checkpoint-dir "$d/copy" \
      --resume --stop-after $(( $(sed 's/step_0*//' "$1/latest") + 1 )) > /dev/null 2>&1
}
row "SIGUSR1 to mpirun mid-run (mpirun -np 4)" "resumes_long $d/sigck" -- "$d/sig" USR1 once "$d/sigck" "${mpi[@]}" 4 "$u" train
row "SIGTERM mid-run (in process, 2 ranks)" "resumes_long $d/sigck" -- "$d/sig" TERM once "$d/sigck" "$u" train --ranks 2
row "SIGTERM mid-run without --checkpoint-dir" - -- "$d/sig" TERM once "" "$u" train --ranks 2
row "SIGINT twice mid-run (in process, seq 8192: a long step)" - -- "$d/sig" INT twice "$d/sigck2" "$u" train --ranks 2 --seq 8192
cp -r "$d/ck" "$d/ck4"
row "resume on another rank count (4, resharded)" "resumes $d/ck" -- "$u" "${small[@]}" --ranks 4 --checkpoint-dir "$d/ck4" --resume
"$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/fb" --save-every 1 --stop-after 3 > /dev/null 2>&1
printf 'x' | dd of="$d/fb/step_00000003/rank_00000.bin" bs=1 seek=200 conv=notrunc 2>/dev/null
row "newest step damaged, an older one intact" - -- "$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/fb" --resume
echo "../../etc" > "$d/fb/latest"
row "latest naming a path outside the directory" - -- "$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/fb" --resume
row "a second job on a checkpoint directory in use" - -- bash -c "( $u train --steps 100000 --batch 1 --seq 64 --no-progress --ranks 2 --checkpoint-dir $d/lock > /dev/null 2>&1 & ); sleep 2; $u ${small[*]} --ranks 2 --checkpoint-dir $d/lock; r=\$?; pkill -9 -f '^$u train .*checkpoint-dir $d/lock'; exit \$r"
row "NaN in a weight the data never reaches (saves refused)" "test \$(cat $d/nw/latest) = step_00000002" -- env UNTIED_FAULT=nan-weight:step=3:rank=3:param=0 "$u" train --steps 6 --batch 1 --seq 64 --kv-keys 8 --no-progress --ranks 4 --vocab 256 --checkpoint-dir "$d/nw" --save-every 2
cp -r $fix/hf_qwen3_tiny "$d/nanm"
python3 - "$d/nanm/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); t = h["model.norm.weight"]; at = 8 + n + t["data_offsets"][0]
b[at:at + 2] = b"\xc0\x7f"  # a bf16 NaN
open(p, "wb").write(b)
PY
row "a model holding a NaN weight (train --hf-model)" - -- "$u" train --hf-model "$d/nanm" --kv-keys 4 --kv-values 4 --seq 60 --steps 1 --no-progress
mkfifo "$d/fifo"
row "--config /dev/zero" - -- "$u" train --config /dev/zero
ln -s /dev/zero "$d/zero.json"
row "a config.json linked to /dev/zero" - -- "$u" train --config "$d/zero.json"
row "--data text --data-path /dev/zero" - -- "$u" train --data text --data-path /dev/zero
row "a FIFO as --config" - -- "$u" train --config "$d/fifo"
row "a FIFO as the token file" - -- "$u" train --data tokens --data-path "$d/fifo"
mkdir -p "$d/fifo_model" && ln -s "$d/fifo" "$d/fifo_model/config.json"
row "a FIFO as the model's config.json" - -- "$u" train --hf-model "$d/fifo_model"
row "a FIFO as the tokenizer and the input of prepare" - -- "$u" prepare --tokenizer "$d/fifo" --output "$d/x.tok" "$d/fifo"
row "--ranks 4294967297" - -- "$u" train --ranks 4294967297
row "--threads 4294967297" - -- "$u" train --threads 4294967297
printf 'ranks = 4294967297\n' > "$d/r.cfg"
row "--ranks 4294967297 in --config" - -- "$u" train --config "$d/r.cfg"
row "attn --seq 2^56" - -- "$u" attn --seq 72057594037927936 --rehearsal
row "plan --seq 2^48" - -- "$u" plan --seq 281474976710656
row "train --seq 2^62 --mem-budget 1G" - -- "$u" train --seq 4611686018427387904 --mem-budget 1G
row "metrics on a full disk (/dev/full)" "test -f $d/mf/latest" -- "$u" "${small[@]}" --ranks 2 --metrics /dev/full --checkpoint-dir "$d/mf"
row "--save-hf's final write fails (ulimit -f 450)" "test -f $d/sh/latest" -- bash -c "ulimit -f 450; exec $u ${small[*]} --ranks 4 --save-hf $d/sh_out --checkpoint-dir $d/sh"
# Started as srun starts tasks without MPI: N processes with Slurm's variables, the last exit status.
srun_like() {  # N NTASKS COMMAND...: ranks 0..N-1 of NTASKS
  local n=$1 ntasks=$2
  shift 2
  echo "pids=(); for r in \$(seq 0 $((n - 1))); do env UNTIED_RENDEZVOUS_DIR=$d/rdv UNTIED_RENDEZVOUS_TIMEOUT=5 SLURM_JOB_ID=\$\$ SLURM_STEP_ID=$RANDOM SLURM_PROCID=\$r SLURM_NTASKS=$ntasks SLURM_LOCALID=\$r SLURM_NNODES=1 $* & pids+=(\$!); done; rc=0; for p in \${pids[@]}; do wait \$p || rc=\$?; done; exit \$rc"
}
row "srun without MPI: rank 3 of 4 never starts" - -- bash -c "$(srun_like 3 4 "$u" ranks)"
row "srun without MPI: --device cpu (2 ranks)" - -- bash -c "$(srun_like 2 2 "$u" train --steps 2 --batch 1 --seq 64 --no-progress)"
row "torchrun variables: rank 1 given twice, rank 2 never" - -- bash -c "pids=(); for r in 0 1 1; do env UNTIED_RENDEZVOUS_DIR=$d/rdv UNTIED_RENDEZVOUS_TIMEOUT=5 RANK=\$r WORLD_SIZE=3 LOCAL_RANK=\$r LOCAL_WORLD_SIZE=3 $u ranks & pids+=(\$!); sleep 0.3; done; rc=0; for p in \${pids[@]}; do wait \$p || rc=\$?; done; exit \$rc"
row "RANK=abc from a launcher" - -- env RANK=abc WORLD_SIZE=2 "$u" ranks
for point in save-begin save-rank-file save-before-latest save-latest-tmp; do
  rm -rf "$d/k"
  row "kill -9 during a save ($point)" "test \$(cat $d/k/latest) = step_00000002 && resumes $d/k" -- env UNTIED_FAULT=kill:at=$point:step=4 "$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/k" --save-every 2
done
"$u" "${small[@]}" --ranks 2 --checkpoint-dir "$d/full" --stop-after 2 > /dev/null 2>&1
row "disk full during a save (ulimit -f 200)" "test \$(cat $d/full/latest) = step_00000002 && resumes $d/full" -- bash -c "ulimit -f 200; exec $u ${small[*]} --ranks 2 --checkpoint-dir $d/full --resume"
rm -rf "$d/mk"
resumes4() {  # a copy of $d/mk resumes on its 4 ranks for two more steps
  local step
  step=$(sed 's/step_0*//' "$d/mk/latest") || return 1
  rm -rf "$d/copy" && cp -r "$d/mk" "$d/copy" &&
    "${mpi[@]}" 4 "$u" train --steps 4000 --batch 1 --seq 64 --kv-keys 8 --no-progress --checkpoint-dir "$d/copy" \
      --save-every 20 --resume --stop-after $((step + 2)) > /dev/null 2>&1
}
row "kill -9 of one rank mid-run (mpirun -np 4)" "resumes4" -- bash -c "( for i in \$(seq 600); do [ -f $d/mk/latest ] && break; sleep 0.1; done; sleep 1; pkill -9 -n -f '^$u train --steps 4000' ) & ${mpi[*]} 4 $u train --steps 4000 --batch 1 --seq 64 --kv-keys 8 --no-progress --checkpoint-dir $d/mk --save-every 20"
