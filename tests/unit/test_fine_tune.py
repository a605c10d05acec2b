"""Fine-tuning a linear head on a client's own rows (ghofl.model.fine_tune)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import check_grad

from ghofl.data.partition import dirichlet_partition
from ghofl.errors import ConfigError, InputError
from ghofl.heads.lda import LDAHead
from ghofl.heads.qda import QDAHead
from ghofl.model.fine_tune import _objective, fine_tune_heads, fine_tune_linear
from ghofl.model.personalize import personalize_heads
from ghofl.stats.accumulate import compute_stats

C, D = 4, 5
CLASSES = tuple(f"c{i}" for i in range(C))


def _data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Classes with different covariances: a shared-covariance LDA is misspecified."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=1.2, size=(C, D))
    scales = rng.uniform(0.3, 2.0, size=(C, D))
    y = rng.integers(0, C, size=n)
    return means[y] + scales[y] * rng.normal(size=(n, D)), y


def test_the_gradient_is_the_objectives() -> None:
    rng = np.random.default_rng(0)
    z, y = rng.normal(size=(40, D)), rng.integers(0, 3, size=40)
    start = rng.normal(size=(3, D + 1))
    theta = rng.normal(size=start.size)
    err = check_grad(lambda t: _objective(t, z, y, start, 7.0)[0],
                     lambda t: _objective(t, z, y, start, 7.0)[1], theta)
    assert err < 1e-5 * max(1.0, float(np.linalg.norm(_objective(theta, z, y, start, 7.0)[1])))


def test_the_result_is_stationary_and_moves_less_with_a_larger_tau() -> None:
    x, y = _data(1, 300)
    y = y % 3
    rng = np.random.default_rng(1)
    w0, b0 = rng.normal(size=(3, D)), rng.normal(size=3)
    moved = []
    for tau in (1.0, 30.0, 1000.0):
        w, b, info = fine_tune_linear(w0, b0, x, y, tau=tau)
        grad = _objective(np.column_stack([w, b]).ravel(), x, y, np.column_stack([w0, b0]),
                          tau)[1]
        assert info["converged"] and np.linalg.norm(grad) < 1e-3 * x.shape[0]
        moved.append(float(np.linalg.norm(np.column_stack([w - w0, b - b0]))))
    assert moved[0] > moved[1] > moved[2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fine_tuning_beats_the_local_priors_on_a_skewed_client(seed: int) -> None:
    x, y = _data(seed, 6000)
    xt, yt = _data(seed + 100, 4000)
    parts = dirichlet_partition(y[:4000], 4, 0.3, seed, min_per_client=50)
    total = compute_stats(x[:4000], y[:4000], CLASSES, mode="full")
    lda = LDAHead(shrinkage=0.05).fit_from_stats(total)
    gain = []
    for idx in parts:
        local = compute_stats(x[idx], y[idx], CLASSES, mode="full")
        pri, _ = personalize_heads({"lda": lda}, total.counts, local, pseudocount=0.0)
        tuned, rec = fine_tune_heads({"lda": lda}, total.counts, x[idx], y[idx])
        mix = local.counts / local.counts.sum()
        rows = np.concatenate([np.flatnonzero(yt == c)[: int(800 * p)] for c, p in enumerate(mix)])
        gain.append(np.mean(tuned["lda"].predict(xt[rows]) == yt[rows])
                    - np.mean(pri["lda"].predict(xt[rows]) == yt[rows]))
        held = set(np.unique(y[idx]).tolist())
        assert set(np.unique(tuned["lda"].predict(xt)).tolist()) <= held
        assert rec.rows == idx.size and rec.classes_held == len(held)
    assert np.mean(gain) > 0.0


def test_a_one_class_client_predicts_its_class_and_the_global_head_is_unchanged() -> None:
    x, y = _data(3, 400)
    total = compute_stats(x, y, CLASSES, mode="full")
    lda = LDAHead().fit_from_stats(total)
    before = lda.coef_.copy()
    tuned, _ = fine_tune_heads({"lda": lda}, total.counts, x[y == 2], y[y == 2])
    assert np.all(tuned["lda"].predict(x) == 2)
    np.testing.assert_array_equal(lda.coef_, before)


def test_bad_requests_are_refused() -> None:
    x, y = _data(4, 200)
    total = compute_stats(x, y, CLASSES, mode="full")
    lda = LDAHead().fit_from_stats(total)
    qda = QDAHead().fit_from_stats(total)
    with pytest.raises(ConfigError, match="fine-tuning needs linear heads"):
        fine_tune_heads({"qda": qda}, total.counts, x, y)
    with pytest.raises(ConfigError, match="tau must be a finite number > 0"):
        fine_tune_heads({"lda": lda}, total.counts, x, y, tau=0.0)
    with pytest.raises(InputError, match="labelled rows; got none"):
        fine_tune_heads({"lda": lda}, total.counts, x[:0], y[:0])
    with pytest.raises(InputError, match=r"class indices in 0\.\.3"):
        fine_tune_heads({"lda": lda}, total.counts, x, y + 1)
    counts = total.counts.copy()
    counts[1] = 0
    with pytest.raises(InputError, match="never saw"):
        fine_tune_heads({"lda": lda}, counts, x, y)
    with pytest.raises(InputError, match=r"coef \(k, d\), intercept"):
        fine_tune_linear(lda.coef_, lda.intercept_[:2], x, y)
    with pytest.raises(InputError, match="finite coefficients and rows"):
        fine_tune_linear(lda.coef_, lda.intercept_, np.full_like(x, np.nan), y)
    with pytest.raises(InputError, match=r"class indices in 0\.\.3"):
        fine_tune_linear(lda.coef_, lda.intercept_, x, y + 1)
