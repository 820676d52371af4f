#!/usr/bin/env bash
# The store against Redis on this host, in the same run (issue 5 targets):
#   1. tcp forced (KVF_TRANSPORTS=tcp), 64 KiB and 1 MiB objects, 8
#      clients: store get/put throughput >= Redis GET/SET, P99 no worse;
#   2. the default transport choice: store get throughput >= 2x Redis GET.
# `kvferry bench store --vs-redis` starts redis-server (loopback, its own
# port, no persistence) and redis-benchmark (-t set,get -d SIZE -c 8) with
# the same sizes and clients, prints the ratios and writes the records.
#
# usage: scripts/bench-store-vs-redis.sh [RECORD_DIR]
#   env: KVF_BIN (default build/kvferry), DURATION (per phase, default 3s),
#        SIZES (default 64K,1M), CLIENTS (default 8), REPEAT (runs of
#        each comparison, alternating kvferry and Redis; the verdict takes
#        the median ratio; default 3); store knobs pass through the
#        environment (e.g. KVF_LEASE_READS=1, KVF_NODE_CONNS,
#        KVF_NODE_CHUNK) and each record lists the ones in effect
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${KVF_BIN:-build/kvferry}
out=${1:-records}
dur=${DURATION:-3s}
sizes=${SIZES:-64K,1M}
clients=${CLIENTS:-8}
repeat=${REPEAT:-3}
for t in redis-server redis-benchmark; do
  if ! command -v "$t" >/dev/null; then
    echo "$t not found: apt-get install redis-server redis-tools" >&2
    exit 1
  fi
done
if [ ! -x "$bin" ]; then
  echo "$bin not built (scripts/setup.sh builds it)" >&2
  exit 1
fi
mkdir -p "$out"
echo "== tcp forced"
KVF_TRANSPORTS=tcp "$bin" bench store --sizes "$sizes" --clients "$clients" \
  --hit-ratio 1 --duration "$dur" --vs-redis --repeat "$repeat" \
  --record "$out"
echo "== default transport choice"
env -u KVF_TRANSPORTS "$bin" bench store --sizes "$sizes" \
  --clients "$clients" --hit-ratio 1 --duration "$dur" --vs-redis \
  --repeat "$repeat" --record "$out"
