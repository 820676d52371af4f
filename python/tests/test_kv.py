"""kvferry.kv against a real master and node: keys, layouts, save/load
round trips, prefix hits, corrupted and foreign-layout entries as misses."""

import os
import uuid

import numpy as np
import pytest

import kvferry
from kvferry.kv import KVCache, KVLayout, chunk_keys


def ns():
    return "kvt/" + uuid.uuid4().hex[:12]


LAYOUTS = {
    "vllm": KVLayout.vllm("m", "bfloat16", num_layers=3, num_blocks=8, block_size=16,
                          num_kv_heads=2, head_dim=32),
    "mla": KVLayout.mla("m", "float16", num_layers=2, num_blocks=8, block_size=16, latent_dim=96),
    "sglang": KVLayout.sglang("m", "bfloat16", num_layers=4, num_pages=8, page_size=16,
                              num_kv_heads=2, head_dim=16),
    "lmcache": KVLayout.lmcache("m", "bfloat16", num_layers=2, num_chunks=8, num_kv_heads=2,
                                head_dim=16, chunk_size=32),
}


def buffers(layout, fill=True, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layout.num_buffers):
        a = np.zeros(layout.buffer_bytes(), dtype=np.uint8)
        if fill:
            a[:] = rng.integers(0, 256, a.size, dtype=np.uint8)
        out.append(a)
    return out


def block_bytes(layout, bufs, blk):
    return b"".join(bytes(bufs[bi][off:off + ln]) for _, bi, off, ln in layout.spans(blk))


def tokens(n, seed=1):
    return list(np.random.default_rng(seed).integers(0, 128000, n))


def test_keys_stable_and_layout_sensitive():
    lay = LAYOUTS["vllm"]
    t = tokens(70)
    a = chunk_keys(t, 16, lay.fingerprint())
    assert len(a) == 4 and all(len(k) == 32 for k in a)
    assert a == chunk_keys(list(t), 16, lay.fingerprint())
    # known value: a change of format must be deliberate
    assert chunk_keys([1, 2, 3, 4], 4, "")[0].hex() == chunk_keys((1, 2, 3, 4), 4, "")[0].hex()
    assert len(chunk_keys(t, 16, "", full_only=False)) == 5
    # chained: a change in chunk 0 changes every later key; chunk 3 alone only key 3
    t2 = list(t)
    t2[0] += 1
    b = chunk_keys(t2, 16, lay.fingerprint())
    assert all(x != y for x, y in zip(a, b))
    t3 = list(t)
    t3[50] += 1
    c = chunk_keys(t3, 16, lay.fingerprint())
    assert c[:3] == a[:3] and c[3] != a[3]
    # every part of the fingerprint matters, the pool size does not
    fp = lay.fingerprint()
    import dataclasses
    for change in (dict(model="m2"), dict(dtype="float16"), dict(block_size=32),
                   dict(num_kv_heads=4), dict(head_dim=64), dict(tp_rank=1, tp_size=2),
                   dict(num_layers=4), dict(version=2), dict(kind="mla", num_kv_heads=1)):
        assert dataclasses.replace(lay, **change).fingerprint() != fp, change
    assert dataclasses.replace(lay, num_blocks=99).fingerprint() == fp
    assert KVLayout.vllm("m", "torch.bfloat16", 3, 8, 16, 2, 32).fingerprint() == fp
    assert chunk_keys(t, 16, "other") != a
    with pytest.raises(ValueError):
        KVLayout.vllm("m", "bf17", 3, 8, 16, 2, 32)
    with pytest.raises(ValueError):
        KVLayout("paged", "m", "bfloat16", 1, 1, 1, 1, 1)


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_round_trip(store, kind):
    lay = LAYOUTS[kind]
    src_bufs, dst_bufs = buffers(lay, seed=3), buffers(lay, fill=False)
    t = tokens(lay.block_size * 3 + 5)
    src_blocks, dst_blocks = [5, 1, 6], [0, 7, 2]
    name = ns()
    with KVCache(store, lay, src_bufs, namespace=name) as src, \
            KVCache(store, lay, dst_bufs, namespace=name) as dst:
        assert dst.lookup(t) == 0
        assert dst.load(t, dst_blocks) == 0
        assert src.save(t, src_blocks) == 3
        assert src.save(t, src_blocks) == 0 and src.stats.skipped_chunks == 3
        assert dst.lookup(t) == 3 * lay.block_size
        assert dst.load(t, dst_blocks) == 3 * lay.block_size
        for s, d in zip(src_blocks, dst_blocks):
            assert block_bytes(lay, dst_bufs, d) == block_bytes(lay, src_bufs, s)
        # blocks not loaded stay untouched
        assert block_bytes(lay, dst_bufs, 3) == bytes(len(block_bytes(lay, dst_bufs, 3)))
        assert dst.stats.corrupt_misses == 0 and dst.stats.loaded_chunks == 3
        assert dst.stats.bytes_loaded == 3 * len(block_bytes(lay, src_bufs, 0))
        assert src.remove(t) == 3
        assert dst.lookup(t) == 0


