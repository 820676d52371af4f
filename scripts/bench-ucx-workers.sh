#!/bin/sh
# Seed 000's workload over the ucx transport (`kvferry bench blocks
# --transport ucx --op both`) for several worker counts (ucx_workers),
# progress-thread polling times (ucx_spin_us), UCX tcp segment sizes
# (ucx_tcp_seg, 0: UCX's own 8K), read modes (ucx_read_mode: get,
# push or auto) and write modes (ucx_write_mode: put, push or auto), in
# interleaved rounds of one run, each block figure next to its own ceiling (`bench link`'s
# contiguous transfer of the same bytes over the same workers, measured
# before each iteration). Writes one JSON and one record per run, and
# summary.md: per configuration, op and size, the median over the rounds
# of the block GB/s, the ceiling and their ratio.
#
# Usage, from the repository root, with a built build/kvferry:
#   scripts/bench-ucx-workers.sh OUTDIR [ROUNDS] [CONFIGS]
# CONFIGS: "workers:spin_us:tcp_seg[:read_mode[:write_mode]] ..."
# (modes: auto when left out; default "1:0:0:get:put 2:0:9K:get:put
# 2:0:9K:push:put 2:0:9K:push:push 4:0:9K:push:push 8:0:9K:push:push";
# 1:0:0:get:put is the transport before several workers, the segment
# size and the active messages), e.g. "2:0:9K:push:put 2:0:9K:push:push
# 4:0:9K:push:push" compares the write modes.
# UCX_TLS defaults to tcp,self (UCX's tcp transport on loopback).
# KVF_BIN overrides the binary, KVF_BENCH_ARGS adds bench blocks options
# (default --pool 2G), BUDGET_S (default 180) is the time after which no
# further run starts (the summary covers the runs done).
set -eu

out=${1:?usage: $0 OUTDIR [ROUNDS] [CONFIGS]}
rounds=${2:-1}
configs=${3:-"1:0:0:get:put 2:0:9K:get:put 2:0:9K:push:put 2:0:9K:push:push 4:0:9K:push:push 8:0:9K:push:push"}
bin=${KVF_BIN:-build/kvferry}
args=${KVF_BENCH_ARGS:---pool 2G}
budget=${BUDGET_S:-180}
export UCX_TLS="${UCX_TLS:-tcp,self}"
# UCX's tcp transport takes peers without the secret: an opt-in
# (docs/ucx.md, Security); a benchmark on loopback accepts it
export KVF_UCX_TCP="${KVF_UCX_TCP:-1}"
start=$(date +%s)

mkdir -p "$out"
"$bin" bench env >"$out/env.txt" 2>&1 || true
r=1
while [ "$r" -le "$rounds" ]; do
    for c in $configs; do
        w=${c%%:*}
        s=${c#*:}
        g=${s#*:}
        s=${s%%:*}
        m=auto
        x=auto
        case $g in *:*)
            m=${g#*:}
            g=${g%%:*}
            ;;
        esac
        case $m in *:*)
            x=${m#*:}
            m=${m%%:*}
            ;;
        esac
        name="w$w-s$s-g$g-m$m-x$x-r$r"
        if [ $(($(date +%s) - start)) -ge "$budget" ]; then
            echo "time budget of ${budget}s spent: $name not run" >&2
            continue
        fi
        echo "round $r: ucx_workers=$w ucx_spin_us=$s ucx_tcp_seg=$g" \
            "ucx_read_mode=$m ucx_write_mode=$x" >&2
        # shellcheck disable=SC2086
        KVF_UCX_WORKERS=$w KVF_UCX_SPIN_US=$s KVF_UCX_TCP_SEG=$g \
            KVF_UCX_READ_MODE=$m KVF_UCX_WRITE_MODE=$x \
            "$bin" bench blocks \
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
for f in sorted(glob.glob(os.path.join(out, "w*-s*-g*-r*.json"))):
    m = re.match(r"w(\d+)-s(\d+)-g(\w+)(?:-m(\w+))?(?:-x(\w+))?-r\d+\.json",
                 os.path.basename(f))
    try:
        d = json.load(open(f))
    except ValueError:
        continue
    for row in d.get("rows", []):
        key = (int(m.group(1)), int(m.group(2)), m.group(3),
               m.group(4) or "auto", m.group(5) or "auto", row["op"],
               row["size_bytes"])
        runs.setdefault(key, []).append(row)
lines = ["# ucx: blocks vs ceiling per worker count",
         "",
         "UCX_TLS=%s; median over rounds; GB/s = GiB/s as bench prints"
         % os.environ.get("UCX_TLS", ""),
         "",
         "| workers | spin us | tcp seg | read mode | write mode | op | size "
         "| blocks GB/s | ceiling GB/s | % of ceiling | rounds |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
for key in sorted(runs):
    rows = runs[key]
    g = statistics.median(r["gib_s"] for r in rows)
    l = statistics.median(r["link_gib_s"] for r in rows)
    p = statistics.median(r["link_ratio"] for r in rows)
    lines.append("| %d | %d | %s | %s | %s | %s | %d MB | %.2f | %.2f "
                 "| %.0f %% | %d |" % (key[0], key[1], key[2], key[3], key[4],
                                      key[5], key[6] >> 20, g, l, 100 * p,
                                      len(rows)))
# the same, one row per op and size, one column per configuration
confs = sorted({k[:5] for k in runs})
cells = sorted({k[5:] for k in runs}, key=lambda k: (k[0] != "write", k[1]))
lines += ["", "blocks GB/s / ceiling GB/s = share, per configuration "
          "(workers:spin_us:tcp_seg:read_mode:write_mode):", "",
          "| op | size | " + " | ".join("%d:%d:%s:%s:%s" % c for c in confs)
          + " |",
          "|---|---|" + "---|" * len(confs)]
for op, size in cells:
    row = []
    for c in confs:
        rows = runs.get(c + (op, size), [])
        if not rows:
            row.append("-")
            continue
        row.append("%.2f / %.2f = %.0f %%" % (
            statistics.median(r["gib_s"] for r in rows),
            statistics.median(r["link_gib_s"] for r in rows),
            100 * statistics.median(r["link_ratio"] for r in rows)))
    lines.append("| %s | %d MB | %s |" % (op, size >> 20, " | ".join(row)))
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
