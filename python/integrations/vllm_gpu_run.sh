#!/usr/bin/env bash
# On the GPU machine: puts together the parts made by vllm_gpu_pack.sh and
# runs python/integrations/serve_vllm.py with vLLM's CUDA build.
#
#   vllm_gpu_run.sh stash DIR        keep DIR/part-* for a later call (/tmp)
#   vllm_gpu_run.sh unpack [DIR]     the kept parts and DIR/part-*, unpacked
#   vllm_gpu_run.sh mooncake DIR     Mooncake's store from DIR/mooncake.tar.xz
#                                    (mooncake_gpu.sh pack; installed in /tmp,
#                                    checked with a GPU round trip) for the
#                                    mooncake configuration of tiers and load
#   vllm_gpu_run.sh serve VARIANT OUTDIR
#   vllm_gpu_run.sh tiers OUTDIR [bench_vllm.py options]
#   vllm_gpu_run.sh load OUTDIR [bench_vllm.py options]
#   vllm_gpu_run.sh pytest OUTDIR    the GPU tests of the connector's chunks
#
# VARIANT (a Llama of 8 layers, hidden 1024, 8 heads, 2 KV heads, random
# weights; 4 prompts of 2000 token ids, 24 greedy tokens, block size 16):
#   bf16       bfloat16, vLLM's defaults (FlashAttention 3, V2 model
#              runner, async scheduling)
#   fp32       float32 with the Triton attention backend (rounding small
#              enough that a run's tokens compare with the baseline's)
#   fp32-sync  fp32, async scheduling off
#   fp32-v1    fp32, vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)
#   fp32-v1-sync  fp32-v1 with async scheduling off; baseline, producer
#              and tampered runs only
#   8k         hidden 2048, 16 layers, 8 KV heads, 4 prompts of 8000 ids,
#              one new token: baseline, producer, consumer (time to the
#              first token with and without the store)
#   4p5b       the 4.5B shape (hidden 4096, 32 layers, 8 KV heads), bf16,
#              2 prompts of 32000 ids, one new token, block size 16:
#              baseline, producer, consumer, split, then consumers of the
#              same objects with the stage pipeline off, with 16 MiB and
#              128 MiB slices, and loading asynchronously (docs/integrations.md)
#   4p5b-b32   the same with block size 32
#   4p5b-kv2   the same with 2 KV heads
# tiers and load: python/integrations/bench_vllm.py with the 4.5B shape
# (the model kept in /tmp between calls of one lease).
# Binaries: KVFERRY_LIB / KVFERRY_BIN, default .dev/gpu (staged by
# tests/gpu/stage-binaries.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
parts=/tmp/kvferry-vllm-parts
site=/tmp/kvferry-vllm-site
mooncake=/tmp/kvferry-mooncake

# the binaries staged by tests/gpu/stage-binaries.sh, vLLM's tree, the package
setenv() {
  local gpu=$PWD/.dev/gpu
  export KVFERRY_LIB=${KVFERRY_LIB:-$gpu/libkvferry.so} KVFERRY_BIN=${KVFERRY_BIN:-$gpu/kvferry}
  export LD_LIBRARY_PATH="$(dirname "$KVFERRY_LIB"):${LD_LIBRARY_PATH:-}"
  export PYTHONPATH="$site:$PWD/python" VLLM_USE_FLASHINFER_SAMPLER=0
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  # Mooncake's store, where `mooncake DIR` installed it
  if [ -f "$mooncake/env.sh" ]; then . "$mooncake/env.sh"; fi
}

