"""QDA: one shrunk full covariance per class (method.md §2); needs upload mode ``full``.

Memory at scale (C = 200, d = 1280): the fit holds the class second moments of the total
(C·d² floats), the fitted whitening factors (another C·d²) and O(d²) per class being
processed; the default shrinkage rule without a held-out part reads only the eigenvalues of
each class covariance (:func:`qda_evidence_shrinkage`). Scoring whitens the inputs one block
of :data:`SCORE_BLOCK_ROWS` rows at a time with a triangular matrix product, so its
temporaries are O(block·d) whatever the number of inputs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
from scipy.linalg import eigvalsh
from scipy.linalg.blas import dsyr, dtrmm
from scipy.linalg.lapack import dpotri

from ghofl.errors import ConfigError
from ghofl.heads._linalg import (
    F64,
    class_map,
    inverse_factor_into,
    one_blas_thread,
    safe_log,
    stable_cholesky,
)
from ghofl.heads._params import Constraint, Options, ShrinkageParam
from ghofl.heads._qda_noise import noise_floor_shrinkage
from ghofl.heads.base import Head
from ghofl.moments.core import Moments
from ghofl.moments.noise import noise_tag
from ghofl.moments.selection import (
    ShrinkageFamily,
    argmax_candidate,
    choose_qda_shrinkage,
    evidence_loglik,
    pooled_center,
    pooled_center_choice,
    refine_grid,
    support_basis,
)
from ghofl.moments.shrinkage import (
    ANALYTIC_DEFAULT,
    Shrinkage,
    check_shrinkage,
    shrink,
)
from ghofl.stats.lapack import sygst
from ghofl.stats.meta import StatsMeta

Shape = tuple[int, ...]
#: Shrinkage targets of QDA: the pooled covariance rescaled per class (the default), or a
#: multiple of the identity (:func:`ghofl.moments.shrinkage.shrink`).
QDATarget = Literal["pooled", "scaled_identity", "identity"]
QDA_TARGETS: tuple[str, ...] = ("pooled", "scaled_identity", "identity")

#: ``shrinkage_method_`` of the evidence rule, before :func:`~ghofl.moments.noise.noise_tag`
#: (``"evidence+dp-noise"`` on a private release, :mod:`ghofl.heads._qda_noise`).
EVIDENCE_RULE = "evidence"

#: Rows of inputs whitened at once when scoring (a (rows, d) float64 buffer: 10 MB at d = 1280).
SCORE_BLOCK_ROWS = 1024


def qda_params(
    moments: Moments,
    shrinkage: Shrinkage,
    target: QDATarget = "pooled",
    divisor: str = "n-1",
    pooled_shrinkage: Shrinkage = "auto",
) -> tuple[F64, F64, F64, list[float], str]:
    """Per-class whitening factors for QDA.

    For each class, Σ̃_c = L_c L_cᵀ is Σ_c shrunk with coefficient a_c toward its target:
    (1 − a_c)Σ_c + a_c·t_c·B with B = :func:`~ghofl.moments.selection.pooled_center` and
    t_c = tr(B⁻¹Σ_c)/d (``"pooled"``), or shrink(Σ_c, a_c, target) toward a multiple of the
    identity. Returns ``P`` (C, d, d) with P_c = L_c⁻ᵀ (upper triangular) so that
    (x−μ_c)ᵀ Σ̃_c⁻¹ (x−μ_c) = ‖(x−μ_c) P_c‖², half log-determinants Σ log diag L_c (C,), log
    priors (C,), the coefficients a_c and how they were chosen (a rule is resolved by
    :func:`qda_shrinkage`). The classes are factorised in a thread pool with one BLAS thread
    each (:func:`~ghofl.heads._linalg.class_map`), each in place in its slot of P (the shrunk
    covariance written from the class sums by :func:`_shrunk_class_covariance`, its Cholesky
    factor and inverse: :func:`~ghofl.heads._linalg.inverse_factor_into`), so peak memory is P
    plus at most one (d, d) temporary per worker. The Cholesky factor of B is computed once and
    shared with the evidence rule, whose whitened traces give the t_c; B⁻¹ is formed (LAPACK
    ``dpotri``) only for the t_c that the rule did not give.
    """
    c_num, d = moments.num_classes, moments.dim
    center, within, chol_b = None, None, None
    if target == "pooled":
        center, choice = pooled_center_choice(moments, pooled_shrinkage)
        if choice.spectrum is not None:
            within = choice.spectrum.eigvals * (moments.n_samples - c_num)
        chol_b = _center_factor(center)
    coefs, method, scales = _choose_shrinkage(
        moments, shrinkage, divisor=divisor, target=target, center=center,
        pooled_shrinkage=pooled_shrinkage, within_eigvals=within, chol_center=chol_b)
    center_inv = None
    if chol_b is not None and (scales is None or np.any(np.isnan(scales))
                               or _inverse_overflows(chol_b)):
        scales = None  # every t_c from B⁻¹, so that an overflowing B⁻¹ is refused below
        center_inv = _inverse_from_factor(chol_b)
    prec = np.empty((c_num, d, d))
    half_logdet = np.empty(c_num)

    def factor(c: int) -> None:  # Σ̃_c, its factor and P_c in place in prec[c]
        scale = None if scales is None or np.isnan(scales[c]) else float(scales[c])
        half_logdet[c], _ = inverse_factor_into(
            prec[c],
            lambda cov: _shrunk_class_covariance(moments, c, coefs[c], divisor, target, cov,
                                                 center, center_inv, scale),
            f"the QDA covariance of class {moments.meta.classes[c]!r}")

    class_map(factor, c_num)  # classes in parallel, one BLAS thread each, without the GIL
    return prec, half_logdet, safe_log(moments.priors), coefs, method


def _center_factor(center: F64) -> F64:
    """The lower Cholesky factor (d, d) of the pooled target B, Fortran-ordered, zeros above."""
    chol, _ = stable_cholesky(center, "the pooled covariance QDA shrinks toward")
    return np.asfortranarray(chol)


def _inverse_overflows(chol: F64) -> bool:
    """Whether B⁻¹ has an entry past float64: its diagonal (B⁻¹)_ii ≥ 1/L_ii², B = L Lᵀ.

    The t_c of such a B are not finite, and neither are the covariances QDA would build from
    it (features scaled near 1e-160): :func:`qda_params` forms B⁻¹ then, and the covariances
    are refused.
    """
    with np.errstate(over="ignore", divide="ignore"):
        return not bool(np.all(np.isfinite(1.0 / np.square(np.diagonal(chol)))))


def _inverse_from_factor(chol: F64) -> F64:
    """B⁻¹ (d, d), symmetric, from the lower Cholesky factor of B (LAPACK ``dpotri``).

    ``dtrtri`` and ``dlauum``: 2d³/3 flops. Entries overflow to ±inf (without a warning) for a
    B too ill-conditioned for float64; the covariances built from it are then refused.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        inv, info = dpotri(chol, lower=1)
    if info != 0:  # pragma: no cover - a Cholesky factor has a positive diagonal
        raise np.linalg.LinAlgError(f"inverting the pooled covariance failed (LAPACK info {info})")
    low = np.tril(inv)
    out: F64 = low + np.tril(low, -1).T
    return out


