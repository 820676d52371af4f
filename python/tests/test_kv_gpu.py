"""kvferry.kv's GPU path: blocks of torch CUDA caches moved by the
checksumming copy kernels (kvferry.kv_gpu), kept in this process's pinned
memory (LocalKVCache) or staged through pinned memory to the store
(KVCache); every checksum a kernel computes equals kvf_checksum of the
same bytes on the host, and a corrupted block is a counted miss.

Runs only where torch sees a GPU and the library has GPU kernels. Also
runs as a script (``python3 python/tests/test_kv_gpu.py``, no pytest
needed: a GPU machine may lack it), starting its own master and node;
exit 77 when skipped.
"""

import ctypes
import os
import sys

try:
    import pytest
except ImportError:  # run as a script on a machine without pytest
    pytest = None

import kvferry
from kvferry import kv_gpu
from kvferry.kv import KVCache, KVLayout, LocalKVCache


def _skip(why):
    if pytest is not None and __name__ != "__main__":
        pytest.skip(why, allow_module_level=True)
    print("SKIP: %s" % why)
    sys.exit(77)


try:
    import numpy as np
    import torch
except ImportError:
    _skip("torch or numpy missing")
if not torch.cuda.is_available() or kv_gpu.gpu_count() == 0:
    _skip("no CUDA device or no GPU kernels")


def layout(layers=4, blocks=32):
    return KVLayout.vllm("m", "bfloat16", num_layers=layers, num_blocks=blocks,
                         block_size=16, num_kv_heads=2, head_dim=64)


def cache(lay, zero=False):
    mk = torch.zeros if zero else torch.randn
    return [mk(lay.buffer_shape(), dtype=torch.bfloat16, device="cuda") for _ in range(lay.num_layers)]


def tokens(n, seed=0):
    return [(seed * 7919 + i * 31) % 32000 for i in range(n)]


def test_kernel_sums_equal_host_checksum():
    lib = kvferry._lib.lib()
    lens = [0, 1, 7, 16, 100, 240, 241, 1024, 1025, 4096, 32768, 32769, 65549]
    total = sum((n + 63) & ~15 for n in lens)
    with kv_gpu.PinnedBuffer(total) as a, kv_gpu.PinnedBuffer(total) as b, \
            kv_gpu.GpuMover(0) as m:
        ctypes.memmove(a.addr, os.urandom(total), total)
        offs, at = [], 0
        for n in lens:
            offs.append(at)
            at += (n + 63) & ~15
        st, sums = m.copy(a.mem(), b.mem(), offs, list(offs), lens)
        assert st == kvferry.errors.OK
        for o, n, s in zip(offs, lens, sums):
            assert int(s) == lib.kvf_checksum(a.addr + o, n)
            assert ctypes.string_at(a.addr + o, n) == ctypes.string_at(b.addr + o, n)


def test_local_round_trip_and_corruption():
    lay = layout()
    src = cache(lay)
    t = tokens(16 * 6)
    with LocalKVCache(lay, src, capacity=64 << 20) as a:
        assert a.save(t, [3, 5, 7, 9, 11, 13]) == 6
        assert a.save(t, [3, 5, 7, 9, 11, 13]) == 0  # held already
        assert a.stats.skipped_chunks == 6
        assert a.lookup(t) == 96
        want = [src[layer][:, 3].clone() for layer in range(lay.num_layers)]
        for layer in range(lay.num_layers):
            src[layer][:, 0].zero_()
        assert a.load(t, [0, 1, 2, 4, 6, 8]) == 96 and a.stats.corrupt_misses == 0
        torch.cuda.synchronize()
        for layer in range(lay.num_layers):
            assert torch.equal(src[layer][:, 0], want[layer])
        # corrupt one byte of chunk 2 in the pool: a miss from there, counted
        v = a.slot_view(t, 2)
        v[100] ^= 0x5A
        assert a.load(t, [20, 21, 22, 23, 24, 25]) == 32
        assert a.stats.corrupt_misses == 1
        assert a.lookup(t) == 32  # the corrupt chunk was dropped


