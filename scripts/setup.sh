#!/usr/bin/env bash
# Installs what untied needs to build and test on Debian 12 (or Ubuntu): compiler, CMake,
# OpenBLAS (OpenMP build), Open MPI, GoogleTest, nlohmann-json, CLI11 (flags), PCRE2 and utf8proc (Hugging Face
# tokenizers), zlib and zstd (compressed inputs of prepare). Installs only what is missing.
# Runs apt-get as root, or through sudo.
set -euo pipefail

packages=(g++ make cmake pkg-config libopenblas-openmp-dev libopenmpi-dev openmpi-bin libgtest-dev
          nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev zlib1g-dev libzstd-dev python3 python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Where a CUDA toolkit is installed: cuDNN's C++ graph frontend (header-only), for the CUDA
# backend's cuDNN attention; not fatal when it cannot be had (that path is then left out).
bash "$(dirname "$0")/fetch-cudnn-frontend.sh" || echo "setup: the cuDNN frontend could not be fetched: cuDNN attention is left out"
