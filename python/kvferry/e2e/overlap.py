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
kernels write straight into the buffers the model reads) is loaded by a
loader thread, one ``load_planned(plan, layers=[i])`` per layer with a
threading.Event each (overlapped), or by one call before the forward
pass (sequential). A layer whose chunks fail verification marks the
load :attr:`Loader.short`: the forward pass that used it is discarded
and the engine recomputes.
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional


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
        self.error: Optional[BaseException] = None

    def start(self) -> "Loader":
        torch, info, src = self.torch, self.info, self.src
        if hasattr(src, "layers"):  # already on the device
            for k, v in src.layers:
                self.keys.append(k)
                self.values.append(v)
            return self
        if hasattr(src, "load_layer"):  # paged GPU buffers, kvferry.kv kernels
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
                for l in range(self.info.layers):
                    if src.load_layer(l) < src.tokens:
                        break  # verification failed: the pass is redone
                    self._events[l].set()
            except BaseException as e:  # surfaced by wait()
                self.error = e
            finally:
                for ev in self._events:
                    ev.set()

        self._thread = threading.Thread(target=run, daemon=True, name="kvferry-e2e-load")
        self._thread.start()
        return self

    def wait(self, layer: int) -> None:
        if not self._events:
            return
        ev = self._events[layer]
        if self.cuda and self._thread is None:
            self.torch.cuda.current_stream(self.info.device).wait_event(ev)
        else:
            ev.wait()
            if self.error is not None:
                raise self.error

    def wait_all(self) -> None:
        for l in range(len(self._events)):
            self.wait(l)
        if self._thread is not None:
            self._thread.join()
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
