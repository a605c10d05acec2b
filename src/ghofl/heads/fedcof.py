"""FedCOF's classifier (Goswami et al., NeurIPS 2025): ridge-like weights from class moments.

FedCOF estimates the Gram matrix of the features from class moments and the class covariances
(its own estimate from client means, :mod:`ghofl.moments.fedcof`, or any covariance the
statistics carry), with a shrinkage γ added to every class covariance:

    G = Σ_c (N_c − 1)(Σ_c + γ I) + N m mᵀ,      W = G⁺ [A_1 … A_C],      s_c(x) = xᵀw_c / ‖w_c‖

(N m mᵀ with the global mean m, as FedCOF writes it: the between-class part of Σ x xᵀ is
replaced by the global mean's; with exact covariances G therefore differs from Fed3R's ΦᵀΦ).
In moments, Σ_c (N_c − 1) Σ_c is the within-class scatter W = B − Σ_c A_c A_cᵀ/N_c, so the
head needs a ``pooled`` upload or FedCOF's estimated statistics
(:func:`~ghofl.moments.fedcof.fedcof_statistics`) from ``means`` uploads, which the server
builds with ``aggregation.estimate = "fedcof"`` (``--estimate fedcof`` of ``ghofl simulate``,
``ghofl aggregate`` and ``ghofl flower-run``; plain protocol only). The class weights are
normalised as in FedCOF's evaluation (``normalize=False`` keeps the raw solution).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ghofl.heads._linalg import F64
from ghofl.heads._params import Constraint, Integer, Options, Real
from ghofl.heads.fed3r import UnscaledLinearHead
from ghofl.moments.core import Moments

Shape = tuple[int, ...]

__all__ = ["FedCOFHead", "fedcof_gram"]


def fedcof_gram(within: F64, counts: F64, global_mean: F64, gamma: float) -> F64:
    """FedCOF's Gram estimate G = W + γ Σ_c (N_c − 1) I + N m mᵀ.

    Parameters
    ----------
    within : ndarray, shape (d, d)
        Within-class scatter W = Σ_c (N_c − 1) Σ_c.
    counts : ndarray, shape (C,)
        N_c.
    global_mean : ndarray, shape (d,)
        m = Σ_c A_c / N.
    gamma : float ≥ 0
        Shrinkage added to every class covariance.
    """
    n = float(counts.sum())
    out: F64 = 0.5 * (within + within.T) + n * np.outer(global_mean, global_mean)
    out[np.diag_indices_from(out)] += gamma * float(np.sum(np.maximum(counts - 1.0, 0.0)))
    return out


class FedCOFHead(UnscaledLinearHead):
    """FedCOF's classifier from pooled moments (exact, or FedCOF's estimate from client means).

    Parameters
    ----------
    gamma : float ≥ 0, default 1.0
        Shrinkage γ added to every class covariance (FedCOF's setting).
    normalize : bool, default True
        Divide each class's weight vector by its norm (module docstring).
    n_calibration : int, default 256
        Synthetic samples per class for the temperature of the probabilities (as ``ridge``, at
        most 65,536 in all);
        0 = T = 1. Predictions do not depend on it.
    seed : int, default 0
        Seed of the calibration samples.
    """

    name = "fedcof"
    min_mode = "gram"
    min_samples = 2
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "gamma": Real(lo=0.0),
        "normalize": Options((True, False)),
        "n_calibration": Integer(lo=0),
        "seed": Integer(lo=0),
    }

    def __init__(self, gamma: float = 1.0, normalize: bool = True, n_calibration: int = 256,
                 seed: int = 0) -> None:
        self.gamma = gamma
        self.normalize = normalize
        self.n_calibration = n_calibration
        self.seed = seed

    def _solution(self, moments: Moments) -> F64:
        within = moments._require_scatter(moments.within_scatter, "the fedcof head")
        g = fedcof_gram(within, moments.counts.astype(np.float64), moments.global_mean,
                        float(self.params_["gamma"]))
        coef: F64 = np.linalg.pinv(g, hermitian=True) @ moments.stats.sums.T  # (d, C)
        return coef
