"""The compiled op-list converter (libkvferry_pyops.so) against the
Python path: the same operations for every input the package accepts,
the same exception (class, status, message) for every bad one, and the
helper bundled and loaded where the package is installed from a wheel."""

import collections
import os
import random
import sysconfig
import threading

import pytest

import kvferry
from kvferry import _lib

BLK = 8192
READ, WRITE = _lib.OP_READ, _lib.OP_WRITE

OpT = collections.namedtuple("OpT", "local remote length")

needs_helper = pytest.mark.skipif(_lib.pyops() is None,
                                  reason="libkvferry_pyops.so not built or not loadable here")


def bundled() -> bool:
    """True when the package is an installed wheel (the library inside it)."""
    return os.path.exists(os.path.join(os.path.dirname(_lib.__file__), "libkvferry.so"))


def outcome(peer, typ, ops):
    """What _ops_array makes of ops: the words, count and total, or the error."""
    try:
        arr, n, total = peer._ops_array(typ, ops)
    except Exception as e:  # every kind is compared, not only ours
        return ("error", type(e), str(e), getattr(e, "code", None))
    return ("ok", list(arr[: 5 * n]), n, total)


def both(peer, typ, ops, monkeypatch):
    """(with the helper, without it) for one input."""
    with_c = outcome(peer, typ, ops)
    with monkeypatch.context() as m:
        m.setattr(_lib, "_pyops", False)
        assert _lib.pyops() is None
        without = outcome(peer, typ, ops)
    return with_c, without


@pytest.fixture()
def setup(engine, target):
    p = engine.open(target.segment)
    r = engine.alloc(64 * BLK)
    r2 = engine.register(bytearray(16 * BLK))
    ro = engine.register(b"read only bytes")
    shut = engine.register(bytearray(BLK))
    shut.deregister()
    yield p, r, r2, ro, shut, target.pool_addr
    for x in (r, r2, ro):
        x.deregister()
    p.close()


def valid_inputs(r, r2, ro, base):
    """(name, ops, the helper converts it itself)."""
    n = 64
    rnd = random.Random(3)
    offs = [i * BLK for i in rnd.sample(range(n), n)]
    lens = [rnd.randrange(0, BLK + 1) for _ in range(n)]
    return [
        ("int locals", [(r.addr + o, base + o, BLK) for o in offs], True),
        ("region locals", [((r, o), base + 2 * o, BLK) for o in offs], True),
        ("lengths vary", [((r, o), base + o, ln) for o, ln in zip(offs, lens)], True),
        ("mixed locals", [((r, o), base, BLK) if i % 2 else (r.addr + o, base, BLK)
                          for i, o in enumerate(offs)], True),
        ("two regions", [((r2 if i % 3 else r, (i % 16) * BLK), base, BLK)
                         for i in range(n)], True),
        ("tuple of ops", tuple((r.addr + o, base + o, BLK) for o in offs), True),
        ("namedtuples", [OpT((r, o), base + o, BLK) for o in offs], True),
        ("one op", [((r, 0), base, 1)], True),
        ("zero length", [((r, r.nbytes), base, 0)], True),
        ("largest ints", [(2**64 - 1, 2**64 - 1, 2**64 - 1)], True),
        ("bool remote", [((r, 0), True, 8)], True),
        ("fills region", [((r, 0), base, r.nbytes)], True),
        ("generator", (((r, o), base + o, BLK) for o in offs[:4]), True),
        ("ops as lists", [[(r, o), base + o, BLK] for o in offs], False),
        ("bool local", [(True, base, 8), (0, base, 8)], False),
        ("total past 2**64", [(1, 2, 2**64 - 1), (1, 2, 2**64 - 1)], False),
        ("write from bytes", [((ro, 0), base, 4)], True),  # WRITE only
    ]