def test_local_loads_into_blocks():
    lay = layout()
    src = cache(lay)
    t = tokens(16 * 4, seed=3)
    with LocalKVCache(lay, src, capacity=16 << 20) as a:
        a.save(t, [3, 5, 7, 9])
        a.load(t, [20, 21, 22, 23])
        torch.cuda.synchronize()
        for layer in range(lay.num_layers):
            assert torch.equal(src[layer][:, 20], src[layer][:, 3])
            assert torch.equal(src[layer][:, 23], src[layer][:, 9])
        assert a.stats.t_h2d > 0 and a.stats.t_d2h > 0


def test_local_layer_by_layer():
    lay = layout()
    src = cache(lay)
    t = tokens(16 * 4, seed=4)
    with LocalKVCache(lay, src, capacity=16 << 20) as a:
        a.save(t, [3, 5, 7, 9])
        plan = a.plan_load(t, [20, 21, 22, 23])
        assert plan.tokens == 64
        for layer in range(lay.num_layers):
            src[layer][:, 20:24].zero_()
        # layers 0 and 1 in one call, then one at a time: each call moves
        # only its layers' pieces
        assert a.load_planned(plan, [0, 1]) == 64
        torch.cuda.synchronize()
        assert torch.equal(src[1][:, 21], src[1][:, 5])
        assert not src[2][:, 21].any()
        for layer in range(2, lay.num_layers):
            assert a.load_planned(plan, [layer]) == 64
        torch.cuda.synchronize()
        for layer in range(lay.num_layers):
            assert torch.equal(src[layer][:, 23], src[layer][:, 9])
        # a corrupted byte in chunk 1 of layer 3's pieces: caught by that
        # layer's call, the plan shrinks to the verified prefix
        v = a.slot_view(t, 1)
        cb = len(v)
        v[cb - 10] ^= 0x11
        plan = a.plan_load(t, [20, 21, 22, 23])
        assert a.load_planned(plan, [0, 1, 2]) == 64
        assert a.load_planned(plan, [3]) == 16 and plan.tokens == 16
        assert a.stats.corrupt_misses == 1 and a.lookup(t) == 16


