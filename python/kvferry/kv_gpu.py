"""The GPU half of :mod:`kvferry.kv`: a paged GPU cache's scattered
blocks moved to and from pinned host memory by kvferry's copy kernels,
each block's checksum computed by the kernel that moves it.

- :class:`PinnedBuffer`: page-locked host memory (``kvf_gpu_alloc``),
  mapped into every GPU, registered with an engine or store on request.
- :class:`BlockTable`: where piece ``p`` of cache block ``b`` lies in
  the span of a layout's buffers (vectorised with numpy when present).
- :class:`GpuMover`: one ``kvf_gpu_copy_blocks_sum`` call per batch of
  pieces: copies them and returns ``kvf_checksum()`` of each, computed
  from the bytes in flight (bit-identical to the value the store records
  at put); with expected checksums, a mismatch is reported, never
  hidden.

numpy is used when installed (descriptor arrays built without a Python
loop per piece); torch is never imported.
"""

from __future__ import annotations

import threading
from array import array
from ctypes import POINTER, Structure, byref, c_char, c_int, c_size_t, c_uint, c_uint64, c_void_p
from typing import Any, List, Optional, Sequence, Tuple

from . import _lib
from .engine import MEM_CUDA, MEM_HOST, MEM_PINNED, Region
from .errors import ERR_CHECKSUM, ERR_OUT_OF_BOUNDS, ERR_TIMEOUT, OK, check

try:  # optional: vectorised descriptor tables
    import numpy as _np
except ImportError:  # pragma: no cover - numpy-free installs
    _np = None


class GpuMem(Structure):
    """kvf_gpu_mem_t."""

    _fields_ = [("base", c_void_p), ("len", c_uint64), ("type", c_int), ("device", c_int)]


_PROTOS = {
    "kvf_gpu_count": (c_int, []),
    "kvf_gpu_alloc": (_lib.status_t, [c_int, c_int, c_size_t, POINTER(c_void_p)]),
    "kvf_gpu_free": (None, [c_int, c_void_p]),
    "kvf_gpu_copier_create": (_lib.status_t, [c_int, POINTER(c_void_p)]),
    "kvf_gpu_copier_destroy": (None, [c_void_p]),
    "kvf_gpu_copy_blocks": (_lib.status_t, [c_void_p, POINTER(GpuMem), POINTER(GpuMem),
                                            c_void_p, c_size_t, c_uint, c_int]),
    "kvf_gpu_copy_blocks_sum": (_lib.status_t, [c_void_p, POINTER(GpuMem), POINTER(GpuMem),
                                                c_void_p, c_size_t, c_uint, c_void_p, c_void_p,
                                                c_int]),
    "kvf_gpu_copy_post": (_lib.status_t, [c_void_p, POINTER(GpuMem), POINTER(GpuMem),
                                          c_void_p, c_size_t, POINTER(c_uint64)]),
    "kvf_gpu_copy_wait": (_lib.status_t, [c_void_p, c_uint64, c_int]),
    "kvf_gpu_checksum_blocks": (_lib.status_t, [c_void_p, POINTER(GpuMem), c_void_p, c_void_p,
                                                c_size_t, c_void_p, c_int]),
    "kvf_gpu_host_register": (_lib.status_t, [c_void_p, c_size_t]),
    "kvf_gpu_host_unregister": (None, [c_void_p]),
}
#: KVF_GPU_POSTS: posts a copier tells apart; a pipeline keeps at most
#: this many in flight so that each wait names its own post
POSTS = 8
#: kvf_gpu_copy_blocks_sum flags: checksums by the copying kernel, or by
#: a pass over the GPU side after the tuned copy (0: per direction, the
#: library's choice)
#: kvf_gpu_copy_blocks flag: every block through the copy engines
COPY_ENGINES = 0x2
SUM_FUSED = 0x1
SUM_AFTER = 0x2
#: ... or by the copy engines, then the pass over the GPU side (leaves the
#: multiprocessors to compute kernels that overlap the copy)
SUM_ENGINES = 0x4
_SUM_MODES = {"auto": 0, "fused": SUM_FUSED, "after": SUM_AFTER, "engines": SUM_ENGINES}


