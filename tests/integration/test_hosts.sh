#!/usr/bin/env bash
# Integration test of scripts/hosts.sh and of the store's placement over
# hosts: two simulated hosts (network namespaces on a bridge), two nodes
# on each, replicas 2, one shared cluster secret.
#  - data: objects put from each host are read back byte for byte from
#    each host (kvferry put/get, sha256), and a short `bench store` run
#    from a host verifies every get;
#  - placement: every object has one replica on each host (the master's
#    /status: each host's nodes hold the same bytes, half of all the
#    replicas' bytes; with two nodes per host a choice by node alone
#    puts both replicas on one host now and then);
#  - local replica: gets from a host read its own replicas, so the other
#    host sends (almost) nothing meanwhile (the bridge's veth counters);
#  - clean-up: after a normal run, a failing command and a SIGTERM, no
#    namespace, veth or process of the run is left.
# Needs root (network namespaces): exit 77 without it.
set -uo pipefail

SRC=${KVF_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${KVF_BIN:-$SRC/build/kvferry}

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# ---- inside the cluster (run by hosts.sh as its COMMAND) ----
if [ "${1:-}" = "--inside" ]; then
    set -e
    read -r -a NS <<<"$HOSTS_NS"
    read -r -a IPS <<<"$HOSTS_IPS"
    W=$HOSTS_OUT/t
    mkdir -p "$W"
    echo "$HOSTS_SW ${NS[*]}" >"$W/../namespaces"
    for ns in "$HOSTS_SW" "${NS[@]}"; do
        ip netns pids "$ns"
    done >"$W/../pids"
    kv() { # kv HOST-INDEX ARGS...: kvferry on that host
        local h=$1
        shift
        ip netns exec "${NS[$h]}" "$KVFERRY" "$@"
    }
    status() {
        ip netns exec "$HOSTS_SW" true # the switch namespace is alive
        ip netns exec "${NS[0]}" curl -sf --noproxy '*' \
            -H "Authorization: Bearer $HOSTS_TOKEN" "http://$HOSTS_HTTP/status"
    }
    sent() { # bytes host h sent: what the bridge's end of its veth got
        ip -n "$HOSTS_SW" -s -j link show "vh$(($1 + 1))" |
            python3 -c 'import json,sys;print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])'
    }

    # puts from both hosts, odd sizes
    total=0
    for h in 0 1; do
        for k in $(seq 8); do
            size=$(((k * 37813 + h * 9001) % 300000 + 1))
            head -c "$size" /dev/urandom >"$W/h$h-$k"
            kv $h put --master "$HOSTS_MASTER" --replicas 2 "t/h$h/$k" \
                "$W/h$h-$k" >/dev/null || fail "put t/h$h/$k"
            total=$((total + size))
        done
    done
    kv 0 ls --master "$HOSTS_MASTER" t/ >"$W/ls"
    n2=$(awk '$2 == 2' "$W/ls" | wc -l)
    [ "$n2" -eq 16 ] || fail "$n2 of 16 objects have 2 replicas: $(cat "$W/ls")"

    # placement: each host holds one replica of every object
    status >"$W/status.json" || fail "no /status"
    python3 - "$W/status.json" "$total" "${IPS[@]}" <<'EOF' || exit 1
import json, sys
st = json.load(open(sys.argv[1]))
total, ips = int(sys.argv[2]), sys.argv[3:]
used = {ip: 0 for ip in ips}
for n in st["node_list"]:
    used[n["segment"].rsplit(":", 1)[0]] += n["used"]
print("used per host:", used, "objects' bytes:", total)
vals = list(used.values())
if vals[0] != vals[1] or vals[0] < total or vals[0] > total + 16 * 64:
    sys.exit(f"FAIL: replicas not one per host: {used}, objects {total}")
EOF

    # gets from each host: its own replicas, byte for byte
    for h in 0 1; do
        o=$((1 - h))
        before=$(sent $o)
        for g in 0 1; do
            for k in $(seq 8); do
                kv $h get --master "$HOSTS_MASTER" "t/h$g/$k" "$W/got" ||
                    fail "get t/h$g/$k from host $h"
                cmp -s "$W/got" "$W/h$g-$k" || fail "t/h$g/$k: wrong bytes"
            done
        done
        other=$(($(sent $o) - before))
        echo "gets from host $h: host $o sent $other bytes for $total"
        [ "$other" -lt $((total / 10)) ] ||
            fail "host $h read $other bytes from host $o, not its own replicas"
    done

    # a short bench from host 2 (every get verified)
    kv 1 bench store --master "$HOSTS_MASTER" --http "$HOSTS_HTTP" \
        --sizes 64K --clients 2 --duration 300ms --hit-ratio 1 --replicas 2 \
        --json >"$W/bench.json" || fail "bench store"
    python3 - "$W/bench.json" <<'EOF' || exit 1
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert {r["op"] for r in rows} == {"put", "get"}, rows
for r in rows:
    if r["errors"] or r["ops"] == 0:
        sys.exit(f"FAIL: bench {r['op']}: {r['ops']} ops, {r['errors']} errors")
print("bench:", ", ".join(f"{r['op']} {r['ops']} ops" for r in rows))
EOF
    echo "inside: ok"
    exit 0
fi

# ---- the runs ----
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root"; exit 77; }
command -v ip >/dev/null && command -v tc >/dev/null ||
    { echo "SKIP: iproute2 missing"; exit 77; }
command -v curl >/dev/null || { echo "SKIP: curl missing"; exit 77; }
[ -x "$BIN" ] || fail "no kvferry at $BIN (KVF_BIN)"

OUT=$(mktemp -d /tmp/kvf_hosts_test.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

# nothing of the run left: namespaces, veths (they go with their
# namespace), processes
left_behind() {
    local ns pid
    for ns in $(cat "$1/namespaces" 2>/dev/null); do
        ip netns list | awk '{print $1}' | grep -qx "$ns" &&
            fail "namespace $ns left behind"
    done
    for pid in $(cat "$1/pids" 2>/dev/null); do
        kill -0 "$pid" 2>/dev/null && fail "process $pid left behind"
    done
    return 0
}

"$SRC/scripts/hosts.sh" --kvferry "$BIN" --hosts 2 --nodes-per-host 2 \
    --client-hosts 0 --replicas 2 --pool 32M --rate 1gbit --out "$OUT/run" \
    -- "$0" --inside
rc=$?
[ $rc -eq 77 ] && { echo "SKIP: namespaces unavailable"; exit 77; }
[ $rc -eq 0 ] || fail "hosts.sh run: exit $rc"
[ -s "$OUT/run/namespaces" ] || fail "the check did not run"
left_behind "$OUT/run"

# a failing command: its status, and clean-up
"$SRC/scripts/hosts.sh" --kvferry "$BIN" --hosts 1 --client-hosts 1 \
    --pool 16M --out "$OUT/fail" -- bash -c \
    'echo "$HOSTS_SW $HOSTS_NS $HOSTS_CLIENT_NS" >"$HOSTS_OUT/namespaces";
     for n in $HOSTS_SW $HOSTS_NS; do ip netns pids $n; done \
         >"$HOSTS_OUT/pids"; exit 3'
rc=$?
[ $rc -eq 3 ] || fail "a failing command: hosts.sh exit $rc, not 3"
left_behind "$OUT/fail"

# SIGTERM while the cluster runs
"$SRC/scripts/hosts.sh" --kvferry "$BIN" --hosts 1 --client-hosts 1 \
    --pool 16M --out "$OUT/term" -- bash -c \
    'echo "$HOSTS_SW $HOSTS_NS $HOSTS_CLIENT_NS" >"$HOSTS_OUT/namespaces";
     for n in $HOSTS_SW $HOSTS_NS; do ip netns pids $n; done \
         >"$HOSTS_OUT/pids"; sleep 60' &
pid=$!
for _ in $(seq 200); do
    [ -s "$OUT/term/pids" ] && break
    sleep 0.1
done
[ -s "$OUT/term/pids" ] || fail "the SIGTERM run did not start"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -ne 0 ] || fail "hosts.sh ended 0 after SIGTERM"
left_behind "$OUT/term"
echo "PASS"
