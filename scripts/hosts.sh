#!/usr/bin/env bash
# A kvferry store spread over several simulated hosts on this machine.
#
# Each host is a network namespace with one veth and its own address on
# a bridge; the bridge sits in a namespace of its own, so nothing changes
# in the namespace this script runs in. A tc tbf rate limit on each
# host's link, both directions (the host's end of the veth shapes what it
# sends, the bridge's end what it receives), stands for the host's NIC.
# The master runs on a host of its own, each storage host runs
# --nodes-per-host nodes, and the clients (`kvferry bench store
# --master`, one process each) run on client hosts of their own, or on
# the storage hosts with --client-hosts 0. Every process shares one
# cluster secret (KVF_SECRET_FILE: the addresses are not loopback) and
# is forced onto tcp (a same-host transport would cross namespaces
# without the link). Everything started (processes, namespaces, their
# veths and the bridge) is removed on exit, also on failure or ^C; runs
# left by a killed script are swept at the next start.
#
#   scripts/hosts.sh [options] [-- COMMAND...]
#
# Without COMMAND the clients run `kvferry bench store` at once and the
# script prints each client's get row and their sum. With COMMAND, it
# runs once the cluster is up (in this namespace, no client started),
# with the cluster's description in the environment (see hosts_env) and
# the script's exit status is COMMAND's. Needs root and iproute2 (exit 77
# without them).
set -u

usage() {
    cat <<'EOF'
usage: scripts/hosts.sh [options] [-- COMMAND...]
  --hosts N            storage hosts (default 2)
  --nodes-per-host K   nodes per storage host (default 1)
  --client-hosts M     hosts running clients only (default: as many as
                       storage hosts; 0 = clients on the storage hosts)
  --clients C          client processes, round robin over the client
                       hosts (default: one per client host)
  --rate RATE          tc tbf rate of each host's link, both directions
                       (e.g. 200mbit; default: none)
  --pool SIZE          pool per node (default 256M)
  --replicas R         the master's default replicas (default 1)
  --bench 'ARGS'       arguments of each client's `kvferry bench store`
                       (default '--sizes 1M --clients 4 --duration 3s
                       --hit-ratio 1')
  --record DIR         DIR/hosts.json (the run, its summary), each
                       client's bench record in DIR/client-N
  --hypothesis TEXT    the hypothesis hosts.json states
  --out DIR            logs and outputs (default: a fresh /tmp dir)
  --secret FILE        the cluster secret (default: a new one in --out)
  --kvferry PATH       the binary (default: build/kvferry)
COMMAND sees: HOSTS_MASTER, HOSTS_HTTP (master addresses),
  HOSTS_NS (storage hosts' namespaces), HOSTS_IPS (their
  addresses), HOSTS_CLIENT_NS, HOSTS_CLIENT_IPS, HOSTS_SW
  (the bridge's namespace; the veth to storage host i is vh<i>, to
  client host j vc<j>), HOSTS_OUT, HOSTS_TOKEN (the bearer
  token of the master's /status), KVF_SECRET_FILE, KVF_TRANSPORTS,
  KVFERRY (the binary).
EOF
}


HOSTS=2
NPH=1
CHOSTS=-1
CLIENTS=0
RATE=
POOL=256M
REPLICAS=1
BENCH='--sizes 1M --clients 4 --duration 3s --hit-ratio 1'
RECORD=
HYPOTHESIS="the clients' store gets together: throughput and latency"
OUT=
SECRET=
KVF=build/kvferry
CMD=()

while [ $# -gt 0 ]; do
    case "$1" in
    --hosts) HOSTS=$2; shift 2 ;;
    --nodes-per-host) NPH=$2; shift 2 ;;
    --client-hosts) CHOSTS=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --pool) POOL=$2; shift 2 ;;
    --replicas) REPLICAS=$2; shift 2 ;;
    --bench) BENCH=$2; shift 2 ;;
    --record) RECORD=$2; shift 2 ;;
    --hypothesis) HYPOTHESIS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --secret) SECRET=$2; shift 2 ;;
    --kvferry) KVF=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; CMD=("$@"); break ;;
    *) echo "hosts.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
[ "$CHOSTS" -lt 0 ] && CHOSTS=$HOSTS
if [ "$CLIENTS" -eq 0 ]; then
    CLIENTS=$((CHOSTS > 0 ? CHOSTS : HOSTS))
