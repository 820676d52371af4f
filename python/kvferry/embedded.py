"""A kvferry store inside this process: a master and one node with a
memory pool, started through the library's server calls
(``kvf_server_master_start`` / ``kvf_server_node_start``), for an engine
that wants a store of its own without daemons (the vLLM connector's
``"master": "embedded"``). Clients of the process reach it like any
store (its node over shm); other processes of the host can too, at
:attr:`EmbeddedStore.address`.

    with EmbeddedStore(pool=8 << 30) as es:
        st = kvferry.Store.connect(es.address)

:func:`shared` keeps one per pool size for the whole process, so that
the scheduler and worker sides of one engine share it.
"""

from __future__ import annotations

import threading
from ctypes import POINTER, Structure, byref, c_char_p, c_double, c_int, c_uint, c_uint64, c_void_p
from typing import Dict

from . import _lib
from .errors import check


class _MasterParams(Structure):
    """kvf_server_master_params_t."""

    _fields_ = [("listen", c_char_p), ("http", c_char_p), ("lease_ms", c_uint64),
                ("put_timeout_ms", c_uint64), ("node_ttl_ms", c_uint64),
                ("heartbeat_ms", c_uint64), ("high_watermark", c_double),
                ("low_watermark", c_double), ("replicas", c_uint), ("loops", c_uint)]


class _NodeParams(Structure):
    """kvf_server_node_params_t."""

    _fields_ = [("master", c_char_p), ("listen", c_char_p), ("pool", c_uint64),
                ("claim", c_uint64), ("transports", c_char_p), ("anon", c_int),
                ("lazy", c_int), ("timeout_ms", c_uint), ("disk", c_char_p),
                ("disk_size", c_uint64)]


_PROTOS = {
    "kvf_server_master_defaults": (c_int, [POINTER(_MasterParams)]),
    "kvf_server_master_start": (c_int, [POINTER(_MasterParams), POINTER(c_void_p)]),
    "kvf_server_master_stop": (None, [c_void_p]),
    "kvf_server_master_address": (c_char_p, [c_void_p]),
    "kvf_server_node_defaults": (c_int, [POINTER(_NodeParams)]),
    "kvf_server_node_start": (c_int, [POINTER(_NodeParams), POINTER(c_void_p)]),
    "kvf_server_node_stop": (None, [c_void_p]),
}


def _dll():
    dll = _lib.lib()
    for name, (res, args) in _PROTOS.items():
        fn = getattr(dll, name)
        fn.restype, fn.argtypes = res, args
    return dll


class EmbeddedStore:
    """A master on 127.0.0.1 (any port, no HTTP endpoint) and a node of
    ``pool`` bytes, in this process, until :meth:`close`."""

    def __init__(self, pool: int):
        dll = _dll()
        self._master = c_void_p()
        self._node = c_void_p()
        mp = _MasterParams()
        check(dll.kvf_server_master_defaults(byref(mp)), "embedded master")
        mp.listen, mp.http = b"127.0.0.1:0", None
        check(dll.kvf_server_master_start(byref(mp), byref(self._master)), "embedded master")
        self.address = dll.kvf_server_master_address(self._master).decode()
        try:
            np_ = _NodeParams()
            check(dll.kvf_server_node_defaults(byref(np_)), "embedded node")
            addr = self.address.encode()
            np_.master, np_.pool = addr, int(pool)
            check(dll.kvf_server_node_start(byref(np_), byref(self._node)), "embedded node")
        except BaseException:
            dll.kvf_server_master_stop(self._master)
            raise

    def close(self) -> None:
        dll = _dll()
        if self._node:
            dll.kvf_server_node_stop(self._node)
            self._node = c_void_p()
        if self._master:
            dll.kvf_server_master_stop(self._master)
            self._master = c_void_p()

    def __enter__(self) -> "EmbeddedStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_shared: Dict[int, EmbeddedStore] = {}
_shared_lock = threading.Lock()


def shared(pool: int) -> EmbeddedStore:
    """The process's embedded store of pool bytes (started on first use,
    stopped when the process exits)."""
    with _shared_lock:
        es = _shared.get(pool)
        if es is None:
            es = _shared[pool] = EmbeddedStore(pool)
        return es


def parse_size(text: str) -> int:
    """Bytes of "20G", "512M", "4096"."""
    t = str(text).strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


__all__ = ["EmbeddedStore", "shared", "parse_size"]