#: the process's checksum mode, set by a caller comparing modes
#: (set_sum_mode); None: the configuration key gpu_sum
_sum_mode: Optional[str] = None


def set_sum_mode(name: Optional[str]) -> None:
    """Sets the checksum mode of the copiers made after this call (None:
    back to the configuration key ``gpu_sum``)."""
    global _sum_mode
    if name is not None:
        sum_mode_flags(name)  # refuses an unknown name here
    _sum_mode = name


def sum_mode(name: Optional[str] = None) -> str:
    """The checksum mode name in force: name, else set_sum_mode's, else
    the configuration key ``gpu_sum`` (``KVF_GPU_SUM``; default auto)."""
    if name is None:
        name = _sum_mode
    if name is None:
        from . import config

        name = config.get("gpu_sum", "auto") or "auto"
    return name


def sum_mode_flags(name: Optional[str] = None) -> int:
    """The copy flags of a checksum mode name (auto, fused, after,
    engines); None: :func:`sum_mode`'s."""
    name = sum_mode(name)
    try:
        return _SUM_MODES[name]
    except KeyError:
        raise ValueError(f"KVF_GPU_SUM: unknown mode {name!r} (one of {', '.join(_SUM_MODES)})") from None
_declared = False


def _dll():
    global _declared
    dll = _lib.lib()
    if not _declared:
        for name, (res, args) in _PROTOS.items():
            fn = getattr(dll, name)
            fn.restype, fn.argtypes = res, args
        _declared = True
    return dll


def gpu_count() -> int:
    """GPUs the library can use (0 without a GPU or a CUDA build)."""
    try:
        return int(_dll().kvf_gpu_count())
    except (OSError, AttributeError):
        return 0


def has_fused_checksums() -> bool:
    """True when this library's copy kernels compute checksums."""
    try:
        _dll()
        return True
    except (OSError, AttributeError):
        return False


class DeviceBuffer:
    """nbytes of memory of GPU device (``kvf_gpu_alloc``), freed by
    :meth:`close`."""

    def __init__(self, nbytes: int, device: int = 0):
        p = c_void_p()
        check(_dll().kvf_gpu_alloc(MEM_CUDA, device, nbytes, byref(p)), "device alloc")
        self.addr, self.nbytes, self.device = int(p.value), int(nbytes), device

    def mem(self) -> "GpuMem":
        return GpuMem(self.addr, self.nbytes, MEM_CUDA, self.device)

    def close(self) -> None:
        if self.addr:
            _dll().kvf_gpu_free(MEM_CUDA, self.addr)
            self.addr = 0


class PinnedBuffer:
    """nbytes of page-locked host memory, mapped into every GPU (freed by
    :meth:`close`). :meth:`register` registers it with a store's or an
    engine's engine as pinned memory."""

    def __init__(self, nbytes: int):
        if nbytes <= 0:
            raise ValueError("kvferry.kv: a pinned buffer needs a size")
        p = c_void_p()
        check(_dll().kvf_gpu_alloc(MEM_PINNED, 0, nbytes, byref(p)), "pinned alloc")
        self.addr, self.nbytes = int(p.value), int(nbytes)
        self.view = (c_char * self.nbytes).from_address(self.addr)
        self.regions: List[Region] = []

    def register(self, owner: Any) -> Region:
        """Registers the buffer with owner (a Store or an Engine)."""
        eng = getattr(owner, "engine", owner)
        r = eng.register(self.view, mem_type=MEM_PINNED, device=0)
        self.regions.append(r)
        return r

    def mem(self) -> GpuMem:
        return GpuMem(self.addr, self.nbytes, MEM_PINNED, 0)

    def close(self) -> None:
        for r in self.regions:
            try:
                r.deregister()
            except Exception:
                pass
        self.regions = []
        if self.addr:
            self.view = None
            _dll().kvf_gpu_free(MEM_PINNED, self.addr)
            self.addr = 0

    def __enter__(self) -> "PinnedBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _u64(values: Sequence[int]):
    """A uint64 array (numpy when present) of values."""
    if _np is not None:
        return _np.asarray(values, dtype=_np.uint64)
    return array("Q", values)


