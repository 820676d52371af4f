#!/usr/bin/env python3
"""Pools the store and blocks rounds of several scripts/ab-binaries.py runs.

usage: scripts/ab-pool.py OUTDIR [OUTDIR...]
Each OUTDIR holds one run's per-round records: WORKLOAD-before-N.log and
WORKLOAD-after-N.log (bench store's JSON on their stdout), and for the
blocks workloads WORKLOAD-before-N.json and WORKLOAD-after-N.json
(bench blocks' --json; pool only runs of the same --iters). Each round's
after/before ratio of each row is one pair; a row's pooled figures are
the geometric mean of its pairs over every run given and their median,
which one wild pair cannot move (the runs may have met the machine at
different levels: a pair's two runs are back to back, so the ratio
carries over), with the pairs' range and the rows' errors. Runs of one binary pair only: the COMMITs of the runs must
agree where commits.txt is present.
"""
import glob, json, math, os, statistics, sys


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


def rows(name, path):
    return store_rows(path) if name.startswith("store") else blocks_rows(path)


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
    print("%-16s %-16s %5s %7s %7s %15s %s" % ("workload", "row", "pairs", "paired",
                                              "median", "range", "wrong"))
    for (name, k), r in sorted(pairs.items()):
        g = math.exp(sum(map(math.log, r)) / len(r))
        print("%-16s %-16s %5d %6.3fx %6.3fx %7.3f-%.3f %d" % (
            name, k, len(r), g, statistics.median(r), min(r), max(r),
            errors[(name, k)]))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
