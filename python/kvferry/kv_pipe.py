"""Two-step pipelines over a GPU stage cut in two halves, for moving
whole objects between host memory and a GPU cache (:mod:`kvferry.kv_chunks`).

A load moves each slice of objects host -> stage by the copy engines
(DMA at the link's rate), then scatters it from the stage into the
cache with the verifying kernel; a save gathers a slice into the stage
with the kernel, then DMAs it to host memory. Run one after the other
the link idles while the kernel runs. Here the DMA of one slice runs on
a thread of its own, with a copier of its own (its own CUDA streams),
while the calling thread's kernel works on the other half:

- loads (:meth:`StagePipe.run_in`): DMA of slice k+1 || kernel on slice k;
- saves (:meth:`StagePipe.run_out`): kernel on slice k+1 || DMA of slice k.

Both return only once every DMA they started has ended, whatever
raised: the stage is never written behind the caller's back.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, List, Optional

#: A step of a slice: (copier, slice, half) -> None
Step = Callable[[Any, Any, int], None]


class StagePipe:
    """A DMA thread and its copier (default: a new one on GPU ``device``;
    closed with the pipe). Used by one thread at a time (the caller holds
    the stage's lock)."""

    def __init__(self, device: int, copier: Any = None):
        if copier is None:
            from . import kv_gpu

            copier = kv_gpu.GpuMover(device)
        self._copier: Any = copier
        self._pool: Optional[ThreadPoolExecutor] = ThreadPoolExecutor(
            1, thread_name_prefix="kvferry-dma")

    def _submit(self, step: Step, item: Any, half: int) -> "Future[None]":
        if self._pool is None:
            raise RuntimeError("kvferry: the stage pipeline is closed")
        return self._pool.submit(step, self._copier, item, half)

    @staticmethod
    def _settle(futures: List["Future[None]"]) -> None:
        """Waits for every future; the first error raises after all ended."""
        err: Optional[BaseException] = None
        for f in futures:
            try:
                f.result()
            except BaseException as e:  # noqa: B902 - re-raised below
                err = err or e
        futures.clear()
        if err is not None:
            raise err

    def run_in(self, slices: Iterable[Any], dma_in: Step, work: Callable[[Any, int], None]
               ) -> None:
        """For each slice (k-th): dma_in(copier, slice, k % 2) on the DMA
        thread, then work(slice, k % 2) here once it landed; the DMA of
        slice k+1 overlaps the work on slice k."""
        flying: List["Future[None]"] = []
        prev: Any = None
        try:
            for k, item in enumerate(slices):
                flying.append(self._submit(dma_in, item, k % 2))
                if prev is not None:
                    self._settle([flying.pop(0)])
                    work(prev[0], prev[1])
                prev = (item, k % 2)
            if prev is not None:
                self._settle(flying)
                work(prev[0], prev[1])
        finally:
            _quiet(flying)

    def run_out(self, slices: Iterable[Any], work: Callable[[Any, int], None], dma_out: Step
                ) -> None:
        """For each slice (k-th): work(slice, k % 2) here, then
        dma_out(copier, slice, k % 2) on the DMA thread; the work on slice
        k+1 overlaps the DMA of slice k (a half is reused only once its
        DMA ended)."""
        pending: List[Optional["Future[None]"]] = [None, None]
        try:
            for k, item in enumerate(slices):
                half = k % 2
                f, pending[half] = pending[half], None
                if f is not None:
                    self._settle([f])
                work(item, half)
                pending[half] = self._submit(dma_out, item, half)
            self._settle([f for f in pending if f is not None])
            pending = [None, None]
        finally:
            _quiet([f for f in pending if f is not None])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._copier is not None:
            self._copier.close()
            self._copier = None


def _quiet(futures: List["Future[None]"]) -> None:
    """Waits for futures whose errors are already moot (another raised)."""
    for f in futures:
        try:
            f.result()
        except BaseException:  # noqa: B902 - the first error is the caller's
            pass


__all__ = ["StagePipe"]
