#!/usr/bin/env bash
# `untied attn --dump` against the independent NumPy implementation in reference/.
# Usage: dump_check.sh UNTIED REFERENCE_SCRIPT RTOL untied-attn-args...
# UNTIED_LAUNCH, when set, is put before the command (e.g. "mpirun -np 3").
set -euo pipefail
untied="$1" script="$2" rtol="$3"
shift 3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# shellcheck disable=SC2086  # UNTIED_LAUNCH is a command and its arguments
${UNTIED_LAUNCH:-} "$untied" attn "$@" --dump "$dir" > /dev/null
python3 "$script" "$dir" --rtol "$rtol"
