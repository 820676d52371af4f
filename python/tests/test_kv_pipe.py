"""kvferry.kv_pipe: the stage pipeline's order, overlap and error rules.

The steps here move bytes between Python buffers (a bytearray per stage
half) so that every slice's data can be checked end to end; the GPU
copies themselves are covered by test_kv_chunks.py on a GPU machine.
"""

import threading
import time

import pytest

from kvferry.kv_pipe import StagePipe


class _Copier:
    """Stands in for the DMA copier: the pipe only hands it to the steps."""

    closed = False

    def close(self):
        self.closed = True


def _slices(n):
    return [bytes([k]) * 1024 for k in range(n)]


def test_run_in_moves_every_slice_through_alternating_halves():
    halves = [bytearray(1024), bytearray(1024)]
    out, used = [], []
    pipe = StagePipe(0, copier=_Copier())
    try:
        def dma_in(copier, item, h):
            halves[h][:] = item

        def work(item, h):
            used.append(h)
            out.append(bytes(halves[h]))

        pipe.run_in(_slices(7), dma_in, work)
    finally:
        pipe.close()
    assert out == _slices(7)  # each slice's bytes, in order, none overwritten early
    assert used == [k % 2 for k in range(7)]


def test_run_in_overlaps_the_next_dma_with_the_work():
    started = threading.Event()
    seen = []
    pipe = StagePipe(0, copier=_Copier())
    try:
        def dma_in(copier, item, h):
            if item == 1:
                started.set()

        def work(item, h):
            if item == 0:  # slice 1's DMA runs while slice 0 is worked on
                seen.append(started.wait(5))

        pipe.run_in(range(3), dma_in, work)
    finally:
        pipe.close()
    assert seen == [True]


def test_run_out_reuses_a_half_only_after_its_dma():
    halves = [bytearray(1024), bytearray(1024)]
    landed = {}
    pipe = StagePipe(0, copier=_Copier())
    try:
        def work(item, h):
            halves[h][:] = item

        def dma_out(copier, item, h):
            time.sleep(0.01)  # a slow link: the next gather must not wait for it
            landed[item[0]] = bytes(halves[h])

        pipe.run_out(_slices(6), work, dma_out)
    finally:
        pipe.close()
    assert [landed[k] for k in range(6)] == _slices(6)


def test_an_error_raises_after_every_dma_ended():
    ended = []
    pipe = StagePipe(0, copier=_Copier())
    try:
        def dma_in(copier, item, h):
            time.sleep(0.02)
            ended.append(item)

        def work(item, h):
            if item == 1:
                raise ValueError("scatter failed")

        with pytest.raises(ValueError):
            pipe.run_in(range(4), dma_in, work)
        assert ended == [0, 1, 2]  # slice 2's DMA was flying: waited for

        def bad_dma(copier, item, h):
            if item == 2:
                raise RuntimeError("dma failed")

        with pytest.raises(RuntimeError):
            pipe.run_out(range(4), lambda item, h: None, bad_dma)
    finally:
        pipe.close()


def test_close_closes_the_copier_and_refuses_more_work():
    copier = _Copier()
    pipe = StagePipe(0, copier=copier)
    pipe.close()
    assert copier.closed
    with pytest.raises(RuntimeError):
        pipe.run_in(range(2), lambda c, i, h: None, lambda i, h: None)
