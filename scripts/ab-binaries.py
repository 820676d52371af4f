#!/usr/bin/env python3
"""Interleaved before/after A/B of two kvferry binaries.

usage: scripts/ab-binaries.py BEFORE_BIN AFTER_BIN ROUNDS OUTDIR
Runs each workload (bench blocks over tcp and the default transport,
bench te over both, bench store alone and --vs-redis, tcp forced) ROUNDS times
per binary, alternating which goes first, and prints each row's median
per side, the after/before ratio and the wrong bytes (mismatches or
errors). Besides throughput, a "cpu" row per workload gives the CPU
seconds of the whole run (the command and the target, master and nodes
it spawned and waited for): for the blocks workloads, which do a fixed
amount of work, a cost that is less sensitive to a shared machine's
scheduling than throughput; the store rows add the bench's own CPU
microseconds per operation ("cpu/op"). A "page faults k" row gives the
minor page faults of the same processes, in thousands: memory the runs
faulted in afresh (docs/security.md, "Page faults"). Both are kept per
run in TAG.usage.json for scripts/ab-pool.py. store-small: 4 KiB
objects, 2 clients, where a per-message cost shows most;
store-small-long: the same over 3 s phases with 64 MiB pools per node
(the put phase then evicts, as a full cache does; docs/security.md
"Measured cost" compares the two). AB_ONLY=name,name limits the
workloads; AB_BLOCKS_ITERS=N sets the blocks workloads' --iters
(default 3); AB_AFTER_ENV="NAME=VALUE ..." is added to the after runs'
environment only (one binary given twice then measures a setting);
AB_PIN=CPULIST runs both builds under taskset -c CPULIST (the processes
they spawn inherit it: fewer migrations, less spread between pairs);
every run's JSON and log stay in OUTDIR.
"""
import json, os, resource, statistics, subprocess, sys, time

before, after, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
os.makedirs(out, exist_ok=True)
env = dict(os.environ)
after_env = dict(kv.split("=", 1) for kv in os.environ.get("AB_AFTER_ENV", "").split())
pin = ["taskset", "-c", os.environ["AB_PIN"]] if os.environ.get("AB_PIN") else []

def run(binary, args, tag, extra_env=None, side_env=None):
    e = dict(env)
    if extra_env:
        e.update(extra_env)
    if side_env:
        e.update(side_env)
    jf = os.path.join(out, tag + ".json")
    args = [a.replace("@JSON@", jf) for a in args]
    t0 = time.time()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(pin + [binary] + args, capture_output=True, text=True,
                       env=e, timeout=900)
    wall = time.time() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    faults = r1.ru_minflt - r0.ru_minflt
    with open(os.path.join(out, tag + ".log"), "w") as f:
        f.write(p.stdout + "\n--stderr--\n" + p.stderr)
    with open(os.path.join(out, tag + ".usage.json"), "w") as f:
        json.dump({"cpu_s": cpu, "minor_faults": faults, "wall_s": wall}, f)
    text = open(jf).read() if os.path.exists(jf) else p.stdout
    i = text.find("{")
    try:
        d = json.loads(text[i:]) if i >= 0 else None
    except Exception:
        d = None
    return p.returncode, d, wall, cpu, faults

def blocks_fig(d):
    r = {}
    for row in d["rows"]:
        r["%s %dM" % (row["op"], row["size_bytes"] >> 20)] = (row["gib_s"], row["mismatches"])
    return r

def te_fig(d):
    return {"%dK" % (row["block_bytes"] >> 10): (row["gb_s"], 0) for row in d["rows"]}

def store_fig(d):
    r = {}
    for row in d["rows"]:
        r["%s %s %dK" % (row["system"], row["op"], row["size"] >> 10)] = (row["ops_per_s"], row["errors"])
        if "cpu_us_per_op" in row:
            r["%s %s %dK cpu/op" % (row["system"], row["op"], row["size"] >> 10)] = (row["cpu_us_per_op"], 0)
    return r

