#!/bin/sh
# Seed 000's workload over the ucx transport (`kvferry bench blocks
# --transport ucx --op both`) for several worker counts (ucx_workers) and
# progress-thread polling times (ucx_spin_us), in interleaved rounds of
# one run, each block figure next to its own ceiling (`bench link`'s
# contiguous transfer of the same bytes over the same workers, measured
# before each iteration). Writes one JSON and one record per run, and
# summary.md: per configuration, op and size, the median over the rounds
# of the block GB/s, the ceiling and their ratio.
#
# Usage, from the repository root, with a built build/kvferry:
#   scripts/bench-ucx-workers.sh OUTDIR [ROUNDS] [CONFIGS]
# CONFIGS: "workers:spin_us ..." (default "1:0 2:0 4:0 8:0 4:50").
# UCX_TLS defaults to tcp,self (UCX's tcp transport on loopback).
# KVF_BIN overrides the binary, KVF_BENCH_ARGS adds bench blocks options
# (default --pool 2G).
set -eu

out=${1:?usage: $0 OUTDIR [ROUNDS] [CONFIGS]}
rounds=${2:-1}
configs=${3:-"1:0 2:0 4:0 8:0 4:50"}
bin=${KVF_BIN:-build/kvferry}
args=${KVF_BENCH_ARGS:---pool 2G}
export UCX_TLS="${UCX_TLS:-tcp,self}"

mkdir -p "$out"
"$bin" bench env >"$out/env.txt" 2>&1 || true
r=1
while [ "$r" -le "$rounds" ]; do
    for c in $configs; do
        w=${c%%:*}
        s=${c#*:}
        name="w$w-s$s-r$r"
        echo "round $r: ucx_workers=$w ucx_spin_us=$s" >&2
        # shellcheck disable=SC2086
        KVF_UCX_WORKERS=$w KVF_UCX_SPIN_US=$s "$bin" bench blocks \
            --transport ucx --op both $args --quiet \
            --json "$out/$name.json" --record "$out/records" \
            >"$out/$name.txt" 2>&1 || echo "  $name failed" >&2
    done
    r=$((r + 1))
done

python3 - "$out" <<'EOF'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, "w*-s*-r*.json"))):
    m = re.match(r"w(\d+)-s(\d+)-r\d+\.json", os.path.basename(f))
    try:
        d = json.load(open(f))
    except ValueError:
        continue
    for row in d.get("rows", []):
        key = (int(m.group(1)), int(m.group(2)), row["op"], row["size_bytes"])
        runs.setdefault(key, []).append(row)
lines = ["# ucx: blocks vs ceiling per worker count",
         "",
         "UCX_TLS=%s; median over rounds; GB/s = GiB/s as bench prints"
         % os.environ.get("UCX_TLS", ""),
         "",
         "| workers | spin us | op | size | blocks GB/s | ceiling GB/s "
         "| % of ceiling | rounds |",
         "|---|---|---|---|---|---|---|---|"]
for key in sorted(runs):
    rows = runs[key]
    g = statistics.median(r["gib_s"] for r in rows)
    l = statistics.median(r["link_gib_s"] for r in rows)
    p = statistics.median(r["link_ratio"] for r in rows)
    lines.append("| %d | %d | %s | %d MB | %.2f | %.2f | %.0f %% | %d |"
                 % (key[0], key[1], key[2], key[3] >> 20, g, l, 100 * p,
                    len(rows)))
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
