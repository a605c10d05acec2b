"""The personalisation benchmark's per-client test rule, and the moments cache it relies on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.heads import make_head
from ghofl.model.personalize import personalize_heads
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture, load_script

ROOT = Path(__file__).resolve().parents[2]
BENCH = load_script(ROOT / "benchmarks" / "bench_personalize.py", "_bench_personalize")


@pytest.mark.parametrize(("counts", "cap", "want"), [
    ([30, 10, 0], 1000, [30, 10, 0]),      # m = n: the client's own mix, its own size
    ([300, 100, 0], 80, [60, 20, 0]),      # m = cap
    ([500, 50, 0], 1000, [100, 10, 0]),    # class 0 has 100 test rows: m = ⌊100·550/500⌋
])
def test_client_test_rows_keep_the_clients_mix(counts: list[int], cap: int,
                                               want: list[int]) -> None:
    y_test = np.repeat(np.arange(3), 100)
    rows = BENCH.client_test_rows(y_test, np.array(counts), cap, np.random.default_rng(0))
    assert np.bincount(y_test[rows], minlength=3).tolist() == want
    assert np.unique(rows).size == rows.size  # drawn without replacement


def test_the_moments_cache_changes_nothing() -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=6, n=400)
    total = compute_stats(x, y, 3, mode="full")
    heads = {"qda": make_head("qda").fit_from_stats(total)}
    cache: dict[str, object] = {}
    for part in (y < 2, y > 0):
        local = compute_stats(x[part], y[part], 3, mode="full")
        plain, _ = personalize_heads(heads, total.counts, local, moments=True)
        cached, _ = personalize_heads(heads, total.counts, local, moments=True, cache=cache)
        np.testing.assert_allclose(cached["qda"].predict_proba(x),
                                   plain["qda"].predict_proba(x), rtol=1e-12, atol=1e-15)
    assert len(cache) == 1 and len(next(iter(cache.values()))) == 3  # type: ignore[arg-type]
