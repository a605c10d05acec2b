"""Trainable heads at many classes (issue 11 §2): the QDA_f-cost cap on Proto-Hyper's
automatic synthetic sample count and the single-thread BLAS block."""

from __future__ import annotations

from typing import Any

import pytest

import ghofl.heads._training as training
from ghofl.bench.synthetic import gaussian_classes
from ghofl.heads._training import (
    auto_qda_samples_per_class,
    auto_samples_per_class,
    auto_train_samples_per_class,
    blas_threads,
    synthesis_covariance,
)
from ghofl.heads.protohyper import ProtoHyperHead
from ghofl.moments import compute_moments
from ghofl.stats import compute_stats


@pytest.mark.parametrize("c", [2, 10, 50, 100])
def test_qda_cap_leaves_small_and_medium_class_counts_alone(c: int) -> None:
    assert auto_qda_samples_per_class(c, c - 1) == auto_samples_per_class(c)


@pytest.mark.parametrize(("c", "k", "expected"), [
    (200, 199, 126),    # 2e11 / (200² · 199²) = 126.3
    (150, 149, 400),    # 2e11 / (150² · 149²) = 400.4, below auto's 1333
    (1000, 999, 100),   # the floor
])
def test_qda_cap_bounds_the_scoring_cost_at_large_c(c: int, k: int, expected: int) -> None:
    n = auto_qda_samples_per_class(c, k)
    assert n == expected
    assert n < auto_samples_per_class(c)
    if n > 100:
        assert c * n * c * k * k <= training.AUTO_QDA_MACS


@pytest.mark.parametrize("c", [2, 10, 50, 100])
def test_training_cap_leaves_up_to_100_classes_alone(c: int) -> None:
    assert auto_train_samples_per_class(c, c - 1) == auto_samples_per_class(c)


@pytest.mark.parametrize(("c", "k", "expected"), [(200, 199, 251), (101, 100, 1960),
                                                  (2000, 1999, 100)])
def test_training_cap_bounds_the_epoch_cost_at_large_c(c: int, k: int, expected: int) -> None:
    n = auto_train_samples_per_class(c, k)
    assert n == expected < auto_samples_per_class(c)
    if n > 100:
        assert c * n * c * k <= training.AUTO_TRAIN_MACS


def test_blas_threads_limits_inside_the_block_and_restores() -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")

    def blas_threads_now() -> list[int]:
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i.get("user_api") == "blas"]

    before = blas_threads_now()
    with blas_threads(1):
        assert all(n == 1 for n in blas_threads_now())
    assert blas_threads_now() == before
    with blas_threads(None):
        assert blas_threads_now() == before


@pytest.fixture(scope="module")
def moments() -> Any:
    sp = gaussian_classes(seed=5, dim=8, num_classes=4, n_train=1200, n_test=10)
    return compute_moments(compute_stats(sp.x_train, sp.y_train, 4, mode="full"))


@pytest.mark.parametrize(("teacher", "capped"), [("informative", True), ("paper", False)])
def test_protohyper_caps_auto_samples_only_when_qda_scores_the_rows(
    moments: Any, monkeypatch: pytest.MonkeyPatch, teacher: str, capped: bool
) -> None:
    pytest.importorskip("torch")
    # a budget small enough to bind at C = 4, k_f = 3: 4e4 / (4² · 3²) = 277 per class
    monkeypatch.setattr(training, "AUTO_QDA_MACS", 4e4)
    head = ProtoHyperHead(teacher=teacher, epochs=2).fit_from_moments(moments)  # type: ignore[arg-type]
    assert head.k_f_ == 3
    assert head.n_per_class_ == (277 if capped else auto_samples_per_class(4))
    fixed = ProtoHyperHead(teacher=teacher, n_per_class=500, epochs=2)  # type: ignore[arg-type]
    assert fixed.fit_from_moments(moments).n_per_class_ == 500  # an explicit count is kept


def _moments_with(n_per_class: int, mode: Any = "full") -> Any:
    sp = gaussian_classes(seed=7, dim=12, num_classes=6, n_train=6 * n_per_class, n_test=6)
    return compute_moments(compute_stats(sp.x_train, sp.y_train, 6, mode=mode))


@pytest.mark.parametrize(("setting", "n_per_class", "mode", "expected"), [
    (False, 200, "full", "pooled"),
    (True, 4, "full", "auto"),         # the paper: class covariances whenever present
    ("auto", 200, "full", "auto"),     # N_c = 200 > k_f = 5
    ("auto", 5, "full", "pooled"),     # N_c = 5 ≤ k_f = 5: not full rank in the Fisher space
    ("auto", 200, "pooled", "auto"),   # no class covariances: fisher_gaussians pools anyway
])
def test_synthesis_covariance_rule(setting: Any, n_per_class: int, mode: str,
                                   expected: str) -> None:
    m = _moments_with(n_per_class, mode)
    assert int(m.counts.min()) == n_per_class
    assert synthesis_covariance(setting, m, 5) == expected


@pytest.mark.parametrize(("setting", "n_per_class", "used"), [
    ("auto", 5, "pooled"), ("auto", 60, "class"), (True, 5, "class"),
])
def test_fishermix_records_the_synthesis_covariance_used(setting: Any, n_per_class: int,
                                                         used: str) -> None:
    pytest.importorskip("torch")
    from ghofl.heads.fishermix import FisherMixHead

    head = FisherMixHead(syn_class_cov=setting, n_per_class=50, val_per_class=50, epochs=1)
    head.fit_from_moments(_moments_with(n_per_class))
    assert head.k_f_ == 5 and head.syn_covariance_ == used


def test_protohyper_drops_qda_from_the_teacher_when_unaffordable(
    moments: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where QDA_f cannot score 100 rows per class within its budget (here a budget binding at
    C = 4, k_f = 3: 4² · 3² · 100 = 14,400 > 10⁴), the informative teacher is LDA_f only, with
    a warning; an explicit n_per_class keeps the QDA_f blend, and so does a cheap problem."""
    pytest.importorskip("torch")
    from ghofl.errors import GhoflWarning
    from ghofl.heads import preflight

    assert training.qda_teacher_affordable(200, 199)
    assert not training.qda_teacher_affordable(1000, 512)
    assert ProtoHyperHead(epochs=1).fit_from_moments(moments).teacher_used_ == "qda_lda"
    full = preflight.estimate_fit(ProtoHyperHead(), "full", 4, 8).memory_bytes
    monkeypatch.setattr(training, "AUTO_QDA_MACS", 1e4)
    with pytest.warns(GhoflWarning, match=r"teacher is LDA_f only.*set n_per_class"):
        head = ProtoHyperHead(epochs=1).fit_from_moments(moments)
    assert head.teacher_used_ == "lda" and head.qda_prec_.shape == (0, 3, 3)
    kept = ProtoHyperHead(epochs=1, n_per_class=50).fit_from_moments(moments)
    assert kept.teacher_used_ == "qda_lda"
    # the pre-flight estimate follows: no QDA_f precisions and covariances counted
    assert preflight.estimate_fit(ProtoHyperHead(), "full", 4, 8).memory_bytes < full
