#!/usr/bin/env bash
# device batch, session 6: lease reads / conns A/B (tcp forced), GPU tests,
# the repo's store-vs-Redis script with lease reads. Results: $OUT/res.tgz
set -u
export PATH=$PWD/.dev/redis:$PATH LD_LIBRARY_PATH=$PWD/.dev/redis:$PWD/.dev/gpu
B=.dev/gpu/kvferry
W=/tmp/s6; mkdir -p $W/rec
trap 'tar czf $OUT/res.tgz -C $W .' EXIT
nproc > $W/nproc.txt; lscpu | head -20 >> $W/nproc.txt
ab() { # $1 tag $2 lease_reads $3 conns
  KVF_LEASE_READS=$2 KVF_CONNS=$3 KVF_TRANSPORTS=tcp timeout 150 $B bench store --sizes 64K,1M --clients 8 --hit-ratio 1 --duration 2s --vs-redis --repeat 3 --record $W/rec > $W/ab-$1.log 2>&1
}
case $1 in
a)
  for t in test_gpu_store test_gpu_copy test_gpu_ipc test_gpu_ipc_engine test_gpu_tcp; do
    KVF_BIN=$PWD/$B timeout 60 .dev/gpu/$t > $W/$t.log 2>&1; echo "$t rc=$?" >> $W/gpu-tests.txt
  done
  ab off4-a 0 4; ab on4-a 1 4; ab on8-a 1 8; ab off8-a 0 8 ;;
b)
  KVF_LEASE_READS=1 KVF_BIN=$B DURATION=2s REPEAT=3 timeout 260 scripts/bench-store-vs-redis.sh $W/rec > $W/script-lease.log 2>&1
  ab on4-b 1 4; ab off4-b 0 4 ;;
esac
echo done
