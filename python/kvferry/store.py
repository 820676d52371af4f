"""The store client (kvf_store_*): put/get/exists/remove, one key or a batch.

Data moves between the caller's registered memory and the nodes without
copies: pass a :class:`Region` or ``(region, offset, length)``. Any other
buffer (bytes, bytearray, numpy array, tensor) is registered for the call
and deregistered after it, still without a copy; :meth:`Store.get_bytes`
returns a new ``bytes``. GPU memory (a CUDA tensor or a region of one) is
passed with KVF_STORE_DEVICE_MEM: the node computes its checksum.
:meth:`Store.view_get` reads objects in place instead: their addresses in
this process's mapping of a node's pool (same host, shm), under a lease.

A Store is safe to use from several threads at once; blocking calls
release the GIL.
"""

from __future__ import annotations

import threading
from array import array
from itertools import accumulate
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    addressof,
    byref,
    c_char,
    c_char_p,
    c_int,
    c_size_t,
    c_uint,
    c_uint64,
    c_void_p,
    cast,
)
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

from . import _lib
from .engine import Engine, Region, _closed
from .errors import (
    ERR_CANCELED,
    ERR_NO_KEY,
    ERR_NOT_READY,
    OK,
    BatchError,
    BufferTypeError,
    check,
    invalid,
    make_error,
)

KEY_MAX = _lib.KEY_MAX
BATCH_MAX = _lib.BATCH_MAX


class Info(NamedTuple):
    """What the master knows of one object (kvf_store_query)."""

    size: int
    checksum: int
    replicas: int
    lease_ms: int
    segments: Tuple[str, ...]


class Timing(NamedTuple):
    """Seconds of the calling thread's last get or put (or batch of
    them) by stage (kvf_store_last_timing)."""

    query: float  #: master round trip: a get's lookup, a put's allocation
    transfer: float  #: the engine's reads (get) or writes (put)
    checksum: float  #: a get's verification, a put's checksums (during its writes)
    commit: float  #: a put's commit round trip (0 for a get)


def last_timing() -> Timing:
    """Stage times of this thread's last store get or put: where a slow
    call spent its time. All zeros before any."""
    t = _lib.StoreTiming()
    _lib.lib().kvf_store_last_timing(byref(t))
    return Timing(t.query_ns / 1e9, t.read_ns / 1e9, t.verify_ns / 1e9, t.commit_ns / 1e9)


class Entry(NamedTuple):
    """One object of :meth:`Store.list`."""

    key: str
    size: int
    replicas: int
    committed: bool


def _key(key: Any) -> bytes:
    if isinstance(key, str):
        b = key.encode()
    elif isinstance(key, bytes):
        b = key
    else:
        raise invalid("key", "a key is str or bytes, got %s" % type(key).__name__, BufferTypeError)
    if b"\0" in b:
        raise invalid("key", "a key has no NUL byte")
    if not b:
        raise invalid("key", "empty key")
    return b


class _ViewC(Structure):
    """kvf_store_view_t."""

    _fields_ = [
        ("ptr", c_void_p),
        ("len", c_uint64),
        ("checksum", c_uint64),
        ("status", c_int),
        ("map_base", c_void_p),
        ("map_len", c_uint64),
    ]


_UNMAP_FN = CFUNCTYPE(None, c_void_p, c_void_p, c_uint64)
_unmap_keep: List[Any] = []  # the hook's C wrapper, kept alive
_view_lock = threading.Lock()


def _vlib() -> Any:
    """The library with the view functions declared (once)."""
    lib = _lib.lib()
    with _view_lock:
        if not getattr(lib, "_kvf_views_declared", False):
            protos = {
                "kvf_store_view_get": (c_int, [c_void_p, c_size_t, c_void_p, c_void_p,
                                               POINTER(c_void_p)]),
                "kvf_store_view_get_flags": (c_int, [c_void_p, c_size_t, c_void_p, c_uint,
                                                     c_void_p, POINTER(c_void_p)]),
                "kvf_store_view_left_ms": (c_uint, [c_void_p]),
                "kvf_store_view_release": (c_int, [c_void_p]),
                "kvf_store_view_unmap_hook": (None, [_UNMAP_FN, c_void_p]),
                "kvf_store_view_put": (c_int, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p,
                                               c_void_p, POINTER(c_void_p)]),
                "kvf_store_view_put_left_ms": (c_uint, [c_void_p]),
                "kvf_store_view_put_commit": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
                "kvf_store_view_put_abort": (None, [c_void_p]),
                "kvf_store_view_maps": (c_int, [c_void_p, _UNMAP_FN, c_void_p]),
            }
            for name, (res, args) in protos.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            lib._kvf_views_declared = True
    return lib


