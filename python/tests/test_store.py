"""Store client against a real `kvferry master` and `kvferry node`."""

import os
import threading
import uuid

import pytest

import kvferry
from kvferry.errors import ERR_EXISTS
from kvferry.procs import Master, Node


def key(tag=""):
    return "t/%s%s" % (tag, uuid.uuid4().hex)


def test_put_get_bytes(store):
    k = key()
    data = os.urandom(10000)
    store.put(k, data)
    assert store.exists(k)
    assert store.get_bytes(k) == data
    buf = bytearray(20000)
    assert store.get(k, buf) == 10000 and bytes(buf[:10000]) == data
    info = store.query(k)
    assert info.size == 10000 and info.replicas == 1 and info.checksum == kvferry.checksum(data)
    assert any(e.key == k and e.committed for e in store.list(prefix="t/"))
    assert store.master_link in ("unix", "tcp")
    store.remove(k)
    assert not store.exists(k)
    with pytest.raises(kvferry.NoKeyError) as ei:
        store.get_bytes(k)
    assert ei.value.code == -60 and ei.value.name == "KVF_ERR_NO_KEY"
    with pytest.raises(kvferry.NoKeyError):
        store.remove(k)


def test_registered_regions_zero_copy(store):
    src = bytearray(os.urandom(1 << 16))
    dst = bytearray(1 << 17)
    rs, rd = store.register(src), store.register(dst)
    k = key()
    store.put(k, (rs, 1024, 4096), pin=True)
    assert store.get(k, (rd, 100)) == 4096
    assert dst[100:4196] == src[1024:5120]
    store.put(key(), rs)
    with pytest.raises(kvferry.NotRegisteredError):
        store.put(key(), (rs, 1 << 16, 1))
    with pytest.raises(kvferry.NotRegisteredError):
        store.get(k, (rs, 0, 10**9))
    rs.deregister()
    rd.deregister()
    other = kvferry.Engine()
    r = other.register(bytearray(64))
    with pytest.raises(kvferry.InvalidParamError):
        store.put(key(), r)
    other.close()


def test_exists_and_busy_errors(store):
    k = key()
    store.put(k, b"one")
    with pytest.raises(kvferry.ExistsError):
        store.put(k, b"two")
    assert store.get_bytes(k) == b"one"


def test_replace(store):
    """put(replace=True) takes the stored object's place; without it the
    key stays as it was; put_batch(replace=True) likewise, per key."""
    k = key()
    store.put(k, b"one" * 1000)
    store.put(k, b"two" * 500, replace=True)
    assert store.get_bytes(k) == b"two" * 500
    with pytest.raises(kvferry.ExistsError):
        store.put(k, b"three")
    assert store.get_bytes(k) == b"two" * 500
    fresh = key()
    store.put(fresh, b"new", replace=True)  # nothing to replace: a plain put
    assert store.get_bytes(fresh) == b"new"
    ks = [k, fresh, key()]
    datas = [os.urandom(n) for n in (10, 70000, 1)]
    assert store.put_batch(ks, datas, replace=True) == [0, 0, 0]
    for kk, d in zip(ks, datas):
        assert store.get_bytes(kk) == d
    sts = store.put_batch(ks[:2], [b"x", b"y"], check=False)
    assert sts == [ERR_EXISTS, ERR_EXISTS], sts
    assert [store.get_bytes(kk) for kk in ks] == datas


def test_too_small_and_bad_buffers(store):
    k = key()
    store.put(k, b"x" * 1000)
    with pytest.raises(kvferry.NoSpaceError) as ei:
        store.get(k, bytearray(10))
    assert ei.value.code == -3
    with pytest.raises(kvferry.BufferTypeError):
        store.get(k, b"read-only bytes" * 100)
    for bad in (None, 42, "str", [1, 2]):
        with pytest.raises(kvferry.BufferTypeError):
            store.put(key(), bad)
    for badkey in (None, 5, b"a\0b", ""):
        with pytest.raises(kvferry.InvalidParamError):
            store.put(badkey, b"v")


def test_key_limit(store):
    ok = "k" * kvferry.KEY_MAX
    store.put(ok, b"v")
    assert store.get_bytes(ok) == b"v"
    store.remove(ok)
    big = "k" * (kvferry.KEY_MAX + 1)
    with pytest.raises(kvferry.KeyTooLargeError) as ei:
        store.put(big, b"v")
    assert ei.value.code == -61
    assert not store.exists(big[:kvferry.KEY_MAX])


