"""Two-step pipelines over a GPU stage cut in segments, for moving
whole objects between host memory and a GPU cache (:mod:`kvferry.kv_chunks`).

A load moves each slice of objects host -> stage by the copy engines
(DMA at the link's rate), then scatters it from the stage into the
cache with the verifying kernel; a save gathers a slice into the stage
with the kernel, then DMAs it to host memory. Run one after the other
the link idles while the kernel runs. Here the DMAs are posted to a
copier of their own (its own copy-engine stream, ``GpuMover.post_plain``)
and waited for by ticket, each slice in a segment of the stage of its
own (slice k in segment k % segments), so the engines go from one
slice's DMA to the next without waiting for this thread, and up to
segments - 1 DMAs wait in line while the calling thread's kernel works
on another segment (a thread held up, say by the interpreter, leaves
the engines work):

- loads (:meth:`StagePipe.run_in`): DMAs of slices k+1.. || kernel on slice k;
- saves (:meth:`StagePipe.run_out`): kernel on slice k+1 || DMAs of slices ..k.

Both return only once every DMA they posted has ended, whatever raised:
the stage is never written behind the caller's back.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, Iterable, Optional

#: Posts a slice's DMA: (copier, slice, segment) -> the copier's ticket
#: (None: nothing to move)
Step = Callable[[Any, Any, int], Any]


class StagePipe:
    """A copier for the DMAs (default: a new one on GPU ``device``; closed
    with the pipe): anything with ``wait(ticket)`` and ``done(ticket)``
    for the tickets the steps' posts return. Used by one thread at a time (the caller holds
    the stage's lock). ``span_s``: the last run's seconds from its first
    post to its last DMA's end."""

    def __init__(self, device: int, copier: Any = None):
        if copier is None:
            from . import kv_gpu

            copier = kv_gpu.GpuMover(device)
        self._copier: Any = copier
        self.span_s = 0.0
        self._t0: Optional[float] = None

    def _post(self, step: Step, item: Any, segment: int) -> Any:
        if self._copier is None:
            raise RuntimeError("kvferry: the stage pipeline is closed")
        if self._t0 is None:
            self._t0 = time.perf_counter()
        return step(self._copier, item, segment)

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

    def _done(self, ticket: Any) -> bool:
        return ticket is None or self._copier.done(ticket)

    def run_in(self, slices: Iterable[Any], dma_in: Step, work: Callable[[Any, int], None],
               segments: int = 2) -> None:
        """For each slice (k-th): dma_in(copier, slice, k % segments)
        posted, then work(slice, k % segments) here once it landed, in
        order. A slice is worked on once a later one is posted behind it
        (the engines never wait for the work) and either its DMA ended or
        every segment is in use."""
        segments = max(2, int(segments))
        flying: Deque[Any] = deque()  # (slice, segment, ticket), oldest first

        def work_oldest() -> None:
            item, seg, t = flying.popleft()
            self._wait(t)
            work(item, seg)

        self._begin()
        try:
            for k, item in enumerate(slices):
                while len(flying) >= segments:  # slice k - segments still there
                    work_oldest()
                flying.append((item, k % segments, self._post(dma_in, item, k % segments)))
                while len(flying) >= 2 and self._done(flying[0][2]):
                    work_oldest()
            while flying:
                work_oldest()
        finally:
            _quiet(self._copier, [t for _, _, t in flying])

    def run_out(self, slices: Iterable[Any], work: Callable[[Any, int], None], dma_out: Step,
                segments: int = 2) -> None:
        """For each slice (k-th): work(slice, k % segments) here, then
        dma_out(copier, slice, k % segments) posted; the work on slice k+1
        runs while the DMAs before it do (a segment is reused only once
        its DMA ended)."""
        segments = max(2, int(segments))
        posted: Deque[Any] = deque()  # tickets, oldest first
        self._begin()
        try:
            for k, item in enumerate(slices):
                if len(posted) >= segments:  # slice k - segments' segment
                    self._wait(posted.popleft())
                work(item, k % segments)
                posted.append(self._post(dma_out, item, k % segments))
            self._settle(posted)
            posted.clear()
        finally:
            _quiet(self._copier, posted)

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
