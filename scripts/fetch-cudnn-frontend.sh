#!/usr/bin/env bash
# Unpacks the headers of cuDNN's C++ graph frontend (the nvidia-cudnn-frontend wheel from PyPI,
# pinned below; the headers are its include/) into .deps/cudnn-frontend/include, where CMake finds
# them. Only where a CUDA toolkit (nvcc) is installed; does nothing when they are already there.
# scripts/gpu-pack's build uses them too (a GPU machine without a registry needs nothing more).
set -euo pipefail
cd "$(dirname "$0")/.."
version=1.32.0
dest=.deps/cudnn-frontend
[ -e "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ] && exit 0
command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=(python3 -m pip)
"${pip[@]}" --version > /dev/null 2>&1 || pip=(pip)
"${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
  "nvidia-cudnn-frontend==$version" -d "$tmp"
rm -rf "$dest"
mkdir -p "$dest"
python3 - "$tmp"/nvidia_cudnn_frontend-*.whl "$dest" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in z.namelist():
        if name.startswith("include/"):
            z.extract(name, sys.argv[2])
PY
echo "$version" > "$dest/VERSION"
echo "fetch-cudnn-frontend: cuDNN frontend $version headers in $dest/include"
