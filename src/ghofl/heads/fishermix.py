"""FisherMix: a softmax head on Fisher features trained on synthetic samples only (method.md §4).

Pipeline (reference-notes §4–6): Fisher subspace V from the pooled moments
(:func:`~ghofl.heads.fisher.fisher_subspace`), class Gaussians N(μ_cᶠ, τ² Σ̃_cᶠ) in z_f = x V
(:mod:`ghofl.heads.synthesis`), then a classifier on z_f trained with cross-entropy (eq. M1)::

    linear:  g(z) = (z − ō) Wᵀ + b                                  (paper HEAD: ō = 0)
    cosine:  g(z)_c = s · cos(z − ō, W_c) − s·m·[c = y] (margin in training only) (b7d6a00)

with AdamW on shuffled batches, starting from LDA_f (``init="lda"``, default) or from the
paper's random initialisation. Training runs in torch (CPU, float64, deterministic); the fitted
state is plain numpy (``V_``, ``offset_``, ``coef_``, ``intercept_``), so prediction and
save/load need no torch.

Randomness: ``seed`` feeds ``numpy.random.SeedSequence(seed).spawn(3)`` (synthesis, batch order,
diagnostics; PCG64 generators) and a ``torch.Generator`` for the random initialisation. The
same seed and ``num_threads`` give bit-identical weights. Statistics that differ only in float
summation order (the same data split over different clients) gave weights equal to ~1e-13 and
identical predictions in the tests; bit-exactness across partitions is not promised.

The synthetic set is class-balanced, so the head assumes uniform class priors (as the paper's).

This module also holds the machinery shared with :mod:`ghofl.heads.protohyper`: the
deterministic torch session, the training loop and the common hyperparameter checks.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, require_extra
from ghofl.heads._linalg import linear_discriminant
from ghofl.heads.base import Head
from ghofl.heads.fisher import (
    FisherSubspace,
    check_choice,
    check_fisher_params,
    check_int,
    check_number,
    fisher_subspace,
    project_covariance,
)
from ghofl.heads.synthesis import (
    FisherGaussians,
    fisher_gaussians,
    fresh_batches,
    sample_fixed,
    shuffled_batches,
)
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import Shrinkage, check_shrinkage
from ghofl.stats.accumulate import compute_stats

if TYPE_CHECKING:
    import torch

F64 = NDArray[np.float64]
#: one training batch (z, y, extra targets or None) as torch tensors
TorchBatch = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]


# ---------------------------------------------------------------------- torch session
@contextmanager
def torch_session(num_threads: int | None) -> Iterator[None]:
    """Deterministic torch for the duration of the block, restoring global state afterwards.

    Enables ``torch.use_deterministic_algorithms(True)`` and sets ``torch.set_num_threads``
    (when ``num_threads`` is not None); both are restored on exit. Raises
    :class:`~ghofl.errors.MissingExtraError` naming the ``torch`` extra when torch is absent.
    """
    require_extra("torch", "torch")
    import torch

    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    try:
        torch.use_deterministic_algorithms(True)
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        torch.set_num_threads(prev_threads)


def uniform_init(shape: tuple[int, ...], bound: float, gen: torch.Generator) -> torch.Tensor:
    """U(−bound, bound) float64 leaf tensor requiring grad (``nn.Linear``'s default scheme)."""
    import torch

    t = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2.0 - 1.0) * bound
    return t.requires_grad_(True)


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser settings of one training run (AdamW on all parameters, no scheduler)."""

    lr: float
    weight_decay: float
    epochs: int
    progress: bool
    desc: str


def run_training(
    params: list[torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor],
    epoch_batches: Callable[[], Iterable[TorchBatch]],
    cfg: TrainConfig,
) -> float:
    """Minimise ``loss_fn`` with AdamW over ``cfg.epochs`` passes of ``epoch_batches()``.

    Returns the sample-weighted mean loss of the last epoch. A tqdm bar over epochs is shown
    only when ``cfg.progress`` is true. Raises :class:`ConfigError` if the loss diverges.
    """
    import torch

    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    epochs: Iterable[int] = range(cfg.epochs)
    bar: Any = None
    if cfg.progress:
        require_extra("tqdm", "torch")
        from tqdm.auto import tqdm

        bar = tqdm(epochs, desc=cfg.desc, unit="epoch")
        epochs = bar
    last = float("nan")
    for _ in epochs:
        total = torch.zeros((), dtype=torch.float64)
        count = 0
        for z, y, extra in epoch_batches():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(z, y, extra)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            total += loss.detach() * y.shape[0]
            count += int(y.shape[0])
        last = float(total) / max(count, 1)
        if not np.isfinite(last):
            raise ConfigError(
                f"{cfg.desc}: the training loss became {last}; lower 'lr' (now {cfg.lr})"
            )
        if bar is not None:
            bar.set_postfix(loss=f"{last:.4f}")
    return last


# ---------------------------------------------------------------------- shared head base
class FisherTrainedHead(Head):
    """Shared parts of the heads trained on synthetic Fisher-space samples.

    Subclasses define ``__init__`` with the common hyperparameters (see :class:`FisherMixHead`)
    and implement :meth:`_train`. Fitted scalars common to both: ``k_f_``,
    ``fisher_shrinkage_`` (coefficient used), ``fisher_ridge_``, ``syn_covariance_``
    (``"class"`` or ``"pooled"``), ``final_loss_`` and ``fit_seconds_`` (wall seconds per
    stage: ``fisher``, ``synthesis`` (class Gaussians and the fixed set), ``teacher``
    (Proto-Hyper's scorers and teacher targets on the fixed set) and ``training``, which
    also holds on-the-fly synthesis and teacher calls when ``fresh_samples`` is on).
    """

    min_mode = "pooled"

    fisher_shrinkage: Shrinkage
    fisher_energy: float
    fisher_max_dim: int | None
    fisher_min_dim: int
    tau: float
    n_per_class: int
    syn_shrink: Shrinkage
    syn_class_cov: bool
    fresh_samples: bool
    center: bool
    lr: float
    weight_decay: float
    batch_size: int
    epochs: int
    seed: int
    num_threads: int | None
    progress: bool

    def fit(self, X: NDArray[Any], y: NDArray[Any], classes: Any = None) -> Self:
        """Fit on pooled data via its mode-``full`` statistics (so class covariances are used).

        Parameters
        ----------
        X : array_like, shape (n, d)
        y : array_like of int, shape (n,)
        classes : int or sequence of str, optional
        """
        y_arr = np.asarray(y)
        if classes is None:
            classes = int(y_arr.max()) + 1 if y_arr.size else 1
        return self.fit_from_stats(compute_stats(X, y_arr, classes, mode="full"))

    def _validate_params(self) -> None:
        owner = type(self).__name__
        self.fisher_shrinkage = _shrinkage(owner, "fisher_shrinkage", self.fisher_shrinkage)
        check_fisher_params(self.fisher_energy, self.fisher_max_dim, self.fisher_min_dim, owner)
        check_number(owner, "tau", self.tau, lo=0.0, lo_open=True)
        check_int(owner, "n_per_class", self.n_per_class, lo=1)
        self.syn_shrink = _shrinkage(owner, "syn_shrink", self.syn_shrink)
        for flag in ("syn_class_cov", "fresh_samples", "center", "progress"):
            check_choice(owner, flag, getattr(self, flag), (True, False))
        check_number(owner, "lr", self.lr, lo=0.0, lo_open=True)
        check_number(owner, "weight_decay", self.weight_decay, lo=0.0)
        check_int(owner, "batch_size", self.batch_size, lo=1)
        check_int(owner, "epochs", self.epochs, lo=1)
        check_int(owner, "seed", self.seed, lo=0)
        check_int(owner, "num_threads", self.num_threads, lo=1, none_ok=True)

    def _fisher_and_gaussians(self, moments: Moments) -> tuple[FisherSubspace, FisherGaussians]:
        """Fisher subspace and class Gaussians; sets the common fitted scalars."""
        with self._timed("fisher"):
            fs = fisher_subspace(moments, self.fisher_shrinkage, self.fisher_energy,
                                 self.fisher_max_dim, self.fisher_min_dim)
        with self._timed("synthesis"):
            g = fisher_gaussians(moments, fs.V, self.tau, self.syn_shrink,
                                 "auto" if self.syn_class_cov else "pooled")
        self.V_ = fs.V
        self.k_f_ = fs.k_f
        self.fisher_shrinkage_ = fs.shrinkage
        self.fisher_ridge_ = fs.ridge
        self.syn_covariance_ = g.source
        return fs, g

    def _rngs(self) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
        """Independent numpy generators (synthesis, batch order, diagnostics) from ``seed``."""
        a, b, c = np.random.SeedSequence(int(self.seed)).spawn(3)
        return np.random.default_rng(a), np.random.default_rng(b), np.random.default_rng(c)

    def _epoch_source(
        self, g: FisherGaussians, extra_fn: Callable[[F64], F64] | None,
    ) -> Callable[[], Iterable[TorchBatch]]:
        """A callable returning one epoch of torch batches (fixed set or fresh draws).

        Fixed set: drawn once and reshuffled every epoch (rows gathered per batch, wrapped as
        tensors without copying); ``extra_fn`` (e.g. teacher targets) is evaluated once on it.
        Fresh: new samples every epoch, ``extra_fn`` evaluated per batch.
        """
        import torch

        syn_rng, order_rng, _ = self._rngs()
        if self.fresh_samples:
            def fresh() -> Iterator[TorchBatch]:
                for z, y in fresh_batches(g, self.n_per_class, self.batch_size, syn_rng):
                    extra = None if extra_fn is None else torch.from_numpy(extra_fn(z))
                    yield torch.from_numpy(z), torch.from_numpy(y), extra
            return fresh
        with self._timed("synthesis"):
            z_np, y_np = sample_fixed(g, self.n_per_class, syn_rng)
        with self._timed("teacher"):
            e_np = None if extra_fn is None else extra_fn(z_np)

        def fixed() -> Iterator[TorchBatch]:
            # np.take gathers rows about 2x faster than torch advanced indexing
            for idx in shuffled_batches(y_np.size, self.batch_size, order_rng):
                yield (torch.from_numpy(np.take(z_np, idx, axis=0)),
                       torch.from_numpy(np.take(y_np, idx)),
                       None if e_np is None else torch.from_numpy(np.take(e_np, idx, axis=0)))
        return fixed

    def _offset(self, g: FisherGaussians) -> F64:
        """Centre of the trainable layer's input: the balanced mean of μ_cᶠ, or 0."""
        out: F64 = g.means.mean(axis=0) if self.center else np.zeros(g.dim)
        return out

    def _train_config(self) -> TrainConfig:
        return TrainConfig(float(self.lr), float(self.weight_decay), int(self.epochs),
                           bool(self.progress), type(self).__name__)

    @contextmanager
    def _timed(self, stage: str) -> Iterator[None]:
        """Add the wall time of the block to ``fit_seconds_[stage]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.fit_seconds_[stage] += time.perf_counter() - start

    def _fit(self, moments: Moments) -> None:
        require_extra("torch", "torch")  # fail before the numpy work
        start = time.perf_counter()
        self.fit_seconds_ = dict.fromkeys(("fisher", "synthesis", "teacher", "training"), 0.0)
        fs, g = self._fisher_and_gaussians(moments)
        with torch_session(self.num_threads):
            self._train(moments, fs, g)
        other = sum(self.fit_seconds_.values())
        self.fit_seconds_["training"] = time.perf_counter() - start - other

    @abstractmethod
    def _train(self, moments: Moments, fs: FisherSubspace, g: FisherGaussians) -> None:
        """Train inside the torch session and store numpy fitted arrays."""


def _shrinkage(owner: str, name: str, value: object) -> Shrinkage:
    try:
        return check_shrinkage(name, value)
    except ConfigError as exc:
        raise ConfigError(f"{owner}: {exc}") from None


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
    fisher_shrinkage : float in [0, 1] or "auto", default 0.05
        Shrinkage of S_W (paper ``lda_shrink``).
    fisher_energy : float in (0, 1], default 0.995
        Cumulative generalised-eigenvalue share kept (paper ``fisher_energy``).
    fisher_max_dim : int or None, default None
        Cap on k_f; None = min(C − 1, 128) (paper: 16 for CIFAR-10, 128 for CIFAR-100; equal
        in effect since k_f ≤ rank S_B ≤ C − 1).
    fisher_min_dim : int, default 2
        Lower bound on k_f (clipped to d).
    tau : float > 0, default 0.9
        Synthetic covariance scale τ (paper ``syn_tau_base``).
    n_per_class : int, default 4000
        Synthetic samples per class and epoch (paper ``syn_ns_per_class``).
    syn_shrink : float in [0, 1] or "auto", default 0.05
        Shrinkage of the covariance used for synthesis (paper ``syn_shrink``).
    syn_class_cov : bool, default True
        Use class covariances when the statistics are mode ``full`` (paper
        ``syn_use_class_cov``); otherwise, or when False, the pooled one. The choice made is
        recorded in ``syn_covariance_``.
    fresh_samples : bool, default False
        Draw a new synthetic set every epoch (memory O(chunk·k_f)) instead of one fixed set
        (the paper's HEAD).
    center : bool, default False
        Feed the trained layer z_f − ō with ō = mean_c μ_cᶠ (the balanced synthetic mean)
        instead of the paper's uncentred z_f. Stored as ``offset_`` (zeros when False).
    init : {"lda", "random"}, default "lda"
        Start from LDA_f with uniform priors (:func:`lda_init`; the paper's NLP server meant to
        warm-start from LDA_f but used x-space weights) or from the paper HEAD's random
        ``nn.Linear`` init (cosine: N(0, 0.01²)). With the paper's lr and epochs, the random
        start does not converge: on C = 4, d = 6 Gaussians (320 steps) it ended 14–38 points
        below the Bayes accuracy, the LDA start within 0.15 (see also the benchmark ablation).
    variant : {"linear", "cosine"}, default "linear"
        Linear layer with bias (HEAD) or cosine classifier s·cos θ with margin m on the target
        during training (b7d6a00).
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
        numpy; 2 trained ≈ 1.7× faster on 2 idle cores (C = 100 step benchmark) and gave
        bit-identical weights in our tests, which torch does not promise in general.
    progress : bool, default False
        Show a tqdm bar over epochs.

    Fitted attributes
    -----------------
    V_ : (d, k_f); offset_ : (k_f,); coef_ : (C, k_f); intercept_ : (C,) (zeros for ``cosine``);
    k_f_, fisher_shrinkage_, fisher_ridge_, syn_covariance_, final_loss_, fit_seconds_.
    """

    name = "fishermix"
    fitted_arrays = ("V_", "offset_", "coef_", "intercept_")
    fitted_scalars = ("k_f_", "fisher_shrinkage_", "fisher_ridge_", "syn_covariance_",
                      "final_loss_", "fit_seconds_")

    def __init__(
        self,
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
        progress: bool = False,
    ) -> None:
        self.fisher_shrinkage = fisher_shrinkage
        self.fisher_energy = fisher_energy
        self.fisher_max_dim = fisher_max_dim
        self.fisher_min_dim = fisher_min_dim
        self.tau = tau
        self.n_per_class = n_per_class
        self.syn_shrink = syn_shrink
        self.syn_class_cov = syn_class_cov
        self.fresh_samples = fresh_samples
        self.center = center
        self.init = init
        self.variant = variant
        self.scale = scale
        self.margin = margin
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.epochs = epochs
        self.seed = seed
        self.num_threads = num_threads
        self.progress = progress

    def _validate_params(self) -> None:
        super()._validate_params()
        owner = type(self).__name__
        check_choice(owner, "variant", self.variant, ("linear", "cosine"))
        check_choice(owner, "init", self.init, ("lda", "random"))
        check_number(owner, "scale", self.scale, lo=0.0, lo_open=True)
        check_number(owner, "margin", self.margin, lo=0.0)

    def _train(self, moments: Moments, fs: FisherSubspace, g: FisherGaussians) -> None:
        import torch
        import torch.nn.functional as F

        c_num, k = g.num_classes, g.dim
        gen = torch.Generator().manual_seed(int(self.seed))
        cosine = self.variant == "cosine"
        self.offset_ = self._offset(g)
        offset = torch.from_numpy(self.offset_)
        if self.init == "lda":
            coef, intercept = lda_init(moments.means @ fs.V, project_covariance(fs.within, fs.V),
                                       self.offset_)
            params = [torch.from_numpy(coef).requires_grad_(True)]
            if not cosine:
                params.append(torch.from_numpy(intercept).requires_grad_(True))
        elif cosine:
            w = (torch.randn((c_num, k), generator=gen, dtype=torch.float64) * 0.01)
            params = [w.requires_grad_(True)]
        else:
            bound = 1.0 / np.sqrt(k)
            params = [uniform_init((c_num, k), bound, gen), uniform_init((c_num,), bound, gen)]
        s, m = float(self.scale), float(self.margin)

        def loss_fn(z: torch.Tensor, y: torch.Tensor, _: torch.Tensor | None) -> torch.Tensor:
            z = z - offset
            if not cosine:
                return F.cross_entropy(z @ params[0].T + params[1], y)
            cos = F.normalize(z, dim=1) @ F.normalize(params[0], dim=1).T
            if m:
                cos = cos - m * F.one_hot(y, c_num).to(cos.dtype)
            return F.cross_entropy(s * cos, y)

        self.final_loss_ = run_training(params, loss_fn, self._epoch_source(g, None),
                                        self._train_config())
        self.coef_ = params[0].detach().numpy().copy()
        self.intercept_ = np.zeros(c_num) if cosine else params[1].detach().numpy().copy()

    def _decision(self, Z: F64) -> F64:
        """Logits (n, C) of eq. M1 (no margin) on z_f = Z V_, in numpy float64."""
        z = Z @ self.V_ - self.offset_
        if self.variant == "cosine":
            zn = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
            wn = self.coef_ / np.maximum(np.linalg.norm(self.coef_, axis=1, keepdims=True), 1e-12)
            cos: F64 = float(self.scale) * (zn @ wn.T)
            return cos
        out: F64 = z @ self.coef_.T + self.intercept_
        return out


__all__ = [
    "FisherMixHead",
    "FisherTrainedHead",
    "TrainConfig",
    "run_training",
    "torch_session",
    "uniform_init",
]
