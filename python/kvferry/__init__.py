"""kvferry: KV-cache transfer engine and store, from Python.

A thin ctypes layer over libkvferry's C ABI (bundled in the package):

- :class:`Engine` registers memory and opens :class:`Peer` s; a peer's
  ``read``/``write`` submit batches of ``(local, remote_addr, length)``
  and return a :class:`Batch` future.
- :class:`Store` is the store client: put/get/exists/remove, one key or
  a batch, zero-copy into and out of registered buffers.
- :mod:`kvferry.procs` starts ``master``/``node``/``target`` daemons.

Errors are :class:`KvferryError` subclasses carrying the kvf_status_t.
Blocking calls release the GIL.
"""

from __future__ import annotations

from ctypes import byref, c_long
from typing import Tuple

from . import _lib, config
from .engine import MEM_CUDA, MEM_HOST, MEM_PINNED, Batch, Engine, Peer, Region
from .errors import (
    BatchError,
    BufferTypeError,
    BusyError,
    CanceledError,
    ClosedError,
    ConnectError,
    ExistsError,
    IntegrityError,
    InvalidParamError,
    KeyTooLargeError,
    KvferryError,
    NoKeyError,
    NoSpaceError,
    NotRegisteredError,
    TimeoutError_,
    status_name,
    status_str,
)
from .store import KEY_MAX, BATCH_MAX, Entry, Info, Store

__version__ = "0.1.0"


def version() -> str:
    """The library's version (kvf_version)."""
    return _lib.lib().kvf_version().decode()


def alloc_stats() -> Tuple[int, int]:
    """(blocks, bytes) of the library's live tracked allocations."""
    b, n = c_long(), c_long()
    _lib.lib().kvf_alloc_stats(byref(b), byref(n))
    return b.value, n.value


def checksum(data) -> int:
    """kvf_checksum of a host buffer (the checksum the store keeps)."""
    from ._buffers import HostView

    v = HostView(data, False)
    try:
        return _lib.lib().kvf_checksum(v.addr, v.nbytes)
    finally:
        v.release()


def config_get(name: str):
    """Effective value of a configuration key (or of a listed variable),
    or None if there is no such name: kvferry.config.get."""
    return config.get(name)


library_path = _lib.library_path
binary_path = _lib.binary_path

__all__ = [
    "Engine", "Peer", "Region", "Batch", "Store", "Info", "Entry",
    "MEM_HOST", "MEM_PINNED", "MEM_CUDA", "KEY_MAX", "BATCH_MAX",
    "KvferryError", "InvalidParamError", "BufferTypeError", "ClosedError",
    "TimeoutError_", "CanceledError", "NoKeyError", "ExistsError", "BusyError",
    "NoSpaceError", "KeyTooLargeError", "ConnectError", "NotRegisteredError",
    "IntegrityError", "BatchError", "status_name", "status_str",
    "version", "alloc_stats", "checksum", "config_get", "library_path", "binary_path",
]
