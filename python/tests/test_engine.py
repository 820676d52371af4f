"""Engine, Region, Peer and Batch against a real `kvferry target`."""

import array
import ctypes
import random
import threading
import time

import pytest

import kvferry
from kvferry.procs import Target

BLK = 8192


def remote_bytes(t, off, n):
    """The target's pool bytes at off, read through a fresh engine."""
    with kvferry.Engine() as e:
        buf = bytearray(n)
        r = e.register(buf)
        e.open(t.segment).read([((r, 0), t.pool_addr + off, n)]).result(10)
        r.deregister()
        return bytes(buf)


def test_version_and_status_names():
    assert kvferry.version() == "0.1.0"
    assert kvferry.status_name(-6) == "KVF_ERR_TIMEOUT"
    assert "time" in kvferry.status_str(-6)
    assert kvferry.config_get("no_such_key_at_all") is None
    assert kvferry.config_get("transports") is not None
    assert kvferry.checksum(b"abc") == kvferry.checksum(bytearray(b"abc"))


def test_engine_properties(engine):
    assert ":" in engine.segment_name
    assert engine.transports
    assert "Engine" in repr(engine)


def test_ucx_workers_over_ucx(monkeypatch):
    """ucx_workers reaches the ucx transport: 3 lanes move verified blocks
    from a target of the same process (over UCX's tcp here: the opt-in
    ucx_tcp, docs/ucx.md)."""
    monkeypatch.setenv("KVF_UCX_TCP", "1")
    try:
        tgt = kvferry.Engine(transports="ucx", ucx_workers=3)
    except kvferry.KvferryError as e:
        pytest.skip("no ucx transport here: %s" % e)
    if kvferry.config_get("ucx_workers") is None:  # built without UCX (the portable wheel)
        tgt.close()
        pytest.skip("this build has no ucx transport")
    src = bytearray(random.randbytes(8 * BLK))
    with tgt, kvferry.Engine(transports="ucx", ucx_workers=3, no_listen=True) as ini:
        assert "ucx" in tgt.transports
        r = tgt.register(src)
        dst = bytearray(8 * BLK)
        rd = ini.register(dst)
        with ini.open(tgt.segment_name) as p:
            assert p.transport == "ucx"
            with p.read([(rd.addr + i * BLK, r.addr + (7 - i) * BLK, BLK) for i in range(8)]) as b:
                assert b.result(10) == 8 * BLK
        assert dst == b"".join(src[(7 - i) * BLK:(8 - i) * BLK] for i in range(8))
        rd.deregister()
        r.deregister()


def test_read_write_roundtrip(engine, target):
    p = engine.open(target.segment)
    assert p.transport in ("tcp", "shm")
    regs = p.regions()
    assert regs and regs[0][0] == target.pool_addr and regs[0][1] == target.pool_len
    src = bytearray(random.randbytes(4 * BLK))
    dst = bytearray(4 * BLK)
    rs, rd = engine.register(src), engine.register(dst)
    base = target.pool_addr + (1 << 20)
    ops = [((rs, i * BLK), base + (3 - i) * BLK, BLK) for i in range(4)]
    with p.write(ops) as b:
        assert b.result(10) == 4 * BLK
        assert b.statuses() == [0] * 4
        assert b.op_status(0) == (0, BLK)
        assert b.done()
    with p.read([(rd.addr + i * BLK, base + (3 - i) * BLK, BLK) for i in range(4)]) as b:
        assert b.wait(10) is True
        b.result()
    assert dst == src
    rs.deregister()
    rd.deregister()
    p.close()


