"""Per-matrix work of the statistics checks, spread over threads.

numpy's array loops and LAPACK release the GIL on large arrays, so per-class work on d × d
matrices (unpacking, finiteness, factorisations) runs on every core from plain threads, with
no copy of the data.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["first_failing", "thread_count"]

S = TypeVar("S")


def thread_count(tasks: int) -> int:
    """Threads for ``tasks`` independent tasks.

    One per core (``os.cpu_count()``), at most one per task, at least 1.
    """
    return max(1, min(tasks, os.cpu_count() or 1))


def first_failing(count: int, check: Callable[[int, S], bool], scratch: Callable[[], S],
                  threads: int = 1) -> int | None:
    """The smallest ``i`` in ``range(count)`` for which ``check(i, buffer)`` is False.

    Parameters
    ----------
    count : int
        Number of tasks.
    check : callable
        ``check(i, buffer) -> bool``; ``buffer`` is the calling thread's scratch (one per
        thread, reused from task to task).
    scratch : callable
        Makes one thread's scratch (e.g. a d × d buffer).
    threads : int, default 1
        Threads to spread the tasks over (1: in the calling thread, in order).

    Returns
    -------
    int or None
        The first failing task, exactly as a loop in order would find it, or ``None``.

    Notes
    -----
    Tasks are handed out in increasing order; once a task fails no thread takes a new one, but
    every task already taken is finished. Every task before the first failure has then been
    taken, and finished, so the smallest failure recorded is the first one. An exception of a
    task is raised in the caller.
    """
    if threads <= 1 or count <= 1:
        buf = scratch()
        return next((i for i in range(count) if not check(i, buf)), None)
    order = itertools.count()
    lock = threading.Lock()
    failed: list[int] = []

    def work() -> None:
        buf = scratch()
        while not failed:
            with lock:
                i = next(order)
            if i >= count:
                return
            if not check(i, buf):
                failed.append(i)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(work) for _ in range(threads)]:
            future.result()
    return min(failed, default=None)
