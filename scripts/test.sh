#!/usr/bin/env bash
# The test command (what CI runs): installs dependencies (with chromium,
# for the two HTML page tests), builds the release and the ASan+UBSan
# trees, runs every CTest test in both, then the code checks
# (scripts/check-code.sh: layering, function size, links) and a short
# fuzzing run of every decoder (scripts/fuzz.sh), then the Python
# package's tests (python/run-tests.sh), and ends with one line counting
# what passed, failed and was skipped. Extra arguments go to both ctest
# runs (e.g. -R store).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh --asan --with-browser
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

passed=0
skipped=0
# ctest_run NAME DIR TIMEOUT ARGS...: one CTest run, counted
ctest_run() {
  local name=$1 dir=$2 timeout=$3 n s
  shift 3
  echo "== $name tests"
  ctest --test-dir "$dir" --output-on-failure --timeout "$timeout" "$@" |
    tee "$logs/$name.log"
  n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* (Passed|\*\*\*Skipped)' \
    "$logs/$name.log" || true)
  s=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped' \
    "$logs/$name.log" || true)
  passed=$((passed + n - s))
  skipped=$((skipped + s))
}

ctest_run release build 300 "$@"
ctest_run asan build-asan 600 "$@"

echo "== code checks"
./scripts/check-code.sh
passed=$((passed + 1))

echo "== fuzzing smoke run"
./scripts/fuzz.sh --smoke 20
passed=$((passed + 1))

echo "== Python package tests"
python/run-tests.sh | tee "$logs/python.log"
n=$(tail -n 1 "$logs/python.log" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
s=$(tail -n 1 "$logs/python.log" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
passed=$((passed + n))
skipped=$((skipped + s))

echo "tests: $passed passed, 0 failed, $skipped skipped"
