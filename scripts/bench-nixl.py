#!/usr/bin/env python3
"""Seed 000's workload through NIXL's UCX backend and kvferry's ucx
transport, side by side in one run.

Two processes on this host (an initiator and a target agent), each with a
pool of --pool bytes; for each transfer size, random non-overlapping
--block blocks on both sides are moved in one NIXL transfer with one
descriptor per block (how NIXL is used by the connectors of seed 000),
READ and WRITE, the median of --iters kept. Then the same sizes through
`kvferry bench blocks --transport ucx` (the same UCX_TLS), and one table:

  size | op | NIXL GB/s | kvferry ucx GB/s | ratio

NIXL comes from PyPI (`nixl-cu13`, its bundled UCX; it runs without a GPU
on host memory). Usage, from the repository root:

  python3 -m venv .venv-nixl && .venv-nixl/bin/pip install nixl-cu13
  UCX_TLS=tcp KVF_UCX_TCP=1 .venv-nixl/bin/python scripts/bench-nixl.py \\
      [--kvferry build/kvferry] [--pool 2G] [--sizes 16M,64M,256M,1G] \\
      [--out DIR]

--out DIR writes nixl-vs-kvferry.json and .md there.
"""
import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import time

import numpy as np

try:
    from nixl_cu13._api import nixl_agent, nixl_agent_config
except ImportError:  # the CUDA 12 wheel, or a source build
    from nixl._api import nixl_agent, nixl_agent_config

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text):
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def fmt(n):
    for unit, mult in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= mult:
            return "%.1f %s" % (n / mult, unit)
    return "%d B" % n


def target_main(pool_len, conn):
    agent = nixl_agent("kvf-nixl-target", nixl_agent_config(backends=["UCX"]))
    pool = np.ones(pool_len, dtype=np.uint8)
    addr = pool.ctypes.data
    agent.register_memory([(addr, pool_len, 0, "")], "DRAM")
    conn.send((agent.get_agent_metadata(), addr))
    conn.recv()  # the initiator is done
    conn.close()


def pick(rng, slots, n):
    return rng.sample(range(slots), n)


def nixl_run(agent, peer, laddr, raddr, pool_len, block, total, op, iters,
             seed):
    rng = random.Random(seed)
    slots = pool_len // block
    n = total // block
    secs = []
    for _ in range(iters):
        lo = pick(rng, slots, n)
        ro = pick(rng, slots, n)
        local = agent.get_xfer_descs(
            [(laddr + i * block, block, 0) for i in lo], "DRAM")
        remote = agent.get_xfer_descs(
            [(raddr + i * block, block, 0) for i in ro], "DRAM")
        t0 = time.perf_counter()
        handle = agent.initialize_xfer(op, local, remote, peer, b"")
        state = agent.transfer(handle)
        while state not in ("DONE", "ERR"):
            state = agent.check_xfer_state(handle)
        secs.append(time.perf_counter() - t0)
        agent.release_xfer_handle(handle)
        if state == "ERR":
            raise RuntimeError("NIXL transfer failed")
    return total / statistics.median(secs) / 1e9


def nixl_all(args, sizes):
    parent, child = mp.Pipe()
    proc = mp.Process(target=target_main, args=(args.pool, child))
    proc.start()
    meta, raddr = parent.recv()
    agent = nixl_agent("kvf-nixl-init", nixl_agent_config(backends=["UCX"]))
    pool = np.zeros(args.pool, dtype=np.uint8)
    laddr = pool.ctypes.data
    agent.register_memory([(laddr, args.pool, 0, "")], "DRAM")
    peer = agent.add_remote_agent(meta)
    out = {}
    try:
        # connect (NIXL wires up on the first transfer), not timed
        nixl_run(agent, peer, laddr, raddr, args.pool, args.block,
                 64 * args.block, "WRITE", 1, 0)
        for op in ("WRITE", "READ"):
            for s in sizes:
                gbs = nixl_run(agent, peer, laddr, raddr, args.pool,
                               args.block, s, op, args.iters, 1)
                out[(op, s)] = gbs
                print("nixl %-5s %9s %7.2f GB/s" % (op, fmt(s), gbs),
                      file=sys.stderr)
    finally:
        parent.send("done")
        proc.join(30)
    return out


def kvferry_all(args, sizes):
    """One `bench blocks` run per op and size; a failed one is left out
    of the table (shown as '-') with its last error line."""
    out = {}
    for op in ("write", "read"):
        for s in sizes:
            cmd = [args.kvferry, "bench", "blocks", "--transport", "ucx",
                   "--pool", str(args.pool), "--block", str(args.block),
                   "--sizes", str(s), "--op", op, "--iters",
                   str(args.iters), "--no-link", "--json", "-", "--quiet"]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0 or "\n{" not in res.stdout:
                err = (res.stderr.strip().splitlines() or ["?"])[-1]
                print("kvferry ucx %s %s failed: %s" % (op, fmt(s), err),
                      file=sys.stderr)
                continue
            # the text table comes first on stdout, then the JSON document
            doc = json.loads(res.stdout[res.stdout.index("\n{") + 1:])
            for row in doc["rows"]:
                out[(op.upper(), int(row["size_bytes"]))] = (
                    row["gib_s"] * (1 << 30) / 1e9)
            print("kvferry ucx %-5s %9s %7.2f GB/s" % (
                op, fmt(s), out.get((op.upper(), s), 0)), file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvferry", default="build/kvferry")
    ap.add_argument("--pool", type=size, default=size("2G"))
    ap.add_argument("--block", type=size, default=size("8K"))
    ap.add_argument("--sizes", default="16M,64M,256M,1G")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sizes = [size(s) for s in args.sizes.split(",")]
    nixl = nixl_all(args, sizes)
    kvf = kvferry_all(args, sizes)
    rows = []
    lines = ["| size | op | NIXL UCX GB/s | kvferry ucx GB/s | kvferry / NIXL |",
             "|---|---|---|---|---|"]
    for op in ("WRITE", "READ"):
        for s in sizes:
            a, b = nixl.get((op, s)), kvf.get((op, s))
            ratio = b / a if a and b else None
            rows.append({"op": op, "size_bytes": s, "nixl_gb_s": a,
                         "kvferry_ucx_gb_s": b, "ratio": ratio})
            lines.append("| %s | %s | %.2f | %s | %s |" % (
                fmt(s), op, a, "%.2f" % b if b else "-",
                "%.2fx" % ratio if ratio else "-"))
    env = {"UCX_TLS": os.environ.get("UCX_TLS", ""), "pool": args.pool,
           "block": args.block, "iters": args.iters}
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "nixl-vs-kvferry.json"), "w") as f:
            json.dump({"config": env, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "nixl-vs-kvferry.md"), "w") as f:
            f.write("# NIXL (UCX backend) vs kvferry ucx, seed 000 workload\n\n")
            f.write("config: %s\n\n" % json.dumps(env))
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
