"""Large arrays written once in full, on ordinary pages.

NumPy advises the kernel to back every large array with transparent huge pages
(``madvise(MADV_HUGEPAGE)``). Where the kernel's huge-page defragmentation is ``madvise`` (a
common default), each 2 MiB page of such an array is then assembled on its first write by
direct compaction whenever free memory is fragmented, which stalls the writing thread: measured
on this project's machine, unpacking a C = 200 payload (2.6 GB of matrices) took 10.3 s inside
the validation benchmark and 6.0 s on ordinary 4 KiB pages. :func:`page_backed_empty` gives
such arrays an anonymous mapping of their own, which nothing advises: the kernel's own default
(huge pages only under ``always``) decides, and the mapping is returned to the system as soon
as the array and its views are gone.
"""

from __future__ import annotations

import math
import mmap
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["PAGE_BACKED_MIN_BYTES", "page_backed_empty"]

#: Size from which :func:`page_backed_empty` maps an array of its own (smaller arrays come from
#: NumPy's allocator, which reuses freed memory).
PAGE_BACKED_MIN_BYTES = 64 << 20


def page_backed_empty(shape: tuple[int, ...], dtype: Any) -> NDArray[Any]:
    """An uninitialised, writable, C-contiguous array, for a caller that writes all of it.

    ``numpy.empty`` below :data:`PAGE_BACKED_MIN_BYTES` (and without POSIX ``mmap``); from
    there, an array over a private anonymous memory mapping of its size (zero-filled pages,
    mapped on first write, never advised to use huge pages), which lives as long as the array
    or any view of it.

    Parameters
    ----------
    shape : tuple of int
    dtype : dtype

    Returns
    -------
    ndarray, shape ``shape``
    """
    dt = np.dtype(dtype)
    count = math.prod(shape)
    nbytes = count * dt.itemsize
    private = getattr(mmap, "MAP_PRIVATE", None)  # POSIX; elsewhere numpy's allocator
    if nbytes < PAGE_BACKED_MIN_BYTES or private is None:
        return np.empty(shape, dtype=dt)
    # private (a forked child's writes stay its own) and anonymous (fileno -1), read-write
    pages = mmap.mmap(-1, nbytes, flags=private)
    return np.frombuffer(pages, dtype=dt, count=count).reshape(shape)
