#!/usr/bin/env bash
# Prepares .dev/gpu for tests/gpu/device_run.sh on a GPU machine that
# builds nothing: builds here (release, CUDA for sm_90, nvcc needs no GPU)
# and copies the kvferry command, libkvferry.so (for the Python package:
# device_run.sh points KVFERRY_LIB at it), the GPU test binaries and the
# Debian shared libraries they load that a bare GPU machine may lack.
# The Python package itself travels with the source tree.
#
#   tests/gpu/stage-binaries.sh            # then, there:
#   tests/gpu/device_run.sh sum
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${KVF_STAGE_BUILD:-build}"
D="${KVF_GPU_BIN:-.dev/gpu}"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVF_WERROR=ON -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
ninja -C "$BUILD" -j"${KVF_JOBS:-2}"
mkdir -p "$D"
bins=("$BUILD/kvferry")
for t in "$BUILD"/tests/gpu/test_gpu_*; do
  [ -x "$t" ] && bins+=("$t")
done
for b in "${bins[@]}"; do
  strip --strip-debug -o "$D/$(basename "$b")" "$b"
done
strip --strip-debug -o "$D/libkvferry.so" "$BUILD/libkvferry.so"
# the package's op-list converter, found next to KVFERRY_LIB
[ -e "$BUILD/libkvferry_pyops.so" ] && cp "$BUILD/libkvferry_pyops.so" "$D/"
scripts/copy-libs.sh "$D" "${bins[@]}" "$D/libkvferry.so"
ls -la "$D"
du -sh "$D"
