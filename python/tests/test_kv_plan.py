"""LocalKVCache's planned and layer-wise loads (plan_load, load_planned)
on the CPU: the cache's pool and GPU side are host arrays and the
verifying copy kernel is replaced by a host copy that computes
kvf_checksum of each piece, so the descriptor tables, the layer
selection and the corruption handling are tested without a GPU (the
GPU run of test_kv_gpu.py covers the real kernel)."""

import ctypes
import threading
from collections import OrderedDict

import pytest

np = pytest.importorskip("numpy")

import kvferry  # noqa: E402
from kvferry import kv_gpu  # noqa: E402
from kvferry.errors import ERR_CHECKSUM, OK  # noqa: E402
from kvferry.kv import KVLayout, KVStats, LocalKVCache  # noqa: E402


class _Region:
    def __init__(self, addr, nbytes):
        self.addr, self.nbytes, self.mem_type, self.device = addr, nbytes, kvferry.MEM_CUDA, 0


class _Mem:
    def __init__(self, base, n):
        self.base, self.len = base, n


class _HostMover:
    """kvf_gpu_copy_blocks_sum's contract on host memory."""

    def copy_table(self, src, dst, blk, expect, sums, timeout_ms=0, flags=0):
        lib = kvferry._lib.lib()
        for i, (so, do, ln) in enumerate(blk):
            ctypes.memmove(int(dst.base) + int(do), int(src.base) + int(so), int(ln))
            sums[i] = lib.kvf_checksum(int(dst.base) + int(do), int(ln))
        return OK if expect is None or (sums == expect).all() else ERR_CHECKSUM


def _cache(lay, slots):
    c = LocalKVCache.__new__(LocalKVCache)
    c.layout, c.fingerprint, c.stats, c._lock = lay, lay.fingerprint(), KVStats(), threading.Lock()
    nb = lay.buffer_bytes()
    c.arena = np.zeros(lay.num_buffers * nb, dtype=np.uint8)
    base = c.arena.ctypes.data
    c._table = kv_gpu.BlockTable(lay, [_Region(base + i * nb, nb) for i in range(lay.num_buffers)])
    c._table.side = _Mem(base, c.arena.nbytes)
    c.npc, c.slots = lay.pieces_per_block, slots
    c.pool_bytes = np.random.default_rng(3).integers(0, 255, slots * c._table.chunk_bytes,
                                                     dtype=np.uint8)
    c.pool = type("P", (), {})()
    c.pool.mem = lambda: _Mem(c.pool_bytes.ctypes.data, c.pool_bytes.nbytes)
    c._mover, c._index, c._free = _HostMover(), OrderedDict(), []
    c._sums = np.zeros((slots, c.npc), dtype=np.uint64)
    return c


def _hold(c, toks, first_slot):
    """Marks the chunks of toks held in consecutive slots, with the
    checksums of the pool's bytes recorded."""
    lib, t = kvferry._lib.lib(), c._table
    cb = t.chunk_bytes
    keys = c.chunk_keys(toks)
    for j, k in enumerate(keys):
        slot = first_slot + j
        c._index[k] = slot
        for p in range(c.npc):
            c._sums[slot, p] = lib.kvf_checksum(c.pool_bytes.ctypes.data + slot * cb + t.within[p],
                                                t.lens[p])
    return keys


