"""The transfer engine: Engine, Region, Peer and Batch over kvf_engine_*.

Every blocking call goes through ctypes, which releases the GIL for the
duration of the C call: other Python threads run while a batch waits or a
peer opens.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import operator
import sys
import threading
import time
import weakref
from array import array
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

from . import _buffers, _lib, config
from .errors import (
    ERR_TIMEOUT,
    INPROGRESS,
    OK,
    BufferTypeError,
    ClosedError,
    NotRegisteredError,
    ERR_INVALID_PARAM,
    ERR_OUT_OF_BOUNDS,
    check,
    invalid,
    make_error,
)

Local = Union[int, Tuple["Region", int]]
OpTuple = Tuple[Local, int, int]
_ONLY_3 = {3}
_chain = itertools.chain.from_iterable


def _add_base(offs: array, base: int, n: int) -> array:
    """offs[i] + base for every i, as one addition of two n*64-bit
    integers (the sums stay below 2**64, so no lane carries into the
    next): C speed without numpy."""
    if sys.byteorder != "little":
        return array("Q", [o + base for o in offs])
    rep = int.from_bytes(base.to_bytes(8, "little") * n, "little")
    return array("Q", (int.from_bytes(offs, "little") + rep).to_bytes(8 * n, "little"))


MEM_HOST = _lib.MEM_HOST
MEM_PINNED = _lib.MEM_PINNED
MEM_CUDA = _lib.MEM_CUDA
_MEM_NAMES = {MEM_HOST: "host", MEM_PINNED: "pinned", MEM_CUDA: "cuda"}


def _closed(what: str) -> ClosedError:
    return ClosedError(ERR_INVALID_PARAM, what, "already closed")


def _enc(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode()


class Region:
    """Registered memory: ``addr``, ``nbytes``, ``mem_type``, ``device``.

    Made by :meth:`Engine.register` or :meth:`Engine.alloc`; keeps the
    registered object alive (and a bytearray unresizable) until
    :meth:`deregister`. Use ``(region, offset)`` as the local side of an
    operation and ``(region, offset, length)`` as a store buffer.
    """

    def __init__(self, engine: "Engine", handle: int, addr: int, nbytes: int,
                 mem_type: int, device: int, obj: Any, view: Any, readonly: bool,
                 owned_mem: bool = False):
        self._engine = engine
        self._h: Optional[int] = handle
        self.addr = addr
        self.nbytes = nbytes
        self.mem_type = mem_type
        self.device = device
        self.obj = obj
        self.readonly = readonly
        self._view = view
        self._owned_mem = owned_mem

    @property
    def closed(self) -> bool:
        return self._h is None

    @property
    def is_gpu(self) -> bool:
        return self.mem_type == MEM_CUDA

    def memoryview(self) -> memoryview:
        """A writable memoryview of host memory from :meth:`Engine.alloc`."""
        if self._h is None:
            raise _closed("region")
        if self.mem_type == MEM_CUDA:
            raise invalid("region", "GPU memory has no host view")
        if self.obj is not None and not self._owned_mem:
            return memoryview(self.obj).cast("B")
        return memoryview((ctypes.c_char * self.nbytes).from_address(self.addr)).cast("B")

    def span(self, offset: int = 0, length: Optional[int] = None) -> Tuple[int, int]:
        """(address, length) of [offset, offset+length) checked against the region."""
        if self._h is None:
            raise _closed("region")
        if length is None:
            length = self.nbytes - offset
        if offset < 0 or length < 0 or offset + length > self.nbytes:
            raise NotRegisteredError(
                ERR_OUT_OF_BOUNDS, "region",
                "[%d, %d) outside a region of %d bytes" % (offset, offset + length, self.nbytes))
        return self.addr + offset, length

    def deregister(self) -> None:
        """Waits for remote accesses in flight, then removes the region."""
        h, self._h = self._h, None
        if h is None:
            return
        eng = self._engine
        st = OK
        if eng._h is not None:
            st = _lib.lib().kvf_engine_dereg(eng._h, h)
        if self._owned_mem:
            _lib.lib().kvf_mem_free(self.addr)
        if self._view is not None:
            self._view.release()
            self._view = None
        self.obj = None
        eng._regions.discard(self)
        check(st, "deregister")

    close = deregister

    def __enter__(self) -> "Region":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.deregister()

    def __repr__(self) -> str:
        return "<kvferry.Region %s 0x%x+%d%s>" % (
            _MEM_NAMES.get(self.mem_type, "?"), self.addr, self.nbytes,
            " closed" if self._h is None else "")


class Batch:
    """A submitted batch of operations: a future.

    ``wait(timeout)`` returns True once every operation ended;
    ``result(timeout)`` raises the first error (a :class:`KvferryError`);
    ``statuses()`` gives each operation's status; ``cancel()`` ends
    operations not yet started with KVF_ERR_CANCELED. The C batch is freed
    by :meth:`close` (or the context manager, or garbage collection).

    A list submitted while it converts is several C batches (slices of
    the operations, in order); the object behaves as one batch.
    """

    def __init__(self, engine: "Engine", handle: int, count: int, nbytes: int,
                 slices: Optional[Sequence[int]] = None, starts: Sequence[int] = (0,)):
        self._engine = engine
        self._h: Optional[int] = handle
        self._hs = tuple(slices) if slices is not None else (handle,)
        self._starts = starts  # index of each slice's first operation
        self._ended = False  # a wait saw every slice done
        self.count = count
        self.nbytes = nbytes
        engine._batches.add(self)

    def _handle(self) -> int:
        if self._h is None:
            raise _closed("batch")
        return self._h

    def _handles(self) -> Tuple[int, ...]:
        if self._h is None:
            raise _closed("batch")
        return self._hs

    def test(self) -> int:
        """kvf_batch_test: INPROGRESS (1), OK (0) or the first error."""
        test = _lib.lib().kvf_batch_test
        first = OK
        for h in self._handles():
            st = test(h)
            if st == INPROGRESS:
                return st
            if first == OK:
                first = st
        return first

    def done(self) -> bool:
        """True once every operation ended (well or not)."""
        return self.test() != INPROGRESS

    def _wait(self, timeout: Optional[float]) -> Tuple[bool, int]:
        """(done, status): kvf_batch_wait on each slice, which returns the
        slice's first error once it is done (ERR_TIMEOUT is also a status
        an operation can end with: kvf_batch_test tells). The last slice
        is waited for first: slices end in about the order they went
        out, so the caller sleeps once and the engine's threads wake
        nobody when the earlier ones end."""
        hs = self._handles()
        lib = _lib.lib()
        wait, test = lib.kvf_batch_wait, lib.kvf_batch_test
        first = OK
        end = None if timeout is None or len(hs) == 1 else time.monotonic() + timeout
        sts = []
        for h in reversed(hs):
            if timeout is None:
                st = wait(h, 1000)
                while st == ERR_TIMEOUT and test(h) == INPROGRESS:
                    st = wait(h, 1000)
            else:
                ms = timeout if end is None else end - time.monotonic()
                st = wait(h, max(0, int(ms * 1000)))
                if st == ERR_TIMEOUT and test(h) == INPROGRESS:
                    return False, INPROGRESS
            sts.append(st)
        for st in reversed(sts):  # the first error in the operations' order
            if st != OK:
                first = st
                break
        self._ended = True
        return True, first

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits at most timeout seconds (None: until done); True when done."""
        return self._wait(timeout)[0]

    def result(self, timeout: Optional[float] = None) -> int:
        """Waits, then returns the bytes moved or raises the first error
        (:class:`TimeoutError_` when not done within timeout)."""
        done, st = self._wait(timeout)
        if not done:
            raise make_error(ERR_TIMEOUT, "batch", "not done within %.3f s" % timeout)
        if st != OK:
            raise make_error(st, "batch")
        return self.nbytes

    def op_status(self, index: int) -> Tuple[int, int]:
        """(status, bytes moved) of operation index."""
        if not 0 <= index < self.count:
            raise IndexError(index)
        hs = self._handles()
        k = bisect.bisect_right(self._starts, index) - 1
        n = c_size_t(0)
        st = _lib.lib().kvf_batch_op_status(hs[k], index - self._starts[k], byref(n))
        return st, n.value

    def statuses(self) -> List[int]:
        """Status of every operation (0 = done, 1 = in progress, < 0 = error)."""
        return [self.op_status(i)[0] for i in range(self.count)]

    def cancel(self) -> None:
        """Ends operations not yet started with KVF_ERR_CANCELED."""
        for h in self._handles():
            _lib.lib().kvf_batch_cancel(h)

    def close(self) -> None:
        """Frees the batch (cancels and waits if it still runs)."""
        h, self._h = self._h, None
        if h is not None:
            lib = _lib.lib()
            if len(self._hs) > 1 and not self._ended:
                for x in self._hs:  # stop the later slices before waiting for any
                    lib.kvf_batch_cancel(x)
            for x in self._hs:
                lib.kvf_batch_destroy(x)
            self._engine._batches.discard(self)

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# A list read through the helper goes in slices of _FIRST_SLICE
# operations, then four times more each (at most _MAX_SLICES): the first
# is small so the engine starts at once, the later ones convert while the
# engine moves the earlier. KVFERRY_FIRST_SLICE (16..65536) tunes the
# first one for a host.
_FIRST_SLICE = config.get_int("KVFERRY_FIRST_SLICE", 16, 65536)
_MAX_SLICES = 8


