"""Merge laws of the in-place aggregation (StatsTotal / sum_stats) on random statistics."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given

from ghofl.stats import ClientStats, sum_stats
from ghofl.stats.client_stats import StatsTotal
from tests.property.test_partition_invariance import SETTINGS, stats_triples

Triple = tuple[ClientStats, ClientStats, ClientStats]


def _same(a: ClientStats, b: ClientStats) -> bool:
    """Bit-for-bit equal values (``allclose`` with zero tolerance)."""
    return a.allclose(b, rtol=0.0) and all(
        (x is None and y is None) or np.array_equal(x, y)
        for x, y in zip(a.arrays().values(), b.arrays().values(), strict=True)
    )


@SETTINGS
@given(t=stats_triples())
def test_in_place_sum_is_the_left_to_right_sum(t: Triple) -> None:
    a, b, c = t
    assert _same(sum_stats([a, b, c]), (a + b) + c)


@SETTINGS
@given(t=stats_triples())
def test_in_place_sum_is_order_independent_up_to_rounding(t: Triple) -> None:
    ref = sum_stats(t)
    for perm in itertools.permutations(t):
        assert sum_stats(perm).allclose(ref, rtol=1e-12)


@SETTINGS
@given(t=stats_triples())
def test_results_handed_out_midway_stay_fixed(t: Triple) -> None:
    a, b, c = t
    acc = StatsTotal()
    acc.add(a)
    first = acc.result()
    acc.add(b)
    second = acc.result()
    acc.add(c)
    assert _same(first, a) and _same(second, a + b) and _same(acc.result(), (a + b) + c)
