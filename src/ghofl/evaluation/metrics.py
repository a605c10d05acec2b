"""Accuracy of fitted heads on labelled test embeddings."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.data.embeddings import check_labelled_embeddings
from ghofl.errors import InputError
from ghofl.heads.base import Head

__all__ = ["HeadScore", "evaluate_heads"]

I64 = NDArray[np.int64]


@dataclass(frozen=True)
class HeadScore:
    """How one head did on a test set.

    Attributes
    ----------
    accuracy : float
        Fraction of test samples predicted correctly, in [0, 1].
    seconds : float
        Wall-clock time to predict the whole test set.
    predictions : ndarray of int64, shape (n,)
        Predicted class indices (into the head's ``meta_.classes``).
    """

    accuracy: float
    seconds: float
    predictions: I64 = field(repr=False)

    @property
    def n(self) -> int:
        """Number of test samples."""
        return int(self.predictions.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"accuracy", "n", "predict_seconds"}`` (no predictions)."""
        return {"accuracy": self.accuracy, "n": self.n, "predict_seconds": self.seconds}


def evaluate_heads(
    heads: Mapping[str, Head], x: NDArray[Any], y: NDArray[Any], *, what: str = "test",
) -> dict[str, HeadScore]:
    """Predict ``x`` with every head and score the predictions against ``y``.

    Parameters
    ----------
    heads : mapping of str to Head
        Fitted heads, all on the same class list.
    x : array_like, shape (n, d)
        Finite test embeddings, in the input space of the heads (before any projection).
    y : array_like of int, shape (n,)
        True class indices into the heads' class list.
    what : str, default "test"
        Name of the data in messages.

    Returns
    -------
    dict of str to HeadScore
        In the order of ``heads``.

    Raises
    ------
    InputError
        Malformed or empty test data, labels out of range, a dimension the heads were not
        fitted on, or heads fitted on different class lists.
    NotFittedError
        A head is not fitted.
    """
    if not heads:
        return {}
    first_name, first = next(iter(heads.items()))
    first._check_fitted()
    classes = first.meta_.classes
    for name, head in heads.items():
        head._check_fitted()
        if head.meta_.classes != classes:
            raise InputError(
                f"head {name!r} was fitted on other classes than head {first_name!r}; "
                "evaluate heads fitted from the same statistics together"
            )
    xx, yy = check_labelled_embeddings(x, y, len(classes), what,
                                       range_hint="the heads do not know that class")
    if yy.size == 0:
        raise InputError(f"the {what} set is empty; accuracy needs at least one sample")
    for name, head in heads.items():
        if xx.shape[1] != head.n_features_in_:
            raise InputError(
                f"{what} embeddings have d={xx.shape[1]} but head {name!r} expects "
                f"d={head.n_features_in_}; embed the {what} set with the clients' encoder"
            )
    out: dict[str, HeadScore] = {}
    for name, head in heads.items():
        t0 = time.perf_counter()
        pred = np.asarray(head.predict(xx), dtype=np.int64)
        seconds = time.perf_counter() - t0
        out[name] = HeadScore(float(np.mean(pred == yy)), seconds, pred)
    return out
