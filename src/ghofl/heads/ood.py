"""Out-of-distribution score from the fitted statistics: Mahalanobis distance to the nearest class.

Score
-----
For an input z in the statistics space (after the model's projection, if any), with class means
μ_c and the pooled within-class covariance Σ̂ = W/(N − C) of the aggregate (its diagonal in
``diag`` mode), shrunk toward a scaled identity, Σ = (1 − a)Σ̂ + a·tr(Σ̂)/k·I (a: the
Rao–Blackwellised Ledoit–Wolf coefficient, :func:`~ghofl.moments.shrinkage.rblw_shrinkage`, so
that Σ is invertible when k is large against N)::

    ood_score(z) = min_c (z − μ_c)ᵀ Σ⁻¹ (z − μ_c)          (squared Mahalanobis distance)

Threshold: only from data
-------------------------
A model fitted from statistics alone has no threshold (``threshold_`` is ``None``, calibration
``"none"``): ``ood_score`` is computed and reported everywhere, the flag ``ood`` is absent until
the threshold is calibrated on in-distribution rows (:data:`CALIBRATE_HINT`). The threshold is
never set from an assumption on the distribution of the embeddings.

Gaussian reference value (``gaussian_threshold_``, never the flag). Under the Gaussian model the
heads assume (class c: N(μ_c, Σ̂)), the distance of an in-distribution sample to its own class
mean is a quadratic form whose mean is tr(M) and variance 2·tr(M²), with M = Σ⁻¹Σ̂. It is
matched by a scaled chi-square g·χ²_h (Satterthwaite): g = tr(M²)/tr(M), h = tr(M)²/tr(M²);
``gaussian_threshold_`` is its ``quantile`` (default 0.99), exactly the chi-square quantile with
k degrees of freedom when M = I. Real embeddings are not Gaussian, and on heavy-tailed
embeddings most in-distribution inputs lie above this value, so it is kept as a reference only.

Calibrated on rows (:meth:`MahalanobisOOD.calibrate`, ``ghofl evaluate --calibrate-ood``).
From n held-out in-distribution rows with scores s_(1) ≤ … ≤ s_(n) and a target false-positive
rate α (default 0.05), the threshold is the order statistic s_(r) with r = ⌈(n + 1)(1 − α)⌉
(split-conformal rule). For a new row exchangeable with the calibration rows, P(score > s_(r))
≤ 1 − r/(n + 1) ≤ α, whatever the distribution of the embeddings; the rule needs r ≤ n, i.e.
n ≥ (1 − α)/α rows (19 at α = 0.05). It is recorded as calibration ``"conformal"`` with α and n.
The guarantee holds for data distributed like the calibration rows: calibrate on held-out data
from the deployment's distribution, not on the rows the rate is then measured on.

Calibrated from the clients' held-out rows, without rows leaving them
(:meth:`MahalanobisOOD.calibrate_from_histogram`, federated evaluation). Every client counts the
scores of its held-out rows in public bins (:func:`score_bin_edges`, :func:`score_histogram`);
the counts add over clients. The edges are k·2^e·(1 + j/32) for the octaves e from
:data:`HIST_OCTAVES` and j = 0..31 (k the statistics dimension: in-distribution scores are of
the order of k): 32 bins per octave, each at most 1/32 of its lower edge wide, exact in binary
floating point so that every client and the server compute the same edges bit for bit. Bin 0
holds the scores below the first edge, bin i the scores in [edge_{i−1}, edge_i), the last bin
the scores at or above the last edge. The threshold is the upper edge of the bin that holds the
conformal order statistic s_(r) (the smallest bin i whose cumulative count reaches r). It is
at least s_(r), so the conformal guarantee above holds unchanged, and it exceeds s_(r) by less
than one bin (a factor below 1 + 1/32); the calibration rows above it all lie in higher bins, at
most n − r ≤ α·n of them, so the empirical false-positive rate on the calibration rows is at
most α too. It is recorded as calibration ``"federated"`` with α and n.

Why not from the clients' holdout statistics. The holdout section of an upload carries per
class the count, the sum and the second-moment sums of the held-out rows. They give the mean of
the own-class distance of a held-out row, E[(x − μ_c)ᵀΣ⁻¹(x − μ_c)] = (tr(Σ⁻¹S_c) −
2μ_cᵀΣ⁻¹s_c + n_cμ_cᵀΣ⁻¹μ_c)/n_c, but neither its variance (a fourth moment of x) nor the
distribution of the nearest-class minimum, so no quantile follows from them. The threshold is
therefore calibrated from rows (held-out embeddings, or the clients' histograms of their scores),
not from the holdout statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Self

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import solve_triangular

from ghofl.errors import ConfigError, InputError, NotFittedError, StatsValidationError
from ghofl.moments.core import Moments, compute_moments
from ghofl.moments.shrinkage import rblw_shrinkage, shrink
from ghofl.stats.client_stats import ClientStats

__all__ = [
    "CALIBRATE_HINT",
    "DEFAULT_FPR",
    "HIST_BINS",
    "MahalanobisOOD",
    "conformal_rank",
    "nearest_mahalanobis",
    "ood_or_none",
    "pooled_covariance_of",
    "scaled_chi2_threshold",
    "score_bin_edges",
    "score_histogram",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: Name of the score, recorded in the model manifest.
OOD_SCORE = "squared Mahalanobis distance to the nearest class mean (shrunk pooled covariance)"
#: How to give a model its threshold, in one line (manifest, card, ``ghofl predict``).
CALIBRATE_HINT = ("calibrate it on held-out in-distribution rows: `ghofl evaluate MODEL "
                  "--embeddings HELD_OUT.npz --calibrate-ood`, or from the clients' federated "
                  "evaluation: `ghofl evaluate --report TOTAL.ghe --update-card MODEL`")
#: The rule of a model without threshold (calibration ``"none"``), recorded in the manifest.
OOD_RULE = ("none: no threshold, so no ood flag (the Gaussian quantile, gaussian_threshold, is "
            "a reference value only: real embeddings are not Gaussian); " + CALIBRATE_HINT)
#: Default false-positive rate of :meth:`MahalanobisOOD.calibrate`.
DEFAULT_FPR = 0.05
_CALIBRATIONS = ("none", "conformal", "federated")
#: Octaves 2^e, e in [HIST_OCTAVES[0], HIST_OCTAVES[1]), of score/k that the histogram edges span.
HIST_OCTAVES = (-12, 13)
_PER_OCTAVE = 32
#: Number of bins of :func:`score_histogram` (the edges plus one).
HIST_BINS = (HIST_OCTAVES[1] - HIST_OCTAVES[0]) * _PER_OCTAVE + 2


def score_bin_edges(dim: int) -> F64:
    """Public edges of the score histogram of a k-dimensional model (module docstring).

    Parameters
    ----------
    dim : int
        k, the statistics dimension (the OOD score's input dimension).

    Returns
    -------
    ndarray, shape (HIST_BINS - 1,)
        k·2^e·(1 + j/32), increasing, identical bit for bit on every machine.
    """
    e0, e1 = HIST_OCTAVES
    mant = 1.0 + np.arange(_PER_OCTAVE, dtype=np.float64) / _PER_OCTAVE
    rel = np.concatenate([np.ldexp(mant, e) for e in range(e0, e1)] + [np.ldexp([1.0], e1)])
    out: F64 = float(dim) * rel
    return out


def score_histogram(scores: NDArray[Any], edges: F64) -> I64:
    """Counts of ``scores`` (n,) in the bins of ``edges`` (B − 1,): shape (B,), int64.

    Bin 0: scores below ``edges[0]``; bin i: [edges[i−1], edges[i]); bin B − 1: at or above
    ``edges[-1]``.
    """
    which = np.searchsorted(edges, np.asarray(scores, dtype=np.float64), side="right")
    out: I64 = np.bincount(which, minlength=edges.size + 1).astype(np.int64)
    return out


def conformal_rank(n: int, fpr: float) -> int:
    """Rank r = ⌈(n + 1)(1 − fpr)⌉ of the order statistic of n scores bounding the FPR by fpr.

    Raises
    ------
    ConfigError
        ``fpr`` outside (0, 1).
    InputError
        r > n: fewer than (1 − fpr)/fpr rows.
    """
    if isinstance(fpr, bool) or not isinstance(fpr, int | float) or not 0.0 < float(fpr) < 1.0:
        raise ConfigError(f"the OOD false-positive rate must lie in (0, 1), e.g. 0.05; got "
                          f"{fpr!r}")
    # the small tolerance keeps (n + 1)(1 − fpr) from rounding up past an exact integer
    rank = math.ceil((n + 1) * (1.0 - float(fpr)) - 1e-9)
    if rank > n:
        need = math.ceil((1.0 - float(fpr)) / float(fpr) - 1e-9)
        raise InputError(
            f"calibrating the OOD threshold at false-positive rate {fpr} needs at least {need} "
            f"in-distribution rows; got {n}; give more held-out rows or a larger rate "
            "(--ood-fpr)"
        )
    return max(rank, 1)


def pooled_covariance_of(moments: Moments) -> F64:
    """Σ̂ = W/(N − C), shape (k, k); its diagonal Σ_c N_c v_c/(N − C) in ``diag`` mode.

    Raises
    ------
    StatsValidationError
        N ≤ C (no within-class degrees of freedom).
    """
    n, c = moments.n_samples, moments.num_classes
    if n <= c:
        raise StatsValidationError(
            f"the out-of-distribution score needs more samples than classes; got N={n}, C={c}"
        )
    if moments.within_scatter is not None:
        return moments.pooled_covariance("n-c")
    scatter = (moments.counts[:, None] * moments.class_vars).sum(axis=0)
    out: F64 = np.diag(scatter / (n - c))
    return out


def _cholesky(cov: F64) -> F64:
    """Lower Cholesky factor of ``cov``, adding the smallest jitter ε·tr/k·I that makes it work."""
    k = cov.shape[0]
    tau = max(float(np.trace(cov)) / k, np.finfo(np.float64).tiny)
    for eps in (0.0, *(10.0 ** p for p in range(-12, 0))):
        try:
            out: F64 = np.linalg.cholesky(cov + eps * tau * np.eye(k))
            return out
        except np.linalg.LinAlgError:
            continue
    raise StatsValidationError(
        "the pooled covariance is not positive definite even after regularisation; the "
        "statistics are degenerate (constant features?)"
    )


def nearest_mahalanobis(Z: F64, means: F64, chol: F64) -> tuple[F64, NDArray[np.int64]]:
    """Squared Mahalanobis distance of every row of ``Z`` to its nearest mean.

    Parameters
    ----------
    Z : ndarray, shape (n, k)
    means : ndarray, shape (C, k)
    chol : ndarray, shape (k, k)
        Lower Cholesky factor L of the covariance Σ = L Lᵀ.

    Returns
    -------
    score : ndarray, shape (n,)
        min_c (z − μ_c)ᵀ Σ⁻¹ (z − μ_c), ≥ 0.
    nearest : ndarray of int64, shape (n,)
        The minimising class c.
    """
    u = solve_triangular(chol, np.asarray(Z, dtype=np.float64).T, lower=True).T  # (n, k)
    m = solve_triangular(chol, np.asarray(means, dtype=np.float64).T, lower=True).T  # (C, k)
    d2 = (u * u).sum(axis=1)[:, None] - 2.0 * (u @ m.T) + (m * m).sum(axis=1)[None, :]
    nearest = np.argmin(d2, axis=1).astype(np.int64)
    score: F64 = np.maximum(d2[np.arange(d2.shape[0]), nearest], 0.0)
    return score, nearest


def scaled_chi2_threshold(chol: F64, cov: F64, quantile: float) -> tuple[float, float, float]:
    """The ``quantile`` of g·χ²_h matching (z − μ)ᵀΣ⁻¹(z − μ) for z ~ N(μ, ``cov``).

    Parameters
    ----------
    chol : ndarray, shape (k, k)
        Lower Cholesky factor of the scoring covariance Σ.
    cov : ndarray, shape (k, k)
        The covariance of the data, Σ̂.
    quantile : float in (0, 1)

    Returns
    -------
    threshold, scale g, degrees of freedom h : float
        With G = L⁻¹Σ̂L⁻ᵀ: g = ‖G‖²_F / tr G, h = (tr G)² / ‖G‖²_F.
    """
    half = solve_triangular(chol, cov, lower=True)
    g_mat = solve_triangular(chol, half.T, lower=True)
    t1 = float(np.trace(g_mat))
    t2 = float(np.sum(g_mat * g_mat))
    scale, dof = t2 / t1, t1 * t1 / t2
    from scipy.stats import chi2  # a heavy import: only when fitting, not to predict

    return float(scale * chi2.ppf(quantile, dof)), scale, dof


class MahalanobisOOD:
    """Out-of-distribution detector held by a model directory (see the module docstring).

    Parameters
    ----------
    quantile : float in (0, 1), default 0.99
        Quantile of the Gaussian score model that sets the reference ``gaussian_threshold_``.

    Attributes
    ----------
    means_ : ndarray, shape (C, k)
    chol_ : ndarray, shape (k, k)
        Lower Cholesky factor of the shrunk pooled covariance.
    threshold_ : float or None
        ``ood`` = ``ood_score > threshold_``; ``None`` until calibrated on data.
    gaussian_threshold_ : float or None
        The ``quantile`` of the Gaussian score model: a reference value, never the flag
        (``None`` when read from a manifest that did not record it).
    shrinkage_, scale_, dof_ : float
    calibration_ : {"none", "conformal", "federated"}
        How ``threshold_`` was set (module docstring).
    fpr_ : float or None
        Target false-positive rate of a calibrated threshold.
    n_calibration_ : int or None
        Number of rows a calibrated threshold was calibrated on.
    """

    fitted_arrays = ("means_", "chol_")
    fitted_scalars = ("shrinkage_", "scale_", "dof_", "quantile")
    threshold_: float | None
    gaussian_threshold_: float | None
    calibration_: str
    fpr_: float | None
    n_calibration_: int | None

    def __init__(self, quantile: float = 0.99) -> None:
        if not 0.0 < float(quantile) < 1.0:
            raise ConfigError(f"the OOD quantile must lie in (0, 1); got {quantile!r}")
        self.quantile = float(quantile)

    def fit_from_moments(self, moments: Moments) -> Self:
        """Fit from the moments of the aggregate (statistics space); no threshold yet."""
        cov = pooled_covariance_of(moments)
        a = 0.0
        if moments.within_scatter is not None:
            n = moments.n_samples
            a = rblw_shrinkage(cov * (n - moments.num_classes) / n, n)
        scoring = shrink(cov, a) if a > 0 else cov
        self.means_ = np.asarray(moments.means, dtype=np.float64)
        self.chol_ = _cholesky(scoring)
        self.shrinkage_ = float(a)
        self.gaussian_threshold_, self.scale_, self.dof_ = scaled_chi2_threshold(
            self.chol_, cov, self.quantile)
        self._uncalibrated()
        return self

    def _uncalibrated(self) -> None:
        self.threshold_, self.calibration_ = None, "none"
        self.fpr_, self.n_calibration_ = None, None

    @property
    def has_threshold(self) -> bool:
        """Whether a threshold was calibrated on data (else there is no ``ood`` flag)."""
        return getattr(self, "threshold_", None) is not None

    def calibrate(self, x_in: NDArray[Any], fpr: float = DEFAULT_FPR) -> Self:
        """Set ``threshold_`` from in-distribution rows at false-positive rate ``fpr``.

        The threshold is the r-th smallest score, r = ⌈(n + 1)(1 − fpr)⌉
        (:func:`conformal_rank`): a new row exchangeable with ``x_in`` is flagged with
        probability at most ``fpr``.

        Parameters
        ----------
        x_in : ndarray, shape (n, k)
            Held-out in-distribution rows in the statistics space (as :meth:`score` takes
            them), not used to fit the model's statistics.
        fpr : float in (0, 1), default 0.05

        Raises
        ------
        ConfigError
            ``fpr`` outside (0, 1).
        InputError
            Wrong shape, non-finite rows, or fewer than (1 − fpr)/fpr rows.
        """
        rows = np.asarray(x_in, dtype=np.float64)
        if not np.all(np.isfinite(rows)):
            raise InputError("the OOD calibration rows hold NaN or infinite values; drop or "
                             "fix those rows")
        scores = self.score(rows)
        rank = conformal_rank(int(scores.shape[0]), fpr)
        self.threshold_ = float(np.partition(scores, rank - 1)[rank - 1])
        self.calibration_, self.fpr_ = "conformal", float(fpr)
        self.n_calibration_ = int(scores.shape[0])
        return self

    def calibrate_from_histogram(self, counts: NDArray[Any], edges: NDArray[Any],
                                 fpr: float = DEFAULT_FPR) -> Self:
        """Set ``threshold_`` from a histogram of in-distribution scores (module docstring).

        With n = Σ counts and r = ⌈(n + 1)(1 − fpr)⌉ (:func:`conformal_rank`), the threshold is
        the upper edge of the first bin whose cumulative count reaches r: the conformal
        threshold s_(r) of the rows rounded up to a bin edge. It is ≥ s_(r), so a new row
        exchangeable with the counted rows is flagged with probability at most ``fpr``; the
        counted rows above it lie in later bins, at most n − r ≤ fpr·n of them (the empirical
        false-positive rate on them is at most ``fpr``); it is conservative by at most one bin.

        Parameters
        ----------
        counts : ndarray of int, shape (B,)
            Rows per bin, as :func:`score_histogram` counts them (summed over clients).
        edges : ndarray, shape (B − 1,)
            The bin edges, :func:`score_bin_edges` of the model's dimension.
        fpr : float in (0, 1), default 0.05

        Raises
        ------
        ConfigError
            ``fpr`` outside (0, 1).
        InputError
            Counts and edges that do not fit (shapes, negative or non-integer counts,
            decreasing edges), fewer than (1 − fpr)/fpr rows, or a rank that falls in the last
            bin (no finite upper edge).
        """
        self._check_fitted()
        c, e = np.asarray(counts), np.asarray(edges, dtype=np.float64)
        if c.ndim != 1 or e.shape != (c.size - 1,) or c.dtype.kind not in "iu" \
                or bool(np.any(c < 0)) or not bool(np.all(np.diff(e) > 0)):
            raise InputError(
                f"an OOD score histogram needs B >= 2 non-negative integer counts and B - 1 "
                f"increasing edges; got counts {c.dtype} of shape {c.shape} and edges of shape "
                f"{e.shape}; count the scores with score_histogram(scores, score_bin_edges(k))"
            )
        n = int(c.sum())
        rank = conformal_rank(n, fpr)
        i = int(np.searchsorted(np.cumsum(c), rank, side="left"))
        if i >= e.size:
            raise InputError(
                f"the OOD score quantile of these {n} rows lies beyond the histogram's last "
                f"edge ({e[-1]:.6g}), so it has no finite upper edge; calibrate on the rows "
                "themselves with `ghofl evaluate MODEL --embeddings HELD_OUT.npz --calibrate-ood`"
            )
        self.threshold_ = float(e[i])
        self.calibration_, self.fpr_, self.n_calibration_ = "federated", float(fpr), n
        return self

    @property
    def rule(self) -> str:
        """How ``threshold_`` was set, in words (recorded in the model manifest)."""
        kind = getattr(self, "calibration_", "none")
        if kind == "conformal":
            return (f"conformal: the ceil((n+1)(1-fpr))-th smallest score of n="
                    f"{self.n_calibration_} held-out in-distribution rows, fpr={self.fpr_} (a "
                    "new in-distribution row exchangeable with them is flagged with "
                    "probability <= fpr)")
        if kind == "federated":
            return (f"federated: the ceil((n+1)(1-fpr))-th smallest score of n="
                    f"{self.n_calibration_} clients' held-out in-distribution rows, rounded "
                    f"up to the upper edge of its histogram bin, fpr={self.fpr_} (no row left "
                    "its client; a new row exchangeable with them is flagged with probability "
                    "<= fpr)")
        return OOD_RULE

    def _check_fitted(self) -> None:
        if not hasattr(self, "chol_"):
            raise NotFittedError("this MahalanobisOOD is not fitted; call fit_from_moments")

    def score(self, Z: NDArray[Any]) -> F64:
        """``ood_score`` of every row of ``Z`` (n, k) in the statistics space; shape (n,)."""
        self._check_fitted()
        Z = np.asarray(Z, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != self.chol_.shape[0]:
            raise InputError(
                f"the OOD score takes inputs of shape (n, {self.chol_.shape[0]}); got {Z.shape}"
            )
        return nearest_mahalanobis(Z, self.means_, self.chol_)[0]

    def bin_edges(self) -> F64:
        """:func:`score_bin_edges` of this model's dimension k; shape (HIST_BINS − 1,)."""
        self._check_fitted()
        return score_bin_edges(int(self.chol_.shape[0]))

    def flag(self, scores: F64) -> NDArray[np.bool_]:
        """``scores > threshold_``, shape as ``scores``.

        Raises
        ------
        InputError
            No threshold was calibrated (``threshold_`` is ``None``).
        """
        self._check_fitted()
        if self.threshold_ is None:
            raise InputError(f"this OOD score has no calibrated threshold, so nothing can be "
                             f"flagged; {CALIBRATE_HINT} (or MahalanobisOOD.calibrate)")
        return np.asarray(scores) > self.threshold_

    def get_state(self) -> tuple[dict[str, F64], dict[str, Any]]:
        """Fitted arrays and scalars: what the model directory stores.

        Arrays ``means_``, ``chol_``; scalars ``threshold`` (``None`` without calibration),
        ``gaussian_threshold`` (reference only), ``shrinkage``, ``scale``, ``dof``,
        ``quantile``, ``calibration``, ``rule`` and, for a calibrated threshold, ``fpr`` and
        ``n_calibration``.
        """
        self._check_fitted()
        scalars: dict[str, Any] = {k.rstrip("_"): float(getattr(self, k))
                                   for k in self.fitted_scalars}
        scalars["threshold"] = self.threshold_
        scalars["gaussian_threshold"] = self.gaussian_threshold_
        scalars["calibration"] = getattr(self, "calibration_", "none")
        scalars["rule"] = self.rule
        if scalars["calibration"] != "none":
            scalars["fpr"], scalars["n_calibration"] = self.fpr_, self.n_calibration_
        return ({k: np.ascontiguousarray(getattr(self, k)) for k in self.fitted_arrays},
                scalars)

    @classmethod
    def from_state(cls, arrays: dict[str, NDArray[Any]], scalars: dict[str, Any],
                   num_classes: int, dim: int, where: str) -> MahalanobisOOD:
        """Rebuild from :meth:`get_state`, checking shapes against the model's C and k.

        A manifest written when the Gaussian quantile was the flag (calibration
        ``"gaussian"`` or none recorded) reads as calibration ``"none"``: its threshold
        becomes ``gaussian_threshold_``, and there is no flag until calibrated.

        Raises
        ------
        InputError
            A missing or malformed array or scalar; the message names ``where``.
        """
        def bad(what: str) -> InputError:
            return InputError(f"{where} is malformed ({what}); fit the model again with "
                              "`ghofl fit`")

        try:
            out = cls(float(scalars["quantile"]))
        except (KeyError, TypeError, ValueError, ConfigError) as exc:
            raise bad(f"quantile: {exc}") from None
        shapes = {"means_": (num_classes, dim), "chol_": (dim, dim)}
        for key, shape in shapes.items():
            arr = arrays.get(key)
            if arr is None or arr.shape != shape or arr.dtype.kind != "f" \
                    or not np.all(np.isfinite(arr)):
                got = None if arr is None else arr.shape
                raise bad(f"{key} must be finite floats of shape {shape}; got {got}")
            setattr(out, key, np.asarray(arr, dtype=np.float64))
        if np.any(np.diag(out.chol_) <= 0):
            raise bad("chol_ is not a Cholesky factor (non-positive diagonal)")
        values = dict(scalars)
        if values.get("calibration", "gaussian") == "gaussian":  # written before "none"
            values.update(calibration="none", gaussian_threshold=values.get("threshold"),
                          threshold=None)
        for key in ("threshold", "gaussian_threshold", "shrinkage", "scale", "dof"):
            value = values.get(key)
            if value is None and key in ("threshold", "gaussian_threshold"):
                setattr(out, key + "_", None)
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not np.isfinite(value) or value < 0:
                raise bad(f"{key} must be a finite non-negative number; got {value!r}")
            setattr(out, key + "_", float(value))
        out._set_calibration(values, bad)
        return out

    def _set_calibration(self, scalars: dict[str, Any],
                         bad: Callable[[str], InputError]) -> None:
        """``calibration_``, ``fpr_``, ``n_calibration_`` from stored scalars."""
        kind = scalars.get("calibration")
        if kind not in _CALIBRATIONS:
            raise bad(f"calibration must be one of {', '.join(_CALIBRATIONS)}; got {kind!r}")
        self.calibration_, self.fpr_, self.n_calibration_ = kind, None, None
        if (kind == "none") != (self.threshold_ is None):
            raise bad(f"calibration {kind!r} with threshold {self.threshold_!r}: a threshold "
                      "is recorded exactly when it was calibrated")
        if kind == "none":
            return
        fpr, n = scalars.get("fpr"), scalars.get("n_calibration")
        if isinstance(fpr, bool) or not isinstance(fpr, int | float) or not 0.0 < fpr < 1.0:
            raise bad(f"fpr must lie in (0, 1); got {fpr!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise bad(f"n_calibration must be a positive integer; got {n!r}")
        self.fpr_, self.n_calibration_ = float(fpr), n


def ood_or_none(stats: Moments | ClientStats) -> MahalanobisOOD | None:
    """The uncalibrated OOD score of aggregate ``stats`` (or their moments), else ``None``.

    They give none with no more samples than classes, or a degenerate covariance.
    """
    try:
        moments = stats if isinstance(stats, Moments) else compute_moments(stats)
        return MahalanobisOOD().fit_from_moments(moments)
    except StatsValidationError:
        return None
