"""A KV layer for serving engines: paged KV caches saved to and loaded
from the kvferry store, block by block, verified.

- :class:`KVLayout` describes a paged cache (vLLM's per-layer
  ``[2, num_blocks, block_size, num_kv_heads, head_dim]``, SGLang's
  page-first host pool, LMCache's 256-token chunks, MLA's single latent)
  and where each block's bytes lie (:meth:`KVLayout.spans`).
- :meth:`KVLayout.fingerprint` hashes everything that decides the bytes
  of a block (model, dtype, layout kind and version, geometry, tensor
  parallel rank); it is part of every key, so a cache built under
  another layout is a miss, never wrong bytes.
- :func:`chunk_keys` chains SHA-256 over each chunk's token ids from the
  previous chunk's key, so key ``i`` names the whole prefix up to chunk
  ``i``.
- :class:`KVCache` saves and loads a request's blocks as batches of
  scattered blocks through :meth:`Store.put_batch`/:meth:`Store.get_batch`
  straight from and into the cache's registered memory (no copies).
  Host caches are numpy arrays, bytearrays or any writable buffer. GPU
  caches (torch CUDA tensors) are staged through pinned host memory
  registered with the store: one kernel gathers a batch of scattered
  blocks into it and computes every block's checksum on the way (save),
  one kernel scatters them back and checks each against the manifest
  (load: the store reads the next slice into the other half of the
  stage meanwhile, without hashing it on the host -- the kernel's check
  is the verification); see :mod:`kvferry.kv_gpu`. Where the library has no GPU
  kernels (or with ``gpu_stage=False``) they go through the store's
  device-memory path (KVF_STORE_DEVICE_MEM), checked with
  ``kvf_gpu_checksum``.
- :class:`LocalKVCache` keeps chunks in the process's own pinned host
  memory (the local tier; same methods as :class:`KVCache`), moved and
  verified by the same kernels.

Every chunk has a manifest object (its fingerprint, chunk key and the
checksum of each of its pieces), written after its pieces: a chunk is
complete when its manifest is. A load reads the manifests, then the
pieces, and verifies each piece's size and checksum against the
manifest (the store has already verified its own checksum); the first
chunk that fails ends the hit, counted in ``stats.corrupt_misses``, so
the engine recomputes from there. A load never raises for a missing or
corrupted block.

Neither numpy nor torch is imported here.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import threading
import time
from array import array
from ctypes import byref, c_size_t, c_uint64, c_void_p
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from . import _lib, config
from .engine import Region
from .errors import ERR_CHECKSUM, ERR_EXISTS, ERR_NO_KEY, ERR_UNSUPPORTED, OK, KvferryError
from .store import BATCH_MAX, Store

#: Version of the key and manifest format and of the layouts' byte maps.
LAYOUT_VERSION = 1
#: LMCache's default chunk, in tokens.
LMCACHE_CHUNK = 256

KINDS = ("vllm", "sglang", "lmcache", "mla")

_DTYPE_SIZES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1,
    "float8_e5m2": 1, "int8": 1, "uint8": 1, "fp8": 1, "float64": 8,
}

_MAGIC = b"KVFM"
_HDR = struct.Struct("<4sII16s32s")  # magic, version, npieces, fingerprint, chunk key


def dtype_size(dtype: str) -> int:
    """Bytes of one element of dtype (a name such as "bfloat16", or
    "torch.bfloat16")."""
    name = str(dtype).replace("torch.", "")
    try:
        return _DTYPE_SIZES[name]
    except KeyError:
        raise ValueError("kvferry.kv: unknown dtype %r" % dtype) from None


@dataclass(frozen=True)
class KVLayout:
    """A paged KV cache's geometry and byte layout.

    kind:
      - ``"vllm"``: one buffer per layer, ``[2, num_blocks, block_size,
        num_kv_heads, head_dim]``; a block is 2 pieces per layer (K, V).
      - ``"mla"``: one buffer per layer, ``[num_blocks, block_size,
        head_dim]`` (head_dim = latent + rope dims, num_kv_heads = 1);
        1 piece per layer.
      - ``"sglang"``: one host pool, page-first ``[2, num_blocks,
        num_layers, block_size, num_kv_heads, head_dim]``: a page's K
        (and V) for all layers is contiguous; 2 pieces per page.
      - ``"lmcache"``: one pool of chunks ``[num_blocks, 2, num_layers,
        block_size, num_kv_heads * head_dim]`` (LMCache's KV_2LTD memory
        object; block_size = 256 by default); 1 piece per chunk.

    A block (page, chunk) of ``block_size`` tokens is the unit of keys.
    """

    kind: str
    model: str
    dtype: str
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    tp_rank: int = 0
    tp_size: int = 1
    version: int = LAYOUT_VERSION
    extra: Tuple[Tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError("kvferry.kv: layout kind is one of %s, got %r" % (KINDS, self.kind))
        for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError("kvferry.kv: %s must be positive" % name)
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError("kvferry.kv: tp_rank must lie in [0, tp_size)")
        if self.kind == "mla" and self.num_kv_heads != 1:
            raise ValueError("kvferry.kv: an MLA layout has one latent head")
        object.__setattr__(self, "dtype", str(self.dtype).replace("torch.", ""))
        dtype_size(self.dtype)

    # -- constructors ------------------------------------------------------

    @classmethod
    def vllm(cls, model: str, dtype: str, num_layers: int, num_blocks: int, block_size: int,
             num_kv_heads: int, head_dim: int, tp_rank: int = 0, tp_size: int = 1) -> "KVLayout":
        return cls("vllm", model, dtype, num_layers, num_blocks, block_size, num_kv_heads,
                   head_dim, tp_rank, tp_size)

    @classmethod
    def mla(cls, model: str, dtype: str, num_layers: int, num_blocks: int, block_size: int,
            latent_dim: int, tp_rank: int = 0, tp_size: int = 1) -> "KVLayout":
        return cls("mla", model, dtype, num_layers, num_blocks, block_size, 1, latent_dim,
                   tp_rank, tp_size)

    @classmethod
    def sglang(cls, model: str, dtype: str, num_layers: int, num_pages: int, page_size: int,
               num_kv_heads: int, head_dim: int, tp_rank: int = 0, tp_size: int = 1) -> "KVLayout":
        return cls("sglang", model, dtype, num_layers, num_pages, page_size, num_kv_heads,
                   head_dim, tp_rank, tp_size)

    @classmethod
    def lmcache(cls, model: str, dtype: str, num_layers: int, num_chunks: int,
                num_kv_heads: int, head_dim: int, chunk_size: int = LMCACHE_CHUNK,
                tp_rank: int = 0, tp_size: int = 1) -> "KVLayout":
        return cls("lmcache", model, dtype, num_layers, num_chunks, chunk_size, num_kv_heads,
                   head_dim, tp_rank, tp_size)

    # -- geometry ----------------------------------------------------------

    @property
    def elt_size(self) -> int:
        return dtype_size(self.dtype)

    @property
    def token_bytes(self) -> int:
        """Bytes of one token of one layer's K (or of the MLA latent)."""
        return self.num_kv_heads * self.head_dim * self.elt_size

    @property
    def num_buffers(self) -> int:
        """How many buffers hold the cache (one per layer, or one pool)."""
        return self.num_layers if self.kind in ("vllm", "mla") else 1

    def buffer_bytes(self) -> int:
        """Bytes of each buffer."""
        per_block = self.block_size * self.token_bytes
        if self.kind == "vllm":
            return 2 * self.num_blocks * per_block
        if self.kind == "mla":
            return self.num_blocks * per_block
        return 2 * self.num_blocks * self.num_layers * per_block

    def buffer_shape(self) -> Tuple[int, ...]:
        """Shape of each buffer, in elements (for allocating one)."""
        b, t, h, d, n = self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim, self.num_layers
        return {
            "vllm": (2, b, t, h, d),
            "mla": (b, t, d),
            "sglang": (2, b, n, t, h, d),
            "lmcache": (b, 2, n, t, h * d),
        }[self.kind]

    def spans(self, block: int) -> List[Tuple[str, int, int, int]]:
        """The pieces of one block: (name, buffer index, offset, length)."""
        if not 0 <= block < self.num_blocks:
            raise ValueError("kvferry.kv: block %d outside [0, %d)" % (block, self.num_blocks))
        blk = self.block_size * self.token_bytes
        if self.kind == "vllm":
            half = self.num_blocks * blk
            out = []
            for layer in range(self.num_layers):
                out.append(("L%dk" % layer, layer, block * blk, blk))
                out.append(("L%dv" % layer, layer, half + block * blk, blk))
            return out
        if self.kind == "mla":
            return [("L%d" % layer, layer, block * blk, blk) for layer in range(self.num_layers)]
        page = blk * self.num_layers
        if self.kind == "sglang":
            half = self.num_blocks * page
            return [("k", 0, block * page, page), ("v", 0, half + block * page, page)]
        return [("c", 0, block * 2 * page, 2 * page)]

    @property
    def pieces_per_block(self) -> int:
        return {"vllm": 2 * self.num_layers, "mla": self.num_layers, "sglang": 2, "lmcache": 1}[self.kind]

    # -- identity ----------------------------------------------------------

    def describe(self) -> Dict[str, Any]:
        """Everything that decides a block's bytes (not num_blocks: the
        pool's size does not change a block)."""
        d = asdict(self)
        d.pop("num_blocks")
        d["extra"] = sorted([list(kv) for kv in self.extra])
        return d

    def fingerprint(self) -> str:
        """32 hex digits of SHA-256 over :meth:`describe` (canonical JSON)."""
        blob = json.dumps(self.describe(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:32]


# the keys of the last few token sequences (the packed tokens are the key)
_KEY_MEMO: Dict[Tuple[bytes, int, str], List[bytes]] = {}
_KEY_MEMO_MAX = 16


def chunk_keys(tokens: Sequence[int], chunk_size: int, fingerprint: str = "",
               full_only: bool = True) -> List[bytes]:
    """Chained SHA-256 digests (32 bytes each) of the token chunks.

    Key i = sha256(key i-1 || token ids of chunk i as little-endian
    int64); key -1 = sha256("kvferry-kv" || version || fingerprint), so
    the chain is stable across processes (no Python hash seeds) and
    differs between layouts. Only full chunks are keyed unless full_only
    is False.
    """
    if chunk_size <= 0:
        raise ValueError("kvferry.kv: chunk_size must be positive")
    if isinstance(tokens, list):
        toks = tokens
    else:
        toks = list(tokens) if not hasattr(tokens, "tolist") else tokens.tolist()
    n = len(toks) // chunk_size if full_only else -(-len(toks) // chunk_size)
    prev = hashlib.sha256(b"kvferry-kv\0%d\0%s" % (LAYOUT_VERSION, fingerprint.encode())).digest()
    # every token as a little-endian int64, packed once
    arr = array("q", toks[: n * chunk_size])
    if sys.byteorder != "little":
        arr.byteswap()
    raw, step = arr.tobytes(), 8 * chunk_size
    memo = (raw, chunk_size, fingerprint)
    hit = _KEY_MEMO.get(memo)
    if hit is not None:  # a lookup, load and save of one request hash once
        return list(hit)
    out = []
    for i in range(n):
        h = hashlib.sha256(prev)
        h.update(raw[i * step:(i + 1) * step])
        prev = h.digest()
        out.append(prev)
    if len(_KEY_MEMO) >= _KEY_MEMO_MAX:
        _KEY_MEMO.clear()
    _KEY_MEMO[memo] = out
    return list(out)


@dataclass
class KVStats:
    """Counters of a :class:`KVCache` (since it was made)."""

    lookups: int = 0
    hit_chunks: int = 0
    miss_chunks: int = 0
    corrupt_misses: int = 0
    saved_chunks: int = 0
    skipped_chunks: int = 0
    loaded_chunks: int = 0
    bytes_saved: int = 0
    bytes_loaded: int = 0
    save_errors: int = 0
    load_errors: int = 0
    #: pieces a GPU load read in place from a node's pool (store views),
    #: without the copy into the pinned stage
    viewed_pieces: int = 0
    #: seconds spent, GPU staging path: manifests / index (query), store
    #: reads into the stage (read), the verifying H2D scatter (h2d), the
    #: checksumming D2H gather (d2h), store writes from the stage (write)
    t_query: float = 0.0
    t_read: float = 0.0
    t_h2d: float = 0.0
    t_d2h: float = 0.0
    t_write: float = 0.0


def _gpu_checksum(addr: int, n: int) -> Optional[int]:
    """kvf_gpu_checksum of device memory, None where GPUs are absent."""
    dll = _lib.lib()
    fn = dll.kvf_gpu_checksum
    if fn.argtypes is None:
        fn.restype = _lib.status_t
        fn.argtypes = [c_void_p, c_size_t, c_void_p]
    out = c_uint64(0)
    if fn(addr, n, byref(out)) != OK:
        return None
    return out.value


def layer_rows(layout: KVLayout, layers: Optional[Sequence[int]]) -> List[int]:
    """The pieces of a block (indices into :meth:`KVLayout.spans`) that
    hold layers (all pieces when None). Only per-layer layouts (vllm,
    MLA) can be split by layer."""
    npc = layout.pieces_per_block
    if layers is None:
        return list(range(npc))
    if layout.kind not in ("vllm", "mla"):
        raise ValueError("kvferry.kv: loading by layer needs a per-layer layout (vllm, mla)")
    per = 2 if layout.kind == "vllm" else 1
    ls = sorted(set(int(x) for x in layers))
    if not ls or ls[0] < 0 or ls[-1] >= layout.num_layers:
        raise ValueError("kvferry.kv: layers outside [0, %d)" % layout.num_layers)
    return [layer * per + j for layer in ls for j in range(per)]


class _PipelineStop(Exception):
    """A pipelined load cut short by a store error, with the chunks it
    verified before."""

    def __init__(self, done: int):
        super().__init__(done)
        self.done = done


class KVCache:
    """A paged KV cache bound to a store: save and load by token prefix.

    ``buffers`` are the cache's memory, :attr:`KVLayout.num_buffers` of
    them, each at least :meth:`KVLayout.buffer_bytes` long: numpy
    arrays, bytearrays, writable buffers, or torch tensors (CPU or CUDA,
    contiguous). They are registered with the store's engine here and
    deregistered by :meth:`close`.

    ``namespace`` prefixes every key (default "kv"); two caches share
    entries when their namespace and layout fingerprint agree.

    GPU buffers: ``gpu_stage`` (default: where the library has GPU
    kernels) stages blocks through ``stage_bytes`` of pinned host memory
    (default: one store batch of chunks, at most 256 MiB) with checksums
    computed by the copy kernels; False keeps the store's device-memory
    path.
    """

    def __init__(self, store: Store, layout: KVLayout, buffers: Sequence[Any],
                 namespace: str = "kv", replicas: int = 0,
                 gpu_stage: Optional[bool] = None, stage_bytes: int = 0):
        if len(buffers) != layout.num_buffers:
            raise ValueError("kvferry.kv: %s layout needs %d buffers, got %d"
                             % (layout.kind, layout.num_buffers, len(buffers)))
        self.store, self.layout, self.namespace, self.replicas = store, layout, namespace, replicas
        self.fingerprint = layout.fingerprint()
        self._fp_raw = bytes.fromhex(self.fingerprint)[:16]
        self.stats = KVStats()
        self._lock = threading.Lock()
        self.regions: List[Region] = []
        need = layout.buffer_bytes()
        try:
            for b in buffers:
                r = store.register(b)
                if r.nbytes < need:
                    r.deregister()
                    raise ValueError("kvferry.kv: a buffer of %d bytes, the layout needs %d"
                                     % (r.nbytes, need))
                self.regions.append(r)
        except BaseException:
            self.close()
            raise
        self._gpu = any(r.is_gpu for r in self.regions)
        npc = layout.pieces_per_block
        self._man_len = _HDR.size + 8 * npc
        self._man_buf = bytearray(self._man_len * BATCH_MAX)
        self._man_region = store.register(self._man_buf)
        self._stage = self._mover = self._table = None
        self._views = False
        if self._gpu and gpu_stage is not False:
            try:
                self._stage_init(stage_bytes, required=bool(gpu_stage))
            except BaseException:
                self.close()
                raise

    def _stage_init(self, stage_bytes: int, required: bool) -> None:
        from . import kv_gpu

        cuda = all(r.mem_type == _lib.MEM_CUDA for r in self.regions)
        one = len({r.device for r in self.regions}) == 1
        if not kv_gpu.has_fused_checksums() or kv_gpu.gpu_count() == 0 or not cuda or not one:
            if required:
                raise ValueError("kvferry.kv: gpu_stage needs a GPU, a CUDA build and every "
                                 "buffer in the memory of one GPU")
            return
        self._table = kv_gpu.BlockTable(self.layout, self.regions)
        per = max(1, BATCH_MAX // self.layout.pieces_per_block)
        cb = self._table.chunk_bytes
        # two store batches of chunks: a load reads one half while the
        # kernel scatters the other
        size = stage_bytes or min(2 * per * cb, max(cb, 256 << 20))
        if size < cb:
            raise ValueError("kvferry.kv: stage_bytes %d < one chunk (%d)" % (size, cb))
        self._mover = kv_gpu.GpuMover(self._table.side.device)
        # loads read the node's pool in place where the store can view it
        # (a node of this host over shm; KVF_KV_VIEWS=0: always staged)
        self._views = (config.get("kv_views", "1") != "0"
                       and hasattr(self.store, "view_get"))
        self._stage = kv_gpu.PinnedBuffer(size)
        self._stage_region = self._stage.register(self.store)
        self._stage_chunks = min(2 * per, size // cb)

    # -- keys --------------------------------------------------------------

    def chunk_keys(self, tokens: Sequence[int]) -> List[bytes]:
        """Chained keys of the full blocks of tokens (see :func:`chunk_keys`)."""
        return chunk_keys(tokens, self.layout.block_size, self.fingerprint)

    def _prefix(self, ck: bytes) -> str:
        return "%s/%s/%s" % (self.namespace, self.fingerprint, ck.hex())

    def manifest_key(self, ck: bytes) -> str:
        return self._prefix(ck) + "/m"

    def piece_keys(self, ck: bytes) -> List[str]:
        p = self._prefix(ck)
        return ["%s/%s" % (p, name) for name, _, _, _ in self.layout.spans(0)]

    # -- helpers -----------------------------------------------------------

    def _checksum(self, region: Region, off: int, n: int) -> Optional[int]:
        addr = region.addr + off
        if region.is_gpu:
            return _gpu_checksum(addr, n)
        return _lib.lib().kvf_checksum(addr, n)

    def _manifest(self, ck: bytes, sums: Sequence[int]) -> bytes:
        return _HDR.pack(_MAGIC, LAYOUT_VERSION, len(sums), self._fp_raw, ck) + struct.pack(
            "<%dQ" % len(sums), *sums)

    def _parse_manifest(self, raw: bytes, ck: bytes) -> Optional[Tuple[int, ...]]:
        npc = self.layout.pieces_per_block
        if len(raw) != self._man_len:
            return None
        magic, ver, n, fp, key = _HDR.unpack_from(raw)
        if magic != _MAGIC or ver != LAYOUT_VERSION or n != npc or fp != self._fp_raw or key != ck:
            return None
        return struct.unpack_from("<%dQ" % npc, raw, _HDR.size)

    def _slices(self, n: int, per: int) -> Iterable[Tuple[int, int]]:
        step = max(1, BATCH_MAX // per)
        if self._stage is not None and per > 1:
            step = min(step, self._stage_chunks)
        for i in range(0, n, step):
            yield i, min(n, i + step)

    # -- lookup ------------------------------------------------------------

    def lookup(self, tokens: Sequence[int]) -> int:
        """How many leading tokens the store holds complete chunks for (a
        multiple of block_size); loads nothing."""
        keys = self.chunk_keys(tokens)
        with self._lock:
            self.stats.lookups += 1
        hit = 0
        for a, b in self._slices(len(keys), 1):
            found = self.store.exists_batch([self.manifest_key(k) for k in keys[a:b]])
            for f in found:
                if not f:
                    return hit * self.layout.block_size
                hit += 1
        return hit * self.layout.block_size

    # -- save --------------------------------------------------------------

    def save(self, tokens: Sequence[int], block_ids: Sequence[int]) -> int:
        """Saves the blocks of the full chunks of tokens (block i of the
        request in cache block block_ids[i]); chunks already stored are
        skipped. Returns how many chunks were written. A chunk whose
        pieces cannot all be stored gets no manifest (so it stays a miss)
        and the save stops there."""
        keys = self.chunk_keys(tokens)
        n = min(len(keys), len(block_ids))
        if n == 0:
            return 0
        present = []
        for a, b in self._slices(n, 1):
            present += self.store.exists_batch([self.manifest_key(k) for k in keys[a:b]])
        todo = [i for i in range(n) if not present[i]]
        written = 0
        npc = self.layout.pieces_per_block
        for a, b in self._slices(len(todo), npc):
            w = self._save_slice([(keys[i], block_ids[i]) for i in todo[a:b]])
            written += w
            if w < b - a:
                break
        with self._lock:
            self.stats.saved_chunks += written
            self.stats.skipped_chunks += n - len(todo)
        return written

    def _save_slice(self, items: List[Tuple[bytes, int]]) -> int:
        if self._stage is not None:
            return self._save_slice_staged(items)
        pkeys: List[str] = []
        spans: List[Tuple[Region, int, int]] = []
        sums: List[List[int]] = []
        for ck, blk in items:
            pkeys += self.piece_keys(ck)
            cs = []
            for _, bi, off, ln in self.layout.spans(blk):
                r = self.regions[bi]
                spans.append((r, off, ln))
                cs.append(self._checksum(r, off, ln) or 0)
            sums.append(cs)
        return self._put_slice(items, pkeys, spans, sums)

    def _save_slice_staged(self, items: List[Tuple[bytes, int]]) -> int:
        """GPU cache: one kernel gathers the slice's pieces into the stage
        and checksums them; the store writes them from there."""
        t = self._table
        npc = self.layout.pieces_per_block
        t0 = time.perf_counter()
        offs = t.offsets([blk for _, blk in items])
        lens = t.piece_lens(len(items))
        packed = t.packed(len(items))
        _, sums = self._mover.copy(t.side, self._stage.mem(), offs, packed, lens)
        t1 = time.perf_counter()
        pkeys: List[str] = []
        for ck, _ in items:
            pkeys += self.piece_keys(ck)
        spans = [(self._stage_region, int(o), int(n)) for o, n in zip(packed, lens)]
        sl = [int(v) for v in sums]
        ok = self._put_slice(items, pkeys, spans, [sl[j * npc:(j + 1) * npc] for j in range(len(items))])
        with self._lock:
            self.stats.t_d2h += t1 - t0
            self.stats.t_write += time.perf_counter() - t1
        return ok

    def _put_slice(self, items: List[Tuple[bytes, int]], pkeys: List[str],
                   spans: List[Tuple[Region, int, int]], sums: List[List[int]]) -> int:
        sts = self.store.put_batch(pkeys, spans, replicas=self.replicas, check=False)
        npc = self.layout.pieces_per_block
        good: List[int] = []
        for j in range(len(items)):
            part = sts[j * npc:(j + 1) * npc]
            # a piece left by an earlier save that got no manifest may hold
            # other bytes: the manifest's checksums then fail it at load
            if all(s in (OK, ERR_EXISTS) for s in part):
                good.append(j)
            else:
                break
        if not good:
            with self._lock:
                self.stats.save_errors += 1
            return 0
        mkeys = [self.manifest_key(items[j][0]) for j in good]
        mans = [self._manifest(items[j][0], sums[j]) for j in good]
        msts = self.store.put_batch(mkeys, mans, replicas=self.replicas, check=False)
        ok = 0
        for s in msts:
            if s not in (OK, ERR_EXISTS):
                break
            ok += 1
        nbytes = sum(ln for _, _, ln in spans[: ok * npc])
        with self._lock:
            self.stats.bytes_saved += nbytes
            if ok < len(items):
                self.stats.save_errors += 1
        return ok

    # -- load --------------------------------------------------------------

    def load(self, tokens: Sequence[int], block_ids: Sequence[int], start: int = 0) -> int:
        """Loads the stored prefix of tokens into cache blocks block_ids
        (block i of the request into block_ids[i]) and returns how many
        tokens were loaded and verified (a multiple of block_size). Blocks
        after the returned prefix may have been written and must be
        recomputed. Never raises for a missing or corrupted chunk: a
        corrupted one ends the prefix and counts in stats.corrupt_misses.
        start: chunks before it are the engine's already (neither read nor
        written); the count returned then begins at chunk start."""
        keys = self.chunk_keys(tokens)[start:]
        n = min(len(keys), len(block_ids) - start)
        with self._lock:
            self.stats.lookups += 1
        done = 0
        npc = self.layout.pieces_per_block
        try:
            if self._stage is not None and self._views and n > 0:
                # manifests, then the pieces read in place by the scatter
                plan = self._plan(keys[:n], block_ids[start:start + n])
                done = self.load_planned(plan) // self.layout.block_size
                n = 0
            elif self._stage is not None and self._stage_chunks >= 2 and n > 0:
                done = self._load_pipelined(keys[:n], block_ids[start:start + n])
                n = 0
            for a, b in self._slices(max(n, 0), npc):
                ok, stop = self._load_slice(keys[a:b], block_ids[start + a:start + b])
                done += ok
                if stop:
                    break
        except KvferryError:
            # a dead node or master: what is verified so far stands, the
            # rest is recomputed by the engine
            with self._lock:
                self.stats.load_errors += 1
        with self._lock:
            self.stats.hit_chunks += done
            self.stats.loaded_chunks += done
            self.stats.miss_chunks += len(keys) - done
        return done * self.layout.block_size

    def _load_manifests(self, keys: List[bytes]) -> List[Tuple[int, ...]]:
        m = self._man_len
        lens = self.store.get_batch([self.manifest_key(k) for k in keys],
                                    [(self._man_region, i * m, m) for i in range(len(keys))],
                                    check=False)
        out = []
        for i, k in enumerate(keys):
            if lens[i] != m:
                if lens[i] not in (ERR_NO_KEY,):
                    with self._lock:
                        self.stats.corrupt_misses += 1
                break
            sums = self._parse_manifest(bytes(self._man_buf[i * m:(i + 1) * m]), k)
            if sums is None:
                with self._lock:
                    self.stats.corrupt_misses += 1
                break
            out.append(sums)
        return out

    def _load_slice(self, keys: List[bytes], blocks: Sequence[int]) -> Tuple[int, bool]:
        t0 = time.perf_counter()
        mans = self._load_manifests(keys)
        with self._lock:
            self.stats.t_query += time.perf_counter() - t0
        if not mans:
            return 0, True
        if self._stage is not None:
            return self._load_slice_staged(keys, blocks, mans)
        k = len(mans)
        pkeys: List[str] = []
        spans: List[Tuple[Region, int, int]] = []
        for ck, blk in zip(keys[:k], blocks[:k]):
            pkeys += self.piece_keys(ck)
            spans += [(self.regions[bi], off, ln) for _, bi, off, ln in self.layout.spans(blk)]
        lens = self.store.get_batch(pkeys, spans, check=False)
        npc = self.layout.pieces_per_block
        ok = 0
        for j in range(k):
            good = True
            missing = False
            for p in range(npc):
                i = j * npc + p
                r, off, ln = spans[i]
                if lens[i] == ERR_NO_KEY:
                    good, missing = False, True
                    break
                if lens[i] != ln or self._checksum(r, off, ln) != mans[j][p]:
                    good = False
                    break
            if not good:
                if not missing:
                    with self._lock:
                        self.stats.corrupt_misses += 1
                with self._lock:
                    self.stats.bytes_loaded += sum(s[2] for s in spans[: ok * npc])
                return ok, True
            ok += 1
        with self._lock:
            self.stats.bytes_loaded += sum(s[2] for s in spans[: ok * npc])
        return ok, k < len(keys)

    def _load_slice_staged(self, keys: List[bytes], blocks: Sequence[int],
                           mans: List[Tuple[int, ...]]) -> Tuple[int, bool]:
        """GPU cache: the store reads the pieces into the stage, one kernel
        scatters them into the cache and checks each against the
        manifest's checksum; the first chunk with a missing, short or
        mismatching piece ends the hit."""
        from .kv_gpu import first_mismatch

        t = self._table
        npc = self.layout.pieces_per_block
        k = len(mans)
        lens = t.piece_lens(k)
        packed = t.packed(k)
        pkeys: List[str] = []
        for ck in keys[:k]:
            pkeys += self.piece_keys(ck)
        t0 = time.perf_counter()
        got, rec = self.store.get_batch_sums(pkeys, [(self._stage_region, int(o), int(n))
                                                    for o, n in zip(packed, lens)])
        t1 = time.perf_counter()
        good, corrupt = k, False
        for i, n in enumerate(got):
            # unhashed by the store: the scatter below verifies the bytes
            # against the manifest, which must be what the store recorded
            if n != int(lens[i]) or rec[i] != mans[i // npc][i % npc]:
                good, corrupt = i // npc, n != ERR_NO_KEY
                break
        ok = good
        if good:
            m = good * npc
            expect = [v for man in mans[:good] for v in man]
            st, sums = self._mover.copy(self._stage.mem(), t.side, packed[:m],
                                        t.offsets(blocks[:good]), lens[:m], expect=expect)
            if st != OK:
                ok, corrupt = first_mismatch(sums, expect) // npc, True
        with self._lock:
            self.stats.t_read += t1 - t0
            self.stats.t_h2d += time.perf_counter() - t1
            self.stats.bytes_loaded += ok * t.chunk_bytes
            if corrupt:
                self.stats.corrupt_misses += 1
        return ok, ok < len(keys)

    def _read_half(self, keys: List[bytes], half: int,
                   mans: Optional[List[Tuple[int, ...]]] = None) -> Tuple[Any, ...]:
        """The read stage of a pipelined load (a worker thread): the
        manifests of keys (unless given), then their pieces into half
        `half` of the stage, unhashed (the scatter verifies them). Returns
        (manifests, chunks read whole, corrupt, recorded sums, seconds
        query, read)."""
        t = self._table
        npc = self.layout.pieces_per_block
        t0 = time.perf_counter()
        if mans is None:
            mans = self._load_manifests(keys)
        t1 = time.perf_counter()
        k = len(mans)
        if not k:
            return mans, 0, False, [], t1 - t0, 0.0
        lens = t.piece_lens(k)
        packed = t.packed(k, half * self._half_bytes)
        pkeys = [pk for ck in keys[:k] for pk in self.piece_keys(ck)]
        got, sums = self.store.get_batch_sums(
            pkeys, [(self._stage_region, int(o), int(n)) for o, n in zip(packed, lens)])
        good, corrupt = k, False
        for i, n in enumerate(got):
            # the store's recorded checksum must be the manifest's: the
            # bytes are then verified against both by the scatter
            if n != int(lens[i]) or sums[i] != mans[i // npc][i % npc]:
                good, corrupt = i // npc, n != ERR_NO_KEY
                break
        return mans, good, corrupt, sums, t1 - t0, time.perf_counter() - t1

    def _load_pipelined(self, keys: List[bytes], blocks: Sequence[int]) -> int:
        """GPU cache, stage of two halves: while one kernel scatters slice
        i from one half into the cache and checks every piece against its
        manifest checksum, a worker thread reads slice i+1's pieces into
        the other half (every manifest is read first). The first chunk
        with a missing, short or mismatching piece ends the hit. Returns
        the chunks loaded."""
        from concurrent.futures import ThreadPoolExecutor

        step = self._stage_chunks // 2
        self._half_bytes = step * self._table.chunk_bytes
        done = 0
        try:
            # every manifest first (one master round trip per store batch),
            # so the reads of the pieces follow each other without them
            t0 = time.perf_counter()
            mans: List[Tuple[int, ...]] = []
            for a in range(0, len(keys), BATCH_MAX):
                got = self._load_manifests(keys[a:a + BATCH_MAX])
                mans += got
                if len(got) < min(BATCH_MAX, len(keys) - a):
                    break
            with self._lock:
                self.stats.t_query += time.perf_counter() - t0
            keys = keys[:len(mans)]
            bounds = [(a, min(len(keys), a + step)) for a in range(0, len(keys), step)]
            if not bounds:
                return 0
            with ThreadPoolExecutor(1, thread_name_prefix="kvferry-kv-read") as pool:
                done = self._pipeline(pool, keys, blocks, bounds, mans)
        except _PipelineStop as e:
            # a dead node or master: what is verified so far stands
            with self._lock:
                self.stats.load_errors += 1
            done = e.done
        return done

    def _pipeline(self, pool: Any, keys: List[bytes], blocks: Sequence[int],
                  bounds: List[Tuple[int, int]], mans_all: List[Tuple[int, ...]]) -> int:
        from .kv_gpu import first_mismatch

        t = self._table
        npc = self.layout.pieces_per_block
        done = 0
        try:
            a0, b0 = bounds[0]
            fut = pool.submit(self._read_half, keys[a0:b0], 0, mans_all[a0:b0])
            for i, (a, b) in enumerate(bounds):
                mans, good, corrupt, _, tq, tr = fut.result()
                fut = None
                if good == b - a and not corrupt and i + 1 < len(bounds):
                    na, nb = bounds[i + 1]
                    fut = pool.submit(self._read_half, keys[na:nb], (i + 1) % 2, mans_all[na:nb])
                t1 = time.perf_counter()
                ok = good
                if good:
                    expect = [v for man in mans[:good] for v in man]
                    st, sums = self._mover.copy(
                        self._stage.mem(), t.side, t.packed(good, (i % 2) * self._half_bytes),
                        t.offsets(blocks[a:a + good]), t.piece_lens(good), expect=expect)
                    if st != OK:
                        ok, corrupt = first_mismatch(sums, expect) // npc, True
                with self._lock:
                    self.stats.t_query += tq
                    self.stats.t_read += tr
                    self.stats.t_h2d += time.perf_counter() - t1
                    self.stats.bytes_loaded += ok * t.chunk_bytes
                    if corrupt:
                        self.stats.corrupt_misses += 1
                done += ok
                if ok < b - a:
                    break
            if fut is not None:
                fut.result()  # its half is written before the next load
        except KvferryError:
            raise _PipelineStop(done) from None
        return done

    # -- planned and layer-wise loads (GPU staged) ---------------------------

    def plan_load(self, tokens: Sequence[int], block_ids: Sequence[int]) -> Any:
        """Reads the manifests of the stored prefix of tokens (one master
        round trip per store batch) and returns a plan for
        :meth:`load_planned`, as :meth:`LocalKVCache.plan_load` does: the
        pieces are then read per group of layers."""
        with self._lock:
            self.stats.lookups += 1
        return self._plan(self.chunk_keys(tokens), block_ids)

    def _plan(self, keys: List[bytes], block_ids: Sequence[int]) -> Any:
        from .kv_local import LoadPlan

        n = min(len(keys), len(block_ids))
        mans: List[Tuple[int, ...]] = []
        t0 = time.perf_counter()
        try:
            for a in range(0, n, BATCH_MAX):
                b = min(n, a + BATCH_MAX)
                got = self._load_manifests(keys[a:b])
                mans += got
                if len(got) < b - a:
                    break
        except KvferryError:
            with self._lock:
                self.stats.load_errors += 1
        with self._lock:
            self.stats.t_query += time.perf_counter() - t0
        k = len(mans)
        return LoadPlan(keys[:k], list(block_ids[:k]), None, mans, len(keys),
                        self.layout.block_size)

    def load_planned(self, plan: Any, layers: Optional[Sequence[int]] = None) -> int:
        """Reads the planned chunks' pieces of layers (all when None; a
        vllm or MLA layout for a subset) from the store into the pinned
        stage, unhashed, and scatters them into the GPU cache with the
        verifying kernel, a stage's worth per call; returns the verified
        tokens. A missing or mismatching piece ends the hit there and
        shortens the plan (a mismatch counts in stats.corrupt_misses)."""
        if self._stage is None:
            raise ValueError("kvferry.kv: load_planned needs a GPU cache staged through "
                             "pinned memory (gpu_stage)")
        rows = layer_rows(self.layout, layers)
        t = self._table
        per_chunk = sum(t.lens[p] for p in rows)
        step = max(1, min(BATCH_MAX // len(rows), self._stage.nbytes // per_chunk))
        a = 0
        try:
            while a < plan.ok:
                b = min(plan.ok, a + step)
                bad = self._load_rows(plan, a, b, rows)
                if bad < b:
                    plan.ok = bad
                    break
                a = b
        except KvferryError:
            with self._lock:
                self.stats.load_errors += 1
            plan.ok = a
        return plan.ok * self.layout.block_size

    def _load_rows(self, plan: Any, a: int, b: int, rows: List[int]) -> int:
        """Chunks a..b of plan, pieces rows: store read into the stage,
        verifying scatter (or, with views, the scatter reads the node's
        pool in place). Returns the first chunk that failed (b: none)."""
        if self._views:
            got = self._load_rows_viewed(plan, a, b, rows)
            if got is not None:
                return got
        t = self._table
        pkeys, dst, lens, expect = self._row_pieces(plan, a, b, rows)
        src, off = [], 0
        for ln in lens:
            src.append(off)
            off += ln
        spans = [(self._stage_region, o, ln) for o, ln in zip(src, lens)]
        t0 = time.perf_counter()
        got, rec = self.store.get_batch_sums(pkeys, spans)
        t1 = time.perf_counter()
        npr = len(rows)
        good, corrupt = b - a, False
        for i, n in enumerate(got):
            if n != lens[i] or rec[i] != expect[i]:
                good, corrupt = i // npr, n != ERR_NO_KEY
                break
        ok = good
        if good:
            m = good * npr
            st, sums = self._mover.copy(self._stage.mem(), t.side, src[:m], dst[:m], lens[:m],
                                        expect=expect[:m])
            if st != OK:
                from .kv_gpu import first_mismatch

                ok, corrupt = first_mismatch(sums, expect[:m]) // npr, True
        with self._lock:
            self.stats.t_read += t1 - t0
            self.stats.t_h2d += time.perf_counter() - t1
            self.stats.bytes_loaded += sum(lens[: ok * npr])
            if corrupt:
                self.stats.corrupt_misses += 1
        return a + ok

    def warm(self, tokens: Sequence[int]) -> int:
        """Registers with the GPU, ahead of the first load, the node
        mappings the stored chunks of tokens lie in (a GPU cache whose
        loads read the store in place; a no-op otherwise): e.g. after a
        save or at start-up, since registering pins a whole pool window
        (about a second per few GiB, once). Returns the mappings now
        registered for them."""
        if self._stage is None or not self._views:
            return 0
        from .kv_gpu import host_mappings

        keys = [pk for ck in self.chunk_keys(tokens) for pk in self.piece_keys(ck)][:BATCH_MAX]
        if not keys:
            return 0
        maps = host_mappings(self.store)
        bases = set()
        with self.store.view_get(keys) as views:
            for v in views:
                if v.status == OK and v.map_base and v.map_base not in bases:
                    if not maps.ensure(v.map_base, v.map_len):
                        self._views = False
                        return 0
                    bases.add(v.map_base)
        return len(bases)

    def _row_pieces(self, plan: Any, a: int, b: int, rows: List[int]):
        """Keys, cache offsets, lengths and manifest checksums of the pieces
        rows of chunks a..b, chunk-major."""
        t = self._table
        names = [self.layout.spans(0)[p][0] for p in rows]
        pkeys, dst, lens, expect = [], [], [], []
        for j in range(a, b):
            pre = self._prefix(plan.keys[j])
            for p, name in zip(rows, names):
                pkeys.append("%s/%s" % (pre, name))
                dst.append(t.rel0[p] + plan.slots[j] * t.stride[p])
                lens.append(t.lens[p])
                expect.append(plan.expect[j][p])
        return pkeys, dst, lens, expect

    def _load_rows_viewed(self, plan: Any, a: int, b: int, rows: List[int]) -> Optional[int]:
        """:meth:`_load_rows` without the host copy: the pieces' views (the
        node's pool mapped in this process, registered with the GPU once)
        are scattered into the cache by the verifying copy, which checks
        each against its manifest checksum; the views are released after
        it. None: a piece cannot be viewed (a node over tcp, or the GPU
        refused the registration): the caller reads them into the stage
        (and views stay off when the registration failed)."""
        from .kv_gpu import GpuMem, MEM_PINNED, first_mismatch, host_mappings

        pkeys, dst, lens, expect = self._row_pieces(plan, a, b, rows)
        npr = len(rows)
        t0 = time.perf_counter()
        with self.store.view_get(pkeys) as views:
            t1 = time.perf_counter()
            good, corrupt = b - a, False
            for i, v in enumerate(views):
                if v.status == ERR_UNSUPPORTED:
                    return None
                if v.status != OK or v.length != lens[i] or v.checksum != expect[i]:
                    good, corrupt = i // npr, v.status != ERR_NO_KEY
                    break
            m = good * npr
            maps = host_mappings(self.store)
            groups: Dict[int, List[int]] = {}
            for i in range(m):
                groups.setdefault(views[i].map_base, []).append(i)
            for base, idx in groups.items():
                if not maps.ensure(base, views[idx[0]].map_len):
                    self._views = False
                    return None
            sums = [0] * m
            for base, idx in groups.items():
                src = GpuMem(base, views[idx[0]].map_len, MEM_PINNED, 0)
                _, got = self._mover.copy(src, self._table.side, [views[i].addr - base for i in idx],
                                          [dst[i] for i in idx], [lens[i] for i in idx],
                                          expect=[expect[i] for i in idx])
                for j, i in enumerate(idx):
                    sums[i] = int(got[j])
            ok = good
            if m and sums != expect[:m]:
                ok, corrupt = first_mismatch(sums, expect[:m]) // npr, True
        t2 = time.perf_counter()
        with self._lock:
            self.stats.t_read += t1 - t0
            self.stats.t_h2d += t2 - t1
            self.stats.bytes_loaded += sum(lens[: ok * npr])
            self.stats.viewed_pieces += ok * npr
            if corrupt:
                self.stats.corrupt_misses += 1
        return a + ok

    # -- housekeeping ------------------------------------------------------

    def remove(self, tokens: Sequence[int]) -> int:
        """Removes the stored chunks of tokens (manifests first); returns
        how many manifests were removed."""
        keys = self.chunk_keys(tokens)
        removed = 0
        for a, b in self._slices(len(keys), 1 + self.layout.pieces_per_block):
            ks = keys[a:b]
            sts = self.store.remove_batch([self.manifest_key(c) for c in ks], check=False)
            removed += sum(1 for s in sts if s == OK)
            pk = [p for c in ks for p in self.piece_keys(c)]
            self.store.remove_batch(pk, check=False)
        return removed

    def close(self) -> None:
        """Deregisters the cache's buffers (the store stays open)."""
        regions, self.regions = self.regions, []
        for name in ("_stage", "_mover"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)
        mr = getattr(self, "_man_region", None)
        if mr is not None:
            regions.append(mr)
            self._man_region = None
        for r in regions:
            try:
                r.deregister()
            except Exception:
                pass

    def __enter__(self) -> "KVCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


from .kv_local import LocalKVCache  # noqa: E402  (uses the names above)

__all__ = ["KVLayout", "KVCache", "KVStats", "LocalKVCache", "chunk_keys", "dtype_size", "layer_rows",
           "LAYOUT_VERSION", "LMCACHE_CHUNK", "ERR_CHECKSUM"]