def _addr(a) -> int:
    return int(a.ctypes.data) if _np is not None and isinstance(a, _np.ndarray) else a.buffer_info()[0]


class BlockTable:
    """Piece geometry of a layout over its registered buffers: one side
    (the span from the lowest buffer to the end of the highest, as
    kvf_gpu_mem_t allows for allocations of one device) and, per piece p
    of a block, its offset in that side for block 0 and its stride."""

    def __init__(self, layout: Any, regions: Sequence[Region]):
        self.layout = layout
        base = min(r.addr for r in regions)
        end = max(r.addr + r.nbytes for r in regions)
        types = {r.mem_type for r in regions}
        devs = {r.device for r in regions}
        if len(types) != 1 or len(devs) != 1:
            raise ValueError("kvferry.kv: the buffers of a GPU cache must share one device")
        mt = types.pop()
        self.side = GpuMem(base, end - base, mt, devs.pop() if mt == MEM_CUDA else 0)
        s0 = layout.spans(0)
        s1 = layout.spans(1) if layout.num_blocks > 1 else s0
        self.rel0 = [regions[bi].addr - base + off for _, bi, off, _ in s0]
        self.stride = [b[2] - a[2] for a, b in zip(s0, s1)]
        self.lens = [ln for _, _, _, ln in s0]
        self.chunk_bytes = sum(self.lens)
        self.within = [sum(self.lens[:p]) for p in range(len(self.lens))]
        if _np is not None:
            u = _np.uint64
            self._rel0 = _np.asarray(self.rel0, dtype=u)[None, :]
            self._stride = _np.asarray(self.stride, dtype=u)[None, :]
            self._lens = _np.asarray(self.lens, dtype=u)
            self._within = _np.asarray(self.within, dtype=u)[None, :]

    def offsets(self, blocks: Sequence[int]):
        """Offsets in the side of every piece of blocks, block-major."""
        if _np is not None:
            b = _np.asarray(blocks, dtype=_np.uint64)[:, None]
            return (self._rel0 + b * self._stride).reshape(-1)
        return array("Q", [r + blk * s for blk in blocks for r, s in zip(self.rel0, self.stride)])

    def piece_lens(self, nblocks: int):
        if _np is not None:
            return _np.tile(self._lens, nblocks)
        return array("Q", self.lens * nblocks)

    def packed(self, nblocks: int, start: int = 0):
        """Offsets of the pieces of nblocks chunks laid end to end from start."""
        return self.at_chunks(range(nblocks), start)

    def at_chunks(self, slots: Sequence[int], start: int = 0):
        """Offsets of the pieces of chunks placed at slots (in chunks) from start."""
        if _np is not None:
            s = _np.asarray(slots, dtype=_np.uint64)[:, None] * _np.uint64(self.chunk_bytes)
            return (s + self._within + _np.uint64(start)).reshape(-1)
        cb = self.chunk_bytes
        return array("Q", [start + s * cb + w for s in slots for w in self.within])


