"""kvferry.kv_pipe: the stage pipeline's order, overlap and error rules,
and ChunkStore's GPU paths (pipelined and serial) driven on host memory.

The first tests move bytes between Python buffers (a bytearray per stage
half) so that every slice's data can be checked end to end; the GPU
copies themselves are covered by test_kv_chunks.py on a GPU machine.
"""

import ctypes
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from kvferry import _lib, kv_chunks as kc, kv_gpu
from kvferry.errors import ERR_CHECKSUM, OK
from kvferry.kv_pipe import StagePipe


class _Copier:
    """Stands in for the DMA copier: post(fn) runs fn on a thread of its
    own, in the order posted (as the copy-engine stream does), and
    returns the ticket that wait() takes."""

    closed = False

    def __init__(self):
        self._pool = ThreadPoolExecutor(1)

    def post(self, fn):
        return self._pool.submit(fn)

    def wait(self, ticket):
        ticket.result()

    def done(self, ticket):
        return ticket.done()

    def close(self):
        self.closed = True
        self._pool.shutdown(wait=True)


def _slices(n):
    return [bytes([k]) * 1024 for k in range(n)]


def test_run_in_moves_every_slice_through_alternating_halves():
    halves = [bytearray(1024), bytearray(1024)]
    out, used = [], []
    pipe = StagePipe(0, copier=_Copier())
    try:
        def dma_in(copier, item, h):
            return copier.post(lambda: halves[h].__setitem__(slice(None), item))

        def work(item, h):
            used.append(h)
            out.append(bytes(halves[h]))

        pipe.run_in(_slices(7), dma_in, work)
    finally:
        pipe.close()
    assert out == _slices(7)  # each slice's bytes, in order, none overwritten early
    assert used == [k % 2 for k in range(7)]


def test_run_in_over_four_segments_keeps_a_dma_posted_behind_each_work():
    segs = [bytearray(1024) for _ in range(4)]
    out, used, posted = [], [], []
    pipe = StagePipe(0, copier=_Copier())
    try:
        def dma_in(copier, item, h):
            posted.append(item[0])

            def move():
                time.sleep(0.002)
                segs[h][:] = item
            return copier.post(move)

        def work(item, h):
            used.append(h)
            out.append(bytes(segs[h]))
            if item[0] < 10:  # the engines never wait for the work
                assert item[0] + 1 in posted

        pipe.run_in(_slices(11), dma_in, work, segments=4)
    finally:
        pipe.close()
    assert out == _slices(11)  # no segment rewritten before its slice was worked on
    assert used == [k % 4 for k in range(11)]


def test_run_in_overlaps_the_next_dma_with_the_work():
    started = threading.Event()
    seen = []
    pipe = StagePipe(0, copier=_Copier())
    try:
        def dma_in(copier, item, h):
            return copier.post(started.set if item == 1 else (lambda: None))

        def work(item, h):
            if item == 0:  # slice 1's DMA runs while slice 0 is worked on
                seen.append(started.wait(5))

        pipe.run_in(range(3), dma_in, work)
    finally:
        pipe.close()
    assert seen == [True]


def test_run_out_reuses_a_half_only_after_its_dma():
    halves = [bytearray(1024), bytearray(1024)]
    landed = {}
    pipe = StagePipe(0, copier=_Copier())
    try:
        def work(item, h):
            halves[h][:] = item

        def dma_out(copier, item, h):
            def move():
                time.sleep(0.01)  # a slow link: the next gather must not wait for it
                landed[item[0]] = bytes(halves[h])
            return copier.post(move)

        pipe.run_out(_slices(6), work, dma_out)
    finally:
        pipe.close()
    assert [landed[k] for k in range(6)] == _slices(6)


def test_an_error_raises_after_every_dma_ended():
    ended = []
    pipe = StagePipe(0, copier=_Copier())
    try:
        def dma_in(copier, item, h):
            def move():
                time.sleep(0.02)
                ended.append(item)
            return copier.post(move)

        def work(item, h):
            if item == 1:
                raise ValueError("scatter failed")

        with pytest.raises(ValueError):
            pipe.run_in(range(4), dma_in, work)
        assert ended == [0, 1, 2]  # slice 2's DMA was flying: waited for

        def bad_dma(copier, item, h):
            def move():
                if item == 2:
                    raise RuntimeError("dma failed")
            return copier.post(move)

        with pytest.raises(RuntimeError):
            pipe.run_out(range(4), lambda item, h: None, bad_dma)
    finally:
        pipe.close()


