"""Large arrays written once in full get a private mapping of ordinary pages (ghofl.stats._pages)."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest

from ghofl.stats import _pages
from ghofl.stats._pages import PAGE_BACKED_MIN_BYTES, page_backed_empty
from ghofl.stats.schema import pack_upper, unpack_upper


def _mapped(a: np.ndarray) -> bool:
    """Whether the memory of ``a`` is an mmap (the end of its chain of bases)."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def test_small_arrays_come_from_numpy() -> None:
    a = page_backed_empty((4, 5), np.float32)
    assert a.shape == (4, 5) and a.dtype == np.float32 and a.flags.owndata


@pytest.mark.skipif(not hasattr(mmap, "MAP_PRIVATE"), reason="POSIX mmap")
def test_large_arrays_are_writable_contiguous_and_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pages, "PAGE_BACKED_MIN_BYTES", 1024)
    a = page_backed_empty((3, 40, 40), np.float64)
    assert _mapped(a) and a.flags.c_contiguous and a.flags.writeable
    assert a.shape == (3, 40, 40) and a.dtype == np.float64
    a[...] = 7.0
    view = a[1]
    del a
    assert np.all(view == 7.0)  # the mapping lives as long as a view of it
    assert PAGE_BACKED_MIN_BYTES == 64 << 20


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_childs_writes_stay_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pages, "PAGE_BACKED_MIN_BYTES", 1024)
    a = page_backed_empty((64, 64), np.float64)
    a[...] = 1.0
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        a[...] = 2.0
        os._exit(0)
    os.waitpid(pid, 0)
    assert np.all(a == 1.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_unpacking_into_a_mapping_gives_the_same_matrices(
        monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 33, 33)).astype(dtype)
    sym = x + np.swapaxes(x, -1, -2)
    packed = pack_upper(sym)
    small = unpack_upper(packed, 33)
    monkeypatch.setattr(_pages, "PAGE_BACKED_MIN_BYTES", 1024)
    big = unpack_upper(packed, 33, dtype=np.float64)
    assert _mapped(big) or sys.platform == "win32"
    assert not _mapped(small)
    np.testing.assert_array_equal(big, small.astype(np.float64))
    np.testing.assert_array_equal(small, sym)