class View(NamedTuple):
    """One key's view (kvf_store_view_t): the object's bytes where they lie,
    in this process's mapping of a node's pool. ``status`` is 0 (OK) or a
    negative kvferry status: ``ERR_NO_KEY`` (absent), ``ERR_UNSUPPORTED``
    (no replica can be viewed: copy it with :meth:`Store.get`; length and
    checksum are set), or another error. ``addr`` is 0 unless OK (and for
    an empty object)."""

    addr: int
    length: int
    checksum: int
    status: int
    map_base: int
    map_len: int

    @property
    def ok(self) -> bool:
        return self.status == OK


class ViewLease:
    """The views of one :meth:`Store.view_get` call and the leases that keep
    them valid: a sequence of :class:`View` and a context manager that
    releases them on exit (also when an exception leaves the block).

    The views are valid until :attr:`left_ms` reaches 0 or the release,
    whichever comes first; reading after that may see another object's
    bytes, which the checksum catches. Verify what you use, release soon.
    """

    def __init__(self, store: "Store", handle: int, views: List[View]):
        self._store = store
        self._h: Optional[int] = handle
        self._views = views
        self.status: Optional[int] = None  # the release's, once released

    def __len__(self) -> int:
        return len(self._views)

    def __getitem__(self, i: Any) -> Any:
        return self._views[i]

    def __iter__(self) -> Any:
        return iter(self._views)

    @property
    def released(self) -> bool:
        return self._h is None

    @property
    def left_ms(self) -> int:
        """Milliseconds the views stay valid (0: expired or released)."""
        h = self._h
        if h is None or self._store.closed:
            return 0
        return int(_vlib().kvf_store_view_left_ms(h))

    def memoryview(self, i: int) -> memoryview:
        """A read-only memoryview of view i's bytes, usable only until the
        release (reading it afterwards may crash the process)."""
        v = self._views[i]
        if self._h is None:
            raise _closed("view lease")
        if v.status != OK:
            raise make_error(v.status, "view")
        if v.length == 0:
            return memoryview(b"")
        arr = (c_char * v.length).from_address(v.addr)
        return memoryview(arr).cast("B").toreadonly()

    def tobytes(self, i: int) -> bytes:
        """A copy of view i's bytes."""
        return self.memoryview(i).tobytes()

    def release(self) -> int:
        """Ends the leases (idempotent): returns 0 when they held until now,
        else the status saying why not (ERR_TIMEOUT: held past their time,
        ERR_CONN_RESET: a node revoked its lease). After this the views'
        addresses must not be read."""
        with _view_lock:
            h, self._h = self._h, None
        if h is None:
            return self.status if self.status is not None else OK
        if self._store.closed:  # the disconnect ended the leases already
            self.status = ERR_CANCELED
            return self.status
        self.status = int(_vlib().kvf_store_view_release(h))
        return self.status

    def __enter__(self) -> "ViewLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass

    def __repr__(self) -> str:
        ok = sum(1 for v in self._views if v.status == OK)
        return "<kvferry.ViewLease %d/%d viewed%s>" % (ok, len(self._views),
                                                        " released" if self._h is None else "")