fi
if [ "$HOSTS" -lt 1 ] || [ "$HOSTS" -gt 60 ] || [ "$CHOSTS" -gt 60 ]; then
    echo "hosts.sh: 1..60 storage hosts and 0..60 client hosts" >&2
    exit 2
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "hosts.sh: SKIP: needs root for network namespaces" >&2
    exit 77
fi
for t in ip tc; do
    if ! command -v $t >/dev/null 2>&1; then
        echo "hosts.sh: SKIP: $t (iproute2) is not installed" >&2
        exit 77
    fi
done
KVF=$(realpath "$KVF" 2>/dev/null || echo "$KVF")
if [ ! -x "$KVF" ]; then
    echo "hosts.sh: no kvferry binary at $KVF (--kvferry PATH)" >&2
    exit 2
fi

P=kvfh$$
SW=$P-sw
NETS=()  # namespaces made by this run
PIDS=()  # processes started by this run
CMDPID= # COMMAND's process group
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/kvferry-hosts-XXXXXX)
mkdir -p "$OUT"
[ -z "$RECORD" ] || mkdir -p "$RECORD"

# shellcheck disable=SC2317 # called by the traps
cleanup() {
    local pid ns i
    trap - EXIT INT TERM
    [ -z "$CMDPID" ] || kill -TERM -- "-$CMDPID" 2>/dev/null
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null
    done
    for i in $(seq 50); do
        local alive=0
        for pid in "${PIDS[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ $alive -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${PIDS[@]}"; do
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    for ns in "${NETS[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
        ip netns del "$ns" 2>/dev/null
    done
}
trap 'cleanup; exit $RC' EXIT
trap 'RC=130; exit 130' INT
trap 'RC=143; exit 143' TERM
RC=1

