"""Turns Python objects into (address, length, memory type, device).

Accepted: any object with the buffer protocol (bytes, bytearray,
memoryview, array.array, mmap, numpy arrays: C-contiguous), torch
tensors (``data_ptr()``/``nbytes``/``device``, CPU or CUDA, contiguous)
and objects with ``__cuda_array_interface__``. Neither numpy nor torch
is imported: objects are recognised by their attributes.

The buffer protocol is used through CPython's ``PyObject_GetBuffer``, so
the exporter stays locked (a registered bytearray cannot be resized) until
the region is deregistered.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_ssize_t, c_void_p, py_object
from typing import Any, Optional, Tuple

from . import _lib
from .errors import BufferTypeError, invalid

_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 0x1


class _PyBuffer(Structure):
    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", c_ssize_t),
        ("itemsize", c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_char_p),
        ("shape", POINTER(c_ssize_t)),
        ("strides", POINTER(c_ssize_t)),
        ("suboffsets", POINTER(c_ssize_t)),
        ("internal", c_void_p),
    ]


_api = ctypes.pythonapi
_api.PyObject_GetBuffer.argtypes = [py_object, POINTER(_PyBuffer), c_int]
_api.PyObject_GetBuffer.restype = c_int
_api.PyBuffer_Release.argtypes = [POINTER(_PyBuffer)]
_api.PyBuffer_Release.restype = None


class HostView:
    """A locked view of a buffer-protocol object; release() unlocks it."""

    __slots__ = ("_view", "addr", "nbytes", "readonly")

    def __init__(self, obj: Any, writable: bool):
        self._view: Optional[_PyBuffer] = None
        view = _PyBuffer()
        flags = _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE
        try:
            _api.PyObject_GetBuffer(obj, ctypes.byref(view), flags)
        except (BufferError, TypeError, ValueError) as e:
            raise invalid(
                "buffer",
                "%s: %s" % (type(obj).__name__, e),
                BufferTypeError,
            ) from None
        self._view = view
        self.addr = view.buf or 0
        self.nbytes = view.len
        self.readonly = bool(view.readonly)

    def release(self) -> None:
        if self._view is not None:
            _api.PyBuffer_Release(ctypes.byref(self._view))
            self._view = None

    def __del__(self) -> None:
        self.release()


def _torch_info(obj: Any) -> Tuple[int, int, int, int]:
    if not obj.is_contiguous():
        raise invalid("buffer", "tensor is not contiguous", BufferTypeError)
    dev = obj.device
    if dev.type == "cuda":
        return obj.data_ptr(), obj.nbytes, _lib.MEM_CUDA, dev.index or 0
    if dev.type == "cpu":
        pinned = bool(getattr(obj, "is_pinned", lambda: False)())
        return obj.data_ptr(), obj.nbytes, _lib.MEM_PINNED if pinned else _lib.MEM_HOST, 0
    raise invalid("buffer", "tensor on device %r" % (str(dev),), BufferTypeError)


def _cuda_iface_info(obj: Any) -> Tuple[int, int, int, int]:
    ai = obj.__cuda_array_interface__
    if ai.get("strides") is not None:
        raise invalid("buffer", "CUDA array is not C-contiguous", BufferTypeError)
    n = int(ai["typestr"][2:])
    for d in ai["shape"]:
        n *= d
    device = 0
    dev = getattr(obj, "device", None)
    if dev is not None and hasattr(dev, "id"):
        device = int(dev.id)
    return int(ai["data"][0]), n, _lib.MEM_CUDA, device


def is_tensor(obj: Any) -> bool:
    """True for a torch tensor (checked without importing torch)."""
    mod = type(obj).__module__ or ""
    return mod.startswith("torch") and hasattr(obj, "data_ptr") and hasattr(obj, "device")


def resolve(obj: Any, writable: bool = False):
    """(addr, nbytes, mem_type, device, view) of obj; view is a HostView to
    release when done with the memory, or None (tensors, CUDA arrays)."""
    if is_tensor(obj):
        addr, n, mt, dev = _torch_info(obj)
        return addr, n, mt, dev, None
    if hasattr(obj, "__cuda_array_interface__"):
        addr, n, mt, dev = _cuda_iface_info(obj)
        return addr, n, mt, dev, None
    if isinstance(obj, (int, float, str)) or obj is None:
        raise invalid(
            "buffer",
            "%s is not a buffer (bytes-like, numpy array or tensor)" % type(obj).__name__,
            BufferTypeError,
        )
    view = HostView(obj, writable)
    return view.addr, view.nbytes, _lib.MEM_HOST, 0, view
