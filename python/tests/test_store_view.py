"""Store views (Store.view_get) against a real `kvferry master` and nodes:
objects read in place in this process's mapping of a node's pool."""

import os
import time
import uuid

import pytest

import kvferry
from kvferry.errors import ERR_CANCELED, ERR_KEY_TOO_LARGE, ERR_NO_KEY, ERR_UNSUPPORTED, OK
from kvferry.procs import Master, Node
from kvferry.store import ViewLease


def key(tag=""):
    return "v/%s%s" % (tag, uuid.uuid4().hex)


def test_view_bytes_and_checksums(store):
    sizes = [1, 4096, 65539, 1 << 20, (3 << 20) + 5]
    keys = [key() for _ in sizes]
    datas = [os.urandom(n) for n in sizes]
    for k, d in zip(keys, datas):
        store.put(k, d)
    missing = key("missing")
    with store.view_get(keys + [missing, "x" * (kvferry.KEY_MAX + 1)]) as vl:
        assert isinstance(vl, ViewLease) and len(vl) == len(keys) + 2
        assert 0 < vl.left_ms <= 2000
        for i, d in enumerate(datas):
            v = vl[i]
            assert v.ok and v.status == OK and v.length == len(d)
            assert v.checksum == kvferry.checksum(d)
            assert v.map_base <= v.addr and v.addr + v.length <= v.map_base + v.map_len
            mv = vl.memoryview(i)
            assert mv.readonly and mv.nbytes == len(d)
            assert mv == d and vl.tobytes(i) == d
            assert kvferry.checksum(mv) == v.checksum
        assert vl[-2].status == ERR_NO_KEY and vl[-2].addr == 0
        assert vl[-1].status == ERR_KEY_TOO_LARGE
        with pytest.raises(kvferry.NoKeyError):
            vl.memoryview(len(keys))
    assert vl.released and vl.status == OK and vl.left_ms == 0
    assert vl.release() == OK  # idempotent
    with pytest.raises(kvferry.ClosedError):
        vl.memoryview(0)


def test_view_releases_on_exception(store):
    k = key()
    store.put(k, b"abc" * 100)
    with pytest.raises(RuntimeError):
        with store.view_get([k]) as vl:
            assert vl.tobytes(0) == b"abc" * 100
            raise RuntimeError("boom")
    assert vl.released and vl.status == OK
    # many leases in a row: nothing accumulates
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        with store.view_get([k]) as vl:
            assert vl[0].ok
    assert len(os.listdir("/proc/self/fd")) <= fds + 4


def test_view_shared(store):
    """shared=True: views under a node lease shared with other shared
    calls; the bytes are the same, and releasing one lease leaves the
    others' views readable."""
    datas = [os.urandom(n) for n in (1, 4096, 1 << 20)]
    keys = [key("s") for _ in datas]
    for k, d in zip(keys, datas):
        store.put(k, d)
    a = store.view_get(keys, shared=True)
    b = store.view_get(keys[::-1], shared=True)
    assert 0 < a.left_ms <= 2000 and 0 < b.left_ms <= 2000
    for i, d in enumerate(datas):
        assert a.tobytes(i) == d and b.tobytes(len(datas) - 1 - i) == d
        assert a[i].checksum == kvferry.checksum(d)
    assert a.release() == OK
    for i, d in enumerate(datas):
        assert b.tobytes(len(datas) - 1 - i) == d
    assert b.release() == OK
    # many shared calls in a row: no descriptors pile up
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(200):
        with store.view_get(keys[:1], shared=True) as vl:
            assert vl.tobytes(0) == datas[0]
    assert len(os.listdir("/proc/self/fd")) <= fds + 4


def test_view_bad_input(store):
    with pytest.raises(kvferry.InvalidParamError):
        store.view_get([])
    with pytest.raises(kvferry.InvalidParamError):
        store.view_get(["k"] * (kvferry.BATCH_MAX + 1))
    with pytest.raises(kvferry.InvalidParamError):
        store.view_get([""])
    with pytest.raises(kvferry.BufferTypeError):
        store.view_get([3])


def test_view_closed_store(master):
    st = kvferry.Store.connect(master)
    k = key()
    st.put(k, b"x" * 64)
    vl = st.view_get([k])
    assert vl[0].ok
    st.close()  # ends the lease (the library logs it)
    assert vl.release() == ERR_CANCELED and vl.left_ms == 0
    with pytest.raises(kvferry.ClosedError):
        st.view_get([k])


def test_view_over_tcp(master, store):
    k = key()
    data = os.urandom(5000)
    store.put(k, data)
    with kvferry.Store.connect(master, transports="tcp") as st:
        with st.view_get([k]) as vl:
            v = vl[0]
            assert v.status == ERR_UNSUPPORTED and v.addr == 0
            assert v.length == 5000 and v.checksum == kvferry.checksum(data)
            buf = bytearray(v.length)  # copied the usual way instead
            assert st.get(k, buf) == 5000 and bytes(buf) == data


def test_view_unmap_hook_after_node_stop():
    seen = []
    kvferry.Store.view_unmap_hook(lambda base, n: seen.append((base, n)))
    try:
        with Master() as m:
            node = Node(m.address, pool="32M", env={"KVF_LEASE_BREAK_MS": "300"})
            with node, kvferry.Store.connect(m.address) as st:
                k = key()
                st.put(k, b"y" * 8192)
                vl = st.view_get([k])
                base = vl[0].map_base
                node.stop()  # breaks the lease after lease_break_ms
                assert vl.tobytes(0) == b"y" * 8192  # still mapped while held
                assert (base, vl[0].map_len) not in seen
                assert vl.release() != OK  # the lease did not hold
                for _ in range(50):
                    if any(b == base for b, _ in seen):
                        break
                    time.sleep(0.1)
                assert any(b == base for b, _ in seen)
    finally:
        kvferry.Store.view_unmap_hook(None)
