"""Outside DP anchors for the DP heads: a DP-SGD linear probe and IBM diffprivlib's models.

Each anchor trains centrally on the pooled training features (one trusted curator: the
strongest position a federated method can be compared with) and is scored on the test split.

- :func:`dpsgd_probe`: multinomial logistic regression trained by DP-SGD (Poisson sampling,
  per-sample clipping at ``clip``, Gaussian noise ``sigma * clip`` on the summed gradients:
  the algorithm of Opacus's ``DPOptimizer``), its noise multiplier calibrated by Opacus's RDP
  accountant (:func:`opacus.accountants.utils.get_noise_multiplier`). The per-sample gradients
  of a linear layer have a closed form, so the step is written out in numpy (Opacus's own
  torch loop is too slow for the grid on a CPU; timings in BENCHMARKS.md).
  Hyperparameters are chosen over a small grid on a validation split: each candidate is one
  (ε, δ)-DP run on the training part; the choice is made by the exponential mechanism on the
  validation counts (ε_select-DP on the disjoint validation part). The whole search is
  therefore (max(ε_runs, ε_select), δ_total)-DP, with ε_runs the RDP composition of all the
  candidates' runs (:func:`composed_epsilon`).
- :func:`diffprivlib_nb` and :func:`diffprivlib_lr`: diffprivlib's ``GaussianNB`` (ε-DP,
  Laplace/geometric noise on counts, means and variances within public feature bounds) and
  ``LogisticRegression`` (ε-DP objective perturbation, δ = 0, one-vs-rest with ε/C per class,
  rows clipped to a public ``data_norm``).

``opacus`` and ``diffprivlib`` come with the ``dp-anchors`` extra and are imported lazily;
:func:`require` names the extra when one is missing.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import softmax

from ghofl.errors import ConfigError

__all__ = [
    "EXTRA",
    "SGDConfig",
    "clipped_rows",
    "composed_epsilon",
    "diffprivlib_lr",
    "diffprivlib_nb",
    "dpsgd_probe",
    "exponential_select",
    "require",
    "train_dpsgd",
]

#: The extra that installs the anchors' libraries.
EXTRA = "dp-anchors"

Array = NDArray[np.float64]


def require(module: str) -> ModuleType:
    """Import ``module`` (``"opacus"`` or ``"diffprivlib"``), naming the extra when missing.

    Raises
    ------
    ConfigError
        The package is not installed.
    """
    try:
        if module == "diffprivlib":
            _diffprivlib_compat()
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"the DP anchors need {module!r}, which is not installed ({exc}); install the "
            f"{EXTRA!r} extra: pip install 'ghofl[{EXTRA}]'"
        ) from exc


def _diffprivlib_compat() -> None:
    """Let diffprivlib 0.6.6 import under scikit-learn >= 1.8.

    Its random-forest module (unused here) imports ``DOUBLE`` and ``DTYPE`` from
    ``sklearn.tree._tree``, which scikit-learn dropped; they were ``float64`` and ``float32``.
    """
    try:
        tree = importlib.import_module("sklearn.tree._tree")
    except ImportError:
        return
    for name, dtype in (("DOUBLE", np.float64), ("DTYPE", np.float32)):
        if not hasattr(tree, name):
            setattr(tree, name, dtype)


def clipped_rows(x: NDArray[Any], bound: float) -> Array:
    """Rows of ``x`` (n, d) scaled down to L2 norm at most ``bound`` (float64, (n, d))."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: Array = x * np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    return out


@dataclass(frozen=True)
class SGDConfig:
    """One DP-SGD candidate: gradient clip, step size, epochs and expected batch size."""

    clip: float
    lr: float
    epochs: int
    batch: int


def _noise_multiplier(eps: float, delta: float, rate: float, steps: int) -> float:
    acc = require("opacus.accountants.utils")
    return float(acc.get_noise_multiplier(target_epsilon=eps, target_delta=delta,
                                          sample_rate=rate, steps=steps, accountant="rdp"))


