"""Products ``zᵀz`` of the statistics accumulation, their reused buffers and their threads.

Every product is numpy's ``matmul`` of a C-ordered block with its own transpose, which numpy
runs as a BLAS symmetric rank-k update (``syrk``) and mirrors, so each product, and every sum
of them, is exactly symmetric. numpy writes and mirrors the whole k × k output whatever the
rows (about 4 ms at k = 1280), so callers give each product as many rows as they can.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.stats._threads import first_failing, thread_count

__all__ = ["Scratch", "spread"]


class Scratch:
    """One thread's reused buffers: a block of rows and a k × k product.

    Reused across blocks and batches, so their pages stay mapped (fresh large allocations
    cost page faults that rival the BLAS work itself).
    """

    def __init__(self) -> None:
        self.buf: NDArray[np.float64] | None = None
        self.tmp: NDArray[np.float64] | None = None

    def block(self, m: int, k: int, size: int) -> NDArray[np.float64]:
        """The first ``m`` rows of the (at least ``m``-row, ``k``-column) row buffer.

        A buffer too small is replaced by one of ``size`` >= ``m`` rows (the most the caller
        will ask for), written once in one sequential pass: its pages are then mapped before
        the gathers and products that follow, often on several threads at once (page faults
        taken inside them made the ``full`` accumulation at n = 50,000, d = 1280 about 4 %
        slower).
        """
        if self.buf is None or self.buf.shape[0] < m or self.buf.shape[1] != k:
            self.buf = np.empty((max(size, m), k))
            self.buf.fill(0.0)
        return self.buf[:m]

    def rows(self, part: NDArray[Any], size: int) -> NDArray[np.float64]:
        """Rows ``part`` (m, k) copied (converted to float64) into the buffer (:meth:`block`)."""
        out = self.block(part.shape[0], part.shape[1], size)
        np.copyto(out, part, casting="unsafe")
        return out

    def gather(self, xin: NDArray[Any], rows: NDArray[np.intp],
               size: int) -> NDArray[np.float64]:
        """Rows ``rows`` (m,) of ``xin`` (n, k) as a contiguous float64 block (:meth:`block`)."""
        out = self.block(rows.size, xin.shape[1], size)
        if xin.dtype == np.float64:
            np.take(xin, rows, axis=0, out=out)
        else:
            np.copyto(out, xin[rows], casting="unsafe")
        return out

    def add_gram(self, target: NDArray[np.float64], rows: NDArray[np.float64],
                 fresh: bool) -> None:
        """``target`` (k, k) += rowsᵀ rows for C-ordered ``rows`` (m, k); = when ``fresh``.

        A fresh target (zero pages no product wrote yet) is written directly, its pages
        written once and never read; otherwise the product goes through the reused buffer
        and one addition.
        """
        if fresh:
            np.matmul(rows.T, rows, out=target)
            return
        if self.tmp is None or self.tmp.shape != target.shape:
            self.tmp = np.empty(target.shape)
        np.matmul(rows.T, rows, out=self.tmp)
        target += self.tmp


def spread(count: int, task: Callable[[int, Scratch], None], scratches: list[Scratch],
           threads: int) -> None:
    """Run ``task(i, scratch)`` for every ``i`` in ``range(count)``, on ``threads`` threads.

    Each thread takes the next task when it is free and uses its own buffers, one of
    ``scratches`` (grown to ``threads`` entries, kept for the next call). With more than one
    thread, the BLAS runs one thread in each (``threadpoolctl``): the tasks' single-threaded
    numpy work (gathers, sums) then overlaps the products of the others instead of leaving
    cores idle; the tasks run under the caller's numpy error state (which pool threads do not
    inherit). One thread: the tasks run in order in the calling thread.
    """
    threads = thread_count(min(threads, count))
    scratches += [Scratch() for _ in range(threads - len(scratches))]
    errors = np.geterr()

    def run(i: int, scratch: Scratch) -> bool:
        with np.errstate(**errors):
            task(i, scratch)
        return True

    if threads <= 1:
        first_failing(count, run, lambda: scratches[0])
        return
    from threadpoolctl import threadpool_limits

    free = list(scratches[:threads])
    with threadpool_limits(limits=1, user_api="blas"):
        first_failing(count, run, free.pop, threads)
