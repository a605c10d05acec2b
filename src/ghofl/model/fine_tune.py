"""A client's own linear head: the global one fine-tuned on the client's own embeddings.

Personalisation with no extra communication (:mod:`ghofl.model.personalize`) changes the
priors and the class Gaussians from the client's statistics. A client also holds its raw
embeddings; with them it can move a linear head's decision boundaries between the classes it
actually sees. Nothing is sent or received: the global model and the client's own rows are all
it reads.

Heads: those that score by one affine map of their inputs, s(z) = W z + b (:data:`LINEAR_HEADS`:
``lda``, ``fedcgs``). The start is the global head with the client's priors and no
pseudo-count: over the classes the client holds (n_c > 0), the rows W_c and b_c + log(n_c / n)
− log π_c of the global head (π the global priors). Then the penalised multinomial logistic
regression over those classes,

    minimise  Σ_i −log softmax(W z_i + b)_{y_i} + (τ / 2)(‖W − W₀‖² + ‖b − b₀‖²),

from (W₀, b₀), the start (L-BFGS, at most :data:`MAX_ITER` iterations). τ is a prior strength
in samples (:data:`DEFAULT_TAU`): a client with few rows stays near the global head, one with
many rows moves further, and the rule uses only the client's training rows, never its test
data. The classes the client never held get intercept −∞: they are never predicted (as with
``--prior local --prior-pseudocount 0``); a client holding one class predicts it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import logsumexp

from ghofl.errors import ConfigError, InputError
from ghofl.heads.base import Head

__all__ = ["DEFAULT_TAU", "LINEAR_HEADS", "MAX_ITER", "FineTune", "fine_tune_heads",
           "fine_tune_linear"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: τ of the penalty (τ/2)‖θ − θ₀‖²: the global head counts as about τ of the client's rows.
DEFAULT_TAU = 100.0
#: Most L-BFGS iterations of one fine-tuning.
MAX_ITER = 200
#: Heads whose scores are one affine map W z + b of their (projected) inputs.
LINEAR_HEADS = frozenset({"lda", "fedcgs"})


@dataclass(frozen=True)
class FineTune:
    """What :func:`fine_tune_heads` did (recorded in the personalised model's manifest).

    Attributes
    ----------
    tau : float
        τ of the penalty.
    rows : int
        The client's rows it was fitted on.
    classes_held : int
        The classes among them (the only ones the tuned heads predict).
    heads : dict of str to dict
        Per tuned head: ``iterations`` and ``converged`` of L-BFGS, and the training accuracy
        on the client's rows before and after.
    """

    tau: float
    rows: int
    classes_held: int
    heads: dict[str, dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"tau": self.tau, "tau_rule": "(tau/2)(|W - W0|^2 + |b - b0|^2), summed loss",
                "rows": self.rows, "classes_held": self.classes_held, "heads": self.heads}


def _objective(theta: F64, z: F64, y: I64, start: F64, tau: float) -> tuple[float, F64]:
    """Summed softmax cross-entropy plus (τ/2)‖θ − θ₀‖², and its gradient; θ = [W | b] rows."""
    k, d1 = start.shape
    w = theta.reshape(k, d1)
    s = z @ w[:, :-1].T + w[:, -1]
    lse = logsumexp(s, axis=1)
    rows = np.arange(y.size)
    loss = float(np.sum(lse - s[rows, y]))
    p = np.exp(s - lse[:, None])
    p[rows, y] -= 1.0
    diff = w - start
    grad = np.empty_like(w)
    grad[:, :-1] = p.T @ z
    grad[:, -1] = p.sum(axis=0)
    grad += tau * diff
    return loss + 0.5 * tau * float(np.sum(diff * diff)), grad.ravel()


def fine_tune_linear(coef: F64, intercept: F64, z: NDArray[Any], y: NDArray[Any],
                     tau: float = DEFAULT_TAU, max_iter: int = MAX_ITER
                     ) -> tuple[F64, F64, dict[str, Any]]:
    """The penalised logistic regression of the module docstring, from (coef, intercept).

    Parameters
    ----------
    coef : ndarray, shape (k, d)
        W₀ over the k classes to tune (the start and the centre of the penalty).
    intercept : ndarray, shape (k,)
        b₀, finite.
    z : array_like, shape (n, d)
        The client's rows in the head's input space.
    y : array_like of int, shape (n,)
        Their classes, indices in 0..k-1.
    tau : float, default :data:`DEFAULT_TAU`
        > 0.
    max_iter : int, default :data:`MAX_ITER`

    Returns
    -------
    coef : ndarray, shape (k, d)
    intercept : ndarray, shape (k,)
    info : dict
        ``iterations``, ``converged``.

    Raises
    ------
    ConfigError
        τ is not a finite number > 0.
    InputError
        Shapes disagree, a label is out of range, or a value is not finite.
    """
    if not (math.isfinite(tau) and tau > 0):
        raise ConfigError(f"the fine-tuning strength tau must be a finite number > 0; got "
                          f"{tau!r}")
    w0 = np.asarray(coef, dtype=np.float64)
    b0 = np.asarray(intercept, dtype=np.float64)
    x = np.asarray(z, dtype=np.float64)
    labels = np.asarray(y, dtype=np.int64)
    k = w0.shape[0]
    if (w0.ndim != 2 or b0.shape != (k,) or x.ndim != 2 or x.shape[1] != w0.shape[1]
            or labels.shape != (x.shape[0],)):
        raise InputError(f"fine-tuning needs coef (k, d), intercept (k,), rows (n, d) and "
                         f"labels (n,); got {w0.shape}, {b0.shape}, {x.shape}, {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise InputError(f"fine-tuning labels must be class indices in 0..{k - 1}")
    if not (np.all(np.isfinite(w0)) and np.all(np.isfinite(b0)) and np.all(np.isfinite(x))):
        raise InputError("fine-tuning needs finite coefficients and rows; the head or the "
                         "client's embeddings hold NaN or infinite values")
    start = np.column_stack([w0, b0])
    res = minimize(_objective, start.ravel(), args=(x, labels, start, float(tau)), jac=True,
                   method="L-BFGS-B", options={"maxiter": int(max_iter)})
    theta = np.asarray(res.x, dtype=np.float64).reshape(start.shape)
    info = {"iterations": int(res.nit), "converged": bool(res.success)}
    return np.ascontiguousarray(theta[:, :-1]), np.ascontiguousarray(theta[:, -1]), info


def _held_start(head: Head, counts: F64, global_counts: F64) -> tuple[I64, F64, F64]:
    """The held classes and the start (W₀, b₀) over them: the head with the client's priors."""
    arrays, _ = head.get_state()
    coef = np.asarray(arrays["coef_"], dtype=np.float64)
    intercept = np.asarray(arrays["intercept_"], dtype=np.float64)
    held = np.flatnonzero((counts > 0) & np.isfinite(intercept)).astype(np.int64)
    b = (intercept[held] + np.log(counts[held] / counts[held].sum())
         - np.log(global_counts[held] / global_counts.sum()))
    return held, coef[held], b


def fine_tune_heads(heads: Mapping[str, Head], global_counts: NDArray[Any], z: NDArray[Any],
                    y: NDArray[Any], tau: float = DEFAULT_TAU, max_iter: int = MAX_ITER
                    ) -> tuple[dict[str, Head], FineTune]:
    """Copies of the linear global ``heads`` fine-tuned on the client's rows (module docstring).

    Parameters
    ----------
    heads : mapping of str to Head
        Fitted global heads, left unchanged; each must be one of :data:`LINEAR_HEADS`.
    global_counts : array_like of int, shape (C,)
        N_c of the statistics the heads were fitted from.
    z : array_like, shape (n, d)
        The client's rows in the heads' input space (after the model's feature transform,
        before any projection the heads apply themselves).
    y : array_like of int, shape (n,)
        Their classes, indices into the heads' classes.
    tau : float, default :data:`DEFAULT_TAU`
    max_iter : int, default :data:`MAX_ITER`

    Returns
    -------
    heads : dict of str to Head
        Same kind of head, coefficients tuned over the held classes, intercept −∞ elsewhere.
    record : FineTune

    Raises
    ------
    ConfigError
        A head is not linear, or τ is out of range.
    InputError
        No rows, labels out of range, or a class the global model never saw.
    """
    bad = sorted(n for n, h in heads.items() if h.name not in LINEAR_HEADS)
    if bad or not heads:
        raise ConfigError(f"fine-tuning needs linear heads ({', '.join(sorted(LINEAR_HEADS))}); "
                          f"got {', '.join(bad) or 'none'}: fit one with --heads lda")
    first = next(iter(heads.values()))
    c = first.meta_.num_classes
    labels = np.asarray(y, dtype=np.int64)
    if labels.ndim != 1 or labels.size == 0:
        raise InputError("fine-tuning needs the client's labelled rows; got none")
    if labels.min() < 0 or labels.max() >= c:
        raise InputError(f"the client's labels must be class indices in 0..{c - 1}")
    g = np.asarray(global_counts, dtype=np.float64)
    counts = np.bincount(labels, minlength=c).astype(np.float64)
    if np.any((counts > 0) & (g <= 0)):
        raise InputError("the client holds rows of a class the global model never saw; "
                         "drop them or fit the global model with that class")
    x = np.asarray(z, dtype=np.float64)
    out: dict[str, Head] = {}
    info: dict[str, dict[str, Any]] = {}
    for name, head in heads.items():
        zp = x if head.meta_.projection is None else head.meta_.projection.apply(x)
        held, w0, b0 = _held_start(head, counts, g)
        index = np.full(c, -1, dtype=np.int64)
        index[held] = np.arange(held.size)
        local = index[labels]
        if np.any(local < 0):
            raise InputError(f"head {name!r} cannot predict some of the client's classes "
                             "(intercept -inf); personalise the global model, not a "
                             "personalised one")
        before = float(np.mean(held[np.argmax(zp @ w0.T + b0, axis=1)] == labels))
        w, b, fit = fine_tune_linear(w0, b0, zp, local, tau, max_iter)
        arrays, scalars = head.get_state()
        new = {k: np.array(v) for k, v in arrays.items()}
        new["coef_"][held] = w
        intercept = np.full(c, -np.inf)
        intercept[held] = b
        new["intercept_"] = intercept
        after = float(np.mean(held[np.argmax(zp @ w.T + b, axis=1)] == labels))
        info[name] = {**fit, "train_accuracy_before": before, "train_accuracy_after": after}
        out[name] = copy.deepcopy(head).set_state(head.meta_, new, scalars)
    held_n = int(np.count_nonzero(counts))
    return out, FineTune(float(tau), int(labels.size), held_n, info)
