#!/usr/bin/env bash
# `untied attn --dump` against the independent NumPy implementation in reference/.
# Usage: dump_check.sh UNTIED REFERENCE_SCRIPT RTOL untied-attn-args...
set -euo pipefail
untied="$1" script="$2" rtol="$3"
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$untied" attn "$@" --dump "$dir" > /dev/null
python3 "$script" "$dir" --rtol "$rtol"
