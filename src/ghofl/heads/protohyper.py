"""Proto-Hyper: a closed-form Fisher-space base plus a low-rank residual, distilled from a teacher.

Model (reference-notes §7.1, eq. P1): on z = z_f = x V,

    student(z) = base(z) + ((z − ō) U₁ᵀ) V₂ᵀ + b,   U₁ ∈ R^{r×k_f}, V₂ ∈ R^{C×r}, b ∈ R^C
    NB_f(z)_c  = log π_c − ‖z − μ_cᶠ‖²/(2σ²) − (k_f/2) log σ²,   σ² = tr(Vᵀ S_W V)/k_f

Base (``base``): the paper's spherical NB_f, which, since V whitens S_W (Σᶠ = I, σ² = 1),
equals LDA_f up to a per-row constant, i.e. the LDA head itself when the Fisher subspace keeps
every LDA direction (the defaults) — ``"lda"``; or QDA_f, the Gaussian classifier with one
covariance per class in the Fisher space (mode ``full``) — ``"qda"``. ``"lda"`` is the
default; ``"auto"`` takes QDA_f in mode ``full`` when it beats LDA_f significantly on held-out
synthetic samples (:func:`choose_base`), else LDA_f (biased toward QDA_f, whose Gaussians the
synthetic samples come from; see the ``base`` parameter). The
residual starts at zero (``residual_init="zero"``: V₂ = 0, b = 0; the paper initialises it
like ``nn.Linear``), so training starts exactly at the base, and the checkpoint kept is chosen
on held-out synthetic samples (see :class:`~ghofl.heads._training.FisherTrainedHead`): the
fitted head is never less accurate than its base there. ō = 0 as in the paper unless
``center=True``, then the balanced mean of μ_cᶠ. Training uses synthetic samples with
(eq. P2)

    L = α T² KL(softmax(teacher/T) ‖ softmax(student/T)) + (1 − α) CE(student, y)

(batch-mean KL, teacher fixed). Inference uses the student only, in numpy.

Rank: ``r = min(rank, k_f − 1)`` (default ``rank=16``; ``None`` → k_f − 1), at least 1, so the
residual is truly low-rank (r < k_f); the paper's ``r = min(ph_rank, k_f)`` is full rank at its
defaults.

Memory: the fixed set keeps z (C·n, k_f) and the targets [teacher log-probabilities | base]
(C·n, 2C) in the training dtype (``train_dtype``: float64, ≈ 1 GB for C = 100, n = 4000; float32
from C·k_f > 10⁵: 1.2 GB in all for C = 1,000, n = 100), computed in blocks of
:func:`score_rows` rows; the held-out set keeps its base logits (C·m, C) in the same dtype.

Teachers (eq. P3), with LDA_f(z)_c = z Σᶠ⁻¹ μ_cᶠ − ½ μ_cᶠᵀ Σᶠ⁻¹ μ_cᶠ + log π_c,
Σᶠ = Vᵀ S_W V, QDA_f from Σ̃_cᶠ = Vᵀ shrink(Σ_c, ``qda_shrinkage``) V, and the row-wise
standardisation std(L) = (L − mean_c L)/(std_c L + 1e-6) (population std):

* ``"informative"`` (default), statistics mode ``full``:
  s(z)·[λ·std(QDA_f) + (1 − λ)·std(LDA_f)], λ = ``teacher_blend`` (default 0.5, the QDA
  weight); ``teacher_used_ = "qda_lda"``. The standardisation puts QDA_f and LDA_f on one
  scale for blending. s(z) is the row std of NB_f(z) (``teacher_scale="base"``), the
  paper's unstandardised NB_f: a unit-std teacher at T = 4 is almost uniform, so knowledge
  distillation would then fight the cross-entropy. ``teacher_scale="unit"`` keeps s = 1.
  With ``base="lda"`` and ``n_per_class=None`` at a C and k_f where QDA_f cannot score even
  100 synthetic rows per class within its budget
  (:func:`~ghofl.heads._training.qda_teacher_affordable`: from C ≈ 210 at k_f = C − 1; e.g.
  C = 1,000, k_f = 512), the teacher is the mode-``pooled`` one below, with a warning.
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
* ``"base"``: the selected base itself (the KD term then only keeps the student near it).

``teacher_base_kl_`` is the mean KL(softmax(teacher/T) ‖ softmax(NB_f/T)) on a diagnostic
synthetic sample (min(n_per_class, 128) per class and ``DIAGNOSTIC_ROWS`` = 20,000 rows in all at
most, its own seeded stream; when QDA_f scores it,
at most a quarter of the QDA_f budget of :func:`~ghofl.heads._training.auto_qda_samples_per_class`,
which binds only at large C: 31 per class at C = 200, k_f = 199).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray
from scipy.linalg import solve_triangular
from scipy.special import log_softmax

from ghofl.errors import GhoflWarning, InputError, UnsupportedModeError
from ghofl.heads._linalg import linear_discriminant, safe_log, stable_cholesky
from ghofl.heads._params import Constraint, Integer, Options, Real, ShrinkageParam
from ghofl.heads._training import (
    AUTO_QDA_MACS,
    F64,
    CheckpointSelector,
    FisherTrainedHead,
    auto_qda_samples_per_class,
    blas_threads,
    qda_teacher_affordable,
    uniform_init,
)
from ghofl.heads.base import scalar_int, scalar_positive
from ghofl.heads.fisher import (
    FisherSubspace,
    fisher_class_covariances,
    project_covariance,
)
from ghofl.heads.synthesis import FArr, FisherGaussians, sample_fixed
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import Shrinkage
from ghofl.stats.meta import StatsMeta

if TYPE_CHECKING:
    import torch

TeacherKind = Literal["informative", "base", "paper"]
BaseKind = Literal["auto", "lda", "qda"]
ResidualInit = Literal["zero", "random"]
TeacherScale = Literal["base", "unit"]
#: rows scored at once by the numpy scorers (bounds temporary memory)
SCORE_CHUNK = 32768
#: bytes of one (rows, C) float64 block of the row-blocked scorers (:func:`score_rows`)
SCORE_BYTES = 1 << 24
#: most rows of the diagnostic sample of ``teacher_base_kl_``
DIAGNOSTIC_ROWS = 20_000


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
                   qda_shrinkage: Shrinkage | None,
                   class_covs: F64 | None = None) -> FisherScorers:
    """NB_f, LDA_f and (when ``qda_shrinkage`` is given) QDA_f parameters (eq. P1, P3).

    Parameters
    ----------
    moments : Moments
    V : (d, k_f)
    within : (d, d)
        The S_W of the Fisher subspace; Σᶠ = Vᵀ S_W V.
    qda_shrinkage : float, "auto" or None
        None skips QDA_f; otherwise the statistics must be mode ``full``.
    class_covs : ndarray, shape (C, k_f, k_f), optional
        Σ̃_cᶠ already computed with ``qda_shrinkage`` (e.g. the synthesis covariances when
        both use the same shrinkage); skips :func:`fisher_class_covariances`.
    """
    means_f = moments.means @ V
    cov_f = project_covariance(within, V)
    log_priors = safe_log(moments.priors)
    coef, intercept, _ = linear_discriminant(means_f, cov_f, log_priors,
                                             "the Fisher-space pooled covariance")
    prec = half = None
    if qda_shrinkage is not None:
        k = V.shape[1]
        with blas_threads(1):  # C small factorisations: one BLAS thread is fastest
            covs = (fisher_class_covariances(moments, V, qda_shrinkage) if class_covs is None
                    else class_covs)
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
    """Row-wise (L − mean)/(std + eps), population std."""
    centred = logits - logits.mean(axis=1, keepdims=True)
    out: F64 = centred / (centred.std(axis=1, keepdims=True) + eps)
    return out


def teacher_logits(sc: FisherScorers, z: F64, teacher: TeacherKind, blend: float,
                   scale: TeacherScale = "base", qda: F64 | None = None,
                   nb: F64 | None = None) -> F64:
    """Teacher logits (n, C) of eq. P3 (see the module docstring), in chunks of rows.

    ``scale`` applies to the informative teacher only: ``"base"`` multiplies each standardised
    row by the row std of NB_f(z), ``"unit"`` leaves it standardised. ``qda`` and
    ``nb``: QDA_f(z) and NB_f(z) (n, C) when already computed.
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
            q = qda_f_logits(sc, zz) if qda is None else qda[s:s + SCORE_CHUNK]
            t = blend * standardise(q) + (1.0 - blend) * standardise(lda)
        if scale == "base":
            nbz = (nb_f_logits(zz, sc.means, sc.sigma2, sc.log_priors) if nb is None
                   else nb[s:s + SCORE_CHUNK])
            t = t * nbz.std(axis=1, keepdims=True)
        out[s:s + SCORE_CHUNK] = t
    return out