def test_close_closes_the_copier_and_refuses_more_work():
    copier = _Copier()
    pipe = StagePipe(0, copier=copier)
    pipe.close()
    assert copier.closed
    with pytest.raises(RuntimeError):
        pipe.run_in(range(2), lambda c, i, h: None, lambda i, h: None)


# -- ChunkStore's GPU paths, their Python side, on host memory ---------------
#
# The GPU copier's calls are served by HostCopier (the same arguments,
# memmove and kvf_checksum instead of the kernels and the copy engines),
# so that the pipelined and the serial GPU paths' descriptors, stage
# halves and offsets are checked byte for byte on a machine without a
# GPU. The kernels themselves are covered on the GPU machine.


class HostCopier:
    """kv_gpu.GpuMover's copy and copy_plain on host addresses; every
    range checked against its memory's bounds."""

    def __init__(self):
        self.plain = []  # (source, destination) of each copy_plain
        self.posts = 0

    @staticmethod
    def _move(src, dst, s, d, n):
        assert 0 <= s and s + n <= src.len and 0 <= d and d + n <= dst.len, "out of bounds"
        ctypes.memmove(dst.base + d, src.base + s, n)

    def copy(self, src, dst, src_offs, dst_offs, lens, expect=None, **_):
        sums = np.zeros(len(lens), dtype=np.uint64)
        for i, (s, d, n) in enumerate(zip(src_offs, dst_offs, lens)):
            self._move(src, dst, int(s), int(d), int(n))
            sums[i] = _lib.lib().kvf_checksum(dst.base + int(d), int(n))
        ok = expect is None or np.array_equal(sums, np.asarray(expect, dtype=np.uint64))
        return (OK if ok else ERR_CHECKSUM), sums

    def copy_plain(self, src, dst, src_offs, dst_offs, lens, **_):
        self.plain.append((src.base, dst.base))
        for s, d, n in zip(src_offs, dst_offs, lens):
            self._move(src, dst, int(s), int(d), int(n))

    def post_plain(self, src, dst, src_offs, dst_offs, lens):
        self.copy_plain(src, dst, src_offs, dst_offs, lens)
        self.posts += 1
        return self.posts - 1

    def wait(self, ticket):
        assert 0 <= ticket < self.posts, "a ticket never given"

    def done(self, ticket):
        self.wait(ticket)
        return True

    def close(self):
        pass


class _HostBuffer:
    def __init__(self, nbytes, device=0):
        self.a = np.zeros(nbytes, dtype=np.uint8)

    def mem(self):
        return kv_gpu.GpuMem(self.a.ctypes.data, self.a.nbytes, _lib.MEM_CUDA, 0)

    def close(self):
        self.a = None


class _Mapped:
    def ensure(self, base, length):
        return True


class _HostKvg:
    """What ChunkStore takes of kvferry.kv_gpu, on host memory."""

    GpuMem, POSTS = kv_gpu.GpuMem, kv_gpu.POSTS
    DeviceBuffer = _HostBuffer

    @staticmethod
    def host_mappings(store):
        return _Mapped()


def _host_gpu_store(store, tensors, namespace, pipeline):
    cs = kc.ChunkStore(store, tensors, tensors[0].shape[1], 16, "fp1" * 8, namespace=namespace,
                       chunk_tokens=64, layer_groups=3, gpu_stage_bytes=1, pipeline=pipeline)
    cs.gpu, cs._kvg, cs._mover = True, _HostKvg, HostCopier()
    cs._side = kv_gpu.GpuMem(cs.map.base, cs.map.end - cs.map.base, _lib.MEM_CUDA, 0)
    if pipeline:
        cs._pipe = StagePipe(0, copier=HostCopier())
    return cs


