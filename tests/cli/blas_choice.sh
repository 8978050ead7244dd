#!/usr/bin/env bash
# untied chooses OpenBLAS's kernels again when OpenBLAS fell back to its generic ones.
# UNTIED_BLAS_PRETEND_CORE makes the startup check believe OpenBLAS picked Prescott; on a CPU
# with AVX or wider, untied must restart itself with OPENBLAS_CORETYPE set, say so in the
# banner, and compute the same losses. An explicit OPENBLAS_CORETYPE=Prescott is respected,
# with a warning.
# usage: blas_choice.sh UNTIED
set -euo pipefail
untied="$1"
# The cases below set OPENBLAS_CORETYPE themselves; one from the caller's environment would
# make every run "chosen by OPENBLAS_CORETYPE".
unset OPENBLAS_CORETYPE
run() { "$untied" train --steps 3 --no-progress 2>&1; }
banner() { "$untied" train --steps 1 2>&1 | grep '^kernels:\|^warning:' || true; }

plain="$(banner)"
echo "plain: $plain"
case "$plain" in
  *"kernels: OpenBLAS"*"attention tiles"*) ;;
  *) echo "FAIL: no kernels line in the train banner" >&2; exit 1 ;;
esac

isa="$(grep -o -m1 -w -E 'avx512f|avx2|avx' /proc/cpuinfo | sort -u | head -1 || true)"
pretend="$(UNTIED_BLAS_PRETEND_CORE=Prescott banner)"
echo "pretend Prescott: $pretend"
if [ -n "$isa" ]; then
  case "$pretend" in
    *"chosen by untied (OpenBLAS detected Prescott)"*) ;;
    *) echo "FAIL: no restart with better kernels on a CPU with $isa" >&2; exit 1 ;;
  esac
  case "$pretend" in
    *"Prescott kernels"*) echo "FAIL: still on Prescott kernels" >&2; exit 1 ;;
  esac
fi

forced="$(OPENBLAS_CORETYPE=Prescott banner)"
echo "OPENBLAS_CORETYPE=Prescott: $forced"
case "$forced" in
  *"Prescott kernels (OpenMP threads, chosen by OPENBLAS_CORETYPE)"*|*"Prescott kernels (pthreads, chosen by OPENBLAS_CORETYPE)"*) ;;
  *) echo "FAIL: OPENBLAS_CORETYPE not respected" >&2; exit 1 ;;
esac
if [ -n "$isa" ]; then
  case "$forced" in
    *"warning: OpenBLAS runs its generic Prescott kernels"*) ;;
    *) echo "FAIL: no warning for slow kernels" >&2; exit 1 ;;
  esac
fi

# Same losses whichever kernels run (to print precision; the GEMMs differ in rounding only).
a="$(run | grep -o 'loss [0-9.]* -> [0-9.]*')"
b="$(UNTIED_BLAS_PRETEND_CORE=Prescott run | grep -o 'loss [0-9.]* -> [0-9.]*')"
echo "losses: $a / $b"
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: losses differ" >&2; exit 1; }
echo "PASS"