def mean_kl(p_logits: F64, q_logits: F64, temperature: float) -> float:
    """Mean over rows of KL(softmax(p/T) ‖ softmax(q/T))."""
    lp = log_softmax(p_logits / temperature, axis=1)
    lq = log_softmax(q_logits / temperature, axis=1)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=1)))


def base_logits(sc: FisherScorers, z: F64, base: str) -> F64:
    """Base logits (n, C) on Fisher features z (n, k_f): QDA_f for ``"qda"``, else NB_f.

    NB_f equals LDA_f up to a per-row constant (V whitens S_W, so Σᶠ = I and σ² = 1): it is
    the LDA base in softmax, cross-entropy and arg-max terms.
    """
    if base == "qda":
        return qda_f_logits(sc, z)
    return nb_f_logits(z, sc.means, sc.sigma2, sc.log_priors)


def score_rows(num_classes: int) -> int:
    """Rows per block of the row-blocked scorers, between 256 and ``SCORE_CHUNK``.

    ``SCORE_BYTES`` of (rows, C) float64 logits: 2,048 rows (16 MB) at C = 1,000.
    """
    return int(min(SCORE_CHUNK, max(256, SCORE_BYTES // (8 * max(num_classes, 1)))))


def base_logits_blocked(sc: FisherScorers, z: FArr, base: str) -> FArr:
    """:func:`base_logits` (n, C) in the dtype of z, computed in float64 row blocks.

    Blocks of ``SCORE_CHUNK`` rows: temporary memory O(SCORE_CHUNK · C).
    """
    out = np.empty((z.shape[0], sc.means.shape[0]), dtype=z.dtype)
    step = score_rows(sc.means.shape[0])
    for s in range(0, z.shape[0], step):
        out[s:s + step] = base_logits(sc, z[s:s + step].astype(np.float64), base)
    return out


def base_correct(sc: FisherScorers, z: FArr, y: NDArray[np.int64], base: str) -> NDArray[np.bool_]:
    """Rows (n,) of z (n, k_f) whose arg-max :func:`base_logits` is ``y``, in blocks of rows."""
    out = np.empty(y.size, dtype=bool)
    step = score_rows(sc.means.shape[0])
    for s in range(0, y.size, step):
        rows = slice(s, s + step)
        logits = base_logits(sc, z[rows].astype(np.float64), base)
        out[rows] = np.argmax(logits, axis=1) == y[rows]
    return out


def choose_base(sc: FisherScorers, base: str, val: tuple[FArr, NDArray[np.int64]] | None,
                z: float = 2.0) -> tuple[str, dict[str, float]]:
    """The base used and the held-out synthetic accuracy of each candidate scored.

    ``"lda"``/``"qda"`` are taken as given. ``"auto"`` scores LDA_f (as NB_f) and, when the
    scorers hold QDA_f (mode ``full``), QDA_f on the held-out synthetic samples ``val``
    ``(z (m, k_f), y (m,))``, and keeps QDA_f only if it beats LDA_f significantly on the same
    rows (the paired test of :class:`~ghofl.heads._training.CheckpointSelector` at ``z``);
    otherwise, and without ``val`` or QDA_f, the base is LDA_f.
    """
    scores: dict[str, float] = {}
    correct: dict[str, NDArray[np.bool_]] = {}
    if val is not None:
        candidates = ["lda"] + (["qda"] if sc.qda_prec is not None else [])
        if base != "auto":
            candidates = [base] if base == "lda" or sc.qda_prec is not None else []
        for cand in candidates:
            correct[cand] = base_correct(sc, val[0], val[1], cand)
            scores[cand] = float(np.mean(correct[cand]))
    if base != "auto":
        return base, scores
    if "qda" in correct:
        test = CheckpointSelector(correct["lda"], [], None, z)
        if test.significant(correct["qda"]):
            return "qda", scores
    return "lda", scores


def effective_rank(rank: int | None, k_f: int) -> int:
    """The rank r = min(rank, k_f − 1) (rank None → k_f − 1), at least 1."""
    cap = k_f - 1 if rank is None else min(int(rank), k_f - 1)
    return max(1, cap)


# ---------------------------------------------------------------------- the head
class ProtoHyperHead(FisherTrainedHead):
    """NB_f plus a rank-r residual distilled from a Fisher-space teacher (eqs. P1–P3).

    Parameters
    ----------
    base : {"lda", "auto", "qda"}, default "lda"
        Closed-form base (module docstring): "lda" is LDA_f (the paper's NB_f, equal to LDA_f
        up to a row constant), so the head starts at the default LDA; "auto" is QDA_f in mode
        ``full`` when it beats LDA_f significantly on held-out synthetic samples, else LDA_f.
        "auto" is not the default: the synthetic samples are drawn from the class Gaussians,
        for which QDA_f is the Bayes rule, so the comparison favours QDA_f (on CIFAR-10
        features it picked QDA_f and ended 0.5 point below LDA); "qda" needs mode ``full``.
    residual_init : {"zero", "random"}, default "zero"
        "zero" starts the residual at 0 (V₂ = 0, b = 0, U₁ random), so training starts at the
        base; "random" is the paper's ``nn.Linear`` initialisation of all three.
    rank : int or None, default 16
        Residual rank cap (paper ``ph_rank``: 16 for CIFAR-10, 128 for CIFAR-100);
        r = min(rank, k_f − 1) ≥ 1, None → k_f − 1. The paper's r = min(ph_rank, k_f) is
        k_f at its defaults, i.e. not low-rank.
    teacher : {"informative", "base", "paper"}, default "informative"
        See the module docstring: "paper" is softmax-identical to the NB_f base, so its KD
        term does nothing; "base" distils the selected base.
    teacher_blend : float in [0, 1] or None, default None
        λ of the teacher blend: the QDA_f weight for "informative" (None → 0.5), the LDA_f
        weight for "paper" (None → 0.7, the paper's ``teacher_blend``).
    teacher_scale : {"base", "unit"}, default "base"
        Row scale of the informative teacher: "base" rescales each standardised row to the
        row std of NB_f (see the module docstring), "unit" keeps it standardised
        (ablation only: with the unstandardised NB_f base it hurts accuracy).
    qda_shrinkage : float in [0, 1] or a rule, default "auto"
        Shrinkage of Σ_c for QDA_f (paper ``qda_shrink`` = 0.1); a rule picks each class's
        coefficient judged in the Fisher space (:func:`~ghofl.heads.fisher.class_coefficient`).
    kd_alpha : float in [0, 1], default 0.4
        α of eq. P2.
    kd_temperature : float > 0, default 4.0
        T of eq. P2.
    lr, weight_decay, batch_size, epochs : default 1e-3, 5e-4, 1024, 40
        AdamW settings (paper ``ph_*``).
    fisher_shrinkage, fisher_energy, fisher_max_dim, fisher_min_dim, tau, n_per_class,
    val_per_class, patience, selection_z, syn_shrink, syn_class_cov, fresh_samples, center,
    prior_correction, seed, num_threads, train_dtype, progress
        As :class:`~ghofl.heads.fishermix.FisherMixHead` (same defaults), except that
        ``n_per_class=None`` is also capped by
        :func:`~ghofl.heads._training.auto_qda_samples_per_class` when QDA_f scores the
        synthetic rows (at large C only: 126 per class at C = 200, k_f = 199). With
        ``prior_correction`` the student is trained on prior-free (balanced) base and teacher
        scores, and the base adds the class log-priors back at prediction.

    Fitted attributes
    -----------------
    V_ : (d, k_f); offset_ : (k_f,); means_f_ : (C, k_f); log_priors_ : (C,);
    qda_prec_ : (C, k_f, k_f) and qda_half_logdet_ : (C,) for the QDA_f base ((0, k_f, k_f) and
    (0,) for LDA_f); U_ : (r, k_f); W2_ : (C, r); b_ : (C,);
    sigma2_, rank_, base_used_ ("lda" or "qda"), base_val_accuracies_ (held-out synthetic
    accuracy of each base candidate), teacher_used_, teacher_blend_ (λ used),
    teacher_base_kl_, and the scalars common to the trainable heads (k_f_, fisher_shrinkage_,
    fisher_ridge_, syn_covariance_, n_per_class_, val_per_class_, epochs_run_,
    selected_epoch_, base_val_accuracy_, val_accuracy_, final_loss_, fit_seconds_).

    Notes
    -----
    With ``fresh_samples=True`` the teacher is re-evaluated on every batch; QDA_f costs
    O(n·C·k_f²), which dominates the run time for C = 100.
    """

    name = "protohyper"
    fitted_arrays = ("V_", "offset_", "means_f_", "log_priors_", "qda_prec_",
                     "qda_half_logdet_", "U_", "W2_", "b_")
    fitted_scalars = ("sigma2_", "rank_", "base_used_", "base_val_accuracies_",
                      "teacher_used_", "teacher_blend_", "teacher_base_kl_", "k_f_",
                      "fisher_shrinkage_", "fisher_ridge_", "syn_covariance_", "n_per_class_",
                      "val_per_class_", "epochs_run_", "selected_epoch_",
                      "base_val_accuracy_", "val_accuracy_", "final_loss_", "fit_seconds_")
    neg_inf_arrays = frozenset({"log_priors_"})
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        **FisherTrainedHead.parameter_constraints,
        "base": Options(("auto", "lda", "qda")),
        "residual_init": Options(("zero", "random")),
        "rank": Integer(lo=1, none_ok=True),
        "teacher": Options(("informative", "base", "paper")),
        "teacher_blend": Real(lo=0.0, hi=1.0, none_ok=True),
        "teacher_scale": Options(("base", "unit")),
        "qda_shrinkage": ShrinkageParam(),
        "kd_alpha": Real(lo=0.0, hi=1.0),
        "kd_temperature": Real(lo=0.0, lo_open=True),
    }

    def _fitted_shapes(
        self, meta: StatsMeta, scalars: dict[str, Any]
    ) -> dict[str, tuple[int, ...]]:
        owner = type(self).__name__
        c, d = meta.num_classes, meta.dim
        k = scalar_int(owner, scalars, "k_f_", 1, d)
        r = scalar_int(owner, scalars, "rank_", 1, k)
        scalar_positive(owner, scalars, "sigma2_")
        base = scalars.get("base_used_")
        if base not in ("lda", "qda"):
            raise InputError(
                f"saved {owner} has base_used_ = {base!r:.60}; expected 'lda' or 'qda'; the "
                "file is corrupt"
            )
        cq = c if base == "qda" else 0
        return {"V_": (d, k), "offset_": (k,), "means_f_": (c, k), "log_priors_": (c,),
                "qda_prec_": (cq, k, k), "qda_half_logdet_": (cq,),
                "U_": (r, k), "W2_": (c, r), "b_": (c,)}

    base: BaseKind
    residual_init: ResidualInit
    rank: int | None
    teacher: TeacherKind
    teacher_blend: float | None
    teacher_scale: TeacherScale
    qda_shrinkage: Shrinkage
    kd_alpha: float
    kd_temperature: float

    def __init__(
        self,
        base: BaseKind = "lda",
        residual_init: ResidualInit = "zero",
        rank: int | None = 16,
        teacher: TeacherKind = "informative",
        teacher_blend: float | None = None,
        teacher_scale: TeacherScale = "base",
        qda_shrinkage: Shrinkage = "auto",
        kd_alpha: float = 0.4,
        kd_temperature: float = 4.0,
        fisher_shrinkage: Shrinkage = "auto",
        fisher_energy: float = 1.0,
        fisher_max_dim: int | None = None,
        fisher_min_dim: int = 2,
        tau: float = 0.9,
        n_per_class: int | None = None,
        val_per_class: int | None = None,
        patience: int | None = 5,
        selection_z: float = 2.0,
        syn_shrink: Shrinkage = "auto",
        syn_class_cov: bool | Literal["auto"] = "auto",
        fresh_samples: bool = False,
        center: bool = False,
        prior_correction: bool = True,
        lr: float = 1e-3,
        weight_decay: float = 5e-4,
        batch_size: int = 1024,
        epochs: int = 40,
        seed: int = 0,
        num_threads: int | None = 1,
        train_dtype: Literal["auto", "float64", "float32"] = "auto",
        progress: bool = False,
    ) -> None:
        self._store_init_args(locals())

    def _blend(self) -> float:
        if self.teacher_blend is not None:
            return float(self.teacher_blend)
        return 0.7 if self.teacher == "paper" else 0.5

    def _train(self, moments: Moments, fs: FisherSubspace, g: FisherGaussians) -> None:
        full = moments.has_class_covariances
        if self.base == "qda" and not full:
            raise UnsupportedModeError(
                "ProtoHyperHead: base='qda' needs class covariances (upload mode 'full'); these "
                f"statistics are mode {moments.meta.mode!r}. Use base='auto' or 'lda', or "
                "recompute the statistics with --mode full"
            )
        want_qda = full and (self.base != "lda" or self.teacher == "informative")
        if (want_qda and self.base == "lda" and self.n_per_class is None
                and not qda_teacher_affordable(moments.num_classes, fs.k_f)):
            warnings.warn(
                f"ProtoHyperHead: at C = {moments.num_classes}, k_f = {fs.k_f} scoring the "
                "synthetic rows with QDA_f would take too long, so the informative teacher is "
                "LDA_f only (teacher_used_ = 'lda'); set n_per_class to keep the QDA_f blend",
                GhoflWarning, stacklevel=3)
            want_qda = False
        # the synthesis covariances are the QDA_f ones (scaled by τ²) when both use the same
        # shrinkage: reuse them instead of choosing C coefficients again
        reuse = (g.covariances() / g.tau**2 if want_qda and g.source == "class"
                 and self.params_["qda_shrinkage"] == self.params_["syn_shrink"] else None)
        with self._timed("teacher"):
            sc = fisher_scorers(moments, fs.V, fs.within,
                                self.params_["qda_shrinkage"] if want_qda else None, reuse)
        # every synthetic row will be scored by QDA_f: bound that cost at large C
        self._qda_dim = fs.k_f if sc.qda_prec is not None else 0
        self.means_f_, self.log_priors_, self.sigma2_ = sc.means, sc.log_priors, sc.sigma2
        with self._timed("selection"):
            val = self._validation_set(g, moments.priors)
            self.base_used_, self.base_val_accuracies_ = choose_base(
                sc, self.base, val, float(self.selection_z))
        keep_qda = self.base_used_ == "qda" and sc.qda_prec is not None
        k = fs.k_f
        self.qda_prec_ = sc.qda_prec if keep_qda else np.zeros((0, k, k))
        self.qda_half_logdet_ = sc.qda_half_logdet if keep_qda else np.zeros(0)
        self.teacher_used_ = self.teacher if self.teacher != "informative" else (
            "qda_lda" if sc.qda_prec is not None else "lda")
        self.rank_ = effective_rank(self.rank, fs.k_f)
        self.teacher_blend_ = self._blend()
        with self._timed("teacher"):
            self.teacher_base_kl_ = self._diagnostic_kl(sc, g)
        self._train_student(sc, g, val)

    def _samples_per_class(self, num_classes: int) -> int:
        """``n_per_class``; when None, an automatic count.

        :func:`~ghofl.heads._training.auto_samples_per_class`, capped by
        :func:`~ghofl.heads._training.auto_qda_samples_per_class` when QDA_f (base or teacher)
        scores the synthetic rows (the cost of QDA_f grows as C²·k_f² per class).
        """
        n = super()._samples_per_class(num_classes)
        qda_dim = int(getattr(self, "_qda_dim", 0))
        if self.n_per_class is None and qda_dim:
            n = min(n, auto_qda_samples_per_class(num_classes, qda_dim))
        return n

    def _balanced(self, sc: FisherScorers) -> FisherScorers:
        """The scorers with uniform priors (``prior_correction``), else (the paper) ``sc`` itself.

        The synthetic set is class-balanced, so the student is trained on balanced base and teacher
        scores and the log-priors return at prediction through the base.
        """
        if not self.prior_correction:
            return sc
        finite = np.where(np.isfinite(sc.log_priors), sc.log_priors, 0.0)
        return replace(sc, log_priors=np.zeros_like(sc.log_priors),
                       lda_intercept=sc.lda_intercept - finite)

    def _base_logits(self, sc: FisherScorers, z: F64) -> F64:
        """The selected base on Fisher features z (n, k_f): NB_f (≡ LDA_f) or QDA_f."""
        return base_logits(sc, z, self.base_used_)

    def _teacher(self, sc: FisherScorers, z: F64) -> F64:
        if self.teacher == "base":
            return self._base_logits(sc, z)
        return teacher_logits(sc, z, self.teacher, self._blend(), self.teacher_scale)

    def _diagnostic_kl(self, sc: FisherScorers, g: FisherGaussians) -> float:
        n = min(self._samples_per_class(g.num_classes), 128,
                max(1, DIAGNOSTIC_ROWS // g.num_classes))
        qda_dim = int(getattr(self, "_qda_dim", 0))
        if qda_dim:  # a quarter of the QDA_f scoring budget of the training rows at most
            cap = AUTO_QDA_MACS / 4 / (float(g.num_classes) ** 2 * float(qda_dim) ** 2)
            n = max(1, min(n, int(cap)))
        z_all, _ = sample_fixed(g, n, self._rngs()[2])
        total, step = 0.0, score_rows(g.num_classes)
        for s in range(0, z_all.shape[0], step):  # row blocks: O(block · C) temporaries
            z: F64 = z_all[s:s + step].astype(np.float64, copy=False)
            base = nb_f_logits(z, sc.means, sc.sigma2, sc.log_priors)
            total += z.shape[0] * mean_kl(self._teacher(sc, z), base, float(self.kd_temperature))
        return float(total / max(z_all.shape[0], 1))

    def _train_student(self, sc: FisherScorers, g: FisherGaussians,
                       val: tuple[FArr, NDArray[np.int64]] | None) -> None:
        import torch
        import torch.nn.functional as F

        c_num, k, r = g.num_classes, g.dim, self.rank_
        T, alpha = float(self.kd_temperature), float(self.kd_alpha)
        bal = self._balanced(sc)

        def targets(z: FArr) -> FArr:
            """[log softmax(teacher/T) | base] per row, (n, 2C) in the dtype of z.

            The fixed inputs of eq. P2, computed in float64 blocks of :func:`score_rows` rows.
            """
            out = np.empty((z.shape[0], 2 * c_num), dtype=z.dtype)
            step = score_rows(c_num)
            for s in range(0, z.shape[0], step):
                block = self._target_block(bal, z[s:s + step].astype(np.float64))
                out[s:s + step, :c_num] = log_softmax(block[0] / T, axis=1)
                out[s:s + step, c_num:] = block[1]
            return out

        gen = torch.Generator().manual_seed(int(self.seed))
        U = uniform_init((r, k), 1.0 / np.sqrt(k), gen)
        W2 = uniform_init((c_num, r), 1.0 / np.sqrt(r), gen)
        b = uniform_init((c_num,), 1.0 / np.sqrt(r), gen)
        if self.residual_init == "zero":
            with torch.no_grad():
                W2.zero_()
                b.zero_()
        self.offset_ = self._offset(g)
        offset = torch.from_numpy(self.offset_)

        def loss_fn(z: torch.Tensor, y: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
            assert extra is not None
            t_logp, base = extra[:, :c_num], extra[:, c_num:]
            dt = z.dtype  # float64 parameters, products in the dtype of the rows
            student = base + ((z - offset.to(dt)) @ U.to(dt).T) @ W2.to(dt).T + b.to(dt)
            s_logp = F.log_softmax(student / T, dim=1)
            kl = (t_logp.exp() * (t_logp - s_logp)).sum(1).mean()
            return alpha * T * T * kl + (1.0 - alpha) * F.cross_entropy(student, y)

        val_base = None if val is None else base_logits_blocked(sc, val[0], self.base_used_)

        def val_logits(z: FArr, rows: slice) -> FArr:
            assert val_base is not None
            dt = z.dtype
            u, w2 = U.detach().numpy().astype(dt), W2.detach().numpy().astype(dt)
            res = ((z - self.offset_.astype(dt)) @ u.T) @ w2.T
            out: FArr = val_base[rows] + res + b.detach().numpy().astype(dt)
            return out

        self._train_selected([U, W2, b], loss_fn, self._epoch_source(g, targets), val_logits,
                             val)
        self.U_ = U.detach().numpy().copy()
        self.W2_ = W2.detach().numpy().copy()
        self.b_ = b.detach().numpy().copy()

    def _target_block(self, bal: FisherScorers, z: F64) -> tuple[F64, F64]:
        """Teacher and base logits (n, C) on rows z (n, k_f) float64, with the balanced scorers.

        QDA_f, the costly scorer (C·k_f² per row), and NB_f are computed once for base and
        teacher.
        """
        qda = None
        if bal.qda_prec is not None and (self.base_used_ == "qda"
                                         or self.teacher == "informative"):
            qda = qda_f_logits(bal, z)
        nb = nb_f_logits(z, bal.means, bal.sigma2, bal.log_priors)
        base = qda if self.base_used_ == "qda" and qda is not None else nb
        if self.teacher == "base":
            return base, base
        return teacher_logits(bal, z, self.teacher, self._blend(), self.teacher_scale, qda,
                              nb), base

    def _fisher_decision(self, z: F64) -> F64:
        """Student logits (n, C) of eq. P1 on z_f (n, k_f), in numpy float64."""
        sc = FisherScorers(self.means_f_, self.log_priors_, float(self.sigma2_),
                           np.zeros((0, z.shape[1])), np.zeros(0),
                           self.qda_prec_ if self.base_used_ == "qda" else None,
                           self.qda_half_logdet_ if self.base_used_ == "qda" else None)
        out: F64 = (base_logits(sc, z, self.base_used_)
                    + ((z - self.offset_) @ self.U_.T) @ self.W2_.T + self.b_)
        return out


__all__ = [
    "FisherScorers",
    "ProtoHyperHead",
    "base_logits",
    "choose_base",
    "effective_rank",
    "fisher_scorers",
    "lda_f_logits",
    "mean_kl",
    "nb_f_logits",
    "qda_f_logits",
    "standardise",
    "teacher_logits",
]
