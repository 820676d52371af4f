"""Python overhead benchmarks: ``python -m kvferry.bench blocks`` (the
engine), ``python -m kvferry.bench store`` (the store's batch calls) and
``python -m kvferry.bench first`` (a new store client's first batches).

Moves batches of random blocks (default 4096 x 8 KiB = 32 MiB, random
offsets on both sides of 1 GiB pools) from a ``kvferry target`` it
starts, several ways in the same process, interleaved round by round on
the same engine and peer. As ``kvferry bench blocks`` does, every batch
moves other blocks than the batches just before it: ``--sets`` random
block sets (16) are taken in turn, so a batch does not find its blocks
(or its Python objects) still in the CPU caches from the last round
(``--sets 1``: the same blocks every batch). The ways:

- C: one prebuilt kvf_op_t array, kvf_batch_submit + kvf_batch_wait +
  kvf_batch_destroy called directly (the C API's cost plus three ctypes
  calls);
- Python list: ``peer.read([(region, off), remote, length] ...)).result()``,
  the op array built from a list of tuples (by libkvferry_pyops.so where
  it is loaded, and then also a fourth way, "list, in Python", with the
  package's pure-Python conversion);
- Python arrays: ``peer.read_blocks(region, offsets, addrs, 8192).result()``
  with numpy arrays (array.array without numpy);
- Python prebuilt: the C way's prebuilt op array submitted through the
  Python Batch (submit, result, close): the package's cost per batch
  without any conversion, what the other Python ways add to;
- C API, sliced: the C way's array submitted in the slices ``peer.read``
  cuts a list into (one kvf_batch_submit each, then a wait on each):
  what slicing costs by itself, without converting anything;
- list, one slice (where the helper is loaded): the list converted whole
  by the helper, then submitted as one batch, where ``peer.read``
  submits it in slices as it converts (the engine starts on the first
  while the next converts).

It prints each way's median and best time, GiB/s, Python as a percentage
of C (of the medians, and of the best rounds: the figure least moved by
other load on the machine), and the per-call cost of ctypes.

``store`` starts a ``kvferry master`` and ``kvferry node`` and times, round
by round, one batch of ``--count`` objects of ``--size`` put and got
through ``Store.put_batch``/``get_batch`` with ``(region, offset, length)``
spans (what kvferry.kv passes) against the same batch through
kvf_store_put_batch/kvf_store_get_batch called with arrays built before
the clock starts; each round's keys are new and removed after it (the
master's read lease is 50 ms, and the next round waits that long).

``first`` starts a master and a node and times new clients (``--clients``,
one after the other, each its own engine) from connect: register, then
``--batches`` put and get batches with each call's stages: where a
client's first batch pays what later ones do not.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import random
import statistics
import sys
import time
from array import array
from ctypes import byref, c_void_p
from typing import Any, Callable, List, Tuple

from . import Engine, _lib
from . import engine as engine_mod
from .procs import Master, Node, Target
from .store import Store, Timing, last_timing


def _size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def _per_call_ns(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def ctypes_overhead(n: int = 200000) -> dict:
    """ns per call: an empty Python function, and ctypes calls of 0, 1 and 2 args."""
    lib = _lib.lib()
    buf = ctypes.create_string_buffer(8)
    addr = ctypes.addressof(buf)
    nb, nbytes = ctypes.c_long(), ctypes.c_long()
    pb, pn = byref(nb), byref(nbytes)

    def py() -> None:
        return None

    return {
        "python_call": _per_call_ns(py, n),
        "ctypes_0_args (kvf_version)": _per_call_ns(lib.kvf_version, n),
        "ctypes_1_arg (kvf_status_name)": _per_call_ns(lambda: lib.kvf_status_name(-6), n),
        "ctypes_2_args (kvf_checksum of 8 B)": _per_call_ns(lambda: lib.kvf_checksum(addr, 8), n),
        "ctypes_2_ptr_args (kvf_alloc_stats)": _per_call_ns(lambda: lib.kvf_alloc_stats(pb, pn), n),
    }


class _BlockSet:
    """One batch's random blocks: slot numbers on each side, and the
    kvf_op_t array of the C way. The Python ways' lists and arrays are
    made from the slots right before their batch (outside the timed
    part), as a serving engine makes them from its block table: their
    objects are new and in the CPU caches, the blocks are not."""

    def __init__(self, rng: random.Random, local: Any, peer: Any, raddr: int, nloc: int,
                 nrem: int, block: int, count: int):
        self.local, self.raddr, self.block = local, raddr, block
        self.lslots, self.rslots = rng.sample(range(nloc), count), rng.sample(range(nrem), count)
        self.cops = (_lib.Op * count)()
        for i, (ls, rs) in enumerate(zip(self.lslots, self.rslots)):
            op = self.cops[i]
            op.type, op.local, op.peer = _lib.OP_READ, local.addr + ls * block, peer._h
            op.remote, op.length = raddr + rs * block, block
        self.cops_words = array("Q", bytes(self.cops))  # the same operations, as _submit takes them
        try:
            import numpy as np

            self.np: Any = np
            self.ls_a = np.array(self.lslots, dtype=np.uint64)
            self.rs_a = np.array(self.rslots, dtype=np.uint64)
            self.arr_kind = "numpy"
        except ImportError:
            self.np, self.arr_kind = None, "array"

    def make_list(self) -> list:
        """[((local, offset), remote address, length)] of new objects."""
        local, raddr, block = self.local, self.raddr, self.block
        return [((local, ls * block), raddr + rs * block, block)
                for ls, rs in zip(self.lslots, self.rslots)]

    def make_arrays(self) -> Tuple[Any, Any]:
        """(local offsets, remote addresses) as new arrays."""
        block = self.block
        if self.np is not None:
            np = self.np
            return self.ls_a * np.uint64(block), self.rs_a * np.uint64(block) + np.uint64(self.raddr)
        return (array("Q", [ls * block for ls in self.lslots]),
                array("Q", [self.raddr + rs * block for rs in self.rslots]))


def _finish(b: Any) -> float:
    """Waits for b and closes it; returns when the wait began."""
    t = time.perf_counter()
    b.result(30)
    b.close()
    return t


def _build_cpu(fn: Callable[[], object], rounds: int) -> float:
    """Seconds of this thread's CPU time per call of fn."""
    t0 = time.thread_time()
    for _ in range(rounds):
        fn()
    return (time.thread_time() - t0) / rounds


