#!/usr/bin/env bash
# GPU test (label gpu): the GPU benches run end to end on a small pool and
# verify what they moved: bench h2d, bench blocks --device gpu on every
# local path (p2p when two GPUs are present) with --verify, and GPU pools
# over tcp with --verify; each writes a record that must exist. Exits 77
# without a GPU.
set -euo pipefail
bin="${KVF_BIN:?}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
rc=0
"$bin" bench h2d --size 64M --iters 2 --warmup 1 --record "$out" || rc=$?
if [ "$rc" -eq 77 ]; then
  echo "no GPU: skipped"
  exit 77
fi
[ "$rc" -eq 0 ]
for path in h2d d2h d2d p2p; do
  rc=0
  "$bin" bench blocks --device gpu --path "$path" --pool 256M \
    --sizes 16M,64M --iters 2 --each-iters 1 --verify --record "$out" || rc=$?
  if [ "$path" = p2p ] && [ "$rc" -eq 77 ]; then
    continue
  fi
  [ "$rc" -eq 0 ]
done
"$bin" bench blocks --device gpu --path h2d --pageable --pool 256M \
  --sizes 16M --iters 2 --each-iters 1 --verify
"$bin" bench blocks --device gpu --pool 256M --sizes 16M --iters 2 \
  --op both --verify --record "$out"
n=$(ls "$out"/*.json | wc -l)
echo "records: $n"
[ "$n" -ge 4 ]