class HostMappings:
    """Host mappings registered with the GPU driver (cudaHostRegister), so
    kernels and copy engines read them in place as pinned memory: the
    mappings of nodes' pools that store views lie in (kvferry.Store's
    view_get). Each is registered once, the first time a view of it is
    used, and unregistered just before the store unmaps it (the store's
    unmap hook), or at :meth:`close`. Registering pins the pages: about a
    second per few GiB, once per mapping."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict = {}  # base -> length
        self.failed = False    # a registration failed: callers copy instead

    def ensure(self, base: int, length: int) -> bool:
        """True when [base, base + length) is registered (now or before)."""
        with self._lock:
            if self._held.get(base) == length:
                return True
            if self.failed:
                return False
        if _dll().kvf_gpu_host_register(base, length) != OK:
            self.failed = True
            return False
        with self._lock:
            self._held[base] = length
        return True

    def forget(self, base: int, length: int) -> None:
        """The store is about to unmap base: unregister it (hook-safe:
        no store call)."""
        with self._lock:
            held = self._held.pop(base, None)
        if held is not None:
            _dll().kvf_gpu_host_unregister(base)

    def close(self) -> None:
        with self._lock:
            bases, self._held = list(self._held), {}
        for b in bases:
            _dll().kvf_gpu_host_unregister(b)


_mappings: Optional[HostMappings] = None
_mappings_lock = threading.Lock()


def host_mappings(store: Any) -> HostMappings:
    """The process's registry of view mappings, hooked to the store's
    unmap notice on first use."""
    global _mappings
    with _mappings_lock:
        if _mappings is None:
            _mappings = HostMappings()
            store.view_unmap_hook(_mappings.forget)
        return _mappings


def _blocks(src_offs, dst_offs, lens) -> Any:
    """(src offset, dst offset, length) rows as one C array of uint64."""
    if _np is not None:
        blk = _np.empty((len(lens), 3), dtype=_np.uint64)
        blk[:, 0], blk[:, 1], blk[:, 2] = src_offs, dst_offs, lens
        return blk
    return array("Q", [v for t in zip(src_offs, dst_offs, lens) for v in t])


class GpuMover:
    """A GPU copier (kvf_gpu_copier_t) moving batches of pieces with the
    checksumming kernel. Used by one thread at a time."""

    def __init__(self, device: int = 0, sum_mode: Optional[str] = None):
        self.flags = sum_mode_flags(sum_mode)
        h = c_void_p()
        check(_dll().kvf_gpu_copier_create(device, byref(h)), "gpu copier")
        self._h = h.value

    def copy(self, src: GpuMem, dst: GpuMem, src_offs, dst_offs, lens,
             expect=None, timeout_ms: int = 60000, flags: int = 0) -> Tuple[int, Any]:
        """Copies len[i] bytes from src + src_offs[i] to dst + dst_offs[i]
        for every i in one call and returns (status, sums): sums[i] is
        kvf_checksum() of piece i. With expect, a mismatch answers
        ERR_CHECKSUM (every piece is still copied and summed). Statuses
        other than OK and ERR_CHECKSUM raise."""
        n = len(lens)
        if _np is not None:
            blk = _np.empty((n, 3), dtype=_np.uint64)
            blk[:, 0], blk[:, 1], blk[:, 2] = src_offs, dst_offs, lens
            sums = _np.zeros(n, dtype=_np.uint64)
            exp = None if expect is None else _np.ascontiguousarray(expect, dtype=_np.uint64)
        else:
            blk = array("Q", [v for t in zip(src_offs, dst_offs, lens) for v in t])
            sums = array("Q", bytes(8 * n))
            exp = None if expect is None else array("Q", expect)
        st = _dll().kvf_gpu_copy_blocks_sum(
            self._h, byref(src), byref(dst), _addr(blk), n, flags or self.flags,
            None if exp is None else _addr(exp), _addr(sums), timeout_ms)
        if st not in (OK, ERR_CHECKSUM):
            check(st, "gpu copy")
        return st, sums

    def copy_plain(self, src: GpuMem, dst: GpuMem, src_offs, dst_offs, lens,
                   engines: bool = True, timeout_ms: int = 60000) -> None:
        """Copies len[i] bytes from src + src_offs[i] to dst + dst_offs[i]
        (kvf_gpu_copy_blocks), through the copy engines (DMA) by default:
        for few large ranges, which the engines move at the link's rate.
        Raises on any error."""
        n = len(lens)
        if n == 0:
            return
        blk = _blocks(src_offs, dst_offs, lens)
        check(_dll().kvf_gpu_copy_blocks(self._h, byref(src), byref(dst), _addr(blk), n,
                                         COPY_ENGINES if engines else 0, timeout_ms),
              "gpu copy")

    def post_plain(self, src: GpuMem, dst: GpuMem, src_offs, dst_offs, lens) -> int:
        """:meth:`copy_plain` through the copy engines, posted and not
        waited for (kvf_gpu_copy_post): returns the post's ticket for
        :meth:`wait`. Posts run one after the other in the order made, so
        the engines go on to the next without waiting for this thread.
        Both sides must stay valid until the ticket was waited for."""
        return self.post_table(src, dst, _blocks(src_offs, dst_offs, lens), len(lens))

    def post_table(self, src: GpuMem, dst: GpuMem, blk, n: Optional[int] = None) -> int:
        """:meth:`post_plain` with the descriptors prebuilt: blk a C array
        of n (src offset, dst offset, length) uint64 rows (a C-contiguous
        ``(n, 3)`` numpy array: n may be left out)."""
        n = int(blk.shape[0]) if n is None else n
        ticket = c_uint64()
        check(_dll().kvf_gpu_copy_post(self._h, byref(src), byref(dst), _addr(blk),
                                       n, byref(ticket)), "gpu copy post")
        return ticket.value

    def wait(self, ticket: int, timeout_ms: int = 60000) -> None:
        """Waits until the post named ticket (and every one before it)
        ended. Raises on a timeout or a copy error."""
        check(_dll().kvf_gpu_copy_wait(self._h, ticket, timeout_ms), "gpu copy wait")

    def done(self, ticket: int) -> bool:
        """Whether the post named ticket has ended (asked once, no wait)."""
        st = _dll().kvf_gpu_copy_wait(self._h, ticket, 0)
        if st == ERR_TIMEOUT:
            return False
        check(st, "gpu copy wait")
        return True

    def checksums(self, mem: GpuMem, offs, lens, sums, timeout_ms: int = 60000) -> None:
        """kvf_checksum() of the ranges (offs[i], lens[i]) of mem into
        sums[i] (kvf_gpu_checksum_blocks: GPU memory is hashed on the GPU,
        where it lies); offs, lens and sums are C arrays of uint64
        (C-contiguous numpy arrays). Raises on any error."""
        check(_dll().kvf_gpu_checksum_blocks(self._h, byref(mem), _addr(offs), _addr(lens),
                                             len(lens), _addr(sums), timeout_ms),
              "gpu checksum")

    def copy_table(self, src: GpuMem, dst: GpuMem, blk, expect, sums,
                   timeout_ms: int = 60000, flags: int = 0) -> int:
        """:meth:`copy` with the descriptors prebuilt: blk a C-contiguous
        ``(n, 3)`` uint64 numpy array of (src offset, dst offset, length),
        expect (or None) and sums ``(n,)`` uint64 arrays (sums written).
        Returns OK or ERR_CHECKSUM; other statuses raise."""
        n = int(blk.shape[0])
        st = _dll().kvf_gpu_copy_blocks_sum(
            self._h, byref(src), byref(dst), int(blk.ctypes.data), n, flags or self.flags,
            None if expect is None else int(expect.ctypes.data), int(sums.ctypes.data),
            timeout_ms)
        if st not in (OK, ERR_CHECKSUM):
            check(st, "gpu copy")
        return st

    def close(self) -> None:
        if self._h:
            _dll().kvf_gpu_copier_destroy(self._h)
            self._h = None

    def __enter__(self) -> "GpuMover":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def first_mismatch(sums, expect) -> int:
    """Index of the first piece whose sum differs from expect (len when none)."""
    if _np is not None:
        bad = _np.nonzero(_np.asarray(sums, dtype=_np.uint64) != _np.asarray(expect, dtype=_np.uint64))[0]
        return int(bad[0]) if len(bad) else len(sums)
    for i, (a, b) in enumerate(zip(sums, expect)):
        if a != b:
            return i
    return len(sums)


__all__ = ["PinnedBuffer", "DeviceBuffer", "COPY_ENGINES", "BlockTable", "GpuMover", "GpuMem", "gpu_count", "first_mismatch",
           "has_fused_checksums", "SUM_FUSED", "SUM_AFTER", "SUM_ENGINES",
           "sum_mode_flags", "HostMappings", "host_mappings", "ERR_OUT_OF_BOUNDS", "MEM_HOST"]
