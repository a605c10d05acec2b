"""Fisher discriminant subspace and projections into it (method.md §3, reference-notes §4).

S_W = shrink(Σ_pool, a) (plus a ridge only when it is numerically singular) and
S_B = Σ_c π_c (μ_c − m̄)(μ_c − m̄)ᵀ with m̄ = Σ_c π_c μ_c. The generalised eigenproblem
S_B v = λ S_W v (eq. F1) is solved by whitening: S_W = U diag(w) Uᵀ, W^{-1/2} = U diag(w^{-1/2}) Uᵀ,
then the eigenvectors Q of the whitened between-class scatter W^{-1/2} S_B W^{-1/2}. Because
S_B = DᵀD with the thin factor D = [√π_c (μ_c − m̄)]_c of shape (C, d), those eigenvectors are the
right singular vectors of D W^{-1/2} and λ its squared singular values; an SVD of that (C, d)
matrix replaces the (d, d) ``eigh`` (same result, O(C²d) instead of O(d³), and no spurious
null-space vectors). V = W^{-1/2} Q[:, :k_f] then satisfies Vᵀ S_W V = I and Vᵀ S_B V = diag(λ).
Features are projected uncentred, z_f = x V (row vectors), as in the paper's code.

Choice of k_f (eq. F2): the smallest k whose cumulative share of Σ λ reaches ``energy``, then
``k_f = max(min(k, cap, d), min(min_dim, d))`` with ``cap = max_dim`` or, for ``max_dim=None``,
``C − 1`` (no cap: with ``energy=1`` the subspace then holds every direction LDA uses, so LDA_f
equals x-space LDA). The paper capped k_f at 128 (``max_dim=128``; its CIFAR-10 value 16 and
CIFAR-100 value 128 both reduce to C − 1, since rank S_B ≤ C − 1, but C = 200 would lose 71
directions).

Degenerate cases (decisions):

* ``k_f`` larger than the numerical rank of S_B (C = 2 gives rank 1, so ``k_f = min_dim = 2``;
  also d < C or ``min_dim`` > C − 1): the extra directions are the S_W-orthonormal completion of
  the kept eigenvectors built from the whitened coordinate axes W^{-1/2} e_j (Gram–Schmidt, in
  order of j), with eigenvalue 0. Unlike eigenvectors of a repeated zero eigenvalue, this choice
  depends continuously on the statistics, so client partitions give the same subspace.
* all class means equal (S_B = 0 numerically): the paper's fallback ``V = first min_dim
  directions``, made S_W-orthonormal (the first ``min_dim`` columns of W^{-1/2}), with a
  :class:`~ghofl.moments.core.GhoflWarning`.
* ``d < min_dim``: ``k_f = d``.
* eigenvector signs are fixed (largest-magnitude entry of each whitened eigenvector positive).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, StatsValidationError
from ghofl.heads.lda import lda_covariance
from ghofl.moments.core import GhoflWarning, Moments
from ghofl.moments.shrinkage import Shrinkage, check_shrinkage, resolve_shrinkage, shrink

F64 = NDArray[np.float64]

#: the paper's cap on k_f (``max_dim=128``); ``max_dim=None`` means C − 1, uncapped
DEFAULT_MAX_DIM = 128


@dataclass(frozen=True, eq=False)
class FisherSubspace:
    """Result of :func:`fisher_subspace`.

    Attributes
    ----------
    V : ndarray, shape (d, k_f)
        Discriminant directions with Vᵀ S_W V = I; project with z_f = x V.
    eigenvalues : ndarray, shape (k_f,)
        Generalised eigenvalues λ of the kept directions, descending (0 for completion
        directions).
    spectrum : ndarray, shape (min(C, d),)
        All generalised eigenvalues λ (numerically zero ones set to 0), descending.
    k_f : int
        Number of kept directions.
    within : ndarray, shape (d, d)
        The S_W used (shrunk pooled covariance, plus ``ridge`` on the diagonal).
    shrinkage : float
        Shrinkage coefficient a used for S_W.
    ridge : float
        Diagonal ridge added to S_W (0 unless it was numerically singular).
    rank : int
        Numerical rank of S_B (number of non-zero λ).
    degenerate : bool
        True when S_B = 0 (all class means equal) and the fallback directions were used.
    """

    V: F64
    eigenvalues: F64
    spectrum: F64
    k_f: int
    within: F64
    shrinkage: float
    ridge: float
    rank: int
    degenerate: bool


def check_fisher_params(energy: object, max_dim: object, min_dim: object, owner: str) -> None:
    """Validate the Fisher hyperparameters; :class:`ConfigError` names the offending one."""
    check_number(owner, "fisher_energy", energy, lo=0.0, hi=1.0, lo_open=True)
    if max_dim is not None:
        check_int(owner, "fisher_max_dim", max_dim, lo=1, none_ok=True)
    check_int(owner, "fisher_min_dim", min_dim, lo=1)


def fisher_subspace(
    moments: Moments,
    shrinkage: Shrinkage = 0.05,
    energy: float = 0.995,
    max_dim: int | None = None,
    min_dim: int = 2,
) -> FisherSubspace:
    """Fisher discriminant directions from pooled moments (eqs. F1–F2 in the module docstring).

    Parameters
    ----------
    moments : Moments
        Needs the pooled within-class covariance (upload mode ``pooled`` or ``full``).
    shrinkage : float in [0, 1] or "auto", default 0.05
        S_W = (1 − a) Σ_pool + a·tr(Σ_pool)/d·I (paper: ``lda_shrink``); ``"auto"`` = OAS.
    energy : float in (0, 1], default 0.995
        Cumulative share of Σ λ to keep (paper: ``fisher_energy``).
    max_dim : int or None, default None
        Cap on k_f; None means C − 1 (the paper: 128).
    min_dim : int, default 2
        Lower bound on k_f (clipped to d).

    Returns
    -------
    FisherSubspace
    """
    check_fisher_params(energy, max_dim, min_dim, "fisher_subspace")
    shrinkage = check_shrinkage("fisher_shrinkage", shrinkage)
    c_num, d = moments.num_classes, moments.dim
    s_w, a = lda_covariance(moments, shrinkage)
    s_w, w_eig, w_vec, ridge = _regularised_eigh(s_w)
    inv_sqrt = w_eig**-0.5

    def whiten_rows(m: F64) -> F64:
        """Rows times W^{-1/2}: (m U) diag(w^{-1/2}) Uᵀ."""
        out: F64 = ((m @ w_vec) * inv_sqrt) @ w_vec.T
        return out

    centred = (moments.means - moments.global_mean) * np.sqrt(moments.priors)[:, None]
    _, sing, q_t = np.linalg.svd(whiten_rows(centred), full_matrices=False)
    scale = max(float(sing[0]) if sing.size else 0.0,
                float(np.max(np.linalg.norm(whiten_rows(moments.means), axis=1))))
    tol = max(c_num, d) * np.finfo(float).eps
    degenerate = bool(sing.size == 0 or float(sing[0]) <= tol * scale)
    rank = 0 if degenerate else int(np.sum(sing > tol * float(sing[0])))
    spectrum = np.where(np.arange(sing.size) < rank, sing**2, 0.0)
    if degenerate:
        warnings.warn(
            "all class means coincide (between-class scatter S_B = 0): the Fisher subspace is "
            f"undefined, using the first {min(min_dim, d)} whitened coordinate directions instead",
            GhoflWarning,
            stacklevel=2,
        )
    k_f = _choose_dim(spectrum[:rank], energy, max_dim, min_dim, c_num, d)
    q = _fix_signs(q_t[: min(rank, k_f)].T)
    q = _complete_basis(q, k_f)
    V = (w_vec * inv_sqrt) @ (w_vec.T @ q)
    eig = np.concatenate([spectrum[: min(rank, k_f)], np.zeros(k_f - min(rank, k_f))])
    return FisherSubspace(V=V, eigenvalues=eig, spectrum=spectrum, k_f=k_f, within=s_w,
                          shrinkage=a, ridge=ridge, rank=rank, degenerate=degenerate)


def default_max_dim(num_classes: int) -> int:
    """The cap used when ``max_dim`` is None: C − 1, at least 1."""
    return max(1, num_classes - 1)


def _choose_dim(lam: F64, energy: float, max_dim: int | None, min_dim: int, c_num: int,
                d: int) -> int:
    """k_f from the non-zero eigenvalues ``lam`` (descending) by eq. F2."""
    cap = default_max_dim(c_num) if max_dim is None else int(max_dim)
    k = 0
    if lam.size:
        cum = np.cumsum(lam)
        k = min(int(np.searchsorted(cum, energy * cum[-1], side="left")) + 1, lam.size)
    return max(min(k, cap, d), min(int(min_dim), d))


def _regularised_eigh(s_w: F64) -> tuple[F64, F64, F64, float]:
    """Eigen-decomposition of S_W, adding a ridge when its smallest eigenvalue is ≤ 1e-10·mean.

    Returns ``(S_W used, eigenvalues (d,), eigenvectors (d, d), ridge)``.
    """
    w_eig, w_vec = np.linalg.eigh(s_w)
    mean = float(np.mean(w_eig))
    if not mean > 0.0:
        raise StatsValidationError(
            "the pooled within-class covariance is zero (every class is a single point), so "
            "no Fisher subspace exists; check that the embeddings are not constant"
        )
    ridge = 0.0
    if float(w_eig[0]) <= 1e-10 * mean:
        ridge = 1e-6 * mean - min(float(w_eig[0]), 0.0)
        warnings.warn(
            f"the within-class scatter S_W is singular; added a ridge of {ridge:.3g} to its "
            "diagonal (use fisher shrinkage > 0 to avoid this)",
            GhoflWarning,
            stacklevel=3,
        )
        s_w = s_w + ridge * np.eye(s_w.shape[0])
        w_eig = w_eig + ridge
    return s_w, w_eig, w_vec, ridge


def _fix_signs(q: F64) -> F64:
    """Flip columns so that each one's largest-magnitude entry is positive."""
    if q.shape[1] == 0:
        return q
    idx = np.argmax(np.abs(q), axis=0)
    signs = np.sign(q[idx, np.arange(q.shape[1])])
    signs[signs == 0] = 1.0
    out: F64 = q * signs
    return out