def _posted_layers(mode):
    """load_layers in one checksum mode: every layer handed over in order,
    the bytes equal; a corrupted chunk ends the load with 0, the layers
    after the bad one not handed over, the plan cut before that chunk."""
    lay = layout(layers=6)
    src = cache(lay)
    t = tokens(16 * 5, seed=6)
    kv_gpu.set_sum_mode(mode)
    try:
        a = LocalKVCache(lay, src, capacity=16 << 20)
    finally:
        kv_gpu.set_sum_mode(None)
    posted = mode in ("engines", "auto")  # auto: the copy engines' posts too
    with a:
        assert bool(a._mover.flags & kv_gpu.SUM_ENGINES) == (mode == "engines")
        a.save(t, [3, 5, 7, 9, 11])
        for layer in range(lay.num_layers):
            src[layer][:, 20:25].zero_()
        seen = []
        plan = a.plan_load(t, [20, 21, 22, 23, 24])
        assert a.load_layers(plan, seen.append) == 80 and seen == list(range(6))
        torch.cuda.synchronize()
        for layer in range(lay.num_layers):
            for i, b in enumerate([3, 5, 7, 9, 11]):
                assert torch.equal(src[layer][:, 20 + i], src[layer][:, b])
        loaded = a.stats.bytes_loaded
        # one byte of chunk 3, in layer 2's pieces (K of layer 2 starts at
        # piece 4 of the chunk's 12)
        v = a.slot_view(t, 3)
        v[len(v) * 4 // 12 + 1] ^= 0x24
        seen = []
        plan = a.plan_load(t, [20, 21, 22, 23, 24])
        assert a.load_layers(plan, seen.append) == 0
        assert plan.ok == 3 and a.stats.corrupt_misses == 1 and a.lookup(t) == 48
        # posted: layer 2 handed over, then found bad; else found first
        assert seen == ([0, 1, 2] if posted else [0, 1])
        assert a.stats.bytes_loaded > loaded


def test_local_posted_layers_engines():
    _posted_layers("engines")


def test_local_posted_layers_auto():
    _posted_layers("auto")


def test_local_layers_fused():
    _posted_layers("fused")


def _store_round_trip(store, views):
    """Save through the stage, load through the stage (views False) or
    from the node's pool in place (views True), then the corruption and
    layer-group cases."""
    lay = layout()
    src, dst = cache(lay), cache(lay, zero=True)
    t = tokens(16 * 5, seed=5)
    name = "kvgpu-" + os.urandom(4).hex()
    with KVCache(store, lay, src, namespace=name, gpu_stage=True) as a, \
            KVCache(store, lay, dst, namespace=name, gpu_stage=True, stage_bytes=2 * 4 * 2 * 4096) as b:
        assert a._stage is not None and b._stage_chunks == 2
        b._views = views
        assert a.save(t, [1, 2, 3, 4, 5]) == 5
        if views:
            assert b.warm(t) >= 1
        assert b.load(t, [10, 11, 12, 13, 14]) == 80
        torch.cuda.synchronize()
        for layer in range(lay.num_layers):
            assert torch.equal(dst[layer][:, 10], src[layer][:, 1])
            assert torch.equal(dst[layer][:, 14], src[layer][:, 5])
        assert b.stats.t_h2d > 0 and b.stats.t_read > 0 and a.stats.t_d2h > 0
        # a host cache of the same layout reads what the GPU cache wrote
        host = [np.zeros(lay.buffer_bytes(), dtype=np.uint8) for _ in range(lay.num_layers)]
        with KVCache(store, lay, host, namespace=name) as h:
            assert h.load(t, [0, 1, 2, 3, 4]) == 80
            assert bytes(host[1][: lay.block_size * lay.token_bytes]) == \
                src[1][0, 1].cpu().contiguous().view(torch.uint8).numpy().tobytes()
        # a piece replaced by other bytes under its key (the store's own
        # checksum then agrees): only the kernel's check against the
        # manifest catches it
        key = a.piece_keys(a.chunk_keys(t)[2])[5]
        n = store.query(key).size
        store.remove(key)
        store.put(key, os.urandom(n))
        assert b.load(t, [10, 11, 12, 13, 14]) == 32 and b.stats.corrupt_misses == 1
        # by group of layers: the replaced piece is layer 2's V of chunk 2
        for layer in range(lay.num_layers):
            dst[layer].zero_()
        plan = b.plan_load(t, [10, 11, 12, 13, 14])
        assert b.load_planned(plan, [0, 1]) == 80
        torch.cuda.synchronize()
        assert torch.equal(dst[1][:, 14], src[1][:, 5]) and not dst[2].any()
        assert b.load_planned(plan, [2]) == 32 and b.stats.corrupt_misses == 2
        assert b.load_planned(plan, [3]) == 32
        torch.cuda.synchronize()
        assert torch.equal(dst[3][:, 11], src[3][:, 2]) and not dst[3][:, 12].any()
        assert (b.stats.viewed_pieces > 0) == views


def test_store_staged(store):
    _store_round_trip(store, views=False)


def test_store_viewed(store):
    """Loads that read the node's pool in place (store views registered
    with the GPU): same bytes, same verification."""
    _store_round_trip(store, views=True)


if __name__ == "__main__":
    from kvferry.procs import Master, Node

    failed = 0
    with Master() as m, Node(m.address, pool="256M"), kvferry.Store.connect(m.address) as st:
        for name, fn in sorted(globals().items()):
            if not name.startswith("test_") or not callable(fn):
                continue
            try:
                fn(st) if fn.__code__.co_argcount == 1 else fn()
                print("PASS: %s" % name)
            except Exception as e:  # report every test, then fail
                import traceback

                traceback.print_exc()
                print("FAIL: %s: %r" % (name, e))
                failed += 1
    print("FAIL: test_kv_gpu" if failed else "PASS: test_kv_gpu")
    sys.exit(1 if failed else 0)
