#!/bin/bash
# kvferry resp against redis-server with redis-benchmark, same run, same
# machine: starts a master, a node, `kvferry resp` and a redis-server
# (persistence off) on loopback, then for each value size runs
# `redis-benchmark -t set,get -d SIZE -c CLIENTS -n N` against each server in
# interleaved rounds and prints requests/s per round and the ratio of the
# medians (kvferry / redis).
#
#   scripts/bench-resp-vs-redis.sh [-b build/kvferry (or $KVF_BIN)] [-s "65536 1048576"]
#                                  [-c 8] [-r 3] [-t resp-threads]
#                                  [-n "N-for-64K N-for-1M ..."] [-l]
#                                  [-k KEYSPACE] [-T BENCH-THREADS]
#                                  [-R REDIS-DIR] [-o OUT-FILE]
#                                  [-B "KEY=VALUE ..."]
#
# -k: random keys out of KEYSPACE (redis-benchmark -r); by default every
# request uses one key, so each SET overwrites it.
#
# -T: redis-benchmark's threads, a list ("1 4": every size is measured
# single-threaded, then with --threads 4); the same for both servers. By
# default it runs single-threaded, which can be what limits the 1 MiB
# runs (the client, not the server, is then measured). With --threads,
# redis-benchmark notices the end of a run on a 250 ms tick, so a run's
# rate is only as good as its length: give -n so that each run lasts
# several seconds.
#
# Each round also prints how busy redis-benchmark was (its CPU time over
# the time its requests took at the rates it reported, per thread): near
# 100 % the client, not the server, set the pace of that round.
#
# -R: a folder holding redis-server, redis-benchmark and redis-cli (and
# the libraries they need), e.g. binaries extracted from Debian packages;
# by default they are found on PATH.
#
# -o: the record is also written to OUT-FILE (its folder is created).
#
# The door's configuration keys reach it through the environment, e.g.
# KVF_RESP_SPREAD=1 (connections given to its loops in turn), printed in
# the record's header.
#
# -B: a second door (B) on the same master and node, started with these
# environment settings added (e.g. -B KVF_RESP_VIEWS=0, or -B
# KVF_RESP_THREADS=4 for other loops), measured in the same rounds
# (door A, door B, Redis, in turn): an A/B of one setting in one run.
#
# -l: the door's GETs use lease reads (KVF_LEASE_READS=1: a key read
# again within its read lease is read without asking the master; for
# keys whose value never changes, as LMCache's chunk keys).
set -eu
BIN=${KVF_BIN:-build/kvferry}
SIZES="65536 1048576"
COUNTS=""
CLIENTS=8
ROUNDS=3
THREADS=2
LEASE=0
KEYS=()
BTHREADS=1
OUTFILE=
BENV=
while getopts "b:s:c:r:t:n:lk:T:R:o:B:" o; do
    case $o in
    b) BIN=$OPTARG ;;
    s) SIZES=$OPTARG ;;
    c) CLIENTS=$OPTARG ;;
    r) ROUNDS=$OPTARG ;;
    t) THREADS=$OPTARG ;;
    n) COUNTS=$OPTARG ;;
    l) LEASE=1 ;;
    k) KEYS=(-r "$OPTARG") ;;
    T) BTHREADS=$OPTARG ;;
    R) export PATH=$OPTARG:$PATH LD_LIBRARY_PATH=$OPTARG:${LD_LIBRARY_PATH:-} ;;
    o) OUTFILE=$OPTARG ;;
    B) BENV=$OPTARG ;;
    *) exit 2 ;;
    esac
done
if [ -n "$OUTFILE" ]; then
    mkdir -p "$(dirname "$OUTFILE")"
    exec > >(tee "$OUTFILE")
fi
for t in redis-server redis-benchmark redis-cli; do
    command -v $t >/dev/null || { echo "$t is not installed" >&2; exit 2; }
