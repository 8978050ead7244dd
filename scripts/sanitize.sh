#!/usr/bin/env bash
# The test suite under sanitizers (g++'s): AddressSanitizer + UBSan over every CPU test
# (build-asan/; allocations too large to make return null, as the out-of-memory tests expect),
# and ThreadSanitizer over the tests of the in-process communicator and what runs
# on it (build-tsan/: threads as ranks). Open MPI's own allocations are not ours: leak detection
# is off; any other report fails the test that made it.
#   bash scripts/sanitize.sh [asan|tsan|all] [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
shift || true
bash scripts/setup.sh
source scripts/env.sh
jobs=$(nproc 2>/dev/null || echo 2)
if [ "$which" = asan ] || [ "$which" = all ]; then
  cmake -S . -B build-asan -DUNTIED_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" >/dev/null
  cmake --build build-asan -j "$jobs"
  (cd build-asan && ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
     ctest --output-on-failure --timeout 1200 -j "$jobs" "$@")
fi
if [ "$which" = tsan ] || [ "$which" = all ]; then
  cmake -S . -B build-tsan -DUNTIED_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" >/dev/null
  cmake --build build-tsan -j "$jobs" --target comm_inproc_test attention_test train_test
  # OpenMP's runtime (libgomp) is not instrumented: one thread per rank, as the ranks' threads are
  # what is under test here.
  (cd build-tsan && OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
     ctest --output-on-failure --timeout 1200 -R "^(comm_inproc_test|attention_test|train_test)$" "$@")
fi
