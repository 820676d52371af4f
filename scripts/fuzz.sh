#!/usr/bin/env bash
# Fuzzing of the wire decoders: builds the libFuzzer targets of
# tests/fuzz (clang-14, ASan + UBSan, build dir build-fuzz) and runs each
# on its seed corpus (tests/fuzz/corpus/<target>/, left as it is: new
# inputs go to the build dir).
#
#   scripts/fuzz.sh --smoke [SECONDS]  each target SECONDS (default 20);
#                                      fails on any crash
#   scripts/fuzz.sh --runs N           each target N executions; prints
#                                      executions, time, exec/s, crashes
#   scripts/fuzz.sh --seeds            rewrites the seed corpus from the
#                                      codecs (tests/fuzz/gen_corpus.c)
# Options: --only TARGET (repeatable), --jobs N (targets run at once,
# default 1), --procs P (each target as P processes with their own seeds,
# the executions split between them and summed; for many-core hosts),
# --build-dir DIR, --no-build. CC overrides clang-14.
# Crash inputs are kept in <build dir>/fuzz-crashes/<target>/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=smoke secs=20 runs=0 build=1 jobs=1 procs=1
bdir=$root/build-fuzz
only=()

while [ $# -gt 0 ]; do
    case "$1" in
    --smoke)
        mode=smoke
        if [ $# -gt 1 ] && [[ $2 =~ ^[0-9]+$ ]]; then secs=$2; shift; fi ;;
    --runs) mode=runs runs=$2; shift ;;
    --seeds) mode=seeds ;;
    --only) only+=("$2"); shift ;;
    --jobs) jobs=$2; shift ;;
    --procs) procs=$2; shift ;;
    --build-dir) bdir=$2; shift ;;
    --no-build) build=0 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

if [ $build = 1 ]; then
    cmake -S "$root" -B "$bdir" -G Ninja -DCMAKE_C_COMPILER="${CC:-clang-14}" \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVF_FUZZ=ON -DKVF_CUDA=OFF \
        >/dev/null
    ninja -C "$bdir" -j"${NINJA_JOBS:-2}" fuzz
fi

if [ $mode = seeds ]; then
    mkdir -p "$root/tests/fuzz/corpus"
    "$bdir/tests/fuzz/kvf_fuzz_seeds" "$root/tests/fuzz/corpus"
    exit 0
fi

targets=()
for src in "$root"/tests/fuzz/fuzz_*.c; do
    t=$(basename "$src" .c)
    if [ ${#only[@]} -eq 0 ] || [[ " ${only[*]} " == *" $t "* ]]; then
        targets+=("$t")
    fi
done

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# run_one TARGET: runs it, then writes "execs seconds exec/s crashes"
# (exec/s over the wall time, start-up included) to
# <build dir>/fuzz-logs/TARGET.res
run_one() {
    local t=$1 bin=$bdir/tests/fuzz/$1 seeds=$root/tests/fuzz/corpus/$1
    local work=$bdir/fuzz-work/$t art=$bdir/fuzz-crashes/$t
    local log=$bdir/fuzz-logs/$t.log limit rc=0 t0 t1 execs eps crashes
    local secs_used
    rm -rf "$art"
    mkdir -p "$work" "$art" "$bdir/fuzz-logs"
    if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
        echo "$t: no binary ($bin) or no seeds ($seeds)" >&2
        echo "0 0 0 1" >"$bdir/fuzz-logs/$t.res"
        return
    fi
    if [ $mode = smoke ]; then
        limit=-max_total_time=$secs
    else
        limit=-runs=$(((runs + procs - 1) / procs))
    fi
    t0=$(date +%s.%N)
    local p pids=()
    for ((p = 1; p <= procs; p++)); do
        "$bin" "$limit" -seed="$p" -max_len=8192 -timeout=10 \
            -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art/" \
            "$work" "$seeds" >"$log.$p" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    cat "$log".* >"$log"
    rm -f "$log".*
    t1=$(date +%s.%N)
    execs=$(awk '/stat::number_of_executed_units/ {n += $2} END {print n + 0}' \
        "$log")
    secs_used=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
    eps=$(awk -v n="${execs:-0}" -v s="$secs_used" \
        'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
    crashes=$(find "$art" -type f | wc -l)
    if [ $rc -ne 0 ] && [ "$crashes" -eq 0 ]; then
        crashes=1 # died without leaving an input (e.g. out of memory)
    fi
    echo "${execs:-0} $secs_used $eps $crashes" >"$bdir/fuzz-logs/$t.res"
}

running=0
for t in "${targets[@]}"; do
    rm -f "$bdir/fuzz-logs/$t.res"
    run_one "$t" &
    running=$((running + 1))
    if [ $running -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait

fail=0
printf '| %-16s | %12s | %9s | %9s | %7s |\n' target executions 'time (s)' \
    exec/s crashes
printf '|%s|%s|%s|%s|%s|\n' ------------------ -------------: ----------: \
    ----------: --------:
for t in "${targets[@]}"; do
    read -r execs secs_used eps crashes <"$bdir/fuzz-logs/$t.res"
    printf '| %-16s | %12s | %9.1f | %9s | %7s |\n' "$t" "$execs" \
        "$secs_used" "$eps" "$crashes"
    if [ "$crashes" != 0 ]; then
        echo "$t: crash, see $bdir/fuzz-logs/$t.log and $bdir/fuzz-crashes/$t/" >&2
        fail=1
    fi
done
exit $fail