def _complete_basis(q: F64, k: int) -> F64:
    """Extend orthonormal columns ``q`` (d, r) to ``k`` by Gram–Schmidt on e_0, e_1, ... in turn."""
    d = q.shape[0]
    cols = [q[:, j] for j in range(q.shape[1])]
    for j in range(d):
        if len(cols) >= k:
            break
        v = np.zeros(d)
        v[j] = 1.0
        for _ in range(2):  # re-orthogonalise once for stability
            for u in cols:
                v = v - (u @ v) * u
        norm = float(np.linalg.norm(v))
        if norm > 1e-6:
            cols.append(v / norm)
    return np.stack(cols, axis=1) if cols else np.zeros((d, 0))


# ---------------------------------------------------------------------- projections
def project(X: F64, V: F64) -> F64:
    """z_f = X V: rows of X (n, d) into the Fisher space (n, k_f), uncentred."""
    out: F64 = X @ V
    return out


def project_covariance(cov: F64, V: F64) -> F64:
    """Vᵀ Σ V, shape (k_f, k_f), symmetrised."""
    p = V.T @ cov @ V
    out: F64 = 0.5 * (p + p.T)
    return out


def fisher_pooled_covariance(moments: Moments, V: F64, shrinkage: Shrinkage) -> F64:
    """Vᵀ shrink(Σ_pool, a) V, shape (k_f, k_f) (equals I when a is the Fisher shrinkage)."""
    cov, _ = lda_covariance(moments, shrinkage)
    return project_covariance(cov, V)