def composed_epsilon(runs: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of DP-SGD runs ``(noise multiplier, sample rate, steps)`` composed.

    Opacus's RDP accountant adds the runs' Rényi curves, then converts to (ε, δ).
    """
    rdp = require("opacus.accountants").RDPAccountant()
    rdp.history = [(float(s), float(q), int(t)) for s, q, t in runs]
    return float(rdp.get_epsilon(delta))


def train_dpsgd(x: Array, y: NDArray[np.int64], num_classes: int, cfg: SGDConfig,
                sigma: float, rng: np.random.Generator) -> Array:
    """DP-SGD on softmax regression; returns the weights ((d + 1), C), bias last.

    Each step draws a Poisson batch (rate ``batch / n``), clips each sample's gradient
    ``(p - onehot) ⊗ [x, 1]`` to L2 norm ``cfg.clip``, adds N(0, (sigma·clip)²) to the sum
    and divides by the expected batch size (Opacus's ``DPOptimizer`` with mean reduction).

    Parameters
    ----------
    x : (n, d) features, y : (n,) labels in [0, num_classes)
    """
    n, d = x.shape
    xb1 = np.hstack([x, np.ones((n, 1))]).astype(np.float32)
    w = np.zeros((d + 1, num_classes), dtype=np.float32)
    rate = min(1.0, cfg.batch / n)
    onehot = np.eye(num_classes)[y]
    for _ in range(cfg.epochs * max(1, round(1 / rate))):
        idx = np.flatnonzero(rng.random(n) < rate)
        xs = xb1[idx]
        err = softmax(xs @ w, axis=1) - onehot[idx]
        norms = np.linalg.norm(err, axis=1) * np.linalg.norm(xs, axis=1)
        scale = np.minimum(1.0, cfg.clip / np.maximum(norms, 1e-12))
        grad = xs.T @ (err * scale[:, None])
        grad += rng.normal(0.0, sigma * cfg.clip, size=grad.shape).astype(np.float32)
        w -= np.float32(cfg.lr / (rate * n)) * grad
    return w.astype(np.float64)


def _accuracy(w: Array, x: Array, y: NDArray[np.int64]) -> float:
    return float(np.mean(np.argmax(x @ w[:-1] + w[-1], axis=1) == y))


def exponential_select(correct: Sequence[int], eps: float, rng: np.random.Generator) -> int:
    """Index chosen by the exponential mechanism on validation counts (ε-DP, sensitivity 1).

    Adding or removing one validation sample changes every count by at most 1, so
    P(i) ∝ exp(ε · correct_i / 2) is ε-DP (Gumbel-max sampling).
    """
    scores = eps * np.asarray(correct, dtype=np.float64) / 2
    return int(np.argmax(scores + rng.gumbel(size=scores.shape)))


def dpsgd_probe(train: tuple[Array, NDArray[np.int64]], test: tuple[Array, NDArray[np.int64]],
                num_classes: int, eps: float, delta: float, grid: Sequence[SGDConfig],
                seed: int, val_fraction: float = 0.1) -> dict[str, Any]:
    """The tuned DP-SGD probe at per-run (eps, delta); its search cost and test accuracy.

    ``train`` rows must already be clipped/scaled by a public rule. The first grid entry is
    the untuned default: its test accuracy is the cost-free anchor at exactly (eps, delta).

    Returns
    -------
    dict
        ``accuracy`` (selected candidate), ``default_accuracy``, ``selected`` (its config),
        ``val_accuracy`` per candidate, ``sigma`` per candidate, ``eps_run``, ``eps_select``,
        ``eps_runs_composed`` and ``eps_search`` (= max of the last two), ``delta``.
    """
    rng = np.random.default_rng(seed)
    x, y = train
    perm = rng.permutation(len(y))
    n_val = max(1, round(val_fraction * len(y)))
    val, part = perm[:n_val], perm[n_val:]
    xt, yt, xv, yv = x[part], y[part], x[val], y[val]
    sigmas, weights, correct = [], [], []
    runs: list[tuple[float, float, int]] = []
    for cfg in grid:
        rate = min(1.0, cfg.batch / len(yt))
        steps = cfg.epochs * max(1, round(1 / rate))
        sigma = _noise_multiplier(eps, delta, rate, steps)
        w = train_dpsgd(xt, yt, num_classes, cfg, sigma, rng)
        sigmas.append(sigma)
        weights.append(w)
        correct.append(round(_accuracy(w, xv, yv) * len(yv)))
        runs.append((sigma, rate, steps))
    composed = composed_epsilon(runs, delta)
    pick = exponential_select(correct, eps, rng)
    return {
        "accuracy": _accuracy(weights[pick], *test),
        "default_accuracy": _accuracy(weights[0], *test),
        "selected": asdict(grid[pick]),
        "val_accuracy": [c / len(yv) for c in correct],
        "sigma": sigmas,
        "eps_run": eps, "eps_select": eps, "eps_runs_composed": composed,
        "eps_search": max(composed, eps), "delta": delta, "n_train_part": len(yt),
    }


def diffprivlib_nb(train: tuple[Array, NDArray[np.int64]], test: tuple[Array, NDArray[np.int64]],
                   eps: float, bounds: tuple[float, float], seed: int) -> float:
    """Test accuracy of diffprivlib's ε-DP ``GaussianNB`` with public per-feature ``bounds``."""
    models = require("diffprivlib").models
    x, y = train
    d = x.shape[1]
    lo, hi = np.full(d, bounds[0]), np.full(d, bounds[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nb = models.GaussianNB(epsilon=eps, bounds=(lo, hi), random_state=seed)
        nb.fit(np.clip(x, lo, hi), y)
        return float(np.mean(nb.predict(test[0]) == test[1]))


def diffprivlib_lr(train: tuple[Array, NDArray[np.int64]], test: tuple[Array, NDArray[np.int64]],
                   eps: float, data_norm: float, seed: int, c: float = 1.0) -> float:
    """Test accuracy of diffprivlib's ε-DP ``LogisticRegression`` (rows clipped to data_norm)."""
    lr_cls = _compat_lr(require("diffprivlib").models.LogisticRegression)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lr = lr_cls(epsilon=eps, data_norm=data_norm, C=c, random_state=seed)
        lr.fit(clipped_rows(train[0], data_norm), train[1])
        return float(np.mean(lr.predict(test[0]) == test[1]))


def _compat_lr(base: type) -> type:
    """The diffprivlib LogisticRegression whose ``__init__`` skips scikit-learn's.

    diffprivlib 0.6.6 passes ``multi_class='ovr'`` to scikit-learn's constructor, which
    scikit-learn >= 1.8 no longer takes; its ``fit`` (the DP part) is unchanged.
    """

    class CompatLogisticRegression(base):  # type: ignore[misc, valid-type]
        def __init__(self, *, epsilon: float = 1.0, data_norm: float | None = None,
                     tol: float = 1e-4, C: float = 1.0, fit_intercept: bool = True,
                     max_iter: int = 100, verbose: int = 0, warm_start: bool = False,
                     n_jobs: int | None = None, random_state: Any = None,
                     accountant: Any = None) -> None:
            self.epsilon, self.data_norm, self.tol, self.C = epsilon, data_norm, tol, C
            self.fit_intercept, self.max_iter, self.verbose = fit_intercept, max_iter, verbose
            self.warm_start, self.n_jobs, self.random_state = warm_start, n_jobs, random_state
            self.penalty, self.dual, self.intercept_scaling = "l2", False, 1.0
            self.class_weight, self.solver, self.l1_ratio = None, "lbfgs", 0.0
            self.classes_ = None
            self.accountant = require("diffprivlib.accountant").BudgetAccountant.load_default(
                accountant)

    return CompatLogisticRegression