class PutViews:
    """The write views of one :meth:`Store.view_put` call: a sequence of
    :class:`View` (checksum 0), each object's space in this process's
    mapping of a node's pool, to be written in place (``addr``, ``length``
    bytes) and then committed (:meth:`commit`) or aborted (:meth:`abort`).
    A context manager: leaving the block without a commit aborts.

    Write and commit before :meth:`left_ms` reaches 0: a commit after that
    commits nothing of an expired lease (its keys get ERR_TIMEOUT). A key
    whose view is not OK was not allocated (ERR_UNSUPPORTED: put it with
    :meth:`Store.put_batch`).
    """

    def __init__(self, store: "Store", handle: int, views: List[View]):
        self._store = store
        self._h: Optional[int] = handle
        self._views = views
        self.statuses: Optional[List[int]] = None  # the commit's, once done

    def __len__(self) -> int:
        return len(self._views)

    def __getitem__(self, i: Any) -> Any:
        return self._views[i]

    def __iter__(self) -> Any:
        return iter(self._views)

    @property
    def done(self) -> bool:
        """Committed or aborted (the handle is gone)."""
        return self._h is None

    def left_ms(self) -> int:
        """Milliseconds left to write and commit (0: expired or done)."""
        h = self._h
        if h is None or self._store.closed:
            return 0
        return int(_vlib().kvf_store_view_put_left_ms(h))

    def memoryview(self, i: int) -> memoryview:
        """A writable memoryview of view i's space, usable only until the
        commit or abort (touching it afterwards may crash the process)."""
        v = self._views[i]
        if self._h is None:
            raise _closed("put view")
        if v.status != OK:
            raise make_error(v.status, "view_put")
        if v.length == 0:
            return memoryview(bytearray())
        return memoryview((c_char * v.length).from_address(v.addr)).cast("B")

    def _take(self) -> Optional[int]:
        with _view_lock:
            h, self._h = self._h, None
        if h is not None and self._store.closed:
            return None  # the disconnect aborted it
        return h

    def commit(self, sums: Optional[Sequence[int]] = None,
               keep: Optional[Sequence[Any]] = None) -> List[int]:
        """Ends the write leases and commits every key whose view was OK and
        whose keep[i] is true (keep None: all), with checksum sums[i]
        (kvferry's checksum of the bytes written; None: computed from the
        mapping); the others are aborted. Returns each key's status: OK,
        ERR_CANCELED (not kept), the view's status (not allocated),
        ERR_TIMEOUT / ERR_CONN_RESET (its lease did not hold: aborted), or
        the master's. Once done, later calls return the same list."""
        n = len(self._views)
        if sums is not None and len(sums) != n:
            raise invalid("commit", "%d keys but %d sums" % (n, len(sums)))
        if keep is not None and len(keep) != n:
            raise invalid("commit", "%d keys but %d keep flags" % (n, len(keep)))
        if self._h is None:
            return list(self.statuses) if self.statuses is not None else [ERR_CANCELED] * n
        sarr = array("Q", sums) if sums is not None else None
        karr = array("i", [1 if k else 0 for k in keep]) if keep is not None else None
        sts = array("i", bytes(4 * n))
        h = self._take()
        if h is None:
            self.statuses = [ERR_CANCELED] * n
            return list(self.statuses)
        _vlib().kvf_store_view_put_commit(h, karr.buffer_info()[0] if karr is not None else None,
                                          sarr.buffer_info()[0] if sarr is not None else None,
                                          sts.buffer_info()[0])
        self.statuses = sts.tolist()
        return list(self.statuses)

    def abort(self) -> None:
        """Ends the write leases and aborts every key (idempotent)."""
        h = self._take()
        if h is not None:
            _vlib().kvf_store_view_put_abort(h)
            self.statuses = [ERR_CANCELED] * len(self._views)

    def __enter__(self) -> "PutViews":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.abort()

    def __del__(self) -> None:
        try:
            self.abort()
        except Exception:
            pass

    def __repr__(self) -> str:
        ok = sum(1 for v in self._views if v.status == OK)
        return "<kvferry.PutViews %d/%d writable%s>" % (ok, len(self._views),
                                                       " done" if self._h is None else "")


class _Span:
    """Memory of one call: (addr, cap, flags), with a temporary region to drop."""

    __slots__ = ("addr", "cap", "flags", "tmp")

    def __init__(self, addr: int, cap: int, flags: int, tmp: Optional[Region]):
        self.addr, self.cap, self.flags, self.tmp = addr, cap, flags, tmp

    def release(self) -> None:
        if self.tmp is not None:
            tmp, self.tmp = self.tmp, None
            tmp.deregister()


