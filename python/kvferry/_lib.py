"""Loads libkvferry.so and declares the C ABI for ctypes.

The library is looked for inside the package first (the wheel bundles it
next to this file), then at the path in the ``KVFERRY_LIB`` environment
variable. ctypes' CDLL releases the GIL around every foreign call, so a
blocking C call (a wait, a store round trip) lets other Python threads
run.

``libkvferry_pyops.so`` (python/ext/pyops.c), found the same way (or
next to ``$KVFERRY_LIB``), converts lists of operations in one call; it
is loaded with ctypes.PyDLL, which keeps the GIL. Without it (a source
tree without the build, a free-threaded CPython, ``KVFERRY_PYOPS=0``)
the package converts them in Python, with the same results.
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_int,
    c_long,
    c_size_t,
    c_uint,
    c_uint64,
    c_void_p,
)
from typing import Any, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))

KEY_MAX = 1024
REPLICA_MAX = 8
BATCH_MAX = 4096
SEG_MAX = 272

MEM_HOST = 0
MEM_PINNED = 1
MEM_CUDA = 2

OP_READ = 0
OP_WRITE = 1

BATCH_INLINE = 0x1
STORE_PIN = 1 << 0
STORE_DEVICE_MEM = 1 << 1
STORE_REPLACE = 1 << 2  # a put takes the place of the stored object
STORE_VIEW_SHARED = 1  # kvf_store_view_get_flags: views share one lease per node

ENGINE_PARAM_LISTEN = 1 << 0
ENGINE_PARAM_CONNS = 1 << 1
ENGINE_PARAM_TIMEOUT = 1 << 2
ENGINE_PARAM_TRANSPORTS = 1 << 3
ENGINE_PARAM_METADATA = 1 << 4
ENGINE_PARAM_CHUNK = 1 << 5
ENGINE_PARAM_NO_LISTEN = 1 << 6
ENGINE_PARAM_UCX_WORKERS = 1 << 7

STORE_PARAM_MASTER = 1 << 0
STORE_PARAM_ENGINE = 1 << 1
STORE_PARAM_TIMEOUT = 1 << 2
STORE_PARAM_TRANSPORTS = 1 << 3

status_t = c_int


class EngineParams(Structure):
    _fields_ = [
        ("field_mask", c_uint64),
        ("listen", c_char_p),
        ("conns", c_uint),
        ("timeout_ms", c_uint),
        ("transports", c_char_p),
        ("metadata", c_char_p),
        ("chunk_bytes", c_size_t),
        ("no_listen", c_int),
        ("ucx_workers", c_uint),
    ]


class Op(Structure):
    """kvf_op_t: 40 bytes, five 8-byte words (type padded to 8)."""

    _fields_ = [
        ("type", c_int),
        ("local", c_void_p),
        ("peer", c_void_p),
        ("remote", c_uint64),
        ("length", c_size_t),
    ]


class StoreParams(Structure):
    _fields_ = [
        ("field_mask", c_uint64),
        ("master", c_char_p),
        ("engine", c_void_p),
        ("timeout_ms", c_uint),
        ("transports", c_char_p),
    ]


class PutOpts(Structure):
    _fields_ = [("replicas", c_uint), ("flags", c_uint)]


class StoreInfo(Structure):
    _fields_ = [
        ("size", c_uint64),
        ("checksum", c_uint64),
        ("replicas", c_uint),
        ("lease_ms", c_uint),
        ("segment", (c_char * SEG_MAX) * REPLICA_MAX),
        ("addr", c_uint64 * REPLICA_MAX),
    ]


class StoreEntry(Structure):
    _fields_ = [
        ("key", c_char_p),
        ("size", c_uint64),
        ("replicas", c_uint),
        ("committed", c_int),
    ]


LIST_FN = ctypes.CFUNCTYPE(None, POINTER(StoreEntry), c_void_p)


class ConfigKey(Structure):
    """kvf_config_key_t: one key as kvf_config_keys reports it."""
    _fields_ = [
        ("component", c_char_p),
        ("name", c_char_p),
        ("value", c_char_p),
        ("defval", c_char_p),
        ("help", c_char_p),
        ("group", c_int),
    ]


CONFIG_KEY_FN = ctypes.CFUNCTYPE(None, POINTER(ConfigKey), c_void_p)


class StoreTiming(Structure):
    """kvf_store_timing_t (kvferry/perf.h)."""

    _fields_ = [
        ("query_ns", c_uint64),
        ("read_ns", c_uint64),
        ("verify_ns", c_uint64),
        ("commit_ns", c_uint64),
    ]

# name: (restype, argtypes)
_PROTOS = {
    "kvf_version": (c_char_p, []),
    "kvf_alloc_stats": (None, [POINTER(c_long), POINTER(c_long)]),
    "kvf_status_str": (c_char_p, [status_t]),
    "kvf_status_name": (c_char_p, [status_t]),
    "kvf_checksum": (c_uint64, [c_void_p, c_size_t]),
    "kvf_config_get": (c_char_p, [c_char_p]),
    "kvf_config_var": (c_char_p, [c_char_p]),
    "kvf_config_keys": (None, [CONFIG_KEY_FN, c_void_p]),
    "kvf_engine_create": (status_t, [POINTER(EngineParams), POINTER(c_void_p)]),
    "kvf_engine_destroy": (None, [c_void_p]),
    "kvf_engine_segment_name": (c_char_p, [c_void_p]),
    "kvf_engine_transports": (c_char_p, [c_void_p]),
    "kvf_mem_alloc": (status_t, [c_size_t, c_int, c_int, POINTER(c_void_p)]),
    "kvf_mem_free": (None, [c_void_p]),
    "kvf_engine_reg": (
        status_t,
        [c_void_p, c_void_p, c_size_t, c_int, c_int, POINTER(c_void_p)],
    ),
    "kvf_engine_dereg": (status_t, [c_void_p, c_void_p]),
    "kvf_peer_open": (status_t, [c_void_p, c_char_p, POINTER(c_void_p)]),
    "kvf_peer_close": (None, [c_void_p]),
    "kvf_peer_region": (
        status_t,
        [c_void_p, c_size_t, POINTER(c_uint64), POINTER(c_size_t), POINTER(c_int)],
    ),
    "kvf_peer_transport": (c_char_p, [c_void_p]),
    "kvf_batch_submit": (status_t, [c_void_p, c_void_p, c_size_t, POINTER(c_void_p)]),
    "kvf_batch_submit_ex": (
        status_t,
        [c_void_p, c_void_p, c_size_t, c_uint, POINTER(c_void_p)],
    ),
    "kvf_batch_test": (status_t, [c_void_p]),
    "kvf_batch_wait": (status_t, [c_void_p, c_int]),
    "kvf_batch_cancel": (None, [c_void_p]),
    "kvf_batch_op_status": (status_t, [c_void_p, c_size_t, POINTER(c_size_t)]),
    "kvf_batch_destroy": (None, [c_void_p]),
    "kvf_transfer_sync": (status_t, [c_void_p, c_void_p, c_size_t, c_int]),
    "kvf_store_connect": (status_t, [POINTER(StoreParams), POINTER(c_void_p)]),
    "kvf_store_disconnect": (None, [c_void_p]),
    "kvf_store_engine": (c_void_p, [c_void_p]),
    "kvf_store_master_link": (c_char_p, [c_void_p]),
    "kvf_store_put": (
        status_t,
        [c_void_p, c_char_p, c_void_p, c_size_t, POINTER(PutOpts)],
    ),
    "kvf_store_get": (
        status_t,
        [c_void_p, c_char_p, c_void_p, c_size_t, POINTER(c_size_t), c_uint],
    ),
    "kvf_store_remove": (status_t, [c_void_p, c_char_p]),
    "kvf_store_exists": (status_t, [c_void_p, c_char_p]),
    "kvf_store_query": (status_t, [c_void_p, c_char_p, POINTER(StoreInfo)]),
    "kvf_store_read": (
        status_t,
        [
            c_void_p,
            c_char_p,
            POINTER(StoreInfo),
            c_void_p,
            c_size_t,
            POINTER(c_size_t),
            c_uint,
        ],
    ),
    "kvf_store_put_batch": (
        status_t,
        [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, POINTER(PutOpts), c_void_p],
    ),
    "kvf_store_get_batch": (
        status_t,
        [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_uint, c_void_p],
    ),
    "kvf_store_get_batch_sums": (
        status_t,
        [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_void_p, c_uint, c_void_p,
         c_void_p],
    ),
    "kvf_store_remove_batch": (status_t, [c_void_p, c_size_t, c_void_p, c_void_p]),
    "kvf_store_exists_batch": (status_t, [c_void_p, c_size_t, c_void_p, c_void_p]),
    "kvf_store_hold_batch": (status_t, [c_void_p, c_size_t, c_void_p, c_void_p,
                                        POINTER(c_uint)]),
    "kvf_store_list": (status_t, [c_void_p, c_char_p, c_size_t, LIST_FN, c_void_p]),
    "kvf_store_last_timing": (None, [POINTER(StoreTiming)]),
}


def library_path() -> str:
    """Path of the libkvferry.so this package uses (bundled, else $KVFERRY_LIB)."""
    bundled = os.path.join(_HERE, "libkvferry.so")
    if os.path.exists(bundled):
        return bundled
    env = os.environ.get("KVFERRY_LIB")
    if env:
        return env
    raise OSError(
        "kvferry: libkvferry.so is not bundled in %s and KVFERRY_LIB is not set" % _HERE
    )


def binary_path() -> str:
    """Path of the ``kvferry`` command (bundled, else $KVFERRY_BIN, else PATH)."""
    bundled = os.path.join(_HERE, "bin", "kvferry")
    if os.path.exists(bundled):
        return bundled
    env = os.environ.get("KVFERRY_BIN")
    if env:
        return env
    import shutil

    found = shutil.which("kvferry")
    if found and not _is_console_script(found):
        return found
    raise FileNotFoundError(
        "kvferry: the kvferry command is not bundled in %s; set KVFERRY_BIN" % _HERE
    )


def _is_console_script(path: str) -> bool:
    """True for pip's `kvferry` console script (a Python file, not the binary)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def pyops_path() -> Optional[str]:
    """Path of libkvferry_pyops.so (bundled, else next to $KVFERRY_LIB), or None."""
    dirs = [_HERE]
    env = os.environ.get("KVFERRY_LIB")
    if env:
        dirs.append(os.path.dirname(os.path.abspath(env)))
    for d in dirs:
        path = os.path.join(d, "libkvferry_pyops.so")
        if os.path.exists(path):
            return path
    return None


