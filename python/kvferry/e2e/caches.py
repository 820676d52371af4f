"""The cache configurations an end-to-end run compares.

- ``none``: no cache; every request is a full single-shot prefill.
- ``local``: prefix KV in kvferry-registered (pinned, where CUDA is)
  host memory of the serving process; chunks verified with kvferry's
  checksum on every load.
- ``remote-shm``, ``remote-tcp``, ``remote-tcp-throttled``: a kvferry
  store (``master`` and ``node`` processes) holding chunk objects
  (:mod:`kvferry.kv_chunks`), loaded layer group by layer group into a
  paged cache; see :mod:`.remote`.
- ``gpu``: the KV stays in GPU memory (the upper bound: no transfer).

On a GPU (torch sees CUDA and kvferry's library has its GPU kernels:
:func:`gpu_paths`), ``local`` binds kvferry.kv to a paged GPU cache
instead: :class:`GpuLocalTier` is a :class:`kvferry.kv_local.LocalKVCache`
(one scatter kernel from pinned host memory with the checksums computed
in the kernel). The paged cache's block is the 256-token chunk and a
request's blocks are blocks 0, 1, ... of one buffer per layer, so layer
l's loaded keys are ``buf[0]`` seen as ``[S, H, D]`` and reach the model
as a ``[1, H, S, D]`` view (:func:`paged_views`): the kernel writes the
bytes the model reads, no copy after it. :class:`PagedSource` loads all
layers in one call (sequential) or one layer per call (overlapped, see
:mod:`.overlap`). Elsewhere (CPU) the host tier below is used.

The local and GPU-resident tiers key 256-token chunks with
:func:`kvferry.kv.chunk_keys` over the prefix tokens and the layout's
fingerprint (a vLLM-style per-layer layout ``[2, blocks, 256, kv_heads,
head_dim]``), so a chunk is found only by the same tokens, model and
layout (the remote tiers' chunk objects chain the same keys). A host
tier's :meth:`fetch` returns a :class:`Source` whose ``copy_layer`` moves
one layer into GPU (or CPU) tensors; :mod:`.overlap` schedules those
copies.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Sequence, Tuple

from .. import _lib
from ..kv import KVLayout, chunk_keys

CHUNK = 256


def _torch():
    import torch
    return torch


def layout_for(info: Any, num_blocks: int) -> KVLayout:
    return KVLayout.vllm(info.name, str(info.dtype), info.layers, max(1, num_blocks), CHUNK,
                         info.kv_heads, info.head_dim)


def _runs(slots: Sequence[int]) -> List[Tuple[int, int]]:
    """Consecutive slots grouped: [(first, count), ...] in order."""
    out: List[Tuple[int, int]] = []
    for s in slots:
        if out and out[-1][0] + out[-1][1] == s:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((s, 1))
    return out


class Source:
    """Verified prefix KV in host buffers, layer by layer: bufs[l] is
    [2, blocks, 256, H, D]; the prefix is the blocks of ``runs``."""

    def __init__(self, bufs: List[Any], runs: List[Tuple[int, int]], tokens: int):
        self.bufs, self.runs, self.tokens = bufs, runs, tokens

    def copy_layer(self, layer: int, k_dst: Any, v_dst: Any, non_blocking: bool) -> None:
        """k_dst, v_dst: [tokens, H, D] (views of the cache's tensors)."""
        b = self.bufs[layer]
        t = 0
        for first, n in self.runs:
            m = n * CHUNK
            k_dst[t:t + m].copy_(b[0, first:first + n].flatten(0, 1), non_blocking=non_blocking)
            v_dst[t:t + m].copy_(b[1, first:first + n].flatten(0, 1), non_blocking=non_blocking)
            t += m


class GpuSource:
    """Prefix KV already on the device ([1, H, S, D] per layer)."""

    def __init__(self, layers: List[Tuple[Any, Any]], tokens: int):
        self.layers, self.tokens = layers, tokens


def _size(s: str) -> int:
    """"8G" -> bytes."""
    s = str(s).strip().upper()
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    return int(float(s.rstrip("KMGT")) * m)


def _pool(info: Any, blocks: int, pin: bool) -> List[Any]:
    torch = _torch()
    return [torch.empty((2, blocks, CHUNK, info.kv_heads, info.head_dim), dtype=info.dtype,
                        pin_memory=pin) for _ in range(info.layers)]


def _to_host(cache: Any, bufs: List[Any], chunk: int, slot: int) -> None:
    """Copies chunk ``chunk`` of every layer of a DynamicCache into block
    ``slot`` of the host buffers."""
    a, b = chunk * CHUNK, (chunk + 1) * CHUNK
    for l, layer in enumerate(cache.layers):
        bufs[l][0, slot].copy_(layer.keys[0, :, a:b].transpose(0, 1))
        bufs[l][1, slot].copy_(layer.values[0, :, a:b].transpose(0, 1))


class Tier:
    name = "none"
    remote = False

    def lookup(self, tokens: Sequence[int]) -> int:
        return 0

    def fetch(self, tokens: Sequence[int], hit: int) -> Tuple[Any, int, Dict[str, float], int]:
        """(source, verified tokens, timings, bytes read remotely)."""
        raise NotImplementedError

    def save(self, tokens: Sequence[int], cache: Any, have: int) -> int:
        return 0

    def corrupt(self, tokens: Sequence[int], chunk: int) -> bool:
        return False

    def describe(self) -> Dict[str, Any]:
        return {"cache": self.name}

    def close(self) -> None:
        pass


class LocalTier(Tier):
    """Pinned host memory of this process, registered with a kvferry
    engine; an index from chunk key to block and per-piece checksums."""

    name = "local"

    def __init__(self, info: Any, capacity_bytes: int):
        from ..engine import Engine
        torch = _torch()
        per_block = 2 * CHUNK * info.kv_heads * info.head_dim * info.dtype.itemsize * info.layers
        self.blocks = max(1, capacity_bytes // per_block)
        self.bufs = _pool(info, self.blocks, torch.cuda.is_available())
        self.engine = Engine(no_listen=True)
        self.regions = [self.engine.register(b) for b in self.bufs]
        self.fp = layout_for(info, self.blocks).fingerprint()
        self.index: Dict[bytes, Tuple[int, Tuple[int, ...]]] = {}
        self.next = 0
        self.full = 0

    def _keys(self, tokens: Sequence[int]) -> List[bytes]:
        return chunk_keys(tokens, CHUNK, self.fp)

    def lookup(self, tokens: Sequence[int]) -> int:
        n = 0
        for k in self._keys(tokens):
            if k not in self.index:
                break
            n += 1
        return n * CHUNK

    def _sums(self, slot: int) -> Tuple[int, ...]:
        ck = _lib.lib().kvf_checksum
        out = []
        for b in self.bufs:
            for kv in (0, 1):
                t = b[kv, slot]
                out.append(ck(t.data_ptr(), t.numel() * t.element_size()))
        return tuple(out)

    def fetch(self, tokens, hit):
        t0 = time.perf_counter()
        slots = []
        for k in self._keys(tokens)[: hit // CHUNK]:
            slot, sums = self.index[k]
            if self._sums(slot) != sums:
                break
            slots.append(slot)
        t1 = time.perf_counter()
        got = len(slots) * CHUNK
        return Source(self.bufs, _runs(slots), got), got, {"verify": t1 - t0}, 0

    def save(self, tokens, cache, have):
        written = 0
        for i, k in enumerate(self._keys(tokens)):
            if i < have // CHUNK or k in self.index:
                continue
            if self.next >= self.blocks:
                self.full += 1
                break
            slot = self.next
            self.next += 1
            _to_host(cache, self.bufs, i, slot)
            self.index[k] = (slot, self._sums(slot))
            written += 1
        return written

    def corrupt(self, tokens, chunk):
        keys = self._keys(tokens)
        if chunk >= len(keys) or keys[chunk] not in self.index:
            return False
        slot = self.index[keys[chunk]][0]
        t = self.bufs[0][0, slot].view(-1)
        t[0] = t[0] + 1 if t[0] == 0 else -t[0]
        return True

    def describe(self):
        return {"cache": "local", "host_pool_blocks": self.blocks,
                "host_pool_pinned": str(self.bufs[0].is_pinned())}

    def close(self):
        for r in self.regions:
            r.deregister()
        self.regions = []
        self.engine.close()


class GpuTier(Tier):
    """Prefix KV kept on the device: the upper bound, nothing moves."""

    name = "gpu"

    def __init__(self, info: Any, capacity_bytes: int):
        self.fp = layout_for(info, 1).fingerprint() + "-gpu"
        self.cap, self.used = capacity_bytes, 0
        self.index: Dict[bytes, Tuple[int, List[Tuple[Any, Any]]]] = {}
        self.per_token = info.kv_bytes_per_token()

    def lookup(self, tokens):
        best = 0
        for i, k in enumerate(chunk_keys(tokens, CHUNK, self.fp)):
            if k not in self.index:
                break
            best = i + 1
        return best * CHUNK

    def fetch(self, tokens, hit):
        k = chunk_keys(tokens[:hit], CHUNK, self.fp)[-1]
        _, layers = self.index[k]
        return GpuSource([(a[:, :, :hit], b[:, :, :hit]) for a, b in layers], hit), hit, {}, 0

    def save(self, tokens, cache, have):
        keys = chunk_keys(tokens, CHUNK, self.fp)
        n = len(keys) * CHUNK
        if not keys or keys[-1] in self.index or self.used + n * self.per_token > self.cap:
            return 0
        layers = [(l.keys[:, :, :n].clone(), l.values[:, :, :n].clone()) for l in cache.layers]
        self.used += n * self.per_token
        for i, k in enumerate(keys):
            if k not in self.index:
                self.index[k] = (i, layers)
        return len(keys)


def gpu_paths(info: Any) -> bool:
    """True when the tiers can use kvferry.kv's GPU paths: the model is
    on a CUDA device and kvferry's library has GPU kernels and a GPU."""
    try:
        from .. import kv_gpu
        return (info.device.type == "cuda" and _torch().cuda.is_available()
                and kv_gpu.gpu_count() > 0 and kv_gpu.has_fused_checksums())
    except Exception:
        return False


def _gpu_bufs(info: Any, blocks: int) -> List[Any]:
    """One paged buffer per layer, [2, blocks, 256, H, D] on the device."""
    torch = _torch()
    return [torch.empty((2, blocks, CHUNK, info.kv_heads, info.head_dim), dtype=info.dtype,
                        device=info.device) for _ in range(info.layers)]


def paged_views(buf: Any, tokens: int) -> Tuple[Any, Any]:
    """The first ``tokens`` keys and values of a paged buffer ([2, blocks,
    256, H, D]; its blocks 0.. seen as one [S, H, D] tensor) as the
    [1, H, S, D] views the model's cache takes: no copy."""
    k = buf[0].flatten(0, 1)[:tokens]
    v = buf[1].flatten(0, 1)[:tokens]
    return k.permute(1, 0, 2).unsqueeze(0), v.permute(1, 0, 2).unsqueeze(0)


def _stats(kv: Any) -> Tuple[float, float, float, int, int]:
    s = kv.stats
    return s.t_query, s.t_read, s.t_h2d, s.bytes_loaded, s.corrupt_misses


class PagedSource:
    """A prefix held by a kvferry.kv cache bound to the paged GPU buffers
    ``bufs`` (request block i = cache block i). :meth:`load_all` loads
    every layer (one call), :meth:`load_layers` every layer, handing each
    over as it lands; both return the tokens verified by the GPU kernels,
    and :attr:`verified` keeps the smallest: below ``tokens`` a chunk
    failed verification and the forward pass that used these buffers must
    be recomputed."""

    def __init__(self, tier: "Tier", kv: Any, tokens: Sequence[int], hit: int,
                 plan: Any = None):
        self.tier, self.kv, self.ids, self.tokens = tier, kv, list(tokens[:hit]), hit
        self.bufs, self.plan, self.verified = tier.bufs, plan, hit
        self._s0 = _stats(kv)

    def _plan(self) -> Any:
        if self.plan is None:
            self.plan = self.kv.plan_load(self.ids, list(range(self.tokens // CHUNK)))
        return self.plan

    def _got(self, n: int) -> int:
        self.verified = min(self.verified, n)
        return n

    def load_all(self) -> int:
        if self.plan is None:
            # remote: the store's pipelined load (reads overlap the
            # verifying scatter); local without numpy: kv.load
            return self._got(self.kv.load(self.ids, list(range(self.tokens // CHUNK))))
        return self._got(self.kv.load_planned(self._plan()))

    def load_layers(self, layer_done: Any) -> int:
        """Every layer in order, ``layer_done(l)`` once layer l is in the
        buffers (LocalKVCache.load_layers: with the copy-engine checksum
        mode the DMAs of later layers are posted ahead and each layer is
        verified after its hand-over; below ``tokens``, redo the pass)."""
        return self._got(self.kv.load_layers(self._plan(), layer_done))

    def views(self, layer: int) -> Tuple[Any, Any]:
        return paged_views(self.bufs[layer], self.tokens)

    def done(self) -> Tuple[Dict[str, float], int]:
        """The load's split from kvferry.kv's stats (query: manifests or
        plan; read: store reads; h2d_verify: the verifying scatter) and
        the bytes it moved."""
        q, r, h, nb, _ = (a - b for a, b in zip(_stats(self.kv), self._s0))
        t = {"kv_query": q, "kv_h2d_verify": h}
        if self.tier.remote:
            t["kv_read"] = r
        return t, nb if self.tier.remote else 0


def _from_cache(cache: Any, bufs: List[Any], a: int, n: int) -> None:
    """Copies tokens a..n of every layer of a DynamicCache into the paged
    buffers' blocks 0.. (D2D), then waits for the copies: kvferry's
    kernels read the buffers on their own stream."""
    if n <= a:
        return
    for l, layer in enumerate(cache.layers):
        bufs[l][0].flatten(0, 1)[a:n].copy_(layer.keys[0, :, a:n].transpose(0, 1))
        bufs[l][1].flatten(0, 1)[a:n].copy_(layer.values[0, :, a:n].transpose(0, 1))
    if bufs[0].device.type == "cuda":
        _torch().cuda.synchronize(bufs[0].device)


class GpuLocalTier(Tier):
    """kvferry.kv_local.LocalKVCache over a paged GPU cache: chunks in
    this process's pinned memory, loaded by one verifying scatter kernel
    (per call: all layers, or one layer when overlapped)."""

    name = "local"

    def __init__(self, info: Any, max_tokens: int, capacity_bytes: int):
        from ..kv_local import LocalKVCache
        self.blocks = max(1, -(-max_tokens // CHUNK))
        self.bufs = _gpu_bufs(info, self.blocks)
        self.kv = LocalKVCache(layout_for(info, self.blocks), self.bufs, capacity_bytes,
                               device=info.device.index or 0)

    def lookup(self, tokens):
        return self.kv.lookup(tokens)

    def fetch(self, tokens, hit):
        from .. import kv_gpu
        src = PagedSource(self, self.kv, tokens, hit)
        if kv_gpu._np is None:  # plan_load needs numpy
            return src, hit, {}, 0
        src.plan = self.kv.plan_load(list(tokens[:hit]), list(range(hit // CHUNK)))
        return src, src.plan.tokens, {}, 0

    def save(self, tokens, cache, have):
        n = min(len(tokens) // CHUNK, self.blocks)
        _from_cache(cache, self.bufs, have, n * CHUNK)
        return self.kv.save(tokens[: n * CHUNK], list(range(n)))

    def corrupt(self, tokens, chunk):
        keys = self.kv.chunk_keys(tokens)
        if chunk >= len(keys):
            return False
        mv = self.kv.slot_view(tokens, chunk)
        if mv is None:
            return False
        mv[0] ^= 0xFF
        return True

    def describe(self):
        return {"cache": "local", "path": "LocalKVCache: pinned host pool; overlapped loads "
                "posted to the copy engines layer by layer, each layer checksummed in GPU "
                "memory (gpu_sum auto, engines), or the verifying scatter kernel (fused)",
                "pool_slots": self.kv.slots, "paged_blocks": self.blocks,
                "corrupt_misses": self.kv.stats.corrupt_misses}

    def close(self):
        self.kv.close()


def make(name: str, info: Any, max_tokens: int, host_bytes: int, node_pool: str,
         throttle_gbs: float = 0.0, chunk_tokens: int = 0, layer_groups: int = 0) -> Tier:
    """The tier of a configuration; chunk_tokens and layer_groups shape
    the remote tiers' chunk objects (0: :mod:`.remote`'s defaults).
    remote-shm-piped: remote-shm whose GPU loads run as one pipeline of
    posted DMAs through a GPU stage (ChunkStore ``pipeline``)."""
    if name == "none":
        return Tier()
    gpu = gpu_paths(info)
    if name == "local":
        return GpuLocalTier(info, max_tokens, host_bytes) if gpu else LocalTier(info, host_bytes)
    if name == "gpu":
        return GpuTier(info, host_bytes)
    parts = name.split("-")
    plain = parts[1:2] in (["shm"], ["tcp"]) and parts[2:] in ([], ["throttled"])
    if parts[0] == "remote" and (plain or parts[1:] == ["shm", "piped"]):
        from . import remote
        return remote.RemoteTier(info, max_tokens, parts[1], node_pool,
                                 throttle_gbs if "throttled" in parts else 0.0,
                                 chunk_tokens=chunk_tokens or remote.CHUNK_TOKENS,
                                 layer_groups=layer_groups or remote.LAYER_GROUPS,
                                 pipeline="piped" in parts)
    raise ValueError("cache is none, local, gpu, remote-shm, remote-tcp, remote-tcp-throttled "
                     "or remote-shm-piped")
