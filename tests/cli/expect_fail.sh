#!/usr/bin/env bash
# Runs a command that must fail cleanly: a non-zero exit that is not a crash (no signal), and
# output matching a pattern. Usage: expect_fail.sh PATTERN -- command args...
set -u
pattern="$1"
shift 2
out=$("$@" 2>&1)
code=$?
echo "$out"
if [ "$code" -eq 0 ]; then
  echo "expect_fail: the command succeeded; it should have failed" >&2
  exit 1
fi
if [ "$code" -ge 128 ]; then
  echo "expect_fail: the command crashed (exit $code)" >&2
  exit 1
fi
if ! grep -qE -- "$pattern" <<<"$out"; then
  echo "expect_fail: output does not match /$pattern/" >&2
  exit 1
fi
echo "expect_fail: failed as expected (exit $code)"
