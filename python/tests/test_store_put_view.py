"""Store put views (Store.view_put, Store.view_maps) against a real
`kvferry master` and nodes: objects written in place in this process's
mapping of a node's pool, then committed or aborted."""

import os
import uuid

import pytest

import kvferry
from kvferry.errors import (
    ERR_CANCELED,
    ERR_CHECKSUM,
    ERR_EXISTS,
    ERR_KEY_TOO_LARGE,
    ERR_UNSUPPORTED,
    OK,
)
from kvferry.procs import Master, Node
from kvferry.store import PutViews


def key(tag=""):
    return "pv/%s%s" % (tag, uuid.uuid4().hex)


def inside(v, maps):
    return any(b <= v.addr and v.addr + v.length <= b + n for b, n in maps)


def test_put_view_write_commit(store):
    sizes = [1, 4096, 65539, 1 << 20, 0, (3 << 20) + 5]
    keys = [key() for _ in sizes]
    datas = [os.urandom(n) for n in sizes]
    with store.view_put(keys, sizes) as pv:
        assert isinstance(pv, PutViews) and len(pv) == len(keys)
        assert 0 < pv.left_ms() <= 5000
        for i, d in enumerate(datas):
            v = pv[i]
            assert v.ok and v.length == len(d) and v.checksum == 0
            if d:
                assert v.map_base <= v.addr and v.addr + v.length <= v.map_base + v.map_len
            mv = pv.memoryview(i)
            assert not mv.readonly and mv.nbytes == len(d)
            mv[:] = d
        # not committed: nobody finds them
        with pytest.raises(kvferry.BusyError):
            store.exists(keys[0])  # KVF_ERR_NOT_READY
        assert pv.commit() == [OK] * len(keys)
        assert pv.done and pv.left_ms() == 0
        assert pv.commit() == [OK] * len(keys)  # the same answer again
    for k, d in zip(keys, datas):
        assert store.get_bytes(k) == d  # the checksum verified by the get


def test_put_view_sums_keep_and_bad_sum(store):
    keys = [key() for _ in range(3)]
    datas = [os.urandom(n) for n in (5000, 6000, 7000)]
    with store.view_put(keys, [len(d) for d in datas]) as pv:
        for i, d in enumerate(datas):
            pv.memoryview(i)[:] = d
        sums = [kvferry.checksum(d) for d in datas]
        sums[2] ^= 1  # wrong: later gets fail, never wrong bytes
        assert pv.commit(sums=sums, keep=[True, False, True]) == [OK, ERR_CANCELED, OK]
    assert store.get_bytes(keys[0]) == datas[0]
    assert not store.exists(keys[1])
    with pytest.raises(kvferry.KvferryError) as e:
        store.get_bytes(keys[2])
    assert e.value.code == ERR_CHECKSUM
    with pytest.raises(kvferry.InvalidParamError):
        store.view_put(keys, [1])
    pv = store.view_put([key()], [10])
    with pytest.raises(kvferry.InvalidParamError):
        pv.commit(sums=[1, 2])
    pv.abort()


def test_put_view_exit_aborts(store):
    k, stored = key(), key()
    store.put(stored, b"s" * 100)
    with pytest.raises(RuntimeError):
        with store.view_put([k, stored, "x" * (kvferry.KEY_MAX + 1)], [4096, 100, 1]) as pv:
            assert pv[1].status == ERR_EXISTS and pv[1].addr == 0
            assert pv[2].status == ERR_KEY_TOO_LARGE
            pv.memoryview(0)[:] = b"a" * 4096
            raise RuntimeError("leave without a commit")
    assert pv.done and not store.exists(k)
    assert pv.commit() == [ERR_CANCELED] * 3
    store.put(k, b"b" * 4096)  # nothing of the put view stayed
    assert store.get_bytes(k) == b"b" * 4096
    with store.view_put([stored], [64], replace=True) as pv:
        pv.memoryview(0)[:] = b"r" * 64
        assert pv.commit() == [OK]
    assert store.get_bytes(stored) == b"r" * 64


def test_put_view_unsupported(master, store):
    k = key()
    with kvferry.Store.connect(master, transports="tcp") as st:
        with st.view_put([k], [5000]) as pv:
            assert pv[0].status == ERR_UNSUPPORTED and pv[0].addr == 0
        st.put_batch([k], [b"t" * 5000])  # the fallback: nothing was left
    assert store.get_bytes(k) == b"t" * 5000
    with store.view_put([key()], [100], replicas=2) as pv:
        assert pv[0].status == ERR_UNSUPPORTED


def test_put_view_closed_store(master):
    st = kvferry.Store.connect(master)
    k = key()
    pv = st.view_put([k], [64])
    assert pv[0].ok
    st.close()  # aborts the put view (the library logs it)
    assert pv.commit() == [ERR_CANCELED] and pv.left_ms() == 0
    with pytest.raises(kvferry.ClosedError):
        st.view_put([k], [64])
    with kvferry.Store.connect(master) as st2:
        assert not st2.exists(k)


def test_view_maps():
    with Master() as m, Node(m.address, pool="32M") as n1, Node(m.address, pool="16M") as n2:
        with kvferry.Store.connect(m.address) as st:
            maps = st.view_maps()
            assert len(maps) == 2
            sizes = sorted(n for _, n in maps)  # whole pools, in whole pages
            assert 16 << 20 <= sizes[0] < 32 << 20 <= sizes[1]
            keys = [key() for _ in range(8)]
            with st.view_put(keys, [65536] * 8) as pv:
                for i, v in enumerate(pv):
                    assert v.ok and inside(v, maps)
                    pv.memoryview(i)[:] = bytes([i]) * 65536
                assert pv.commit() == [OK] * 8
            with st.view_get(keys) as vl:
                assert all(v.ok and inside(v, maps) for v in vl)
                assert vl.tobytes(3) == bytes([3]) * 65536
            assert st.view_maps() == maps  # the same mappings again
        with kvferry.Store.connect(m.address, transports="tcp") as st:
            assert st.view_maps() == []  # nothing reached over shm
        del n1, n2
