#!/usr/bin/env bash
# Fuzzes every parser of outside input with clang's libFuzzer under AddressSanitizer and UBSan:
# builds the fuzz targets (tests/fuzz, -DUNTIED_FUZZ=ON, no OpenMP needed by them) into
# build-fuzz/, then runs each for SECONDS (default 60) from its committed corpus, with new inputs
# kept in build-fuzz/corpus/NAME. Prints the executions of each target; a crash stops with the
# input that caused it (build-fuzz/crash-*), to be fixed and added to the corpus.
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]
# With FUZZ_RUNS=N in the environment each target runs N inputs from a fixed seed instead of for
# SECONDS: the same inputs on every machine (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
bash scripts/setup.sh
if ! command -v clang++ >/dev/null || ! dpkg-query -W -f='${Status}' libomp-dev 2>/dev/null | grep -q "ok installed"; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends clang libomp-dev >/dev/null
fi
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DUNTIED_CUDA=OFF -DUNTIED_BUILD_TESTS=OFF -DUNTIED_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" >/dev/null
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors token_file checkpoint hf_config config_file tokenizer_json encode flags sizes)
cmake --build build-fuzz -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  log=build-fuzz/fuzz_$t.log
  budget=(-max_total_time="$seconds")
  [ -n "${FUZZ_RUNS:-}" ] && budget=(-runs="$FUZZ_RUNS" -seed=1)
  (cd build-fuzz && "./tests/fuzz/fuzz_$t" "${budget[@]}" -rss_limit_mb=4096 -max_len=65536 \
     "corpus/$t" "../tests/fuzz/corpus/$t" > "fuzz_$t.log" 2>&1) || { tail -40 "$log"; echo "fuzz: $t crashed"; exit 1; }
  echo "fuzz_$t: $(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1), corpus $(ls "build-fuzz/corpus/$t" | wc -l) inputs (AddressSanitizer, UBSan)"
done