def test_planned_and_layer_loads_move_and_verify():
    lay = KVLayout.vllm("m", "bfloat16", 4, 64, 16, 2, 64)
    c = _cache(lay, 8)
    toks = list(range(16 * 5))
    keys = _hold(c, toks, 2)
    ids = [9, 3, 40, 7, 22]
    assert c.load(toks, ids) == 80
    t, nb = c._table, lay.buffer_bytes()
    blk = lay.block_size * lay.token_bytes
    src = 4 * t.chunk_bytes + t.within[3]  # chunk 2 (slot 4), layer 1's V
    at = nb + 64 * blk + 40 * blk
    assert (c.arena[at:at + blk] == c.pool_bytes[src:src + blk]).all()
    plan = c.plan_load(toks, ids)
    assert plan.tokens == 80
    c.arena[:] = 0
    assert c.load_planned(plan, layers=[2, 3]) == 80
    assert not c.arena[:nb].any() and c.arena[2 * nb:].any()
    assert c.load_planned(plan, [0]) == 80 and c.load_planned(plan, [0, 2]) == 80
    # a flipped bit in chunk 1's layer-2 V: layers 0-1 still pass, layer 2
    # ends the hit there and drops the chunk; later groups load less
    c.pool_bytes[3 * t.chunk_bytes + t.within[5] + 7] ^= 1
    assert c.load_planned(plan, [0, 1]) == 80
    assert c.load_planned(plan, [2]) == 16 and plan.tokens == 16
    assert c.stats.corrupt_misses == 1 and keys[1] not in c._index
    assert c.load_planned(plan, [3]) == 16
    assert c.load(toks, ids) == 16
    with pytest.raises(ValueError):
        c.load_planned(plan, [4])


def test_layer_loads_need_a_per_layer_layout():
    lay = KVLayout.sglang("m", "bfloat16", 2, 8, 16, 2, 64)
    c = _cache(lay, 4)
    toks = list(range(32))
    _hold(c, toks, 0)
    plan = c.plan_load(toks, [1, 2])
    with pytest.raises(ValueError):
        c.load_planned(plan, [0])
    assert c.load_planned(plan) == 32


class _HostListMover:
    """GpuMover.copy's contract on host memory (offset lists)."""

    def close(self):
        pass

    def copy(self, src, dst, src_offs, dst_offs, lens, expect=None, timeout_ms=0, flags=0):
        lib = kvferry._lib.lib()
        sums = np.zeros(len(lens), dtype=np.uint64)
        for i, (so, do, ln) in enumerate(zip(src_offs, dst_offs, lens)):
            ctypes.memmove(int(dst.base) + int(do), int(src.base) + int(so), int(ln))
            sums[i] = lib.kvf_checksum(int(dst.base) + int(do), int(ln))
        ok = expect is None or (sums == np.asarray(expect, dtype=np.uint64)).all()
        return (OK if ok else ERR_CHECKSUM), sums


def _staged(store, lay, chunks):
    """A KVCache over host buffers whose GPU staging is played by host
    memory: a stage of `chunks` chunks registered with the store and a
    host mover, so the pipelined load runs against the real store."""
    from kvferry.kv import KVCache

    nb = lay.buffer_bytes()
    arena = np.zeros(lay.num_buffers * nb, dtype=np.uint8)
    bufs = [arena[i * nb:(i + 1) * nb] for i in range(lay.num_buffers)]
    c = KVCache(store, lay, bufs, namespace="plan-pipe")
    c.arena = arena
    c._table = kv_gpu.BlockTable(lay, c.regions)
    c._table.side = _Mem(arena.ctypes.data, arena.nbytes)
    stage = np.zeros(chunks * c._table.chunk_bytes, dtype=np.uint8)
    c._stage_mem = stage
    c._stage = type("S", (), {"mem": lambda self: _Mem(stage.ctypes.data, stage.nbytes),
                              "close": lambda self: None, "nbytes": stage.nbytes})()
    c._stage_region = store.register(stage)
    c._stage_chunks = chunks
    c._mover = _HostListMover()
    return c