def blocks(args: argparse.Namespace) -> int:
    block, count = _size(args.block), args.count
    total = block * count
    rng = random.Random(args.seed)
    tgt = None
    if args.target is None:
        tgt = Target(pool=args.pool, transports=args.transport).start()
        seg, raddr, rlen = tgt.segment, tgt.pool_addr, tgt.pool_len
    else:
        seg, raddr, rlen = args.target, None, None
    eng = Engine(transports=args.transport)
    try:
        peer = eng.open(seg)
        if raddr is None:
            raddr, rlen, _ = peer.regions()[0]
        local = eng.alloc(max(total, _size(args.local_pool)))
        nloc, nrem = local.nbytes // block, rlen // block
        sets = [_BlockSet(rng, local, peer, raddr, nloc, nrem, block, count)
                for _ in range(max(1, args.sets))]
        arr_kind = sets[0].arr_kind
        lib, eh = _lib.lib(), eng._h
        h = c_void_p()

        def run_c(cops: Any) -> float:
            st = lib.kvf_batch_submit(eh, cops, count, byref(h))
            t = time.perf_counter()
            if st != 0 or lib.kvf_batch_wait(h, 30000) != 0:
                raise RuntimeError("C batch failed")
            lib.kvf_batch_destroy(h)
            return t

        # the list path's slices, cut from the C array: what slicing
        # costs by itself, without any conversion
        starts = [i for i in engine_mod._slice_starts(count, engine_mod._MAX_SLICES) if i < count]
        bounds = list(zip(starts, starts[1:] + [count]))
        hs = [c_void_p() for _ in bounds]
        opsz = ctypes.sizeof(_lib.Op)

        def run_c_sliced(cops: Any) -> float:
            base = ctypes.addressof(cops)
            for (a, b), hx in zip(bounds, hs):
                if lib.kvf_batch_submit(eh, c_void_p(base + a * opsz), b - a, byref(hx)) != 0:
                    raise RuntimeError("C batch failed")
            t = time.perf_counter()
            for hx in reversed(hs):
                if lib.kvf_batch_wait(hx, 30000) != 0:
                    raise RuntimeError("C batch failed")
            for hx in hs:
                lib.kvf_batch_destroy(hx)
            return t

        def run_list(ops: list) -> float:
            return _finish(peer.read(ops))

        def run_list_python(ops: list) -> float:
            saved, _lib._pyops = _lib._pyops, False  # the pure-Python conversion
            try:
                return run_list(ops)
            finally:
                _lib._pyops = saved

        def run_arrays(arrs: Tuple[Any, Any]) -> float:
            return _finish(peer.read_blocks(local, arrs[0], arrs[1], block))

        def run_list_whole(ops: list) -> float:
            arr, n, tot = peer._ops_array(_lib.OP_READ, ops)
            return _finish(peer._submit(arr, n, tot))

        def run_prebuilt(words: Any) -> float:
            return _finish(peer._submit(words, count, total))

        helper = _lib.pyops() is not None
        # (name, what its batch is made of, taken from a block set untimed, the timed call)
        ways: List[Tuple[str, Callable[[_BlockSet], Any], Callable[[Any], float]]] = [
            ("C API", lambda bs: bs.cops, run_c),
            ("Python list", _BlockSet.make_list, run_list),
            ("Python %s" % arr_kind, _BlockSet.make_arrays, run_arrays),
            ("Python prebuilt", lambda bs: bs.cops_words, run_prebuilt),
            ("C API, sliced", lambda bs: bs.cops, run_c_sliced)]
        if helper:
            ways.append(("list, in Python", _BlockSet.make_list, run_list_python))
            ways.append(("list, one slice", _BlockSet.make_list, run_list_whole))
        times: dict = {name: [] for name, _, _ in ways}
        posted: dict = {name: [] for name, _, _ in ways}  # until the submit call returned
        for bs in sets:  # warm-up: every set's pages touched once
            run_c(bs.cops)
        k = 0  # batches so far: each takes the next block set in turn
        for name, make, fn in ways:
            fn(make(sets[k % len(sets)]))
            k += 1
        if args.pin:
            _pin(tgt)
        # As timeit does, the garbage collector is off during the timed
        # calls (--gc: on): making a batch's list allocates thousands of
        # objects untimed, and the collections they owe would otherwise
        # fall into whichever way is timed next.
        gc_off = not args.gc and gc.isenabled()
        for _ in range(args.rounds):
            rng.shuffle(ways)  # no way always runs right after another
            for name, make, fn in ways:
                batch = make(sets[k % len(sets)])
                k += 1
                if gc_off:
                    gc.disable()
                t0 = time.perf_counter()
                tp = fn(batch)
                times[name].append(time.perf_counter() - t0)
                if gc_off:
                    gc.enable()
                posted[name].append(tp - t0)
        # Python-side build cost alone (no submit): what the ratio pays
        # for, in this thread's CPU time (other load on the machine moves
        # it less than wall time)
        ops0, arrs0 = sets[0].make_list(), sets[0].make_arrays()
        build_list = _build_cpu(lambda: peer._ops_array(_lib.OP_READ, ops0), args.rounds)
        build_py = None
        if helper:
            saved, _lib._pyops = _lib._pyops, False
            try:
                build_py = _build_cpu(lambda: peer._ops_array(_lib.OP_READ, ops0), args.rounds)
            finally:
                _lib._pyops = saved
        build_arr = _build_cpu(lambda: peer._blocks_array(_lib.OP_READ, local, arrs0[0], arrs0[1], block),
                               args.rounds)
        print("kvferry bench blocks (python): %d x %s random blocks (%s) via %s, %d rounds, "
              "%d block sets in turn, garbage collector %s during the timed calls"
              % (count, args.block, _fmt(total), peer.transport, args.rounds, len(sets),
                 "off" if gc_off else "on"))
        print("  Python %s, op-list converter: %s%s"
              % (sys.version.split()[0], _lib.pyops_path() if helper else "none (pure Python)",
                 " (direct reads %d)" % _lib.pyops_direct if helper else ""))
        print("  %-15s %9s  %11s  %9s    %9s  %9s" % ("", "median", "", "% of C", "best", "% of C"))
        c_med, c_min = statistics.median(times["C API"]), min(times["C API"])
        for name in times:
            med, best = statistics.median(times[name]), min(times[name])
            print("  %-15s %9.3f ms  %6.2f GiB/s  %6.1f %%    %6.3f ms  %6.1f %%"
                  % (name, med * 1e3, total / med / (1 << 30), 100.0 * c_med / med,
                     best * 1e3, 100.0 * c_min / best))
        print("  submit call (median; the rest is waiting for the copies):")
        print("    " + ", ".join("%s %.3f ms" % (name, statistics.median(posted[name]) * 1e3)
                                 for name in posted))
        print("  op array build (CPU): list %.3f ms (%.0f ns/op), %s %.3f ms (%.0f ns/op)"
              % (build_list * 1e3, build_list * 1e9 / count, arr_kind, build_arr * 1e3,
                 build_arr * 1e9 / count))
        if build_py is not None:
            print("  op array build (CPU): list, in Python %.3f ms (%.0f ns/op)"
                  % (build_py * 1e3, build_py * 1e9 / count))
        print("ctypes per-call cost (ns):")
        for k, v in ctypes_overhead(args.calls).items():
            print("  %-38s %7.0f" % (k, v))
    finally:
        eng.close()  # ends batches, closes the peer, frees the local pool
        if tgt is not None:
            tgt.close()
    return 0


