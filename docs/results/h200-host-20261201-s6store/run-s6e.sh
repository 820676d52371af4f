#!/usr/bin/env bash
# device batch, session 6 (e): the repo script on 6728cd4 (defaults; redis-thr rows). Results: $OUT/res.tgz
set -u
export PATH=$PWD/.dev/redis:$PATH LD_LIBRARY_PATH=$PWD/.dev/redis:$PWD/.dev/gpu
B=.dev/gpu/kvferry
W=/tmp/s6e; mkdir -p $W/rec
trap 'tar czf $OUT/res.tgz -C $W .' EXIT
KVF_BIN=$B DURATION=2s REPEAT=3 timeout 420 scripts/bench-store-vs-redis.sh $W/rec > $W/script.log 2>&1
echo done
