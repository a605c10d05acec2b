"""StatsTotal memory and ownership: two payloads' worth at most, payloads and results untouched."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest

from ghofl.stats import ClientStats, compute_stats
from ghofl.stats.client_stats import StatsTotal
from tests.helpers import gaussian_mixture


def _payload_bytes(s: ClientStats) -> int:
    """Bytes of every array of ``s``, held-out section included."""
    own = sum(int(arr.nbytes) for arr in s.arrays().values() if arr is not None)
    return own + (0 if s.holdout is None else _payload_bytes(s.holdout))


def _fresh(base: ClientStats) -> ClientStats:
    """A new payload with arrays of its own (validated), equal to ``base``."""
    holdout = None if base.holdout is None else _fresh(base.holdout)
    arrays = {k: np.array(v) for k, v in base.arrays().items() if v is not None}
    return ClientStats(base.meta, n_clipped=base.n_clipped, holdout=holdout, **arrays)


@pytest.mark.parametrize("holdout", [0.0, 0.3])
def test_streaming_holds_at_most_two_payloads(holdout: float) -> None:
    x, y = gaussian_mixture(5, num_classes=20, dim=200, n=500)
    base = compute_stats(x, y, 20, "full", holdout_fraction=holdout, holdout_seed=1)
    one = _payload_bytes(base)  # mode full, C = 20, d = 200: 6.4 MB of class_scatter

    def stream(k: int) -> Iterator[ClientStats]:
        for _ in range(k):
            yield _fresh(base)

    total = StatsTotal()
    before, peaks = [], []
    tracemalloc.start()  # base (allocated before) is not traced; only the stream and the total
    try:
        for payload in stream(5):
            before.append(tracemalloc.get_traced_memory()[0])  # the total and this payload
            tracemalloc.reset_peak()  # the peak of each add (not of building the payload)
            total.add(payload)
            peaks.append(tracemalloc.get_traced_memory()[1])
        del payload
    finally:
        tracemalloc.stop()
    assert len(total) == 5
    growth = [(p - b) / one for p, b in zip(peaks, before, strict=True)]
    assert growth[0] >= 0.9  # the first add copies the payload (and the tracing sees arrays)
    assert max(growth[1:]) <= 0.2, growth  # later adds allocate no sum beside the total
    if holdout == 0.0:  # (a payload with a held-out section also caches its fitting part)
        # The total plus the payload being added: 2x; a sum held beside both would be 3x.
        assert max(peaks) <= 2.2 * one, [round(p / one, 2) for p in peaks]
    np.testing.assert_array_equal(total.result().counts, 5 * base.counts)


def test_payloads_are_not_mutated_by_in_place_adds() -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=5, n=60)
    first = compute_stats(x, y, 3, "pooled", holdout_fraction=0.3, holdout_seed=2)
    second = compute_stats(x[::-1].copy(), y[::-1].copy(), 3, "pooled",
                           holdout_fraction=0.3, holdout_seed=4)
    snap = _fresh(first)
    acc = StatsTotal()
    for p in (first, second, second, second):  # adds 2-4 go into the copy of the first
        acc.add(p)
    assert first.holdout is not None and snap.holdout is not None
    for a, b in ((first, snap), (first.holdout, snap.holdout)):
        for name, arr in a.arrays().items():
            if arr is not None:
                np.testing.assert_array_equal(arr, b.arrays()[name])
                assert not np.shares_memory(arr, getattr(acc.result(), name) if a is first
                                            else getattr(acc.result().holdout, name))
    assert acc.result().n_samples == first.n_samples + 3 * second.n_samples


def _assert_identical(a: ClientStats, b: ClientStats) -> None:
    """Bit-for-bit equality of every array, held-out section included."""
    for name, arr in a.arrays().items():
        other = b.arrays()[name]
        assert (arr is None) == (other is None)
        if arr is not None:
            np.testing.assert_array_equal(arr, other)
    assert (a.holdout is None) == (b.holdout is None)
    if a.holdout is not None and b.holdout is not None:
        _assert_identical(a.holdout, b.holdout)


def test_an_earlier_result_is_not_changed_by_later_adds() -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=4, n=50)
    p = compute_stats(x, y, 3, "full", holdout_fraction=0.3, holdout_seed=5)
    acc = StatsTotal()
    acc.add(p)
    after_one = acc.result()  # the total's own arrays (a copy of p), handed out
    assert not np.shares_memory(after_one.class_scatter, p.class_scatter)
    acc.add(p)  # into new arrays: after_one keeps its own
    after_two = acc.result()
    acc.add(p)
    acc.add(p)  # in place again, into arrays no result holds
    two = p + p
    _assert_identical(after_one, p)
    _assert_identical(after_two, two)
    _assert_identical(acc.result(), (two + p) + p)
