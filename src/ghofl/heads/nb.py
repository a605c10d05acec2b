"""NB-diag: per-class diagonal Gaussians with log priors (method.md §2).

On the statistics of a differentially private release (:class:`~ghofl.stats.release.
NoisyStats`, whose public noise levels σ_b the criteria read) the per-class variances are
shrunk toward the pooled one by an amount that counts the noise left in them
(:func:`noise_aware_class_vars`; in ``full`` mode the post-processing already removed part of
it); ``var_rule_`` then reads ``"pooled-shrinkage+dp-noise"``.
On other statistics the variances are those of scikit-learn's ``GaussianNB`` (``"fixed"``),
unchanged.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ghofl.errors import InputError
from ghofl.heads._linalg import F64, safe_log
from ghofl.heads._params import Constraint, Real
from ghofl.heads._qda_noise import postprocess_intensities
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.moments.noise import noise_tag
from ghofl.stats.meta import StatsMeta
from ghofl.stats.release import NoisyStats

Shape = tuple[int, ...]


#: ``var_rule_`` of variances read as given (exact statistics).
FIXED_RULE = "fixed"
#: ``var_rule_`` of variances shrunk toward the pooled one, before :func:`noise_tag`.
POOLED_RULE = "pooled-shrinkage"


def class_var_noise(moments: Moments) -> F64 | None:
    """ν²_cj (C, d): variance of the release noise left on each class variance v_cj.

    v_cj = D̃_cj/N_c − (Ã_cj/N_c)² reads the noisy diagonal second moment D̃ (σ_D: the level
    of ``sq_sums``, else of ``class_scatter``) and the noisy sum Ã (σ_A), so to first order

        ν²_cj = (1 − a_p,c)² (σ_D² + 4 σ_A² μ̂_cj²) / N_c²,

    a_p,c the intensity by which the post-processing of a ``full`` release (P2n) already
    shrank class c's covariance, leaving (1 − a_p,c) of its noise
    (:func:`~ghofl.heads._qda_noise.postprocess_intensities`: recorded by the release, else
    recovered; 0 in the other modes). The noise of the counts (rounded integers) and the
    bias σ_A²/N_c² of the centring are left out. None when the statistics carry no noise
    levels (:func:`noise_tag`).
    """
    noise = _release_noise(moments)
    if noise is None:
        return None
    nu, applied = noise
    out: F64 = (nu * (1.0 - applied)[:, None]) ** 2
    return out


def _release_noise(moments: Moments) -> tuple[F64, F64] | None:
    """Noise standard deviation (C, d) on v_cj before any post-processing, and a_p (C,).

    √(σ_D² + 4σ_A²μ̂²)/N_c, the root taken as a hypotenuse so that no scale of the features
    overflows.
    """
    stats = moments.stats
    if not noise_tag(stats) or not isinstance(stats, NoisyStats):
        return None
    sigma = stats.noise_sigma
    sd_d = float(sigma.get("sq_sums", sigma.get("class_scatter", 0.0)))
    sd_a = float(sigma.get("sums", 0.0))
    cnt = np.maximum(moments.counts.astype(np.float64), 1.0)
    out: F64 = np.hypot(sd_d, 2.0 * sd_a * moments.means) / cnt[:, None]
    return out, postprocess_intensities(moments)


def noise_aware_class_vars(moments: Moments) -> tuple[F64, F64] | None:
    """Class variances (C, d) shrunk toward the pooled one knowing the noise, and a (C,).

    With ν²_cj of :func:`class_var_noise` (the noise left) and v_cj the noisy class
    variances (already clamped at 0):

    * floor: ṽ_cj = max(v_cj, ν_cj), a variance below one noise standard deviation being
      indistinguishable from 0 at the noise level (so ṽ_cj > 0 wherever ν_cj > 0; where
      ν_cj = 0, i.e. no noise reached it, a variance of 0 stays 0, and :func:`nb_params`'
      smoothing makes it positive);
    * target: v̄_j = max(Σ_c π_c v_cj, ν̄_j), π_c = N_c/N, ν̄²_j = Σ_c π_c² ν²_cj;
    * the noise's share of the spread around the target in relative squared error, each
      term divided by v̄_j before it is squared (features with v̄_j = 0 hold no noise nor
      spread and are left out), so that no scale of the features overflows or underflows::

          s_c = min(1, Σ_j (ν_cj/v̄_j)² / Σ_j ((ṽ_cj − v̄_j)/v̄_j)²)    (1 when the spread is 0);

    * intensity: s_c is the total shrinkage the noise calls for (shrinking scales the noise
      and the spread alike, so s_c reads the same before and after the post-processing's
      a_p,c); what is left to apply is a_c = max(0, (s_c − a_p,c)/(1 − a_p,c)), so that
      (1 − a_p,c)(1 − a_c) = 1 − s_c (a_c = s_c outside ``full`` mode, where a_p,c = 0;
      a_c = 0 when a_p,c = 1, the post-processing having shrunk all the way);
    * a_c = 1 for a class of at most one sample (a placeholder of the post-processing: its
      variances are noise, or absent);
    * v̂_c = (1 − a_c) ṽ_c + a_c v̄.

    a_c → 0 as the noise vanishes and → 1 as it dominates the spread (a class with few
    samples is shrunk more). None without release noise.
    """
    noise = _release_noise(moments)
    if noise is None:
        return None
    nu, applied = noise
    nu = nu * (1.0 - applied)[:, None]
    raw = moments.class_vars
    cnt = np.maximum(moments.counts.astype(np.float64), 1.0)
    pi = cnt / float(np.sum(cnt))
    floored = np.maximum(raw, nu)
    target = np.maximum(pi @ raw, np.hypot.reduce(pi[:, None] * nu, axis=0))
    inv = np.divide(1.0, target, out=np.zeros_like(target), where=target > 0.0)
    num = np.sum((nu * inv) ** 2, axis=1)
    den = np.sum(((floored - target) * inv) ** 2, axis=1)
    share = np.minimum(1.0, np.divide(num, den, out=np.ones_like(num), where=den > num))
    rest = 1.0 - applied
    a = np.maximum(0.0, np.divide(share - applied, rest, out=np.zeros_like(share),
                                  where=rest > 0.0))
    a[moments.counts <= 1] = 1.0
    out: F64 = (1.0 - a)[:, None] * floored + a[:, None] * target
    return out, a


def nb_params(
    moments: Moments, var_smoothing: float, var_floor: float = 0.0,
    class_vars: F64 | None = None,
) -> tuple[F64, F64, F64]:
    """Means (C, d), variances (C, d) and log priors (C,) of Gaussian naive Bayes.

    Variances are max(v_c + ε, f): the class variances v_c (``class_vars``, shape (C, d);
    default the maximum-likelihood D_c/N_c − μ_c²), plus ε = var_smoothing · max_j Var(x_j)
    over all samples (scikit-learn's ``GaussianNB``), floored at the absolute value
    f = ``var_floor`` (the paper's clamp). Each variance is thus at least as large as under
    either rule alone.
    """
    n = moments.n_samples
    m = moments.global_mean
    global_var = moments.stats.diag_sums.sum(axis=0) / n - m**2
    eps = var_smoothing * float(np.max(global_var, initial=0.0))
    if eps == 0.0:
        eps = np.finfo(float).tiny
    base = moments.class_vars if class_vars is None else class_vars
    variances = np.maximum(base + eps, var_floor)
    return moments.means.copy(), variances, safe_log(moments.priors)


class NBDiagHead(Head):
    """Gaussian naive Bayes from per-class sums of squares (works in every upload mode).

    Parameters
    ----------
    var_smoothing : float, default 1e-9
        Portion of the largest feature variance added to every variance (scikit-learn).
    var_floor : float, default 1e-6
        Absolute lower bound on every variance (the paper's clamp), applied after the
        smoothing, so the variances are never below those of either rule. Features that are
        constant within a class (for example ReLU outputs that stay 0) otherwise get a
        variance of ~1e-9 × the largest variance and dominate the score.

    Attributes
    ----------
    var_shrinkage_ : list of float, length C
        a_c, how far each class variance was shrunk toward the pooled one before the
        smoothing: 0 on exact statistics; on a private release the noise-aware intensity of
        :func:`noise_aware_class_vars`.
    var_rule_ : str
        ``"fixed"`` (variances as estimated), or ``"pooled-shrinkage+dp-noise"`` when the
        shrinkage weighed the public noise of a differentially private release.
    """

    name = "nb"
    min_mode = "diag"
    fitted_arrays = ("means_", "vars_", "log_priors_")
    fitted_scalars = ("var_shrinkage_", "var_rule_")
    neg_inf_arrays = frozenset({"log_priors_"})
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "var_smoothing": Real(lo=0.0),
        "var_floor": Real(lo=0.0),
    }

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        c, d = meta.num_classes, meta.dim
        return {"means_": (c, d), "vars_": (c, d), "log_priors_": (c,)}

    def _check_arrays(self, arrays: dict[str, F64]) -> None:
        if np.any(arrays["vars_"] <= 0):
            raise InputError(
                "saved NBDiagHead array vars_ holds variances <= 0; expected positive "
                "variances; the file is corrupt"
            )

    def __init__(self, var_smoothing: float = 1e-9, var_floor: float = 1e-6) -> None:
        self.var_smoothing = var_smoothing
        self.var_floor = var_floor

    def _fit(self, moments: Moments) -> None:
        p = self.params_
        shrunk = noise_aware_class_vars(moments)
        if shrunk is None:
            class_vars, a, rule = None, np.zeros(moments.num_classes), FIXED_RULE
        else:
            class_vars, a = shrunk
            rule = POOLED_RULE + noise_tag(moments.stats)
        self.means_, self.vars_, self.log_priors_ = nb_params(
            moments, p["var_smoothing"], p["var_floor"], class_vars
        )
        self.var_shrinkage_ = [float(v) for v in a]
        self.var_rule_ = rule

    def set_state(
        self, meta: StatsMeta, arrays: dict[str, Any], scalars: dict[str, Any]
    ) -> NBDiagHead:
        """Restore a fitted head.

        Files written before ``var_rule_`` existed load with ``var_rule_ = "unrecorded"``
        and no shrinkage (``var_shrinkage_`` all 0).
        """
        if isinstance(scalars, dict) and "var_rule_" not in scalars:
            scalars = {"var_shrinkage_": [0.0] * meta.num_classes, **scalars,
                       "var_rule_": "unrecorded"}
        return super().set_state(meta, arrays, scalars)

    def _decision(self, Z: F64) -> F64:
        inv = 1.0 / self.vars_  # (C, d)
        quad = (
            (Z**2) @ inv.T - 2.0 * Z @ (self.means_ * inv).T + np.sum(self.means_**2 * inv, axis=1)
        )
        const = -0.5 * np.sum(np.log(2.0 * np.pi * self.vars_), axis=1)
        out: F64 = self.log_priors_ + const - 0.5 * quad
        return out


__all__ = ["FIXED_RULE", "POOLED_RULE", "NBDiagHead", "class_var_noise", "nb_params",
           "noise_aware_class_vars"]
