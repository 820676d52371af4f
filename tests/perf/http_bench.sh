#!/bin/sh
# The master's HTTP endpoint under load and with idle connections: for
# each kvferry binary given, starts a master (no nodes), then measures
# requests/s of /status and /metrics with wrk (1 and 8 connections, 5 s
# each; then /status with a new connection per request) and the time of one /status while 20 idle connections are open.
# Binaries alternate per round so that machine noise falls on all.
# Usage: tests/perf/http_bench.sh ROUNDS KVFERRY_BIN...
# Requests carry the bearer token of the cluster secret ($KVF_SECRET_FILE,
# else the automatic $HOME/.kvferry/secret), which the master asks for.
set -eu
rounds=$1
shift
port=18900
for r in $(seq 1 "$rounds"); do
  for bin in "$@"; do
    port=$((port + 2))
    "$bin" master --listen 127.0.0.1:$port --http 127.0.0.1:$((port + 1)) \
      >/dev/null 2>&1 &
    pid=$!
    url=http://127.0.0.1:$((port + 1))
    i=0
    until [ -f "${KVF_SECRET_FILE:-$HOME/.kvferry/secret}" ] &&
      auth="Authorization: Bearer $(python3 -c 'import hmac,hashlib,sys
print(hmac.new(open(sys.argv[1],"rb").read(),b"kvferry-http-v1",hashlib.sha256).hexdigest())' "${KVF_SECRET_FILE:-$HOME/.kvferry/secret}")" &&
      curl -sf -o /dev/null -H "$auth" "$url/status"; do
      i=$((i + 1)); [ $i -lt 100 ] || { echo "no master"; exit 1; }
      sleep 0.05
    done
    for path in /status /metrics; do
      for c in 1 8; do
        rps=$(wrk -t1 -c$c -d5s -H "$auth" "$url$path" | awk '/Requests\/sec/ {print $2}')
        echo "round $r $bin $path c=$c req/s $rps"
      done
    done
    rps=$(wrk -t1 -c8 -d5s -H 'Connection: close' -H "$auth" "$url/status" |
          awk '/Requests\/sec/ {print $2}')
    echo "round $r $bin /status c=8 new connection per request req/s $rps"
    # 20 idle connections (connected, nothing sent), then one /status
    python3 - "$((port + 1))" "$bin" "$r" "$auth" <<'PY'
import socket, subprocess, sys, time
port, binname, rnd, auth = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
t0 = time.monotonic()
out = subprocess.run(["curl", "-s", "-m", "60", "-H", auth, "-o", "/dev/null", "-w",
                      "%{http_code}", f"http://127.0.0.1:{port}/status"],
                     capture_output=True, text=True).stdout
print(f"round {rnd} {binname} /status with 20 idle: "
      f"{time.monotonic() - t0:.3f} s, code {out}")
for s in idle:
    s.close()
PY
    kill "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
