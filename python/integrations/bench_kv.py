"""Save/load speed of kvferry.kv for one request against a local master
and node: a vLLM-layout paged cache (default: 32 layers, 8 KV heads of
128, bf16, 16-token blocks, a 4096-token request), on the GPU (torch
CUDA tensors) or on the host (numpy), next to the copy ceiling measured
in the same run (pinned host <-> device through torch for the GPU, a
host memcpy for the host). Prints one JSON line.

    python python/integrations/bench_kv.py --device cuda
"""

import argparse
import json
import time

import numpy as np

import kvferry
from kvferry.kv import KVCache, KVLayout
from kvferry.procs import Master, Node


def best(fn, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    nblocks = a.tokens // a.block
    lay = KVLayout.vllm("bench", "bfloat16", a.layers, nblocks, a.block, a.heads, a.dim)
    total = nblocks * lay.pieces_per_block * a.block * lay.token_bytes
    pool = "%dM" % (total * (a.reps + 1) // (1 << 20) + 256)
    tokens = list(range(a.tokens))
    blocks = list(range(nblocks))
    if a.device == "cuda":
        import torch

        src = [torch.randn(lay.buffer_shape(), dtype=torch.bfloat16, device="cuda")
               for _ in range(a.layers)]
        dst = [torch.zeros_like(s) for s in src]
        pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(total, dtype=torch.uint8, device="cuda")

        def h2d():
            dev.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()

        def d2h():
            pinned.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()

        ceil = {"h2d_s": best(h2d, a.reps), "d2h_s": best(d2h, a.reps)}
    else:
        rng = np.random.default_rng(0)
        src = [rng.integers(0, 256, lay.buffer_bytes(), dtype=np.uint8) for _ in range(a.layers)]
        dst = [np.zeros_like(s) for s in src]
        x, y = np.ones(total, dtype=np.uint8), np.zeros(total, dtype=np.uint8)
        ceil = {"memcpy_s": best(lambda: np.copyto(y, x), a.reps)}
    rec = {"device": a.device, "layers": a.layers, "tokens": a.tokens, "block": a.block,
           "pieces": nblocks * lay.pieces_per_block, "bytes": total}
    with Master() as m, Node(m.address, pool=pool):
        with kvferry.Store.connect(m.address) as st:
            with KVCache(st, lay, src, namespace="bench-s") as s, \
                    KVCache(st, lay, dst, namespace="bench-s") as d:
                saves, loads = [], []
                for r in range(a.reps):
                    s.namespace = d.namespace = "bench-%d" % r
                    t0 = time.perf_counter()
                    assert s.save(tokens, blocks) == nblocks
                    saves.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    assert d.load(tokens, blocks) == a.tokens
                    loads.append(time.perf_counter() - t0)
                    s.remove(tokens)
                assert d.stats.corrupt_misses == 0
    rec.update(ceil)
    rec["save_s"], rec["load_s"] = min(saves), min(loads)
    rec["save_GBps"] = total / rec["save_s"] / 1e9
    rec["load_GBps"] = total / rec["load_s"] / 1e9
    if a.device == "cuda":
        rec["save_vs_d2h"] = ceil["d2h_s"] / rec["save_s"]
        rec["load_vs_h2d"] = ceil["h2d_s"] / rec["load_s"]
    print(json.dumps(rec))


if __name__ == "__main__":
    main()