def test_partial_prefix_hit(store):
    lay = LAYOUTS["vllm"]
    src_bufs, dst_bufs = buffers(lay, seed=4), buffers(lay, fill=False)
    t = tokens(16 * 5)
    name = ns()
    with KVCache(store, lay, src_bufs, namespace=name) as src, \
            KVCache(store, lay, dst_bufs, namespace=name) as dst:
        assert src.save(t[:16 * 2], [0, 1]) == 2
        # a longer request sharing the first two chunks hits them only
        assert dst.lookup(t) == 32
        assert dst.load(t, [3, 4, 5, 6, 7]) == 32
        assert block_bytes(lay, dst_bufs, 4) == block_bytes(lay, src_bufs, 1)
        # a request differing in chunk 1 hits chunk 0 only
        t2 = t[:16] + [x + 1 for x in t[16:]]
        assert dst.load(t2, [3, 4, 5]) == 16
        assert dst.stats.corrupt_misses == 0


def corrupt_piece(store, cache, ck, piece=0):
    """Replaces one stored piece by other bytes of the same size under the
    same key (a raw put: the store's own checksum is then of the new
    bytes, so only the manifest can tell)."""
    key = cache.piece_keys(ck)[piece]
    n = store.query(key).size
    store.remove(key)
    store.put(key, os.urandom(n))


def test_corrupted_block_is_counted_miss(store):
    lay = LAYOUTS["vllm"]
    src_bufs, dst_bufs = buffers(lay, seed=5), buffers(lay, fill=False)
    t = tokens(16 * 3)
    name = ns()
    with KVCache(store, lay, src_bufs, namespace=name) as src, \
            KVCache(store, lay, dst_bufs, namespace=name) as dst:
        assert src.save(t, [0, 1, 2]) == 3
        keys = src.chunk_keys(t)
        corrupt_piece(store, src, keys[1], piece=3)
        assert dst.load(t, [4, 5, 6]) == 16        # never raises
        assert dst.stats.corrupt_misses == 1
        assert block_bytes(lay, dst_bufs, 4) == block_bytes(lay, src_bufs, 0)
        # a piece of another size, and a forged manifest
        key = src.piece_keys(keys[0])[0]
        store.remove(key)
        store.put(key, b"short")
        assert dst.load(t, [4, 5, 6]) == 0
        assert dst.stats.corrupt_misses == 2
        mk = src.manifest_key(keys[0])
        raw = bytearray(store.get_bytes(mk))
        store.remove(mk)
        raw[12] ^= 0xFF                            # the fingerprint inside
        store.put(mk, bytes(raw))
        assert dst.load(t, [4, 5, 6]) == 0
        assert dst.stats.corrupt_misses == 3


def test_missing_piece_is_plain_miss(store):
    lay = LAYOUTS["sglang"]
    t = tokens(16 * 2)
    name = ns()
    with KVCache(store, lay, buffers(lay), namespace=name) as src, \
            KVCache(store, lay, buffers(lay, fill=False), namespace=name) as dst:
        assert src.save(t, [0, 1]) == 2
        store.remove(src.piece_keys(src.chunk_keys(t)[1])[1])
        assert dst.lookup(t) == 32                 # the manifest is there
        assert dst.load(t, [2, 3]) == 16
        assert dst.stats.corrupt_misses == 0


def test_wrong_layout_is_miss(store):
    lay = LAYOUTS["vllm"]
    other = KVLayout.vllm("m", "float16", num_layers=3, num_blocks=8, block_size=16,
                          num_kv_heads=2, head_dim=32)
    rank1 = KVLayout.vllm("m", "bfloat16", num_layers=3, num_blocks=8, block_size=16,
                          num_kv_heads=2, head_dim=32, tp_rank=1, tp_size=2)
    t = tokens(32)
    name = ns()
    with KVCache(store, lay, buffers(lay), namespace=name) as src:
        assert src.save(t, [0, 1]) == 2
        for lay2 in (other, rank1):
            dst_bufs = buffers(lay2, fill=False)
            with KVCache(store, lay2, dst_bufs, namespace=name) as dst:
                assert dst.lookup(t) == 0
                assert dst.load(t, [0, 1]) == 0
                assert not any(b.any() for b in dst_bufs)
                assert dst.stats.corrupt_misses == 0