def test_last_timing(store):
    """last_timing: the stages of this thread's last put or get batch, as
    the C library measured them (a put commits, a get has no commit), and
    each thread its own."""
    from kvferry.store import last_timing

    ks = [key("lt") for _ in range(64)]
    vals = [os.urandom(65536) for _ in ks]
    store.put_batch(ks, vals)
    put = last_timing()
    assert put.query > 0 and put.transfer > 0 and put.checksum > 0 and put.commit > 0
    outs = [bytearray(65536) for _ in ks]
    store.get_batch(ks, outs)
    got = last_timing()
    assert outs == [bytearray(v) for v in vals]
    assert got.query > 0 and got.transfer > 0 and got.checksum > 0 and got.commit == 0
    other = []
    t = threading.Thread(target=lambda: other.append(last_timing()))
    t.start()
    t.join()
    assert other == [(0.0, 0.0, 0.0, 0.0)]  # no store call on that thread
    store.remove_batch(ks)


def test_batches(store):
    ks = [key("b") for _ in range(50)]
    vals = [os.urandom(100 + i) for i in range(50)]
    assert store.put_batch(ks, vals) == [0] * 50
    assert store.exists_batch(ks + [key()]) == [True] * 50 + [False]
    # a hold answers as exists (and leases what it found: test_store_faults)
    assert store.hold_batch([key()] + ks) == [False] + [True] * 50
    bufs = [bytearray(200) for _ in ks]
    assert store.get_batch(ks, bufs) == [100 + i for i in range(50)]
    assert all(bytes(b[: 100 + i]) == vals[i] for i, b in enumerate(bufs))
    # one already stored: the others go in, the error is per key
    new = key("b")
    with pytest.raises(kvferry.BatchError) as ei:
        store.put_batch([ks[0], new], [b"a", b"b"])
    assert ei.value.statuses[0] == -10 and ei.value.statuses[1] == 0
    assert store.get_bytes(new) == b"b"
    res = store.get_batch([ks[0], key()], [bytearray(200), bytearray(200)], check=False)
    assert res[0] == 100 and res[1] == -60
    assert store.remove_batch(ks) == [0] * 50
    assert store.exists_batch(ks) == [False] * 50
    st = store.remove_batch([new, new + "x"], check=False)
    assert st == [0, -60]
    with pytest.raises(kvferry.InvalidParamError):
        store.put_batch([], [])
    with pytest.raises(kvferry.InvalidParamError):
        store.put_batch(["a"], [b"1", b"2"])
    with pytest.raises(kvferry.InvalidParamError):
        store.exists_batch(["k"] * (kvferry.BATCH_MAX + 1))


def test_get_batch_sums_returns_recorded_checksums(store):
    lib = kvferry._lib.lib()
    ks = [key("s") for _ in range(20)] + ["t/one-" + uuid.uuid4().hex]
    vals = [os.urandom(1000 + 97 * i) for i in range(len(ks))]
    assert store.put_batch(ks, vals) == [0] * len(ks)
    bufs = [bytearray(4096) for _ in ks]
    lens, sums = store.get_batch_sums(ks, bufs)
    assert lens == [len(v) for v in vals]
    for b, v, s in zip(bufs, vals, sums):
        assert bytes(b[: len(v)]) == v
        assert s == lib.kvf_checksum(bytes(v), len(v)) and s != 0
    # one key alone (no location-cache shortcut) and a missing key
    lens, sums = store.get_batch_sums([ks[-1], key()], [bytearray(4096), bytearray(4096)])
    assert lens[0] == len(vals[-1]) and lens[1] == -60 and sums[1] == 0
    with pytest.raises(kvferry.InvalidParamError):
        store.get_batch_sums(ks[:2], [bytearray(10)])
    store.remove_batch(ks)
    lens, _ = store.get_batch_sums(ks[:1], [bytearray(4096)])
    assert lens == [-60]