def _slice_starts(n: int, nb: int) -> Tuple[int, ...]:
    """First operation of each of the nb slices of n operations, as
    kvf_pyops_submit_call cuts them."""
    starts, i, step = [], 0, _FIRST_SLICE
    for _ in range(nb):
        starts.append(i)
        i += step
        step *= 4
    return tuple(starts)


def _outside() -> NotRegisteredError:
    return NotRegisteredError(ERR_OUT_OF_BOUNDS, "op", "block outside the local region")


def _is_numpy(x: Any) -> bool:
    return (type(x).__module__ or "").startswith("numpy")


class Peer:
    """An opened peer (a remote or local segment): batched read and write.

    An operation is ``(local, remote_addr, length)``; local is an address
    inside a registered region or ``(region, offset)`` (checked against the
    region here). :meth:`read_blocks`/:meth:`write_blocks` take arrays of
    offsets and addresses instead and build the C operation array in one
    go (numpy or :mod:`array`), with no per-operation Python work.
    """

    def __init__(self, engine: "Engine", handle: int, name: str):
        self._engine = engine
        self._h: Optional[int] = handle
        self.name = name
        self._tls = threading.local()
        engine._peers.add(self)

    def _handle(self) -> int:
        if self._h is None or self._engine._h is None:
            raise _closed("peer")
        return self._h

    @property
    def transport(self) -> str:
        """Name of the transport serving the peer ("tcp", "shm", ...)."""
        return _lib.lib().kvf_peer_transport(self._handle()).decode()

    def regions(self) -> List[Tuple[int, int, int]]:
        """(addr, length, mem_type) of the peer's registered regions."""
        out = []
        h = self._handle()
        a, n, t = c_uint64(), c_size_t(), c_int()
        i = 0
        while _lib.lib().kvf_peer_region(h, i, byref(a), byref(n), byref(t)) == OK:
            out.append((a.value, n.value, t.value))
            i += 1
        return out

    def _ops_array(self, typ: int, ops: Iterable[OpTuple]) -> Tuple[array, int, int]:
        p = self._handle()
        if not isinstance(ops, (list, tuple)):
            ops = list(ops)
        pack = _lib.pyops()
        if pack is not None:
            packed = self._ops_array_c(pack, typ, p, ops)
            if packed is not None:
                return packed
        fast = self._ops_array_fast(typ, p, ops)
        if fast is not None:
            return fast
        return self._ops_array_slow(typ, p, ops)

    def _ops_array_c(self, pack: Any, typ: int, p: int,
                     ops: Sequence[OpTuple]) -> Optional[Tuple[array, int, int]]:
        """The op array built by libkvferry_pyops.so in one call, into a
        reused array of this thread (kvf_batch_submit copies the
        operations); None when it declines (the Python paths then build
        it, or raise)."""
        tls = self._tls
        out = getattr(tls, "words", None)
        if out is None or len(out) < 5 * len(ops):
            self._grow_words(len(ops))
        n = pack(ops, Region, typ, p, tls.out_addr, tls.cap, tls.total_ref)
        if n < 0:
            return None
        return tls.words, n, tls.total.value

    @staticmethod
    def _ops_array_fast(typ: int, p: int, ops: Sequence[OpTuple]) -> Optional[Tuple[array, int, int]]:
        """The op array built column by column at C speed when every local
        is an int or every local is (one region, offset); None for
        anything else (the per-op path then checks and reports).

        The operations are flattened once (itertools.chain), each column
        is a slice of that list made an array("Q") (which checks that
        every item is an int in range), and the region's base is added to
        the offsets as one big integer (no int object per operation)."""
        n = len(ops)
        try:
            if n == 0 or set(map(len, ops)) != _ONLY_3:
                return None
            flat = list(_chain(ops))
            locs = flat[0::3]
            lens_l = flat[2::3]
            lens = array("Q", lens_l)
            one = lens_l[0]
            uniform = lens_l.count(one) == n  # one block size: no per-op sums
            total = one * n if uniform else sum(lens_l)
            if type(locs[0]) is tuple:
                pairs = list(_chain(locs))
                reg = pairs[0]
                if len(pairs) != 2 * n or not isinstance(reg, Region) or reg._h is None:
                    return None
                if pairs[0::2].count(reg) != n or (typ == _lib.OP_READ and reg.readonly):
                    return None
                offs_l = pairs[1::2]
                offs = array("Q", offs_l)  # OverflowError for a negative offset
                end = max(offs_l) + one if uniform else max(map(operator.add, offs_l, lens_l))
                if end > reg.nbytes:
                    return None
                addrs = _add_base(offs, reg.addr, n)
            else:
                addrs = array("Q", locs)
            arr = array("Q", [typ, 0, p, 0, 0]) * n
            arr[1::5] = addrs
            arr[3::5] = array("Q", flat[1::3])
            arr[4::5] = lens
        except (TypeError, ValueError, OverflowError):
            return None
        return arr, n, total

    def _ops_array_slow(self, typ: int, p: int, ops: Sequence[OpTuple]) -> Tuple[array, int, int]:
        """The op array built operation by operation: any mix of local
        forms, and the error that names the first bad operation."""
        vals: List[int] = []
        ext = vals.extend
        for i, op in enumerate(ops):
            try:
                local, remote, length = op
            except (TypeError, ValueError):
                raise invalid("op", "operation %d is not (local, remote_addr, length): %r"
                              % (i, op)) from None
            if type(local) is int:
                addr = local
            else:
                addr = self._local_addr(typ, i, local, length)
            ext((typ, addr, p, remote, length))
        if not vals:
            raise invalid("op", "empty batch")
        try:
            arr = array("Q", vals)
        except (TypeError, OverflowError):
            raise self._bad_words(ops) from None
        return arr, len(vals) // 5, sum(arr[4::5])

    @staticmethod
    def _local_addr(typ: int, i: int, local: Any, length: Any) -> int:
        """The address of a (region, offset) local, checked against the region."""
        try:
            region, off = local
            span = region.span
        except (TypeError, ValueError, AttributeError):
            raise invalid("op", "operation %d: local must be an address or (region, offset), got %r"
                          % (i, local), BufferTypeError) from None
        try:
            addr, _ = span(operator.index(off), operator.index(length))
        except TypeError:
            raise invalid("op", "operation %d: offset and length must be ints, got %r, %r"
                          % (i, off, length), BufferTypeError) from None
        if typ == _lib.OP_READ and region.readonly:
            raise invalid("op", "read into a read-only buffer (%r)" % (region,))
        return addr

    @staticmethod
    def _bad_words(ops: Sequence[OpTuple]) -> Exception:
        """The error for the first operation whose address, remote address
        or length is not an int in [0, 2**64)."""
        for i, (local, remote, length) in enumerate(ops):
            for name, v in (("address", local), ("remote address", remote), ("length", length)):
                if type(local) is not int and name == "address":
                    continue
                try:
                    array("Q", [v])
                except TypeError:
                    return invalid("op", "operation %d: %s must be an int, got %r" % (i, name, v),
                                   BufferTypeError)
                except OverflowError:
                    return invalid("op", "operation %d: %s %d outside [0, 2**64)" % (i, name, v))
        return invalid("op", "an address or length is not an int in [0, 2**64)")

    @staticmethod
    def _blocks_check(typ: int, region: "Region", local_offsets: Any, remote_addrs: Any) -> int:
        """The number of blocks, once the arrays and region may take them."""
        n = len(local_offsets)
        if n == 0 or len(remote_addrs) != n:
            raise invalid("op", "offsets and addresses must be non-empty and of one length")
        if region.closed:
            raise _closed("region")
        if typ == _lib.OP_READ and region.readonly:
            raise invalid("op", "read into a read-only buffer (%r)" % (region,))
        return n

    def _blocks_array(self, typ: int, region: "Region", local_offsets: Any,
                      remote_addrs: Any, length: Any) -> Tuple[Any, int, int]:
        p = self._handle()
        n = self._blocks_check(typ, region, local_offsets, remote_addrs)
        if any(_is_numpy(x) for x in (local_offsets, remote_addrs, length)):
            packed = self._blocks_c(typ, p, region, local_offsets, remote_addrs, length, n)
            if packed is not None:
                return packed
            return self._blocks_numpy(typ, p, region, local_offsets, remote_addrs, length, n)
        lens = [int(length)] * n if isinstance(length, int) else list(length)
        if len(lens) != n:
            raise invalid("op", "lengths and offsets differ in count")
        base = region.addr
        if max(o + ln for o, ln in zip(local_offsets, lens)) > region.nbytes or min(local_offsets) < 0:
            raise _outside()
        arr = array("Q", [typ, 0, p, 0, 0]) * n
        arr[1::5] = array("Q", [base + o for o in local_offsets])
        arr[3::5] = array("Q", remote_addrs)
        arr[4::5] = array("Q", lens)
        return arr, n, sum(lens)

    def _blocks_args(self, typ: int, p: int, region: "Region", local_offsets: Any,
                     remote_addrs: Any, length: Any, n: int) -> Tuple[Any, tuple]:
        """The arguments both block helpers of libkvferry_pyops.so begin
        with (offsets, addresses, lengths, length, n, base, nbytes, type,
        peer), and the contiguous uint64 numpy arrays whose memory they
        point at (keep them alive over the call). This thread's op array
        is made large enough for n."""
        import numpy as np

        lo = np.ascontiguousarray(local_offsets, dtype=np.uint64)
        ra = np.ascontiguousarray(remote_addrs, dtype=np.uint64)
        if lo.shape != (n,) or ra.shape != (n,):
            raise invalid("op", "offsets and addresses must be 1-D arrays of one length")
        lens, ln = None, 0
        if isinstance(length, (int, np.integer)):
            ln = int(length)
            if ln < 0:
                raise _outside()
        else:
            lens = np.ascontiguousarray(length, dtype=np.uint64)
            if lens.shape != (n,):
                raise invalid("op", "lengths and offsets differ in count")
        self._grow_words(n)
        args = (lo.ctypes.data, ra.ctypes.data, None if lens is None else lens.ctypes.data, ln, n,
                region.addr, region.nbytes, typ, p)
        return (lo, ra, lens), args

    def _blocks_c(self, typ: int, p: int, region: "Region", local_offsets: Any,
                  remote_addrs: Any, length: Any, n: int) -> Optional[Tuple[array, int, int]]:
        """The op array of numpy blocks built by libkvferry_pyops.so in one
        call into this thread's reused array: a few numpy calls instead of
        a dozen, which cold (after a batch has moved megabytes) cost more
        than the build. None without the helper (the numpy path then)."""
        fn = _lib.pyops_blocks()
        if fn is None:
            return None
        keep, args = self._blocks_args(typ, p, region, local_offsets, remote_addrs, length, n)
        tls = self._tls
        got = fn(*args, tls.out_addr, tls.cap, tls.total_ref)
        if got == -1:
            raise _outside()
        return (tls.words, n, tls.total.value) if got > 0 else None

    def _blocks_buffers(self, typ: int, region: "Region", local_offsets: Any,
                        remote_addrs: Any, length: Any) -> Optional[Batch]:
        """The common form (two contiguous uint64 arrays, an int length)
        checked, built and submitted in slices by one call of
        libkvferry_pyops.so, which reads the arrays through the buffer
        protocol: no Python work before the first slice goes out. None
        when it declines (another form, or no such helper): the other
        paths take the batch and raise what they raise."""
        fn = _lib.pyops_blocks_buffers()
        if fn is None:
            return None
        got = self._call_helper(fn, len(local_offsets), local_offsets, remote_addrs, length,
                                region, typ)
        if got < -1:
            return None
        if got == -1:
            raise _outside()
        return self._sliced_batch(got, got)

    def _call_helper(self, fn: Any, count: int, *args: Any) -> int:
        """fn(*args, call) of libkvferry_pyops.so with this thread's
        PyopsCall for count operations; when it answers -3 (no room in the
        op array), the array grows and fn is called once more."""
        self._handle()  # a closed peer or engine raises here
        got = fn(*args, getattr(self._tls, "call_addr", None) or self._helper_call())
        if got == -3:
            self._grow_words(count)
            got = fn(*args, self._helper_call())
        return got

    def _helper_call(self) -> int:
        """This thread's PyopsCall for kvf_pyops_submit_call and
        kvf_pyops_blocks_buffers (made again when the op array grows);
        its address."""
        tls = self._tls
        if getattr(tls, "words", None) is None:
            self._grow_words(1)
        call = _lib.PyopsCall(Region, self._engine._handle(), self._handle(), _FIRST_SLICE,
                              tls.out_addr, tls.cap, tls.slices_addr, _MAX_SLICES, tls.res_addr)
        tls.call, tls.call_addr = call, ctypes.addressof(call)
        return tls.call_addr

    def _blocks_sliced(self, typ: int, region: "Region", local_offsets: Any,
                       remote_addrs: Any, length: Any) -> Optional[Batch]:
        """Numpy blocks checked, built and submitted in slices by
        libkvferry_pyops.so (the engine moves the first slice while the
        next is built); None when the arrays are not numpy or the helper
        is absent or cannot (the caller builds the whole array then)."""
        fn = _lib.pyops_blocks_submit()
        if fn is None or not (_is_numpy(local_offsets) or _is_numpy(remote_addrs) or _is_numpy(length)):
            return None
        p = self._handle()
        n = self._blocks_check(typ, region, local_offsets, remote_addrs)
        keep, args = self._blocks_args(typ, p, region, local_offsets, remote_addrs, length, n)
        tls = self._tls
        got = fn(*args, self._engine._handle(), _FIRST_SLICE, tls.out_addr, tls.cap,
                 tls.slices_addr, _MAX_SLICES, tls.res_addr)
        if got == -1:
            raise _outside()
        return self._sliced_batch(got, n) if got >= 0 else None

    def _scratch(self, n: int) -> Any:
        """A reused (n, 5) uint64 numpy array of this thread (kvf_batch_submit
        copies the operations, so the array is free again once it returns):
        no fresh 40-bytes-per-op allocation and page faults per batch."""
        import numpy as np

        tls = self._tls
        buf = getattr(tls, "ops", None)
        if buf is None or buf.shape[0] < n:
            buf = np.empty((max(n, 1024), 5), dtype=np.uint64)
            tls.ops = buf
            tls.typ_rows = -1
        return buf[:n]

    def _blocks_numpy(self, typ: int, p: int, region: "Region", local_offsets: Any,
                      remote_addrs: Any, length: Any, n: int) -> Tuple[Any, int, int]:
        import numpy as np  # already imported by the caller

        lo = np.asarray(local_offsets, dtype=np.uint64)
        ra = np.asarray(remote_addrs, dtype=np.uint64)
        if lo.shape != (n,) or ra.shape != (n,):
            raise invalid("op", "offsets and addresses must be 1-D arrays of one length")
        if isinstance(length, (int, np.integer)):
            ln: Any = int(length)
            if ln < 0 or int(lo.max()) + ln > region.nbytes:
                raise _outside()
            total = ln * n
        else:
            ln = np.asarray(length, dtype=np.uint64)
            if ln.shape != (n,):
                raise invalid("op", "lengths and offsets differ in count")
            if int((lo + ln).max()) > region.nbytes:
                raise _outside()
            total = int(ln.sum())
        arr = self._scratch(n)
        tls = self._tls
        # the type and peer columns stay from the last batch of this type
        if tls.typ_rows < n or tls.typ != typ:
            arr[:, 0] = typ
            arr[:, 2] = p
            tls.typ, tls.typ_rows = typ, n
        np.add(lo, np.uint64(region.addr), out=arr[:, 1])
        arr[:, 3] = ra
        arr[:, 4] = ln
        return arr, n, total

    def _submit(self, arr: Any, n: int, total: int, flags: int = 0) -> Batch:
        eng = self._engine
        addr = arr.ctypes.data if hasattr(arr, "ctypes") else arr.buffer_info()[0]
        h = c_void_p()
        st = _lib.lib().kvf_batch_submit_ex(eng._handle(), addr, n, flags, byref(h))
        check(st, "submit")
        return Batch(eng, h.value, n, total)

    def _read_sliced(self, submit: Any, ops: Sequence[OpTuple]) -> Optional[Batch]:
        """A READ of ops converted by libkvferry_pyops.so and submitted
        slice by slice as it converts (the engine moves the first slice
        while the next converts); None when it declines (nothing was left
        submitted: the Python path then converts or raises)."""
        n = self._call_helper(submit, len(ops), ops, _lib.OP_READ)
        if n < 0:
            return None
        return self._sliced_batch(n, len(ops))

    def _sliced_batch(self, n: int, count: int) -> Batch:
        """The Batch of a sliced submit that returned n (0: a submit
        failed, raised here) for count operations."""
        eng, res = self._engine, self._tls.res
        if n == 0:
            check(res[2] - (1 << 64) if res[2] >> 63 else res[2], "submit")
        nb, slices = res[1], self._tls.slices
        if nb == 1:
            return Batch(eng, slices[0], count, res[0])
        hs = slices[:nb]
        return Batch(eng, hs[0], count, res[0], hs, _slice_starts(count, nb))

    def _grow_words(self, n: int) -> None:
        """This thread's reused op array (kvf_batch_submit copies the
        operations) for at least n operations, and the helper's outputs."""
        tls = self._tls
        if getattr(tls, "words", None) is not None and tls.cap >= n:
            return
        out = array("Q", bytes(40 * max(n, 1024)))
        tls.words, tls.total, tls.cap = out, c_uint64(), len(out) // 5
        tls.call = tls.call_addr = None  # the helper's view of the old array
        tls.out_addr, tls.total_ref = out.buffer_info()[0], byref(tls.total)
        if getattr(tls, "slices", None) is None:
            tls.slices = array("Q", bytes(8 * _MAX_SLICES))
            tls.res = array("Q", bytes(8 * 3))
            tls.slices_addr, tls.res_addr = tls.slices.buffer_info()[0], tls.res.buffer_info()[0]

    def read(self, ops: Iterable[OpTuple], inline: bool = False) -> Batch:
        """Submits READ operations (remote -> local) at once; returns the Batch.

        inline=True: the caller waits right away, and the calling thread
        may move requests itself (KVF_BATCH_INLINE)."""
        if not isinstance(ops, (list, tuple)):
            ops = list(ops)
        if not inline:
            submit = _lib.pyops_submit()
            if submit is not None and len(ops) > _FIRST_SLICE:
                b = self._read_sliced(submit, ops)
                if b is not None:
                    return b
        arr, n, total = self._ops_array(_lib.OP_READ, ops)
        return self._submit(arr, n, total, _lib.BATCH_INLINE if inline else 0)

    def write(self, ops: Iterable[OpTuple], inline: bool = False) -> Batch:
        """Submits WRITE operations (local -> remote) at once; returns the Batch."""
        arr, n, total = self._ops_array(_lib.OP_WRITE, ops)
        return self._submit(arr, n, total, _lib.BATCH_INLINE if inline else 0)

    def read_blocks(self, region: Region, local_offsets: Sequence[int],
                    remote_addrs: Sequence[int], length: Union[int, Sequence[int]],
                    inline: bool = False) -> Batch:
        """READ of many blocks given as arrays (lists, array.array or numpy):
        block i goes from remote_addrs[i] to region + local_offsets[i]."""
        return self._blocks(_lib.OP_READ, region, local_offsets, remote_addrs, length, inline)

    def write_blocks(self, region: Region, local_offsets: Sequence[int],
                     remote_addrs: Sequence[int], length: Union[int, Sequence[int]],
                     inline: bool = False) -> Batch:
        """WRITE of many blocks given as arrays: region + local_offsets[i]
        goes to remote_addrs[i]."""
        return self._blocks(_lib.OP_WRITE, region, local_offsets, remote_addrs, length, inline)

    def _blocks(self, typ: int, region: Region, local_offsets: Any, remote_addrs: Any,
                length: Any, inline: bool) -> Batch:
        if not inline:
            b = self._blocks_buffers(typ, region, local_offsets, remote_addrs, length)
            if b is not None:
                return b
            b = self._blocks_sliced(typ, region, local_offsets, remote_addrs, length)
            if b is not None:
                return b
        arr, n, total = self._blocks_array(typ, region, local_offsets, remote_addrs, length)
        return self._submit(arr, n, total, _lib.BATCH_INLINE if inline else 0)

    def close(self) -> None:
        """Closes the peer (its batches must have ended)."""
        h, self._h = self._h, None
        if h is not None:
            if self._engine._h is not None:
                _lib.lib().kvf_peer_close(h)
            self._engine._peers.discard(self)

    def __enter__(self) -> "Peer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "<kvferry.Peer %s%s>" % (self.name, " closed" if self._h is None else "")