_lib: Optional[ctypes.CDLL] = None
_pyops: Any = None  # the converter, False once found absent
_pyops_submit: Any = None  # its converting submit, False once found absent
# what the helper reads without API calls: 1 tuples and lists, 2 ints, 3 both
pyops_direct = 0


def lib() -> ctypes.CDLL:
    """The loaded library with every prototype declared (loaded once)."""
    global _lib
    if _lib is None:
        dll = ctypes.CDLL(library_path())
        for name, (res, args) in _PROTOS.items():
            fn = getattr(dll, name)
            fn.restype = res
            fn.argtypes = args
        _lib = dll
    return _lib


def pyops() -> Any:
    """kvf_pyops_pack of libkvferry_pyops.so, or None when absent or off.

    kvf_pyops_pack(ops, Region, type, peer, out, cap, byref(total))
    fills out with the kvf_op_t words of the list ops and returns their
    count, or -1 when the Python path must convert them (see pyops.c).
    Off where its stable-ABI build cannot run: a free-threaded CPython.
    """
    global _pyops, _pyops_submit
    if _pyops is None:
        _pyops = False
        path = pyops_path()
        from . import config

        off = config.get("KVFERRY_PYOPS", "1") == "0"
        if path is not None and not off and not sysconfig.get_config_var("Py_GIL_DISABLED"):
            try:  # an interpreter without CPython's ABI (PyPy) cannot load it
                dll = ctypes.PyDLL(path)
                fn = dll.kvf_pyops_pack
            except (OSError, AttributeError):
                return None
            try:  # a helper older than the package converts, and does not submit
                submit = _load_submit(dll)
            except (OSError, AttributeError):
                submit = None
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [ctypes.py_object, ctypes.py_object, c_uint, c_uint64,
                           c_void_p, ctypes.c_ssize_t, POINTER(c_uint64)]
            _pyops, _pyops_submit = fn, submit
    return _pyops or None


