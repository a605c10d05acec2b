"""NCM: the nearest-class-mean classifier of FedNCM (Legate et al., NeurIPS 2023).

FedNCM's clients upload, per class, the count N_c^k and the sum A_c^k of their embeddings;
the server forms the global class means μ_c = Σ_k A_c^k / Σ_k N_c^k and classifies by the
nearest of them. Only N_c and A_c are read, so the head fits from every upload mode.

Two distances (``metric``):

``"cosine"`` (default, FedNCM's choice)
    FedNCM uses the normalised class means μ_c/‖μ_c‖ as the weights of a linear classifier
    on normalised embeddings, so the score is the cosine similarity
    s_c(x) = xᵀμ_c / (‖x‖ ‖μ_c‖); the norms are taken after the means are formed (the
    means are of raw embeddings, not of normalised ones).
``"euclidean"``
    s_c(x) = −½ ‖x − μ_c‖², scikit-learn's ``NearestCentroid`` (identical predictions on
    the pooled data).

Log-probabilities are softmax(s/T) with the temperature T = ``temperature``; argmax
predictions do not depend on T. A class with no samples has no mean and gets the score −∞.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ghofl.errors import InputError
from ghofl.heads._linalg import F64
from ghofl.heads._params import Constraint, Options, Real
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]


def unit_rows(x: F64) -> F64:
    """Rows of ``x`` (n, d) divided by their Euclidean norms (rows of norm 0 stay 0)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: F64 = x / np.where(norms > 0, norms, 1.0)
    return out


def ncm_scores(Z: F64, means: F64, metric: str) -> F64:
    """Nearest-class-mean scores (n, C) of inputs ``Z`` (n, d) for class means (C, d).

    ``"cosine"``: cosine similarity; ``"euclidean"``: −½ squared Euclidean distance.
    """
    if metric == "cosine":
        out: F64 = unit_rows(Z) @ unit_rows(means).T
        return out
    sq = np.sum(Z**2, axis=1, keepdims=True) - 2.0 * Z @ means.T + np.sum(means**2, axis=1)
    out = -0.5 * np.maximum(sq, 0.0)
    return out


class NCMHead(Head):
    """Nearest class mean (FedNCM), from the class counts and sums (every upload mode).

    Parameters
    ----------
    metric : {"cosine", "euclidean"}, default "cosine"
        FedNCM's cosine similarity to the class means, or the Euclidean distance of
        scikit-learn's ``NearestCentroid`` (module docstring).
    temperature : float > 0, default 1.0
        Scores are divided by T before the softmax; predictions do not depend on it.
    """

    name = "ncm"
    min_mode = "means"
    fitted_arrays = ("means_", "offsets_")
    neg_inf_arrays = frozenset({"offsets_"})
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "metric": Options(("cosine", "euclidean")),
        "temperature": Real(lo=0.0, lo_open=True),
    }

    def __init__(self, metric: str = "cosine", temperature: float = 1.0) -> None:
        self.metric = metric
        self.temperature = temperature

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        return {"means_": (meta.num_classes, meta.dim), "offsets_": (meta.num_classes,)}

    def _check_arrays(self, arrays: dict[str, F64]) -> None:
        off = arrays["offsets_"]
        if not np.all((off == 0.0) | (off == -np.inf)):
            raise InputError(
                "saved NCMHead array offsets_ holds values other than 0 and -inf; expected 0 "
                "for classes with samples and -inf for empty ones; the file is corrupt"
            )

    def _fit(self, moments: Moments) -> None:
        self.means_ = moments.means.copy()
        self.offsets_ = np.where(moments.counts > 0, 0.0, -np.inf)

    def _decision(self, Z: F64) -> F64:
        p = self.params_
        out: F64 = ncm_scores(Z, self.means_, p["metric"]) / p["temperature"] + self.offsets_
        return out


__all__ = ["NCMHead", "ncm_scores", "unit_rows"]