class Engine:
    """A kvferry transfer engine (kvf_engine_create); a context manager.

    Parameters left None come from configuration (``kvferry config``,
    ``KVF_<KEY>`` environment variables). ``listen`` is the "host:port" to
    serve on (default 127.0.0.1:0); ``no_listen`` makes an initiator that
    exposes no segment; ``ucx_workers`` sets the UCX workers per peer and
    on the target (1..16) where the ucx transport is built.
    """

    def __init__(self, listen: Optional[str] = None, transports: Optional[str] = None,
                 timeout_ms: Optional[int] = None, conns: Optional[int] = None,
                 chunk_bytes: Optional[int] = None, no_listen: bool = False,
                 metadata: Optional[str] = None, ucx_workers: Optional[int] = None,
                 _handle: Optional[int] = None):
        self._regions: "weakref.WeakSet[Region]" = weakref.WeakSet()
        self._peers: "weakref.WeakSet[Peer]" = weakref.WeakSet()
        self._batches: "weakref.WeakSet[Batch]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._owned = _handle is None
        self._h: Optional[int] = None
        if _handle is not None:
            self._h = _handle
            return
        p = _lib.EngineParams()
        self._keep = []
        for field, bit, val in (("listen", _lib.ENGINE_PARAM_LISTEN, listen),
                                ("transports", _lib.ENGINE_PARAM_TRANSPORTS, transports),
                                ("metadata", _lib.ENGINE_PARAM_METADATA, metadata)):
            if val is not None:
                b = _enc(val)
                self._keep.append(b)
                setattr(p, field, b)
                p.field_mask |= bit
        for field, bit, val in (("timeout_ms", _lib.ENGINE_PARAM_TIMEOUT, timeout_ms),
                                ("conns", _lib.ENGINE_PARAM_CONNS, conns),
                                ("chunk_bytes", _lib.ENGINE_PARAM_CHUNK, chunk_bytes),
                                ("ucx_workers", _lib.ENGINE_PARAM_UCX_WORKERS, ucx_workers)):
            if val is not None:
                setattr(p, field, val)
                p.field_mask |= bit
        if no_listen:
            p.no_listen = 1
            p.field_mask |= _lib.ENGINE_PARAM_NO_LISTEN
        h = c_void_p()
        check(_lib.lib().kvf_engine_create(byref(p), byref(h)), "engine create")
        self._h = h.value

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise _closed("engine")
        return h

    @property
    def closed(self) -> bool:
        return self._h is None

    @property
    def segment_name(self) -> str:
        """The local segment's name ("host:port") peers open."""
        return _lib.lib().kvf_engine_segment_name(self._handle()).decode()

    @property
    def transports(self) -> str:
        """The transports preference list as set at create."""
        return _lib.lib().kvf_engine_transports(self._handle()).decode()

    def register(self, obj: Any, mem_type: Optional[int] = None,
                 device: Optional[int] = None) -> Region:
        """Registers a buffer for local and remote access; returns its Region.

        obj: bytes-like (bytes, bytearray, memoryview, array, mmap), a
        C-contiguous numpy array, a torch CPU or CUDA tensor, or an object
        with ``__cuda_array_interface__``. bytes are registered read-only
        (a source of writes and puts only).
        """
        if isinstance(obj, Region):
            raise invalid("register", "already a Region", BufferTypeError)
        h = self._handle()
        addr, n, mt, dev, view = _buffers.resolve(obj)
        try:
            if n <= 0:
                raise invalid("register", "empty buffer", BufferTypeError)
            if mem_type is not None:
                mt = mem_type
            if device is not None:
                dev = device
            rh = c_void_p()
            check(_lib.lib().kvf_engine_reg(h, addr, n, mt, dev, byref(rh)), "register")
        except BaseException:
            if view is not None:
                view.release()
            raise
        readonly = bool(view.readonly) if view is not None else False
        r = Region(self, rh.value, addr, n, mt, dev, obj, view, readonly)
        self._regions.add(r)
        return r

    def alloc(self, nbytes: int) -> Region:
        """Allocates and registers nbytes of shareable host memory
        (kvf_mem_alloc: zeroed, what same-host peers reach without copies
        through the shm transport); freed by :meth:`Region.deregister`."""
        h = self._handle()
        if nbytes <= 0:
            raise invalid("alloc", "size must be > 0")
        ptr = c_void_p()
        check(_lib.lib().kvf_mem_alloc(nbytes, MEM_HOST, 0, byref(ptr)), "alloc")
        rh = c_void_p()
        st = _lib.lib().kvf_engine_reg(h, ptr.value, nbytes, MEM_HOST, 0, byref(rh))
        if st != OK:
            _lib.lib().kvf_mem_free(ptr.value)
            check(st, "register")
        r = Region(self, rh.value, ptr.value, nbytes, MEM_HOST, 0, None, None, False, owned_mem=True)
        self._regions.add(r)
        return r

    def open(self, segment_name: str) -> Peer:
        """Opens a peer by segment name ("host:port"); raises
        :class:`ConnectError` when it cannot be reached within the timeout."""
        if not isinstance(segment_name, str):
            raise invalid("open", "segment name must be a str", BufferTypeError)
        ph = c_void_p()
        check(_lib.lib().kvf_peer_open(self._handle(), segment_name.encode(), byref(ph)),
              "open %s" % segment_name)
        return Peer(self, ph.value, segment_name)

    def _close_children(self) -> None:
        for b in list(self._batches):
            b.close()
        for p in list(self._peers):
            p.close()
        for r in list(self._regions):
            try:
                r.deregister()
            except Exception:
                pass

    def close(self) -> None:
        """Ends the batches, closes the peers, deregisters the regions and
        destroys the engine. Further calls raise :class:`ClosedError`."""
        with self._lock:
            if self._h is None:
                return
            self._close_children()
            h, self._h = self._h, None
            if self._owned:
                _lib.lib().kvf_engine_destroy(h)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        if self._h is None:
            return "<kvferry.Engine closed>"
        return "<kvferry.Engine %s>" % self.segment_name
