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


def _run(alpha: float, seed: int, scores: dict[str, float]) -> dict[str, object]:
    methods = {m: {"mean": scores.get(m, 0.5), "p10": scores.get(m, 0.5) - 0.05}
               for m in BENCH.METHODS}
    lda = {"accuracy": 0.8, "client_accuracy_mean": 0.8, "client_accuracy_std": 0.05, "n": 10}
    return {"alpha": alpha, "seed": seed, "methods": methods,
            "central": {"lda": 0.8, "qda": 0.77},
            "federated": {k: {"lda": lda, "qda": lda} for k in ("global", "personalised")}}


def test_the_verdict_pairs_the_methods_by_partition() -> None:
    # fine-tuned lda leads FedAvg + FT by 0.4-0.6 point on every partition while both move
    # 4 points from partition to partition: a decided lead when paired, a tie unpaired.
    base = [0.90, 0.94, 0.92, 0.96]
    runs = {f"alpha=0.1/seed={i}": _run(0.1, i, {
        "fine-tuned lda": b + 0.004 + 0.002 * (i % 2), "fedavg + fine-tune": b,
        "local only": b - 0.01, "global lda": 0.8}) for i, b in enumerate(base)}
    text = BENCH._part_text("cifar10/10", {"dataset": "cifar10", "clients": 10,
                                           "encoder": "e", "n_train": 1, "n_test": 1,
                                           "runs": runs})
    assert ("+0.5 ± 0.1 point(s) against fedavg + fine-tune (paired over 4 partitions: a "
            "decided lead)") in text
    assert "(the bar: above all three, met)" in text
    worse = {k: _run(0.1, r["seed"], {"fine-tuned lda": 0.9 + (0.01 if r["seed"] % 2 else -0.01),
                                      "fedavg + fine-tune": 0.9})  # type: ignore[index]
             for k, r in runs.items()}
    text = BENCH._part_text("cifar10/10", {"dataset": "cifar10", "clients": 10,
                                           "encoder": "e", "n_train": 1, "n_test": 1,
                                           "runs": worse})
    assert "fedavg + fine-tune (paired over 4 partitions: above, within 2 SE)" not in text
    assert "against fedavg + fine-tune (paired over 4 partitions: tied)" in text
    below = {k: _run(0.1, r["seed"], {"fine-tuned lda": 0.9 - (0.02 if r["seed"] % 2 else 0.0),
                                      "fedavg + fine-tune": 0.9})  # type: ignore[index]
             for k, r in runs.items()}
    text = BENCH._part_text("cifar10/10", {"dataset": "cifar10", "clients": 10,
                                           "encoder": "e", "n_train": 1, "n_test": 1,
                                           "runs": below})
    assert "against fedavg + fine-tune (paired over 4 partitions: BELOW)" in text


def test_an_infeasible_partition_is_recorded_not_averaged() -> None:
    y = np.repeat(np.arange(2), 6)

    class F:  # the features' fields run_seed reads
        x_train, y_train = np.zeros((12, 3)), y
        x_test, y_test = np.zeros((4, 3)), np.arange(4) % 2
        classes, encoder_info = ("a", "b"), None

    r = BENCH.run_seed(F(), 10, 0.05, 0, 1)  # 12 rows cannot give 10 clients 2 rows each
    assert set(r) == {"clients", "alpha", "seed", "infeasible"}
    assert "min_per_client=2" in r["infeasible"]
    runs = {"alpha=0.05/seed=0": r, "alpha=0.1/seed=0": _run(0.1, 0, {})}
    assert list(BENCH.summarise(runs)) == ["0.1"]
    assert set(BENCH._complete(runs)) == set(runs)  # neither is measured again
    text = BENCH._part_text("agnews/100", {"dataset": "agnews", "clients": 100, "encoder": "e",
                                           "n_train": 6080, "n_test": 1, "runs": runs})
    assert ("α = 0.05, seed(s) 0: not run: no Dirichlet partition of the 6,080 training rows "
            "gives each of the 100 clients 2 rows or more") in text