def fisher_class_covariances(moments: Moments, V: F64, shrinkage: Shrinkage) -> F64:
    """Σ̃_cᶠ = Vᵀ shrink(Σ_c, a_c) V for every class, shape (C, k_f, k_f); needs mode ``full``.

    For a fixed coefficient a the projection is taken from the sums directly (eq. F3)::

        Vᵀ Σ_c V = (Vᵀ S_c V − N_c μ_cᶠ μ_cᶠᵀ)/(N_c − 1),   tr Σ_c = (tr S_c − N_c ‖μ_c‖²)/(N_c − 1)
        Vᵀ shrink(Σ_c, a) V = (1 − a) Vᵀ Σ_c V + a·max(tr Σ_c, 0)/d · VᵀV

    with S_c V computed for blocks of classes in one matrix product (memory ≈ 64 MB per
    block). A named rule (``"auto"``, ``"oas"``, …) picks a_c per class with
    :func:`class_coefficient` (judged on the projected covariance Vᵀ shrink(Σ_c, a) V, the one
    actually used). Classes with N_c = 1 (pooled covariance, with a warning, see
    :meth:`Moments.class_covariance`) take the explicit d × d path.
    """
    scatter = moments.stats.class_scatter
    if scatter is None:
        moments.class_covariance(0)  # raises UnsupportedModeError with the standard message
        raise AssertionError("unreachable")  # pragma: no cover
    c_num, d, k = moments.num_classes, moments.dim, V.shape[1]
    counts = moments.counts
    gram = V.T @ V
    means_f = moments.means @ V
    out = np.empty((c_num, k, k))
    block = max(1, 2**23 // max(d * k, 1))
    for start in range(0, c_num, block):
        rows = scatter[start:start + block]
        sv = (rows.reshape(-1, d) @ V).reshape(rows.shape[0], d, k)  # one GEMM per block
        out[start:start + block] = np.swapaxes(sv, 1, 2) @ V
    fast_rule = _fast_rule(moments, shrinkage)
    for c in range(c_num):
        n_c = int(counts[c])
        if n_c < 2:
            cov = moments.class_covariance(c)
            a = resolve_shrinkage(shrinkage, cov * (n_c - 1) / max(n_c, 1), n_c)
            out[c] = project_covariance(shrink(cov, a), V)
            continue
        proj = (out[c] - n_c * np.outer(means_f[c], means_f[c])) / (n_c - 1)
        proj = 0.5 * (proj + proj.T)
        trace = (float(np.trace(scatter[c])) - n_c * float(moments.means[c] @ moments.means[c]))
        tau = max(trace / (n_c - 1), 0.0) / d
        if fast_rule:
            from ghofl.moments.selection import evidence_shrinkage

            a = evidence_shrinkage(proj, float(n_c - 1), metric=gram, target=tau)
        else:
            a = class_coefficient(moments, c, shrinkage, V)
        mixed = (1.0 - a) * proj + (a * tau) * gram
        out[c] = 0.5 * (mixed + mixed.T)
    return out


def _fast_rule(moments: Moments, shrinkage: Shrinkage) -> bool:
    """Whether a class coefficient can be chosen from the projected covariance alone.

    True for ``"evidence"``, and for ``"auto"`` when the statistics carry no held-out part
    (``"auto"`` then means the analytic default, the evidence rule): the evidence judged on
    Vᵀ Σ_c V with metric VᵀV is what :func:`class_coefficient` computes, without forming the
    d × d class covariance (C·d² work saved; minutes at C = 200, d = 1280).
    """
    if not isinstance(shrinkage, str):
        return False
    from ghofl.moments.selection import holdout_parts
    from ghofl.moments.shrinkage import ANALYTIC_DEFAULT

    if shrinkage == "evidence":
        return True
    return (shrinkage == "auto" and ANALYTIC_DEFAULT == "evidence"
            and holdout_parts(moments) is None)


def class_coefficient(moments: Moments, c: int, shrinkage: Shrinkage, V: F64) -> float:
    """a_c for shrink(Σ_c, a_c) of class c as used in the Fisher space with directions V (d, k).

    A number is returned as given; a rule (``"auto"`` and the named ones) is resolved by
    :func:`ghofl.moments.selection.choose_class_shrinkage` with ``basis=V``, i.e. judged on
    Vᵀ shrink(Σ_c, a) V: in the few Fisher directions a class covariance is estimated from many
    samples per dimension and needs far less shrinkage than in the d-space.
    """
    if not isinstance(shrinkage, str):
        return float(shrinkage)
    from ghofl.moments.selection import choose_class_shrinkage

    return float(choose_class_shrinkage(moments, c, shrinkage, basis=V).value)


# ---------------------------------------------------------------------- parameter checks
def check_number(owner: str, name: str, value: object, *, lo: float | None = None,
                 hi: float | None = None, lo_open: bool = False, hi_open: bool = False) -> float:
    """A real number within [lo, hi] (open ends as flagged); :class:`ConfigError` otherwise."""
    left = "(" if lo_open else "["
    right = ")" if hi_open else "]"
    low = "-inf" if lo is None else lo
    high = "inf" if hi is None else hi
    allowed = f"a number in {left}{low}, {high}{right}"
    ok = isinstance(value, int | float | np.floating) and not isinstance(value, bool)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = bool(np.isfinite(v))
        if lo is not None:
            ok = ok and (v > lo if lo_open else v >= lo)
        if hi is not None:
            ok = ok and (v < hi if hi_open else v <= hi)
    if not ok:
        raise ConfigError(f"{owner}: parameter {name!r} must be {allowed}; got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_int(owner: str, name: str, value: object, *, lo: int = 0, none_ok: bool = False) -> None:
    """An integer ≥ lo (or None when ``none_ok``); :class:`ConfigError` otherwise."""
    if none_ok and value is None:
        return
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= lo
    if not ok:
        extra = " or None" if none_ok else ""
        raise ConfigError(
            f"{owner}: parameter {name!r} must be an integer >= {lo}{extra}; got {value!r}"
        )


def check_choice(owner: str, name: str, value: object, choices: tuple[object, ...]) -> None:
    """One of ``choices``; :class:`ConfigError` listing them otherwise."""
    if isinstance(value, bool) != any(isinstance(c, bool) for c in choices) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"{owner}: parameter {name!r} must be one of {allowed}; got {value!r}")


__all__ = [
    "DEFAULT_MAX_DIM",
    "FisherSubspace",
    "check_choice",
    "check_fisher_params",
    "check_int",
    "check_number",
    "class_coefficient",
    "default_max_dim",
    "fisher_class_covariances",
    "fisher_pooled_covariance",
    "fisher_subspace",
    "project",
    "project_covariance",
]