class _KeyArray:
    """A batch's keys as the C array of NUL-terminated strings the batch
    calls take (passed to ctypes as ``_as_parameter_``). A batch of ASCII
    str keys (what kvferry.kv and the integrations make) is encoded in one
    join, the pointers summed from the lengths; other keys one by one
    through _key, with its checks."""

    __slots__ = ("_as_parameter_", "_keep")

    def __init__(self, keys: Sequence[Any]):
        joined = None
        if all(type(k) is str for k in keys):
            text = "\0".join(keys)
            if text.isascii() and text.count("\0") == len(keys) - 1 and "" not in keys:
                joined = (text + "\0").encode()
        if joined is None:
            arr: Any = (c_char_p * len(keys))(*[_key(k) for k in keys])
            self._keep, self._as_parameter_ = arr, addressof(arr)
            return
        base = c_char_p(joined)
        start = cast(base, c_void_p).value or 0
        ptrs = array("Q", accumulate([len(k) + 1 for k in keys[:-1]], initial=start))
        self._keep = (joined, base, ptrs)
        self._as_parameter_ = ptrs.buffer_info()[0]


class _BatchSpans:
    """The buffers of one batch call as the C arrays of their addresses and
    capacities (addrs_p, caps_p), the flags they need and the regions
    registered for the call (dropped by release). A run of
    ``(region, offset, length)`` spans of one region, the form kvferry.kv
    and the engine integrations pass thousands at a time, is checked
    against the region once and then per span by its bounds only; any
    other buffer goes through Store._span as a single call's would."""

    __slots__ = ("addrs", "caps", "addrs_p", "caps_p", "flags", "tmps")

    def __init__(self, store: "Store", datas: Sequence[Any], writable: bool):
        n = len(datas)
        self.addrs = addrs = array("Q", bytes(8 * n))
        self.caps = caps = array("Q", bytes(8 * n))
        self.addrs_p, self.caps_p = addrs.buffer_info()[0], caps.buffer_info()[0]
        self.flags = 0
        self.tmps: List[_Span] = []
        last: Any = None
        base = size = 0
        try:
            for i, d in enumerate(datas):
                if type(d) is tuple and len(d) == 3:
                    reg, off, ln = d
                    if reg is not last and type(reg) is Region:
                        base, size = store._span((reg, 0, 0), writable).addr, reg.nbytes
                        self.flags |= _lib.STORE_DEVICE_MEM if reg.is_gpu else 0
                        last = reg
                    if (reg is last and type(off) is int and type(ln) is int and off >= 0
                            and ln >= 0 and off + ln <= size):
                        addrs[i], caps[i] = base + off, ln
                        continue
                sp = store._span(d, writable)
                if sp.tmp is not None:
                    self.tmps.append(sp)
                addrs[i], caps[i] = sp.addr, sp.cap
                self.flags |= sp.flags
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        for sp in self.tmps:
            sp.release()
        self.tmps = []