def _scatter_into(moments: Moments, c: int, factor: float, out: F64) -> F64:
    """factor·(S_c − N_c μ_c μ_cᵀ) into the upper triangle of ``out`` (d, d), C-contiguous.

    That is the lower triangle of the Fortran-ordered ``out.T``, as LAPACK reads it: a scaled
    copy of the class second moment and a rank-one update (BLAS ``dsyr``) of one triangle,
    where the full symmetric covariance takes four passes over (d, d). The strict lower
    triangle of ``out`` holds factor·S_c (finite when S_c is). Class c holds two samples or
    more. Returns ``out``.
    """
    s = moments.stats.class_scatter
    if s is None:  # no class second moments: class_covariance refuses the mode
        return moments.class_covariance(c, out=out)
    np.multiply(s[c], factor, out=out)
    res = dsyr(-factor * float(moments.counts[c]), moments.means[c], a=out.T, lower=1,
               overwrite_a=1)
    if not np.shares_memory(res, out):  # pragma: no cover - BLAS wrapper made a copy
        out.T[...] = res
    return out


def _shrunk_class_covariance(
    moments: Moments, c: int, a: float, divisor: str, target: QDATarget, out: F64,
    center: F64 | None, center_inv: F64 | None, scale: float | None,
) -> None:
    """The shrunk Σ̃_c (its upper triangle, as LAPACK reads ``out.T``) into ``out`` (d, d).

    Target ``"pooled"`` (``center`` B given): (1 − a)Σ_c + a·t_c·B with t_c = ``scale`` when
    known, else max(tr(B⁻¹Σ_c), 0)/d from ``center_inv``; else (1 − a)Σ_c + a·τ·I with
    τ = max(tr Σ_c, 0)/d (``"scaled_identity"``) or 1. A class of one sample takes the pooled
    covariance, as :meth:`~ghofl.moments.core.Moments.class_covariance` gives it.
    """
    d = moments.dim
    n_c = float(moments.counts[c])
    if n_c < 2:  # the pooled covariance, with the warning class_covariance gives
        cov = moments.class_covariance(c, divisor, out=out)
        if center is None:
            shrink(cov, a, target, overwrite=True)  # type: ignore[arg-type]
            return
        assert center_inv is not None
        with np.errstate(over="ignore", invalid="ignore"):
            t = max(float(np.vdot(center_inv, cov)), 0.0) / d
            cov *= 1.0 - a
            cov += (a * t) * center
        return
    den = n_c - 1.0 if divisor == "n-1" else n_c
    _scatter_into(moments, c, (1.0 - a) / den, out)
    s = moments.stats.class_scatter
    if s is None:  # pragma: no cover - _scatter_into refused the mode
        return
    mu = moments.means[c]
    with np.errstate(over="ignore", invalid="ignore"):  # non-finite: refused by the caller
        if center is not None:
            if scale is None:
                assert center_inv is not None
                raw = float(np.vdot(center_inv, s[c])) - n_c * float(mu @ center_inv @ mu)
                scale = max(raw / den, 0.0) / d
            out += (a * scale) * center
            return
        tau = 1.0
        if target == "scaled_identity":
            tau = max((float(np.trace(s[c])) - n_c * float(mu @ mu)) / den, 0.0) / d
        out[np.diag_indices(d)] += a * tau


