#!/usr/bin/env bash
# The test command (what CI runs): installs dependencies (with chromium,
# for the two HTML page tests), builds the release and the ASan+UBSan
# trees, runs every CTest test in both, then the code checks
# (scripts/check-code.sh: layering, function size, links) and a short
# fuzzing smoke run of every decoder (scripts/fuzz.sh), and last the Python
# package tests (python/run-tests.sh). Extra arguments go
# to both ctest runs (e.g. -R store).
set -euo pipefail
cd "$(dirname "$0")/.."

# 1: a failing code check fails the test command; 0: its result is printed
CHECK_CODE_FATAL=0

./scripts/setup.sh --asan --with-browser
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== release build tests"
ctest --test-dir build --output-on-failure --timeout 300 "$@"
echo "== ASan+UBSan build tests"
ctest --test-dir build-asan --output-on-failure --timeout 600 "$@"

echo "== code checks"
if ./scripts/check-code.sh; then
  echo "code checks: passed"
elif [ "$CHECK_CODE_FATAL" -eq 1 ]; then
  echo "code checks: FAILED" >&2
  exit 1
else
  echo "code checks: failed (not yet fatal: CHECK_CODE_FATAL=0 in scripts/test.sh)"
fi

if [ -x scripts/fuzz.sh ]; then
  echo "== fuzzing smoke run"
  ./scripts/fuzz.sh --smoke 20
fi

# last, so the output ends with pytest's summary line
echo "== Python package tests"
./python/run-tests.sh