class Store:
    """A connection to a store master (kvf_store_connect); a context manager.

    Use :meth:`connect` (or the constructor with the same arguments).
    """

    def __init__(self, master: Optional[str] = None, timeout_ms: Optional[int] = None,
                 transports: Optional[str] = None, engine: Optional[Engine] = None):
        p = _lib.StoreParams()
        mb = master.encode() if master is not None else None
        tb = transports.encode() if transports is not None else None
        if mb is not None:
            p.master, p.field_mask = mb, p.field_mask | _lib.STORE_PARAM_MASTER
        if timeout_ms is not None:
            p.timeout_ms, p.field_mask = timeout_ms, p.field_mask | _lib.STORE_PARAM_TIMEOUT
        if tb is not None:
            p.transports, p.field_mask = tb, p.field_mask | _lib.STORE_PARAM_TRANSPORTS
        if engine is not None:
            p.engine, p.field_mask = engine._handle(), p.field_mask | _lib.STORE_PARAM_ENGINE
        self._lock = threading.Lock()
        self._h: Optional[int] = None
        h = c_void_p()
        check(_lib.lib().kvf_store_connect(byref(p), byref(h)), "connect %s" % (master or "master"))
        self._h = h.value
        self.master = master
        self._user_engine = engine
        self.engine = engine if engine is not None else Engine(
            _handle=_lib.lib().kvf_store_engine(self._h))

    @classmethod
    def connect(cls, master: Optional[str] = None, timeout_ms: Optional[int] = None,
                transports: Optional[str] = None, engine: Optional[Engine] = None) -> "Store":
        """Connects to the master at "host:port" (default: config key
        ``master``); raises :class:`ConnectError` within the timeout."""
        return cls(master, timeout_ms, transports, engine)

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise _closed("store")
        return h

    @property
    def closed(self) -> bool:
        return self._h is None

    @property
    def master_link(self) -> str:
        """"unix" or "tcp": how the last master connection goes."""
        return _lib.lib().kvf_store_master_link(self._handle()).decode()

    def register(self, obj: Any) -> Region:
        """Registers a buffer with the store's engine (see :meth:`Engine.register`)."""
        self._handle()
        return self.engine.register(obj)

    # -- buffers -----------------------------------------------------------

    def _span(self, buf: Any, writable: bool) -> _Span:
        self._handle()
        if isinstance(buf, Region):
            addr, n = buf.span()
            region = buf
        elif isinstance(buf, tuple):
            if len(buf) == 2:
                region, off = buf
                length = None
            elif len(buf) == 3:
                region, off, length = buf
            else:
                raise invalid("buffer", "a span is (region, offset[, length])", BufferTypeError)
            if not isinstance(region, Region):
                raise invalid("buffer", "a span starts with a Region", BufferTypeError)
            addr, n = region.span(off, length)
        else:
            region = self.engine.register(buf)
            flags = _lib.STORE_DEVICE_MEM if region.is_gpu else 0
            if writable and region.readonly:
                region.deregister()
                raise invalid("buffer", "%s is read-only" % type(buf).__name__, BufferTypeError)
            return _Span(region.addr, region.nbytes, flags, region)
        if writable and region.readonly:
            raise invalid("buffer", "region of a read-only object")
        if region._engine is not self.engine:
            raise invalid("buffer", "region of another engine than the store's")
        return _Span(addr, n, _lib.STORE_DEVICE_MEM if region.is_gpu else 0, None)

    @staticmethod
    def _opts(replicas: int, pin: bool, flags: int, replace: bool = False) -> _lib.PutOpts:
        o = _lib.PutOpts()
        o.replicas = replicas
        o.flags = flags | (_lib.STORE_PIN if pin else 0) | (_lib.STORE_REPLACE if replace else 0)
        return o

    # -- one key -----------------------------------------------------------

    def put(self, key: Any, data: Any, *, replicas: int = 0, pin: bool = False,
            replace: bool = False) -> None:
        """Stores data under key. data: a Region, (region, offset, length),
        or any buffer (registered for the call). Raises :class:`ExistsError`
        if the key is stored (unless replace: the new object then takes
        the old one's place at commit, and readers see one or the other,
        never neither), :class:`BusyError` while another put of it runs."""
        k = _key(key)
        sp = self._span(data, writable=False)
        try:
            opts = self._opts(replicas, pin, sp.flags, replace)
            check(_lib.lib().kvf_store_put(self._handle(), k, sp.addr, sp.cap, byref(opts)), "put")
        finally:
            sp.release()

    def get(self, key: Any, into: Any) -> int:
        """Reads the object into `into` (a Region, (region, offset[, cap]) or a
        writable buffer) and returns its size. Raises :class:`NoKeyError`
        when absent, :class:`NoSpaceError` when `into` is too small."""
        k = _key(key)
        sp = self._span(into, writable=True)
        try:
            n = c_size_t(0)
            check(_lib.lib().kvf_store_get(self._handle(), k, sp.addr, sp.cap, byref(n), sp.flags),
                  "get")
            return n.value
        finally:
            sp.release()

    def get_bytes(self, key: Any) -> bytes:
        """The object as new bytes (one master round trip: query, then read)."""
        k = _key(key)
        h = self._handle()
        info = _lib.StoreInfo()
        check(_lib.lib().kvf_store_query(h, k, byref(info)), "get")
        size = info.size
        if size == 0:
            return b""
        buf = bytearray(size)
        region = self.engine.register(buf)
        try:
            n = c_size_t(0)
            check(_lib.lib().kvf_store_read(h, k, byref(info), region.addr, size, byref(n), 0), "get")
        finally:
            region.deregister()
        return bytes(memoryview(buf)[: n.value])

    def exists(self, key: Any) -> bool:
        """True if the key is stored and committed."""
        st = _lib.lib().kvf_store_exists(self._handle(), _key(key))
        if st == OK:
            return True
        if st == ERR_NO_KEY:
            return False
        raise make_error(st, "exists")

    def remove(self, key: Any) -> None:
        """Removes the object; raises :class:`NoKeyError` when absent."""
        check(_lib.lib().kvf_store_remove(self._handle(), _key(key)), "remove")

    def query(self, key: Any) -> Info:
        """Size, checksum and replicas of a committed object."""
        info = _lib.StoreInfo()
        check(_lib.lib().kvf_store_query(self._handle(), _key(key), byref(info)), "query")
        segs = tuple(info.segment[i].value.decode() for i in range(min(info.replicas, _lib.REPLICA_MAX)))
        return Info(info.size, info.checksum, info.replicas, info.lease_ms, segs)

    def list(self, prefix: Optional[str] = None, max: int = 0) -> List[Entry]:
        """Objects whose key starts with prefix (None: all), at most max (0: any)."""
        out: List[Entry] = []

        def fn(e: Any, _arg: Any) -> None:
            c = e.contents
            out.append(Entry(c.key.decode(errors="replace"), c.size, c.replicas, bool(c.committed)))

        cb = _lib.LIST_FN(fn)
        pb = prefix.encode() if prefix is not None else None
        check(_lib.lib().kvf_store_list(self._handle(), pb, max, cb, None), "list")
        return out

    # -- batches -----------------------------------------------------------

    @staticmethod
    def _keys(keys: Sequence[Any]) -> Tuple[Any, int]:
        n = len(keys)
        if n == 0 or n > BATCH_MAX:
            raise invalid("batch", "1 to %d keys, got %d" % (BATCH_MAX, n))
        return _KeyArray(keys), n

    def _finish(self, st: int, what: str, statuses: Any, check_all: bool) -> List[int]:
        out = statuses.tolist() if isinstance(statuses, array) else list(statuses)
        if st != OK and check_all:
            raise BatchError(st, what, out)
        return out

    def put_batch(self, keys: Sequence[Any], datas: Sequence[Any], *, replicas: int = 0,
                  pin: bool = False, check: bool = True, replace: bool = False) -> List[int]:
        """Puts many keys at once (one master round trip per phase). Returns
        each key's status; raises :class:`BatchError` when one failed and
        check is True. replace: as for :meth:`put`."""
        karr, n = self._keys(keys)
        if len(datas) != n:
            raise invalid("put_batch", "%d keys but %d buffers" % (n, len(datas)))
        bs = _BatchSpans(self, datas, writable=False)
        try:
            sts = array("i", bytes(4 * n))
            opts = self._opts(replicas, pin, bs.flags, replace)
            st = _lib.lib().kvf_store_put_batch(self._handle(), n, karr, bs.addrs_p, bs.caps_p,
                                                byref(opts), sts.buffer_info()[0])
            return self._finish(st, "put_batch", sts, check)
        finally:
            bs.release()

    def _get_into(self, what: str, keys: Sequence[Any], intos: Sequence[Any],
                  check: bool, with_sums: bool) -> Tuple[List[int], List[int]]:
        """One batch get into buffers: (sizes or -status, recorded checksums
        or zeros); with_sums asks for the checksums instead of hashing."""
        karr, n = self._keys(keys)
        if len(intos) != n:
            raise invalid(what, "%d keys but %d buffers" % (n, len(intos)))
        bs = _BatchSpans(self, intos, writable=True)
        try:
            lens = array("Q", bytes(8 * n))
            sums = array("Q", bytes(8 * n))
            sts = array("i", bytes(4 * n))
            lib = _lib.lib()
            lens_p, sts_p = lens.buffer_info()[0], sts.buffer_info()[0]
            if with_sums:
                st = lib.kvf_store_get_batch_sums(self._handle(), n, karr, bs.addrs_p, bs.caps_p,
                                                  lens_p, bs.flags, sums.buffer_info()[0], sts_p)
            else:
                st = lib.kvf_store_get_batch(self._handle(), n, karr, bs.addrs_p, bs.caps_p,
                                             lens_p, bs.flags, sts_p)
            if st == OK:
                return lens.tolist(), (sums.tolist() if with_sums else [0] * n)
            statuses = self._finish(st, what, sts, check)
            return ([ln if s == OK else s for ln, s in zip(lens, statuses)],
                    [c if s == OK else 0 for c, s in zip(sums, statuses)])
        finally:
            bs.release()

    def get_batch(self, keys: Sequence[Any], intos: Sequence[Any], *,
                  check: bool = True) -> List[int]:
        """Gets many keys at once into buffers (as :meth:`get` takes them).
        Returns each object's size (-status for a key that failed when
        check is False); raises :class:`BatchError` when one failed and
        check is True."""
        return self._get_into("get_batch", keys, intos, check, False)[0]

    def get_batch_sums(self, keys: Sequence[Any], intos: Sequence[Any]) -> Tuple[List[int], List[int]]:
        """Like :meth:`get_batch` (check False) but the client does not hash
        the bytes: returns (sizes or -status, checksums the store recorded
        at put). The caller MUST verify every object against its checksum
        before using it (kvferry.kv does it on the GPU while scattering the
        bytes into the cache) and treat a mismatch as a miss."""
        return self._get_into("get_batch_sums", keys, intos, False, True)

    def exists_batch(self, keys: Sequence[Any]) -> List[bool]:
        """Whether each key is stored and committed (a key whose put is in
        progress is not yet: False)."""
        return self._presence("exists_batch", keys)

    def hold_batch(self, keys: Sequence[Any]) -> List[bool]:
        """:meth:`exists_batch` for keys about to be read: each one found
        is also held under a read lease (not evicted, its space not
        reused, for the master's ``lease_ms``) and counts as just used
        (kvf_store_hold_batch). One master round trip."""
        return self._presence("hold_batch", keys, None)

    def _presence(self, op: str, keys: Sequence[Any], *extra: Any) -> List[bool]:
        """kvf_store_<op>(store, n, keys, statuses, *extra): per key,
        stored and committed; a status other than found / not found /
        not ready raises BatchError."""
        karr, n = self._keys(keys)
        sts = (c_int * n)()
        if n:
            getattr(_lib.lib(), "kvf_store_" + op)(self._handle(), n, karr, sts, *extra)
        out = []
        for s in sts:
            if s not in (OK, ERR_NO_KEY, ERR_NOT_READY):
                raise BatchError(s, op, list(sts))
            out.append(s == OK)
        return out

    def remove_batch(self, keys: Sequence[Any], *, check: bool = True) -> List[int]:
        """Removes many keys; returns each key's status (raises
        :class:`BatchError` when one failed and check is True)."""
        karr, n = self._keys(keys)
        sts = (c_int * n)()
        st = _lib.lib().kvf_store_remove_batch(self._handle(), n, karr, sts)
        return self._finish(st, "remove_batch", sts, check)

    # -- views -------------------------------------------------------------

    def view_get(self, keys: Sequence[Any], shared: bool = False) -> ViewLease:
        """Views of many keys (kvf_store_view_get): one master round trip,
        then each object's bytes where they lie on a node of this host
        reached over shm, read in place without a copy. Returns a
        :class:`ViewLease` (a sequence of :class:`View`, one per key; use it
        in a ``with`` block, which releases it). A key that cannot be viewed
        gets its status in its View (copy it with :meth:`get`). Raises
        :class:`InvalidParamError` for 0 or more than BATCH_MAX keys, the
        master's error when the look-up fails.

        shared: the views may lie under one lease per node shared with
        other shared views of this store (KVF_STORE_VIEW_SHARED), kept open
        and renewed before it ends: a call then costs the master's look-up
        alone, no node round trip (for callers taking many small batches).
        Their lifetime is the same (:meth:`ViewLease.left_ms`)."""
        karr, n = self._keys(keys)
        views = (_ViewC * n)()
        h = c_void_p()
        lib = _vlib()
        flags = _lib.STORE_VIEW_SHARED if shared else 0
        check(lib.kvf_store_view_get_flags(self._handle(), n, karr, flags, views, byref(h)),
              "view_get")
        try:
            out = [View(v.ptr or 0, v.len, v.checksum, v.status, v.map_base or 0, v.map_len)
                   for v in views]
            return ViewLease(self, h.value, out)
        except BaseException:
            lib.kvf_store_view_release(h)
            raise

    def view_put(self, keys: Sequence[Any], lens: Sequence[int], replicas: int = 0, *,
                 pin: bool = False, replace: bool = False) -> PutViews:
        """Write views of many new objects (kvf_store_view_put): one master
        round trip allocates them, then each node of this host reached over
        shm grants their space in its pool, to be written in place (a GPU
        kernel, threads) and committed with :meth:`PutViews.commit`. Returns
        a :class:`PutViews` (a sequence of :class:`View`, one per key; use
        it in a ``with`` block, which aborts what was not committed). A key
        that cannot be written in place gets its status in its View and is
        not allocated: ERR_UNSUPPORTED (node over tcp, several replicas:
        put it with :meth:`put_batch`), ERR_EXISTS, ERR_BUSY, ERR_NO_SPACE...
        replicas: 0 (the master's default, which must then be 1) or 1.
        Raises :class:`InvalidParamError` for 0 or more than BATCH_MAX keys,
        the master's error when the allocation fails."""
        karr, n = self._keys(keys)
        if len(lens) != n:
            raise invalid("view_put", "%d keys but %d lengths" % (n, len(lens)))
        larr = array("Q", [int(x) for x in lens])
        views = (_ViewC * n)()
        h = c_void_p()
        lib = _vlib()
        opts = self._opts(replicas, pin, 0, replace)
        check(lib.kvf_store_view_put(self._handle(), n, karr, larr.buffer_info()[0], byref(opts),
                                     views, byref(h)), "view_put")
        try:
            out = [View(v.ptr or 0, v.len, v.checksum, v.status, v.map_base or 0, v.map_len)
                   for v in views]
            return PutViews(self, h.value, out)
        except BaseException:
            lib.kvf_store_view_put_abort(h)
            raise

    def view_maps(self) -> List[Tuple[int, int]]:
        """Maps now every pool of every node this store reaches over shm
        (kvf_store_view_maps) and returns each mapping as (base, length):
        views and put views into those pools lie in them later, so a
        caller can register them with a GPU ahead of time. The unmap hook
        (:meth:`view_unmap_hook`) tells when one goes."""
        out: List[Tuple[int, int]] = []

        def call(_arg: Any, base: Any, length: int) -> None:
            out.append((base or 0, int(length)))

        cb = _UNMAP_FN(call)
        check(_vlib().kvf_store_view_maps(self._handle(), cb, None), "view_maps")
        return out

    @staticmethod
    def view_unmap_hook(fn: Optional[Callable[[int, int], None]]) -> None:
        """Sets the process's hook told (base, length) just before a mapping
        views lay in is unmapped (e.g. to cudaHostUnregister it); None
        removes it. It runs on a kvferry thread under a lock: it must be
        quick and call no kvferry function."""
        lib = _vlib()
        if fn is None:
            lib.kvf_store_view_unmap_hook(_UNMAP_FN(), None)
            return
        if len(_unmap_keep) > 16:  # replaced long ago: no call runs them
            del _unmap_keep[:-16]

        def call(_arg: Any, base: Any, length: int) -> None:
            try:
                fn(base or 0, length)
            except Exception:  # never unwind into C
                pass

        cb = _UNMAP_FN(call)
        _unmap_keep.append(cb)  # alive while C may call it
        lib.kvf_store_view_unmap_hook(cb, None)

    # -- life --------------------------------------------------------------

    def close(self) -> None:
        """Deregisters the regions of the store's own engine and disconnects.
        No call may be in progress on the store."""
        with self._lock:
            if self._h is None:
                return
            if self._user_engine is None:
                self.engine.close()
            h, self._h = self._h, None
            _lib.lib().kvf_store_disconnect(h)

    disconnect = close

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return "<kvferry.Store master=%s%s>" % (self.master, " closed" if self._h is None else "")

