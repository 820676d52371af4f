"""Two-step pipelines over a GPU stage cut in two halves, for moving
whole objects between host memory and a GPU cache (:mod:`kvferry.kv_chunks`).

A load moves each slice of objects host -> stage by the copy engines
(DMA at the link's rate), then scatters it from the stage into the
cache with the verifying kernel; a save gathers a slice into the stage
with the kernel, then DMAs it to host memory. Run one after the other
the link idles while the kernel runs. Here the DMAs are posted to a
copier of their own (its own copy-engine stream, ``GpuMover.post_plain``)
and waited for by ticket, so the engines go from one slice's DMA to the
next without waiting for this thread, while the calling thread's kernel
works on the other half:

- loads (:meth:`StagePipe.run_in`): DMA of slice k+1 || kernel on slice k;
- saves (:meth:`StagePipe.run_out`): kernel on slice k+1 || DMA of slice k.

Both return only once every DMA they posted has ended, whatever raised:
the stage is never written behind the caller's back.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, Iterable, List, Optional

#: Posts a slice's DMA: (copier, slice, half) -> the copier's ticket
#: (None: nothing to move)
Step = Callable[[Any, Any, int], Any]


class StagePipe:
    """A copier for the DMAs (default: a new one on GPU ``device``; closed
    with the pipe): anything with ``wait(ticket)`` for the tickets the
    steps' posts return. Used by one thread at a time (the caller holds
    the stage's lock). ``span_s``: the last run's seconds from its first
    post to its last DMA's end."""

    def __init__(self, device: int, copier: Any = None):
        if copier is None:
            from . import kv_gpu

            copier = kv_gpu.GpuMover(device)
        self._copier: Any = copier
        self.span_s = 0.0
        self._t0: Optional[float] = None

    def _post(self, step: Step, item: Any, half: int) -> Any:
        if self._copier is None:
            raise RuntimeError("kvferry: the stage pipeline is closed")
        if self._t0 is None:
            self._t0 = time.perf_counter()
        return step(self._copier, item, half)

    def _wait(self, ticket: Any) -> None:
        if ticket is None:
            return
        self._copier.wait(ticket)
        if self._t0 is not None:
            self.span_s = time.perf_counter() - self._t0

    def _settle(self, tickets: Iterable[Any]) -> None:
        """Waits for every ticket; the first error raises after all ended."""
        err: Optional[BaseException] = None
        for t in list(tickets):
            try:
                self._wait(t)
            except BaseException as e:  # noqa: B902 - re-raised below
                err = err or e
        if err is not None:
            raise err

    def _begin(self) -> None:
        self._t0, self.span_s = None, 0.0

    def run_in(self, slices: Iterable[Any], dma_in: Step, work: Callable[[Any, int], None]
               ) -> None:
        """For each slice (k-th): dma_in(copier, slice, k % 2) posted, then
        work(slice, k % 2) here once it landed; slice k+1's DMA is posted
        before the work on slice k starts."""
        flying: Deque[Any] = deque()
        prev: Any = None
        self._begin()
        try:
            for k, item in enumerate(slices):
                flying.append(self._post(dma_in, item, k % 2))
                if prev is not None:
                    self._wait(flying.popleft())
                    work(prev[0], prev[1])
                prev = (item, k % 2)
            if prev is not None:
                self._settle(flying)
                flying.clear()
                work(prev[0], prev[1])
        finally:
            _quiet(self._copier, flying)

    def run_out(self, slices: Iterable[Any], work: Callable[[Any, int], None], dma_out: Step
                ) -> None:
        """For each slice (k-th): work(slice, k % 2) here, then
        dma_out(copier, slice, k % 2) posted; the work on slice k+1 runs
        while slice k's DMA does (a half is reused only once its DMA
        ended)."""
        pending: List[Any] = [None, None]
        order: Deque[int] = deque()  # halves with a DMA in flight, oldest first
        self._begin()
        try:
            for k, item in enumerate(slices):
                half = k % 2
                if pending[half] is not None:
                    t, pending[half] = pending[half], None
                    order.remove(half)
                    self._wait(t)
                work(item, half)
                pending[half] = self._post(dma_out, item, half)
                order.append(half)
            self._settle([pending[h] for h in order])
            pending = [None, None]
            order.clear()
        finally:
            _quiet(self._copier, [pending[h] for h in order])

    def close(self) -> None:
        if self._copier is not None:
            self._copier.close()
            self._copier = None


def _quiet(copier: Any, tickets: Iterable[Any]) -> None:
    """Waits for posts whose errors are already moot (another raised)."""
    for t in list(tickets):
        if t is None or copier is None:
            continue
        try:
            copier.wait(t)
        except BaseException:  # noqa: B902 - the first error is the caller's
            pass


__all__ = ["StagePipe"]
