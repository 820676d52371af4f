#!/usr/bin/env bash
# The test command.
#
#   scripts/test.sh [--full] [--asan-drills] [--jobs N] [CTEST ARGS...]
#
# Default (about 5 minutes on a 2-core machine after set-up): set-up
# (the release build, with chromium for the two HTML page tests), the
# release build's CTest tests run in parallel (all but the fault drills,
# label drill), the code checks (scripts/check-code.sh: layering,
# function size, links, docs/config.md against `kvferry config
# --markdown`), and the Python package's tests against that build.
#
# --full (what CI runs, .ci/run) adds: the fault drills (`drill all`, the
# soak) on the release build, one at a time; the ASan+UBSan build and its
# CTest tests in parallel (the drills there only with --asan-drills:
# they check time bounds that a sanitizer build's slowness distorts); a
# short fuzzing run of every decoder (scripts/fuzz.sh); the portable
# wheel (python/build-wheel.sh), checked in a fresh virtual environment
# (python/check-wheel.sh: its tag, what it links, an engine and a store
# operation), and the Python tests against that wheel.
#
# --jobs N: CTest tests at once (default twice the cores, 4 to 16; the
# tests pick free ports and their own files). Other arguments go to
# every ctest run (e.g. -R store). Ends with one line counting what
# passed, failed and was skipped, and how long each part took.
set -euo pipefail
cd "$(dirname "$0")/.."

full=0 asan_drills=0 jobs=0
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --full) full=1 ;;
    --asan-drills) asan_drills=1 ;;
    --jobs) jobs=$2; shift ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ctest_args+=("$1") ;;
  esac
  shift
done
if [ "$jobs" -le 0 ]; then
  jobs=$(( $(nproc) * 2 ))
  [ "$jobs" -lt 4 ] && jobs=4
  [ "$jobs" -gt 16 ] && jobs=16
fi

t_start=$SECONDS
if [ "$full" -eq 1 ]; then
  ./scripts/setup.sh --asan --with-browser
else
  ./scripts/setup.sh --with-browser
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

passed=0
skipped=0
times=()
# stage NAME T0: records how long a part took
stage() { times+=("$1 $((SECONDS - $2)) s"); }

# ctest_run NAME DIR TIMEOUT ARGS...: one CTest run, counted
ctest_run() {
  local name=$1 dir=$2 timeout=$3 n s t0=$SECONDS
  shift 3
  echo "== $name tests"
  ctest --test-dir "$dir" --output-on-failure --timeout "$timeout" "$@" \
    ${ctest_args[@]+"${ctest_args[@]}"} | tee "$logs/$name.log"
  n=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* (Passed|\*\*\*Skipped)' \
    "$logs/$name.log" || true)
  s=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .*\*\*\*Skipped' \
    "$logs/$name.log" || true)
  passed=$((passed + n - s))
  skipped=$((skipped + s))
  stage "$name" "$t0"
}

# python_run NAME ARGS...: python/run-tests.sh, counted from pytest's line
python_run() {
  local name=$1 n s t0=$SECONDS
  shift
  echo "== $name"
  python/run-tests.sh "$@" | tee "$logs/python.log"
  n=$(tail -n 1 "$logs/python.log" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
  s=$(tail -n 1 "$logs/python.log" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
  passed=$((passed + n))
  skipped=$((skipped + s))
  stage "$name" "$t0"
}

ctest_run release build 300 -j "$jobs" -LE drill
if [ "$full" -eq 1 ]; then
  ctest_run drills build 900 -L drill
fi

echo "== code checks"
t0=$SECONDS
./scripts/check-code.sh
passed=$((passed + 1))
stage "code checks" "$t0"

if [ "$full" -eq 1 ]; then
  if [ "$asan_drills" -eq 1 ]; then
    ctest_run asan build-asan 600 -j "$jobs"
  else
    ctest_run asan build-asan 600 -j "$jobs" -LE drill
  fi

  echo "== fuzzing smoke run"
  t0=$SECONDS
  ./scripts/fuzz.sh --smoke 20
  passed=$((passed + 1))
  stage fuzz "$t0"

  echo "== the portable wheel"
  t0=$SECONDS
  python/build-wheel.sh build-py/dist
  python/check-wheel.sh build-py/dist/kvferry-*manylinux*.whl
  passed=$((passed + 1))
  stage wheel "$t0"
  python_run "Python package tests (the wheel)" \
    --wheel "$(ls build-py/dist/kvferry-*manylinux*.whl | head -1)"
else
  python_run "Python package tests (the release build)" --from-build build
fi

echo "== time: ${times[*]/%/,} total $((SECONDS - t_start)) s with set-up"
echo "tests: $passed passed, 0 failed, $skipped skipped"
