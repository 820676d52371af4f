#!/usr/bin/env bash
# Starts and stops a throw-away etcd for tests and drills: one member on
# 127.0.0.1, free ports, data in DIR (a temporary folder the caller owns).
#
#   scripts/etcd.sh start DIR   prints the client endpoint (127.0.0.1:PORT)
#                               once etcd answers; its pid is DIR/etcd.pid
#   scripts/etcd.sh stop DIR    stops it (SIGTERM, then SIGKILL after 3 s)
#   scripts/etcd.sh have        exit 0 if etcd is installed, 77 if not
#
# Exit 77 (skip) when etcd is not installed, 1 when it does not start
# within 10 s (its log is DIR/etcd.log).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
etcd_bin=$(command -v etcd || true)
[ -n "$etcd_bin" ] || [ ! -x /usr/bin/etcd ] || etcd_bin=/usr/bin/etcd

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

case "$cmd" in
  have)
    [ -n "$etcd_bin" ] || exit 77
    ;;
  start)
    [ -n "$etcd_bin" ] || { echo "etcd.sh: etcd is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
    [ -n "$dir" ] || { echo "etcd.sh: start needs a folder" >&2; exit 2; }
    mkdir -p "$dir"
    cport=$(free_port)
    pport=$(free_port)
    while [ "$pport" = "$cport" ]; do pport=$(free_port); done
    "$etcd_bin" --name kvf-test --data-dir "$dir/data" \
      --listen-client-urls "http://127.0.0.1:$cport" \
      --advertise-client-urls "http://127.0.0.1:$cport" \
      --listen-peer-urls "http://127.0.0.1:$pport" \
      --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
      --initial-cluster "kvf-test=http://127.0.0.1:$pport" \
      --heartbeat-interval 20 --election-timeout 200 \
      --log-level error >"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/etcd.pid"
    for _ in $(seq 100); do
      if python3 -c 'import sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1], data=b"{\"key\":\"AA==\"}"), timeout=1)' \
           "http://127.0.0.1:$cport/v3/kv/range" >/dev/null 2>&1; then
        echo "127.0.0.1:$cport"
        exit 0
      fi
      kill -0 "$(cat "$dir/etcd.pid")" 2>/dev/null || break
      sleep 0.1
    done
    echo "etcd.sh: etcd did not start; last lines of $dir/etcd.log:" >&2
    tail -n 5 "$dir/etcd.log" >&2 || true
    kill "$(cat "$dir/etcd.pid")" 2>/dev/null || true
    exit 1
    ;;
  stop)
    [ -f "$dir/etcd.pid" ] || exit 0
    pid=$(cat "$dir/etcd.pid")
    kill -CONT "$pid" 2>/dev/null || true
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 30); do
      kill -0 "$pid" 2>/dev/null || { rm -f "$dir/etcd.pid"; exit 0; }
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/etcd.pid"
    ;;
  *)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