# namespaces of runs whose script died without cleaning up
sweep() {
    local ns pid
    for ns in $(ip netns list | awk '{print $1}' | grep -E '^kvfh[0-9]+-'); do
        pid=${ns#kvfh}
        pid=${pid%%-*}
        if ! kill -0 "$pid" 2>/dev/null; then
            ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
            ip netns del "$ns" 2>/dev/null
        fi
    done
}

die() {
    echo "hosts.sh: $*" >&2
    RC=1
    exit 1
}

# add_host NS VETH IP: a namespace linked to the bridge at IP/24
add_host() {
    local ns=$1 veth=$2 ipa=$3
    ip netns add "$ns" || die "ip netns add $ns failed"
    NETS+=("$ns")
    ip -n "$SW" link add "$veth" type veth peer name eth0 netns "$ns" ||
        die "veth $veth failed"
    ip -n "$SW" link set "$veth" master br0 up &&
        ip -n "$ns" addr add "$ipa/24" dev eth0 &&
        ip -n "$ns" link set eth0 up &&
        ip -n "$ns" link set lo up || die "address of $ns failed"
    if [ -n "$RATE" ]; then
        # what the host sends, and what it receives
        tc -n "$ns" qdisc add dev eth0 root tbf rate "$RATE" burst 256kb \
            latency 1s &&
            tc -n "$SW" qdisc add dev "$veth" root tbf rate "$RATE" \
                burst 256kb latency 1s || die "tc tbf on $ns failed"
    fi
}

# start NAME NS ARGS...: a kvferry process in NS, output in OUT/NAME.log
start() {
    local name=$1 ns=$2
    shift 2
    ip netns exec "$ns" "$KVF" "$@" >"$OUT/$name.log" 2>&1 &
    PIDS+=($!)
}

# wait_log NAME PATTERN: until the process's log shows PATTERN (10 s)
wait_log() {
    local i
    for i in $(seq 100); do
        grep -q "$2" "$OUT/$1.log" 2>/dev/null && return 0
        sleep 0.1
    done
    cat "$OUT/$1.log" >&2
    die "$1 did not start (log above)"
}

sweep
ip netns add "$SW" || die "ip netns add failed"
NETS+=("$SW")
ip -n "$SW" link add br0 type bridge && ip -n "$SW" link set br0 up ||
    die "bridge failed"

if [ -z "$SECRET" ]; then
    SECRET=$OUT/secret
    (umask 077 && head -c 32 /dev/urandom >"$SECRET") || die "secret failed"
fi
export KVF_SECRET_FILE=$SECRET
export KVF_TRANSPORTS=tcp
# a connection is a thread on both sides: a few per node and client
export KVF_NODE_CONNS=${KVF_NODE_CONNS:-4}
# the master's /metrics and /status want a token derived from the secret
TOKEN=$(python3 -c 'import hmac,hashlib,sys
print(hmac.new(open(sys.argv[1],"rb").read(),b"kvferry-http-v1",
               hashlib.sha256).hexdigest())' "$SECRET") || die "token failed"

NET=10.214.0
MNS=$P-m
add_host "$MNS" vm "$NET.1"
HNS=()
HIPS=()
for i in $(seq "$HOSTS"); do
    HNS+=("$P-h$i")
    HIPS+=("$NET.$((10 + i))")
    add_host "$P-h$i" "vh$i" "$NET.$((10 + i))"
done
CNS=()
CIPS=()
for j in $(seq "$CHOSTS"); do
    CNS+=("$P-c$j")
    CIPS+=("$NET.$((100 + j))")
    add_host "$P-c$j" "vc$j" "$NET.$((100 + j))"
done

MASTER=$NET.1:17800
HTTP=$NET.1:17801
start master "$MNS" master --listen "$MASTER" --http "$HTTP" \
    --replicas "$REPLICAS"
wait_log master 'master='
for i in $(seq "$HOSTS"); do
    for k in $(seq "$NPH"); do
        start "node-h$i-$k" "${HNS[$((i - 1))]}" node --pool "$POOL" \
            --master "$MASTER" --listen "${HIPS[$((i - 1))]}:0"
    done
done
for i in $(seq "$HOSTS"); do
    for k in $(seq "$NPH"); do
        wait_log "node-h$i-$k" 'node='
    done
done
want=$((HOSTS * NPH))
for i in $(seq 100); do
    n=$(ip netns exec "$MNS" curl -s --noproxy '*' \
        -H "Authorization: Bearer $TOKEN" "http://$HTTP/metrics" 2>/dev/null |
        awk '$1 == "kvferry_store_nodes" {print $2}')
    [ "${n:-0}" = "$want" ] && break
    sleep 0.1
done
[ "${n:-0}" = "$want" ] || die "the master sees ${n:-0} of $want nodes"
echo "hosts.sh: master $MASTER, $HOSTS storage host(s) x $NPH node(s)," \
    "$CHOSTS client host(s), rate ${RATE:-unlimited}, out $OUT"

export HOSTS_MASTER=$MASTER HOSTS_HTTP=$HTTP HOSTS_SW=$SW
export HOSTS_NS="${HNS[*]}" HOSTS_IPS="${HIPS[*]}"
export HOSTS_CLIENT_NS="${CNS[*]}" HOSTS_CLIENT_IPS="${CIPS[*]}"
export HOSTS_OUT=$OUT HOSTS_TOKEN=$TOKEN KVFERRY=$KVF

if [ ${#CMD[@]} -gt 0 ]; then
    # in the background, so that a signal reaches the traps at once; its
    # own process group, so that the clean-up ends whatever it started
    setsid "${CMD[@]}" &
    CMDPID=$!
    wait $CMDPID
    RC=$?
    exit $RC
fi

# the clients: one bench process each, their measured phases starting
# together once every one has connected and warmed up
START=$(($(date +%s%3N) + 4000 + 500 * CLIENTS))
CPIDS=()
for c in $(seq "$CLIENTS"); do
    if [ "$CHOSTS" -gt 0 ]; then
        ns=${CNS[$(((c - 1) % CHOSTS))]}
    else
        ns=${HNS[$(((c - 1) % HOSTS))]}
    fi
    rm -f "$OUT/client-$c.lat" # --latencies appends
    rec=()
    [ -n "$RECORD" ] && rec=(--record "$RECORD/client-$c" --hypothesis
        "client $c of $CLIENTS of scripts/hosts.sh ($HOSTS storage host(s), rate ${RATE:-none}); the run's figures are in hosts.json")
    # shellcheck disable=SC2086 # BENCH is a list of arguments
    ip netns exec "$ns" "$KVF" bench store --master "$MASTER" --http "$HTTP" \
        --start-at "$START" --latencies "$OUT/client-$c.lat" \
        $BENCH "${rec[@]}" --json >"$OUT/client-$c.json" \
        2>"$OUT/client-$c.log" &
    CPIDS+=($!)
    PIDS+=($!)
done
RC=0
for pid in "${CPIDS[@]}"; do
    wait "$pid" || RC=1
done
[ $RC -eq 0 ] || echo "hosts.sh: a client failed (see $OUT/client-*.log)" >&2
SUMMARY=$OUT/summary.json
python3 - "$OUT" "$CLIENTS" "$SUMMARY" <<'EOF' || RC=1
# Per operation and size: the clients' operations over the union of
# their phases' windows (a lower bound of the aggregate rate: clients
# that did not start at the same instant only lower it), the sum of
# their own rates, P50 and P99 of every call of every client, and the
# clients' own P99s (max, median).
import json, sys
out, n, summary = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = {}
for c in range(1, n + 1):
    doc = json.load(open(f"{out}/client-{c}.json"))
    for r in doc["rows"]:
        if r.get("system", "kvferry") == "kvferry":
            rows.setdefault((r["op"], r["size"]), []).append(r)
lat = {}
for c in range(1, n + 1):
    for line in open(f"{out}/client-{c}.lat"):
        op, size, us = line.split()
        lat.setdefault((op, int(size)), []).append(float(us))
def q(v, p):  # interpolated, as bench store's own quantiles
    v = sorted(v)
    if not v:
        return 0
    pos = p * (len(v) - 1)
    i = int(pos)
    return v[-1] if i + 1 >= len(v) else v[i] + (v[i + 1] - v[i]) * (pos - i)
res = []
for (op, size), rs in sorted(rows.items()):
    ops = sum(r["ops"] for r in rs)
    win = (max(r["end_unix_ms"] for r in rs) -
           min(r["start_unix_ms"] for r in rs)) / 1e3
    p99 = sorted(r["p99_us"] for r in rs)
    e = {"op": op, "size": size, "clients": len(rs), "ops": ops,
         "window_s": round(win, 3), "ops_per_s": ops / win if win else 0,
         "mb_per_s": ops * size / win / 1e6 if win else 0,
         "sum_client_ops_per_s": sum(r["ops_per_s"] for r in rs),
         "errors": sum(r["errors"] for r in rs),
         "p99_us_max": p99[-1], "p99_us_median": p99[len(p99) // 2],
         "p50_us": q(lat.get((op, size), []), 0.5),
         "p99_us": q(lat.get((op, size), []), 0.99)}
    res.append(e)
    sz = f"{size >> 10}K" if size < 1 << 20 else f"{size >> 20}M"
    print(f"all {op:4s} {sz:>5s} clients {len(rs)} ops/s {e['ops_per_s']:8.1f}"
          f" MB/s {e['mb_per_s']:7.1f} (window {win:.2f} s) errors "
          f"{e['errors']} p50_us {e['p50_us']:.0f} p99_us {e['p99_us']:.0f}"
          f" (clients' p99 max {p99[-1]:.0f} median {e['p99_us_median']:.0f})")
json.dump(res, open(summary, "w"), indent=1)
EOF
if [ -n "$RECORD" ]; then
    python3 - "$SUMMARY" "$RECORD/hosts.json" "$HYPOTHESIS" "$HOSTS" "$NPH" \
        "$CHOSTS" "$CLIENTS" "${RATE:-none}" "$REPLICAS" "$BENCH" \
        "$START" <<'EOF' || RC=1
import json, os, sys
(summary, path, hyp, hosts, nph, chosts, clients, rate, replicas, bench,
 start) = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
            if l.startswith("model name")), "?")
doc = {"experiment": "store gets over simulated hosts (scripts/hosts.sh)",
       "hypothesis": hyp, "storage_hosts": int(hosts),
       "nodes_per_host": int(nph), "client_hosts": int(chosts),
       "clients": int(clients), "rate_per_host_each_way": rate,
       "replicas": int(replicas), "bench_store_args": bench,
       "start_unix_ms": int(start),
       "machine": f"{os.cpu_count()} cores, {cpu}, kernel {os.uname().release}",
       "load_avg_after": open("/proc/loadavg").read().split()[:3],
       "results": json.load(open(summary))}
json.dump(doc, open(path, "w"), indent=1)
EOF
    cat "$OUT"/client-*.lat >"$RECORD/latencies.txt"
fi
exit $RC