def bad_inputs(r, ro, shut, base):
    good = ((r, 0), base, 8)
    return [
        ("empty", []),
        ("two items", [(1, 2)]),
        ("four items", [(1, 2, 3, 4)]),
        ("not a tuple", [5]),
        ("None op", [None]),
        ("float local", [(1.5, 2, 3)]),
        ("str local", [("1", 2, 3)]),
        ("float remote", [(1, 2.0, 3)]),
        ("str length", [(1, 2, "3")]),
        ("None length", [((r, 0), base, None)]),
        ("negative local", [(-1, 2, 3)]),
        ("negative remote", [(1, -2, 3)]),
        ("negative length", [(1, 2, -3)]),
        ("local over 2**64", [(2**64, 2, 3)]),
        ("remote over 2**64", [(1, 2**64, 3)]),
        ("length over 2**64", [(1, 2, 2**64)]),
        ("negative offset", [((r, -1), base, 8)]),
        ("offset over 2**64", [((r, 2**64), base, 8)]),
        ("past the region", [((r, 0), base, r.nbytes + 1)]),
        ("past the end", [((r, r.nbytes - 4), base, 8)]),
        ("negative region length", [((r, 0), base, -1)]),
        ("float offset", [((r, 0.5), base, 8)]),
        ("short local", [((r,), base, 8)]),
        ("long local", [((r, 0, 1), base, 8)]),
        ("not a region", [(("x", 0), base, 8)]),
        ("closed region", [((shut, 0), base, 8)]),
        ("read into bytes", [((ro, 0), base, 4)]),
        ("bool local among regions", [good, (True, base, 8)]),
        ("last op bad", [good] * 100 + [((r, 0), -1, 8)]),
        ("middle op bad", [good] * 50 + [(1, 2)] + [good] * 50),
    ]


@pytest.mark.parametrize("typ", [READ, WRITE])
def test_same_ops_as_python(setup, typ, monkeypatch):
    p, r, r2, ro, shut, base = setup
    pack = _lib.pyops()
    for name, ops, converts in valid_inputs(r, r2, ro, base):
        if name == "write from bytes" and typ == READ:
            continue
        if not isinstance(ops, (list, tuple)):
            ops = list(ops)
        with_c, without = both(p, typ, ops, monkeypatch)
        assert with_c[0] == "ok", (name, with_c)
        assert with_c == without, name
        if pack is not None:
            took = p._ops_array_c(pack, typ, p._h, ops) is not None
            assert took == converts, name


@pytest.mark.parametrize("typ", [READ, WRITE])
def test_same_errors_as_python(setup, typ, monkeypatch):
    p, r, r2, ro, shut, base = setup
    for name, ops in bad_inputs(r, ro, shut, base):
        with_c, without = both(p, typ, ops, monkeypatch)
        if name == "read into bytes" and typ == WRITE:
            assert with_c[0] == "ok"
            continue
        assert with_c[0] == "error", (name, with_c)
        assert with_c == without, name
        # every argument error is the package's, with its status
        assert issubclass(with_c[1], kvferry.KvferryError), (name, with_c)


def test_clear_messages(setup):
    p, r, r2, ro, shut, base = setup
    cases = [
        ([(1, 2)], kvferry.InvalidParamError, "operation 0 is not (local, remote_addr, length)"),
        ([(1, 2.0, 3)], kvferry.BufferTypeError, "operation 0: remote address must be an int"),
        ([(1, 2, 3)] * 3 + [(1, 2, -3)], kvferry.InvalidParamError,
         "operation 3: length -3 outside [0, 2**64)"),
        ([((r, 0), 2, "8")], kvferry.BufferTypeError, "operation 0: offset and length must be ints"),
        ([(("x", 0), 2, 8)], kvferry.BufferTypeError, "operation 0: local must be an address"),
        ([((r, 0.5), 2, 8)], kvferry.BufferTypeError, "operation 0: offset and length must be ints"),
        ([((r, 0), 2, r.nbytes + 1)], kvferry.NotRegisteredError, "outside a region"),
    ]
    for ops, cls, text in cases:
        with pytest.raises(cls) as ei:
            p.read(ops)
        assert text in str(ei.value), str(ei.value)
        assert ei.value.code < 0


