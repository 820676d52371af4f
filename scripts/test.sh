#!/usr/bin/env bash
# The test command: installs dependencies, builds the release and the
# ASan+UBSan trees, and runs every CTest test in both.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
echo "== release build tests"
ctest --test-dir build --output-on-failure --timeout 300 "$@"
echo "== ASan+UBSan build tests"
ctest --test-dir build-asan --output-on-failure --timeout 600 "$@"
