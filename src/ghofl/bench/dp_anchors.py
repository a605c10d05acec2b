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
  candidates' runs (:func:`composed_epsilon`). :func:`per_run_epsilon` lowers the per-run
  ε until that composition spends exactly the row's ε ("tuned with search ε").
- :func:`diffprivlib_nb` and :func:`diffprivlib_lr`: diffprivlib's ``GaussianNB`` (ε-DP,
  Laplace/geometric noise on counts, means and variances within public per-feature bounds,
  :func:`feature_bounds`) and ``LogisticRegression`` (ε-DP objective perturbation, δ = 0,
  one-vs-rest with ε/C per class, rows of L2 norm at most a public ``data_norm``), configured
  as diffprivlib's documentation asks: bounds and norm chosen without the data, from the
  clipping rule the rows obey; :func:`check_rows` refuses rows that do not obey them.

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
    "check_rows",
    "clipped_rows",
    "composed_epsilon",
    "diffprivlib_lr",
    "diffprivlib_nb",
    "dpsgd_probe",
    "exponential_select",
    "feature_bounds",
    "per_run_epsilon",
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


#: Rényi orders of the accountant: Opacus's defaults (up to 63) and larger ones, which the
#: small per-run ε of a composed search needs (at order α the conversion alone costs
#: log(1/δ)/(α − 1), 0.19 at α = 63 and δ = 1e-5).
ALPHAS: tuple[float, ...] = (*(1 + x / 10.0 for x in range(1, 100)), *range(12, 64),
                             *range(64, 256, 8), 256, 384, 512, 1024)


def _noise_multiplier(eps: float, delta: float, rate: float, steps: int) -> float:
    acc = require("opacus.accountants.utils")
    return float(acc.get_noise_multiplier(target_epsilon=eps, target_delta=delta,
                                          sample_rate=rate, steps=steps, accountant="rdp",
                                          epsilon_tolerance=max(1e-4, 1e-3 * eps),
                                          alphas=list(ALPHAS)))


def composed_epsilon(runs: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε at ``delta`` of DP-SGD runs ``(noise multiplier, sample rate, steps)`` composed.

    Opacus's RDP accountant adds the runs' Rényi curves, then converts to (ε, δ).
    """
    rdp = require("opacus.accountants").RDPAccountant()
    rdp.history = [(float(s), float(q), int(t)) for s, q, t in runs]
    return float(rdp.get_epsilon(delta, alphas=list(ALPHAS)))


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


def _schedule(cfg: SGDConfig, n: int) -> tuple[float, int]:
    """(Poisson sample rate, steps) of ``cfg`` on ``n`` training rows."""
    rate = min(1.0, cfg.batch / n)
    return rate, cfg.epochs * max(1, round(1 / rate))


def per_run_epsilon(grid: Sequence[SGDConfig], n: int, eps: float, delta: float,
                    rel_tol: float = 2e-3) -> float:
    """The per-run ε at which the RDP composition of all of ``grid``'s runs spends ``eps``.

    Every candidate runs at the same per-run ε (its own noise multiplier for its sample rate
    and steps on ``n`` rows); Opacus's RDP accountant composes the runs' Rényi curves and
    converts once at ``delta`` (:func:`composed_epsilon`). Bisection returns the largest
    per-run ε found whose composition is at most ``eps`` (and within ``rel_tol`` of it).

    Raises
    ------
    ConfigError
        ``eps`` is not positive or ``grid`` is empty.
    """
    if not eps > 0 or not grid:
        raise ConfigError(f"per_run_epsilon needs eps > 0 and a non-empty grid; got eps={eps} "
                          f"and {len(grid)} candidates")
    sched = [_schedule(cfg, n) for cfg in grid]

    def spent(e_run: float) -> float:
        runs = [(_noise_multiplier(e_run, delta, q, t), q, t) for q, t in sched]
        return composed_epsilon(runs, delta)

    lo, hi = eps / (2 * len(grid)), eps
    while spent(lo) > eps:
        lo /= 2
    if spent(hi) <= eps:
        return hi
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if spent(mid) <= eps else (lo, mid)
    return lo


def dpsgd_probe(train: tuple[Array, NDArray[np.int64]], test: tuple[Array, NDArray[np.int64]],
                num_classes: int, eps: float, delta: float, grid: Sequence[SGDConfig],
                seed: int, val_fraction: float = 0.1,
                eps_run: float | None = None) -> dict[str, Any]:
    """The tuned DP-SGD probe: every candidate at per-run (eps_run, delta); search cost, accuracy.

    ``train`` rows must already be clipped/scaled by a public rule. ``eps_run`` defaults to
    ``eps`` (each run at the row's ε: the search as a whole spends more, stated as
    ``eps_search``); give :func:`per_run_epsilon`'s value so the whole search spends ``eps``.
    The choice among the candidates is an ``eps``-DP exponential mechanism on the disjoint
    validation part. The first grid entry is the untuned default: its test accuracy is the
    cost-free anchor at (eps_run, delta).

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
    run_eps = eps if eps_run is None else eps_run
    sigmas, weights, correct = [], [], []
    runs: list[tuple[float, float, int]] = []
    for cfg in grid:
        rate, steps = _schedule(cfg, len(yt))
        sigma = _noise_multiplier(run_eps, delta, rate, steps)
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
        "eps_run": run_eps, "eps_select": eps, "eps_runs_composed": composed,
        "eps_search": max(composed, eps), "delta": delta, "n_train_part": len(yt),
    }