def test_blocks_forms(engine, target):
    p = engine.open(target.segment)
    n = 64
    r = engine.alloc(n * BLK)
    offs = list(range(0, n * BLK, BLK))
    remote = [target.pool_addr + random.randrange(0, target.pool_len // BLK) * BLK for _ in range(n)]
    p.read_blocks(r, offs, remote, BLK).result(10)
    one = bytes(r.memoryview()[:BLK])
    assert one == remote_bytes(target, remote[0] - target.pool_addr, BLK)
    got = bytes(r.memoryview())
    r2 = engine.register(bytearray(n * BLK))
    p.read_blocks(r2, array.array("Q", offs), array.array("Q", remote), [BLK] * n, inline=True).result(10)
    assert bytes(r2.obj) == got
    # write_blocks: r2's blocks to a scratch area of the pool, read back
    scratch = [target.pool_addr + (8 << 20) + i * BLK for i in range(n)]
    p.write_blocks(r2, offs, scratch, BLK).result(10)
    assert remote_bytes(target, 8 << 20, n * BLK) == got
    r.deregister()
    r2.deregister()


def test_numpy_buffers(engine, target):
    np = pytest.importorskip("numpy")
    p = engine.open(target.segment)
    n = 128
    a = np.zeros((n, BLK), dtype=np.uint8)
    r = engine.register(a)
    remote = target.pool_addr + np.random.default_rng(1).integers(0, target.pool_len // BLK, n, dtype=np.uint64) * BLK
    p.read_blocks(r, np.arange(n, dtype=np.uint64) * BLK, remote, BLK).result(10)
    assert bytes(a[5]) == remote_bytes(target, int(remote[5]) - target.pool_addr, BLK)
    with pytest.raises(kvferry.BufferTypeError):
        engine.register(a[:, ::2])  # not contiguous
    with pytest.raises(kvferry.NotRegisteredError):
        p.read_blocks(r, np.array([n * BLK], dtype=np.uint64), remote[:1], BLK)
    r.deregister()


@pytest.mark.parametrize("mode", ["sliced", "packed", "numpy"])
def test_numpy_blocks_forms(engine, target, monkeypatch, mode):
    """read_blocks/write_blocks with numpy arrays move the same bytes
    whether libkvferry_pyops.so checks, builds and submits them in slices
    (sliced), builds the whole array for an inline batch (packed), or
    numpy builds it (no helper): strided and int64 inputs, per-block
    lengths, and a block one byte past the region refused before
    anything moves."""
    np = pytest.importorskip("numpy")
    from kvferry import _lib

    monkeypatch.setattr(_lib, "_pyops_buffers", False)  # its own test below
    if mode == "numpy":
        monkeypatch.setattr(_lib, "_pyops_blocks", False)
    elif _lib.pyops_blocks_submit() is None:
        pytest.skip("no libkvferry_pyops.so with kvf_pyops_blocks_submit")
    inline = mode == "packed"
    p = engine.open(target.segment)
    n = 600  # more than the first slice (256): the sliced mode makes two
    a = np.zeros(n * BLK, dtype=np.uint8)
    r = engine.register(a)
    slots = np.random.default_rng(7).permutation((12 << 20) // BLK)[:n].astype(np.int64)
    remote = target.pool_addr + slots * BLK  # int64: converted
    offs = np.arange(2 * n, dtype=np.uint64)[::2] // 2 * BLK  # strided view: made contiguous
    b = p.read_blocks(r, offs, remote, np.uint64(BLK), inline=inline)
    assert b.result(10) == n * BLK and set(b.statuses()) == {0}
    assert len(b._hs) == (2 if mode == "sliced" else 1)
    for i in (0, 255, 256, n - 1):
        assert bytes(a[i * BLK:(i + 1) * BLK]) == remote_bytes(target, int(slots[i]) * BLK, BLK)
    # per-block lengths: the first half of each block, packed into a scratch area
    half = BLK // 2
    lens = np.full(n, half, dtype=np.uint64)
    scratch = target.pool_addr + (12 << 20) + np.arange(n, dtype=np.uint64) * half
    assert p.write_blocks(r, offs, scratch, lens, inline=inline).result(10) == n * half
    got = remote_bytes(target, 12 << 20, n * half)
    for i in (0, 300, n - 1):
        assert got[i * half:(i + 1) * half] == bytes(a[i * BLK:i * BLK + half])
    # a block one byte past the region, or a length past it: refused, nothing moved
    _past_region_refused(p, r, a, offs, remote, inline=inline)
    with pytest.raises(kvferry.NotRegisteredError):
        p.read_blocks(r, offs, remote, np.full(n, BLK + 1, dtype=np.uint64), inline=inline)
    with pytest.raises(kvferry.InvalidParamError):
        p.read_blocks(r, offs, remote[: n - 1], BLK, inline=inline)
    with pytest.raises(kvferry.InvalidParamError):
        p.read_blocks(r, offs, remote, lens[:-1], inline=inline)
    time.sleep(0.1)
    assert not a.any()
    r.deregister()


def _past_region_refused(p, r, a, offs, remote, **kw):
    """a zeroed, then a read_blocks whose last block ends one byte past
    the region refused with NotRegisteredError; the caller checks that
    nothing moved."""
    a[:] = 0
    bad = offs.copy()
    bad[-1] = len(a) - BLK + 1
    with pytest.raises(kvferry.NotRegisteredError):
        p.read_blocks(r, bad, remote, BLK, **kw)


def _counted_buffers(monkeypatch):
    """kvf_pyops_blocks_buffers wrapped to record what each call returned
    (the test skips where the helper lacks it: before CPython 3.11)."""
    from kvferry import _lib

    real = _lib.pyops_blocks_buffers()
    if real is None:
        pytest.skip("no kvf_pyops_blocks_buffers here (CPython < 3.11 or no helper)")
    got = []

    def counted(*args):
        got.append(real(*args))
        return got[-1]

    monkeypatch.setattr(_lib, "_pyops_buffers", counted)
    return got


def test_blocks_through_buffers(engine, target, monkeypatch):
    """Contiguous uint64 arrays (numpy, array('Q')) and an int length go
    through kvf_pyops_blocks_buffers, which reads them through the buffer
    protocol and submits in slices: the blocks arrive byte for byte, a
    first batch larger than the thread's op array grows it (-3, then n),
    and a block outside the region is refused with nothing moved."""
    np = pytest.importorskip("numpy")
    got = _counted_buffers(monkeypatch)
    p = engine.open(target.segment)
    n = 1500  # more than a new thread's op array (1024): grown once
    a = np.zeros(n * BLK, dtype=np.uint8)
    r = engine.register(a)
    slots = np.random.default_rng(11).permutation((16 << 20) // BLK)[:n].astype(np.uint64)
    offs = np.arange(n, dtype=np.uint64) * np.uint64(BLK)
    remote = np.uint64(target.pool_addr) + slots * np.uint64(BLK)
    b = p.read_blocks(r, offs, remote, BLK)
    assert b.result(10) == n * BLK and set(b.statuses()) == {0}
    assert got == [-3, n] and len(b._hs) == 3  # 256, 1024, the rest
    for i in (0, 255, 256, 1279, 1280, n - 1):
        assert bytes(a[i * BLK:(i + 1) * BLK]) == remote_bytes(target, int(slots[i]) * BLK, BLK)
    # array('Q') takes the path too: half blocks into a scratch area
    half, m = BLK // 2, 300
    scratch = [target.pool_addr + (12 << 20) + i * half for i in range(m)]
    assert p.write_blocks(r, array.array("Q", range(0, m * BLK, BLK)), array.array("Q", scratch),
                          half).result(10) == m * half
    assert got[-1] == m
    back = remote_bytes(target, 12 << 20, m * half)
    for i in (0, 150, m - 1):
        assert back[i * half:(i + 1) * half] == bytes(a[i * BLK:i * BLK + half])
    # one block one byte past the region: -1, refused, nothing moved
    _past_region_refused(p, r, a, offs, remote)
    assert got[-1] == -1
    time.sleep(0.1)
    assert not a.any()
    r.deregister()


def _blocks_outcome(p, r, a, args):
    """What read_blocks(r, *args) does: the bytes it moved, or the error."""
    a[:] = 0
    try:
        p.read_blocks(r, *args).result(10)
    except Exception as e:
        return ("error", type(e), str(e))
    return ("ok", bytes(a))


def test_blocks_buffers_declines_to_the_other_paths(engine, target, monkeypatch):
    """Every other form (int64 or strided arrays, lists, a numpy length,
    arrays of two lengths, a read-only or closed region) is declined by
    kvf_pyops_blocks_buffers (-2) and ends as it ends without it: the
    same bytes moved, or the same exception."""
    np = pytest.importorskip("numpy")
    from kvferry import _lib

    got = _counted_buffers(monkeypatch)
    counted = _lib._pyops_buffers
    p = engine.open(target.segment)
    n = 64
    a = np.zeros(n * BLK, dtype=np.uint8)
    r = engine.register(a)
    ro = engine.register(bytes(n * BLK))
    closed = engine.alloc(n * BLK)
    closed.deregister()
    offs = np.arange(n, dtype=np.uint64) * np.uint64(BLK)
    remote = np.uint64(target.pool_addr) + offs[::-1].copy()
    forms = [
        (r, (offs.astype(np.int64), remote, BLK)),
        (r, (np.repeat(offs, 2)[::2], remote, BLK)),  # a strided view
        (r, ([int(x) for x in offs], remote, BLK)),
        (r, (offs, remote, np.uint64(BLK))),
        (r, (offs, remote[:-1], BLK)),
        (ro, (offs, remote, BLK)),
        (closed, (offs, remote, BLK)),
    ]
    for region, args in forms:
        del got[:]
        monkeypatch.setattr(_lib, "_pyops_buffers", counted)
        with_it = _blocks_outcome(p, region, a, args)
        assert got == [-2], (region, got)
        monkeypatch.setattr(_lib, "_pyops_buffers", False)
        assert _blocks_outcome(p, region, a, args) == with_it
    r.deregister()
    ro.deregister()


def test_block_helpers_refuse_what_does_not_fit(engine, target):
    """The block helpers of libkvferry_pyops.so refuse (-2) a batch larger
    than the op array they are given, and submit nothing, rather than
    write past it; a block outside the region is -1."""
    np = pytest.importorskip("numpy")
    from kvferry import _lib

    pack, submit = _lib.pyops_blocks(), _lib.pyops_blocks_submit()
    if submit is None:
        pytest.skip("no libkvferry_pyops.so with kvf_pyops_blocks_submit")
    p = engine.open(target.segment)
    r = engine.alloc(4 * BLK)
    offs = np.arange(4, dtype=np.uint64) * BLK
    addrs = target.pool_addr + offs
    out = np.zeros(5 * 4, dtype=np.uint64)
    slices, res, total = np.zeros(8, dtype=np.uint64), np.zeros(3, dtype=np.uint64), ctypes.c_uint64()
    head = (offs.ctypes.data, addrs.ctypes.data, None, BLK, 4, r.addr, r.nbytes, _lib.OP_READ, p._h)
    tail = (slices.ctypes.data, 8, res.ctypes.data)
    eh = engine._handle()
    assert pack(*head, out.ctypes.data, 3, ctypes.byref(total)) == -2
    assert submit(*head, eh, 256, out.ctypes.data, 3, *tail) == -2
    assert not out.any() and not slices.any()
    bad = (offs.ctypes.data, addrs.ctypes.data, None, BLK + 1) + head[4:]
    assert pack(*bad, out.ctypes.data, 4, ctypes.byref(total)) == -1
    assert submit(*bad, eh, 256, out.ctypes.data, 4, *tail) == -1
    assert not slices.any()
    assert pack(*head, out.ctypes.data, 4, ctypes.byref(total)) == 4 and total.value == 4 * BLK
    r.deregister()


def test_torch_cpu(engine, target):
    torch = pytest.importorskip("torch")
    t = torch.zeros(4 * BLK, dtype=torch.uint8)
    r = engine.register(t)
    assert r.nbytes == 4 * BLK and r.mem_type in (kvferry.MEM_HOST, kvferry.MEM_PINNED)
    engine.open(target.segment).read([((r, 0), target.pool_addr, BLK)]).result(10)
    assert bytes(t[:BLK].numpy()) == remote_bytes(target, 0, BLK)
    r.deregister()


def test_register_bad_types(engine):
    for bad in (123, "text", None, 1.5, object()):
        with pytest.raises(kvferry.BufferTypeError) as ei:
            engine.register(bad)
        assert isinstance(ei.value, TypeError) and ei.value.code == -1
    with pytest.raises(kvferry.BufferTypeError):
        engine.register(bytearray())
    ba = bytearray(100)
    r = engine.register(ba)
    with pytest.raises(BufferError):
        ba.extend(b"x")  # locked while registered
    r.deregister()
    ba.extend(b"x")
    r.deregister()  # twice is fine


def test_bad_ops(engine, target):
    p = engine.open(target.segment)
    buf = bytearray(BLK)
    r = engine.register(buf)
    with pytest.raises(kvferry.NotRegisteredError):  # too small region
        p.read([((r, 1), target.pool_addr, BLK)])
    unreg = bytearray(BLK)
    import ctypes

    addr = ctypes.addressof((ctypes.c_char * BLK).from_buffer(unreg))
    with pytest.raises(kvferry.KvferryError) as ei:
        p.read([(addr, target.pool_addr, BLK)]).result(10)
    assert ei.value.code in (-42, -41, -1)
    with pytest.raises(kvferry.InvalidParamError):
        p.read([])
    with pytest.raises(kvferry.InvalidParamError):
        p.read([(1, 2)])
    with pytest.raises(kvferry.BufferTypeError):
        p.read([(("x", 0), target.pool_addr, 8)])
    ro = engine.register(b"read only bytes")
    with pytest.raises(kvferry.InvalidParamError):
        p.read([((ro, 0), target.pool_addr, 4)])
    p.write([((ro, 0), target.pool_addr + (2 << 20), 4)]).result(10)
    # remote address outside the target's pool: the target refuses it
    with pytest.raises(kvferry.KvferryError) as ei:
        p.read([((r, 0), 0x1000, BLK)]).result(10)
    assert ei.value.code < 0
    with pytest.raises(kvferry.ConnectError):
        kvferry.Engine(timeout_ms=500).open("127.0.0.1:1")
    r.deregister()
    ro.deregister()


def test_cancel_and_timeout(engine, target):
    p = engine.open(target.segment)
    n = 2048
    r = engine.register(bytearray(n * BLK))
    b = p.read_blocks(r, list(range(0, n * BLK, BLK)), [target.pool_addr + i * BLK for i in range(n)], BLK)
    b.cancel()
    assert b.wait(10)
    st = b.test()
    assert st in (0, -7)
    if st == -7:
        with pytest.raises(kvferry.CanceledError):
            b.result()
        assert -7 in b.statuses()
    b.close()
    with pytest.raises(kvferry.ClosedError):
        b.wait()
    r.deregister()


def test_call_after_close(target):
    e = kvferry.Engine()
    p = e.open(target.segment)
    r = e.register(bytearray(BLK))
    b = p.read([((r, 0), target.pool_addr, BLK)])
    e.close()
    e.close()
    for call in (lambda: e.segment_name, lambda: e.register(bytearray(8)),
                 lambda: e.open(target.segment), lambda: p.read([((r, 0), target.pool_addr, BLK)]),
                 lambda: b.result(), lambda: r.span()):
        with pytest.raises(kvferry.ClosedError):
            call()
    assert r.closed and b._h is None


def test_dead_target():
    t = Target(pool="4M").start()
    try:
        with kvferry.Engine(timeout_ms=2000) as e:
            p = e.open(t.segment)
            r = e.register(bytearray(BLK))
            p.read([((r, 0), t.pool_addr, BLK)]).result(10)
            t.kill()
            with pytest.raises(kvferry.KvferryError) as ei:
                p.read([((r, 0), t.pool_addr, BLK)]).result(10)
            assert ei.value.code < 0
    finally:
        t.close()


def test_threads_share_engine_and_release_gil(engine, target):
    p = engine.open(target.segment)
    errors = []
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    def worker(k):
        try:
            r = engine.register(bytearray(64 * BLK))
            for _ in range(20):
                p.read_blocks(r, list(range(0, 64 * BLK, BLK)),
                              [target.pool_addr + ((k * 64 + i) % 2048) * BLK for i in range(64)],
                              BLK).result(20)
            r.deregister()
        except Exception as ex:  # noqa: BLE001
            errors.append(ex)

    s = threading.Thread(target=spin)
    s.start()
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stop.set()
    s.join()
    assert not errors
    assert ticks[0] > 0


def test_blocking_call_releases_gil():
    """A thread blocked in a C call (kvf_peer_open waiting for a peer that
    accepted the connection but never answers) lets other threads run."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # the kernel completes connects; nobody answers
    name = "127.0.0.1:%d" % silent.getsockname()[1]
    with kvferry.Engine(timeout_ms=1500) as e:
        result = []

        def blocked():
            t0 = time.monotonic()
            try:
                e.open(name)
            except kvferry.KvferryError as ex:
                result.append(ex)
            result.append(time.monotonic() - t0)

        th = threading.Thread(target=blocked)
        th.start()
        time.sleep(0.1)
        spins = 0
        t0 = time.monotonic()
        while th.is_alive() and time.monotonic() - t0 < 10:
            spins += 1
        th.join()
    silent.close()
    assert isinstance(result[0], kvferry.KvferryError)
    assert result[-1] >= 0.5  # it did block in C
    assert spins > 10000  # and this thread ran meanwhile


def test_no_leaks(target):
    from conftest import open_fds

    def cycle():
        with kvferry.Engine() as e:
            p = e.open(target.segment)
            r = e.register(bytearray(16 * BLK))
            p.read_blocks(r, list(range(0, 16 * BLK, BLK)), [target.pool_addr] * 16, BLK).result(10)
            e.register(bytearray(8))  # left registered: close deregisters it
            p.read([((r, 0), target.pool_addr, BLK)])  # left un-waited: close ends it

    cycle()
    base = kvferry.alloc_stats()
    fds = open_fds()
    for _ in range(5):
        cycle()
    assert kvferry.alloc_stats() == base
    assert open_fds() <= fds
