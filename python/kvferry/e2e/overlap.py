"""Layer-wise loading of prefix KV into a transformers cache, overlapped
with the suffix's compute or before it.

The cache's tensors for the prefix are allocated first (empty) and the
copies of layer 0, 1, ... are queued on a side CUDA stream with one event
per layer (on CPU: a thread with one threading.Event per layer). The
model's attention calls ``Cache.update(k, v, layer_idx)`` layer after
layer; :class:`LayerwiseCache` makes layer i's update wait for layer i's
event, so layer i computes while layers i+1... are still loading.
The sequential variant waits for every layer before the forward pass.

Sequence lengths and masks come from the pre-sized tensors, so the
model sees a cache of ``hit`` tokens from the first layer on.

A paged GPU source (:class:`.caches.PagedSource`: kvferry.kv's verifying
kernels or the copy engines write straight into the buffers the model
reads) is loaded by a loader thread, one ``load_layers`` that hands each
layer over as it lands (a threading.Event each; overlapped), or by one
call before the forward pass (sequential). A source of chunk objects
(:class:`.remote.ChunkSource`, the remote tiers) is loaded by one ``ChunkStore.load`` on a thread
(:class:`GroupLoad`) that hands the buffers over layer group by layer
group: layer i waits for its group only. A layer whose chunks fail
verification marks the load :attr:`Loader.short`: the forward pass that
used it is discarded and the engine recomputes.

Every wait for a load is bounded (:data:`WAIT_S`).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, List, Optional

#: Seconds a layer's compute waits for its KV before the pass fails.
WAIT_S = 120.0
#: The interpreter's thread switch interval while a group load runs: the
#: loader's Python (descriptors, headers) and the forward pass's kernel
#: launches take turns at this pace instead of the default 5 ms, so the
#: launches of a group that has arrived do not wait behind the next
#: group's preparation.
SWITCH_S = 0.0005


class GroupLoad:
    """Loads a chunk source on a thread, group by group: ``src.load(
    group_done)`` calls ``group_done(g)`` once layer group g is in the
    buffers (whatever its outcome: verification is judged at the end);
    :meth:`wait` for layer l returns once its group ``src.group_of[l]``
    is. Needs no torch."""

    def __init__(self, src: Any, layers: int):
        self.src = src
        self._groups = [threading.Event() for _ in range(src.groups)]
        self._events = [self._groups[src.group_of[l]] for l in range(layers)]
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    def start(self) -> "GroupLoad":
        self._thread = threading.Thread(target=self._run, daemon=True, name="kvferry-e2e-groups")
        self._thread.start()
        return self

    def _run(self) -> None:
        old = sys.getswitchinterval()
        sys.setswitchinterval(min(old, SWITCH_S))
        try:
            self.src.load(group_done=lambda g: self._groups[g].set())
        except BaseException as e:  # surfaced by wait() and join()
            self.error = e
        finally:
            sys.setswitchinterval(old)
            for ev in self._groups:
                ev.set()

    def ready(self, layer: int) -> bool:
        """True once layer's group has been handed over."""
        return self._events[layer].is_set()

    def wait(self, layer: int, timeout: float = WAIT_S) -> None:
        if not self._events[layer].wait(timeout):
            raise TimeoutError("kvferry e2e: layer %d's KV not loaded in %.0f s" % (layer, timeout))
        if self.error is not None:
            raise self.error

    def join(self, timeout: float = WAIT_S) -> None:
        """Waits for the whole load (every group, the verdict)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError("kvferry e2e: the load did not end in %.0f s" % timeout)
        if self.error is not None:
            raise self.error


class Loader:
    """Queues a source's per-layer copies into fresh cache tensors."""

    def __init__(self, src: Any, info: Any, overlap: bool = True):
        import torch
        self.overlap = overlap
        self.torch = torch
        self.src, self.info = src, info
        self.cuda = info.device.type == "cuda"
        self.keys: List[Any] = []
        self.values: List[Any] = []
        self._events: List[Any] = []
        self._thread: Optional[threading.Thread] = None
        self._groups: Optional[GroupLoad] = None
        self.error: Optional[BaseException] = None

    def start(self) -> "Loader":
        torch, info, src = self.torch, self.info, self.src
        if hasattr(src, "layers"):  # already on the device
            for k, v in src.layers:
                self.keys.append(k)
                self.values.append(v)
            return self
        if hasattr(src, "group_of"):  # chunk objects, loaded group by group
            return self._start_grouped()
        if hasattr(src, "load_layers"):  # paged GPU buffers, kvferry.kv kernels
            return self._start_paged()
        s = src.tokens
        raw = []
        for _ in range(info.layers):
            kr = torch.empty((s, info.kv_heads, info.head_dim), dtype=info.dtype, device=info.device)
            vr = torch.empty_like(kr)
            raw.append((kr, vr))
            # [S, H, D] -> [1, H, S, D] views: the copies stay contiguous
            self.keys.append(kr.permute(1, 0, 2).unsqueeze(0))
            self.values.append(vr.permute(1, 0, 2).unsqueeze(0))
        if self.cuda:
            stream = torch.cuda.Stream(device=info.device)
            stream.wait_stream(torch.cuda.current_stream(info.device))
            with torch.cuda.stream(stream):
                for l, (kr, vr) in enumerate(raw):
                    src.copy_layer(l, kr, vr, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    self._events.append(ev)
            for kr, vr in raw:
                kr.record_stream(stream)
                vr.record_stream(stream)
        else:
            self._events = [threading.Event() for _ in range(info.layers)]

            def run() -> None:
                try:
                    for l, (kr, vr) in enumerate(raw):
                        src.copy_layer(l, kr, vr, non_blocking=False)
                        self._events[l].set()
                except BaseException as e:  # surfaced by wait()
                    self.error = e
                    for ev in self._events:
                        ev.set()

            self._thread = threading.Thread(target=run, daemon=True)
            self._thread.start()
        return self

    @property
    def short(self) -> bool:
        """True when a paged load verified fewer tokens than planned."""
        return getattr(self.src, "verified", self.src.tokens) < self.src.tokens

    def _start_paged(self) -> "Loader":
        src = self.src
        for l in range(self.info.layers):
            k, v = src.views(l)
            self.keys.append(k)
            self.values.append(v)
        if not self.overlap:
            src.load_all()
            return self
        self._events = [threading.Event() for _ in range(self.info.layers)]

        def run() -> None:
            try:
                # below src.tokens (short): the pass is redone
                src.load_layers(lambda l: self._events[l].set())
            except BaseException as e:  # surfaced by wait()
                self.error = e
            finally:
                for ev in self._events:
                    ev.set()

        self._thread = threading.Thread(target=run, daemon=True, name="kvferry-e2e-load")
        self._thread.start()
        return self

    def _start_grouped(self) -> "Loader":
        """The model reads the source's buffers in place; overlapped, a
        GroupLoad hands them over group by group, else one load now."""
        src = self.src
        for l in range(self.info.layers):
            k, v = src.views(l)
            self.keys.append(k)
            self.values.append(v)
        if self.overlap:
            self._groups = GroupLoad(src, self.info.layers).start()
        else:
            src.load()
        return self

    def wait(self, layer: int) -> None:
        if self._groups is not None:
            self._groups.wait(layer)
            return
        if not self._events:
            return
        ev = self._events[layer]
        if self.cuda and self._thread is None:
            self.torch.cuda.current_stream(self.info.device).wait_event(ev)
        else:
            if not ev.wait(WAIT_S):
                raise TimeoutError("kvferry e2e: layer %d not loaded in %.0f s" % (layer, WAIT_S))
            if self.error is not None:
                raise self.error

    def wait_all(self) -> None:
        """Waits for the whole load (bounded by WAIT_S per wait)."""
        if self._groups is not None:
            self._groups.join()
            return
        for l in range(len(self._events)):
            self.wait(l)
        if self._thread is not None:
            self._thread.join(WAIT_S)
            if self._thread.is_alive():
                raise TimeoutError("kvferry e2e: the load did not end in %.0f s" % WAIT_S)
            if self.error is not None:
                raise self.error


def make_cache(loader: Loader, overlap: bool) -> Any:
    """A DynamicCache holding the loader's prefix tensors; with overlap,
    each layer's first update waits for that layer's copy."""
    from transformers import DynamicCache

    class LayerwiseCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            pending = self._kvf_pending
            if pending is not None and layer_idx in pending:
                pending.discard(layer_idx)
                self._kvf_loader.wait(layer_idx)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    # (None, None) per layer: empty DynamicLayers, filled here with the
    # loader's tensors without touching their bytes (ddp_cache_data with
    # tensors would copy them at once, before the loads finish)
    cache = LayerwiseCache(ddp_cache_data=[(None, None)] * len(loader.keys))
    for layer, k, v in zip(cache.layers, loader.keys, loader.values):
        layer.dtype, layer.device = k.dtype, k.device
        layer.keys, layer.values = k, v
        layer.is_initialized = True
    if overlap:
        cache._kvf_pending = set(range(len(loader.keys)))
        cache._kvf_loader = loader
    else:
        loader.wait_all()
        cache._kvf_pending = None
    return cache