def feature_bounds(natural: tuple[float, float] | None, clip: float) -> tuple[float, float]:
    """Per-coordinate bounds of rows clipped to L2 norm ``clip`` and then scaled by 1/clip.

    Clipping multiplies a row by s ∈ (0, 1], so a coordinate in the encoder's ``natural``
    range [lo, hi] (public, by construction; ``None``: unknown) stays in [min(lo, 0),
    max(hi, 0)]; a norm of at most ``clip`` bounds every coordinate by ``clip``. After the
    1/clip scaling the bounds are the intersection of both, divided by ``clip``.

    Raises
    ------
    ConfigError
        ``clip`` is not positive or ``natural`` is not an interval.
    """
    if not clip > 0:
        raise ConfigError(f"clip must be a positive L2 bound; got {clip}")
    lo, hi = (-clip, clip) if natural is None else natural
    if lo > hi:
        raise ConfigError(f"natural bounds must be (low, high) with low <= high; got {natural}")
    return max(min(lo, 0.0), -clip) / clip, min(max(hi, 0.0), clip) / clip


def check_rows(x: NDArray[Any], *, data_norm: float | None = None,
               bounds: tuple[Any, Any] | None = None) -> None:
    """Refuse training rows ``x`` (n, d) that break the public bound an anchor is told.

    diffprivlib clips silently to what it is told, so rows that exceed it would be changed
    (a misconfigured anchor); the rows must already be the clipped ones.

    Raises
    ------
    ConfigError
        A row's L2 norm exceeds ``data_norm`` or a coordinate lies outside ``bounds``.
    """
    x = np.asarray(x, dtype=np.float64)
    tol = 1e-9
    if data_norm is not None:
        worst = float(np.linalg.norm(x, axis=1).max(initial=0.0))
        if worst > data_norm * (1 + tol):
            raise ConfigError(
                f"rows have L2 norm up to {worst:.6g} > data_norm {data_norm:g}: pass the rows "
                "clipped by the same rule (clipped_rows) or the data_norm they obey")
    if bounds is not None:
        lo, hi = (np.broadcast_to(np.asarray(b, dtype=np.float64), x.shape[1:]) for b in bounds)
        if np.any(x < lo - tol) or np.any(x > hi + tol):
            raise ConfigError(
                f"rows have coordinates in [{x.min():.6g}, {x.max():.6g}], outside the bounds "
                "given to GaussianNB: pass the clipped rows, or the bounds feature_bounds "
                "derives from the clipping bound")


def diffprivlib_nb(train: tuple[Array, NDArray[np.int64]], test: tuple[Array, NDArray[np.int64]],
                   eps: float, bounds: tuple[Any, Any], seed: int) -> float:
    """Test accuracy of diffprivlib's ε-DP ``GaussianNB`` with public per-feature ``bounds``.

    ``bounds`` is (low, high), scalars or (d,) arrays; the training rows must lie within
    them (:func:`check_rows`). diffprivlib spends ε/3 on the class counts and ε/(3d) on each
    feature's mean and on each feature's variance.
    """
    models = require("diffprivlib").models
    x, y = train
    d = x.shape[1]
    lo, hi = (np.broadcast_to(np.asarray(b, dtype=np.float64), (d,)).copy() for b in bounds)
    check_rows(x, bounds=(lo, hi))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nb = models.GaussianNB(epsilon=eps, bounds=(lo, hi), random_state=seed)
        nb.fit(x, y)
        return float(np.mean(nb.predict(test[0]) == test[1]))


def diffprivlib_lr(train: tuple[Array, NDArray[np.int64]], test: tuple[Array, NDArray[np.int64]],
                   eps: float, data_norm: float, seed: int, c: float = 1.0) -> float:
    """Test accuracy of diffprivlib's ε-DP ``LogisticRegression``.

    The training rows must have L2 norm at most ``data_norm`` (:func:`check_rows`): the
    bound the objective perturbation is calibrated to (ε/C per one-vs-rest class).
    """
    lr_cls = _compat_lr(require("diffprivlib").models.LogisticRegression)
    check_rows(train[0], data_norm=data_norm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lr = lr_cls(epsilon=eps, data_norm=data_norm, C=c, random_state=seed)
        lr.fit(np.asarray(train[0], dtype=np.float64), train[1])
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

