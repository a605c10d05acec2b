"""FisherMix: a softmax head on Fisher features trained on synthetic samples only (method.md §4).

Pipeline (reference-notes §4–6): Fisher subspace V from the pooled moments
(:func:`~ghofl.heads.fisher.fisher_subspace`), class Gaussians N(μ_cᶠ, τ² Σ̃_cᶠ) in z_f = x V
(:mod:`ghofl.heads.synthesis`), then a classifier on z_f trained with cross-entropy (eq. M1)::

    linear:  g(z) = (z − ō) Wᵀ + b                                  (paper HEAD: ō = 0)
    cosine:  g(z)_c = s · cos(z − ō, W_c) − s·m·[c = y] (margin in training only)

with AdamW on shuffled batches, starting from LDA_f (``init="lda"``, default) or from the
paper's random initialisation. By default the checkpoint kept is chosen on a held-out synthetic
set (the start, LDA_f, unless a trained epoch is significantly more accurate there), with early
stopping; with the default Fisher settings LDA_f is the default LDA head, so FisherMix never
ends below LDA on held-out synthetic samples. Training runs in torch (CPU, float64 parameters,
deterministic); the fitted state is plain numpy (``V_``, ``offset_``, ``coef_``,
``intercept_``), so prediction and save/load need no torch.

Randomness: ``seed`` feeds ``numpy.random.SeedSequence(seed).spawn(3)`` (synthesis, batch order,
diagnostics; PCG64 generators) and a ``torch.Generator`` for the random initialisation. The
same seed and ``num_threads`` give bit-identical weights. Statistics that differ only in float
summation order (the same data split over different clients) gave weights equal to ~1e-13 and
identical predictions in the tests; bit-exactness across partitions is not promised.

The synthetic set is class-balanced, so the layer learns uniform-prior scores (as the paper's);
``prior_correction`` (default) adds the class log-priors at prediction.

The machinery shared with :mod:`ghofl.heads.protohyper` (the deterministic torch session, the
training loop, the common hyperparameters and their checks) lives in
:mod:`ghofl.heads._training`; its public names are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from ghofl.heads._linalg import linear_discriminant, safe_log
from ghofl.heads._params import Constraint, Options, Real
from ghofl.heads._training import (
    F64,
    FisherTrainedHead,
    LossFn,
    TrainConfig,
    run_training,
    torch_session,
    uniform_init,
)
from ghofl.heads.base import scalar_int
from ghofl.heads.fisher import FisherSubspace, project_covariance
from ghofl.heads.synthesis import FArr, FisherGaussians
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import Shrinkage
from ghofl.stats.meta import StatsMeta

if TYPE_CHECKING:
    import torch


# ---------------------------------------------------------------------- FisherMix
def lda_init(means_f: F64, cov_f: F64, offset: F64) -> tuple[F64, F64]:
    """LDA_f with uniform priors as a starting point for the layer on z − ō.

    coef = μᶠ Σᶠ⁻¹ (C, k_f) and intercept_c = −½ μ_cᶠ Σᶠ⁻¹ μ_cᶠ + ō·coef_c (C,), so that
    (z − ō) coefᵀ + intercept = LDA_f(z) up to a constant. The synthetic set is balanced,
    hence uniform priors.
    """
    coef, intercept, _ = linear_discriminant(means_f, cov_f, np.zeros(means_f.shape[0]),
                                             "the Fisher-space pooled covariance")
    out: F64 = intercept + coef @ offset
    return coef, out


class FisherMixHead(FisherTrainedHead):
    """Softmax head on Fisher features, trained on synthetic class Gaussians (eq. M1).

    Parameters
    ----------
    fisher_shrinkage : float in [0, 1] or a rule, default "auto"
        Shrinkage of S_W: ``"auto"`` is the data-driven choice of the LDA head
        (:func:`ghofl.moments.selection.choose_pooled_shrinkage`), so that S_W is the default
        LDA covariance (paper ``lda_shrink`` = 0.05, the ``"paper"`` preset).
    fisher_energy : float in (0, 1], default 1.0
        Cumulative generalised-eigenvalue share kept (paper ``fisher_energy`` = 0.995). With
        1.0 and ``fisher_max_dim=None`` the layer starts exactly at LDA (uniform priors).
    fisher_max_dim : int or None, default None
        Cap on k_f; None = C − 1, i.e. every direction LDA uses (the paper capped at 128:
        16 for CIFAR-10 and 128 for CIFAR-100 are both C − 1 in effect, since
        k_f ≤ rank S_B ≤ C − 1).
    fisher_min_dim : int, default 2
        Lower bound on k_f (clipped to d).
    tau : float > 0, default 0.9
        Synthetic covariance scale τ (paper ``syn_tau_base``).
    n_per_class : int or None, default None
        Synthetic samples per class and epoch (paper ``syn_ns_per_class`` = 4000); None:
        :func:`~ghofl.heads._training.auto_train_samples_per_class` (4000 up to C = 50, then
        200,000 / C, at least 1000; from C ≈ 100 also capped at 2·10⁹ / (C²·k_f), at least
        100: 251 per class at C = 200, k_f = 199).
    val_per_class : int or None, default None
        Held-out synthetic samples per class for model selection (None:
        :func:`~ghofl.heads._training.auto_val_per_class`); 0 switches selection off (the
        paper: all epochs, last weights).
    patience : int or None, default 5
        Early stopping: epochs without a new best held-out accuracy before training stops.
    selection_z : float >= 0, default 2.0
        A trained checkpoint replaces the starting LDA_f only when it is more accurate on the
        held-out synthetic set by a paired sign test at this z (see
        :class:`~ghofl.heads._training.CheckpointSelector`).
    syn_shrink : float in [0, 1] or a rule, default "auto"
        Shrinkage of the covariance used for synthesis (paper ``syn_shrink`` = 0.05); a rule
        picks each class's coefficient judged in the Fisher space
        (:func:`~ghofl.heads.fisher.class_coefficient`).
    syn_class_cov : bool or "auto", default "auto"
        Synthesis covariance (paper ``syn_use_class_cov``): True uses the class covariances
        when the statistics are mode ``full`` (the paper), False the pooled one, ``"auto"``
        the class ones only when in addition every class has more samples than Fisher
        dimensions (N_c > k_f), else the pooled one
        (:func:`~ghofl.heads._training.synthesis_covariance`). The choice made is recorded in
        ``syn_covariance_``.
    fresh_samples : bool, default False
        Draw a new synthetic set every epoch (memory O(chunk·k_f)) instead of one fixed set
        (the paper's HEAD).
    center : bool, default False
        Feed the trained layer z_f − ō with ō = mean_c μ_cᶠ (the balanced synthetic mean)
        instead of the paper's uncentred z_f. Stored as ``offset_`` (zeros when False).
    prior_correction : bool, default True
        The synthetic set is class-balanced, so the layer learns balanced (uniform-prior)
        scores; add the class log-priors log π_c of the statistics at prediction
        (``log_priors_``), so that the LDA start is exactly the default LDA head also on
        imbalanced classes. False: the paper's uniform priors (``log_priors_`` = 0).
    init : {"lda", "random"}, default "lda"
        Start from LDA_f with uniform priors (:func:`lda_init`; the paper's NLP server meant to
        warm-start from LDA_f but used x-space weights) or from the paper HEAD's random
        ``nn.Linear`` init (cosine: N(0, 0.01²)). With the paper's lr and epochs, the random
        start does not converge: on C = 4, d = 6 Gaussians (320 steps) it ended 14–38 points
        below the Bayes accuracy, the LDA start within 0.15 (see also the benchmark ablation).
    variant : {"linear", "cosine"}, default "linear"
        Linear layer with bias (HEAD) or cosine classifier s·cos θ with margin m on the target
        during training.
    scale : float > 0, default 20.0
        s of the cosine variant.
    margin : float >= 0, default 0.0
        m of the cosine variant (CosFace-style, training only).
    lr, weight_decay, batch_size, epochs : default 8e-4, 3e-4, 2048, 40
        AdamW settings (paper ``fm_*``).
    seed : int, default 0
        Seeds the numpy generators (synthesis, batch order; ``SeedSequence(seed).spawn``) and the
        ``torch.Generator`` of the weight initialisation.
    num_threads : int or None, default 1
        torch threads while training (restored afterwards); None keeps torch's current
        setting. 1 keeps results independent of the core count and leaves the other core to
        numpy; 2 trains faster on 2 idle cores and gave bit-identical weights in our tests,
        which torch does not promise in general.
    train_dtype : {"auto", "float64", "float32"}, default "auto"
        Dtype of the synthetic rows (training and held-out), of the teacher targets and of the
        products on them; the trained parameters, their optimiser state and the starting base
        stay float64. ``"auto"``: float32 when the layer has more than 10⁵ entries C·k_f (from
        C ≈ 317 at k_f = C − 1: halves the memory of the synthetic sets and about halves the
        epoch time), else float64 (:meth:`~ghofl.heads._training.FisherTrainedHead._np_dtype`).
    progress : bool, default False
        Show a tqdm bar over epochs.

    Fitted attributes
    -----------------
    V_ : (d, k_f); offset_ : (k_f,); coef_ : (C, k_f); intercept_ : (C,) (zeros for ``cosine``);
    log_priors_ : (C,) (zeros without ``prior_correction``);
    k_f_, fisher_shrinkage_, fisher_ridge_, syn_covariance_, n_per_class_, val_per_class_,
    epochs_run_, selected_epoch_, base_val_accuracy_, val_accuracy_, final_loss_, fit_seconds_
    (see :class:`~ghofl.heads._training.FisherTrainedHead`).
    """

    name = "fishermix"
    fitted_arrays = ("V_", "offset_", "coef_", "intercept_", "log_priors_")
    neg_inf_arrays = frozenset({"log_priors_"})
    fitted_scalars = ("k_f_", "fisher_shrinkage_", "fisher_ridge_", "syn_covariance_",
                      "n_per_class_", "val_per_class_", "epochs_run_", "selected_epoch_",
                      "base_val_accuracy_", "val_accuracy_", "final_loss_", "fit_seconds_")
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        **FisherTrainedHead.parameter_constraints,
        "init": Options(("lda", "random")),
        "variant": Options(("linear", "cosine")),
        "scale": Real(lo=0.0, lo_open=True),
        "margin": Real(lo=0.0),
    }

    def _fitted_shapes(
        self, meta: StatsMeta, scalars: dict[str, Any]
    ) -> dict[str, tuple[int, ...]]:
        c, d = meta.num_classes, meta.dim
        k = scalar_int(type(self).__name__, scalars, "k_f_", 1, d)
        return {"V_": (d, k), "offset_": (k,), "coef_": (c, k), "intercept_": (c,),
                "log_priors_": (c,)}


    init: Literal["lda", "random"]
    variant: Literal["linear", "cosine"]
    scale: float
    margin: float

    def __init__(
        self,
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
        init: Literal["lda", "random"] = "lda",
        variant: Literal["linear", "cosine"] = "linear",
        scale: float = 20.0,
        margin: float = 0.0,
        lr: float = 8e-4,
        weight_decay: float = 3e-4,
        batch_size: int = 2048,
        epochs: int = 40,
        seed: int = 0,
        num_threads: int | None = 1,
        train_dtype: Literal["auto", "float64", "float32"] = "auto",
        progress: bool = False,
    ) -> None:
        self._store_init_args(locals())

    def _train(self, moments: Moments, fs: FisherSubspace, g: FisherGaussians) -> None:
        self.offset_ = self._offset(g)
        params = self._initial_params(moments, fs, g)
        self.log_priors_ = (safe_log(moments.priors) if self.prior_correction
                            else np.zeros(g.num_classes))
        with self._timed("selection"):
            val = self._validation_set(g, moments.priors)

        def val_logits(z: FArr, _: slice) -> FArr:
            self._store(params, g.num_classes)
            out: FArr = self._layer_logits(z) + self.log_priors_.astype(z.dtype)
            return out

        self._train_selected(params, self._loss_fn(params, g.num_classes),
                             self._epoch_source(g, None), val_logits, val)
        self._store(params, g.num_classes)

    def _store(self, params: list[torch.Tensor], c_num: int) -> None:
        """Copy the current parameters into ``coef_`` and ``intercept_``."""
        self.coef_ = params[0].detach().numpy().copy()
        self.intercept_ = (np.zeros(c_num) if self.variant == "cosine"
                           else params[1].detach().numpy().copy())

    def _initial_params(self, moments: Moments, fs: FisherSubspace,
                        g: FisherGaussians) -> list[torch.Tensor]:
        """Leaf tensors [coef (C, k_f), intercept (C,)], or [coef] for ``cosine``."""
        import torch

        c_num, k = g.num_classes, g.dim
        cosine = self.variant == "cosine"
        if self.init == "lda":
            coef, intercept = lda_init(moments.means @ fs.V, project_covariance(fs.within, fs.V),
                                       self.offset_)
            params = [torch.from_numpy(coef).requires_grad_(True)]
            if not cosine:
                params.append(torch.from_numpy(intercept).requires_grad_(True))
            return params
        gen = torch.Generator().manual_seed(int(self.seed))
        if cosine:
            w = (torch.randn((c_num, k), generator=gen, dtype=torch.float64) * 0.01)
            return [w.requires_grad_(True)]
        bound = 1.0 / np.sqrt(k)
        return [uniform_init((c_num, k), bound, gen), uniform_init((c_num,), bound, gen)]

    def _loss_fn(self, params: list[torch.Tensor], c_num: int) -> LossFn:
        """Cross-entropy of eq. M1 on a batch (cosine: with the margin on the target)."""
        import torch
        import torch.nn.functional as F

        offset = torch.from_numpy(self.offset_)
        cosine = self.variant == "cosine"
        s, m = float(self.scale), float(self.margin)

        def loss_fn(z: torch.Tensor, y: torch.Tensor, _: torch.Tensor | None) -> torch.Tensor:
            # float64 parameters, products in the dtype of the rows (train_dtype)
            z = z - offset.to(z.dtype)
            w = params[0].to(z.dtype)
            if not cosine:
                return F.cross_entropy(z @ w.T + params[1].to(z.dtype), y)
            cos = F.normalize(z, dim=1) @ F.normalize(w, dim=1).T
            if m:
                cos = cos - m * F.one_hot(y, c_num).to(cos.dtype)
            return F.cross_entropy(s * cos, y)

        return loss_fn

    def _fisher_decision(self, z: F64) -> F64:
        """Logits (n, C) of eq. M1 (no margin) on z_f (n, k_f) plus ``log_priors_``, in numpy."""
        out: F64 = self._layer_logits(z) + self.log_priors_
        return out

    def _layer_logits(self, z_f: FArr) -> FArr:
        """Logits (n, C) of the layer on Fisher features z_f (n, k_f), in the dtype of z_f."""
        dt = z_f.dtype
        z = z_f - self.offset_.astype(dt)
        coef = self.coef_.astype(dt, copy=False)
        if self.variant == "cosine":
            zn = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
            wn = coef / np.maximum(np.linalg.norm(coef, axis=1, keepdims=True), 1e-12)
            cos: FArr = dt.type(self.scale) * (zn @ wn.T)
            return cos
        out: FArr = z @ coef.T + self.intercept_.astype(dt)
        return out


__all__ = [
    "FisherMixHead",
    "FisherTrainedHead",
    "TrainConfig",
    "run_training",
    "torch_session",
    "uniform_init",
]
