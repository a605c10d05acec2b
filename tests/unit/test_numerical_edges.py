"""Numerical edge cases over every head: tiny classes, d > N, singular covariances, float32
input, feature scales from 1e-6 to 1e6. No head may produce NaN; degenerate statistics are
either handled with a warning saying what was done, or refused with a clear error."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, GhoflError, StatsValidationError
from ghofl.heads import available_heads, make_head
from ghofl.model.directory import check_fitted_head
from ghofl.moments.core import GhoflWarning
from ghofl.stats import compute_stats

HEADS = available_heads()
FAST = {"epochs": 1, "n_per_class": 40, "batch_size": 64}


def _head(name: str) -> Any:
    return make_head(name, **(FAST if name in ("fishermix", "protohyper") else {}))


def _data(case: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    y = np.arange(60) % 3
    if case == "one-sample class":
        x = rng.normal(size=(41, 4))
        return x, np.array([0] * 20 + [1] * 20 + [2])
    if case == "d > N":
        return rng.normal(size=(9, 20)), np.arange(9) % 3
    if case == "singular":
        x = rng.normal(size=(60, 4))
        x[:, 3] = x[:, 2]
        return x, y
    if case == "float32":
        return rng.normal(size=(60, 4)).astype(np.float32) + y[:, None], y
    scale = float(case)
    return (rng.normal(size=(60, 4)) + y[:, None]) * scale, y


def _fit(name: str, x: np.ndarray, y: np.ndarray) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        head = _head(name).fit_from_stats(compute_stats(x, y, 3, mode="full"))
    return head, [str(w.message) for w in caught if issubclass(w.category, GhoflWarning)]


@pytest.mark.parametrize("case", ["one-sample class", "d > N", "singular", "float32", "1e-6",
                                  "1e-3", "1", "1e3", "1e6"])
@pytest.mark.parametrize("name", HEADS)
def test_no_nan_in_any_head(name: str, case: str) -> None:
    x, y = _data(case)
    head, _ = _fit(name, x, y)
    proba = head.predict_proba(x)
    assert np.all(np.isfinite(proba))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)  # huge scores: ~1e-7
    check_fitted_head(name, head)  # what `ghofl fit` checks before writing


@pytest.mark.parametrize("name", ["qda", "fishermix", "protohyper"])
def test_a_one_sample_class_is_reported(name: str) -> None:
    # FisherMix's default synthesis ("auto") uses the pooled covariance outright when a class
    # has no more samples than Fisher dimensions; the class covariances (the paper's choice)
    # report the class they cannot estimate.
    params = {"syn_class_cov": True} if name == "fishermix" else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x, y = _data("one-sample class")
        make_head(name, **{**(FAST if name != "qda" else {}), **params}).fit_from_stats(
            compute_stats(x, y, 3, mode="full"))
    messages = [str(w.message) for w in caught if issubclass(w.category, GhoflWarning)]
    assert any(re_search(r"class '2' has 1 sample\(s\): its covariance cannot be estimated, "
                         r"using the pooled", m) for m in messages), messages


def test_fishermix_auto_synthesis_falls_back_to_the_pooled_covariance() -> None:
    head, _ = _fit("fishermix", *_data("one-sample class"))
    assert head.syn_covariance_ == "pooled"
    x, y = _data("1")
    assert _fit("fishermix", x, y)[0].syn_covariance_ == "class"


def test_a_singular_total_covariance_is_reported() -> None:
    _, messages = _fit("fedcgs", *_data("d > N"))
    assert any(re_search(r"the FedCGS total covariance is singular; added a ridge of .* to its "
                         r"diagonal", m) for m in messages), messages


@pytest.mark.parametrize("name", HEADS)
def test_an_empty_class_is_refused_with_a_sentence(name: str) -> None:
    x = np.random.default_rng(1).normal(size=(40, 4))
    y = np.array([0] * 20 + [1] * 20)
    with pytest.raises(StatsValidationError, match=r"class\(es\) '2' have no samples in the "
                       r"aggregate, so no head can model them"):
        _head(name).fit_from_stats(compute_stats(x, y, 3, mode="full"))


@pytest.mark.parametrize("name", ["nb", "lda", "qda", "fedcgs"])
def test_heads_with_non_finite_scores_are_not_written(name: str) -> None:
    """Data scaled by 1e-160: the fit either stays finite or is refused before writing."""
    x, y = _data("1")
    try:
        head, _ = _fit(name, x * 1e-160, y)
    except GhoflError:
        return  # refused while fitting, with a ghofl error
    try:
        check_fitted_head(name, head)
    except ConfigError as exc:
        assert f"refusing to save head {name!r}" in str(exc)
        return
    assert np.all(np.isfinite(head.predict_proba(x * 1e-160)))


def re_search(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern, text) is not None
