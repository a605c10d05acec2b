"""The power-law-spectrum generator: exact, seeded statistics of drawn samples."""

from __future__ import annotations

import numpy as np

from ghofl.bench.spectrum import class_statistics, draw, spectrum_classes
from ghofl.stats.accumulate import compute_stats


def test_spectrum_and_statistics_are_sums_of_the_draws() -> None:
    gen = spectrum_classes(3, dim=6, num_classes=5, trace=12.0)
    assert np.isclose(gen.eigenvalues.sum(), 12.0)
    assert np.all(np.diff(gen.eigenvalues) < 0)
    np.testing.assert_allclose(gen.basis.T @ gen.basis, np.eye(6), atol=1e-12)
    stats = class_statistics(gen, 4, "full", seed=7, classes_per_chunk=2)
    rng = np.random.default_rng(7)
    ys = [np.repeat(np.arange(s, min(s + 2, 5)), 4) for s in range(0, 5, 2)]
    x = np.vstack([draw(gen, y, rng) for y in ys])
    ref = compute_stats(x, np.concatenate(ys), 5, mode="full")
    np.testing.assert_array_equal(stats.counts, np.full(5, 4))
    np.testing.assert_allclose(stats.sums, ref.sums, rtol=1e-12)
    np.testing.assert_allclose(stats.class_scatter, ref.class_scatter, rtol=1e-10, atol=1e-12)
    again = class_statistics(spectrum_classes(3, 6, 5, trace=12.0), 4, "full", seed=7,
                             classes_per_chunk=2)
    np.testing.assert_array_equal(again.sums, stats.sums)