@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_pipelined_store_load_unhashed(store, chunks):
    from kvferry.kv import KVCache

    lay = KVLayout.vllm("m", "bfloat16", 2, 16, 16, 2, 64)
    nb = lay.buffer_bytes()
    src = [np.random.default_rng(i).integers(0, 255, nb, dtype=np.uint8) for i in range(2)]
    toks = [(chunks * 131 + i * 7) % 32000 for i in range(16 * 7)]
    with KVCache(store, lay, src, namespace="plan-pipe") as w:
        w.remove(toks)
        assert w.save(toks, [0, 1, 2, 3, 4, 5, 6]) == 7
    c = _staged(store, lay, chunks)
    try:
        ids = [15, 3, 9, 11, 2, 7, 13]
        assert c.load(toks, ids) == 16 * 7
        blk = lay.block_size * lay.token_bytes
        for layer in range(2):
            for half in (0, 16 * blk):
                for j, b in enumerate(ids):
                    got = c.arena[layer * nb + half + b * blk: layer * nb + half + (b + 1) * blk]
                    assert (got == src[layer][half + j * blk: half + (j + 1) * blk]).all()
        assert c.stats.t_read > 0 and c.stats.corrupt_misses == 0
        c.arena[:] = 0
        assert c.load(toks, ids, start=3) == 16 * 4  # chunks 0-2 are the engine's
        assert not c.arena[ids[0] * blk:(ids[0] + 1) * blk].any()
        assert (c.arena[ids[3] * blk:(ids[3] + 1) * blk] == src[0][3 * blk:4 * blk]).all()
        # a piece replaced under its key: the store's recorded checksum
        # no longer matches the manifest, the hit ends there
        key = c.piece_keys(c.chunk_keys(toks)[4])[3]
        n = store.query(key).size
        store.remove(key)
        store.put(key, bytes(n))
        assert c.load(toks, ids) == 16 * 4 and c.stats.corrupt_misses == 1
        # a missing piece: a plain miss from there
        store.remove(c.piece_keys(c.chunk_keys(toks)[2])[0])
        assert c.load(toks, ids) == 16 * 2 and c.stats.corrupt_misses == 1
    finally:
        c.remove(toks)
        c._stage_region.deregister()
        c.close()


def test_store_layer_by_layer(store):
    from kvferry.kv import KVCache

    lay = KVLayout.vllm("m", "bfloat16", 3, 16, 16, 2, 64)
    nb = lay.buffer_bytes()
    src = [np.random.default_rng(10 + i).integers(0, 255, nb, dtype=np.uint8) for i in range(3)]
    toks = [(i * 13 + 5) % 32000 for i in range(16 * 6)]
    with KVCache(store, lay, src, namespace="plan-pipe") as w:
        w.remove(toks)
        assert w.save(toks, [0, 1, 2, 3, 4, 5]) == 6
    c = _staged(store, lay, 2)  # a stage of 2 chunks: several calls per group
    blk = lay.block_size * lay.token_bytes
    ids = [8, 1, 14, 6, 3, 11]

    def same(layer, j):
        b = ids[j]
        for half in (0, 16 * blk):
            got = c.arena[layer * nb + half + b * blk: layer * nb + half + (b + 1) * blk]
            if not (got == src[layer][half + j * blk: half + (j + 1) * blk]).all():
                return False
        return True

    try:
        plan = c.plan_load(toks, ids)
        assert plan.tokens == 96
        assert c.load_planned(plan, [1]) == 96
        assert all(same(1, j) for j in range(6)) and not same(0, 0)
        assert c.load_planned(plan, [0, 2]) == 96
        assert all(same(layer, j) for layer in (0, 2) for j in range(6))
        # layer 2's V of chunk 3 replaced: layers 0-1 still load whole
        key = c.piece_keys(c.chunk_keys(toks)[3])[5]
        n = store.query(key).size
        store.remove(key)
        store.put(key, bytes(n))
        plan = c.plan_load(toks, ids)
        assert c.load_planned(plan, [0, 1]) == 96
        assert c.load_planned(plan, [2]) == 48 and plan.tokens == 48
        assert c.stats.corrupt_misses == 1
        assert c.load_planned(plan) == 48
        with pytest.raises(ValueError):
            c.load_planned(plan, [3])
    finally:
        c.remove(toks)
        c._stage_region.deregister()
        c.close()