def _store_round(st: Store, lib: Any, reg: Any, spans: List[Tuple[Any, int, int]],
                 keys: List[str], size: int, way: str) -> Tuple[float, float, Timing, Timing]:
    """(put, get) seconds of one batch, through the package or the C calls,
    and each one's stages (last_timing)."""
    n = len(keys)
    if way == "Python":
        t0 = time.perf_counter()
        st.put_batch(keys, spans)
        t1 = time.perf_counter()
        sp = last_timing()
        t1b = time.perf_counter()
        st.get_batch(keys, spans)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1b, sp, last_timing()
    karr = (ctypes.c_char_p * n)(*[k.encode() for k in keys])
    bufs = (c_void_p * n)(*[reg.addr + off for _, off, _ in spans])
    lens = (ctypes.c_size_t * n)(*([size] * n))
    got = (ctypes.c_size_t * n)()
    sts = (ctypes.c_int * n)()
    opts = _lib.PutOpts()
    h = st._handle()
    t0 = time.perf_counter()
    r1 = lib.kvf_store_put_batch(h, n, karr, bufs, lens, byref(opts), sts)
    t1 = time.perf_counter()
    sp = last_timing()
    t1b = time.perf_counter()
    r2 = lib.kvf_store_get_batch(h, n, karr, bufs, lens, got, 0, sts)
    t2 = time.perf_counter()
    if r1 != 0 or r2 != 0:
        raise SystemExit("C batch failed: put %d, get %d" % (r1, r2))
    return t1 - t0, t2 - t1b, sp, last_timing()


