#!/usr/bin/env bash
# Runs a command only where no NVIDIA GPU is visible; where one is, exits 77, which ctest
# reports as skipped (the test's SKIP_RETURN_CODE). For tests of what untied says when it has no
# GPU: on a GPU machine the same command would run for real.
# Visible: nvidia-smi lists a GPU and CUDA_VISIBLE_DEVICES does not hide them all.
# Usage: skip_if_gpu.sh command args...
set -u
case "${CUDA_VISIBLE_DEVICES-unset}" in
  "" | "-1") exec "$@" ;;  # every GPU hidden from CUDA
esac
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2> /dev/null | grep -q '^GPU '; then
  echo "skip_if_gpu: skipped, a GPU is visible: $(nvidia-smi -L 2> /dev/null | head -n 1)"
  exit 77
fi
exec "$@"
