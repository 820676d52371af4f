#!/usr/bin/env bash
# device batch, session 6 (c): chunk_bytes / conns A/B at 1 MiB, tcp forced, lease reads on
set -u
export PATH=$PWD/.dev/redis:$PATH LD_LIBRARY_PATH=$PWD/.dev/redis:$PWD/.dev/gpu
B=.dev/gpu/kvferry
W=/tmp/s6c; mkdir -p $W/rec
trap 'tar czf $OUT/res.tgz -C $W .' EXIT
ab() { # $1 tag $2 chunk $3 conns $4 sizes
  KVF_LEASE_READS=1 KVF_CHUNK_BYTES=$2 KVF_CONNS=$3 KVF_TRANSPORTS=tcp timeout 120 $B bench store --sizes $4 --clients 8 --hit-ratio 1 --duration 2s --vs-redis --repeat 3 > $W/ab-$1.log 2>&1
}
ab c1m-4 1M 4 1M; ab c256k-4 256K 4 1M; ab c512k-4 512K 4 1M; ab c256k-8 256K 8 1M; ab c256k-8-64k 256K 8 64K
echo done
