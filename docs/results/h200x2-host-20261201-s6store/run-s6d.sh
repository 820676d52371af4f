#!/usr/bin/env bash
# device batch, session 6 (d): the new defaults (node_conns 8, node_chunk auto), tcp forced, twice;
# the repo script with lease reads; GPU tests. Results: $OUT/res.tgz
set -u
export PATH=$PWD/.dev/redis:$PATH LD_LIBRARY_PATH=$PWD/.dev/redis:$PWD/.dev/gpu
B=.dev/gpu/kvferry
W=/tmp/s6d; mkdir -p $W/rec $W/rec-lease
trap 'tar czf $OUT/res.tgz -C $W .' EXIT
nproc > $W/nproc.txt
for t in test_gpu_store test_gpu_copy test_gpu_ipc test_gpu_ipc_engine test_gpu_tcp; do
  KVF_BIN=$PWD/$B timeout 60 .dev/gpu/$t > $W/$t.log 2>&1; echo "$t rc=$?" >> $W/gpu-tests.txt
done
for r in d1 d2; do
  KVF_TRANSPORTS=tcp timeout 140 $B bench store --sizes 64K,1M --clients 8 --hit-ratio 1 --duration 2s --vs-redis --repeat 3 --record $W/rec > $W/ab-$r.log 2>&1
done
KVF_LEASE_READS=1 KVF_BIN=$B DURATION=2s REPEAT=3 timeout 280 scripts/bench-store-vs-redis.sh $W/rec-lease > $W/script-lease.log 2>&1
echo done
