#!/bin/bash
# Two `kvferry resp` builds side by side with redis-server: one master and
# node, door A ($BASE) and door B ($NEW, default build/kvferry) with
# --threads THREADS (door A: $TB if set), and Redis; redis-benchmark
# -t set,get -d SIZE -c 8 -n N against each in turn, ROUNDS times.
#   BASE=/path/to/old/kvferry side-by-side.sh SIZE N ROUNDS THREADS [bench-threads]
B=${NEW:-build/kvferry}
D=$(mktemp -d /tmp/kvf-ab-XXXXXX)
PIDS=()
st() { local n=$1 bin=$2; shift 2; "$bin" "$@" >$D/$n.out 2>$D/$n.err & echo $! >$D/$n.pid
  for _ in $(seq 100); do [ -s $D/$n.out ] && break; sleep 0.1; done
  head -1 $D/$n.out | sed -n "s/^[a-z]*=\([^ ]*\).*/\1/p"; }
M=$(st master $B master --listen 127.0.0.1:0 --http off)
st node $B node --master $M --pool 3G >/dev/null
A=$(st base "${BASE:?set BASE}" resp --master $M --listen 127.0.0.1:0 --pool 1G --threads ${TB:-$4})
N=$(st resp $B resp --master $M --listen 127.0.0.1:0 --pool 1G --threads $4)
PW=$("$B" resp --listen 127.0.0.1:0 --print-password)
RD=16998
redis-server --bind 127.0.0.1 --port $RD --save '' --requirepass "$PW" --appendonly no --dir $D --daemonize no >/dev/null 2>&1 & PIDS+=($!)
for _ in $(seq 100); do
  [ "$(redis-cli -p ${A##*:} -a $PW SET ready 1 2>/dev/null)" = OK ] && [ "$(redis-cli -p ${N##*:} -a $PW SET ready 1 2>/dev/null)" = OK ] && [ "$(redis-cli -p $RD -a $PW PING 2>/dev/null)" = PONG ] && break; sleep 0.2; done
BT=(); [ -n "$5" ] && BT=(--threads $5)
for r in $(seq $3); do
  for x in base:${A##*:} new:${N##*:} redis:$RD; do
    echo -n "${x%%:*} "
    redis-benchmark -p ${x##*:} -a $PW -t set,get -d $1 -c 8 -n $2 "${BT[@]}" -q 2>/dev/null | tr '\r' '\n' | grep -a "^[SG]ET: [0-9]" | awk '{printf "%s %s  ", $1, $2}'; echo
  done
done
kill ${PIDS[@]} $(cat $D/*.pid); wait
