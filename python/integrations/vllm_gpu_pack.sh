#!/usr/bin/env bash
# Packs vLLM 0.26.0 for a GPU machine that has PyTorch but no package
# registry, in parts small enough to carry one per call.
#
#   python/integrations/vllm_gpu_pack.sh [OUT]     (default .dev/vllm-gpu)
#
# vLLM 0.26.0 is the newest vLLM built against torch 2.11.0 (the GPU
# machine's); 0.27.0 and later want torch 2.13 or newer. Its wheel and the
# packages in vllm_gpu_carry.txt are downloaded for CPython 3.12, unpacked
# into one tree, stripped of what a Llama model on an H100/H200 does not
# load (FlashAttention 2 kernels: FlashAttention 3 serves Hopper; MoE
# kernels; the Rust front end; FlashMLA and DeepGEMM), compressed and cut
# into parts of 54 MB: OUT/part-00, OUT/part-01, ...
# python/integrations/vllm_gpu_run.sh puts them together there.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.dev/vllm-gpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 \
  manylinux_2_26_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
  manylinux_2_31_x86_64 manylinux_2_34_x86_64; do
  plat+=(--platform "$p")
done
pip=(python3 -m pip -q --disable-pip-version-check)
echo "vllm-gpu-pack: downloading vllm 0.26.0 and $(grep -vc '^#' python/integrations/vllm_gpu_carry.txt) packages"
"${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d "$work/wheels" vllm==0.26.0 -r python/integrations/vllm_gpu_carry.txt
"${pip[@]}" install --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" --target "$work/site" "$work"/wheels/*.whl
v="$work/site/vllm"
rm -f "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$v/_moe_C_stable_libtorch.abi3.so" \
  "$v/vllm-rs" "$v/_flashmla_C.abi3.so"
find "$v/third_party" \( -name '*.so' -o -name '*.h' -o -name '*.hpp' -o -name '*.cuh' \
  -o -name '*.cu' -o -name '*.cpp' \) -delete
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
echo "vllm-gpu-pack: $(du -sh "$work/site" | cut -f1) unpacked; compressing"
mkdir -p "$out"
rm -f "$out"/part-*
tar -C "$work/site" -cf - . | xz -6 -T0 | split -b 54000000 -d -a 2 - "$out/part-"
ls -l "$out"