def qda_shrinkage(
    moments: Moments,
    shrinkage: Shrinkage,
    *,
    divisor: str = "n-1",
    target: QDATarget = "pooled",
    center: F64 | None = None,
    pooled_shrinkage: Shrinkage = "auto",
    within_eigvals: F64 | None = None,
) -> tuple[list[float], str]:
    """The QDA coefficients: :func:`~ghofl.moments.selection.choose_qda_shrinkage`, mostly.

    Except that the inverse-Wishart evidence rule (``"evidence"``, and ``"auto"`` on statistics
    without a held-out part) runs through :func:`qda_evidence_shrinkage`, which gives the same
    coefficient from eigenvalues alone (O(d²) memory instead of C eigenbases). ``center`` (d, d):
    the ``"pooled"`` target's centre when the caller already has it; ``within_eigvals`` (d,):
    the eigenvalues of the within-class scatter when known
    (:func:`~ghofl.moments.selection.support_basis`).
    """
    coefs, method, _ = _choose_shrinkage(
        moments, shrinkage, divisor=divisor, target=target, center=center,
        pooled_shrinkage=pooled_shrinkage, within_eigvals=within_eigvals)
    return coefs, method


def _choose_shrinkage(
    moments: Moments,
    shrinkage: Shrinkage,
    *,
    divisor: str,
    target: QDATarget,
    center: F64 | None,
    pooled_shrinkage: Shrinkage,
    within_eigvals: F64 | None,
    chol_center: F64 | None = None,
) -> tuple[list[float], str, F64 | None]:
    """:func:`qda_shrinkage`, and the scales t_c (C,) of the ``"pooled"`` target when known.

    ``chol_center``: the lower Cholesky factor of ``center``, Fortran-ordered, when the caller
    has it. The scales (for ``divisor``; NaN for a class the rule skipped) come from the
    evidence rule on the whole space (:func:`evidence_families`), else None.
    """
    rule = check_shrinkage("shrinkage", shrinkage)
    lean = rule == "evidence" or (
        rule == "auto" and ANALYTIC_DEFAULT == "evidence" and moments.stats.holdout is None
    )
    if lean:
        if target == "pooled" and center is None:
            center = pooled_center(moments, pooled_shrinkage)
        return _evidence_choice(moments, target, center, within_eigvals, chol_center, divisor)
    coefs, method = choose_qda_shrinkage(moments, shrinkage, divisor=divisor, target=target,
                                         pooled_shrinkage=pooled_shrinkage)
    return coefs, method, None