done
DIR=$(mktemp -d /tmp/kvf-resp-bench-XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait "${PIDS[@]}" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

# Starts "$@" in the background, waits for its first line (KEY=VALUE ...)
# and sets ADDR to VALUE.
start() {
    local out=$DIR/$1.out
    "$BIN" "$@" >"$out" 2>"$DIR/$1.err" &
    PIDS+=($!)
    for _ in $(seq 100); do
        [ -s "$out" ] && break
        sleep 0.1
    done
    ADDR=$(head -1 "$out" | sed -n "s/^$1=\([^ ]*\).*/\1/p")
}

# both servers ask for the door's AUTH password (derived from the cluster
# secret), and redis-benchmark gives it to both: same client flags
PW=$("$BIN" resp --listen 127.0.0.1:0 --print-password)
export REDISCLI_AUTH=$PW
start master --listen 127.0.0.1:0 --http off
MASTER=$ADDR
start node --master "$MASTER" --pool 2G
# info: the door logs, when it stops, how many GETs it sent from store
# views and how many through the copy path (printed at the end)
KVF_LOG_LEVEL=${KVF_LOG_LEVEL:-info} KVF_LEASE_READS=$LEASE start resp \
    --master "$MASTER" --listen 127.0.0.1:0 --pool 1G --threads "$THREADS"
RESP=$ADDR
RPORT=${RESP##*:}
RDPORT=$((16000 + $$ % 1000))
redis-server --bind 127.0.0.1 --port "$RDPORT" --save '' --requirepass "$PW" \
    --appendonly no --dir "$DIR" --daemonize no >"$DIR/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    [ "$(redis-cli -p "$RDPORT" PING 2>/dev/null)" = PONG ] &&
        [ "$(redis-cli -p "$RPORT" SET ready 1 2>/dev/null)" = OK ] && break
    sleep 0.2
done
if [ -n "$BENV" ]; then # door B: index 4 of PIDS
    # its loops: -t, unless -B sets KVF_RESP_THREADS (the flag would win)
    bthreads=(--threads "$THREADS")
    case " $BENV" in *" KVF_RESP_THREADS="*) bthreads=() ;; esac
    # shellcheck disable=SC2086
    env KVF_LOG_LEVEL="${KVF_LOG_LEVEL:-info}" $BENV KVF_LEASE_READS=$LEASE "$BIN" resp --master "$MASTER" \
        --listen 127.0.0.1:0 --pool 1G "${bthreads[@]}" \
        >"$DIR/respb.out" 2>"$DIR/respb.err" &
    PIDS+=($!)
    for _ in $(seq 100); do
        [ -s "$DIR/respb.out" ] && break
        sleep 0.1
    done
    BPORT=$(head -1 "$DIR/respb.out" | sed -n 's/^resp=[^ ]*:\([0-9]*\).*/\1/p')
    for _ in $(seq 100); do
        [ "$(redis-cli -p "$BPORT" SET ready 1 2>/dev/null)" = OK ] && break
        sleep 0.2
    done
fi

# requests/s of SET and GET, and the CPU seconds redis-benchmark itself
# used: prints "SET GET CPU" (a run that printed no figures, as
# redis-benchmark at times does on a loaded host, is redone).
bench() { # port size n bench-threads
    local r bopts=() TIMEFORMAT='cpu %U %S'
    [ "$4" -gt 1 ] && bopts=(--threads "$4")
    for _ in 1 2 3; do
        r=$( { time redis-benchmark -p "$1" -a "$PW" -t set,get -d "$2" -c "$CLIENTS" \
            -n "$3" "${KEYS[@]}" "${bopts[@]}" -q 2>&1; } 2>&1 | tr '\r' '\n' |
            awk '/^SET: [0-9]/ {s=$2} /^GET: [0-9]/ {g=$2} /^cpu / {c=$2 + $3}
                 END {if (s != "" && g != "") print s, g, c}')
        [ -n "$r" ] && break
    done
    echo "${r:-0 0 0}"
}

# The client's share of the run: its CPU time over the time the requests
# took at the measured rates (n/SET + n/GET), in percent per client
# thread. Near 100 % the client, not the server, sets the pace.
client_busy() { # "SET GET CPU" n bench-threads
    echo "$1" | awk -v n="$2" -v t="$3" '{
        w = ($1 > 0 && $2 > 0) ? n / $1 + n / $2 : 0
        printf "%.0f", (w > 0 ? 100 * $3 / w / t : 0) }'
}

# CPU time (ticks) a process has used.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TCK=$(getconf CLK_TCK)
# microseconds of CPU per request between two tick counts
per_op() { awk -v a="$1" -v b="$2" -v n="$3" -v t="$TCK" \
    'BEGIN {printf "%.0f", (b - a) * 1e6 / t / n}'; }

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "# $(nproc) CPUs; clients $CLIENTS; resp threads $THREADS" \
    "(resp_spread ${KVF_RESP_SPREAD:-1});" \
    "lease reads $LEASE; keys ${KEYS[*]:-one};" \
    "redis-benchmark threads $BTHREADS;" \
    "${BENV:+door B: $BENV;}" \
    "$(redis-server --version | cut -d' ' -f3)"
i=0
for size in $SIZES; do
    i=$((i + 1))
    n=$(echo "$COUNTS" | cut -d' ' -f$i)
    [ -n "$n" ] || n=$((size >= 1048576 ? 2000 : 10000))
    for bt in $BTHREADS; do
        : >"$DIR/k" && : >"$DIR/r" && : >"$DIR/b"
        for r in $(seq "$ROUNDS"); do
            t0=(); for p in "${PIDS[@]}"; do t0+=("$(ticks "$p")"); done
            k=$(bench "$RPORT" "$size" "$n" "$bt")
            t1=(); for p in "${PIDS[@]}"; do t1+=("$(ticks "$p")"); done
            b=""
            if [ -n "$BENV" ]; then
                tb0=$(ticks "${PIDS[4]}")
                b=$(bench "$BPORT" "$size" "$n" "$bt")
                tb1=$(ticks "${PIDS[4]}")
                echo "$b" >>"$DIR/b"
            fi
            t2=$(ticks "${PIDS[3]}")
            d=$(bench "$RDPORT" "$size" "$n" "$bt")
            t3=$(ticks "${PIDS[3]}")
            echo "$k" >>"$DIR/k"
            echo "$d" >>"$DIR/r"
            printf "size %-8s bench-threads %s round %s  kvferry SET %10s GET %10s | redis SET %10s GET %10s\n" \
                "$size" "$bt" "$r" $(echo "$k" | cut -d' ' -f1,2) $(echo "$d" | cut -d' ' -f1,2)
            if [ -n "$b" ]; then
                printf "    door B SET %10s GET %10s, cpu/request %s us, client busy %s %%\n" \
                    $(echo "$b" | cut -d' ' -f1,2) "$(per_op "$tb0" "$tb1" $((2 * n)))" \
                    "$(client_busy "$b" "$n" "$bt")"
            fi
            printf "    client busy (redis-benchmark CPU over the requests' time, per thread): against kvferry %s %%, redis %s %%\n" \
                "$(client_busy "$k" "$n" "$bt")" "$(client_busy "$d" "$n" "$bt")"
            # CPU per request (SET and GET together) of each server process
            printf "    cpu/request: resp %s us, master %s us, node %s us | redis-server %s us\n" \
                "$(per_op "${t0[2]}" "${t1[2]}" $((2 * n)))" \
                "$(per_op "${t0[0]}" "${t1[0]}" $((2 * n)))" \
                "$(per_op "${t0[1]}" "${t1[1]}" $((2 * n)))" \
                "$(per_op "$t2" "$t3" $((2 * n)))"
        done
        ks=$(cut -d' ' -f1 "$DIR/k" | median)
        kg=$(cut -d' ' -f2 "$DIR/k" | median)
        rs=$(cut -d' ' -f1 "$DIR/r" | median)
        rg=$(cut -d' ' -f2 "$DIR/r" | median)
        awk -v s="$size" -v bt="$bt" -v ks="$ks" -v kg="$kg" -v rs="$rs" -v rg="$rg" 'BEGIN {
            printf "size %-8s bench-threads %s median rps: kvferry SET %.0f GET %.0f, redis SET %.0f GET %.0f; ratio SET %.2fx GET %.2fx\n",
                s, bt, ks, kg, rs, rg, ks / rs, kg / rg }'
        if [ -n "$BENV" ]; then
            bs=$(cut -d' ' -f1 "$DIR/b" | median)
            bg=$(cut -d' ' -f2 "$DIR/b" | median)
            awk -v s="$size" -v bt="$bt" -v bs="$bs" -v bg="$bg" -v rs="$rs" -v rg="$rg" -v ks="$ks" -v kg="$kg" 'BEGIN {
                printf "size %-8s bench-threads %s median rps: door B SET %.0f GET %.0f; B/redis SET %.2fx GET %.2fx; A/B SET %.2fx GET %.2fx\n",
                    s, bt, bs, bg, bs / rs, bg / rg, ks / bs, kg / bg }'
        fi
    done
done
# the doors' own counts: GETs sent from store views / through the copy
# path; SETs stored / answered by another loop's store of their key
counts() { sed -n 's/.*resp: \(GETs sent.*\|SETs stored.*\)/\1/p' "$1" | paste -sd ';' -; }
kill "${PIDS[2]}" 2>/dev/null && wait "${PIDS[2]}" 2>/dev/null || true
echo "# door A: $(counts "$DIR/resp.err")"
if [ -n "$BENV" ]; then
    kill "${PIDS[4]}" 2>/dev/null && wait "${PIDS[4]}" 2>/dev/null || true
    echo "# door B: $(counts "$DIR/respb.err")"
fi
