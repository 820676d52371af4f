"""The remote tiers of ``kvferry bench e2e``: a kvferry store (``master``
and ``node`` processes on this host) that keeps prefixes as chunk
objects (:mod:`kvferry.kv_chunks`), reached over shm or, forced, tcp;
the throttled variant slows the client's eps down with kvferry's fault
transport (``KVF_FAULT`` ``delay_ms``).

The tier's cache is paged like the others': one buffer per layer,
``[2, blocks, 256, kv_heads, head_dim]``, on the model's GPU when the
tiers use kvferry's GPU paths (:func:`.caches.gpu_paths`), in host memory
otherwise; a request's tokens [256 i, 256 (i+1)) are block i, so the
model reads layer l's prefix as a ``[1, H, S, D]`` view of its buffer
(:func:`.caches.paged_views`) and nothing is copied after the load.

A :class:`kvferry.kv_chunks.ChunkStore` binds the buffers to the store:
one object per (chunk of ``chunk_tokens`` tokens, layer group) with the
checksum of every piece in its header. A hit is loaded by one
``ChunkStore.load`` that hands the buffers over group by group
(:class:`ChunkSource`; :class:`.overlap.GroupLoad` runs it beside the
forward pass, so the model's layer l waits for its own group only). On a
GPU over shm, a group is scattered from the node's pool in place (store
views) by one verifying copy kernel, the pool's mapping registered with
the GPU when the tier is set up (``ChunkStore.warm``), outside any
request's time; over tcp (and with ``KVF_KV_VIEWS=0``) the objects go
through a pinned stage. On the host the pieces are checked against their
headers and copied by the CPU. A damaged or missing piece shortens the
load; the engine recomputes and the tier removes that chunk so the
recompute's save stores it anew.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import config
from ..errors import KvferryError
from ..kv_chunks import Chunk, ChunkStore, LoadReq, SaveReq, header_bytes
from ..procs import Master, Node
from ..store import Store
from .caches import (CHUNK, Source, Tier, _from_cache, _gpu_bufs, _pool, _size, gpu_paths,
                     layout_for, paged_views)

#: Tokens per chunk object (4 of the cache's 256-token blocks): a 32K
#: prefix is 32 objects per layer group, so the Python work of a group
#: (headers, descriptors) stays well under a millisecond
CHUNK_TOKENS = 1024
#: Layer groups: the first group (4 of the 8B shape's 32 layers, 512 MiB
#: of a 32K prefix) is all the model waits for before its first layer
LAYER_GROUPS = 8
#: Largest stage of the loads and saves that copy (tcp, views off)
STAGE_BYTES = 256 << 20


def _nbytes(t: Any) -> int:
    """Bytes of a torch tensor or a numpy array."""
    return int(t.numel() * t.element_size()) if hasattr(t, "element_size") else int(t.nbytes)


class ReadTimer:
    """A :class:`kvferry.Store` seen through this adds up the seconds its
    object reads take (``get_batch``, ``get_batch_sums``: the reads of a
    load through the stage, i.e. the link); every other attribute is the
    store's own."""

    def __init__(self, store: Store):
        self._inner = store
        self.read_s = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.read_s += time.perf_counter() - t

    def get_batch(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._inner.get_batch, *args, **kwargs)

    def get_batch_sums(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(self._inner.get_batch_sums, *args, **kwargs)


class ChunkSource:
    """A stored prefix (tokens [0, tokens)) to load into the tier's paged
    buffers, request block i into buffer block i. :meth:`load` runs the
    ChunkStore load (group_done(g) once group g is in the buffers) and
    leaves in :attr:`verified` the tokens it verified: below ``tokens``
    the pass that used the buffers must be recomputed."""

    def __init__(self, tier: "RemoteTier", tokens: int, chunks: Sequence[Chunk]):
        self.tier, self.kv, self.bufs = tier, tier.kv, tier.bufs
        self.tokens = self.verified = tokens
        self.groups = tier.kv.groups
        self.group_of: Dict[int, int] = dict(tier.kv.map.group_of)  # layer -> group
        self.req = LoadReq(list(chunks), list(range(tokens // CHUNK)), 0, tokens)
        self._s0 = tier.counters()

    def load(self, group_done: Any = None) -> int:
        self.kv.load([self.req], group_done=group_done)
        if self.req.loaded < self.tokens:
            self.tier.drop(self.req)
        self.verified = min(self.verified, self.req.loaded)
        return self.req.loaded

    def views(self, layer: int) -> Tuple[Any, Any]:
        return paged_views(self.bufs[layer], self.tokens)

    def done(self) -> Tuple[Dict[str, float], int]:
        """The load's split (kv_query: the views' look-up; kv_read: store
        reads into the stage, 0 for views; kv_h2d_verify: the rest, the
        verifying scatters) and the bytes it moved from the store."""
        q, r, t, nb = (a - b for a, b in zip(self.tier.counters(), self._s0))
        return {"kv_query": q, "kv_read": r, "kv_h2d_verify": max(0.0, t - q - r)}, int(nb)


class RemoteTier(Tier):
    """A kvferry store in master + node processes on this host, read over
    ``transport`` ("shm" or "tcp"); with ``throttle_gbs`` the client's
    eps are slowed to about that speed (kvferry's fault transport).
    bufs: the paged buffers (default: allocated for info's model, on its
    GPU or in host memory)."""

    remote = True

    def __init__(self, info: Any, max_tokens: int, transport: str = "shm",
                 node_pool: str = "1G", throttle_gbs: float = 0.0, timeout_ms: int = 60000,
                 chunk_tokens: int = CHUNK_TOKENS, layer_groups: int = LAYER_GROUPS,
                 bufs: Optional[List[Any]] = None, pipeline: bool = False):
        self.transport, self.throttle_gbs, self.timeout_ms = transport, throttle_gbs, timeout_ms
        self.throttle_ms = 0.0
        self.pipeline = pipeline
        self.name = "remote-%s%s%s" % (transport, "-throttled" if throttle_gbs else "",
                                       "-piped" if pipeline else "")
        self.blocks = max(1, -(-max_tokens // CHUNK))
        # the model reads the buffers where they are, or (a CUDA model
        # without kvferry's GPU kernels) gets copies of host buffers
        self.resident = gpu_paths(info) or info.device.type != "cuda"
        self.bufs = bufs if bufs is not None else self._buffers(info)
        self.probe_bytes = min(32 << 20, _size(node_pool) // 16)
        self._fault_old = os.environ.get("KVF_FAULT")
        self.use_views = transport == "shm" and config.get("kv_views", "1") != "0"
        self._found: Optional[Tuple[List[int], List[Chunk]]] = None
        self.master = Master().start()
        try:
            self.node = Node(self.master.address, pool=node_pool, timeout=60.0).start()
            self._bind(info, chunk_tokens, layer_groups)
        except BaseException:
            self.close()
            raise

    def _bind(self, info: Any, chunk_tokens: int, layer_groups: int) -> None:
        """The client (throttled when asked) and the ChunkStore over the
        buffers; the node's pool registered with the GPU now, outside any
        request's time."""
        self.store = self._connect()
        if self.throttle_gbs:
            self._throttle(self.throttle_gbs)
        self.reads = ReadTimer(self.store)
        # the stage (tcp, no views): at most what the buffers hold
        stage = min(STAGE_BYTES, sum(_nbytes(b) for b in self.bufs))
        self.kv = ChunkStore(self.reads, self.bufs, self.blocks, CHUNK,
                             layout_for(info, self.blocks).fingerprint(), namespace="e2e",
                             chunk_tokens=chunk_tokens, layer_groups=layer_groups,
                             stage_bytes=stage, views=self.use_views,
                             pipeline=self.pipeline)
        self.mappings = self.kv.warm()

    def _buffers(self, info: Any) -> List[Any]:
        if gpu_paths(info):
            return _gpu_bufs(info, self.blocks)
        return _pool(info, self.blocks, info.device.type == "cuda")

    def _connect(self) -> Store:
        return Store.connect(self.master.address, timeout_ms=self.timeout_ms,
                             transports=self.transport)

    def _throttle(self, target_gbs: float) -> None:
        """Slows the client's eps to the node down to about target_gbs
        with the fault transport's per-request delay (``KVF_FAULT``
        ``delay_ms``, whole milliseconds, read when an ep opens): the delay
        is scaled from a probe until the measured speed is within 20 % of
        the target (or 1 ms is already slower)."""
        d = 1
        for _ in range(4):
            os.environ["KVF_FAULT"] = "delay_ms=%d" % d
            self.store.close()
            self.store = self._connect()
            self.throttle_ms = d
            g = self.probe_gbs()
            if abs(g - target_gbs) <= 0.2 * target_gbs or g <= 0 or (d == 1 and g < target_gbs):
                break
            # the delay dominates a slowed link: speed ~ 1 / delay
            nd = int(min(200, max(1, round(d * min(10.0, g / target_gbs)))))
            if nd == d:
                break
            d = nd

    def probe_gbs(self, nbytes: int = 0, rounds: int = 3) -> float:
        """Read speed of one object of nbytes from the node through this
        client (best of rounds), in GB/s: the policy's starting link."""
        nbytes = nbytes or self.probe_bytes
        key = "e2e-probe/%d/%d" % (os.getpid(), nbytes)
        buf = bytearray(nbytes)
        region = self.store.register(buf)
        try:
            if not self.store.exists(key):
                self.store.put(key, region)
            best = float("inf")
            for _ in range(rounds):
                t = time.perf_counter()
                self.store.get(key, region)
                best = min(best, time.perf_counter() - t)
            self.store.remove(key)
        finally:
            region.deregister()
        return nbytes / best / 1e9

    def counters(self) -> Tuple[float, float, float, int]:
        """(query s, read s, load s, bytes loaded) so far."""
        s = self.kv.stats
        return s.t_query, self.reads.read_s, s.t_load, s.bytes_loaded

    # -- the engine's calls ------------------------------------------------

    def lookup(self, tokens: Sequence[int]) -> int:
        n = min(len(tokens) // CHUNK, self.blocks) * CHUNK
        hit, chunks = self.kv.lookup(tokens[:n], n) if n else (0, [])
        self._found = (list(tokens[:hit]), chunks)
        return hit

    def _chunks(self, tokens: Sequence[int], hit: int) -> List[Chunk]:
        """The chunks of the last lookup when it was of these tokens."""
        if self._found is not None and self._found[0] == list(tokens[:hit]):
            return self._found[1]
        return self.kv.lookup(tokens[:hit], hit)[1]

    def fetch(self, tokens, hit):
        src = ChunkSource(self, hit, self._chunks(tokens, hit))
        if self.resident:  # loaded by the Loader, beside the forward pass
            return src, hit, {}, 0
        got = src.load()
        t, nbytes = src.done()
        times = {"read": t["kv_query"] + t["kv_read"], "verify": t["kv_h2d_verify"]}
        return Source(self.bufs, [(0, got // CHUNK)] if got else [], got), got, times, nbytes

    def save(self, tokens, cache, have):
        n = min(len(tokens) // CHUNK, self.blocks) * CHUNK
        _from_cache(cache, self.bufs, have, n)
        return self.save_blocks(tokens, n, have)

    def save_blocks(self, tokens: Sequence[int], n: int, have: int = 0) -> int:
        """Stores the chunks of tokens[:n] the store lacks from the
        buffers' blocks 0.. (which hold those tokens; the first ``have``
        came from the store). Returns the objects stored."""
        chunks = [c for c in self.kv.chunks_of(tokens, n)
                  if c.first_token + c.blocks * CHUNK > have]
        missing = [c for c, ok in zip(chunks, self.kv.exists(chunks)) if not ok]
        if not missing:
            return 0
        return self.kv.save([SaveReq(missing, list(range(n // CHUNK)))])()

    def drop(self, req: LoadReq) -> None:
        """A load that ended short: the chunk it ended in is removed, so
        that the recompute's save stores it anew."""
        at = req.start + req.loaded
        for c in req.chunks:
            if c.first_token <= at < c.first_token + c.blocks * CHUNK:
                self.kv.remove([c])
                return

    def corrupt(self, tokens, chunk):
        """Damages the stored bytes of block ``chunk`` (256 tokens) of
        tokens: one byte of its first piece in the last layer group's
        object, put again under the same key, so that the store's own
        checksum agrees and only the header's piece checksums can tell."""
        at, n = chunk * CHUNK, len(tokens) // CHUNK * CHUNK
        held = [c for c in self.kv.chunks_of(tokens, n)
                if c.first_token <= at < c.first_token + c.blocks * CHUNK]
        if not held:
            return False
        c, g = held[0], self.kv.groups - 1
        key = self.kv.object_key(c.key, c.blocks, g)
        try:
            raw = bytearray(self.store.get_bytes(key))
            q = len(self.kv.map.group_parts(g))
            raw[header_bytes(q, c.blocks) + (at - c.first_token) // CHUNK * self.kv.map.piece_bytes] ^= 0xFF
            self.store.remove(key)
            self.store.put(key, bytes(raw))
        except KvferryError:
            return False
        return True

    def describe(self):
        s = self.kv.stats
        where = ("GPU buffers, one verifying copy kernel per group" if self.kv.gpu else
                 "host buffers, pieces checked against the headers and copied by the CPU")
        how = ("the node's pool read in place (store views; %d pool mapping(s) registered with "
               "the GPU at set-up)" % self.mappings if self.use_views
               else "store reads through a stage")
        return {"cache": self.name, "transport": self.transport, "link": self.store.master_link,
                "throttle_delay_ms": self.throttle_ms, "throttle_target_gbs": self.throttle_gbs,
                "path": "chunk objects (kvferry.kv_chunks) of %d tokens in %d layer groups, "
                        "loaded group by group: %s, %s%s" % (
                            self.kv.chunk_tokens, self.kv.groups, how, where,
                            "; on a GPU, one pipeline over the groups: whole objects posted to "
                            "the copy engines into a GPU stage in segments, each slice "
                            "scattered once a later DMA is posted" if self.pipeline else ""),
                "pipeline": self.pipeline,
                "paged_blocks": self.blocks, "chunk_tokens": self.kv.chunk_tokens,
                "layer_groups": self.kv.groups, "pool_mappings_registered": self.mappings,
                "viewed_objects": s.viewed_objects, "put_viewed_objects": s.put_viewed_objects,
                "corrupt_misses": s.corrupt_misses, "load_errors": s.load_errors,
                "save_errors": s.save_errors}

    def _end_procs(self) -> None:
        """Restores KVF_FAULT and ends the node and the master."""
        if self.throttle_gbs:
            if self._fault_old is None:
                os.environ.pop("KVF_FAULT", None)
            else:
                os.environ["KVF_FAULT"] = self._fault_old
        for p in (getattr(self, "node", None), self.master):
            if p is not None:
                p.close()

    def close(self):
        try:
            kv, store = getattr(self, "kv", None), getattr(self, "store", None)
            if kv is not None:
                kv.close()
            if store is not None:
                store.close()
        finally:
            self._end_procs()