def test_batches_in_flight_keep_their_ops(setup, target, monkeypatch):
    """The helper's output array is reused: a batch must not see the next one's ops."""
    p, r, r2, ro, shut, base = setup
    n = 32
    rnd = random.Random(5)
    remote = [base + BLK * i for i in rnd.sample(range(target.pool_len // BLK), 2 * n)]
    b1 = p.read([((r, i * BLK), remote[i], BLK) for i in range(n)])
    b2 = p.read([((r, (n + i) * BLK), remote[n + i], BLK) for i in range(n)])
    assert b1.result(10) == b2.result(10) == n * BLK
    b1.close()
    b2.close()
    got = bytes(r.memoryview()[: 2 * n * BLK])
    check = kvferry.Engine()
    try:
        c = check.alloc(2 * n * BLK)
        with monkeypatch.context() as m:
            m.setattr(_lib, "_pyops", False)  # the Python path reads the same blocks
            check.open(target.segment).read(
                [((c, i * BLK), remote[i], BLK) for i in range(2 * n)]).result(10)
        assert bytes(c.memoryview()) == got
    finally:
        check.close()


@pytest.mark.skipif(not bundled(), reason="package not installed from a wheel")
def test_wheel_bundles_the_helper():
    if os.environ.get("KVFERRY_PYOPS") == "0" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("helper switched off here")
    path = _lib.pyops_path()
    assert path == os.path.join(os.path.dirname(_lib.__file__), "libkvferry_pyops.so")
    assert _lib.pyops() is not None


@needs_helper
def test_helper_not_linked_against_libpython():
    with open(_lib.pyops_path(), "rb") as f:
        data = f.read()
    assert b"libpython" not in data


def test_overhead_bench_runs(capsys):
    """python -m kvferry.bench blocks, tiny: every way runs and is reported."""
    from kvferry import bench

    assert bench.main(["blocks", "--count", "64", "--rounds", "2", "--calls", "100",
                       "--pool", "16M", "--local-pool", "4M", "--transport", "tcp"]) == 0
    out = capsys.readouterr().out
    for way in ("C API", "Python list", "Python prebuilt", "C API, sliced", "op array build",
                "submit call",
                "16 block sets in turn"):
        assert way in out, out
    if _lib.pyops() is not None:
        assert "list, in Python" in out


# Reads of more than one slice: the helper submits the first slice
# before it converts the next (Peer._read_sliced).
SMALL = 4096


def sliced_ops(region, target, n, seed=11):
    rnd = random.Random(seed)
    locs = rnd.sample(range(region.nbytes // SMALL), n)
    rems = rnd.sample(range(target.pool_len // SMALL), n)
    return [((region, lo * SMALL), target.pool_addr + re * SMALL, SMALL)
            for lo, re in zip(locs, rems)]


@needs_helper
def test_sliced_read_moves_what_the_python_path_moves(engine, target, monkeypatch):
    n = 3000  # more than three slices' worth at first, then the rest
    p = engine.open(target.segment)
    r = engine.alloc(n * SMALL)
    b = p.read(sliced_ops(r, target, n))
    assert len(b._hs) > 1, "not submitted in slices"
    assert b.result(10) == n * SMALL
    assert b.statuses() == [0] * n
    for i in (0, 255, 256, 1279, 1280, n - 1):  # both sides of each cut
        assert b.op_status(i) == (0, SMALL)
    with pytest.raises(IndexError):
        b.op_status(n)
    assert b.done() and b.wait(0)
    b.close()
    with pytest.raises(kvferry.ClosedError):
        b.wait(0)
    r2 = engine.alloc(n * SMALL)
    with monkeypatch.context() as m:
        m.setattr(_lib, "_pyops", False)
        b2 = p.read([((r2, off), rem, ln) for (_, off), rem, ln in sliced_ops(r, target, n)])
        assert len(b2._hs) == 1
        b2.result(10)
        b2.close()
    assert bytes(r.memoryview()) == bytes(r2.memoryview())
    # a tuple of operations, and a generator (made a list), slice too
    for ops in (tuple(sliced_ops(r, target, n, seed=12)), iter(sliced_ops(r, target, n, seed=13))):
        with p.read(ops) as b3:
            assert len(b3._hs) > 1
            assert b3.result(10) == n * SMALL


@needs_helper
def test_sliced_read_errors_are_the_python_paths(target, monkeypatch):
    """A bad operation far into the list, after slices went: the same
    exception as the Python path, no batch left behind, nothing leaked."""

    def cycle(positions, check):
        with kvferry.Engine() as engine:
            p = engine.open(target.segment)
            r = engine.alloc(2048 * SMALL)
            ro = engine.register(b"read only bytes")
            shut = engine.register(bytearray(SMALL))
            shut.deregister()
            good = sliced_ops(r, target, 1500)
            bads = [(name, ops[-1]) for name, ops in bad_inputs(r, ro, shut, target.pool_addr)
                    if ops and name not in ("bool local among regions", "last op bad",
                                            "middle op bad")]
            bads.append(("no region there", (8, target.pool_addr, SMALL)))  # fails in the batch
            for at in positions:
                for name, bad in bads:
                    ops = good[:at] + [bad] + good[at:]
                    with_c = outcome_read(p, ops)
                    if not check:
                        continue
                    with monkeypatch.context() as m:
                        m.setattr(_lib, "_pyops", False)
                        without = outcome_read(p, ops)
                    assert with_c[0] == ("ok" if name == "no region there" else "error"), (name, at)
                    assert with_c == without, (name, at)
                    assert not engine._batches, (name, at)

    cycle((1, 300, 1499), True)
    base = kvferry.alloc_stats()
    cycle((300, 1499), False)
    assert kvferry.alloc_stats() == base


def outcome_read(peer, ops):
    """The exception of peer.read(ops), or its batch's error and statuses."""
    try:
        b = peer.read(ops)
    except Exception as e:
        return ("error", type(e), str(e), getattr(e, "code", None))
    with b:
        with pytest.raises(kvferry.KvferryError) as ei:
            b.result(10)
        return ("ok", type(ei.value), ei.value.code, b.statuses())


@needs_helper
def test_sliced_read_timeout_cancel_and_threads(engine, target):
    p = engine.open(target.segment)
    r = engine.alloc(2048 * SMALL)
    ops = sliced_ops(r, target, 2048)
    b = p.read(ops)
    assert b.wait(10) and b.wait(None)
    b.cancel()  # all done: nothing to cancel
    assert b.result(0) == 2048 * SMALL
    b.close()
    b = p.read(ops)
    b.close()  # in flight: cancels the slices, then waits for them
    assert not engine._batches
    # the GIL is let go around each slice's submit: other threads read too
    errs = []

    def reader():
        try:
            for _ in range(5):
                with p.read(ops) as x:
                    x.result(10)
        except Exception as e:  # reported below
            errs.append(e)

    ts = [threading.Thread(target=reader) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs


@needs_helper
def test_direct_reads_found():
    """The helper reads tuples, lists and ints without API calls on every
    CPython it was checked on (a later one may keep the calls: 0)."""
    import sys

    if sys.version_info[:2] <= (3, 13):
        assert _lib.pyops_direct == 3
    assert _lib.pyops_direct in (0, 1, 2, 3)


@needs_helper
def test_first_slice_setting(engine, target, monkeypatch):
    """Another first slice (KVFERRY_FIRST_SLICE) cuts the list elsewhere
    and moves the same bytes; a value out of range stops the import."""
    import subprocess
    import sys

    from kvferry import engine as engine_mod

    n = 1500
    p = engine.open(target.segment)
    r = engine.alloc(n * SMALL)
    monkeypatch.setattr(engine_mod, "_FIRST_SLICE", 16)
    with p.read(sliced_ops(r, target, n, seed=21)) as b:
        assert engine_mod._slice_starts(n, len(b._hs))[:3] == (0, 16, 80)
        assert len(b._hs) > 3
        assert b.result(10) == n * SMALL
    monkeypatch.setattr(_lib, "_pyops", False)
    r2 = engine.alloc(n * SMALL)
    with p.read([((r2, off), rem, ln) for (_, off), rem, ln in sliced_ops(r, target, n, seed=21)]) as b2:
        b2.result(10)
    assert bytes(r.memoryview()) == bytes(r2.memoryview())
    for bad in ("3", "x", "100000"):
        env = dict(os.environ, KVFERRY_FIRST_SLICE=bad)
        out = subprocess.run([sys.executable, "-c", "import kvferry.engine"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "KVFERRY_FIRST_SLICE" in out.stderr
    env = dict(os.environ, KVFERRY_FIRST_SLICE="64")
    out = subprocess.run([sys.executable, "-c", "from kvferry import engine; print(engine._FIRST_SLICE)"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "64", out.stderr
