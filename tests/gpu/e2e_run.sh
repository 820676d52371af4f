#!/usr/bin/env bash
# The end-to-end comparison (kvferry bench e2e) on the GPU machine, in
# at most 10 minutes (timeouts 90 + 250 + 95 + 90 + 70 s, each killed 5 s
# after; staged32, 90 s, and groups32, 150 s, only when named): an 8B-shaped Llama with random weights (bf16, sdpa).
#   test:   python/tests/test_e2e_gpu.py as a script (no pytest needed): the
#           GPU tiers' load, layer-wise load, verification and a corrupted
#           chunk on a tiny model, so a broken GPU path shows in a minute;
#   main32: the 32K shared prefix first (so the budget never cuts it): no
#           cache, local (LocalKVCache: pinned pool, verifying scatter
#           kernel), remote over shm (ChunkStore: the node's pool read in
#           place through store views, layer group by layer group), the
#           GPU-resident bound, and remote-shm-piped (the remote
#           load as one pipeline of posted DMAs, as the vLLM connector
#           loads) overlapped; local and remote-shm overlapped and
#           sequential; each with the fused and the copy-engine checksum
#           modes;
#   staged32: (only when named) remote-shm through the pinned stage
#           (KVF_KV_VIEWS=0), for comparison with the views;
#   groups32: (only when named) remote-shm and remote-shm-piped with 8,
#           16 and 32 layer groups;
#   main:   2K and 8K prefixes at 90 % and 0 % sharing, remote tcp too;
#   check:  the correctness check in deterministic mode;
#   slow:   remote tcp slowed to about 1 GB/s with the policies always /
#           never / calc.
# Each step has its own timeout and writes its records as it goes
# (records packed into $OUT/records.tgz after each step), so a run cut
# short still returns what it measured. A budget counts from after the
# model is built, so each timeout leaves it about 20 s; pools are sized
# to each stage's prefixes (pinned and shm pools cost time to allocate).
# Each bench stage also leaves $OUT/<stage>.json (summaries) and
# $OUT/<stage>.md (the closing table).
#
# Needs python3 with torch and transformers (the GPU host has them);
# kvferry's library and command come from $KVF_GPU_BIN (default .dev/gpu:
# libkvferry.so and kvferry), else build/.
#
#   OUT=/tmp/out tests/gpu/e2e_run.sh [test|main32|main|check|slow ...]   (default: all)
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
  timeout -k 5 "$t" python3 -m kvferry bench e2e --record "$R" \
    --json "$OUT/$n.json" "$@" 2>&1 | tee "$OUT/$n.log"
  echo "=== $n rc=${PIPESTATUS[0]} ($(( $(date +%s) - s )) s)"
  pack
}
COMMON=(--model 8b --prefix-lens 2K,8K,32K --pool-lens 2K,8K,32K --pool-size 3
  --host-pool 8G --node-pool 16G --slo 0.5)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(test main32 main check slow)
for st in "${stages[@]}"; do
  case "$st" in
  test)
    echo "=== test: python/tests/test_e2e_gpu.py"
    s=$(date +%s)
    timeout -k 5 90 python3 python/tests/test_e2e_gpu.py 2>&1 | tee "$OUT/test.log"
    echo "=== test rc=${PIPESTATUS[0]} ($(( $(date +%s) - s )) s)"
    ;;
  main32)
    # every request after the first reuses the one 32K prefix
    # each caching configuration with the kernel's fused checksums and
    # with the copy engines (then a checksum pass over GPU memory)
    step 250 main32 "${COMMON[@]}" --caches none,local,remote-shm,remote-shm-piped,gpu \
      --sequential local,remote-shm --prefix-lens 32K --pool-lens 32K \
      --pool-size 1 --sharing 1 --requests 4 --rate 0 --check 0 --budget 200 \
      --host-pool 5G --node-pool 6G --gpu-sum fused,engines
    ;;
  staged32)
    # remote-shm through the pinned stage instead of store views
    KVF_KV_VIEWS=0 step 90 staged32 "${COMMON[@]}" --caches none,remote-shm \
      --sequential remote-shm --prefix-lens 32K --pool-lens 32K \
      --pool-size 1 --sharing 1 --requests 4 --rate 0 --check 0 --budget 60 \
      --host-pool 1G --node-pool 6G
    ;;
  groups32)
    # (only when named) remote-shm's 32K hit with 8, 16 and 32 layer
    # groups (the model's layer l waits for its own group, so the last
    # group's layers compute after the load's end), each also as one
    # pipeline of posted DMAs through a GPU stage (remote-shm-piped)
    step 150 groups32 "${COMMON[@]}" --caches none,remote-shm,remote-shm-piped,gpu \
      --prefix-lens 32K --pool-lens 32K --pool-size 1 --sharing 1 \
      --requests 4 --rate 0 --check 0 --budget 120 --host-pool 5G \
      --node-pool 6G --gpu-sum fused --layer-groups 8,16,32 --sequential ""
    ;;
  main)
    # the budget stops taking requests in time; records after each config
    step 95 main "${COMMON[@]}" --prefix-lens 2K,8K --pool-lens 2K,8K \
      --pool-size 2 --sharing 0.9,0 --requests 4 --rate 2 --check 0 --budget 65 \
      --host-pool 2G --node-pool 4G
    ;;
  check)
    step 90 check "${COMMON[@]}" --caches local,remote-shm,gpu,remote-tcp \
      --prefix-lens 2K,8K --pool-lens 2K,8K --pool-size 2 --check 2 \
      --check-only --budget 60 --host-pool 2G --node-pool 4G
    ;;
  slow)
    step 70 slow "${COMMON[@]}" --caches "" --sharing 1 --requests 3 \
      --rate 0 --prefix-lens 8K --pool-lens 8K --pool-size 1 \
      --throttle-gbs 1.0 --check 0 --budget 45 --node-pool 4G
    ;;
  *) echo "e2e_run.sh: unknown stage $st" >&2 ;;
  esac
done
ls -l "$R" | tail -n +2 | wc -l | xargs echo "records and files:"