case "${1:-}" in
  stash)
    mkdir -p "$parts"
    cp "$2"/part-* "$parts/"
    ls -l "$parts"
    ;;
  unpack)
    [ -n "${2:-}" ] && cp "$2"/part-* "$parts/"
    mkdir -p "$site"
    cat "$parts"/part-* | xz -d -T0 | tar -x -C "$site"
    du -sh "$site"
    ;;
  mooncake)
    bash python/integrations/mooncake_gpu.sh install "$2" "$mooncake"
    bash python/integrations/mooncake_gpu.sh check "$mooncake"
    ;;
  serve)
    variant=$2 out=$3
    [ -d "$site/vllm" ] || { echo "vllm-gpu-run: unpack first" >&2; exit 2; }
    mkdir -p "$out"
    setenv
    small=(--hidden 1024 --layers 8 --heads 8 --kv-heads 2 --vocab 32000 --prompt-len 2000
      --block-size 16 --gpu-memory-utilization 0.3)
    fp32=(--dtype float32 --attention-backend TRITON_ATTN)
    case "$variant" in
      bf16) args=(--dtype bfloat16 "${small[@]}") ;;
      fp32) args=("${fp32[@]}" "${small[@]}") ;;
      fp32-sync) args=("${fp32[@]}" --async-scheduling off "${small[@]}") ;;
      fp32-v1) export VLLM_USE_V2_MODEL_RUNNER=0; args=("${fp32[@]}" "${small[@]}") ;;
      fp32-v1-sync) export VLLM_USE_V2_MODEL_RUNNER=0
        args=("${fp32[@]}" --async-scheduling off "${small[@]}" --modes "baseline,producer,tampered") ;;
      8k) args=(--dtype bfloat16 --hidden 2048 --layers 16 --heads 16 --kv-heads 8 --vocab 32000
        --prompt-len 8000 --new-tokens 1 --block-size 16 --gpu-memory-utilization 0.4
        --node-pool 4G --modes "baseline,producer,consumer") ;;
      4p5b*) args=(--dtype bfloat16 --hidden 4096 --layers 32 --heads 32 --vocab 32000
        --prompt-len 32000 --prompts 2 --new-tokens 1 --gpu-memory-utilization 0.6
        --node-pool 12G)
        case "$variant" in
          # consumers of the producer's objects configured otherwise (the
          # node's 12G pool holds one producer's 8.4 GB: a producer
          # variant, in a namespace of its own, would evict them)
          4p5b) args+=(--kv-heads 8 --block-size 16 --modes "baseline,producer,consumer,split"
            --variant 'nopipe={"stage_pipeline": false}'
            --variant 'slice16m={"stage_slice_bytes": 16777216}'
            --variant 'slice128m={"stage_slice_bytes": 134217728}'
            --variant 'async={"load_mode": "async"}') ;;
          4p5b-b32) args+=(--kv-heads 8 --block-size 32 --modes "baseline,producer,consumer") ;;
          4p5b-kv2) args+=(--kv-heads 2 --block-size 16 --modes "baseline,producer,consumer") ;;
          *) echo "vllm-gpu-run: unknown variant $variant" >&2; exit 2 ;;
        esac
        kv=$(printf '%s\n' "${args[@]}" | grep -A1 -- --kv-heads | tail -1)
        args+=(--model-dir "/tmp/kvferry-model-4p5b-kv$kv") ;;
      *) echo "vllm-gpu-run: unknown variant $variant" >&2; exit 2 ;;
    esac
    rc=0
    python3 python/integrations/serve_vllm.py "${args[@]}" \
      --out "$out/serve-vllm-gpu-$variant.json" >"$out/serve-vllm-gpu-$variant.log" 2>&1 || rc=$?
    echo "vllm-gpu-run: $variant rc $rc"
    exit "$rc"
    ;;
  tiers|load)
    kind=$1 out=$2
    shift 2
    [ -d "$site/vllm" ] || { echo "vllm-gpu-run: unpack first" >&2; exit 2; }
    mkdir -p "$out"
    setenv
    rc=0
    python3 python/integrations/bench_vllm.py "$kind" --model-dir /tmp/kvferry-model-4p5b-kv8 \
      --outdir "$out" "$@" >"$out/bench-vllm-$kind.log" 2>&1 || rc=$?
    grep '^bench-vllm' "$out/bench-vllm-$kind.log" || tail -40 "$out/bench-vllm-$kind.log"
    echo "vllm-gpu-run: $kind rc $rc"
    exit "$rc"
    ;;
  pytest)
    out=$2
    mkdir -p "$out"
    setenv
    python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_kv_chunks.py \
      python/tests/test_vllm_connector.py -k "cuda" 2>&1 | tee "$out/pytest-gpu.txt" | tail -15
    ;;
  *)
    awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0"
    exit 2
    ;;
esac
