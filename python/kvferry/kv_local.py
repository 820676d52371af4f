"""The local tier of :mod:`kvferry.kv`: a GPU paged cache's chunks kept in
the process's own pinned host memory, moved by kvferry's copy kernels.

:class:`LocalKVCache` has :class:`kvferry.kv.KVCache`'s methods
(``chunk_keys``, ``lookup``, ``save``, ``load``, ``remove``, ``close``,
``stats``) with no store behind it: a pool of pinned host memory
(optionally registered with an engine, so peers can read it) cut into
one slot per chunk, least recently used slots reused first. A save is
one kernel that gathers the chunks' scattered blocks into their slots and
computes each block's checksum (XXH3-64, as ``kvf_checksum``); a load is
one kernel that scatters them back and checks every block against the
checksum recorded at save. A mismatch ends the hit there, counts in
``stats.corrupt_misses`` and the slot is dropped: the engine recomputes.

:meth:`LocalKVCache.plan_load` builds a load's descriptor table once;
:meth:`LocalKVCache.load_planned` then moves all of it, or one group of
layers per call (layer-wise loading overlapped with compute).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Sequence

from . import kv_gpu
from .errors import OK
from .kv import KVLayout, KVStats, chunk_keys, layer_rows

#: Layers whose DMAs a posted load keeps in flight (at most
#: kv_gpu.POSTS)
POSTS_AHEAD = 4


class LocalKVCache:
    """A GPU paged cache (``buffers``: the layout's buffers, torch CUDA
    tensors or anything registered as GPU memory) with chunks kept in
    ``capacity`` bytes of pinned host memory of this process. ``engine``
    (an Engine or Store, optional) registers the pool with it."""

    def __init__(self, layout: KVLayout, buffers: Sequence[Any], capacity: int,
                 engine: Any = None, device: Optional[int] = None):
        from .engine import Engine

        if len(buffers) != layout.num_buffers:
            raise ValueError("kvferry.kv: %s layout needs %d buffers, got %d"
                             % (layout.kind, layout.num_buffers, len(buffers)))
        if kv_gpu.gpu_count() == 0:
            raise ValueError("kvferry.kv: LocalKVCache needs a GPU and a CUDA build")
        self.layout, self.fingerprint = layout, layout.fingerprint()
        self.stats = KVStats()
        self._lock = threading.Lock()
        self._own_engine = engine is None
        self.engine = Engine(no_listen=True) if engine is None else getattr(engine, "engine", engine)
        self.regions = []
        self.pool: Optional[kv_gpu.PinnedBuffer] = None
        self._mover: Optional[kv_gpu.GpuMover] = None
        try:
            for b in buffers:
                r = self.engine.register(b)
                if not r.is_gpu or r.nbytes < layout.buffer_bytes():
                    r.deregister()
                    raise ValueError("kvferry.kv: LocalKVCache buffers are GPU memory "
                                     "of at least %d bytes" % layout.buffer_bytes())
                self.regions.append(r)
            self._table = kv_gpu.BlockTable(layout, self.regions)
            self.npc = layout.pieces_per_block
            self.slots = capacity // self._table.chunk_bytes
            if self.slots < 1:
                raise ValueError("kvferry.kv: capacity below one chunk (%d bytes)"
                                 % self._table.chunk_bytes)
            self.pool = kv_gpu.PinnedBuffer(self.slots * self._table.chunk_bytes)
            self.pool_region = self.pool.register(self.engine)
            self._mover = kv_gpu.GpuMover(self._table.side.device if device is None else device)
        except BaseException:
            self.close()
            raise
        self._free = list(range(self.slots - 1, -1, -1))
        # chunk key -> slot; order = recency. The checksums of each slot's
        # pieces, recorded at save, in one table.
        self._index: "OrderedDict[bytes, int]" = OrderedDict()
        np = kv_gpu._np
        self._sums: Any = (np.zeros((self.slots, self.npc), dtype=np.uint64) if np is not None
                           else [None] * self.slots)

    # -- keys and lookup ----------------------------------------------------

    def chunk_keys(self, tokens: Sequence[int]) -> List[bytes]:
        return chunk_keys(tokens, self.layout.block_size, self.fingerprint)

    def lookup(self, tokens: Sequence[int]) -> int:
        """Leading tokens held (a multiple of block_size); loads nothing."""
        with self._lock:
            self.stats.lookups += 1
            hit = 0
            for k in self.chunk_keys(tokens):
                if k not in self._index:
                    break
                hit += 1
        return hit * self.layout.block_size

    # -- save ---------------------------------------------------------------

    def _slot(self) -> int:
        if self._free:
            return self._free.pop()
        _, slot = self._index.popitem(last=False)  # least recently used
        return slot

    def save(self, tokens: Sequence[int], block_ids: Sequence[int]) -> int:
        """Saves the blocks of the full chunks of tokens (block i of the
        request in cache block block_ids[i]); chunks held already are
        skipped. Returns how many chunks were written."""
        keys = self.chunk_keys(tokens)
        n = min(len(keys), len(block_ids), self.slots)
        t = self._table
        with self._lock:
            todo = [i for i in range(n) if keys[i] not in self._index]
            for i in range(n):
                if keys[i] in self._index:
                    self._index.move_to_end(keys[i])
            slots = [self._slot() for _ in todo]
            self.stats.skipped_chunks += n - len(todo)
            if not todo:
                return 0
            t0 = time.perf_counter()
            lens = t.piece_lens(len(todo))
            dst = self._slot_offsets(slots)
            _, sums = self._mover.copy(t.side, self.pool.mem(), t.offsets([block_ids[i] for i in todo]),
                                       dst, lens)
            for j, i in enumerate(todo):
                self._index[keys[i]] = slots[j]
            if kv_gpu._np is not None:
                self._sums[kv_gpu._np.asarray(slots)] = sums.reshape(len(todo), self.npc)
            else:
                for j, slot in enumerate(slots):
                    self._sums[slot] = sums[j * self.npc:(j + 1) * self.npc]
            self.stats.t_d2h += time.perf_counter() - t0
            self.stats.saved_chunks += len(todo)
            self.stats.bytes_saved += len(todo) * t.chunk_bytes
        return len(todo)

    def _slot_offsets(self, slots: Sequence[int]):
        return self._table.at_chunks(slots)

    # -- load ---------------------------------------------------------------

    def load(self, tokens: Sequence[int], block_ids: Sequence[int]) -> int:
        """Loads the held prefix of tokens into cache blocks block_ids and
        returns how many tokens were loaded and verified (a multiple of
        block_size): one kernel for every piece. A chunk whose bytes fail
        their checksums ends the prefix, is dropped and counts in
        stats.corrupt_misses."""
        if kv_gpu._np is None:
            return self._load_lists(tokens, block_ids)
        plan = self.plan_load(tokens, block_ids)
        got = self.load_planned(plan)
        with self._lock:
            ok = got // self.layout.block_size
            self.stats.hit_chunks += ok
            self.stats.loaded_chunks += ok
            self.stats.miss_chunks += plan.nkeys - ok
        return got

    def plan_load(self, tokens: Sequence[int], block_ids: Sequence[int]) -> "LoadPlan":
        """Looks up the held prefix of tokens and builds, once, the
        descriptor table of its pieces into block_ids and their recorded
        checksums, piece-major (the pieces of one layer are contiguous).
        :meth:`load_planned` then moves all of it or a group of layers per
        call. Needs numpy."""
        np = kv_gpu._np
        if np is None:
            raise ValueError("kvferry.kv: plan_load needs numpy")
        keys = self.chunk_keys(tokens)
        n = min(len(keys), len(block_ids))
        t0 = time.perf_counter()
        with self._lock:
            self.stats.lookups += 1
            hits: List[int] = []
            for k in keys[:n]:
                e = self._index.get(k)
                if e is None:
                    break
                self._index.move_to_end(k)
                hits.append(e)
            ok = len(hits)
            expect = self._sums[np.asarray(hits, dtype=np.int64)].T.copy() if ok else None
        t = self._table
        slots = np.asarray(hits, dtype=np.uint64)
        blocks = np.asarray(block_ids[:ok], dtype=np.uint64)
        blk = np.empty((self.npc, ok, 3), dtype=np.uint64)
        lens = t._lens[:, None]
        blk[:, :, 0] = slots[None, :] * np.uint64(t.chunk_bytes) + t._within.reshape(-1, 1)
        blk[:, :, 1] = t._rel0.reshape(-1, 1) + blocks[None, :] * t._stride.reshape(-1, 1)
        blk[:, :, 2] = lens
        plan = LoadPlan(keys[:ok], hits, blk, expect, len(keys), self.layout.block_size)
        with self._lock:
            self.stats.t_query += time.perf_counter() - t0
        return plan

    def _layer_pieces(self, layers: Optional[Sequence[int]]) -> Any:
        """The piece rows of layers (a slice for a contiguous range)."""
        rows = layer_rows(self.layout, layers)
        if rows == list(range(rows[0], rows[-1] + 1)):
            return slice(rows[0], rows[-1] + 1)
        return rows

    def load_planned(self, plan: "LoadPlan", layers: Optional[Sequence[int]] = None) -> int:
        """Moves the planned pieces (of layers only, when given: a vllm or
        MLA layout) into the GPU cache with one verifying kernel, in the
        calling thread (the GIL is released while the kernel runs; the
        bytes are in the cache when it returns). Returns the tokens whose
        pieces (of those layers) are verified: a mismatch drops that chunk,
        counts in stats.corrupt_misses and shortens the plan, so later
        groups load only the verified prefix."""
        np = kv_gpu._np
        rows = self._layer_pieces(layers)
        t = self._table
        with self._lock:
            ok = plan.ok
            if ok == 0:
                return 0
            t0 = time.perf_counter()
            if isinstance(rows, slice) and ok == plan.n:
                blk, expect = plan.blk[rows].reshape(-1, 3), plan.expect[rows].reshape(-1)
            else:
                blk = np.ascontiguousarray(plan.blk[rows, :ok]).reshape(-1, 3)
                expect = np.ascontiguousarray(plan.expect[rows, :ok]).reshape(-1)
            sums = np.empty(len(expect), dtype=np.uint64)
            st = self._mover.copy_table(self.pool.mem(), t.side, blk, expect, sums)
            if st != OK:
                bad = np.nonzero(sums != expect)[0]
                ok = int((bad % ok).min()) if len(bad) else 0
                self.stats.corrupt_misses += 1
                key, slot = plan.keys[ok], plan.slots[ok]
                if self._index.get(key) == slot:
                    self._free.append(self._index.pop(key))
                plan.ok = ok
            self.stats.t_h2d += time.perf_counter() - t0
            self.stats.bytes_loaded += ok * int(t._lens[rows].sum())
        return ok * self.layout.block_size

    def load_layers(self, plan: "LoadPlan", layer_done: Callable[[int], None],
                    ahead: int = POSTS_AHEAD) -> int:
        """Moves the planned pieces layer by layer (a vllm or MLA layout),
        calling ``layer_done(l)`` once layer l's pieces are in the cache,
        and returns the tokens loaded and verified in every layer:
        ``plan.tokens``, or 0 when a layer's pieces failed verification
        (the layers after it are not moved; ``plan.ok`` keeps the chunks
        before the bad one). With the copy-engine checksum mode
        (``gpu_sum`` engines) the DMAs of ``ahead`` layers are posted
        before the first is waited for, so the engines go from layer to
        layer without waiting for this thread, and each layer is
        checksummed in GPU memory right after its hand-over: a forward
        pass that used a layer found bad is the caller's to redo (the 0
        says so). ``auto`` (the default) does the same: a layer-wise load
        runs beside the model's kernels, which the fused kernel would
        keep from the multiprocessors. ``fused`` and ``after``: one
        :meth:`load_planned` per layer, verified before its hand-over."""
        layers = list(range(self.layout.num_layers))
        flags = self._mover.flags
        if flags and not flags & kv_gpu.SUM_ENGINES:
            for layer in layers:
                ok = plan.ok
                if ok == 0 or self.load_planned(plan, [layer]) < ok * plan.block_size:
                    return 0
                layer_done(layer)
            return plan.tokens
        with self._lock:
            t0 = time.perf_counter()
            try:
                whole = self._posted_layers(plan, layers, layer_done,
                                            max(1, min(ahead, kv_gpu.POSTS)))
            finally:
                self.stats.t_h2d += time.perf_counter() - t0
        return plan.tokens if whole else 0

    def _posted_layers(self, plan: "LoadPlan", layers: List[int],
                       layer_done: Callable[[int], None], ahead: int) -> bool:
        """load_layers' posted pipeline (the lock held): post ahead, wait,
        hand over, verify. False when a layer failed verification (the
        posts stop there) or the plan is empty."""
        np, t, ok = kv_gpu._np, self._table, plan.ok
        if ok == 0:
            return False
        tables = []
        for layer in layers:
            rows = self._layer_pieces([layer])
            tables.append((np.ascontiguousarray(plan.blk[rows, :ok]).reshape(-1, 3),
                           np.ascontiguousarray(plan.expect[rows, :ok]).reshape(-1)))
        tickets: List[int] = []
        try:
            for i, layer in enumerate(layers):
                while len(tickets) < min(len(layers), i + ahead):
                    tickets.append(self._mover.post_table(self.pool.mem(), t.side,
                                                          tables[len(tickets)][0]))
                self._mover.wait(tickets[i])
                layer_done(layer)
                if not self._verify_pieces(plan, *tables[i]):
                    return False
                self.stats.bytes_loaded += int(tables[i][0][:, 2].sum())
        finally:
            if tickets:
                self._mover.wait(tickets[-1])  # nothing may still write the cache
        return True

    def _verify_pieces(self, plan: "LoadPlan", blk: Any, expect: Any) -> bool:
        """Checksums pieces where they landed (GPU memory: blk's cache
        offsets and lengths, ``plan.ok`` chunks per piece row) against
        expect; on a mismatch drops the first bad chunk, cuts the plan to
        the chunks before it and answers False."""
        np, ok = kv_gpu._np, plan.ok
        sums = np.empty(len(expect), dtype=np.uint64)
        self._mover.checksums(self._table.side, np.ascontiguousarray(blk[:, 1]),
                              np.ascontiguousarray(blk[:, 2]), sums)
        bad = np.nonzero(sums != expect)[0]
        if not len(bad):
            return True
        first = int((bad % ok).min())
        self.stats.corrupt_misses += 1
        key, slot = plan.keys[first], plan.slots[first]
        if self._index.get(key) == slot:
            self._free.append(self._index.pop(key))
        plan.ok = first
        return False

    def _load_lists(self, tokens: Sequence[int], block_ids: Sequence[int]) -> int:
        """load without numpy: descriptor lists built per call."""
        keys = self.chunk_keys(tokens)
        n = min(len(keys), len(block_ids))
        t = self._table
        with self._lock:
            self.stats.lookups += 1
            t0 = time.perf_counter()
            hits: List[int] = []
            for k in keys[:n]:
                e = self._index.get(k)
                if e is None:
                    break
                self._index.move_to_end(k)
                hits.append(e)
            t1 = time.perf_counter()
            ok = len(hits)
            if hits:
                expect = self._expect(hits)
                st, sums = self._mover.copy(self.pool.mem(), t.side, self._slot_offsets(hits),
                                            t.offsets(block_ids[:ok]), t.piece_lens(ok), expect=expect)
                if st != OK:
                    ok = kv_gpu.first_mismatch(sums, expect) // self.npc
                    self.stats.corrupt_misses += 1
                    self._free.append(self._index.pop(keys[ok]))
            self.stats.t_query += t1 - t0
            self.stats.t_h2d += time.perf_counter() - t1
            self.stats.hit_chunks += ok
            self.stats.loaded_chunks += ok
            self.stats.miss_chunks += len(keys) - ok
            self.stats.bytes_loaded += ok * t.chunk_bytes
        return ok * self.layout.block_size

    def _expect(self, slots: List[int]):
        """The recorded checksums of the pieces of slots, in order."""
        if kv_gpu._np is not None:
            return self._sums[kv_gpu._np.asarray(slots)].reshape(-1)
        out = kv_gpu.array("Q")
        for slot in slots:
            out.extend(self._sums[slot])
        return out

    # -- housekeeping -------------------------------------------------------

    def remove(self, tokens: Sequence[int]) -> int:
        removed = 0
        with self._lock:
            for k in self.chunk_keys(tokens):
                e = self._index.pop(k, None)
                if e is not None:
                    self._free.append(e)
                    removed += 1
        return removed

    def slot_view(self, tokens: Sequence[int], chunk: int) -> Optional[memoryview]:
        """The pool bytes of one held chunk (tests corrupt them)."""
        e = self._index.get(self.chunk_keys(tokens)[chunk])
        if e is None:
            return None
        cb = self._table.chunk_bytes
        return memoryview(self.pool.view).cast("B")[e * cb:(e + 1) * cb]

    def close(self) -> None:
        if self._mover is not None:
            self._mover.close()
            self._mover = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        for r in self.regions:
            try:
                r.deregister()
            except Exception:
                pass
        self.regions = []
        if self._own_engine and self.engine is not None:
            self.engine.close()
            self.engine = None

    def __enter__(self) -> "LocalKVCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LoadPlan:
    """A planned load. From :meth:`LocalKVCache.plan_load`: the held
    chunks' keys and pool slots, the descriptor table ``blk`` (pieces x
    chunks x (pool offset, cache offset, length)) and the recorded
    checksums ``expect`` (pieces x chunks). From
    :meth:`kvferry.kv.KVCache.plan_load`: the stored chunks' keys, their
    cache blocks (``slots``) and manifests (``expect``, chunk x piece),
    no table. ``ok``: chunks still good (a failed verification shortens
    it); ``tokens``: ``ok`` in tokens."""

    def __init__(self, keys: List[bytes], slots: List[int], blk: Any, expect: Any,
                 nkeys: int, block_size: int):
        self.keys, self.slots, self.blk, self.expect = keys, slots, blk, expect
        self.n = self.ok = len(slots)
        self.nkeys, self.block_size = nkeys, block_size

    @property
    def tokens(self) -> int:
        return self.ok * self.block_size


__all__ = ["LocalKVCache", "LoadPlan"]
