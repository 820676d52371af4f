"""kvferry.kv_chunks against a real master and node: chunk objects of a
paged cache saved and loaded byte for byte (host caches here; GPU caches
where torch sees a GPU), partial chunks and tails, layer groups, other
fingerprints, damaged objects and a dead store.
"""

import uuid

import numpy as np
import pytest

import kvferry
from kvferry import kv_chunks as kc
from kvferry.errors import ERR_NO_KEY

LAYERS, NBLK, BS, HEADS, HD = 6, 40, 16, 2, 32


DEVICE = ["cpu"]


def ns():
    return "kc-" + uuid.uuid4().hex[:10]


@pytest.fixture(params=["cpu", "cuda"], autouse=True)
def device(request):
    """Every test on host caches, and on GPU caches where torch sees a GPU
    (the copy kernels, store views and put views)."""
    if request.param == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("no GPU that torch sees")
    DEVICE[0] = request.param
    yield request.param
    DEVICE[0] = "cpu"


def caches(seed, layers=LAYERS, nblk=NBLK, bs=BS, heads=HEADS, shape="kv"):
    """Per-layer caches of random bytes: vLLM's [2, blocks, bs, H, D]
    (shape "kv") or a block-outermost [blocks, 2, bs, H, D] ("block"):
    numpy arrays, or torch CUDA tensors under the cuda parameter."""
    rng = np.random.default_rng(seed)
    dims = (2, nblk, bs, heads, HD) if shape == "kv" else (nblk, 2, bs, heads, HD)
    out = [rng.integers(0, 1 << 16, dims, dtype=np.uint16) for _ in range(layers)]
    if DEVICE[0] == "cuda":
        import torch

        return [torch.from_numpy(a.view(np.int16)).cuda() for a in out]
    return out


def host(t):
    return t.cpu().numpy() if hasattr(t, "cpu") else t


def blocks_equal(a, b, ids_a, ids_b, shape="kv"):
    a, b = [host(t) for t in a], [host(t) for t in b]
    for la, lb in zip(a, b):
        for x, y in zip(ids_a, ids_b):
            if shape == "kv":
                if not (np.array_equal(la[0, x], lb[0, y]) and np.array_equal(la[1, x], lb[1, y])):
                    return False
            elif not np.array_equal(la[x], lb[y]):
                return False
    return True


def make(store, tensors, namespace, fp="fp0" * 8, chunk=64, groups=3, bs=BS, **kw):
    return kc.ChunkStore(store, tensors, tensors[0].shape[1] if tensors[0].shape[0] == 2
                         else tensors[0].shape[0], bs, fp, namespace=namespace,
                         chunk_tokens=chunk, layer_groups=groups, stage_bytes=1 << 20, **kw)


def tokens(n, seed=0):
    rng = np.random.default_rng(seed + 1000)
    return [int(x) for x in rng.integers(1, 30000, n)]


def save_all(cs, toks, block_ids, upto):
    chunks = cs.chunks_of(toks, upto)
    commit = cs.save([kc.SaveReq(chunks, block_ids)])
    return commit()