def pyops_submit() -> Any:
    """kvf_pyops_submit_call of libkvferry_pyops.so, or None where pyops() is.

    kvf_pyops_submit_call(ops, type, PyopsCall address) converts ops as
    kvf_pyops_pack does and submits them in slices while it converts
    (see pyops.c): the number of operations (res[0] their total length,
    res[1] the batches in batches), 0 when a submit failed (res[2] its
    status), -2 when the Python path must convert ops instead, -3 when
    the op array has no room for them; nothing is left submitted then.
    """
    return _pyops_submit if pyops() is not None else None  # None when that helper lacks it


_pyops_blocks: Any = None  # (kvf_pyops_blocks, kvf_pyops_blocks_submit); False once absent


def _blocks_helpers() -> Any:
    global _pyops_blocks
    if pyops() is None:
        return None
    if _pyops_blocks is None:
        _pyops_blocks = False
        try:
            dll = ctypes.PyDLL(pyops_path())
            pack, submit = dll.kvf_pyops_blocks, dll.kvf_pyops_blocks_submit
        except (OSError, AttributeError, TypeError):
            return None  # a helper older than the package
        arrays = [c_void_p, c_void_p, c_void_p, c_uint64, ctypes.c_ssize_t, c_uint64, c_uint64,
                  c_uint, c_uint64]
        pack.restype = submit.restype = ctypes.c_ssize_t
        pack.argtypes = arrays + [c_void_p, ctypes.c_ssize_t, POINTER(c_uint64)]
        submit.argtypes = arrays + [c_void_p, ctypes.c_ssize_t, c_void_p, ctypes.c_ssize_t,
                                    c_void_p, ctypes.c_ssize_t, c_void_p]
        _pyops_blocks = (pack, submit)
    return _pyops_blocks or None


