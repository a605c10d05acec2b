"""PlainSumAggregator: the in-the-clear implementation of the Aggregator seam."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import IncompatibleStatsError, InputError, StatsValidationError
from ghofl.secure import Aggregator, PlainSumAggregator
from ghofl.stats import ClientStats, compute_stats


def _stats(seed: int, n: int = 20, d: int = 3, mode: str = "full") -> ClientStats:
    rng = np.random.default_rng(seed)
    return compute_stats(rng.normal(size=(n, d)), rng.integers(0, 3, n), 3, mode)  # type: ignore[arg-type]


def test_is_an_aggregator() -> None:
    assert isinstance(PlainSumAggregator(), Aggregator)


def test_sums_a_stream_and_counts_it() -> None:
    parts = [_stats(i) for i in range(5)]
    agg = PlainSumAggregator()
    assert agg.num_aggregated_ == 0
    total = agg.aggregate(p for p in parts)
    assert agg.num_aggregated_ == 5
    assert total.allclose(parts[0] + parts[1] + parts[2] + parts[3] + parts[4])


def test_a_dropped_client_is_just_absent() -> None:
    parts = [_stats(i) for i in range(4)]
    total = PlainSumAggregator().aggregate(parts[:2] + parts[3:])
    assert total.allclose(parts[0] + parts[1] + parts[3])


def test_incompatible_payload_is_named_by_position() -> None:
    with pytest.raises(IncompatibleStatsError, match=r"payload 3 cannot be added to the total "
                       r"of the payloads before it: .*differ in dim \(3 vs 4\)"):
        PlainSumAggregator().aggregate([_stats(0), _stats(1), _stats(2, d=4)])
    with pytest.raises(IncompatibleStatsError, match=r"payload 2 .*differ in mode"):
        PlainSumAggregator().aggregate([_stats(0), _stats(1, mode="pooled")])


def test_nothing_to_aggregate() -> None:
    with pytest.raises(StatsValidationError, match=r"no client payload arrived"):
        PlainSumAggregator().aggregate([])


def test_non_stats_item_is_rejected() -> None:
    with pytest.raises(InputError, match=r"payload 2 is a dict, not ClientStats"):
        PlainSumAggregator().aggregate([_stats(0), {}])  # type: ignore[list-item]