BI = os.environ.get("AB_BLOCKS_ITERS", "3")
W = [
    ("blocks-tcp", ["bench", "blocks", "--op", "both", "--verify", "--transport", "tcp",
                    "--pool", "1G", "--sizes", "16M,64M,256M", "--iters", BI,
                    "--no-link", "--json", "@JSON@"], blocks_fig, None),
    ("blocks-default", ["bench", "blocks", "--op", "both", "--verify",
                        "--pool", "1G", "--sizes", "16M,64M,256M", "--iters", BI,
                        "--no-link", "--json", "@JSON@"], blocks_fig, None),
    ("te", ["bench", "te", "--duration", "0.3s", "--block-sizes", "8K,64K,1M,16M",
            "--json", "@JSON@"], te_fig, None),
    ("te-tcp", ["bench", "te", "--duration", "0.3s", "--block-sizes", "8K,64K,1M,16M",
                "--transport", "tcp", "--json", "@JSON@"], te_fig, None),
    ("store", ["bench", "store", "--sizes", "64K,1M", "--clients", "8",
               "--duration", "1s", "--json"], store_fig, {"KVF_TRANSPORTS": "tcp"}),
    ("store-small", ["bench", "store", "--sizes", "4K", "--clients", "2",
                     "--duration", "1s", "--json"], store_fig, {"KVF_TRANSPORTS": "tcp"}),
    ("store-small-long", ["bench", "store", "--sizes", "4K", "--clients", "2",
                          "--duration", "3s", "--pool", "64M", "--json"], store_fig,
     {"KVF_TRANSPORTS": "tcp"}),
    ("store-redis", ["bench", "store", "--sizes", "64K,1M", "--clients", "8",
                     "--duration", "1s", "--vs-redis", "--json"], store_fig,
     {"KVF_TRANSPORTS": "tcp"}),
]
only = os.environ.get("AB_ONLY")
res = {}
for name, args, fig, xe in W:
    if only and name not in only.split(","):
        continue
    for rd in range(rounds):
        order = [("before", before), ("after", after)]
        if rd % 2:
            order.reverse()
        for side, b in order:
            rc, d, secs, cpu, faults = run(b, args, "%s-%s-%d" % (name, side, rd), xe,
                                           after_env if side == "after" else None)
            if d is None:
                print("%s %s round %d: rc=%d no json" % (name, side, rd, rc), flush=True)
                continue
            for k, (v, bad) in fig(d).items():
                res.setdefault((name, k), {}).setdefault(side, []).append((v, bad))
            res.setdefault((name, "cpu s"), {}).setdefault(side, []).append((cpu, 0))
            res.setdefault((name, "page faults k"), {}).setdefault(side, []).append((faults / 1000, 0))
            print("%s %s round %d rc=%d %.0fs" % (name, side, rd, rc, secs), flush=True)

# "paired": the geometric mean of each round's after/before (the two runs
# of a round are back to back, so slow drifts of a shared machine cancel)
print("\n%-16s %-26s %10s %10s %7s %7s %s" % ("workload", "row", "before", "after",
                                            "ratio", "paired", "wrong"))
summary = []
for (name, k), sides in sorted(res.items()):
    if "before" not in sides or "after" not in sides:
        continue
    mb = statistics.median(v for v, _ in sides["before"])
    ma = statistics.median(v for v, _ in sides["after"])
    pairs = [a / b for (a, _), (b, _) in zip(sides["after"], sides["before"]) if a > 0 and b > 0]
    paired = statistics.geometric_mean(pairs) if pairs else 0
    bad = sum(b for v, b in sides["before"] + sides["after"])
    line = "%-16s %-26s %10.3f %10.3f %6.2fx %6.3fx %d" % (
        name, k, mb, ma, ma / mb if mb else 0, paired, bad)
    print(line)
    summary.append(line)
open(os.path.join(out, "summary.txt"), "w").write("\n".join(summary) + "\n")