def qda_evidence_shrinkage(
    moments: Moments, target: QDATarget = "pooled", center: F64 | None = None,
    within_eigvals: F64 | None = None,
) -> tuple[list[float], str]:
    """One coefficient for every class: the maximum of the summed inverse-Wishart evidence.

    The evidence (:func:`~ghofl.moments.selection.evidence_loglik`) is summed over the
    class scatters, on the support of the data, as
    ``choose_qda_shrinkage(moments, "evidence")`` chooses it, from one symmetric eigenvalue
    computation per class (:func:`evidence_families`): every candidate's log-determinant is
    closed-form on the spectrum. ``center`` (d, d): B, required with the ``"pooled"`` target;
    ``within_eigvals`` (d,): the eigenvalues of the within-class scatter when known
    (:func:`~ghofl.moments.selection.support_basis`).

    Returns
    -------
    (list of float of length C, str)
        The coefficients (all equal) and ``"evidence"`` (``"evidence+dp-noise"`` on a
        private release, the coefficient at least the release noise's share,
        :func:`~ghofl.heads._qda_noise.noise_floor_shrinkage`; ``"single-sample"`` with every
        coefficient 1.0 when no class holds two samples).
    """
    coefs, method, _ = _evidence_choice(moments, target, center, within_eigvals)
    return coefs, method


def _evidence_choice(
    moments: Moments, target: QDATarget, center: F64 | None, within_eigvals: F64 | None,
    chol_center: F64 | None = None, divisor: str = "n-1",
) -> tuple[list[float], str, F64 | None]:
    """:func:`qda_evidence_shrinkage` and the scales of :func:`_choose_shrinkage`."""
    c_num = moments.num_classes
    usable = [c for c in range(c_num) if moments.counts[c] >= 2 and moments.class_dof(c) >= 1]
    if not usable:
        return [1.0] * c_num, "single-sample", None
    fams, scales = evidence_families(moments, usable, target, center, within_eigvals,
                                     chol_center)
    grid = [float(v) for v in np.geomspace(1e-6, 0.99, 49)]
    best = argmax_candidate(summed_evidence(fams, grid), grid)
    fine = refine_grid(best, grid)
    chosen = argmax_candidate(summed_evidence(fams, fine), fine)
    method = EVIDENCE_RULE
    floor = noise_floor_shrinkage(moments, fams, usable, target, center, within_eigvals)
    if floor is not None:  # a private release: the noise's share of the spread at least
        chosen, method = max(chosen, floor), EVIDENCE_RULE + noise_tag(moments.stats)
    if scales is not None and divisor != "n-1":  # tr(B⁻¹Σ_c) with Σ_c = S_c/N_c instead
        counts = moments.counts.astype(np.float64)
        scales = scales * (counts - 1.0) / counts
    return [chosen] * c_num, method, scales


def summed_evidence(fams: list[tuple[ShrinkageFamily, float]], cands: list[float]) -> F64:
    """Σ_c of :func:`~ghofl.moments.selection.evidence_loglik` per candidate, shape (len(cands),).

    ``fams``: per class its eigenvalue family and degrees of freedom (:func:`evidence_families`).
    """
    out = np.zeros(len(cands))
    for fam, n in fams:
        out += evidence_loglik(fam, n, cands)
    return out


