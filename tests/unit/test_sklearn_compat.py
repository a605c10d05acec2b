"""The heads are scikit-learn classifiers: estimator checks, clone, tags, model selection."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, InputError, NotFittedError
from ghofl.heads import (
    Fed3RHead,
    FedCGSHead,
    FedCOFHead,
    FisherMixHead,
    Head,
    LDAHead,
    NBDiagHead,
    NCMHead,
    ProtoHyperHead,
    QDAHead,
    RidgeHead,
    available_heads,
    head_class,
)
from ghofl.heads._inputs import ColumnVectorWarning
from ghofl.heads._params import BOOL, Integer, Options, Real, RealOrAuto
from tests.helpers import gaussian_mixture

pytest.importorskip("sklearn")

from sklearn.base import clone, is_classifier
from sklearn.exceptions import DataConversionWarning
from sklearn.exceptions import NotFittedError as SkNotFittedError
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

#: trainable heads at a budget that fits in a fraction of a second on a few hundred rows
FAST = {"epochs": 2, "n_per_class": 50, "val_per_class": 20, "batch_size": 64}
CLOSED_FORM = [NBDiagHead(), LDAHead(), QDAHead(), FedCGSHead(), RidgeHead(n_calibration=32),
               NCMHead(), NCMHead(metric="euclidean"), Fed3RHead(n_calibration=32),
               FedCOFHead(n_calibration=32)]


@parametrize_with_checks(CLOSED_FORM)
def test_sklearn_estimator_checks(estimator: Any, check: Any) -> None:
    check(estimator)


#: the trainable heads at a small budget pass the same checks (torch extra only)
TRAINABLE = ([FisherMixHead(**FAST), ProtoHyperHead(**FAST)]
             if importlib.util.find_spec("torch") is not None else [])


@parametrize_with_checks(TRAINABLE)
def test_sklearn_estimator_checks_trainable(estimator: Any, check: Any) -> None:
    check(estimator)


def test_head_classes_are_exported_and_match_the_registry() -> None:
    exported = {c.name: c for c in (NBDiagHead, LDAHead, QDAHead, FedCGSHead, RidgeHead,
                                    FisherMixHead, ProtoHyperHead, NCMHead, Fed3RHead,
                                    FedCOFHead)}
    assert set(exported) == set(available_heads())
    for name, cls in exported.items():
        assert head_class(name) is cls
    import ghofl.heads

    with pytest.raises(AttributeError, match=r"module 'ghofl\.heads' has no attribute 'SVMHead'"):
        ghofl.heads.SVMHead  # noqa: B018


@pytest.mark.parametrize("name", available_heads())
def test_clone_is_classifier_and_deep_params(name: str) -> None:
    head = head_class(name)()
    assert is_classifier(head)
    assert head.get_params(deep=True) == head.get_params(deep=False) == head.get_params()
    twin = clone(head)
    assert type(twin) is type(head) and twin is not head
    assert twin.get_params() == head.get_params()


def test_cross_val_score_grid_search_and_pipeline() -> None:
    x, y = gaussian_mixture(1, num_classes=3, dim=5, n=300)
    scores = cross_val_score(LDAHead(), x, y, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.6
    grid = GridSearchCV(LDAHead(), {"shrinkage": [0.0, 0.3, "auto"]}, cv=3).fit(x, y)
    assert grid.best_params_["shrinkage"] in (0.0, 0.3, "auto")
    assert grid.best_estimator_.get_params()["shrinkage"] == grid.best_params_["shrinkage"]
    pipe = make_pipeline(StandardScaler(), QDAHead()).fit(x * 100.0, y)
    assert pipe.score(x * 100.0, y) > 0.6
    assert pipe.predict_proba(x[:4]).shape == (4, 3)


@pytest.mark.parametrize("cls", [FisherMixHead, ProtoHyperHead])
def test_trainable_heads_work_with_clone_and_cross_val_score(cls: type[Head]) -> None:
    pytest.importorskip("torch")
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=150)
    head = cls(fisher_shrinkage="0.05", **FAST)
    scores = cross_val_score(head, x, y, cv=2)
    assert scores.min() > 0.5
    fitted = clone(head).fit(x, y)
    assert fitted.get_params()["fisher_shrinkage"] == "0.05"  # as given, not rewritten
    assert fitted.params_["fisher_shrinkage"] == 0.05


def test_labels_of_any_kind_round_trip() -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=4, n=240)
    names = np.array(["cat", "dog", "emu"])[y]
    head = NBDiagHead().fit(x, names)
    np.testing.assert_array_equal(head.classes_, ["cat", "dog", "emu"])
    assert head.meta_.classes == ("cat", "dog", "emu")
    assert set(head.predict(x)) <= {"cat", "dog", "emu"}
    assert head.score(x, names) == pytest.approx(NBDiagHead().fit(x, y).score(x, y))
    gaps = LDAHead().fit(x, 10 * y + 5)  # labels 5, 15, 25: no empty classes in between
    np.testing.assert_array_equal(gaps.classes_, [5, 15, 25])
    np.testing.assert_array_equal(gaps.predict(x), 10 * LDAHead().fit(x, y).predict(x) + 5)
    indices = LDAHead().fit(x, y)  # labels 0..C-1: indices, as from statistics
    assert indices.classes_.dtype == np.int64 and indices.predict(x).dtype == np.int64


@pytest.mark.parametrize(("cls", "given", "resolved"), [
    (LDAHead, {"shrinkage": "0.1"}, {"shrinkage": 0.1}),
    (QDAHead, {"shrinkage": "0.2", "pooled_shrinkage": "0.3"},
     {"shrinkage": 0.2, "pooled_shrinkage": 0.3}),
    (RidgeHead, {"alpha": "0.01", "n_calibration": 0}, {"alpha": 0.01, "n_calibration": 0}),
    (NBDiagHead, {"var_floor": 0}, {"var_floor": 0.0}),
])
def test_fit_never_rewrites_parameters(cls: type[Head], given: dict[str, Any],
                                       resolved: dict[str, Any]) -> None:
    x, y = gaussian_mixture(4, num_classes=2, dim=3, n=120)
    head = cls(**given)
    before = head.get_params()
    head.fit(x, y)
    assert head.get_params() == before
    for key, value in given.items():
        assert head.get_params()[key] == value and type(head.get_params()[key]) is type(value)
        assert head.params_[key] == resolved[key]
        assert type(head.params_[key]) is type(resolved[key])


def test_parameter_constraints_cover_every_parameter() -> None:
    for name in available_heads():
        cls = head_class(name)
        assert set(cls.parameter_constraints) == set(cls().get_params()), name


@pytest.mark.parametrize(("head", "match"), [
    (LDAHead(covariance_divisor="n-1"),
     r"^LDAHead: parameter 'covariance_divisor' must be one of 'n-c', 'n'; got 'n-1'$"),
    (QDAHead(shrinkage_target="pooledx"),
     r"^QDAHead: parameter 'shrinkage_target' must be one of 'pooled', 'scaled_identity', "
     r"'identity'; got 'pooledx'$"),
    (QDAHead(covariance_divisor=1),
     r"^QDAHead: parameter 'covariance_divisor' must be one of 'n-1', 'n'; got 1$"),
    (LDAHead(shrinkage=2.0), r"^LDAHead: shrinkage must be a number in \[0, 1\] or 'auto'"),
    (RidgeHead(seed=True), r"^RidgeHead: parameter 'seed' must be an integer >= 0; got True$"),
])
def test_parameter_errors_name_head_parameter_allowed_and_given(head: Head, match: str) -> None:
    x, y = gaussian_mixture(5, num_classes=2, dim=3, n=100)
    with pytest.raises(ConfigError, match=match):
        head.fit(x, y)


def test_constraint_kinds() -> None:
    assert BOOL.resolve(True) is True
    with pytest.raises(ValueError):
        BOOL.resolve(1)
    with pytest.raises(ValueError):
        Options((0, 1)).resolve(False)
    assert Options((True, False, "auto")).resolve("auto") == "auto"
    with pytest.raises(ValueError):
        Options(("a",)).resolve(np.array(["a", "a"]))
    assert Real(lo=0.0, hi=1.0, lo_open=True).resolve(1) == 1.0
    for bad in (0.0, 1.5, float("nan"), "0.5", None):
        with pytest.raises(ValueError):
            Real(lo=0.0, hi=1.0, lo_open=True).resolve(bad)
    assert Real(none_ok=True).resolve(None) is None
    assert Integer(lo=1).resolve(np.int64(3)) == 3
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError):
            Integer(lo=1).resolve(bad)
    assert RealOrAuto().resolve("auto") == "auto" and RealOrAuto().resolve("0.5") == 0.5
    for bad in (1.0, "big", -0.1, False):
        with pytest.raises(ValueError):
            RealOrAuto().resolve(bad)
    assert Real(lo=0.0, lo_open=True).describe() == "a number in (0.0, inf]"
    assert Integer(lo=1, none_ok=True).describe() == "an integer >= 1 or None"


@pytest.mark.parametrize(("x", "y", "match"), [
    (np.zeros((4, 2)), None, r"LDAHead requires y to be passed, but the target y is None"),
    (np.zeros((0, 2)), np.zeros(0),
     r"Found array with 0 sample\(s\) \(shape=\(0, 2\)\) while a minimum of 1 is required"),
    (np.zeros((4, 0)), np.arange(4) % 2,
     r"Found array with 0 feature\(s\) \(shape=\(4, 0\)\) while a minimum of 1 is required"),
    (np.zeros(4), np.arange(4) % 2, r"needs a 2-D array X .*Reshape your data"),
    (np.ones((4, 2)) * 1j, np.arange(4) % 2, r"Complex data not supported"),
    (np.array([["a", "b"], ["c", "d"]]), np.arange(2), r"LDAHead needs numeric features"),
    (np.full((4, 2), np.nan), np.arange(4) % 2, r"X contains NaN or infinite values"),
    (np.zeros((1, 2)), np.zeros(1), r"LDAHead got 1 sample\(s\) \(n_samples=1\) but needs at "
                                    r"least 2"),
    (np.zeros((4, 2)), np.arange(3), r"X and y have inconsistent numbers of samples: 4 rows"),
    (np.zeros((4, 2)), np.array([0.5, 1.0, 0.0, 1.0]), r"Unknown label type: continuous"),
    (np.zeros((4, 2)), np.array([0.0, np.nan, 0.0, 1.0]), r"Input y contains NaN"),
    (np.zeros((4, 2)), np.zeros((4, 2)), r"needs y as a 1-D array of shape \(n_samples,\)"),
])
def test_fit_input_errors(x: Any, y: Any, match: str) -> None:
    with pytest.raises(InputError, match=match):
        LDAHead().fit(x, y)


def test_sparse_input_is_refused_with_a_hint() -> None:
    from scipy.sparse import csr_matrix

    with pytest.raises(InputError, match=r"LDAHead got a sparse matrix; .*X.toarray\(\)"):
        LDAHead().fit(csr_matrix(np.eye(4)), np.arange(4) % 2)


def test_column_vector_labels_are_read_with_a_warning() -> None:
    x, y = gaussian_mixture(6, num_classes=2, dim=3, n=80)
    with pytest.warns(ColumnVectorWarning, match="A column-vector y was passed") as record:
        head = LDAHead().fit(x, y[:, None])
    assert issubclass(record[0].category, DataConversionWarning)  # sklearn is loaded here
    np.testing.assert_array_equal(head.predict(x), LDAHead().fit(x, y).predict(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LDAHead().fit(x, y)


def test_not_fitted_error_is_also_sklearns() -> None:
    with pytest.raises(NotFittedError) as info:
        LDAHead().predict(np.zeros((2, 3)))
    assert isinstance(info.value, SkNotFittedError)


def test_predict_reads_object_arrays_of_numbers() -> None:
    x, y = gaussian_mixture(7, num_classes=2, dim=3, n=80)
    head = LDAHead().fit(x, y)
    np.testing.assert_array_equal(head.predict(x.astype(object)), head.predict(x))
    with pytest.raises(InputError, match="LDAHead needs numeric features"):
        head.predict(np.full((2, 3), "a", dtype=object))


# ---------------------------------------------------------------- binary problems
def test_estimator_checks_cover_every_head() -> None:
    pytest.importorskip("torch", reason="the trainable heads' checks need the torch extra")
    assert {type(h).name for h in CLOSED_FORM + TRAINABLE} == set(available_heads())


def _binary(name: str) -> tuple[Head, np.ndarray, np.ndarray]:
    """An unfitted head at a small budget, and overlapping two-class data labelled neg/pos."""
    if name in ("fishermix", "protohyper"):
        pytest.importorskip("torch", reason="the trainable heads need the torch extra")
    cls = head_class(name)
    budget = {**FAST, "n_calibration": 32}
    head = cls(**{k: v for k, v in budget.items() if k in cls().get_params()})
    x, y = gaussian_mixture(11, num_classes=2, dim=4, n=240, sep=1.0)
    return head, x, np.array(["neg", "pos"])[y]


@pytest.mark.parametrize("name", available_heads())
def test_binary_decision_function_is_the_log_odds_of_classes_1(name: str) -> None:
    head, x, labels = _binary(name)
    head.fit(x, labels)
    dec = head.decision_function(x)
    scores = head.class_scores(x)
    assert dec.shape == (len(x),) and scores.shape == (len(x), 2)
    np.testing.assert_array_equal(dec, scores[:, 1] - scores[:, 0])
    log_proba = head.predict_log_proba(x)
    np.testing.assert_allclose(dec, log_proba[:, 1] - log_proba[:, 0], rtol=1e-9,
                               atol=1e-12 * (1.0 + np.max(np.abs(scores))))
    # > 0 exactly where classes_[1] is predicted, and both signs occur
    np.testing.assert_array_equal(head.predict(x), head.classes_[(dec > 0).astype(int)])
    assert np.any(dec > 0) and np.any(dec < 0)
    truth = labels == head.classes_[1]
    auc = roc_auc_score(truth, dec)
    assert auc == pytest.approx(roc_auc_score(truth, head.predict_proba(x)[:, 1]), abs=1e-12)
    assert 0.6 < auc < 1.0  # overlapping classes: a real ranking, not a separable toy


@pytest.mark.parametrize("name", available_heads())
def test_calibrated_classifier_cv_calibrates_the_binary_decision_function(name: str) -> None:
    from sklearn.calibration import CalibratedClassifierCV

    head, x, labels = _binary(name)
    cal = CalibratedClassifierCV(head, method="sigmoid", cv=3).fit(x, labels)
    proba = cal.predict_proba(x)
    assert proba.shape == (len(x), 2)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(cal.classes_, ["neg", "pos"])
    assert set(cal.predict(x)) <= {"neg", "pos"} and cal.score(x, labels) > 0.6
    # one sigmoid on the (n,) decision values of each fold's head
    fold = cal.calibrated_classifiers_[0]
    assert len(fold.calibrators) == 1
    np.testing.assert_allclose(fold.predict_proba(x)[:, 1],
                               fold.calibrators[0].predict(fold.estimator.decision_function(x)))


@pytest.mark.parametrize("name", available_heads())
def test_roc_curve_display_from_estimator(name: str) -> None:
    matplotlib = pytest.importorskip("matplotlib", reason="RocCurveDisplay needs matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import RocCurveDisplay

    head, x, labels = _binary(name)
    head.fit(x, labels)
    auc = roc_auc_score(labels == "pos", head.decision_function(x))
    try:
        for method in ("decision_function", "predict_proba", "auto"):
            disp = RocCurveDisplay.from_estimator(head, x, labels, response_method=method)
            assert disp.roc_auc == pytest.approx(auc, abs=1e-12), method
            assert disp.pos_label == "pos"
    finally:
        plt.close("all")


def test_more_than_two_classes_keep_the_score_matrix() -> None:
    x, y = gaussian_mixture(12, num_classes=3, dim=4, n=240)
    head = LDAHead().fit(x, y)
    dec = head.decision_function(x)
    assert dec.shape == (240, 3)
    np.testing.assert_array_equal(dec, head.class_scores(x))
    np.testing.assert_array_equal(head.predict(x), np.argmax(dec, axis=1))
    assert roc_auc_score(y, head.predict_proba(x), multi_class="ovr") > 0.8


def test_a_class_of_probability_zero_gives_an_infinite_binary_score() -> None:
    """Statistics where class 1 has no samples: its log prior is -inf, so is its score."""
    from ghofl.moments.core import compute_moments
    from ghofl.stats import compute_stats

    x, _ = gaussian_mixture(13, num_classes=1, dim=3, n=50)
    stats = compute_stats(x, np.zeros(50, dtype=np.int64), 2)
    head = NBDiagHead().fit_from_moments(compute_moments(stats, allow_empty_classes=True))
    assert np.all(head.decision_function(x) == -np.inf)
    np.testing.assert_array_equal(head.predict(x), np.zeros(50))
    assert np.all(head.predict_proba(x)[:, 1] == 0.0)  # exactly 0: no floor for -inf


def test_probabilities_below_the_smallest_normal_float_keep_a_finite_log() -> None:
    x, y = gaussian_mixture(14, num_classes=2, dim=3, n=200)
    head = LDAHead().fit(x, y)
    far = head.means_[:1] + 60.0 * (head.means_[:1] - head.means_[1:2])  # deep inside class 0
    log_proba = head.predict_log_proba(far)
    assert np.isfinite(log_proba[0, 1]) and log_proba[0, 1] < -800.0  # exp() underflows to 0
    proba = head.predict_proba(far)
    assert proba[0, 1] == np.finfo(np.float64).tiny and proba[0, 0] == 1.0
    assert head.decision_function(far)[0] == pytest.approx(log_proba[0, 1], rel=1e-9)
