#!/bin/bash
# The door with GETs from store views (A) and without (B, KVF_RESP_VIEWS=0)
# on one master and node: GET-only and SET-only redis-benchmark runs in
# turn, requests/s and CPU per request of each door, the master and the node.
# SIZE, N, R (rounds), T (door loops), OPS; KVF_BIN: the binary.
B=$(realpath "${KVF_BIN:-build/kvferry}"); SIZE=${SIZE:-65536}; N=${N:-10000}; R=${R:-5}; T=${T:-2}; OPS=${OPS:-get set}
D=$(mktemp -d /tmp/kvf-views-ab-XXXX); cd $D
$B master --listen 127.0.0.1:0 --http off > m.out 2>m.err & MP=$!; sleep 0.5; M=$(head -1 m.out | cut -d= -f2 | cut -d' ' -f1)
$B node --master $M --pool 1G > n.out 2>n.err & NP=$!
KVF_LOG_LEVEL=info $B resp --master $M --listen 127.0.0.1:16390 --pool 256M --threads $T > a.out 2> a.err & AP=$!
KVF_LOG_LEVEL=info KVF_RESP_VIEWS=0 $B resp --master $M --listen 127.0.0.1:16391 --pool 256M --threads $T > b.out 2> b.err & BP=$!
sleep 1
export REDISCLI_AUTH=$($B resp --listen 127.0.0.1:16390 --print-password)
until [ "$(redis-cli -p 16390 SET ready 1 2>/dev/null)" = OK ]; do sleep 0.2; done
redis-benchmark -a $REDISCLI_AUTH -p 16390 -t set -d $SIZE -c 8 -n 100 -q >/dev/null 2>&1
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for r in $(seq $R); do for op in $OPS; do for d in a b; do
  port=16390; pid=$AP; [ $d = b ] && port=16391 && pid=$BP
  t0=$(ticks $pid); m0=$(ticks $MP); n0=$(ticks $NP)
  rps=$(redis-benchmark -a $REDISCLI_AUTH -p $port -t $op -d $SIZE -c 8 -n $N -q 2>&1 | tr '\r' '\n' | grep -E "^(GET|SET): [0-9]" | tail -1 | awk '{print $2}')
  t1=$(ticks $pid); m1=$(ticks $MP); n1=$(ticks $NP)
  echo "$op $d rps $rps door_us $(( (t1-t0)*10000/N )) master_us $(( (m1-m0)*10000/N )) node_us $(( (n1-n0)*10000/N ))"
done; done; done | tee res.txt
kill $AP $BP; sleep 1; kill $NP $MP; wait
grep -h "store views" a.err b.err | sed 's/.*resp: //'
for op in $OPS; do for d in a b; do echo "$op $d median rps $(grep "^$op $d" res.txt | awk '{print $4}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') median door_us $(grep "^$op $d" res.txt | awk '{print $6}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"; done; done