def evidence_families(
    moments: Moments, usable: list[int], target: QDATarget, center: F64 | None,
    within_eigvals: F64 | None = None, chol_center: F64 | None = None,
) -> tuple[list[tuple[ShrinkageFamily, float]], F64 | None]:
    """Per class of ``usable`` the eigenvalues the evidence reads, and its degrees of freedom.

    The evidence depends on each class covariance only through its (generalised) eigenvalues,
    so they are all this computes: one symmetric eigenvalue computation per class (no
    eigenvectors), kept as C·k numbers, on the support of the data
    (:func:`~ghofl.moments.selection.support_basis`). With the ``"pooled"`` target (``center``
    B, (d, d), required) they are the eigenvalues of L⁻¹Σ_cL⁻ᵀ, B = LLᵀ (one Cholesky factor
    for all classes, ``chol_center`` when given; the reduction by LAPACK ``dsygst`` reads one
    triangle of Σ_c, written from the class sums by :func:`_scatter_into`), and the prior of
    class c is centred on t_c·B. The classes run in a thread pool with one BLAS thread each
    (:func:`~ghofl.heads._linalg.class_map`), the eigenvalues by ``numpy.linalg.eigvalsh``,
    which releases the GIL.

    Returns
    -------
    (list of (ShrinkageFamily, float), ndarray of shape (C,) or None)
        The families in the order of ``usable``; the scales t_c = tr(B⁻¹Σ_c)/d on the whole
        space (NaN outside ``usable``) when target is ``"pooled"`` and the support is the whole
        space, else None.
    """
    d = moments.dim
    support = support_basis(moments, within_eigvals)
    metric = None if support is None else support.T @ support
    chol_q = None
    if target == "pooled":
        if center is None:
            raise ValueError("the 'pooled' target needs its centre")
        if support is None and chol_center is not None:
            chol_q = chol_center
        else:
            q = center if support is None else support.T @ center @ support
            chol_q = _center_factor(0.5 * (q + q.T))
            del q

    def family(c: int) -> tuple[ShrinkageFamily, float]:
        if chol_q is not None and support is None:  # one triangle, as dsygst reads it
            p = _scatter_into(moments, c, 1.0 / (float(moments.counts[c]) - 1.0),
                              np.empty((d, d)))
            wc = _whiten(p, chol_q)
            t = max(float(np.trace(wc)), 0.0) / d
            w = np.linalg.eigvalsh(wc, UPLO="L")  # releases the GIL, unlike scipy's
        else:
            cov = moments.class_covariance(c, "n-1")
            t = max(float(np.trace(cov)), 0.0) / d if target == "scaled_identity" else 1.0
            if chol_q is not None:
                assert support is not None
                wc = _whiten(_project(cov, support), chol_q)
                t = max(float(np.trace(wc)), 0.0) / d
                w = np.linalg.eigvalsh(wc, UPLO="L")
            elif support is None:
                w = np.linalg.eigvalsh(cov, UPLO="L")
            else:
                w = eigvalsh(_project(cov, support), metric, check_finite=False)
        no_basis = np.empty((0, 0))  # the evidence reads the eigenvalues and the target only
        return (ShrinkageFamily(np.maximum(w, 0.0), no_basis, max(t, 0.0), 0.0),
                moments.class_dof(c))

    # classes in parallel, one BLAS thread each
    fams = class_map(lambda i: family(usable[i]), len(usable))
    scales = None
    if chol_q is not None and support is None:
        scales = np.full(moments.num_classes, np.nan)
        scales[usable] = [fam.target for fam, _ in fams]
    return fams, scales


def _project(cov: F64, support: F64) -> F64:
    """Vᵀ Σ V (r, r), symmetrised, for the orthonormal basis V (d, r) of the support."""
    p = support.T @ cov @ support
    out: F64 = 0.5 * (p + p.T)
    return out