def test_batch_bad_key_leaves_nothing(store):
    ks = [key("h"), "k" * (kvferry.KEY_MAX + 1), key("h")]
    try:
        store.put_batch(ks, [b"1", b"2", b"3"])
    except kvferry.KvferryError:
        pass
    # the oversize key is never stored; no half-written entry shows
    assert not any(not e.committed for e in store.list(prefix="t/h"))
    assert not store.exists(ks[1][: kvferry.KEY_MAX])


def test_batch_spans_mixed_and_checked(store):
    """A batch's buffers: runs of (region, offset, length) of one region
    (checked once, then by bounds), spans of a second region, plain
    buffers registered for the call and non-ASCII or bytes keys all land
    where they should; a span out of bounds anywhere in the batch raises
    before anything is stored and leaves no region registered."""
    n = 64
    src = bytearray(os.urandom(n * 512))
    other = bytearray(os.urandom(4096))
    rs, ro = store.register(src), store.register(other)
    ks = [key("mix%d-" % i) for i in range(n)] + [key("é"), key().encode(), key()]
    datas = [(rs, i * 512, 512) for i in range(n)] + [(ro, 100, 300), b"plain", (rs, 7, 9)]
    assert store.put_batch(ks, datas) == [0] * len(ks)
    dst = bytearray(n * 512 + 4096)
    rd = store.register(dst)
    intos = [(rd, i * 512, 512) for i in range(n)] + [(rd, n * 512, 300), bytearray(16),
                                                     (rd, n * 512 + 1000, 9)]
    assert store.get_batch(ks, intos) == [512] * n + [300, 5, 9]
    assert dst[: n * 512] == src
    assert dst[n * 512:n * 512 + 300] == other[100:400]
    assert dst[n * 512 + 1000:n * 512 + 1009] == src[7:16]
    assert store.get_bytes(ks[n + 1].decode()) == b"plain"

    def bad_batches():
        for bad in ((rs, n * 512 - 10, 11), (rs, -1, 4), (rs, 2**64, 1)):
            k2 = [key("oob"), key("oob"), key("oob")]
            with pytest.raises((kvferry.NotRegisteredError, kvferry.InvalidParamError)):
                store.put_batch(k2, [(rs, 0, 8), b"tmp", bad])
            assert not any(store.exists(k) for k in k2)
        readonly = store.register(b"read only bytes")
        with pytest.raises(kvferry.InvalidParamError):
            store.get_batch(ks[:2], [bytearray(8), (readonly, 0, 4)])
        readonly.deregister()

    bad_batches()
    base = kvferry.alloc_stats()
    for _ in range(3):
        bad_batches()
    assert kvferry.alloc_stats() == base  # the call's temporary regions dropped
    rd.deregister()
    store.remove_batch(ks)
    rs.deregister()
    ro.deregister()


def test_numpy_put_get(store):
    np = pytest.importorskip("numpy")
    a = np.random.default_rng(0).integers(0, 255, (64, 1024), dtype=np.uint8)
    k = key()
    store.put(k, a)
    b = np.zeros_like(a)
    assert store.get(k, b) == a.nbytes
    assert (a == b).all()
    r = store.register(b)
    b[:] = 0
    assert store.get(k, (r, 0)) == a.nbytes and (a == b).all()
    r.deregister()
    with pytest.raises(kvferry.BufferTypeError):
        store.put(key(), a[:, ::2])


def test_torch_cpu_put_get(store):
    torch = pytest.importorskip("torch")
    t = torch.arange(4096, dtype=torch.int32)
    k = key()
    store.put(k, t)
    u = torch.zeros_like(t)
    assert store.get(k, u) == t.numel() * 4 and torch.equal(t, u)


def test_concurrent_callers(store):
    errors = []

    def worker(n):
        try:
            for i in range(30):
                k = "c/%d/%d/%s" % (n, i, uuid.uuid4().hex)
                v = os.urandom(500 + i)
                store.put(k, v)
                assert store.get_bytes(k) == v
                store.remove(k)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


def test_call_after_close(master):
    st = kvferry.Store.connect(master)
    r = st.register(bytearray(16))
    st.close()
    st.close()
    for call in (lambda: st.put("k", b"v"), lambda: st.get_bytes("k"), lambda: st.exists("k"),
                 lambda: st.remove("k"), lambda: st.put_batch(["k"], [b"v"]),
                 lambda: st.register(bytearray(4)), lambda: st.list()):
        with pytest.raises(kvferry.ClosedError):
            call()
    assert r.closed


