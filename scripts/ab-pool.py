#!/usr/bin/env python3
"""Pools the store and blocks rounds of several scripts/ab-binaries.py runs.

usage: scripts/ab-pool.py OUTDIR [OUTDIR...]
Each OUTDIR holds one run's per-round records: WORKLOAD-before-N.log and
WORKLOAD-after-N.log (bench store's JSON on their stdout), and for the
blocks workloads WORKLOAD-before-N.json and WORKLOAD-after-N.json
(bench blocks' --json; pool only runs of the same --iters), and where
present WORKLOAD-SIDE-N.usage.json (the run's CPU seconds and page faults,
pooled as rows "cpu s" and "page faults k": for those, lower is better,
so a ratio below 1 is the after build spending less). Each round's
after/before ratio of each row is one pair; a row's pooled figures are
the geometric mean of its pairs over every run given and their median,
which one wild pair cannot move (the runs may have met the machine at
different levels: a pair's two runs are back to back, so the ratio
carries over), with a 95 % interval for the geometric mean (percentile
bootstrap over the pairs, fixed seed, so a rerun prints the same), the
pairs' range and the rows' errors. A throughput row is shown within 2 %
of before only where the interval's lower end is 0.98 or more (a cost
row: its upper end 1.02 or less). Runs of one binary pair
only: the COMMITs of the runs must agree where commits.txt is present.
"""
import glob, json, math, os, random, statistics, sys

RESAMPLES = 10000


def store_rows(path):
    text = open(path).read()
    end = text.find("\n--stderr--")
    text = text[:end] if end >= 0 else text
    d = json.loads(text[text.find("{"):])
    return {"%s %dK" % (r["op"], r["size"] >> 10): (r["ops_per_s"], r["errors"])
            for r in d["rows"]}


def blocks_rows(log_path):
    path = log_path[:-len(".log")] + ".json"
    if not os.path.exists(path):
        return {}
    d = json.load(open(path))
    return {"%s %dM" % (r["op"], r["size_bytes"] >> 20): (r["gib_s"], r["mismatches"])
            for r in d["rows"]}


def usage_rows(log_path):
    """The run's CPU seconds and minor faults (thousands), which
    scripts/ab-binaries.py keeps beside the log; errors are not counted."""
    path = log_path[:-len(".log")] + ".usage.json"
    if not os.path.exists(path):
        return {}
    u = json.load(open(path))
    return {"cpu s": (u["cpu_s"], 0), "page faults k": (u["minor_faults"] / 1000, 0)}


def rows(name, path):
    r = store_rows(path) if name.startswith("store") else blocks_rows(path)
    r.update(usage_rows(path))
    return r


def geomean(ratios):
    return math.exp(statistics.fmean(map(math.log, ratios)))


def interval95(ratios):
    """Percentile bootstrap of the geometric mean: the 2.5th and 97.5th
    percentiles of the geometric means of RESAMPLES resamples."""
    rng = random.Random(0)
    logs = [math.log(r) for r in ratios]
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs)))
                   for _ in range(RESAMPLES))
    return math.exp(means[int(0.025 * RESAMPLES)]), math.exp(means[int(0.975 * RESAMPLES) - 1])


def main(dirs):
    commits = {open(c).read() for d in dirs
               for c in [os.path.join(d, "commits.txt")] if os.path.exists(c)}
    if len(commits) > 1:
        sys.exit("ab-pool: the runs compared different builds")
    pairs, errors = {}, {}
    for d in dirs:
        for before in sorted(glob.glob(os.path.join(d, "*-before-*.log"))):
            name = os.path.basename(before).rsplit("-before-", 1)[0]
            after = before.replace("-before-", "-after-")
            if not name.startswith(("store", "blocks")) or not os.path.exists(after):
                continue
            b, a = rows(name, before), rows(name, after)
            for k in b.keys() & a.keys():
                if b[k][0] > 0 and a[k][0] > 0:
                    pairs.setdefault((name, k), []).append(a[k][0] / b[k][0])
                errors[(name, k)] = errors.get((name, k), 0) + b[k][1] + a[k][1]
    print("%-16s %-16s %5s %7s %13s %7s %13s %s" % (
        "workload", "row", "pairs", "paired", "95% interval", "median", "range", "wrong"))
    for (name, k), r in sorted(pairs.items()):
        lo, hi = interval95(r)
        print("%-16s %-16s %5d %6.3fx %6.3f-%.3f %6.3fx %6.3f-%.3f %d" % (
            name, k, len(r), geomean(r), lo, hi, statistics.median(r), min(r), max(r),
            errors[(name, k)]))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
