#!/usr/bin/env bash
# Connection floods: 10,000 idle and 10,000 slow connections (one byte
# every 2 s) from 127.0.0.2 against an engine target, then against the
# store master, while a real client from 127.0.0.1 is timed (target:
# engine peer open + one verified 8 KiB read; master: store connect +
# 8 KiB put + verified get), and the server's RSS, threads and fds are
# sampled before, during (largest) and after. Writes DIR/flood.json and
# DIR/flood.md; docs/security.md ("Connection floods") shows a run.
#
#   scripts/bench-flood.sh [--build DIR] [--conns N] [--hold-s S] [--out DIR]
#
# Needs the build's kvferry and tests/flood_bench (ninja flood_bench), and
# a hard descriptor limit of at least conns + 1024 (one process floods
# with the idle connections, another with the slow ones).
set -euo pipefail

build=build
conns=10000
hold=12
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --conns) conns=$2; shift 2 ;;
    --hold-s) hold=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "bench-flood: unknown argument $1" >&2; exit 2 ;;
  esac
done
kvf=$build/kvferry
fb=$build/tests/flood_bench
for f in "$kvf" "$fb"; do
  [ -x "$f" ] || { echo "bench-flood: $f missing (ninja -C $build)" >&2; exit 2; }
done
work=$(mktemp -d /tmp/kvferry-flood-XXXXXX)
out=${out:-$work}
mkdir -p "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# one cluster secret for every process of the run
if [ -z "${KVF_SECRET_FILE:-}" ]; then
  head -c 32 /dev/urandom > "$work/secret"
  chmod 600 "$work/secret"
  export KVF_SECRET_FILE=$work/secret
fi

# start NAME CMD... : runs it with stdout to a file, waits for its first
# line; the line in $line, the pid in $pid
start() {
  local name=$1; shift
  "$@" > "$work/$name.out" 2> "$work/$name.log" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 100); do
    [ -s "$work/$name.out" ] && break
    sleep 0.1
  done
  line=$(head -1 "$work/$name.out")
  [ -n "$line" ] || { echo "bench-flood: $name did not start:" >&2; cat "$work/$name.log" >&2; exit 1; }
}
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }

start target "$kvf" target --listen 127.0.0.1:0 --pool 64M --seed 7
tpid=$pid
seg=$(field segment "$line")
start master "$kvf" master --listen 127.0.0.1:0 --http 127.0.0.1:0
mpid=$pid
maddr=$(field master "$line")
start node "$kvf" node --pool 64M --master "$maddr" --listen 127.0.0.1:0
sleep 1

echo "bench-flood: target $seg (pid $tpid), master $maddr (pid $mpid), $conns idle + $conns slow connections each, ${hold}s" >&2
"$fb" target "$seg" 7 "$tpid" --conns "$conns" --hold-s "$hold" > "$work/target.json"
"$fb" master "$maddr" "$mpid" --conns "$conns" --hold-s "$hold" > "$work/master.json"

{
  printf '{"bench":"flood","date":"%s","host":"%s","kernel":"%s","kvferry":"%s","runs":[' \
    "$(date -u +%FT%TZ)" "$(hostname)" "$(uname -r)" "$("$kvf" version | head -1)"
  cat "$work/target.json"; printf ','; cat "$work/master.json"; printf ']}\n'
} > "$out/flood.json"

python3 - "$out/flood.json" > "$out/flood.md" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("# bench flood\n")
print(f"{r['date']} on {r['host']} (kernel {r['kernel']}), {r['kvferry']}.\n")
print("Flood from 127.0.0.2 (idle connections and slow ones sending one byte"
      " every 2 s, each reopened when the server closes it); a real client"
      " from 127.0.0.1 timed once a second during the flood. Target: served"
      " within 1 s, memory and threads bounded.\n")
print("| server | idle + slow | opened | closed by server | most open at once"
      " | client before | during mean / max (n, failed) | after |"
      " RSS KiB before / during / after | threads | fds |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for s in r["runs"]:
    print(f"| {s['server']} | {s['conns_idle']} + {s['conns_slow']} | {s['opened']}"
          f" | {s['closed_by_server']} | {s['open_max']} | {s['probe_before_ms']:.1f} ms"
          f" | {s['probe_during_mean_ms']:.1f} / {s['probe_during_max_ms']:.1f} ms"
          f" ({s['probes_during']}, {s['probes_during_failed']})"
          f" | {s['probe_after_ms']:.1f} ms"
          f" | {' / '.join(str(int(x)) for x in s['rss_kb'])}"
          f" | {' / '.join(str(int(x)) for x in s['threads'])}"
          f" | {' / '.join(str(int(x)) for x in s['fds'])} |")
ok = all(s["probes_during_failed"] == 0 and s["probe_during_max_ms"] <= 1000
         for s in r["runs"])
print(f"\nConclusion: {'holds' if ok else 'does not hold'} (every client call"
      " during the flood served within 1 s).")
EOF
cat "$out/flood.md"
echo "bench-flood: record in $out/flood.json and $out/flood.md" >&2