def _whiten(p: F64, chol_q: F64) -> F64:
    """L⁻¹ P L⁻ᵀ (its lower triangle; the strict upper one is not meaningful), Q = L Lᵀ.

    ``p`` (d, d) symmetric, overwritten; ``chol_q`` (d, d) Fortran-ordered.

    LAPACK ``dsygst`` (the reduction of the pencil (P, Q) to standard form): d³ flops, where
    two triangular products with L⁻¹ take 2d³ and the inverse d³/3 more; called without the
    GIL (:func:`ghofl.stats.lapack.sygst`), so the classes' reductions run in parallel.
    """
    sym = p.T if p.flags.c_contiguous else np.asfortranarray(p)  # p symmetric: no copy
    info = sygst(sym, chol_q)  # in place, without the GIL
    if info != 0:  # pragma: no cover - the arguments are checked above
        raise np.linalg.LinAlgError(f"reduction to standard form failed (LAPACK info {info})")
    return sym


def whitened_sq_norms(Z: F64, mean: F64, prec: F64, out: F64,
                      block_rows: int | None = None) -> F64:
    """‖(z − μ) P‖² for every row z of ``Z``, one block of rows at a time.

    Parameters
    ----------
    Z : ndarray, shape (n, d)
    mean : ndarray, shape (d,)
    prec : ndarray, shape (d, d)
        P; when upper triangular (as fitted, P = L⁻ᵀ) the product is a triangular one
        (BLAS ``dtrmm``, half the flops of a general product), else a general one.
    out : ndarray, shape (n,)
        Receives the result.
    block_rows : int, optional
        Rows per block (default :data:`SCORE_BLOCK_ROWS`).

    Returns
    -------
    ndarray, shape (n,)
        ``out``.
    """
    n, d = Z.shape
    rows = max(1, SCORE_BLOCK_ROWS if block_rows is None else block_rows)
    buf = np.empty((min(rows, n), d))
    upper = not np.any(np.tril(prec, -1))
    lower_t = prec.T  # Fortran-ordered lower-triangular view: no copy handed to BLAS
    for s in range(0, n, rows):
        y = buf[: min(rows, n - s)]
        np.subtract(Z[s : s + rows], mean, out=y)
        if upper:
            # y P = (Pᵀ yᵀ)ᵀ; yᵀ is the Fortran-ordered view of y, overwritten in place
            res = dtrmm(1.0, lower_t, y.T, side=0, lower=1, trans_a=0, overwrite_b=1)
            if not np.shares_memory(res, y):  # pragma: no cover - BLAS wrapper made a copy
                y[...] = res.T
        else:
            y[...] = y @ prec
        np.einsum("ij,ij->i", y, y, out=out[s : s + rows])
    return out