def _saved_pair(store, seed, pipeline):
    """A producer's and a consumer's host-memory stores of one namespace
    (6 layers), the producer's cache random, 256 tokens of it (blocks
    0..15) saved: (src, dst, a, b, tokens)."""
    rng = np.random.default_rng(seed)
    shape = (2, 40, 16, 2, 32)
    src = [rng.integers(0, 1 << 16, shape, dtype=np.uint16) for _ in range(6)]
    dst = [np.zeros(shape, dtype=np.uint16) for _ in range(6)]
    name = "kp-" + uuid.uuid4().hex[:10]
    a, b = _host_gpu_store(store, src, name, pipeline), _host_gpu_store(store, dst, name, pipeline)
    toks = [int(x) for x in rng.integers(1, 30000, 256)]
    assert a.save([kc.SaveReq(a.chunks_of(toks, 256), list(range(16)))])() == 4 * a.groups
    return src, dst, a, b, toks


@pytest.mark.parametrize("pipeline", [True, False])
def test_gpu_paths_on_host_memory_byte_for_byte(store, pipeline):
    """Save and load through the GPU paths (put views, stage, gather,
    DMA out; views, DMA in, scatter), the stage cut in halves or not."""
    src, dst, a, b, toks = _saved_pair(store, 3, pipeline)
    hit, chunks = b.lookup(toks, 256)
    req = kc.LoadReq(chunks, list(range(20, 36)), 0, hit)
    done = []
    b.load([req], group_done=done.append)
    assert req.loaded == 256 and req.failed_blocks == []
    assert done == list(range(b.groups)) and b.stats.t_dma > 0
    assert b.stats.viewed_objects == 4 * b.groups and b.stats.corrupt_misses == 0
    for s, d in zip(src, dst):
        assert np.array_equal(s[:, 0:16], d[:, 20:36])
    if pipeline:  # the DMAs used both halves: out of them (save), into them (load)
        for cs, end in ((a, 0), (b, 1)):
            base, half = cs._gstage.mem().base, cs._gstage_bytes // 2
            halves = {(pair[end] - base) // half for pair in cs._pipe._copier.plain}
            assert halves == {0, 1}
    a.close()
    b.close()


def test_the_stage_has_at_most_the_segments_a_copier_tells_apart(store):
    """A stage of many slices is cut in kv_gpu.POSTS segments at most
    (each pipeline wait then names its own post), all inside the stage."""
    cs = _host_gpu_store(store, [np.zeros((2, 40, 16, 2, 32), dtype=np.uint16)], "segs", True)
    gst = kv_gpu.GpuMem(1 << 30, 512 << 20, _lib.MEM_CUDA, 0)
    for slice_cap, want in ((256 << 20, 2), (64 << 20, 8), (16 << 20, kv_gpu.POSTS)):
        cs._gstage_bytes, cs._slice_cap = 512 << 20, slice_cap
        segs = cs._segments(gst)
        assert len(segs) == want and all(g.len >= slice_cap for g in segs)
        assert segs[-1].base + segs[-1].len <= gst.base + gst.len
    cs.close()


@pytest.mark.parametrize("pipeline", [True, False])
def test_a_damaged_piece_ends_the_hit_there(store, pipeline):
    """A piece whose bytes differ from its header's checksum (third block
    of one group's object) is caught by the verifying scatter: the hit
    ends before that block, the rest is left to be recomputed."""
    _, _, a, b, toks = _saved_pair(store, 4, pipeline)
    hit, chunks = b.lookup(toks, 256)
    ch = chunks[0]
    key = b.object_key(ch.key, ch.blocks, 1)
    raw = bytearray(store.get_bytes(key))
    raw[kc.header_bytes(b._batches[1].q, ch.blocks) + 2 * b.map.piece_bytes] ^= 0xFF
    store.remove(key)
    store.put(key, bytes(raw))
    req = kc.LoadReq(chunks, list(range(20, 36)), 0, hit)
    b.load([req])
    assert req.loaded == 2 * 16 and req.failed_blocks == list(range(22, 36))
    assert b.stats.corrupt_misses == 1
    a.close()
    b.close()
