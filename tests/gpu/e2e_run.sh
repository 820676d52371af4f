#!/usr/bin/env bash
# The end-to-end comparison (kvferry bench e2e) on the GPU machine, in
# at most 8 minutes (timeouts 240 + 120 + 100 s): an 8B-shaped Llama with random weights (bf16, sdpa)
# served with no cache, a local pinned-host cache, the remote store over
# shm and tcp, and the GPU-resident upper bound; prefixes of 2K, 8K and
# 32K tokens at 90 % and 0 % sharing; then the correctness check in
# deterministic mode; then the slow-link scenario (remote tcp slowed to
# about 1 GB/s) with the policies always / never / calc. Each step has
# its own timeout and writes its records as it goes (records packed into
# $OUT/records.tgz after each step), so a run cut short still returns
# what it measured. Each stage also leaves $OUT/<stage>.json (summaries)
# and $OUT/<stage>.md (the closing table).
#
# Needs python3 with torch and transformers (the GPU host has them);
# kvferry's library and command come from $KVF_GPU_BIN (default .dev/gpu:
# libkvferry.so and kvferry), else build/.
#
#   OUT=/tmp/out tests/gpu/e2e_run.sh [main|check|slow ...]   (default: all)
set -uo pipefail
cd "$(dirname "$0")/../.."
D="${KVF_GPU_BIN:-.dev/gpu}"
[ -e "$D/libkvferry.so" ] || D=build
OUT="${OUT:-/tmp/kvf-e2e-out}"
R="$OUT/rec"
mkdir -p "$R"
export KVFERRY_LIB="$PWD/$D/libkvferry.so" KVFERRY_BIN="$PWD/$D/kvferry"
export LD_LIBRARY_PATH="$PWD/$D:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8
pack() { tar czf "$OUT/records.tgz" -C "$OUT" rec 2>/dev/null; }
step() { # step SECONDS NAME ARGS... (of kvferry bench e2e)
  local t="$1" n="$2"; shift 2
  echo "=== $n: $*"
  local s=$(date +%s)
  timeout -k 10 "$t" python3 -m kvferry bench e2e --record "$R" \
    --json "$OUT/$n.json" "$@" 2>&1 | tee "$OUT/$n.log"
  echo "=== $n rc=${PIPESTATUS[0]} ($(( $(date +%s) - s )) s)"
  pack
}
COMMON=(--model 8b --prefix-lens 2K,8K,32K --pool-lens 2K,8K,32K --pool-size 3
  --host-pool 8G --node-pool 16G --slo 0.5)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(main check slow)
for st in "${stages[@]}"; do
  case "$st" in
  main)
    # the budget stops taking requests in time; records after each config
    step 240 main "${COMMON[@]}" --sharing 0.9,0 --requests 6 --rate 2 \
      --check 0 --budget 205
    ;;
  check)
    step 120 check "${COMMON[@]}" --caches local,remote-shm,gpu,remote-tcp \
      --check 2 --check-only --budget 90
    ;;
  slow)
    step 100 slow "${COMMON[@]}" --caches "" --sharing 0.9 --requests 4 \
      --rate 0 --prefix-lens 8K,32K --pool-lens 8K,32K --pool-size 2 \
      --throttle-gbs 1.0 --check 0 --budget 75
    ;;
  *) echo "e2e_run.sh: unknown stage $st" >&2 ;;
  esac
done
ls -l "$R" | tail -n +2 | wc -l | xargs echo "records and files:"