def test_dead_master_and_node():
    with pytest.raises(kvferry.ConnectError):
        kvferry.Store.connect("127.0.0.1:1", timeout_ms=500)
    m = Master().start()
    n = Node(m.address, pool="8M").start()
    try:
        st = kvferry.Store.connect(m.address, timeout_ms=2000)
        st.put("d/1", b"v" * 1000)
        n.kill()
        with pytest.raises(kvferry.KvferryError):
            st.get_bytes("d/1")
        m.kill()
        with pytest.raises(kvferry.KvferryError):
            st.put("d/2", b"v")
        with pytest.raises(kvferry.KvferryError):
            st.exists("d/1")
        st.close()
    finally:
        n.close()
        m.close()


def test_node_gone_put_leaves_nothing():
    with Master("--node-ttl", "500ms", "--heartbeat", "100ms") as m:
        n = Node(m.address, pool="8M").start()
        st = kvferry.Store.connect(m.address, timeout_ms=2000)
        try:
            n.kill()
            with pytest.raises(kvferry.KvferryError):
                st.put("gone/1", os.urandom(4096))
            assert not st.exists("gone/1")
            assert all(e.committed for e in st.list())
        finally:
            st.close()
            n.close()


def test_env_passes_through(tmp_path):
    with Master(env={"KVF_LOG_LEVEL": "debug"}) as m:
        assert m.env["KVF_LOG_LEVEL"] == "debug"
        assert m.alive()
    assert not m.alive()


def test_no_leaks(master):
    from conftest import open_fds

    def cycle():
        with kvferry.Store.connect(master) as st:
            k = key("leak")
            st.put(k, os.urandom(5000))
            st.get_bytes(k)
            st.register(bytearray(100))  # left registered: close drops it
            st.put_batch([k + "a", k + "b"], [b"1", b"2"])
            st.remove_batch([k, k + "a", k + "b"])

    cycle()
    base = kvferry.alloc_stats()
    fds = open_fds()
    for _ in range(5):
        cycle()
    assert kvferry.alloc_stats() == base
    assert open_fds() <= fds


def test_store_on_user_engine(master):
    with kvferry.Engine() as eng:
        with kvferry.Store.connect(master, engine=eng, timeout_ms=3000) as st:
            assert st.engine is eng
            r = eng.register(bytearray(4096))
            k = key()
            st.put(k, b"on my engine")
            assert st.get(k, (r, 0)) == 12 and bytes(r.obj[:12]) == b"on my engine"
        assert not r.closed  # the engine and its regions outlive the store
        r.deregister()


def test_daemon_log_and_failure():
    from kvferry.procs import ProcessError

    with pytest.raises(ProcessError) as ei:
        Node("127.0.0.1:1", "--bogus-flag", timeout=10).start()
    assert "bogus" in str(ei.value) or "exited" in str(ei.value)
    m = Master().start()
    assert m.stop() == 0  # SIGTERM: an orderly, quiet stop
    assert "error" not in m.log()
    m.close()


def test_store_bench_runs(capsys):
    """python -m kvferry.bench store, tiny: both ways put and get the batch
    (the C way checks its calls' status) and each phase is reported."""
    from kvferry import bench

    assert bench.main(["store", "--count", "64", "--size", "4K", "--rounds", "2",
                       "--pool", "16M"]) == 0
    out = capsys.readouterr().out
    assert "64 objects of 4 KiB, 2 rounds" in out, out
    for op in ("put: C", "get: C"):
        assert op in out and "% of C" in out, out
    assert "its put: master" in out and "the C calls' stages (medians): put: master" in out, out


def test_store_bench_first_runs(capsys):
    """python -m kvferry.bench first, tiny: two new clients each put and
    get their batches (a failed key raises) and every step is reported."""
    from kvferry import bench

    assert bench.main(["first", "--count", "64", "--size", "4K", "--pool", "16M",
                       "--batches", "2"]) == 0
    out = capsys.readouterr().out
    assert "64 objects of 4 KiB, 2 clients in turn, 2 batches each" in out, out
    for c in (0, 1):
        assert "client %d: connect" % c in out, out
    for line in ("batch 0 put", "batch 1 get"):
        assert out.count(line) == 2 and "transfer" in out, out
    assert out.count("deregister and close") == 2, out