class QDAHead(Head):
    """Quadratic discriminant analysis from per-class second moments.

    Parameters
    ----------
    shrinkage : float in [0, 1] or rule, default "auto"
        Shrinkage a of every class covariance toward its target. ``"auto"``: one coefficient
        for all classes chosen from the data: on the held-out part of the statistics when the
        clients uploaded one (a Gaussian estimate of the held-out error of the quadratic rule;
        the held-out log-likelihood above ``selection.QDA_ERROR_MAX_CLASSES`` classes), else by
        the inverse-Wishart evidence of the class moments (on a differentially private
        release raised to the release noise's share of the class covariances' spread,
        :mod:`ghofl.heads._qda_noise`); ``"heldout"``, ``"oas"``,
        ``"rblw"`` (identity targets only), ``"evidence"`` name one rule. The paper fixed
        a = 0.1 toward the scaled identity (``preset="paper"``).
    shrinkage_target : {"pooled", "scaled_identity", "identity"}, default "pooled"
        ``"pooled"``: (1 − a)Σ_c + a·t_c·B, toward the covariance B of the default LDA (the
        pooled covariance shrunk with ``pooled_shrinkage``) rescaled to the class,
        t_c = tr(B⁻¹Σ_c)/d: a = 1 is an LDA whose covariance has each class's scale, a = 0
        plain QDA (regularised discriminant analysis, Friedman 1989). ``"scaled_identity"``:
        toward tr(Σ_c)/d·I (the paper); ``"identity"``: toward I (scikit-learn's
        ``reg_param``).
    covariance_divisor : {"n-1", "n"}, default "n-1"
        Divide class scatter by N_c − 1 (unbiased, the paper) or N_c (maximum likelihood,
        scikit-learn >= 1.9 ``QuadraticDiscriminantAnalysis``).
    pooled_shrinkage : float in [0, 1] or rule, default "auto"
        Shrinkage of the pooled covariance B (target ``"pooled"`` only); ``"auto"`` is the
        default LDA's rule.

    Attributes
    ----------
    shrinkage_ : list of float, length C
        The coefficients a_c.
    shrinkage_method_ : str
        The rule that chose them: ``"evidence"``, ``"evidence+dp-noise"`` (the evidence
        knowing the noise of a private release), a named rule, or ``"fixed"``.
    """

    name = "qda"
    min_mode = "full"
    min_samples = 2
    fitted_arrays = ("means_", "precision_chol_", "half_log_det_", "log_priors_")
    fitted_scalars = ("shrinkage_", "shrinkage_method_")
    neg_inf_arrays = frozenset({"log_priors_"})
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "shrinkage": ShrinkageParam(),
        "shrinkage_target": Options(QDA_TARGETS),
        "covariance_divisor": Options(("n-1", "n")),
        "pooled_shrinkage": ShrinkageParam(),
    }

    def _fitted_shapes(self, meta: StatsMeta, scalars: dict[str, Any]) -> dict[str, Shape]:
        c, d = meta.num_classes, meta.dim
        return {"means_": (c, d), "precision_chol_": (c, d, d), "half_log_det_": (c,),
                "log_priors_": (c,)}

    def __init__(
        self,
        shrinkage: Shrinkage = "auto",
        shrinkage_target: QDATarget = "pooled",
        covariance_divisor: Literal["n-1", "n"] = "n-1",
        pooled_shrinkage: Shrinkage = "auto",
    ) -> None:
        self.shrinkage = shrinkage
        self.shrinkage_target = shrinkage_target
        self.covariance_divisor = covariance_divisor
        self.pooled_shrinkage = pooled_shrinkage

    def _check_params(self, params: dict[str, Any]) -> None:
        if params["shrinkage_target"] == "pooled" and params["shrinkage"] in ("oas", "rblw"):
            raise ConfigError(
                f"QDAHead: shrinkage {params['shrinkage']!r} is defined for a multiple of the "
                "identity as target, not the pooled covariance; set "
                "shrinkage_target='scaled_identity' with it, or use shrinkage='auto'"
            )

    def _fit(self, moments: Moments) -> None:
        p = self.params_
        self.means_ = moments.means.copy()
        with one_blas_thread():  # the per-class work runs in a thread pool (class_map)
            self.precision_chol_, self.half_log_det_, self.log_priors_, coefs, method = (
                qda_params(moments, p["shrinkage"], p["shrinkage_target"],
                           p["covariance_divisor"], p["pooled_shrinkage"]))
        self.shrinkage_ = coefs
        self.shrinkage_method_ = method

    def set_state(
        self, meta: StatsMeta, arrays: dict[str, Any], scalars: dict[str, Any]
    ) -> QDAHead:
        """Restore a fitted head.

        Files written before ``shrinkage_method_`` existed load as ``"unrecorded"``.
        """
        if isinstance(scalars, dict) and "shrinkage_method_" not in scalars:
            scalars = {**scalars, "shrinkage_method_": "unrecorded"}
        return super().set_state(meta, arrays, scalars)

    def _decision(self, Z: F64) -> F64:
        n, d = Z.shape
        c_num = self.means_.shape[0]
        out = np.empty((n, c_num))

        def score(c: int) -> None:
            col = np.empty(n)
            whitened_sq_norms(Z, self.means_[c], self.precision_chol_[c], col)
            out[:, c] = -0.5 * col - self.half_log_det_[c]

        class_map(score, c_num)  # classes in parallel, one BLAS thread each
        out += self.log_priors_ - 0.5 * d * np.log(2.0 * np.pi)
        return out
