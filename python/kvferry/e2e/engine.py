"""A first-come-first-served, batch-1 serving loop over a trace.

Per request: look the prefix's 256-token chunks up in the cache tier
(the query), ask the policy whether to load a hit, load it (remote read,
verify, then host-to-device layer by layer, overlapped with the suffix's
compute or before it), prefill what is left, take the first greedy token
(TTFT), decode the rest one token at a time (ITL), then save the prefix
chunks the tier lacks (after the last token: off the latency path).

A load that fails verification for any chunk is dropped whole and the
prefix recomputed ("corrupt"), so a damaged block costs time, never a
different output. With a cache tier, a prefix that is not loaded is
prefilled on its own and the suffix after it (the computation a later
hit replaces, so hit and recompute are compared like for like); the
``none`` configuration prefills prompt in one pass.

The remote tiers (everywhere) and the local tier on a GPU verify while
they load (:class:`.remote.ChunkSource`, :class:`.caches.PagedSource`),
so a damaged chunk is found while (or, sequential, before) the forward
pass runs: that pass is thrown away and the request recomputed, decision
"corrupt", like a refused fetch.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Optional

from .caches import CHUNK, Tier
from .overlap import Loader, make_cache
from .stats import Served


class _Refused(Exception):
    """A paged load verified less than it planned: recompute."""


class Engine:
    def __init__(self, info: Any, tier: Tier, policy: Any, overlap: bool = True,
                 pool_seed: int = 0, keep_logits: bool = False, realtime: bool = True):
        self.info, self.tier, self.policy, self.overlap = info, tier, policy, overlap
        self.pool_seed, self.keep_logits, self.realtime = pool_seed, keep_logits, realtime
        self.logits: dict = {}
        import torch
        self.torch = torch

    def _sync(self) -> None:
        if self.info.device.type == "cuda":
            self.torch.cuda.synchronize(self.info.device)

    def forward(self, ids: List[int], cache: Any) -> Any:
        t = self.torch.tensor([ids], dtype=self.torch.long, device=self.info.device)
        out = self.info.model(input_ids=t, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def prefill(self, tokens: List[int], nprefix: int, src: Any, split: dict) -> Any:
        """The cache and the last position's logits for tokens, the first
        ``src.tokens`` coming from src (None: computed)."""
        from transformers import DynamicCache
        now = time.perf_counter
        if src is not None:
            t0 = now()
            loader = Loader(src, self.info, self.overlap).start()
            cache = make_cache(loader, self.overlap)
            if not self.overlap:
                self._sync()
                split["h2d"] = now() - t0
            logits = None
            if not loader.short:
                logits = self.forward(tokens[src.tokens:], cache)
            # the whole load, before its buffers are reused or judged
            loader.wait_all()
            if loader.short:
                raise _Refused()
            return cache, logits
        cache = DynamicCache()
        if self.tier.name == "none" or nprefix == 0:
            return cache, self.forward(tokens, cache)
        self.forward(tokens[:nprefix], cache)
        return cache, self.forward(tokens[nprefix:], cache)

    def serve_one(self, req: Any, arrival: float, start: float,
                  tokens: Optional[List[int]] = None) -> Served:
        """Serves req from start; tokens: its ids, drawn by the client
        before it arrives (None: drawn here, inside the service time)."""
        torch, now = self.torch, time.perf_counter
        if tokens is None:
            tokens = req.tokens(self.pool_seed)
        nprefix = req.prefix_len // CHUNK * CHUNK
        split: dict = {}
        t0 = now()
        hit = self.tier.lookup(tokens[:nprefix]) if self.tier.name != "none" else 0
        split["query"] = now() - t0
        decision = "miss" if hit == 0 else ("load" if self.policy.load(hit) else "recompute")
        src, nbytes = None, 0
        if decision == "load":
            src, got, times, nbytes = self.tier.fetch(tokens[:hit], hit)
            split.update(times)
            if self.tier.remote and times.get("read", 0) > 0:
                self.policy.observe_link(nbytes, times["read"])
            if got < hit:
                decision, src = "corrupt", None
        with torch.no_grad():
            t1 = now()
            try:
                cache, logits = self.prefill(tokens, nprefix, src, split)
            except _Refused:
                decision, paged, src = "corrupt", src, None
                self._sync()
                cache, logits = self.prefill(tokens, nprefix, None, split)
            else:
                paged = src
            if paged is not None and hasattr(paged, "done"):
                times, nbytes = paged.done()
                split.update(times)
                if self.tier.remote and times.get("kv_read", 0) > 0:
                    self.policy.observe_link(nbytes, times["kv_read"])
            tok = int(torch.argmax(logits))
            self._sync()
            first = now()
            split["compute"] = first - t1 - split.get("h2d", 0.0)
            if self.keep_logits:
                self.logits[req.rid] = logits.float().cpu()
            out, itl = [tok], []
            for _ in range(req.out_tokens - 1):
                t = now()
                tok = int(torch.argmax(self.forward([tok], cache)))
                self._sync()
                itl.append(now() - t)
                out.append(tok)
        end = now()
        if self.tier.name != "none" and nprefix:
            self.tier.save(tokens[:nprefix], cache, src.tokens if src is not None else 0)
        loaded = src.tokens if src is not None else 0
        return Served(req.rid, req.prefix_len, len(tokens), arrival, start, first, end, itl,
                      hit, loaded, decision, nbytes, out, split)

    def serve(self, requests: List[Any], deadline: Optional[float] = None,
              on_done: Optional[Callable[[Served], None]] = None) -> List[Served]:
        """Serves requests in arrival order; arrivals are replayed in real
        time (or back to back without ``realtime``). Stops taking requests
        at ``deadline`` (a perf_counter time)."""
        now = time.perf_counter
        t0 = now()
        out = []
        for req in sorted(requests, key=lambda r: (r.arrival_s, r.rid)):
            # the client's side: a request's ids exist before it arrives,
            # so drawing them (milliseconds for a 32K prompt) is no TTFT
            tokens = req.tokens(self.pool_seed)
            arrival = t0 + req.arrival_s if self.realtime else now()
            wait = arrival - now()
            if wait > 0:
                time.sleep(wait)
            if deadline is not None and now() > deadline:
                break
            s = self.serve_one(req, arrival, now(), tokens)
            out.append(s)
            if on_done is not None:
                on_done(s)
        return out