def test_bad_input(store):
    lay = LAYOUTS["sglang"]
    with pytest.raises(ValueError):
        KVCache(store, lay, [])
    with pytest.raises(ValueError):
        KVCache(store, lay, [bytearray(10)])
    with KVCache(store, lay, buffers(lay), namespace=ns()) as c:
        with pytest.raises(ValueError):
            c.save(tokens(16), [99])
        assert c.save(tokens(5), [0]) == 0         # no full chunk
        assert c.load(tokens(5), [0]) == 0


def test_many_chunks_span_batches(store):
    # more pieces than one store batch holds: the save and load split
    lay = KVLayout.vllm("m", "bfloat16", num_layers=40, num_blocks=64, block_size=4,
                        num_kv_heads=1, head_dim=8)
    src_bufs, dst_bufs = buffers(lay, seed=9), buffers(lay, fill=False)
    t = tokens(4 * 60)
    blocks = list(range(60))
    name = ns()
    with KVCache(store, lay, src_bufs, namespace=name) as src, \
            KVCache(store, lay, dst_bufs, namespace=name) as dst:
        assert src.save(t, blocks) == 60
        assert dst.load(t, blocks) == 240
        assert all(block_bytes(lay, src_bufs, b) == block_bytes(lay, dst_bufs, b) for b in blocks)
        assert block_bytes(lay, dst_bufs, 63) == bytes(len(block_bytes(lay, dst_bufs, 63)))
        src.remove(t)


def test_torch_cpu_tensor(store):
    torch = pytest.importorskip("torch")
    lay = LAYOUTS["vllm"]
    src = [torch.randn(lay.buffer_shape(), dtype=torch.bfloat16) for _ in range(lay.num_layers)]
    dst = [torch.zeros(lay.buffer_shape(), dtype=torch.bfloat16) for _ in range(lay.num_layers)]
    t = tokens(32)
    name = ns()
    with KVCache(store, lay, src, namespace=name) as a, KVCache(store, lay, dst, namespace=name) as b:
        a.save(t, [0, 1])
        assert b.load(t, [2, 3]) == 32
        assert torch.equal(dst[0][:, 2], src[0][:, 0]) and torch.equal(dst[2][:, 3], src[2][:, 1])


def test_no_leak(master):
    base = kvferry.alloc_stats()
    lay = LAYOUTS["mla"]
    with kvferry.Store.connect(master) as st:
        with KVCache(st, lay, buffers(lay), namespace=ns()) as c:
            t = tokens(32)
            c.save(t, [0, 1])
            c.load(t, [2, 3])
            c.remove(t)
    assert kvferry.alloc_stats() == base


def test_cuda_tensors(store):
    """GPU caches: torch CUDA tensors through the store's device-memory
    path, verified with kvf_gpu_checksum (runs where torch sees a GPU)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    lay = KVLayout.vllm("m", "bfloat16", num_layers=4, num_blocks=16, block_size=16,
                        num_kv_heads=2, head_dim=64)
    src = [torch.randn(lay.buffer_shape(), dtype=torch.bfloat16, device="cuda")
           for _ in range(lay.num_layers)]
    dst = [torch.zeros_like(s) for s in src]
    host = [np.zeros(lay.buffer_bytes(), dtype=np.uint8) for _ in range(lay.num_layers)]
    t = tokens(16 * 4)
    name = ns()
    with KVCache(store, lay, src, namespace=name) as a, \
            KVCache(store, lay, dst, namespace=name) as b, \
            KVCache(store, lay, host, namespace=name) as h:
        assert a.save(t, [3, 5, 7, 9]) == 4
        assert b.load(t, [0, 1, 2, 15]) == 64
        torch.cuda.synchronize()
        for layer in range(lay.num_layers):
            assert torch.equal(dst[layer][:, 0], src[layer][:, 3])
            assert torch.equal(dst[layer][:, 15], src[layer][:, 9])
        # a host cache of the same layout reads what the GPU cache wrote
        assert h.load(t, [0, 1, 2, 3]) == 64
        assert bytes(host[1][: lay.block_size * lay.token_bytes]) == \
            src[1][0, 3].cpu().contiguous().view(torch.uint8).numpy().tobytes()
        corrupt_piece(store, a, a.chunk_keys(t)[2])
        assert b.load(t, [0, 1, 2, 15]) == 32 and b.stats.corrupt_misses == 1