def test_save_then_load_byte_for_byte(store):
    name = ns()
    src, dst = caches(1), caches(2)
    a, b = make(store, src, name), make(store, dst, name)
    toks = tokens(200)  # 3 full chunks of 64 and a tail of 4 blocks (8 tokens left over)
    ids_src = list(range(3, 3 + 13))
    stored = save_all(a, toks, ids_src, 208 // 16 * 16 - 16)  # 192: 3 full chunks
    assert stored == 3 * a.groups
    stored = save_all(a, toks, ids_src, 192 + 0)
    assert stored == 0  # all there: skipped
    assert a.stats.skipped_objects == 3 * a.groups
    hit, chunks = b.lookup(toks, 192)
    assert hit == 192 and len(chunks) == 3
    ids_dst = [39 - i for i in range(13)]
    req = kc.LoadReq(chunks, ids_dst, 0, hit)
    b.load([req])
    assert req.loaded == 192 and req.failed_blocks == []
    assert blocks_equal(src, dst, ids_src[:12], ids_dst[:12])
    assert not blocks_equal(src, dst, ids_src[12:13], ids_dst[12:13])
    a.close()
    b.close()


def test_tail_and_partial_chunks(store):
    name = ns()
    src, dst = caches(3), caches(4)
    a, b = make(store, src, name), make(store, dst, name)
    toks = tokens(150, seed=5)  # 2 full chunks (128) + tail of 1 block (16) + 6 tokens
    ids = list(range(10))
    chunks = a.chunks_of(toks, 144)
    assert [c.blocks for c in chunks] == [4, 4, 1]
    assert save_all(a, toks, ids, 144) == 3 * a.groups
    # the limit (last token computed by the engine) inside the tail
    hit, got = b.lookup(toks, 144)
    assert hit == 144 and [c.blocks for c in got] == [4, 4, 1]
    # a longer prompt sharing 150 tokens: the tail continues its prefix
    longer = toks + tokens(100, seed=9)
    hit, got = b.lookup(longer, 240)
    assert hit == 144 and got[-1].blocks == 1
    # a load starting inside a chunk (the engine had blocks 0..4) and ending
    # inside another (limit 112)
    req = kc.LoadReq(got, list(range(20, 30)), 80, 112)
    b.load([req])
    assert req.loaded == 32
    assert blocks_equal(src, dst, ids[5:7], list(range(25, 27)))
    assert not blocks_equal(src, dst, ids[4:5], [24])
    a.close()
    b.close()


def test_other_fingerprint_and_geometry_miss(store):
    name = ns()
    src = caches(5)
    a = make(store, src, name)
    toks = tokens(128, seed=11)
    assert save_all(a, toks, list(range(8)), 128) == 2 * a.groups
    for other in (make(store, caches(6), name, fp="fp1" * 8),
                  make(store, caches(6), name, chunk=32),
                  make(store, caches(6), name, groups=2),
                  make(store, caches(6), "other-" + name)):
        assert other.lookup(toks, 128) == (0, [])
        other.close()
    a.close()


def test_block_outermost_layout(store):
    name = ns()
    src, dst = caches(7, shape="block"), caches(8, shape="block")
    a, b = make(store, src, name), make(store, dst, name)
    toks = tokens(64, seed=13)
    save_all(a, toks, [1, 2, 3, 4], 64)
    hit, chunks = b.lookup(toks, 64)
    req = kc.LoadReq(chunks, [9, 8, 7, 6], 0, hit)
    b.load([req])
    assert req.loaded == 64
    assert blocks_equal(src, dst, [1, 2, 3, 4], [9, 8, 7, 6], shape="block")
    a.close()
    b.close()


def test_damaged_object_is_a_miss_never_wrong_bytes(store):
    name = ns()
    src, dst = caches(9), caches(10)
    a, b = make(store, src, name), make(store, dst, name)
    toks = tokens(192, seed=17)
    save_all(a, toks, list(range(12)), 192)
    _, chunks = b.lookup(toks, 192)
    # chunk 1's group-1 object: a byte of its data changed (the store's own
    # checksum is recomputed by the put: only the header's sums can tell)
    key = b.object_key(chunks[1].key, chunks[1].blocks, 1)
    raw = bytearray(store.get_bytes(key))
    raw[-1] ^= 0xFF
    store.remove(key)
    store.put(key, bytes(raw))
    # and chunk 2's group 0 removed
    store.remove(b.object_key(chunks[2].key, chunks[2].blocks, 0))
    req = kc.LoadReq(chunks, list(range(20, 32)), 0, 192)
    b.load([req])
    # the store's checksum matches the new bytes (the put recomputed it);
    # the header's piece checksums find the damaged piece, the object's
    # last (block 3 of chunk 1): the hit ends there
    assert req.loaded == 64 + 3 * BS
    assert req.failed_blocks == list(range(20, 32))[req.loaded // BS:]
    assert blocks_equal(src, dst, list(range(7)), list(range(20, 27)))
    assert b.stats.corrupt_misses == 1
    hit, _ = b.lookup(toks, 192)
    assert hit == 128
    a.close()
    b.close()


def test_header_checked(store):
    name = ns()
    src, dst = caches(11), caches(12)
    a, b = make(store, src, name), make(store, dst, name)
    toks = tokens(64, seed=19)
    save_all(a, toks, [0, 1, 2, 3], 64)
    _, chunks = b.lookup(toks, 64)
    key = b.object_key(chunks[0].key, 4, 0)
    raw = bytearray(store.get_bytes(key))
    raw[100] ^= 1  # inside the piece checksums: the header checksum fails
    store.remove(key)
    store.put(key, bytes(raw))
    req = kc.LoadReq(chunks, [4, 5, 6, 7], 0, 64)
    b.load([req])
    assert req.loaded == 0 and req.failed_blocks == [4, 5, 6, 7]
    assert b.stats.corrupt_misses >= 1
    a.close()
    b.close()


def test_dead_store_is_a_miss(master):
    name = ns()
    from kvferry.procs import Node

    with kvferry.Store.connect(master) as st:
        a = make(st, caches(13), name)
        toks = tokens(64, seed=23)
        save_all(a, toks, [0, 1, 2, 3], 64)
        a.close()
    st = kvferry.Store.connect(master, timeout_ms=500)
    b = make(st, caches(14), name)
    _, chunks = b.lookup(toks, 64)
    st.close()  # a closed store: every call fails
    req = kc.LoadReq(chunks, [4, 5, 6, 7], 0, 64)
    b.load([req])
    assert req.loaded == 0 and req.failed_blocks == [4, 5, 6, 7]
    assert b.stats.load_errors == 1
    b.close()
    del Node


def test_layer_parts_refuse_gaps():
    t = np.zeros((2, 8, 16, 4, 64), dtype=np.uint16)[:, :, :, :2, :]  # heads sliced: gaps
    with pytest.raises(ValueError):
        kc.layer_parts(t, 8)
    with pytest.raises(ValueError):
        kc.layer_parts(np.zeros((3, 8, 16), dtype=np.uint16), 8)
    parts = kc.layer_parts(np.zeros((2, 8, 16, 2, 64), dtype=np.uint16), 8)
    assert [p.nbytes for p in parts] == [16 * 2 * 64 * 2] * 2
    assert parts[1].addr - parts[0].addr == 8 * 16 * 2 * 64 * 2


def test_group_done_called_for_every_group(store):
    name = ns()
    a, b = make(store, caches(15), name), make(store, caches(16), name)
    toks = tokens(64, seed=29)
    save_all(a, toks, [0, 1, 2, 3], 64)
    _, chunks = b.lookup(toks, 64)
    seen = []
    b.load([kc.LoadReq(chunks, [4, 5, 6, 7], 0, 64)], group_done=seen.append)
    assert seen == list(range(b.groups))
    seen = []
    b.load([kc.LoadReq([], [], 0, 0)], group_done=seen.append)
    assert seen == list(range(b.groups))
    assert ERR_NO_KEY < 0
    a.close()
    b.close()


@pytest.mark.parametrize("views", [True, False])
def test_views_and_stage_paths(store, views):
    """Objects move through store views and put views (the node is on
    this host) or, with views off, through the stage: the same bytes
    either way, and the counters say which path ran."""
    name = ns()
    src, dst = caches(31), caches(32)
    a, b = make(store, src, name, views=views), make(store, dst, name, views=views)
    toks = tokens(256, seed=37)
    ids = list(range(16))
    assert save_all(a, toks, ids, 256) == 4 * a.groups
    hit, chunks = b.lookup(toks, 256)
    req = kc.LoadReq(chunks, list(range(20, 36)), 0, hit)
    b.load([req])
    assert req.loaded == 256 and blocks_equal(src, dst, ids, list(range(20, 36)))
    if views:
        assert b.stats.viewed_objects == 4 * b.groups
        assert a.stats.put_viewed_objects == 4 * a.groups
    else:
        assert b.stats.viewed_objects == 0 and a.stats.put_viewed_objects == 0
    a.close()
    b.close()


def test_embedded_store():
    """A master and a node inside this process serve chunk objects like
    the daemons do."""
    from kvferry import embedded

    with embedded.EmbeddedStore(32 << 20) as es, kvferry.Store.connect(es.address) as st:
        a, b = make(st, caches(41), ns()), None
        b = make(st, caches(42), a.namespace)
        toks = tokens(64, seed=43)
        assert save_all(a, toks, [0, 1, 2, 3], 64) == a.groups
        hit, chunks = b.lookup(toks, 64)
        req = kc.LoadReq(chunks, [5, 6, 7, 8], 0, hit)
        b.load([req])
        assert req.loaded == 64
        a.close()
        b.close()
    assert embedded.parse_size("20G") == 20 << 30 and embedded.parse_size("512") == 512


def test_quota_of_uncommitted_bytes_retried():
    """A save whose groups together exceed the master's quota of a
    client's uncommitted bytes: a group refused for it is asked again
    once the earlier groups' commits ran (quota_wait), and every object
    is stored; without the wait, the refused objects are counted."""
    from kvferry.procs import Master, Node

    env = {"KVF_CLIENT_MAX_RESERVED_PCT": "30"}
    with Master(env=env) as m, Node(m.address, pool="8M"), kvferry.Store.connect(m.address) as st:
        for wait in (True, False):
            name = ns()
            src = caches(51, nblk=256)
            a = make(st, src, name)
            queued = []
            if wait:
                a.quota_wait = lambda: [c() for c in queued] and queued.clear()
            toks = tokens(60 * 64, seed=53 + wait)
            chunks = a.chunks_of(toks, len(toks))
            a.save([kc.SaveReq(chunks, list(range(240)))], on_commit=queued.append)
            stored = sum(c() for c in queued)
            if wait:
                assert a.stats.quota_retries >= 1 and a.stats.refused_objects == 0
                assert a.lookup(toks, len(toks))[0] == len(toks)
            else:
                assert a.stats.refused_objects > 0 and stored < len(chunks) * a.groups
            a.close()
