"""Federated evaluation: the clients' sums give the metrics of the union of their rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    confusion_matrix,
    f1_score,
    log_loss,
)

from ghofl.errors import InputError
from ghofl.evaluation.federated import (
    LOG_LOSS_CAP,
    EvaluationSums,
    load_evaluation,
    local_evaluation,
    report,
    save_evaluation,
    vector_bounds,
)
from ghofl.heads.lda import LDAHead
from ghofl.heads.nb import NBDiagHead
from ghofl.heads.qda import QDAHead

C, D = 4, 5


def _data(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=1.5, size=(C, D))
    y = rng.integers(0, C, size=n)
    return means[y] + rng.normal(size=(n, D)), y


@pytest.fixture(scope="module")
def heads() -> dict[str, object]:
    x, y = _data(0, 400)
    return {"nb": NBDiagHead().fit(x, y, classes=C), "lda": LDAHead().fit(x, y, classes=C),
            "qda": QDAHead(shrinkage=0.2).fit(x, y, classes=C)}


def _split(n: int, k: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, n), size=k - 1, replace=False))
    return np.split(rng.permutation(n), cuts)


def _federated(heads: dict[str, object], x: np.ndarray, y: np.ndarray, parts: list[np.ndarray]
               ) -> EvaluationSums:
    return sum(local_evaluation(heads, x[p], y[p]) for p in parts)  # type: ignore[return-value]


def _central_ece(proba: np.ndarray, y: np.ndarray, bins: int = 15) -> float:
    conf, pred = proba.max(axis=1), proba.argmax(axis=1)
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        inside = (conf >= lo) & ((conf < hi) if b < bins - 1 else (conf <= hi))
        if inside.any():
            total += abs(np.sum(pred[inside] == y[inside]) - np.sum(conf[inside]))
    return total / y.size


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_federated_metrics_equal_central_sklearn(heads: dict[str, object], seed: int) -> None:
    x, y = _data(100 + seed, 300)
    parts = _split(y.size, 2 + seed, seed)
    total = _federated(heads, x, y, parts)
    rep = report(total)
    assert total.clients == len(parts)
    for name, head in heads.items():
        proba = head.predict_proba(x)  # type: ignore[attr-defined]
        pred = head.predict(x)  # type: ignore[attr-defined]
        h = total.heads[name]
        np.testing.assert_array_equal(h.confusion, confusion_matrix(y, pred, labels=range(C)))
        r = rep[name]
        assert r["n"] == y.size
        assert r["accuracy"] == pytest.approx(accuracy_score(y, pred), abs=1e-12)
        assert r["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred),
                                                       abs=1e-12)
        assert r["macro_f1"] == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-12)
        assert r["log_loss"] == pytest.approx(log_loss(y, proba, labels=range(C)), abs=1e-12)
        assert r["ece"] == pytest.approx(_central_ece(proba, y), abs=1e-12)
        accs = [np.mean(pred[p] == y[p]) for p in parts]
        assert r["client_accuracy_mean"] == pytest.approx(np.mean(accs), abs=1e-12)
        assert r["client_accuracy_std"] == pytest.approx(np.std(accs), abs=1e-12)


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_macro_f1_with_a_class_absent_from_the_held_out_rows(heads: dict[str, object]) -> None:
    x, y = _data(7, 200)
    keep = y != 3
    x, y = x[keep], y[keep]
    rep = report(_federated(heads, x, y, _split(y.size, 3, 0)))
    for name, head in heads.items():
        pred = head.predict(x)  # type: ignore[attr-defined]
        assert rep[name]["macro_f1"] == pytest.approx(f1_score(y, pred, average="macro"),
                                                      abs=1e-12)
        assert rep[name]["balanced_accuracy"] == pytest.approx(
            balanced_accuracy_score(y, pred), abs=1e-12)


@settings(max_examples=15, deadline=None)
@given(k1=st.integers(1, 8), k2=st.integers(1, 8), s1=st.integers(0, 10**6),
       s2=st.integers(0, 10**6))
def test_the_sum_does_not_depend_on_the_split_into_clients(heads: dict[str, object], k1: int,
                                                           k2: int, s1: int, s2: int) -> None:
    x, y = _data(11, 120)
    a = _federated(heads, x, y, _split(y.size, k1, s1))
    b = _federated(heads, x, y, _split(y.size, k2, s2))
    ra, rb = report(a), report(b)
    for name in heads:
        ha, hb = a.heads[name], b.heads[name]
        np.testing.assert_array_equal(ha.confusion, hb.confusion)
        np.testing.assert_array_equal(ha.bin_counts, hb.bin_counts)
        np.testing.assert_array_equal(ha.bin_correct, hb.bin_correct)
        np.testing.assert_allclose(ha.bin_confidence_sum, hb.bin_confidence_sum, atol=1e-12)
        assert ha.log_loss_sum == pytest.approx(hb.log_loss_sum, abs=1e-12 * y.size)
        for key in ("accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece"):
            assert ra[name][key] == pytest.approx(rb[name][key], abs=1e-12)


def test_a_model_applies_its_features(heads: dict[str, object]) -> None:
    class Model:
        def __init__(self) -> None:
            self.heads = heads

        def features(self, x: np.ndarray, transform: str | None = None) -> np.ndarray:
            return np.asarray(x, dtype=np.float64) * 2.0

    x, y = _data(5, 50)
    via_model = local_evaluation(Model(), x, y)  # type: ignore[arg-type]
    direct = local_evaluation(heads, 2.0 * x, y)  # type: ignore[arg-type]
    np.testing.assert_array_equal(via_model.heads["lda"].confusion,
                                  direct.heads["lda"].confusion)


def test_file_round_trip_is_exact(heads: dict[str, object], tmp_path: object) -> None:
    x, y = _data(3, 90)
    total = _federated(heads, x, y, _split(y.size, 3, 1))
    path = save_evaluation(tmp_path / "total.ghe", total)  # type: ignore[operator]
    back = load_evaluation(path)
    assert back.classes == total.classes and back.clients == 3 and back.bins == 15
    for name in heads:
        a, b = total.heads[name], back.heads[name]
        np.testing.assert_array_equal(a.confusion, b.confusion)
        np.testing.assert_array_equal(a.bin_confidence_sum, b.bin_confidence_sum)
        assert a.log_loss_sum == b.log_loss_sum
        assert a.client_accuracy_sq_sum == b.client_accuracy_sq_sum


def _rewrite(path: object, edit: object, redigest: bool) -> None:
    from ghofl.evaluation.federated import _digest

    raw = json.loads(path.read_text())  # type: ignore[attr-defined]
    edit(raw)  # type: ignore[operator]
    if redigest:
        raw["digest"] = _digest({k: v for k, v in raw.items() if k != "digest"})
    path.write_text(json.dumps(raw))  # type: ignore[attr-defined]


def test_bad_files_are_refused(heads: dict[str, object], tmp_path: object) -> None:
    x, y = _data(3, 60)
    path = tmp_path / "a.ghe"  # type: ignore[operator]
    save_evaluation(path, local_evaluation(heads, x, y))  # type: ignore[arg-type]
    _rewrite(path, lambda r: r["heads"]["nb"].__setitem__("log_loss_sum", 1.0), False)
    with pytest.raises(InputError, match="does not match its digest"):
        load_evaluation(path)
    _rewrite(path, lambda r: r["heads"]["nb"]["bin_counts"].__setitem__(0, 1000), True)
    with pytest.raises(InputError, match="no clients' evaluation can produce"):
        load_evaluation(path)
    _rewrite(path, lambda r: r.__setitem__("format_version", 99), True)
    with pytest.raises(InputError, match="format version 99"):
        load_evaluation(path)
    _rewrite(path, lambda r: r.__setitem__("format", "other"), True)
    with pytest.raises(InputError, match="not a ghofl evaluation file"):
        load_evaluation(path)
    path.write_text("not json")  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="not JSON"):
        load_evaluation(path)
    save_evaluation(path, local_evaluation(heads, x, y))  # type: ignore[arg-type]
    _rewrite(path, lambda r: r["heads"]["nb"].__setitem__("confusion", [[0.5]]), True)
    with pytest.raises(InputError, match="malformed field"):
        load_evaluation(path)


def test_adding_sums_of_other_models_is_refused(heads: dict[str, object]) -> None:
    x, y = _data(3, 40)
    a = local_evaluation(heads, x, y)  # type: ignore[arg-type]
    b = local_evaluation({"nb": heads["nb"]}, x, y)  # type: ignore[dict-item]
    with pytest.raises(InputError, match="cannot add evaluation sums of heads"):
        _ = a + b
    c = local_evaluation(heads, x, y, bins=10)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="different classes or confidence bins"):
        _ = a + c
    with pytest.raises(InputError, match="set is empty"):
        local_evaluation(heads, x[:0], y[:0])  # type: ignore[arg-type]
    with pytest.raises(InputError, match="confidence bins must be an integer >= 1"):
        local_evaluation(heads, x, y, bins=0)  # type: ignore[arg-type]


def test_vectors_round_trip_within_public_bounds(heads: dict[str, object]) -> None:
    x, y = _data(9, 80)
    parts = _split(y.size, 4, 2)
    per_client = [local_evaluation(heads, x[p], y[p]) for p in parts]  # type: ignore[arg-type]
    hi_int, hi_float = vector_bounds(per_client[0], max_samples=max(p.size for p in parts))
    for s in per_client:
        ints, floats = s.to_vectors()
        assert np.all(np.abs(ints) <= hi_int) and np.all(np.abs(floats) <= hi_float)
    ints = sum(s.to_vectors()[0] for s in per_client)
    floats = sum(s.to_vectors()[1] for s in per_client)
    back = EvaluationSums.from_vectors(per_client[0].classes, tuple(heads), 15, ints, floats)
    total = sum(per_client)
    assert back.clients == 4
    for name in heads:
        np.testing.assert_array_equal(back.heads[name].confusion, total.heads[name].confusion)
        assert back.heads[name].log_loss_sum == pytest.approx(total.heads[name].log_loss_sum,
                                                              abs=1e-12)
    assert pytest.approx(-np.log(np.finfo(np.float64).eps)) == LOG_LOSS_CAP
    with pytest.raises(InputError, match="do not match"):
        EvaluationSums.from_vectors(per_client[0].classes, tuple(heads), 14, ints, floats)
