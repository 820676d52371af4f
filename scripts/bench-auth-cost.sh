#!/usr/bin/env bash
# What authentication costs: one kvferry binary run with the cluster
# secret (the default: mutual HMAC-SHA256 handshake at connect) and with
# KVF_INSECURE=1 (no handshake), rounds interleaved through
# scripts/ab-binaries.py (bench blocks and bench te over tcp and the
# default transport, bench store with tcp forced). "before" is insecure,
# "after" authenticated: the ratio column is the authenticated figure
# over the unauthenticated one. docs/security.md shows a run.
#
#   scripts/bench-auth-cost.sh KVFERRY ROUNDS OUTDIR
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,10p' "$0"; exit 2; }
bin=$(realpath "$1") rounds=$2 out=$3
mkdir -p "$out"
cat >"$out/insecure.sh" <<WRAP
#!/bin/sh
KVF_INSECURE=1 exec "$bin" "\$@"
WRAP
chmod +x "$out/insecure.sh"
AB_ONLY=${AB_ONLY:-blocks-tcp,blocks-default,te,te-tcp,store} \
    exec python3 "$(dirname "$0")/ab-binaries.py" "$out/insecure.sh" "$bin" \
    "$rounds" "$out"
