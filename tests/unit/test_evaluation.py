"""evaluate_heads: accuracies by hand, timing, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import InputError, NotFittedError
from ghofl.evaluation import HeadScore, evaluate_heads
from ghofl.heads import make_head
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture


def test_accuracy_is_the_fraction_of_correct_predictions() -> None:
    x, y = gaussian_mixture(6, num_classes=3, dim=4, n=300, sep=0.8)
    stats = compute_stats(x[:200], y[:200], 3)
    heads = {n: make_head(n).fit_from_stats(stats) for n in ("nb", "lda", "qda")}
    xte, yte = x[200:], y[200:]
    scores = evaluate_heads(heads, xte, yte)
    assert list(scores) == ["nb", "lda", "qda"]
    for name, head in heads.items():
        pred = head.predict(xte)
        correct = sum(int(p == t) for p, t in zip(pred.tolist(), yte.tolist(), strict=True))
        s = scores[name]
        assert isinstance(s, HeadScore)
        assert s.accuracy == correct / len(yte)
        np.testing.assert_array_equal(s.predictions, pred)
        assert s.predictions.dtype == np.int64 and s.predictions.shape == (100,)
        assert s.seconds >= 0 and s.n == 100
        assert s.to_dict() == {"accuracy": s.accuracy, "n": 100, "predict_seconds": s.seconds}
    assert 0 < scores["lda"].accuracy < 1


def test_hand_computed_accuracy_on_three_points() -> None:
    x = np.array([[0.0], [0.1], [5.0], [5.1]])
    y = np.array([0, 0, 1, 1])
    head = make_head("nb").fit_from_stats(compute_stats(x, y, 2))
    scores = evaluate_heads({"nb": head}, np.array([[0.0], [5.0], [0.05]]), np.array([0, 1, 1]))
    assert scores["nb"].accuracy == pytest.approx(2 / 3)
    np.testing.assert_array_equal(scores["nb"].predictions, [0, 1, 0])


def test_errors_are_named() -> None:
    x, y = gaussian_mixture(1, num_classes=2, dim=3, n=40)
    head = make_head("nb").fit_from_stats(compute_stats(x, y, 2))
    with pytest.raises(InputError, match=r"test embeddings have d=2 but head 'nb' expects d=3"):
        evaluate_heads({"nb": head}, x[:, :2], y)
    with pytest.raises(InputError, match=r"the test set is empty"):
        evaluate_heads({"nb": head}, x[:0], y[:0])
    with pytest.raises(InputError, match=r"test label 5 is out of range for 2 classes"):
        evaluate_heads({"nb": head}, x[:3], np.array([0, 1, 5]))
    with pytest.raises(NotFittedError):
        evaluate_heads({"nb": make_head("nb")}, x, y)
    other = make_head("nb").fit_from_stats(compute_stats(x, y, ("p", "q")))
    with pytest.raises(InputError, match=r"head 'b' was fitted on other classes than head 'a'"):
        evaluate_heads({"a": head, "b": other}, x, y)
    assert evaluate_heads({}, x, y) == {}