def pyops_blocks() -> Any:
    """kvf_pyops_blocks of libkvferry_pyops.so, or None where pyops() is
    (or that helper lacks it).

    kvf_pyops_blocks(offs, addrs, lens, len, n, base, nbytes, type, peer,
    out, cap, byref(total)) fills out with the kvf_op_t words of n blocks
    given as uint64 arrays (lens NULL: len for every block): n, -1 when a
    block lies outside the region of nbytes at base, -2 when n does not
    fit out.
    """
    h = _blocks_helpers()
    return h[0] if h else None


def pyops_blocks_submit() -> Any:
    """kvf_pyops_blocks_submit of libkvferry_pyops.so, or None as above.

    kvf_pyops_blocks_submit(offs, addrs, lens, len, n, base, nbytes, type,
    peer, engine, first, out, cap, batches, maxb, res) checks every block,
    then builds and submits them in slices as kvf_pyops_submit_call does: n
    (res[0] the total length, res[1] the batches), 0 when a submit failed
    (res[2] its status), -1 for a block outside the region, -2 when it
    cannot (nothing submitted for either).
    """
    h = _blocks_helpers()
    return h[1] if h else None


class PyopsCall(Structure):
    """struct pyops_call of python/ext/pyops_int.h: what a peer's thread
    passes to every kvf_pyops_submit_call and kvf_pyops_blocks_buffers
    call."""

    _fields_ = [
        ("region_cls", ctypes.py_object),
        ("engine", c_void_p),
        ("peer", c_uint64),
        ("first", ctypes.c_ssize_t),
        ("out", c_void_p),
        ("cap", ctypes.c_ssize_t),
        ("batches", c_void_p),
        ("maxb", ctypes.c_ssize_t),
        ("res", c_void_p),
    ]


_pyops_buffers: Any = None  # kvf_pyops_blocks_buffers; False once absent


def pyops_blocks_buffers() -> Any:
    """kvf_pyops_blocks_buffers of libkvferry_pyops.so, or None where
    pyops_blocks_submit() is, before CPython 3.11 (its limited API has no
    buffer protocol), or where the helper was built without it.

    kvf_pyops_blocks_buffers(offs, addrs, length, region, type,
    PyopsCall address) takes two contiguous uint64 arrays (numpy uint64,
    array('Q')), an int length and a Region, and checks, builds and
    submits the blocks as kvf_pyops_blocks_submit does: n, 0 when a
    submit failed (res[2] its status), -1 for a block outside the region,
    -2 when it declines (another form), -3 when the op array has no room
    for them (nothing submitted for -1, -2, -3, and no exception set).
    """
    global _pyops_buffers
    if _pyops_buffers is None:
        _pyops_buffers = False
        if sys.version_info >= (3, 11) and pyops_blocks_submit() is not None:
            try:
                fn = ctypes.PyDLL(pyops_path()).kvf_pyops_blocks_buffers
            except (OSError, AttributeError, TypeError):
                return None  # built against older headers, or an older helper
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [ctypes.py_object] * 4 + [c_uint, c_void_p]
            _pyops_buffers = fn
    return _pyops_buffers or None


def _load_submit(dll: ctypes.PyDLL) -> Any:
    """kvf_pyops_submit_call of dll, given the library's batch calls."""
    l, addr = lib(), ctypes.cast
    global pyops_direct
    init = dll.kvf_pyops_init
    init.restype = c_int
    init.argtypes = [c_void_p, c_void_p, c_void_p]
    pyops_direct = init(addr(l.kvf_batch_submit_ex, c_void_p),
                        addr(l.kvf_batch_cancel, c_void_p), addr(l.kvf_batch_destroy, c_void_p))
    fn = dll.kvf_pyops_submit_call
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.py_object, c_uint, c_void_p]
    return fn
