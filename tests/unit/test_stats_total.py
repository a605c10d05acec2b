"""StatsTotal / sum_stats: in-place, bounded-memory aggregation of client payloads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ghofl.errors import IncompatibleStatsError, StatsOverflowError, StatsValidationError
from ghofl.stats import ClientStats, StatsMeta, compute_stats, sum_stats
from ghofl.stats.client_stats import StatsTotal, check_addable
from ghofl.stats.meta import Mode
from tests.helpers import gaussian_mixture

MODES: tuple[Mode, ...] = ("full", "pooled", "gram", "diag")


def _parts(mode: Mode, k: int = 4, holdout: float = 0.0, clip: float | None = None,
           ) -> list[ClientStats]:
    out = []
    for i in range(k):
        x, y = gaussian_mixture(10 + i, num_classes=3, dim=4, n=30 + 7 * i)
        out.append(compute_stats(x, y, 3, mode, clip_norm=clip, holdout_fraction=holdout,
                                 holdout_seed=3))
    return out


def _assert_identical(a: ClientStats, b: ClientStats) -> None:
    """Bit-for-bit equality of every array, n_clipped, metadata and held-out section."""
    assert not a.meta.differences(b.meta)
    assert a.n_clipped == b.n_clipped and a.rounding == b.rounding
    for name, arr in a.arrays().items():
        other = b.arrays()[name]
        if arr is None:
            assert other is None
        else:
            np.testing.assert_array_equal(arr, other)
    assert (a.holdout is None) == (b.holdout is None)
    if a.holdout is not None and b.holdout is not None:
        _assert_identical(a.holdout, b.holdout)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("holdout", "clip"), [(0.0, None), (0.3, None), (0.0, 2.5)])
def test_equals_the_pairwise_sum_bit_for_bit(mode: Mode, holdout: float,
                                             clip: float | None) -> None:
    parts = _parts(mode, holdout=holdout, clip=clip)
    pairwise = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    _assert_identical(sum_stats(parts), pairwise)
    _assert_identical(sum_stats(iter(parts)), pairwise)  # any iterable, consumed once
    if clip is not None:
        assert pairwise.n_clipped > 0  # the clipped counts are added too


def test_payloads_are_never_modified_or_shared() -> None:
    parts = _parts("full", holdout=0.3)
    before = [{k: np.array(v) for k, v in p.arrays().items() if v is not None} for p in parts]
    total = sum_stats(parts)
    for p, snap in zip(parts, before, strict=True):
        for name, arr in snap.items():
            np.testing.assert_array_equal(getattr(p, name), arr)
            assert not getattr(p, name).flags.writeable
            assert not np.shares_memory(getattr(p, name), getattr(total, name))
    assert not total.sums.flags.writeable  # the total is an immutable ClientStats too


def test_one_payload_gives_an_equal_copy() -> None:
    (p,) = _parts("pooled", k=1)
    total = sum_stats([p])
    _assert_identical(total, p)
    assert not np.shares_memory(total.scatter, p.scatter)


def test_result_never_changes_and_adding_can_continue() -> None:
    parts = _parts("full", holdout=0.3)
    acc = StatsTotal()
    assert len(acc) == 0 and acc.meta is None
    acc.add(parts[0])
    acc.add(parts[1])
    first = acc.result()
    assert acc.result() is first  # the same value until the next add
    snapshot = np.array(first.class_scatter)
    held = np.array(first.holdout.sums)  # type: ignore[union-attr]
    acc.add(parts[2])
    acc.add(parts[3])
    np.testing.assert_array_equal(first.class_scatter, snapshot)  # earlier result unchanged
    np.testing.assert_array_equal(first.holdout.sums, held)  # type: ignore[union-attr]
    assert len(acc) == 4 and acc.meta == parts[0].meta
    _assert_identical(acc.result(), sum_stats(parts))
    _assert_identical(first, parts[0] + parts[1])


def test_empty_and_incompatible_inputs_are_named() -> None:
    parts = _parts("full")
    with pytest.raises(StatsValidationError, match="cannot sum an empty collection"):
        sum_stats([])
    with pytest.raises(StatsValidationError, match="cannot sum an empty collection"):
        StatsTotal().result()
    with pytest.raises(IncompatibleStatsError,
                       match=r"payload #2 \(0-based\): cannot combine these statistics because "
                             r"they differ in mode \('full' vs 'diag'\)"):
        sum_stats([parts[0], parts[1], parts[2].to_mode("diag")])
    with pytest.raises(IncompatibleStatsError,
                       match=r"payload #1 \(0-based\): can only combine ClientStats with "
                             r"ClientStats; got int"):
        sum_stats([parts[0], 3])  # type: ignore[list-item]
    with pytest.raises(IncompatibleStatsError,
                       match=r"payload #0 \(0-based\): can only combine ClientStats with "
                             r"ClientStats; got str"):
        sum_stats(["x"])  # type: ignore[list-item]


def _huge(mode: Mode) -> ClientStats:
    """Valid one-class statistics whose largest second moment is 1.2e308: adding two
    overflows."""
    x, _ = gaussian_mixture(0, num_classes=1, dim=3, n=40)
    s = compute_stats(x, np.zeros(40, dtype=np.int64), 1, mode=mode)
    f = 1.2e308 / float(np.max(s.diag_sums))
    arrays: dict[str, Any] = {k: (np.array(v) if k == "counts" else np.array(v) * (np.sqrt(f) if k == "sums"
                                                                     else f))
              for k, v in s.arrays().items() if v is not None}
    return ClientStats(s.meta, **arrays)


@pytest.mark.parametrize(("mode", "array"), [("diag", "sq_sums"), ("full", "class_scatter"),
                                             ("pooled", "sq_sums")])
def test_a_refused_overflow_leaves_the_total_unchanged(mode: Mode, array: str) -> None:
    huge = _huge(mode)
    acc = StatsTotal()
    acc.add(huge)
    with pytest.raises(StatsOverflowError,
                       match=rf"cannot add payload #1 \(0-based\) to the total of the payloads "
                             rf"before it: adding these statistics overflows float64 in {array}"):
        acc.add(huge)
    assert len(acc) == 1
    _assert_identical(acc.result(), huge)
    small = ClientStats.zeros(huge.meta)
    acc.add(small)  # the caller may skip the refused payload and go on
    _assert_identical(acc.result(), huge)


def test_count_overflow_is_refused() -> None:
    meta = StatsMeta(mode="diag", dim=3, classes=("a", "b"))
    big = ClientStats(meta, counts=np.full(2, 2**61, dtype=np.int64), sums=np.zeros((2, 3)),
                      sq_sums=np.zeros((2, 3)))
    with pytest.raises(StatsOverflowError,
                       match=r"payload #1 \(0-based\).*overflows the int64 sample counts"):
        sum_stats([big, big])


def test_check_addable_says_what_adding_would_say() -> None:
    parts = _parts("pooled")
    check_addable(parts[0], parts[1])  # fine: nothing raised
    with pytest.raises(IncompatibleStatsError, match=r"differ in mode \('pooled' vs 'diag'\)"):
        check_addable(parts[0], parts[1].to_mode("diag"))
    huge = _huge("pooled")
    with pytest.raises(StatsOverflowError, match="overflows float64 in sq_sums"):
        check_addable(huge, huge)
    with pytest.raises(StatsOverflowError, match="overflows float64 in sq_sums"):
        huge + huge
