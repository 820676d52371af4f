"""Chunk objects: a serving engine's paged KV cache kept in the kvferry
store as a few large objects per chunk of tokens, whatever the engine's
block size.

A chunk is ``chunk_tokens`` tokens (default 256, a multiple of the
engine's block size). Its KV is split by layer groups (``layer_groups``,
default 4: a load can hand layer group g to the model while group g+1
still moves) and each (chunk, group) is ONE store object:

- a header: magic, format version, group, block count, pieces per
  block, piece size, the cache's fingerprint, the chunk's key, then the
  checksum (XXH3-64, as ``kvf_checksum``) of every piece, and a checksum
  of the header itself;
- the data: piece ``q`` (a layer's K or V page, in layer order) of block
  ``j`` of the chunk at ``data_off + (q * blocks + j) * piece_bytes``:
  each layer's K (then V) of the chunk's tokens in one run.

A prompt of 32K tokens is then 125 chunks x 4 groups = 500 objects
instead of one object per engine block per layer. Keys chain SHA-256
over the chunks' token ids (:func:`kvferry.kv.chunk_keys`) under the
fingerprint, so key ``i`` names the whole prefix up to chunk ``i``. A
prompt's last, partial chunk is saved as a *tail* object of the full
blocks it has (key: the previous chunk's key and those tokens); a load
may use any leading blocks of a full chunk or of a tail.

How bytes move (:class:`ChunkStore`):

- GPU caches, node of this host over shm (the fast path): a load views
  the objects where they lie in the node's pool (``Store.view_get``), and
  one kvferry copy kernel per layer group and pool mapping scatters their
  pieces into the engine's blocks and checks every piece against the
  header's checksums on the way; a save opens put views
  (``Store.view_put``), one kernel per group gathers the blocks' pieces
  straight into the pool and computes their checksums, the header is
  written, and the commit (the store's own checksum of each object, by
  the library) can run later on another thread. No host copy either way.
  The pool's mappings are registered with the GPU once, ahead of use.
- GPU caches otherwise (a node over tcp, no views): through a pinned
  stage, the same kernels, ``Store.get_batch_sums`` / ``put_batch``.
- Host caches (numpy arrays, CPU tensors): numpy gathers and scatters
  through a host stage, the store verifying each object's checksum.

A load never returns wrong bytes: a missing, short, mis-headed or
mismatching object ends the request's hit at the first bad block (a
count in ``stats.corrupt_misses`` unless it was merely absent); the engine
recomputes from there.

Neither numpy nor torch is imported at module level; numpy is required
by :class:`ChunkStore`.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import threading
import time
from array import array
from ctypes import memmove, string_at
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _lib
from .errors import ERR_EXISTS, ERR_NO_KEY, ERR_QUOTA, ERR_UNSUPPORTED, OK, KvferryError
from .kv import LAYOUT_VERSION, chunk_keys
from .store import BATCH_MAX, Store

#: Format version of chunk objects (header and data layout).
CHUNK_FORMAT = 1
#: Default chunk, in tokens, and default number of layer groups.
CHUNK_TOKENS = 256
LAYER_GROUPS = 4
#: Largest slice of objects a pipelined GPU load or save moves at once
#: (kv_pipe): small enough that filling the pipeline costs little
PIPE_SLICE = 64 << 20

_MAGIC = b"KVFC"
# magic, version, group, groups, (pad), blocks, pieces per block, piece
# bytes, fingerprint, chunk key, header checksum
_HDR = struct.Struct("<4sHHHHIII16s32sQ")
_HSUM_AT = _HDR.size - 8
_ALIGN = 4096


def header_bytes(pieces: int, blocks: int) -> int:
    """Bytes before the data of an object of blocks x pieces pieces."""
    raw = _HDR.size + 8 * pieces * blocks
    return (raw + _ALIGN - 1) // _ALIGN * _ALIGN


def tail_key(prev: bytes, tokens: Sequence[int]) -> bytes:
    """Key of a tail object: the chunk key before it (or the chain's seed)
    and the tail's token ids (little-endian int64)."""
    arr = array("q", list(tokens))
    if sys.byteorder != "little":
        arr.byteswap()
    h = hashlib.sha256(prev)
    h.update(arr.tobytes())
    h.update(b"tail")
    return h.digest()


def chain_seed(fingerprint: str) -> bytes:
    """Key before the first chunk (see :func:`kvferry.kv.chunk_keys`)."""
    return hashlib.sha256(b"kvferry-kv\0%d\0%s" % (LAYOUT_VERSION, fingerprint.encode())).digest()


# ---------------------------------------------------------------------------
# where a cache's pieces lie


def _tensor_info(t: Any) -> Tuple[int, Tuple[int, ...], Tuple[int, ...], int, int]:
    """(address, shape, strides in bytes, element size, CUDA device or -1)."""
    if hasattr(t, "data_ptr"):  # torch
        esz = t.element_size()
        dev = t.device.index or 0 if t.device.type == "cuda" else -1
        if t.device.type not in ("cuda", "cpu"):
            raise ValueError("kvferry chunks: a tensor on %s" % t.device)
        return (t.data_ptr(), tuple(t.shape), tuple(s * esz for s in t.stride()), esz, dev)
    if hasattr(t, "__array_interface__"):  # numpy
        return (t.ctypes.data, tuple(t.shape), tuple(t.strides), t.itemsize, -1)
    raise ValueError("kvferry chunks: a cache buffer is a torch tensor or a numpy array, "
                     "got %s" % type(t).__name__)


def _dense_run(shape: Sequence[int], strides: Sequence[int], esz: int) -> int:
    """Bytes of the dense run shape/strides describe (any dimension order),
    or ValueError when it has gaps."""
    expect = esz
    for st, n in sorted(zip(strides, shape)):
        if n == 1:
            continue
        if st != expect:
            raise ValueError("kvferry chunks: a KV block is not one dense run (strides %s)"
                             % (tuple(strides),))
        expect *= n
    return expect


@dataclass(frozen=True)
class Part:
    """One piece of every block of one layer: block b's bytes lie at
    ``addr + b * stride``, ``nbytes`` long."""

    addr: int
    stride: int
    nbytes: int


def layer_parts(t: Any, num_blocks: int) -> List[Part]:
    """The pieces of one layer's KV tensor: K and V of a ``[2, num_blocks,
    ...]`` tensor (vLLM's layer-compact layouts, NHD or HND), or the one
    page of a ``[num_blocks, ...]`` tensor (K and V together, MLA
    latents, or a view into a cross-layer cache)."""
    addr, shape, strides, esz, _ = _tensor_info(t)
    if len(shape) >= 3 and shape[0] == 2 and shape[1] == num_blocks:
        subs = [(addr, shape[1:], strides[1:]), (addr + strides[0], shape[1:], strides[1:])]
    elif len(shape) >= 2 and shape[0] == num_blocks:
        subs = [(addr, shape, strides)]
    else:
        raise ValueError("kvferry chunks: KV cache shape %s has no block dimension of %d"
                         % (shape, num_blocks))
    return [Part(a, st[0], _dense_run(sh[1:], st[1:], esz)) for a, sh, st in subs]


class CacheMap:
    """A paged cache's pieces by layer and layer group.

    tensors: one per layer (in layer order), torch tensors (CUDA on one
    device, or CPU) or numpy arrays. Every piece has the same size."""

    def __init__(self, tensors: Sequence[Any], num_blocks: int, layer_groups: int):
        if not tensors:
            raise ValueError("kvferry chunks: no KV cache tensors")
        self.tensors = list(tensors)  # kept alive while the map is used
        self.num_blocks = int(num_blocks)
        self.layers = [layer_parts(t, self.num_blocks) for t in self.tensors]
        sizes = {p.nbytes for ps in self.layers for p in ps}
        if len(sizes) != 1:
            raise ValueError("kvferry chunks: KV pieces of different sizes %s" % sorted(sizes))
        self.piece_bytes = sizes.pop()
        devs = {_tensor_info(t)[4] for t in self.tensors}
        if len(devs) != 1:
            raise ValueError("kvferry chunks: KV tensors on more than one device %s" % devs)
        self.device = devs.pop()  # -1: host memory
        n = len(self.layers)
        g = effective_groups(layer_groups, n)
        self.groups = [list(range(i * n // g, (i + 1) * n // g)) for i in range(g)]
        self.group_of = {layer: gi for gi, ls in enumerate(self.groups) for layer in ls}
        parts = [p for ps in self.layers for p in ps]
        self.base = min(p.addr for p in parts)
        self.end = max(p.addr + (self.num_blocks - 1) * p.stride + p.nbytes for p in parts)
        self._sizes: Dict[Tuple[int, int], int] = {}

    def group_parts(self, g: int) -> List[Part]:
        """The pieces of a block in group g, in object order."""
        return [p for layer in self.groups[g] for p in self.layers[layer]]

    def object_bytes(self, g: int, blocks: int) -> int:
        """Bytes of group g's object of a chunk of blocks blocks (its
        header and pieces); asked per object, so computed once a shape."""
        got = self._sizes.get((g, blocks))
        if got is None:
            q = len(self.group_parts(g))
            got = self._sizes[(g, blocks)] = header_bytes(q, blocks) + q * blocks * self.piece_bytes
        return got


# ---------------------------------------------------------------------------
# what a lookup found, what a load or save moves


@dataclass
class Chunk:
    """A stored chunk (or tail) of a request: its key, the blocks its
    objects hold, and its first token in the request."""

    key: bytes
    blocks: int
    first_token: int


@dataclass
class LoadReq:
    """Tokens [start, end) of a request loaded into cache blocks
    ``block_ids`` (the request's block i holds tokens [i*bs, (i+1)*bs));
    ``chunks``: the lookup's chunks covering them."""

    chunks: List[Chunk]
    block_ids: List[int]
    start: int
    end: int
    #: set by the load: tokens verified from start (a multiple of the block size)
    loaded: int = 0
    failed_blocks: List[int] = field(default_factory=list)


@dataclass
class SaveReq:
    """Chunks of a request to save: each from the request's blocks."""

    chunks: List[Chunk]
    block_ids: List[int]


@dataclass
class ChunkStats:
    lookups: int = 0
    hit_tokens: int = 0
    loaded_tokens: int = 0
    saved_objects: int = 0
    skipped_objects: int = 0
    corrupt_misses: int = 0
    load_errors: int = 0
    save_errors: int = 0
    bytes_loaded: int = 0
    bytes_saved: int = 0
    viewed_objects: int = 0
    put_viewed_objects: int = 0
    #: objects a put view refused (pool full, quota) and quota retries
    refused_objects: int = 0
    quota_retries: int = 0
    t_query: float = 0.0
    t_load: float = 0.0
    #: of the GPU loads: seconds the copy engines' DMA into the GPU stage
    #: and the verifying scatter kernels took (busy time of each; with the
    #: stage pipeline, DMA from a load's first post to its last DMA's end)
    t_dma: float = 0.0
    t_scatter: float = 0.0
    #: of the GPU saves: seconds waiting for the forward pass to reach a
    #: group, the gathering kernels, and the DMA out of the GPU stage
    t_save_wait: float = 0.0
    t_gather: float = 0.0
    t_dma_out: float = 0.0
    t_save: float = 0.0
    t_commit: float = 0.0


class _GroupBatch:
    """The pieces of one layer group for a list of (chunk, block range)
    slices, vectorised: per slice its object's blocks, the range [j0, j1)
    of them to move, and the cache blocks they go to or come from."""

    def __init__(self, cmap: CacheMap, g: int):
        np = _np()
        parts = cmap.group_parts(g)
        self.q = len(parts)
        self.plen = cmap.piece_bytes
        self.part_off = np.asarray([p.addr - cmap.base for p in parts], dtype=np.uint64)
        self.part_stride = np.asarray([p.stride for p in parts], dtype=np.uint64)
        self._memo: Dict[Tuple[int, int, int], Any] = {}

    def cache_offsets(self, blocks: Any) -> Any:
        """(n, q, m) offsets in the cache side of the pieces of blocks (n, m)."""
        np = _np()
        b = np.asarray(blocks, dtype=np.uint64)
        return self.part_off[None, :, None] + b[:, None, :] * self.part_stride[None, :, None]

    def object_offsets(self, k: int, j0: int, j1: int) -> Any:
        """(q, j1-j0) offsets inside an object of k blocks (from its start)."""
        got = self._memo.get((k, j0, j1))
        if got is None:
            got = self._memo[(k, j0, j1)] = self._object_offsets(k, j0, j1)
        return got

    def _object_offsets(self, k: int, j0: int, j1: int) -> Any:
        np = _np()
        q = np.arange(self.q, dtype=np.uint64)[:, None]
        j = np.arange(j0, j1, dtype=np.uint64)[None, :]
        return np.uint64(header_bytes(self.q, k)) + (q * np.uint64(k) + j) * np.uint64(self.plen)


def _np() -> Any:
    import numpy

    return numpy


_hash_pool: Any = None
_hash_lock = threading.Lock()
#: threads that compute the store checksums of objects written in place
HASH_THREADS = 4


def _object_sums(views: Any, keep: Sequence[int]) -> List[int]:
    """kvf_checksum of every kept view's bytes, in parallel threads (the
    library's checksum runs without Python's lock); 0 for the others."""
    global _hash_pool
    from concurrent.futures import ThreadPoolExecutor

    with _hash_lock:
        if _hash_pool is None:
            _hash_pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="kvferry-hash")
    fn = _lib.lib().kvf_checksum
    jobs = [_hash_pool.submit(fn, v.addr, v.length) if kp and v.status == OK else None
            for v, kp in zip(views, keep)]
    return [int(j.result()) if j is not None else 0 for j in jobs]


# ---------------------------------------------------------------------------


def effective_groups(layer_groups: int, num_layers: int) -> int:
    """The layer groups a cache of num_layers layers is split into."""
    return max(1, min(int(layer_groups), int(num_layers)))


class ChunkIndex:
    """The keys and the look-up of chunk objects without a cache (an
    engine's scheduler side): the store, the engine's block size, the
    fingerprint, namespace, chunk_tokens and layer groups as the cache's
    :class:`ChunkStore` has them."""

    def __init__(self, store: Store, block_size: int, fingerprint: str, namespace: str = "kv",
                 chunk_tokens: int = CHUNK_TOKENS, groups: int = LAYER_GROUPS):
        if block_size <= 0 or chunk_tokens <= 0 or chunk_tokens % block_size:
            raise ValueError("kvferry chunks: chunk_tokens %d is not a multiple of the block "
                             "size %d" % (chunk_tokens, block_size))
        self.store, self.namespace = store, namespace
        self.block_size, self.chunk_tokens = int(block_size), int(chunk_tokens)
        self.bpc = self.chunk_tokens // self.block_size  # blocks per chunk
        self.groups = int(groups)
        desc = "%s|c%d|g%d|f%d" % (fingerprint, self.chunk_tokens, self.groups, CHUNK_FORMAT)
        self.fingerprint = hashlib.sha256(desc.encode()).hexdigest()[:32]
        self._fp_raw = bytes.fromhex(self.fingerprint)[:16]
        self.stats = ChunkStats()
        self._lock = threading.Lock()

    # -- keys ----------------------------------------------------------------

    def object_key(self, key: bytes, blocks: int, g: int) -> str:
        return "%s/%s/%s/%d/%d" % (self.namespace, self.fingerprint, key.hex(), blocks, g)

    def _object_keys(self, ch: Chunk) -> List[str]:
        return [self.object_key(ch.key, ch.blocks, g) for g in range(self.groups)]

    def chunks_of(self, tokens: Sequence[int], upto: int) -> List[Chunk]:
        """The chunks (full, then a tail) that hold tokens [0, upto) of a
        prompt, upto a multiple of the block size (for saves)."""
        n = self.chunk_tokens
        full = chunk_keys(tokens[: upto // n * n], n, self.fingerprint)
        out = [Chunk(k, self.bpc, i * n) for i, k in enumerate(full)]
        rest = (upto - len(full) * n) // self.block_size
        if rest > 0:
            prev = full[-1] if full else chain_seed(self.fingerprint)
            first = len(full) * n
            out.append(Chunk(tail_key(prev, tokens[first:first + rest * self.block_size]),
                             rest, first))
        return out

    def rekey(self, tokens: Sequence[int], chunks: Sequence[Chunk]) -> List[Chunk]:
        """The same chunks of tokens (same boundaries and block counts)
        keyed under this index's fingerprint: e.g. another tensor-parallel
        rank's objects of chunks a lookup found."""
        n, bs = self.chunk_tokens, self.block_size
        nfull = sum(1 for c in chunks if c.blocks == self.bpc and c.first_token % n == 0)
        keys = chunk_keys(tokens[: nfull * n], n, self.fingerprint)
        out, prev = [], chain_seed(self.fingerprint)
        for c in chunks:
            i = c.first_token // n
            if c.blocks == self.bpc and c.first_token % n == 0 and i < len(keys):
                key = keys[i]
            else:
                key = tail_key(keys[i - 1] if i else prev,
                               tokens[c.first_token:c.first_token + c.blocks * bs])
            out.append(Chunk(key, c.blocks, c.first_token))
        return out

    def _tail_candidates(self, tokens: Sequence[int], prev: bytes, first: int,
                         limit: int) -> List[Chunk]:
        """Tails that could follow the chunk key prev at token first:
        largest first."""
        most = min(self.bpc - 1, (len(tokens) - first) // self.block_size)
        if first >= limit or most <= 0:
            return []
        return [Chunk(tail_key(prev, tokens[first:first + k * self.block_size]), k, first)
                for k in range(most, 0, -1)]

    # -- lookup --------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], limit: int) -> Tuple[int, List[Chunk]]:
        """How many leading tokens of tokens (at most limit, a multiple of
        the block size) the store holds, and the chunks holding them. One
        master round trip (two when a stored prefix ends inside the
        prompt's full chunks and a tail may continue it)."""
        t0 = time.perf_counter()
        n = self.chunk_tokens
        nfull = min(len(tokens) // n, (limit + n - 1) // n)
        full = [Chunk(k, self.bpc, i * n) for i, k in
                enumerate(chunk_keys(tokens[: nfull * n], n, self.fingerprint))]
        prev = full[-1].key if full else chain_seed(self.fingerprint)
        tails = self._tail_candidates(tokens, prev, nfull * n, limit)
        found = self._exists(full + tails)
        hit = 0
        while hit < len(full) and found[hit]:
            hit += 1
        chunks = full[:hit]
        if hit == len(full):
            tail = next((t for t, f in zip(tails, found[len(full):]) if f), None)
        else:  # the stored prefix ends at chunk hit: a tail may follow it
            prev = full[hit - 1].key if hit else chain_seed(self.fingerprint)
            cands = self._tail_candidates(tokens, prev, hit * n, limit)
            tail = next((t for t, f in zip(cands, self._exists(cands)) if f), None)
        if tail is not None:
            chunks.append(tail)
        tokens_hit = min(limit, sum(c.blocks for c in chunks) * self.block_size)
        while chunks and chunks[-1].first_token >= tokens_hit:
            chunks.pop()
        with self._lock:
            self.stats.lookups += 1
            self.stats.hit_tokens += tokens_hit
            self.stats.t_query += time.perf_counter() - t0
        return tokens_hit, chunks

    def _exists(self, chunks: List[Chunk]) -> List[bool]:
        """Per chunk: every group's object is stored. Found objects are
        held (read leases, as just used) where the store can: a hit stays
        in the pool until its load, however full the pool runs meanwhile."""
        keys = [k for c in chunks for k in self._object_keys(c)]
        look = getattr(self.store, "hold_batch", None) or self.store.exists_batch
        found: List[bool] = []
        for a in range(0, len(keys), BATCH_MAX):
            found += look(keys[a:a + BATCH_MAX])
        g = self.groups
        return [all(found[i * g:(i + 1) * g]) for i in range(len(chunks))]

    def exists(self, chunks: List[Chunk]) -> List[bool]:
        """Per chunk: stored (every group's object)."""
        return self._exists(chunks) if chunks else []


class ChunkStore(ChunkIndex):
    """A paged KV cache bound to a kvferry store as chunk objects.

    store: a :class:`kvferry.Store`. tensors: the cache's per-layer tensors
    (see :class:`CacheMap`). block_size: the engine's tokens per block.
    fingerprint: 32 hex digits naming everything that decides a block's
    bytes (model, weights, dtype, layout, parallel rank...); objects of
    another fingerprint are never found. namespace: key prefix (a
    tenant). chunk_tokens, layer_groups: the object geometry (part of
    every key). stage_bytes: the stage for the paths that copy (at least
    one object). views: use store views and put views where the node
    allows (False: always through the stage). sum_mode: the GPU copies'
    checksum mode (:func:`kvferry.kv_gpu.sum_mode_flags`).
    gpu_stage_bytes: GPU memory whole objects cross the link through (0:
    none, the kernels reach the pool mapping). pipeline: that stage in
    segments of a slice (at most slice_bytes, at least an object; two at
    least), DMAs of some while the kernel works on another
    (:mod:`kvferry.kv_pipe`)."""

    def __init__(self, store: Store, tensors: Sequence[Any], num_blocks: int, block_size: int,
                 fingerprint: str, namespace: str = "kv", chunk_tokens: int = CHUNK_TOKENS,
                 layer_groups: int = LAYER_GROUPS, replicas: int = 0, stage_bytes: int = 256 << 20,
                 views: bool = True, sum_mode: Optional[str] = None,
                 gpu_stage_bytes: int = 512 << 20, pipeline: bool = False,
                 slice_bytes: int = PIPE_SLICE):
        self.map = CacheMap(tensors, num_blocks, layer_groups)
        super().__init__(store, block_size, fingerprint, namespace, chunk_tokens,
                         len(self.map.groups))
        self.replicas = replicas
        self._batches = [_GroupBatch(self.map, g) for g in range(self.groups)]
        self.gpu = self.map.device >= 0
        self._want_views = bool(views) and hasattr(store, "view_get")
        self._want_put_views = self._want_views and hasattr(store, "view_put")
        self._stage_bytes = max(int(stage_bytes), max(self.map.object_bytes(g, self.bpc)
                                                      for g in range(self.groups)))
        self._stage: Any = None
        self._stage_region: Any = None
        #: GPU memory that whole objects are copied through by the copy
        #: engines (full link rate), the pieces then scattered on the GPU
        biggest = max(self.map.object_bytes(g, self.bpc) for g in range(self.groups))
        halves = 2 if pipeline else 1
        self._gstage_bytes = max(int(gpu_stage_bytes), halves * biggest) if gpu_stage_bytes else 0
        self._gstage: Any = None
        #: the stage in segments of a slice, DMAs of some || kernel on
        #: another (kv_pipe), slices of at most slice_bytes (at least an
        #: object)
        self._pipeline = bool(pipeline)
        self._pipe: Any = None
        #: why warm()'s copies failed (None: they did not; the pipeline is
        #: then off)
        self.warm_error: Optional[str] = None
        self._slice_cap = max(min(self._gstage_bytes // 2, int(slice_bytes)), biggest)
        #: called when a put view is refused for the client's quota of
        #: uncommitted bytes, to let the queued commits run (the caller's)
        self.quota_wait: Optional[Callable[[], None]] = None
        #: one thread at a time uses the copier and the stages (a load and
        #: a save may run on two threads: each takes it per slice)
        self._move_lock = threading.RLock()
        self._mover: Any = None
        self._maps: Any = None
        self._side: Any = None
        if self.gpu:
            from . import kv_gpu

            if kv_gpu.gpu_count() == 0:
                raise ValueError("kvferry chunks: GPU tensors, but this library has no GPU")
            self._kvg = kv_gpu
            self._side = kv_gpu.GpuMem(self.map.base, self.map.end - self.map.base,
                                       _lib.MEM_CUDA, self.map.device)
            self._mover = kv_gpu.GpuMover(self.map.device, sum_mode)

    # -- headers -------------------------------------------------------------

    def _header(self, ch: Chunk, g: int, sums: Any) -> bytes:
        """The header of object (ch, g) with its pieces' checksums (q x blocks)."""
        q = self._batches[g].q
        raw = bytearray(header_bytes(q, ch.blocks))
        _HDR.pack_into(raw, 0, _MAGIC, CHUNK_FORMAT, g, self.groups, 0, ch.blocks, q,
                       self.map.piece_bytes, self._fp_raw, ch.key, 0)
        body = _np().ascontiguousarray(sums, dtype=_np().uint64).tobytes()
        raw[_HDR.size:_HDR.size + len(body)] = body
        struct.pack_into("<Q", raw, _HSUM_AT, _lib.lib().kvf_checksum(bytes(raw), len(raw)))
        return bytes(raw)

    def _parse_header(self, raw: bytes, ch: Chunk, g: int) -> Optional[Any]:
        """The pieces' checksums (q x blocks) of a header read from the
        store, or None when it is not object (ch, g) of this cache or is
        damaged."""
        q = self._batches[g].q
        if len(raw) != header_bytes(q, ch.blocks):
            return None
        magic, ver, gg, groups, _, blocks, qq, plen, fp, key, hsum = _HDR.unpack_from(raw)
        if (magic != _MAGIC or ver != CHUNK_FORMAT or gg != g or groups != self.groups
                or blocks != ch.blocks or qq != q or plen != self.map.piece_bytes
                or fp != self._fp_raw or key != ch.key):
            return None
        zeroed = bytearray(raw)
        struct.pack_into("<Q", zeroed, _HSUM_AT, 0)
        if _lib.lib().kvf_checksum(bytes(zeroed), len(zeroed)) != hsum:
            return None
        np = _np()
        return np.frombuffer(raw, dtype=np.uint64, count=q * blocks,
                             offset=_HDR.size).reshape(q, blocks)

    # -- set-up of the GPU paths --------------------------------------------

    def _stage_init(self) -> None:
        if self._stage_region is not None:
            return
        if self.gpu:
            self._stage = self._kvg.PinnedBuffer(self._stage_bytes)
            self._stage_region = self._stage.register(self.store)
            self._stage_mem = self._stage.mem()
        else:
            self._stage_region = self.store.engine.alloc(self._stage_bytes)

    def _gpu_stage(self) -> Any:
        """The GPU stage (a GpuMem), allocated on first use; None without
        one (or when the GPU has no room: the kernels then reach the pool
        directly)."""
        with self._move_lock:
            if self._gstage is None and self._gstage_bytes:
                try:
                    self._gstage = self._kvg.DeviceBuffer(self._gstage_bytes, self.map.device)
                except KvferryError:
                    self._gstage_bytes = 0
            if self._gstage is not None and self._pipeline and self._pipe is None:
                from .kv_pipe import StagePipe

                self._pipe = StagePipe(self.map.device)
        return self._gstage.mem() if self._gstage is not None else None

    def _segments(self, gst: Any) -> List[Any]:
        """The GPU stage cut in segments of a slice each (at least two, at
        most the posts a copier tells apart), each a GpuMem of its own."""
        n = min(max(2, self._gstage_bytes // self._slice_cap), self._kvg.POSTS)
        size = self._gstage_bytes // n
        return [self._kvg.GpuMem(gst.base + h * size, size, gst.type, gst.device)
                for h in range(n)]

    @staticmethod
    def _stage_slices(rows, size, cap: int):
        """rows cut into slices whose objects fit cap bytes laid end to end:
        lists of (row, offset in the stage); cap 0: one slice, offsets 0."""
        if not cap:
            yield [(r, 0) for r in rows]
            return
        sl, used = [], 0
        for r in rows:
            n = size(r)
            if sl and used + n > cap:
                yield sl
                sl, used = [], 0
            sl.append((r, used))
            used += n
        if sl:
            yield sl

    def _dma(self, src: Any, dst: Any, src_offs, dst_offs, lens, copier: Any = None) -> None:
        """Whole ranges through the copy engines (DMA at the link's rate),
        by copier (default: this store's own)."""
        np = _np()
        (copier or self._mover).copy_plain(src, dst, np.asarray(src_offs, dtype=np.uint64),
                               np.asarray(dst_offs, dtype=np.uint64),
                               np.asarray(lens, dtype=np.uint64))

    def _timed_dma(self, src: Any, dst: Any, src_offs, dst_offs, lens, copier: Any = None,
                   counter: str = "t_dma") -> None:
        """:meth:`_dma`, its seconds added to the stats' counter."""
        t0 = time.perf_counter()
        self._dma(src, dst, src_offs, dst_offs, lens, copier)
        with self._lock:
            setattr(self.stats, counter, getattr(self.stats, counter) + time.perf_counter() - t0)

    def pool_dma_rate(self, nbytes: int = 512 << 20, rounds: int = 3) -> float:
        """GB/s of one plain DMA from the largest pool mapping of the
        store's nodes into the GPU stage (best of rounds): the ceiling of
        the loads that read the pool in place, to compare with a pinned
        buffer's. 0.0 without a GPU, views or a stage."""
        if not self.gpu or not self._want_views or not hasattr(self.store, "view_maps"):
            return 0.0
        maps = [m for m in self.store.view_maps() if m[0]]
        gst = self._gpu_stage()
        if not maps or gst is None:
            return 0.0
        base, length = max(maps, key=lambda m: m[1])
        if not self._kvg.host_mappings(self.store).ensure(base, length):
            return 0.0
        n = min(int(nbytes), length, self._gstage_bytes)
        pool = self._kvg.GpuMem(base, length, _lib.MEM_PINNED, 0)
        best = 0.0
        with self._move_lock:
            for _ in range(rounds):
                t0 = time.perf_counter()
                self._dma(pool, gst, [0], [0], [n])
                best = max(best, n / (time.perf_counter() - t0) / 1e9)
        return best

    def warm(self) -> int:
        """Readies the GPU paths now, so that no first transfer pays for
        them: the GPU stage and its copies (:meth:`_warm_copies`), and every
        mapping of the store's nodes that views and put views can land in
        registered with the GPU (``Store.view_maps``). Returns the mappings
        registered (0 without views)."""
        if self.gpu:
            try:
                self._warm_copies()
            except Exception as e:  # the proven serial path stays
                self.warm_error = "%s: %s" % (type(e).__name__, e)
                self._close_pipe()
        if not self.gpu or not self._want_views or not hasattr(self.store, "view_maps"):
            return 0
        maps = self._kvg.host_mappings(self.store)
        n = 0
        for base, length in self.store.view_maps():
            if maps.ensure(base, length):
                n += 1
        return n

    def _warm_copies(self) -> None:
        """The GPU stage allocated and every copy this store makes run once
        on it (one piece each), so that the first request does not pay for
        the allocation or for loading the kernels."""
        gst = self._gpu_stage()
        if gst is None:
            return
        pb = min(self.map.piece_bytes, self._gstage_bytes // 2)
        with self._move_lock:
            self._mover.copy(gst, gst, [0], [pb], [pb])
            self._dma(gst, gst, [0], [pb], [pb])
            if self._pipe is not None:
                self._pipe.run_in([0], lambda c, _i, _h: c.post_plain(gst, gst, [0], [pb], [pb]),
                                  lambda _i, _h: None)

    # -- load ----------------------------------------------------------------

    def _slices(self, req: LoadReq) -> List[Tuple[Chunk, int, int, List[int]]]:
        """(chunk, j0, j1, cache blocks) of a load: blocks j0..j1 of each
        chunk's objects, covering tokens [start, end)."""
        bs, out = self.block_size, []
        for ch in req.chunks:
            lo = max(req.start, ch.first_token)
            hi = min(req.end, ch.first_token + ch.blocks * bs)
            if hi <= lo:
                continue
            j0, j1 = (lo - ch.first_token) // bs, (hi - ch.first_token) // bs
            out.append((ch, j0, j1, req.block_ids[lo // bs:hi // bs]))
        return out

    def load(self, reqs: Sequence[LoadReq], group_done: Optional[Callable[[int], None]] = None
             ) -> None:
        """Loads every request's tokens [start, end) into its blocks, group
        by group (group_done(g) is called once group g is in the cache,
        whatever its outcome), and sets each request's ``loaded`` (tokens
        verified from start) and ``failed_blocks`` (blocks loaded but not
        verified: the engine must recompute them). Never raises for a
        missing or damaged object or a store error."""
        t0 = time.perf_counter()
        plan = [(r, self._slices(r)) for r in reqs]
        # per request: the first bad block (index into its slices' blocks)
        bad = [sum(j1 - j0 for _, j0, j1, _ in sl) for _, sl in plan]
        done_groups = set()
        try:
            if self._want_views:
                self._load_viewed(plan, bad, group_done, done_groups)
            else:
                self._load_staged(plan, bad, group_done, done_groups)
        except KvferryError:
            with self._lock:
                self.stats.load_errors += 1
            bad = [0] * len(plan)
        finally:
            for g in range(self.groups):
                if g not in done_groups and group_done is not None:
                    group_done(g)
        bs = self.block_size
        for (r, sl), nb in zip(plan, bad):
            blocks = [b for _, _, _, ids in sl for b in ids]
            r.loaded = nb * bs
            r.failed_blocks = blocks[nb:]
        with self._lock:
            self.stats.loaded_tokens += sum(r.loaded for r in reqs)
            self.stats.t_load += time.perf_counter() - t0

    def _flat(self, plan) -> List[Tuple[int, Chunk, int, int, List[int], int]]:
        """(request index, chunk, j0, j1, blocks, first block index in the
        request's load) of every slice."""
        out = []
        for ri, (_, sl) in enumerate(plan):
            at = 0
            for ch, j0, j1, ids in sl:
                out.append((ri, ch, j0, j1, ids, at))
                at += j1 - j0
        return out

    def _note_bad(self, bad: List[int], item, rel_block: int, corrupt: bool) -> None:
        ri, _, _, _, _, at = item
        if at + rel_block < bad[ri]:
            bad[ri] = at + rel_block
        if corrupt:
            with self._lock:
                self.stats.corrupt_misses += 1

    def _load_viewed(self, plan, bad, group_done, done_groups) -> None:
        """GPU cache, objects viewed in the node's pool: per group one
        verifying scatter per mapping."""
        items = self._flat(plan)
        if not items:
            return
        keys = [self.object_key(it[1].key, it[1].blocks, g) for g in range(self.groups)
                for it in items]
        leases = []
        try:
            t0 = time.perf_counter()
            for a in range(0, len(keys), BATCH_MAX):
                leases.append(self.store.view_get(keys[a:a + BATCH_MAX]))
            views = [v for lease in leases for v in lease]
            with self._lock:
                self.stats.t_query += time.perf_counter() - t0
            n = len(items)
            if self._piped_views(views):
                return self._load_viewed_piped(items, views, bad, group_done, done_groups)
            for g in range(self.groups):
                gv = views[g * n:(g + 1) * n]
                if any(v.status == ERR_UNSUPPORTED for v in gv):
                    self._load_group_staged(items, g, bad)
                else:
                    self._load_group_viewed(items, gv, g, bad)
                done_groups.add(g)
                if group_done is not None:
                    group_done(g)
        finally:
            for lease in leases:
                lease.release()

    def _piped_views(self, views) -> bool:
        """May a load of these views run as one pipeline over all groups
        (:meth:`_load_viewed_piped`)? A GPU stage in segments, and every
        view's mapping reachable by the GPU."""
        if not self.gpu or self._pipe is None or self._gpu_stage() is None:
            return False
        if any(v.status == ERR_UNSUPPORTED for v in views):
            return False
        maps = self._kvg.host_mappings(self.store)
        seen = {(v.map_base, v.map_len) for v in views if v.status == OK and v.map_base}
        return all(maps.ensure(b, n) for b, n in seen)

    def _group_rows(self, items, gv, g: int, bad: List[int]):
        """The viewed objects of group g whose header is right, as rows
        (item, offset in the mapping, blocks k, j0, j1, cache blocks,
        expected sums) per mapping base, and each mapping's length; the
        others noted bad."""
        gb = self._batches[g]
        per_map: Dict[int, List[Tuple[Any, int, int, int, int, List[int], Any]]] = {}
        lens: Dict[int, int] = {}
        for it, v in zip(items, gv):
            _, ch, j0, j1, ids, _ = it
            if v.status != OK or v.length != self.map.object_bytes(g, ch.blocks):
                self._note_bad(bad, it, 0, v.status not in (ERR_NO_KEY,))
                continue
            sums = self._parse_header(string_at(v.addr, header_bytes(gb.q, ch.blocks)), ch, g)
            if sums is None:
                self._note_bad(bad, it, 0, True)
                continue
            lens[v.map_base] = v.map_len
            per_map.setdefault(v.map_base, []).append(
                (it, v.addr - v.map_base, ch.blocks, j0, j1, ids, sums[:, j0:j1]))
        return per_map, lens

    def _load_viewed_piped(self, items, views, bad, group_done, done_groups) -> None:
        """Every group's viewed objects through the GPU stage's segments in
        one pipeline: each slice's headers are read and its descriptors
        built while the DMA of the one before runs, and the DMA of the next
        group's first slice overlaps the scatter of this group's last.
        group_done(g) runs once group g's last slice is scattered."""
        gst, n = self._gpu_stage(), len(items)
        segs = self._segments(gst)

        def slices():
            for g in range(self.groups):
                gb, gv = self._batches[g], views[g * n:(g + 1) * n]
                # headers read a slice's worth at a time, between DMAs
                per = max(1, self._slice_cap // self.map.object_bytes(g, self.bpc))
                for a in range(0, n, per):
                    per_map, lens = self._group_rows(items[a:a + per], gv[a:a + per], g, bad)
                    for base, rows in per_map.items():
                        pool = self._kvg.GpuMem(base, lens[base], _lib.MEM_PINNED, 0)
                        for sl, local, objs, cache in self._staged_rows(gb, rows, g, gst,
                                                                       self._slice_cap):
                            yield g, pool, sl, [(r[0], o, c, r[6])
                                                for r, o, c in zip(local, objs, cache)]
                    with self._lock:
                        self.stats.viewed_objects += sum(len(r) for r in per_map.values())
                yield g, None, [], []  # the group's end

        def dma_in(copier: Any, item: Any, h: int) -> Any:
            g, pool, sl, _ = item
            if not sl:
                return None
            return copier.post_plain(pool, segs[h], [r[1] for r, _ in sl],
                                     [off for _, off in sl],
                                     [self.map.object_bytes(g, r[2]) for r, _ in sl])

        def work(item: Any, h: int) -> None:
            g, _, sl, full = item
            if sl:
                return self._scatter(segs[h], full, bad)
            done_groups.add(g)
            if group_done is not None:
                group_done(g)

        with self._move_lock:
            try:
                self._pipe.run_in(slices(), dma_in, work, len(segs))
            finally:
                with self._lock:  # the DMAs' span: posted back to back
                    self.stats.t_dma += self._pipe.span_s

    def _load_group_viewed(self, items, gv, g: int, bad: List[int]) -> None:
        gb = self._batches[g]
        maps = self._kvg.host_mappings(self.store) if self.gpu else None
        per_map, lens = self._group_rows(items, gv, g, bad)
        for base in list(lens):
            if maps is not None and not maps.ensure(base, lens[base]):
                # the GPU refused the mapping: this process copies instead
                self._want_views = self._want_put_views = False
                return self._load_group_staged(items, g, bad)
        for base, rows in per_map.items():
            if self.gpu:
                self._scatter_from_pool(gb, rows, base, lens[base], bad, g)
                continue
            objs, cache = self._descriptors(gb, rows)
            full = [(r[0], o, c, r[6]) for r, o, c in zip(rows, objs, cache)]
            self._host_scatter(full, bad, base)
        with self._lock:
            self.stats.viewed_objects += sum(len(r) for r in per_map.values())

    def _scatter_from_pool(self, gb: "_GroupBatch", rows, base: int, maplen: int,
                           bad: List[int], g: int) -> None:
        """GPU: the rows' objects moved whole from the pool into the GPU
        stage by the copy engines, then scattered into the cache by the
        verifying kernel (GPU to GPU); without a stage the kernel reads
        the mapping directly."""
        pool = self._kvg.GpuMem(base, maplen, _lib.MEM_PINNED, 0)
        gst = self._gpu_stage()
        for sl, local, objs, cache in self._staged_rows(gb, rows, g, gst):
            full = [(r[0], o, c, r[6]) for r, o, c in zip(local, objs, cache)]
            with self._move_lock:
                if gst is not None:
                    self._timed_dma(pool, gst, [r[1] for r, _ in sl], [off for _, off in sl],
                                    [self.map.object_bytes(g, r[2]) for r, _ in sl])
                self._scatter(gst if gst is not None else pool, full, bad)

    def _staged_rows(self, gb: "_GroupBatch", rows, g: int, gst: Any, cap: int = 0):
        """rows (tag, offset in the pool mapping, k, j0, j1, blocks, ...) in
        slices that fit the GPU stage (or cap bytes): per slice (row, stage
        offset) pairs, the rows with their objects' offsets where the copy
        finds them (the stage, or the mapping without one), and their
        descriptors."""
        cap = 0 if gst is None else (cap or self._gstage_bytes)
        for sl in self._stage_slices(rows, lambda r: self.map.object_bytes(g, r[2]), cap):
            local = [(r[0], off if gst is not None else r[1]) + tuple(r[2:]) for r, off in sl]
            objs, cache = self._descriptors(gb, local)
            yield sl, local, objs, cache

    def _descriptors(self, gb: _GroupBatch, rows) -> Tuple[List[Any], List[Any]]:
        """Per row (tag, object offset, blocks k, j0, j1, cache blocks, ...):
        the (q, j1-j0) offsets of its pieces in the object's mapping and in
        the cache, computed for all rows of one shape at once."""
        np = _np()
        shapes: Dict[Tuple[int, int, int], List[int]] = {}
        for i, r in enumerate(rows):
            shapes.setdefault((r[2], r[3], r[4]), []).append(i)
        objs: List[Any] = [None] * len(rows)
        cache: List[Any] = [None] * len(rows)
        for (k, j0, j1), idx in shapes.items():
            o = gb.object_offsets(k, j0, j1)
            bases = np.asarray([rows[i][1] for i in idx], dtype=np.uint64)
            ob = o[None, :, :] + bases[:, None, None]
            cb = gb.cache_offsets([rows[i][5] for i in idx])
            for n, i in enumerate(idx):
                objs[i], cache[i] = ob[n], cb[n]
        return objs, cache

    def _scatter(self, src_mem: Any, rows, bad: List[int]) -> None:
        """One verifying copy of rows (item, src offsets, dst offsets,
        expected sums, _) from src_mem into the cache."""
        np = _np()
        src = np.concatenate([r[1].reshape(-1) for r in rows])
        dst = np.concatenate([r[2].reshape(-1) for r in rows])
        exp = np.concatenate([r[3].reshape(-1) for r in rows]).astype(np.uint64)
        lens = np.full(len(src), self.map.piece_bytes, dtype=np.uint64)
        t0 = time.perf_counter()
        st, sums = self._mover.copy(src_mem, self._side, src, dst, lens, expect=exp)
        t_scatter = time.perf_counter() - t0
        nbytes = int(lens.sum())
        if st != OK:
            sums = np.asarray(sums, dtype=np.uint64)
            at = 0
            for it, s, _, e in rows:
                cnt = s.size
                wrong = np.nonzero(sums[at:at + cnt].reshape(e.shape) != e)
                if len(wrong[1]):
                    self._note_bad(bad, it, int(wrong[1].min()), True)
                at += cnt
        with self._lock:
            self.stats.bytes_loaded += nbytes
            self.stats.t_scatter += t_scatter

    def _load_staged(self, plan, bad, group_done, done_groups) -> None:
        items = self._flat(plan)
        for g in range(self.groups):
            if items:
                self._load_group_staged(items, g, bad)
            done_groups.add(g)
            if group_done is not None:
                group_done(g)

    def _load_group_staged(self, items, g: int, bad: List[int]) -> None:
        """Objects of group g read whole into the stage (store batches of
        what fits), then scattered into the cache (verified)."""
        self._stage_init()
        sizes = [self.map.object_bytes(g, it[1].blocks) for it in items]
        a = 0
        while a < len(items):
            b, used = a, 0
            while b < len(items) and b - a < BATCH_MAX and used + sizes[b] <= self._stage_bytes:
                used += sizes[b]
                b += 1
            self._stage_round(items[a:b], sizes[a:b], g, bad)
            a = b

    def _stage_round(self, items, sizes, g: int, bad: List[int]) -> None:
        with self._move_lock:
            self._stage_round_locked(items, sizes, g, bad)

    def _stage_round_locked(self, items, sizes, g: int, bad: List[int]) -> None:
        np = _np()
        gb = self._batches[g]
        offs = [0]
        for s in sizes[:-1]:
            offs.append(offs[-1] + s)
        keys = [self.object_key(it[1].key, it[1].blocks, g) for it in items]
        spans = [(self._stage_region, o, s) for o, s in zip(offs, sizes)]
        if self.gpu:  # the scatter verifies every piece: no host hash
            got, _ = self.store.get_batch_sums(keys, spans)
        else:  # the store verifies each object, the scatter each piece
            got = self.store.get_batch(keys, spans, check=False)
        rows = []
        for it, o, s, n in zip(items, offs, sizes, got):
            _, ch, j0, j1, ids, _ = it
            if n != s:
                self._note_bad(bad, it, 0, n != ERR_NO_KEY)
                continue
            hdr = string_at(self._stage_region.addr + o, header_bytes(gb.q, ch.blocks))
            sums = self._parse_header(hdr, ch, g)
            if sums is None:
                self._note_bad(bad, it, 0, True)
                continue
            src = gb.object_offsets(ch.blocks, j0, j1) + np.uint64(o)
            rows.append((it, src, gb.cache_offsets([ids])[0], sums[:, j0:j1]))
        if not rows:
            return
        if self.gpu:
            self._scatter(self._stage_mem, rows, bad)
        else:
            self._host_scatter(rows, bad, self._stage_region.addr)

    def _host_scatter(self, rows, bad: List[int], sa: int) -> None:
        """Host cache: each piece (at sa + its source offset: the stage or a
        view's mapping) checked against its header checksum, then copied
        (a mismatch ends its request's hit there)."""
        np = _np()
        plen, base, nbytes = self.map.piece_bytes, self.map.base, 0
        cks = _lib.lib().kvf_checksum
        for it, src, dst, exp in rows:
            got = np.asarray([cks(sa + o, plen) for o in src.reshape(-1).tolist()],
                             dtype=np.uint64).reshape(exp.shape)
            wrong = np.nonzero(got != exp)
            if len(wrong[1]):
                self._note_bad(bad, it, int(wrong[1].min()), True)
            for s_off, d_off in zip(src.reshape(-1).tolist(), dst.reshape(-1).tolist()):
                memmove(base + d_off, sa + s_off, plen)
            nbytes += src.size * plen
        with self._lock:
            self.stats.bytes_loaded += nbytes

    # -- save ----------------------------------------------------------------

    def save_items(self, reqs: Sequence[SaveReq]) -> List[Tuple[Chunk, List[int]]]:
        """(chunk, its cache blocks) of every chunk to save."""
        out = []
        bs = self.block_size
        for r in reqs:
            for ch in r.chunks:
                b0 = ch.first_token // bs
                out.append((ch, list(r.block_ids[b0:b0 + ch.blocks])))
        return out

    def save(self, reqs: Sequence[SaveReq], group_ready: Optional[Callable[[int], None]] = None,
             on_commit: Optional[Callable[[Callable[[], int]], None]] = None) -> Callable[[], int]:
        """Saves the requests' chunks, group by group (group_ready(g) is
        called before group g's blocks are read: it waits until the
        engine wrote them). Each group's commit, which makes its objects
        visible and returns how many were stored, goes to on_commit (to
        run on any thread, e.g. after the step); without on_commit they are
        returned as one callable. A chunk already stored is skipped; a
        save that fails is a later miss, never an error."""
        t0 = time.perf_counter()
        items = self.save_items(reqs)
        commits: List[Callable[[], int]] = []
        sink = on_commit if on_commit is not None else commits.append
        try:
            if items and self._want_put_views:
                self._save_viewed(items, group_ready, sink)
            elif items:
                self._save_staged(items, group_ready, sink)
        except KvferryError:
            with self._lock:
                self.stats.save_errors += 1
        with self._lock:
            self.stats.t_save += time.perf_counter() - t0
        return lambda: sum(c() for c in commits)

    def _save_viewed(self, items, group_ready, on_commit) -> None:
        """Per group, once its blocks are written: put views for its objects
        (one master round trip), the gathering copies straight into the
        node's pool, the headers; its commit (the store's checksum of each
        object, PUT_END) goes to on_commit at once, so that the objects a
        client holds uncommitted (the master's per-client quota) stay
        about one group's worth."""
        fallback: set = set()
        for g in range(self.groups):
            if group_ready is not None:
                t0 = time.perf_counter()
                group_ready(g)
                with self._lock:
                    self.stats.t_save_wait += time.perf_counter() - t0
            keys = [self.object_key(ch.key, ch.blocks, g) for ch, _ in items]
            lens = [self.map.object_bytes(g, ch.blocks) for ch, _ in items]
            pvs = self._put_views(keys, lens)
            try:
                views = [v for pv in pvs for v in pv]
                keep = [0] * len(views)
                self._save_group_viewed(items, views, keep, fallback, g)
            except BaseException:
                for pv in pvs:
                    pv.abort()
                raise
            on_commit(self._commit_of(pvs, keep))
        if fallback:
            self._save_staged([items[i] for i in sorted(fallback)], None, on_commit)

    def _put_views(self, keys: List[str], lens: List[int]) -> List[Any]:
        """Put views of keys; keys refused for the client's quota of
        uncommitted bytes are asked again once, after the commits queued
        before them had time to run (quota_wait)."""
        pvs = [self.store.view_put(keys[a:a + BATCH_MAX], lens[a:a + BATCH_MAX],
                                   replicas=self.replicas)
               for a in range(0, len(keys), BATCH_MAX)]
        again = [i for i, v in enumerate(v for pv in pvs for v in pv) if v.status == ERR_QUOTA]
        if not again or self.quota_wait is None:
            return pvs
        self.quota_wait()
        more = self.store.view_put([keys[i] for i in again], [lens[i] for i in again],
                                   replicas=self.replicas)
        with self._lock:
            self.stats.quota_retries += 1
        return pvs + [more]

    def _commit_of(self, pvs: List[Any], keep: List[int]) -> Callable[[], int]:
        bounds = [0]
        for pv in pvs:
            bounds.append(bounds[-1] + len(pv))

        def commit() -> int:
            t1 = time.perf_counter()
            stored = 0
            for k, pv in enumerate(pvs):
                kp = keep[bounds[k]:bounds[k + 1]]
                sts = pv.commit(sums=_object_sums(pv, kp), keep=kp)
                stored += sum(1 for s, x in zip(sts, kp) if x and s == OK)
            with self._lock:
                self.stats.saved_objects += stored
                self.stats.put_viewed_objects += stored
                self.stats.t_commit += time.perf_counter() - t1
                if stored < sum(keep):
                    self.stats.save_errors += 1
            return stored

        return commit

    def _save_group_viewed(self, items, views, keep, fallback, g: int) -> None:
        """Group g of a viewed save: the gathering copies, the headers.
        views[i] (and keep[i]) belong to items[i], a key asked again for
        the quota to items[i - len(items)] past the first round."""
        gb = self._batches[g]
        maps = self._kvg.host_mappings(self.store) if self.gpu else None
        per_map: Dict[int, List[Tuple[int, int, int, int, int, List[int]]]] = {}
        lens: Dict[int, int] = {}
        n = len(items)
        again = [i for i, v in enumerate(views[:n]) if v.status == ERR_QUOTA]
        retried = len(views) > n  # the quota's refusals were asked again
        owner = list(range(n)) + (again if retried else [])
        for vi, v in enumerate(views):
            i = owner[vi]
            ch, ids = items[i]
            if v.status == OK and v.map_base not in lens:
                if maps is not None and not maps.ensure(v.map_base, v.map_len):
                    fallback.add(i)
                    continue
                lens[v.map_base] = v.map_len
            if v.status == ERR_UNSUPPORTED:
                fallback.add(i)
                continue
            if v.status != OK:  # stored already (EXISTS), over quota, refused
                with self._lock:
                    if v.status == ERR_EXISTS:
                        self.stats.skipped_objects += 1
                    elif not (retried and v.status == ERR_QUOTA and vi < n):
                        self.stats.refused_objects += 1
                continue
            per_map.setdefault(v.map_base, []).append((vi, v.addr - v.map_base, ch.blocks, 0,
                                                       ch.blocks, ids))
        for base, rows in per_map.items():
            if self.gpu:
                self._gather_to_pool(gb, rows, base, lens[base], views, items, owner, keep, g)
                continue
            objs, cache = self._descriptors(gb, rows)
            full = [(r[0], c, o) for r, o, c in zip(rows, objs, cache)]
            for vi, sums in self._host_gather(full, base):
                hdr = self._header(items[owner[vi]][0], g, sums)
                memmove(views[vi].addr, hdr, len(hdr))
                keep[vi] = 1

    def _gather_to_pool(self, gb: "_GroupBatch", rows, base: int, maplen: int, views, items,
                        owner, keep, g: int) -> None:
        """GPU: the rows' pieces gathered (checksummed) from the cache into
        the objects in the pool: through the GPU stage and the copy
        engines (a whole object per DMA) where there is one, else by the
        kernel writing the mapping directly. Headers written by the host."""
        pool = self._kvg.GpuMem(base, maplen, _lib.MEM_PINNED, 0)
        gst = self._gpu_stage()
        if gst is not None and self._pipe is not None:
            return self._gather_piped(gb, rows, pool, gst, views, items, owner, keep, g)
        for sl, local, objs, cache in self._staged_rows(gb, rows, g, gst):
            full = [(r[0], c, o) for r, o, c in zip(local, objs, cache)]
            with self._move_lock:
                for vi, sums in self._gather(self._side, gst if gst is not None else pool, full):
                    hdr = self._header(items[owner[vi]][0], g, sums)
                    memmove(views[vi].addr, hdr, len(hdr))
                    keep[vi] = 1
                if gst is not None:  # the data of each object, stage -> pool
                    hb = [header_bytes(gb.q, r[2]) for r, _ in sl]
                    self._timed_dma(gst, pool, [off + h for (_, off), h in zip(sl, hb)],
                                    [r[1] + h for (r, _), h in zip(sl, hb)],
                                    [self.map.object_bytes(g, r[2]) - h
                                     for (r, _), h in zip(sl, hb)], counter="t_dma_out")

    def _gather_piped(self, gb: "_GroupBatch", rows, pool: Any, gst: Any, views, items, owner,
                      keep, g: int) -> None:
        """_gather_to_pool through the stage's segments: the next slice is
        gathered while this one's DMA runs."""
        segs = self._segments(gst)

        def work(item: Any, h: int) -> None:
            for vi, sums in self._gather(self._side, segs[h], item[1]):
                hdr = self._header(items[owner[vi]][0], g, sums)
                memmove(views[vi].addr, hdr, len(hdr))
                keep[vi] = 1

        def dma_out(copier: Any, item: Any, h: int) -> Any:
            sl = item[0]
            hb = [header_bytes(gb.q, r[2]) for r, _ in sl]
            return copier.post_plain(segs[h], pool, [off + n for (_, off), n in zip(sl, hb)],
                                     [r[1] + n for (r, _), n in zip(sl, hb)],
                                     [self.map.object_bytes(g, r[2]) - n
                                      for (r, _), n in zip(sl, hb)])

        def slices():
            for sl, local, objs, cache in self._staged_rows(gb, rows, g, gst, self._slice_cap):
                yield sl, [(r[0], c, o) for r, o, c in zip(local, objs, cache)]

        with self._move_lock:
            try:
                self._pipe.run_out(slices(), work, dma_out, len(segs))
            finally:
                with self._lock:
                    self.stats.t_dma_out += self._pipe.span_s

    def _gather(self, src_mem: Any, dst_mem: Any, rows):
        """One checksumming copy of rows (tag, cache offsets, object
        offsets, ...) from the cache; yields (tag, sums q x blocks)."""
        np = _np()
        src = np.concatenate([r[1].reshape(-1) for r in rows])
        dst = np.concatenate([r[2].reshape(-1) for r in rows])
        lens = np.full(len(src), self.map.piece_bytes, dtype=np.uint64)
        t0 = time.perf_counter()
        _, sums = self._mover.copy(src_mem, dst_mem, src, dst, lens)
        with self._lock:
            self.stats.t_gather += time.perf_counter() - t0
        sums = np.asarray(sums, dtype=np.uint64)
        at = 0
        for r in rows:
            cnt = r[1].size
            yield r[0], sums[at:at + cnt].reshape(r[1].shape)
            at += cnt
        with self._lock:
            self.stats.bytes_saved += int(lens.sum())

    def _save_staged(self, items, group_ready, on_commit) -> None:
        """Objects built in the stage (a gathering copy on the GPU, numpy on
        the host) and put with store batches, group by group (on_commit is
        told how many were stored)."""
        self._stage_init()
        stored = 0
        for g in range(self.groups):
            if group_ready is not None:
                group_ready(g)
            sizes = [self.map.object_bytes(g, ch.blocks) for ch, _ in items]
            a = 0
            while a < len(items):
                b, used = a, 0
                while b < len(items) and b - a < BATCH_MAX and used + sizes[b] <= self._stage_bytes:
                    used += sizes[b]
                    b += 1
                stored += self._save_round(items[a:b], sizes[a:b], g)
                a = b
        with self._lock:
            self.stats.saved_objects += stored
        on_commit(lambda: stored)

    def _save_round(self, items, sizes, g: int) -> int:
        with self._move_lock:
            return self._save_round_locked(items, sizes, g)

    def _save_round_locked(self, items, sizes, g: int) -> int:
        np = _np()
        gb = self._batches[g]
        offs = [0]
        for s in sizes[:-1]:
            offs.append(offs[-1] + s)
        rows = [(i, gb.cache_offsets([ids])[0],
                 gb.object_offsets(ch.blocks, 0, ch.blocks) + np.uint64(o))
                for i, ((ch, ids), o) in enumerate(zip(items, offs))]
        if self.gpu:
            gathered = list(self._gather(self._side, self._stage_mem, rows))
        else:
            gathered = self._host_gather(rows, self._stage_region.addr)
        for i, sums in gathered:
            hdr = self._header(items[i][0], g, sums)
            memmove(self._stage_region.addr + offs[i], hdr, len(hdr))
        keys = [self.object_key(ch.key, ch.blocks, g) for ch, _ in items]
        spans = [(self._stage_region, o, s) for o, s in zip(offs, sizes)]
        sts = self.store.put_batch(keys, spans, replicas=self.replicas, check=False)
        with self._lock:
            self.stats.skipped_objects += sum(1 for s in sts if s == ERR_EXISTS)
            if any(s not in (OK, ERR_EXISTS) for s in sts):
                self.stats.save_errors += 1
        return sum(1 for s in sts if s == OK)

    def _host_gather(self, rows, sa: int):
        """Host cache: pieces copied one by one to sa + their object offsets
        (the stage or a put view's mapping), each piece's checksum computed
        on the host."""
        np = _np()
        plen, base = self.map.piece_bytes, self.map.base
        cks = _lib.lib().kvf_checksum
        out = []
        for tag, src, dst in rows:
            sums = []
            for s_off, d_off in zip(src.reshape(-1).tolist(), dst.reshape(-1).tolist()):
                memmove(sa + d_off, base + s_off, plen)
                sums.append(cks(sa + d_off, plen))
            out.append((tag, np.asarray(sums, dtype=np.uint64).reshape(src.shape)))
            with self._lock:
                self.stats.bytes_saved += src.size * plen
        return out

    # -- housekeeping ----------------------------------------------------------

    def remove(self, chunks: Sequence[Chunk]) -> None:
        """Removes the chunks' objects (a damaged chunk, so that a later save
        writes it anew); errors are ignored."""
        keys = [k for c in chunks for k in self._object_keys(c)]
        for a in range(0, len(keys), BATCH_MAX):
            try:
                self.store.remove_batch(keys[a:a + BATCH_MAX], check=False)
            except KvferryError:
                return

    def _close_pipe(self) -> None:
        with self._move_lock:
            if self._pipe is not None:
                self._pipe.close()
                self._pipe = None
            self._pipeline = False

    def close(self) -> None:
        """Frees the stages and the copiers (the store stays open)."""
        self._close_pipe()
        if self._gstage is not None:
            self._gstage.close()
            self._gstage = None
        if self._stage is not None:
            self._stage.close()
            self._stage = None
        elif self._stage_region is not None:
            try:
                self._stage_region.deregister()
            except Exception:
                pass
        self._stage_region = None
        if self._mover is not None:
            self._mover.close()
            self._mover = None


__all__ = ["ChunkStore", "CacheMap", "Chunk", "LoadReq", "SaveReq", "ChunkStats", "Part",
           "layer_parts", "header_bytes", "tail_key", "chain_seed", "CHUNK_TOKENS",
           "LAYER_GROUPS", "CHUNK_FORMAT"]
