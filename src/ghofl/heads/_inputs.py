"""Validation of the pooled data given to a head's thin ``fit(X, y)``, scikit-learn style.

The federated path never comes here: clients reduce their data to statistics, and heads are
fitted from those. ``fit(X, y)`` is the convenience that lets a head be used as a
scikit-learn classifier (``clone``, ``cross_val_score``, ``GridSearchCV``, ``Pipeline``), so it
accepts what scikit-learn classifiers accept (array-likes, any hashable labels) and refuses
what they refuse, with messages that name the problem and the fix.
"""

from __future__ import annotations

import functools
import sys
import warnings
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import InputError
from ghofl.moments.core import GhoflWarning

T = TypeVar("T", bound=type)


def sklearn_flavoured(ours: T, module: str, name: str) -> T:
    """``ours``, or a subclass of it and of scikit-learn's ``module.name``.

    The subclass when scikit-learn is already imported, so that scikit-learn's own
    ``except NotFittedError`` or warning filters see ghofl's errors and warnings;
    scikit-learn is never imported here.
    """
    if module not in sys.modules:
        return ours
    return cast(T, _dual(ours, module, name))


@functools.cache
def _dual(ours: type, module: str, name: str) -> type:
    theirs = getattr(sys.modules[module], name)
    # scikit-learn's name, which its checks read in warning reprs
    return type(theirs.__name__, (ours, theirs), {"__module__": ours.__module__,
                                                "__doc__": ours.__doc__})


class ColumnVectorWarning(GhoflWarning):
    """Labels were given as a column vector (n, 1) and read as a 1-D array."""


@dataclass(frozen=True)
class TrainingData:
    """Checked training data.

    Attributes
    ----------
    X : ndarray of float64, shape (n, d)
    y : ndarray of int64, shape (n,)
        Class indices into ``classes``.
    classes : int or tuple of str
        What :func:`ghofl.stats.compute_stats` takes: the number of classes when the labels
        are exactly 0..C-1 (or ``classes`` was given), else the label names.
    labels : ndarray, shape (C,) or None
        The sorted distinct labels (``classes_`` of the fitted head); None when predictions
        are the indices 0..C-1 themselves.
    """

    X: NDArray[np.float64]
    y: NDArray[np.int64]
    classes: Any
    labels: NDArray[Any] | None


def check_features(owner: str, X: Any) -> NDArray[np.float64]:
    """``X`` as a finite float64 matrix (n >= 1, d >= 1), or the error scikit-learn gives.

    Raises
    ------
    InputError
        Sparse, complex, non-numeric, not 2-D, empty, NaN or infinite inputs.
    TypeError
        Entries that are not numbers at all (from ``numpy``; e.g. a dict).
    """
    if hasattr(X, "toarray") and hasattr(X, "nnz"):
        raise InputError(
            f"{owner} got a sparse matrix; dense input is required: pass X.toarray() (the "
            "statistics are dense d x d moments anyway)"
        )
    arr = np.asarray(X)
    if arr.dtype.kind == "c":
        raise InputError(f"Complex data not supported: {owner} needs real-valued features; "
                         "pass the real part or the magnitude")
    if arr.dtype.kind not in "fiub":
        try:
            arr = np.asarray(arr, dtype=np.float64)
        except ValueError:
            raise InputError(
                f"{owner} needs numeric features; got dtype {arr.dtype} with entries that "
                "are not numbers; encode them as numbers first"
            ) from None
    if arr.ndim != 2:
        raise InputError(
            f"{owner} needs a 2-D array X of shape (n_samples, n_features); got shape "
            f"{arr.shape}. Reshape your data: X.reshape(-1, 1) for a single feature, "
            "X.reshape(1, -1) for a single sample"
        )
    if arr.shape[0] < 1:
        raise InputError(
            f"Found array with 0 sample(s) (shape={arr.shape}) while a minimum of 1 is "
            f"required by {owner}; give it at least one sample per class"
        )
    if arr.shape[1] < 1:
        raise InputError(
            f"Found array with 0 feature(s) (shape={arr.shape}) while a minimum of 1 is "
            f"required by {owner}; give it at least one feature"
        )
    out = np.asarray(arr, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        raise InputError(
            f"X contains NaN or infinite values ({int(np.count_nonzero(~np.isfinite(out)))} "
            f"of them); {owner} cannot fit on them: drop or impute those entries first"
        )
    return out


def check_training_data(owner: str, X: Any, y: Any, classes: Any = None,
                        min_samples: int = 1) -> TrainingData:
    """Check ``X`` (n, d) and ``y`` (n,) for ``fit(X, y)`` and encode the labels.

    Parameters
    ----------
    owner : str
        The head's class name, for the messages.
    X : array_like, shape (n, d)
    y : array_like, shape (n,)
        Any hashable labels (ints, strings, ...) when ``classes`` is None; otherwise class
        indices 0..C-1.
    classes : int or sequence of str, optional
        Number or names of the classes (then ``y`` holds indices, as in
        :func:`ghofl.stats.compute_stats`).
    min_samples : int, default 1
        Fewest samples the head can be fitted on (covariances need 2).

    Raises
    ------
    InputError
        Invalid ``X`` (:func:`check_features`), ``y`` None, not 1-D, of the wrong length,
        with NaN, or continuous.
    """
    if y is None:
        raise InputError(
            f"{owner} requires y to be passed, but the target y is None; give the class "
            "label of every row of X"
        )
    x = check_features(owner, X)
    yy = np.asarray(y)
    if yy.ndim == 2 and yy.shape[1] == 1:
        category = sklearn_flavoured(ColumnVectorWarning, "sklearn.exceptions",
                                     "DataConversionWarning")
        warnings.warn(
            f"A column-vector y was passed when a 1d array was expected; {owner} read it as "
            "y.ravel(); pass a 1-D array of labels to silence this warning",
            category, stacklevel=3,
        )
        yy = yy.ravel()
    if yy.ndim != 1:
        raise InputError(
            f"{owner} needs y as a 1-D array of shape (n_samples,); got shape {yy.shape}; "
            "use y.ravel() for a column vector (multi-output targets are not supported)"
        )
    if x.shape[0] < min_samples:
        raise InputError(
            f"{owner} got {x.shape[0]} sample(s) (n_samples={x.shape[0]}) but needs at least "
            f"{min_samples} to estimate its covariances; give it more samples"
        )
    if yy.shape[0] != x.shape[0]:
        raise InputError(
            f"X and y have inconsistent numbers of samples: {x.shape[0]} rows vs "
            f"{yy.shape[0]} labels; give one label per row"
        )
    if classes is not None:
        return TrainingData(x, yy, classes, None)
    if yy.dtype.kind == "f" or yy.dtype.kind == "c":
        if not np.all(np.isfinite(yy)):
            raise InputError(f"Input y contains NaN or infinite values; {owner} needs a class "
                             "label for every row: drop the unlabelled rows")
        if not np.all(yy == np.round(yy)):
            raise InputError(
                f"Unknown label type: continuous. {owner} is a classifier and y holds "
                "non-integer numbers; give class labels (use a regressor for continuous "
                "targets)"
            )
    labels, idx = np.unique(yy, return_inverse=True)
    idx = idx.reshape(-1).astype(np.int64)
    if labels.dtype.kind in "iuf" and np.array_equal(labels, np.arange(labels.size)):
        return TrainingData(x, idx, int(labels.size), None)
    return TrainingData(x, idx, tuple(str(v) for v in labels), labels)


__all__ = ["ColumnVectorWarning", "TrainingData", "check_features", "check_training_data",
           "sklearn_flavoured"]
