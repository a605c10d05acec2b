"""Multinomial logistic regression for the centralised probe, fast at many classes.

The model and objective are scikit-learn's ``LogisticRegression(C=C)`` with the ``lbfgs``
solver (multinomial, intercept fitted and not penalised)::

    min_{W, b}  (1/n) Σ_i [logsumexp_c(x_i W_cᵀ + b_c) − (x_i W_{y_i}ᵀ + b_{y_i})]
                + ‖W‖²_F / (2 C n)

solved with the same optimiser (SciPy's L-BFGS-B, 10 stored pairs, stopping when the largest
absolute gradient entry is at most ``tol``, at most ``max_iter`` iterations). What differs is
the cost of one evaluation: the two products with the data matrix, X Wᵀ (n, C) and
(P − Y)ᵀ X (C, d), which are the whole cost at C = 200, d = 1280, run in float32 by default
(``matmul_dtype``; the logits, softmax, loss and gradient sums stay float64), faster than
float64 on a CPU; and :func:`fit_path` solves a grid of C in increasing order, each
solution starting from the previous one (a warm-started regularisation path), which cuts the
iterations of the cross-validated choice of C. The minimiser is unique (the objective is
strictly convex in W and the softmax is invariant to a shift of b), so both solvers approach
the same model; ``tests/unit/test_logreg_probe.py`` checks it against scikit-learn.

Needs scikit-learn (the ``bench`` extra): :class:`LogisticProbe` is a scikit-learn estimator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, ClassifierMixin

from ghofl.errors import ConfigError, InputError

F64 = NDArray[np.float64]
MatmulDtype = Literal["float32", "float64"]


def multinomial_loss_grad(w: F64, X: NDArray[Any], y: NDArray[np.intp], l2: float,
                          num_classes: int) -> tuple[float, F64]:
    """Objective and gradient of the L2-penalised multinomial logistic loss.

    Parameters
    ----------
    w : ndarray, shape (C·(d + 1),)
        Flattened ``[W | b]`` of shape (C, d + 1): coefficients then the intercept column.
    X : ndarray, shape (n, d)
        Features, float32 or float64 (the dtype of the two matrix products).
    y : ndarray of int, shape (n,)
        Class indices in [0, C).
    l2 : float
        Penalty strength λ = 1 / (C_reg · n) of λ/2 ‖W‖².
    num_classes : int

    Returns
    -------
    f : float
        Mean loss plus penalty.
    grad : ndarray, shape (C·(d + 1),)
    """
    n, d = X.shape
    wb = w.reshape(num_classes, d + 1)
    coef, intercept = wb[:, :d], wb[:, d]
    z = (X @ coef.T.astype(X.dtype, copy=False)).astype(np.float64, copy=False)
    z += intercept
    lse = logsumexp(z, axis=1)
    rows = np.arange(n)
    f = float(np.mean(lse - z[rows, y])) + 0.5 * l2 * float(np.sum(coef * coef))
    z -= lse[:, None]
    np.exp(z, out=z)  # z now holds the probabilities P
    z[rows, y] -= 1.0
    z /= n
    grad = np.empty_like(wb)
    grad[:, :d] = (z.T.astype(X.dtype, copy=False) @ X).astype(np.float64, copy=False)
    grad[:, :d] += l2 * coef
    grad[:, d] = z.sum(axis=0)
    return f, grad.reshape(-1)


class LogisticProbe(ClassifierMixin, BaseEstimator):  # type: ignore[misc]
    """Multinomial logistic regression with scikit-learn's ``LogisticRegression`` objective.

    A scikit-learn classifier (``get_params``, ``score``, usable in a ``Pipeline``); this
    module needs the ``bench`` extra (scikit-learn).

    Parameters
    ----------
    C : float > 0, default 1.0
        Inverse regularisation strength (scikit-learn's ``C``).
    tol : float > 0, default 1e-4
        Stop when the largest absolute gradient entry is at most ``tol`` (L-BFGS-B ``gtol``,
        as scikit-learn).
    max_iter : int >= 1, default 500
    matmul_dtype : {"float32", "float64"}, default "float32"
        Precision of the two products with the data matrix; the rest is float64.
    warm_start : bool, default False
        Start from the current ``coef_``/``intercept_`` (when their shapes fit) instead of 0.

    Fitted attributes
    -----------------
    classes_ : (C,); coef_ : (C, d); intercept_ : (C,); n_iter_ : int (L-BFGS iterations);
    converged_ : bool.
    """

    def __init__(self, C: float = 1.0, tol: float = 1e-4, max_iter: int = 500,
                 matmul_dtype: MatmulDtype = "float32", warm_start: bool = False) -> None:
        self.C = C
        self.tol = tol
        self.max_iter = max_iter
        self.matmul_dtype = matmul_dtype
        self.warm_start = warm_start

    def _check(self) -> None:
        if not (isinstance(self.C, (int, float)) and np.isfinite(self.C) and self.C > 0):
            raise ConfigError(f"LogisticProbe: C must be a finite number > 0, got {self.C!r}; "
                              "pass e.g. C=0.01")
        if not (isinstance(self.tol, (int, float)) and self.tol > 0):
            raise ConfigError(f"LogisticProbe: tol must be > 0, got {self.tol!r}; pass e.g. "
                              "tol=1e-4")
        if isinstance(self.max_iter, bool) or not isinstance(self.max_iter, int) \
                or self.max_iter < 1:
            raise ConfigError(f"LogisticProbe: max_iter must be an integer >= 1, got "
                              f"{self.max_iter!r}")
        if self.matmul_dtype not in ("float32", "float64"):
            raise ConfigError(f"LogisticProbe: matmul_dtype must be 'float32' or 'float64', "
                              f"got {self.matmul_dtype!r}")

    def fit(self, X: NDArray[Any], y: NDArray[Any]) -> LogisticProbe:
        """Fit on features ``X`` (n, d) and labels ``y`` (n,) (any sortable labels, ≥ 2 classes)."""
        self._check()
        Xc, y_idx, classes = _prepare(X, y, self.matmul_dtype)
        k, d = classes.size, Xc.shape[1]
        w0 = np.zeros((k, d + 1))
        coef0: F64 | None = getattr(self, "coef_", None)
        if self.warm_start and coef0 is not None and coef0.shape == (k, d):
            w0[:, :d], w0[:, d] = coef0, getattr(self, "intercept_", 0.0)
        res = minimize(
            multinomial_loss_grad, w0.reshape(-1), args=(Xc, y_idx, 1.0 / (self.C * y_idx.size),
                                                         k),
            method="L-BFGS-B", jac=True,
            options={"maxiter": int(self.max_iter), "maxls": 50, "gtol": float(self.tol),
                     "ftol": 64 * np.finfo(float).eps},
        )
        wb = np.asarray(res.x, dtype=np.float64).reshape(k, d + 1)
        self.classes_ = classes
        self.coef_ = np.ascontiguousarray(wb[:, :d])
        self.intercept_ = wb[:, d].copy()
        self.n_iter_ = int(res.nit)
        self.converged_ = bool(res.success)
        return self

    def decision_function(self, X: NDArray[Any]) -> F64:
        """Logits (n, C) = X coef_ᵀ + intercept_, in float64."""
        self._fitted()
        out: F64 = np.asarray(X, dtype=np.float64) @ self.coef_.T + self.intercept_
        return out

    def predict_proba(self, X: NDArray[Any]) -> F64:
        """Class probabilities (n, C) (softmax of :meth:`decision_function`)."""
        z = self.decision_function(X)
        out: F64 = np.exp(z - logsumexp(z, axis=1, keepdims=True))
        return out

    def predict(self, X: NDArray[Any]) -> NDArray[Any]:
        """Labels (n,) of the largest logit."""
        self._fitted()
        out: NDArray[Any] = self.classes_[np.argmax(self.decision_function(X), axis=1)]
        return out

    def _fitted(self) -> None:
        if getattr(self, "coef_", None) is None:
            raise InputError("LogisticProbe is not fitted; call fit(X, y) first")


def fit_path(X: NDArray[Any], y: NDArray[Any], cs: Sequence[float], tol: float = 1e-4,
             max_iter: int = 500, matmul_dtype: MatmulDtype = "float32"
             ) -> dict[float, LogisticProbe]:
    """One :class:`LogisticProbe` per C in ``cs``, fitted in increasing C.

    Each is warm-started from the solution of the previous (smaller, more regularised) C.

    Returns ``{C: fitted probe}``. Every probe solves its own objective to ``tol``: the warm
    start changes the iterations, not the minimiser.
    """
    out: dict[float, LogisticProbe] = {}
    prev: LogisticProbe | None = None
    for c in sorted(float(v) for v in cs):
        probe = LogisticProbe(C=c, tol=tol, max_iter=max_iter, matmul_dtype=matmul_dtype,
                              warm_start=True)
        if prev is not None:
            probe.coef_, probe.intercept_ = prev.coef_, prev.intercept_
        out[c] = prev = probe.fit(X, y)
    return out


def _prepare(X: NDArray[Any], y: NDArray[Any], dtype: MatmulDtype
             ) -> tuple[NDArray[Any], NDArray[np.intp], NDArray[Any]]:
    """Features as a C-contiguous ``dtype`` array, labels as indices into the sorted classes."""
    Xc = np.ascontiguousarray(X, dtype=np.dtype(dtype))
    y_arr = np.asarray(y)
    if Xc.ndim != 2 or y_arr.shape != (Xc.shape[0],):
        raise InputError(f"LogisticProbe: X must be (n, d) and y (n,); got X {Xc.shape} and y "
                         f"{y_arr.shape}. Pass one label per row")
    if not np.all(np.isfinite(Xc)):
        raise InputError("LogisticProbe: X holds NaN or infinite values; clean or impute the "
                         "features first")
    classes, y_idx = np.unique(y_arr, return_inverse=True)
    if classes.size < 2:
        raise InputError(f"LogisticProbe: y holds {classes.size} class(es); a classifier needs "
                         "at least 2")
    return Xc, y_idx.astype(np.intp), classes


__all__ = ["LogisticProbe", "fit_path", "multinomial_loss_grad"]
