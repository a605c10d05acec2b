"""Proto-Hyper: NB_f base plus a low-rank residual, distilled from a Fisher-space teacher.

Model (reference-notes §7.1, eq. P1): on z = z_f = x V,

    student(z) = NB_f(z) + ((z − ō) U₁ᵀ) V₂ᵀ + b,   U₁ ∈ R^{r×k_f}, V₂ ∈ R^{C×r}, b ∈ R^C
    NB_f(z)_c  = log π_c − ‖z − μ_cᶠ‖²/(2σ²) − (k_f/2) log σ²,   σ² = tr(Vᵀ S_W V)/k_f

(the paper's spherical Gaussian base, kept unstandardised; ō = 0 as in the paper unless
``center=True``, then the balanced mean of μ_cᶠ), trained on synthetic samples with
(eq. P2)

    L = α T² KL(softmax(teacher/T) ‖ softmax(student/T)) + (1 − α) CE(student, y)

(batch-mean KL, teacher fixed). Inference uses the student only, in numpy.

Rank: ``r = min(rank, k_f − 1)`` (default ``rank=16``; ``None`` → k_f − 1), at least 1, so the
residual is truly low-rank (r < k_f); the paper's ``r = min(ph_rank, k_f)`` is full rank at its
defaults.

Memory: the fixed set keeps z (C·n, k_f) and the targets [teacher log-probabilities | NB_f]
(C·n, 2C) in float64, ≈ 1 GB for C = 100, n = 4000.

Teachers (eq. P3), with LDA_f(z)_c = z Σᶠ⁻¹ μ_cᶠ − ½ μ_cᶠᵀ Σᶠ⁻¹ μ_cᶠ + log π_c,
Σᶠ = Vᵀ S_W V, QDA_f from Σ̃_cᶠ = Vᵀ shrink(Σ_c, ``qda_shrinkage``) V, and the row-wise
standardisation std(L) = (L − mean_c L)/(std_c L + 1e-6) (population std, as b7d6a00):

* ``"informative"`` (default), statistics mode ``full``:
  s(z)·[λ·std(QDA_f) + (1 − λ)·std(LDA_f)], λ = ``teacher_blend`` (default 0.5, the QDA
  weight); ``teacher_used_ = "qda_lda"``. The standardisation puts QDA_f and LDA_f on one
  scale for blending (b7d6a00). s(z) is the row std of NB_f(z) (``teacher_scale="base"``):
  b7d6a00 also standardised its base, but ours is the paper's unstandardised NB_f, and a
  unit-std teacher at T = 4 is almost uniform, so KD then fights CE (measured on C = 10,
  d = 32 Gaussian data: 87.6 % vs 99.7 % for LDA). ``teacher_scale="unit"`` keeps s = 1.
* ``"informative"`` with mode ``pooled`` (no class covariances, so no QDA_f): s(z)·std(LDA_f);
  ``teacher_used_ = "lda"``. Since NB_f = LDA_f − ½‖z‖² + const here, this equals the base up
  to a per-row constant (softmax-identical, like the paper teacher) with ``teacher_scale=
  "base"``: KD does nothing and training is effectively CE. It is a documented fallback, not an
  informative teacher; use mode ``full`` for the QDA_f blend.
* ``"paper"``: the HEAD code, λ·LDA_f + (1 − λ)·NB_f unstandardised with λ = ``teacher_blend``
  (default 0.7, the LDA weight); ``teacher_used_ = "paper"``. Since V whitens S_W, σ² = 1 and
  NB_f = LDA_f − ½‖z‖² + const, so this teacher differs from the base by a per-row constant:
  its softmax equals the base's and the KD term only pulls the residual toward a row constant
  (KL(teacher‖base) ≈ 0, recorded as ``teacher_base_kl_``).

``teacher_base_kl_`` is the mean KL(softmax(teacher/T) ‖ softmax(NB_f/T)) on a diagnostic
synthetic sample (min(n_per_class, 128) per class, its own seeded stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import log_softmax

from ghofl.heads._linalg import linear_discriminant, safe_log, stable_cholesky
from ghofl.heads._training import (
    F64,
    FisherTrainedHead,
    check_owned_shrinkage,
    run_training,
    uniform_init,
)
from ghofl.heads.base import scalar_int, scalar_positive
from ghofl.heads.fisher import (
    FisherSubspace,
    check_choice,
    check_int,
    check_number,
    fisher_class_covariances,
    project_covariance,
)
from ghofl.heads.synthesis import FisherGaussians, sample_fixed
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import Shrinkage
from ghofl.stats.meta import StatsMeta

if TYPE_CHECKING:
    import torch

TeacherKind = Literal["informative", "paper"]
TeacherScale = Literal["base", "unit"]
#: rows scored at once by the numpy scorers (bounds temporary memory)
SCORE_CHUNK = 32768


# ---------------------------------------------------------------------- Fisher-space scorers
@dataclass(frozen=True, eq=False)
class FisherScorers:
    """Closed-form Gaussian classifiers in the Fisher space.

    Attributes
    ----------
    means : (C, k_f)
        μ_cᶠ.
    log_priors : (C,)
    sigma2 : float
        σ² = tr(Σᶠ)/k_f of NB_f.
    lda_coef : (C, k_f)
        Σᶠ⁻¹ μ_cᶠ rows.
    lda_intercept : (C,)
    qda_prec : (C, k_f, k_f) or None
        P_c = L_c⁻ᵀ with Σ̃_cᶠ = L_c L_cᵀ (None without class covariances).
    qda_half_logdet : (C,) or None
    """

    means: F64
    log_priors: F64
    sigma2: float
    lda_coef: F64
    lda_intercept: F64
    qda_prec: F64 | None
    qda_half_logdet: F64 | None


def fisher_scorers(moments: Moments, V: F64, within: F64,
                   qda_shrinkage: Shrinkage | None) -> FisherScorers:
    """NB_f, LDA_f and (when ``qda_shrinkage`` is given) QDA_f parameters (eq. P1, P3).

    Parameters
    ----------
    moments : Moments
    V : (d, k_f)
    within : (d, d)
        The S_W of the Fisher subspace; Σᶠ = Vᵀ S_W V.
    qda_shrinkage : float, "auto" or None
        None skips QDA_f; otherwise the statistics must be mode ``full``.
    """
    means_f = moments.means @ V
    cov_f = project_covariance(within, V)
    log_priors = safe_log(moments.priors)
    coef, intercept, _ = linear_discriminant(means_f, cov_f, log_priors,
                                             "the Fisher-space pooled covariance")
    prec = half = None
    if qda_shrinkage is not None:
        covs = fisher_class_covariances(moments, V, qda_shrinkage)
        k = V.shape[1]
        prec, half = np.empty_like(covs), np.empty(covs.shape[0])
        for c in range(covs.shape[0]):
            L, _ = stable_cholesky(covs[c], f"the Fisher-space QDA covariance of class {c}")
            prec[c] = solve_triangular(L, np.eye(k), lower=True, check_finite=False).T
            half[c] = float(np.sum(np.log(np.diag(L))))
    return FisherScorers(means_f, log_priors, float(np.trace(cov_f)) / V.shape[1], coef,
                         intercept, prec, half)


def nb_f_logits(z: F64, means: F64, sigma2: float, log_priors: F64) -> F64:
    """NB_f(z) (n, C) of eq. P1: log π_c − ‖z − μ_c‖²/(2σ²) − (k/2) log σ²."""
    sq = (np.sum(z**2, axis=1)[:, None] - 2.0 * z @ means.T + np.sum(means**2, axis=1))
    out: F64 = log_priors - 0.5 * sq / sigma2 - 0.5 * means.shape[1] * np.log(sigma2)
    return out


def lda_f_logits(sc: FisherScorers, z: F64) -> F64:
    """LDA_f(z) (n, C): z Σᶠ⁻¹ μ_c − ½ μ_cᵀ Σᶠ⁻¹ μ_c + log π_c."""
    out: F64 = z @ sc.lda_coef.T + sc.lda_intercept
    return out


def qda_f_logits(sc: FisherScorers, z: F64) -> F64:
    """QDA_f(z) (n, C): log π_c − ½‖z P_c − μ_c P_c‖² − ½ log det Σ̃_cᶠ.

    z P_c for all classes is one matrix product with the concatenated P (k_f, C·k_f), in
    row blocks of ≈ 64 MB.
    """
    if sc.qda_prec is None or sc.qda_half_logdet is None:
        raise ValueError("these scorers were built without QDA_f (qda_shrinkage=None)")
    c_num, k = sc.means.shape
    p_cat = np.ascontiguousarray(np.swapaxes(sc.qda_prec, 0, 1).reshape(k, c_num * k))
    shift = np.einsum("ck,ckl->cl", sc.means, sc.qda_prec).reshape(-1)
    out = np.empty((z.shape[0], c_num))
    rows = max(1, 2**23 // (c_num * k))
    for s in range(0, z.shape[0], rows):
        u = z[s:s + rows] @ p_cat
        u -= shift
        u *= u
        out[s:s + rows] = u.reshape(-1, c_num, k).sum(axis=2)
    res: F64 = sc.log_priors - sc.qda_half_logdet - 0.5 * out
    return res


def standardise(logits: F64, eps: float = 1e-6) -> F64:
    """Row-wise (L − mean)/(std + eps), population std (the b7d6a00 teacher)."""
    centred = logits - logits.mean(axis=1, keepdims=True)
    out: F64 = centred / (centred.std(axis=1, keepdims=True) + eps)
    return out


def teacher_logits(sc: FisherScorers, z: F64, teacher: TeacherKind, blend: float,
                   scale: TeacherScale = "base") -> F64:
    """Teacher logits (n, C) of eq. P3 (see the module docstring), in chunks of rows.

    ``scale`` applies to the informative teacher only: ``"base"`` multiplies each standardised
    row by the row std of NB_f(z), ``"unit"`` leaves it standardised (b7d6a00).
    """
    out = np.empty((z.shape[0], sc.means.shape[0]))
    for s in range(0, z.shape[0], SCORE_CHUNK):
        zz = z[s:s + SCORE_CHUNK]
        lda = lda_f_logits(sc, zz)
        if teacher == "paper":
            nb = nb_f_logits(zz, sc.means, sc.sigma2, sc.log_priors)
            out[s:s + SCORE_CHUNK] = blend * lda + (1.0 - blend) * nb
            continue
        if sc.qda_prec is None:
            t = standardise(lda)
        else:
            t = blend * standardise(qda_f_logits(sc, zz)) + (1.0 - blend) * standardise(lda)
        if scale == "base":
            t = t * nb_f_logits(zz, sc.means, sc.sigma2, sc.log_priors).std(axis=1, keepdims=True)
        out[s:s + SCORE_CHUNK] = t
    return out


def mean_kl(p_logits: F64, q_logits: F64, temperature: float) -> float:
    """Mean over rows of KL(softmax(p/T) ‖ softmax(q/T))."""
    lp = log_softmax(p_logits / temperature, axis=1)
    lq = log_softmax(q_logits / temperature, axis=1)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=1)))


def effective_rank(rank: int | None, k_f: int) -> int:
    """r = min(rank, k_f − 1) (rank None → k_f − 1), at least 1."""
    cap = k_f - 1 if rank is None else min(int(rank), k_f - 1)
    return max(1, cap)


# ---------------------------------------------------------------------- the head
class ProtoHyperHead(FisherTrainedHead):
    """NB_f plus a rank-r residual distilled from a Fisher-space teacher (eqs. P1–P3).

    Parameters
    ----------
    rank : int or None, default 16
        Residual rank cap (paper ``ph_rank``: 16 for CIFAR-10, 128 for CIFAR-100);
        r = min(rank, k_f − 1) ≥ 1, None → k_f − 1. The paper's r = min(ph_rank, k_f) is
        k_f at its defaults, i.e. not low-rank.
    teacher : {"informative", "paper"}, default "informative"
        See the module docstring: "paper" is softmax-identical to the base, so its KD term
        does nothing.
    teacher_blend : float in [0, 1] or None, default None
        λ of the teacher blend: the QDA_f weight for "informative" (None → 0.5), the LDA_f
        weight for "paper" (None → 0.7, the paper's ``teacher_blend``).
    teacher_scale : {"base", "unit"}, default "base"
        Row scale of the informative teacher: "base" rescales each standardised row to the
        row std of NB_f (see the module docstring), "unit" keeps it standardised (b7d6a00;
        ablation only: with the unstandardised NB_f base it hurts accuracy).
    qda_shrinkage : float in [0, 1] or "auto", default 0.1
        Shrinkage of Σ_c for QDA_f (paper ``qda_shrink``).
    kd_alpha : float in [0, 1], default 0.4
        α of eq. P2.
    kd_temperature : float > 0, default 4.0
        T of eq. P2.
    lr, weight_decay, batch_size, epochs : default 1e-3, 5e-4, 1024, 40
        AdamW settings (paper ``ph_*``).
    fisher_shrinkage, fisher_energy, fisher_max_dim, fisher_min_dim, tau, n_per_class,
    syn_shrink, syn_class_cov, fresh_samples, center, seed, num_threads, progress
        As :class:`~ghofl.heads.fishermix.FisherMixHead` (same defaults).

    Fitted attributes
    -----------------
    V_ : (d, k_f); offset_ : (k_f,); means_f_ : (C, k_f); log_priors_ : (C,);
    U_ : (r, k_f); W2_ : (C, r); b_ : (C,) (initialised like ``nn.Linear``, as the paper);
    sigma2_, rank_, teacher_used_, teacher_blend_ (λ used), teacher_base_kl_,
    k_f_, fisher_shrinkage_, fisher_ridge_, syn_covariance_, final_loss_, fit_seconds_.

    Notes
    -----
    With ``fresh_samples=True`` the teacher is re-evaluated on every batch; QDA_f costs
    O(n·C·k_f²), which dominates the run time for C = 100.
    """

    name = "protohyper"
    fitted_arrays = ("V_", "offset_", "means_f_", "log_priors_", "U_", "W2_", "b_")
    fitted_scalars = ("sigma2_", "rank_", "teacher_used_", "teacher_blend_", "teacher_base_kl_",
                      "k_f_", "fisher_shrinkage_", "fisher_ridge_", "syn_covariance_",
                      "final_loss_", "fit_seconds_")
    neg_inf_arrays = frozenset({"log_priors_"})

    def _fitted_shapes(
        self, meta: StatsMeta, scalars: dict[str, Any]
    ) -> dict[str, tuple[int, ...]]:
        owner = type(self).__name__
        c, d = meta.num_classes, meta.dim
        k = scalar_int(owner, scalars, "k_f_", 1, d)
        r = scalar_int(owner, scalars, "rank_", 1, k)
        scalar_positive(owner, scalars, "sigma2_")
        return {"V_": (d, k), "offset_": (k,), "means_f_": (c, k), "log_priors_": (c,),
                "U_": (r, k), "W2_": (c, r), "b_": (c,)}

    rank: int | None
    teacher: TeacherKind
    teacher_blend: float | None
    teacher_scale: TeacherScale
    qda_shrinkage: Shrinkage
    kd_alpha: float
    kd_temperature: float

    def __init__(
        self,
        rank: int | None = 16,
        teacher: TeacherKind = "informative",
        teacher_blend: float | None = None,
        teacher_scale: TeacherScale = "base",
        qda_shrinkage: Shrinkage = 0.1,
        kd_alpha: float = 0.4,
        kd_temperature: float = 4.0,
        fisher_shrinkage: Shrinkage = 0.05,
        fisher_energy: float = 0.995,
        fisher_max_dim: int | None = None,
        fisher_min_dim: int = 2,
        tau: float = 0.9,
        n_per_class: int = 4000,
        syn_shrink: Shrinkage = 0.05,
        syn_class_cov: bool = True,
        fresh_samples: bool = False,
        center: bool = False,
        lr: float = 1e-3,
        weight_decay: float = 5e-4,
        batch_size: int = 1024,
        epochs: int = 40,
        seed: int = 0,
        num_threads: int | None = 1,
        progress: bool = False,
    ) -> None:
        self._store_init_args(locals())

    def _validate_params(self) -> None:
        super()._validate_params()
        owner = type(self).__name__
        check_int(owner, "rank", self.rank, lo=1, none_ok=True)
        check_choice(owner, "teacher", self.teacher, ("informative", "paper"))
        if self.teacher_blend is not None:
            check_number(owner, "teacher_blend", self.teacher_blend, lo=0.0, hi=1.0)
        check_choice(owner, "teacher_scale", self.teacher_scale, ("base", "unit"))
        self.qda_shrinkage = check_owned_shrinkage(owner, "qda_shrinkage", self.qda_shrinkage)
        check_number(owner, "kd_alpha", self.kd_alpha, lo=0.0, hi=1.0)
        check_number(owner, "kd_temperature", self.kd_temperature, lo=0.0, lo_open=True)

    def _blend(self) -> float:
        if self.teacher_blend is not None:
            return float(self.teacher_blend)
        return 0.7 if self.teacher == "paper" else 0.5

    def _train(self, moments: Moments, fs: FisherSubspace, g: FisherGaussians) -> None:
        use_qda = self.teacher == "informative" and moments.has_class_covariances
        with self._timed("teacher"):
            sc = fisher_scorers(moments, fs.V, fs.within,
                                self.qda_shrinkage if use_qda else None)
        self.means_f_, self.log_priors_, self.sigma2_ = sc.means, sc.log_priors, sc.sigma2
        self.teacher_used_ = "paper" if self.teacher == "paper" else (
            "qda_lda" if use_qda else "lda")
        self.rank_ = effective_rank(self.rank, fs.k_f)
        self.teacher_blend_ = self._blend()
        with self._timed("teacher"):
            self.teacher_base_kl_ = self._diagnostic_kl(sc, g)
        self._train_student(sc, g)

    def _diagnostic_kl(self, sc: FisherScorers, g: FisherGaussians) -> float:
        z, _ = sample_fixed(g, min(int(self.n_per_class), 128), self._rngs()[2])
        base = nb_f_logits(z, sc.means, sc.sigma2, sc.log_priors)
        teach = teacher_logits(sc, z, self.teacher, self._blend(), self.teacher_scale)
        return mean_kl(teach, base, float(self.kd_temperature))

    def _train_student(self, sc: FisherScorers, g: FisherGaussians) -> None:
        import torch
        import torch.nn.functional as F

        c_num, k, r = g.num_classes, g.dim, self.rank_
        T, alpha = float(self.kd_temperature), float(self.kd_alpha)
        blend, scale = self._blend(), self.teacher_scale

        def targets(z: F64) -> F64:
            """[log softmax(teacher/T) | NB_f] per row, (n, 2C): the fixed inputs of eq. P2."""
            t_logp = log_softmax(teacher_logits(sc, z, self.teacher, blend, scale) / T, axis=1)
            out: F64 = np.concatenate(
                [t_logp, nb_f_logits(z, sc.means, sc.sigma2, sc.log_priors)], axis=1)
            return out

        gen = torch.Generator().manual_seed(int(self.seed))
        U = uniform_init((r, k), 1.0 / np.sqrt(k), gen)
        W2 = uniform_init((c_num, r), 1.0 / np.sqrt(r), gen)
        b = uniform_init((c_num,), 1.0 / np.sqrt(r), gen)
        self.offset_ = self._offset(g)
        offset = torch.from_numpy(self.offset_)

        def loss_fn(z: torch.Tensor, y: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
            assert extra is not None
            t_logp, base = extra[:, :c_num], extra[:, c_num:]
            student = base + ((z - offset) @ U.T) @ W2.T + b
            s_logp = F.log_softmax(student / T, dim=1)
            kl = (t_logp.exp() * (t_logp - s_logp)).sum(1).mean()
            return alpha * T * T * kl + (1.0 - alpha) * F.cross_entropy(student, y)

        self.final_loss_ = run_training([U, W2, b], loss_fn, self._epoch_source(g, targets),
                                        self._train_config())
        self.U_ = U.detach().numpy().copy()
        self.W2_ = W2.detach().numpy().copy()
        self.b_ = b.detach().numpy().copy()

    def _decision(self, Z: F64) -> F64:
        """Student logits (n, C) of eq. P1 on z_f = Z V_, in numpy float64."""
        z = Z @ self.V_
        base = nb_f_logits(z, self.means_f_, float(self.sigma2_), self.log_priors_)
        out: F64 = base + ((z - self.offset_) @ self.U_.T) @ self.W2_.T + self.b_
        return out


__all__ = [
    "FisherScorers",
    "ProtoHyperHead",
    "effective_rank",
    "fisher_scorers",
    "lda_f_logits",
    "mean_kl",
    "nb_f_logits",
    "qda_f_logits",
    "standardise",
    "teacher_logits",
]