def _stages(t: Timing) -> str:
    """A call's stages in ms (query, transfer, checksum, commit)."""
    return "master %.1f, transfer %.1f, checksums %.1f, commit %.1f ms" % (
        t.query * 1e3, t.transfer * 1e3, t.checksum * 1e3, t.commit * 1e3)


def _median_timing(ts: List[Timing]) -> Timing:
    return Timing(*(statistics.median(col) for col in zip(*ts)))


def store(args: argparse.Namespace) -> int:
    size, n = _size(args.size), args.count
    ways = ("C", "Python")
    times = {(w, op): [] for w in ways for op in ("put", "get")}
    stages: dict = {op: [] for op in ("put", "get")}  # the C calls' stages
    first: dict = {}  # round 0, untimed: a new client's first batch
    # a get's read lease keeps a removed object's space: short leases and a
    # pause after each round's removal leave the pool free for the next
    with Master("--lease", "50ms") as m, Node(m.address, pool=args.pool), \
            Store.connect(m.address) as st:
        unit = random.Random(args.seed).randbytes(1 << 20)
        buf = bytearray((unit * (size * n // len(unit) + 1))[:size * n])
        reg = st.register(buf)
        spans = [(reg, i * size, size) for i in range(n)]
        lib = _lib.lib()
        gc.disable()
        try:
            for r in range(args.rounds + 1):  # round 0 warms up, untimed
                for w in (ways if r % 2 else ways[::-1]):
                    keys = ["bench/%d/%s/%d" % (r, w, i) for i in range(n)]
                    tp, tg, sp, sg = _store_round(st, lib, reg, spans, keys, size, w)
                    st.remove_batch(keys)
                    time.sleep(0.06)
                    if r:
                        times[(w, "put")].append(tp)
                        times[(w, "get")].append(tg)
                        if w == "C":
                            stages["put"].append(sp)
                            stages["get"].append(sg)
                    else:
                        first[w] = (tp, tg, sp, sg)
        finally:
            gc.enable()
            reg.deregister()
    print("store batch: %d objects of %s, %d rounds (master and node started here)"
          % (n, _fmt(size), args.rounds))
    tp, tg, sp, sg = first[ways[1]]
    print("  a new client's first batch (round 0, not in the medians): put %.1f ms, get %.1f ms"
          % (tp * 1e3, tg * 1e3))
    print("    its put: %s; its get: %s" % (_stages(sp), _stages(sg)))
    print("  the C calls' stages (medians): put: %s; get: %s"
          % (_stages(_median_timing(stages["put"])), _stages(_median_timing(stages["get"]))))
    for op in ("put", "get"):
        c, py = (statistics.median(times[(w, op)]) for w in ways)
        print("  %s: C %.2f us/key (%.2f GB/s), Python %.2f us/key (%.2f GB/s): "
              "Python %.1f %% of C, %.2f us/key more"
              % (op, c / n * 1e6, n * size / c / 1e9, py / n * 1e6, n * size / py / 1e9,
                 100 * c / py, (py - c) / n * 1e6))
    return 0


def first(args: argparse.Namespace) -> int:
    """A new store client's first batches against later ones: what a
    client pays once (connect, register, the node's first mapping)."""
    size, n = _size(args.size), args.count
    ms = 1e3
    print("store first batches: %d objects of %s, %d clients in turn, %d batches each"
          % (n, _fmt(size), args.clients, args.batches))
    with Master("--lease", "50ms") as m, Node(m.address, pool=args.pool):
        for c in range(args.clients):
            buf = bytearray(size * n)  # zeroed here: its pages are touched
            t0 = time.perf_counter()
            st = Store.connect(m.address)
            t1 = time.perf_counter()
            reg = st.register(buf)
            print("client %d: connect %.1f ms, register %s %.1f ms"
                  % (c, (t1 - t0) * ms, _fmt(size * n), (time.perf_counter() - t1) * ms))
            spans = [(reg, i * size, size) for i in range(n)]
            try:
                for r in range(args.batches):
                    keys = ["first/%d/%d/%d" % (c, r, i) for i in range(n)]
                    for op, call in (("put", st.put_batch), ("get", st.get_batch)):
                        t0 = time.perf_counter()
                        call(keys, spans)
                        print("  batch %d %s %.1f ms: %s"
                              % (r, op, (time.perf_counter() - t0) * ms, _stages(last_timing())))
                    st.remove_batch(keys)
                    time.sleep(0.06)  # the read leases end
            finally:
                t0 = time.perf_counter()
                reg.deregister()
                st.close()
                print("  deregister and close %.1f ms" % ((time.perf_counter() - t0) * ms))
    return 0


def _pin(tgt: "Target") -> None:
    """The calling thread on the first CPU, every other thread of this
    process (the engine's) and the target started here on the others: a
    caller with a core of its own, as on a host with cores to spare."""
    import os
    import threading

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs")
    me, rest = threading.get_native_id(), set(cpus[1:])
    for t in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(t), {cpus[0]} if int(t) == me else rest)
    if tgt is not None:
        for t in os.listdir("/proc/%d/task" % tgt.proc.pid):
            os.sched_setaffinity(int(t), rest)
    print("  pinned: this thread on CPU %d, the engine's threads and the target on %s"
          % (cpus[0], ",".join(map(str, sorted(rest)))))


def _fmt(n: int) -> str:
    for unit, d in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= d and n % d == 0:
            return "%d %s" % (n // d, unit)
    return "%d B" % n


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvferry.bench", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("blocks", help="C vs Python on one batch of random blocks")
    b.add_argument("--block", default="8K")
    b.add_argument("--count", type=int, default=4096)
    b.add_argument("--pool", default="1G", help="target pool (started here)")
    b.add_argument("--local-pool", default="1G")
    b.add_argument("--gc", action="store_true",
                   help="keep the garbage collector on during the timed calls")
    b.add_argument("--sets", type=int, default=16,
                   help="block sets taken in turn, one per batch (1: the same blocks every batch)")
    b.add_argument("--transport", default=None, help="tcp, shm (default: auto)")
    b.add_argument("--target", default=None, help="HOST:PORT of a running target")
    b.add_argument("--rounds", type=int, default=30)
    b.add_argument("--calls", type=int, default=200000)
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--pin", action="store_true",
                   help="this thread on one CPU, the engine and the target on the others")
    s = sub.add_parser("store", help="Python vs C on store batches (starts master and node)")
    s.add_argument("--size", default="32K")
    s.add_argument("--count", type=int, default=4096)
    s.add_argument("--pool", default="1G", help="the node's pool")
    s.add_argument("--rounds", type=int, default=20)
    s.add_argument("--seed", type=int, default=1)
    f = sub.add_parser("first", help="a new store client's first batches, stage by stage")
    f.add_argument("--size", default="32K")
    f.add_argument("--count", type=int, default=4096)
    f.add_argument("--pool", default="1G", help="the node's pool")
    f.add_argument("--clients", type=int, default=2, help="clients in turn, each new")
    f.add_argument("--batches", type=int, default=3, help="put and get batches a client")
    args = ap.parse_args(argv)
    return {"store": store, "first": first}.get(args.cmd, blocks)(args)


if __name__ == "__main__":
    sys.exit(main())
