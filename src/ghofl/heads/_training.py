"""Machinery shared by the heads trained on synthetic Fisher-space samples.

:class:`FisherTrainedHead` owns the hyperparameters common to
:class:`~ghofl.heads.fishermix.FisherMixHead` and :class:`~ghofl.heads.protohyper.ProtoHyperHead`
(Fisher subspace, synthesis, AdamW and seeding), their validation, the Fisher subspace and class
Gaussians, the seeded batch sources and the fit-time bookkeeping. :func:`torch_session` and
:func:`run_training` are the deterministic torch context and the generic minibatch loop.
The public names are re-exported by :mod:`ghofl.heads.fishermix`.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, require_extra
from ghofl.heads.base import Head
from ghofl.heads.fisher import (
    FisherSubspace,
    check_choice,
    check_fisher_params,
    check_int,
    check_number,
    fisher_subspace,
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
#: a training loss on one batch: (z, y, extra targets or None) -> scalar tensor
LossFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor | None"], "torch.Tensor"]


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
    loss_fn: LossFn,
    epoch_batches: Callable[[], Iterable[TorchBatch]],
    cfg: TrainConfig,
) -> float:
    """Minimise ``loss_fn`` with AdamW over ``cfg.epochs`` passes of ``epoch_batches()``.

    Returns the sample-weighted mean loss of the last epoch. A tqdm bar over epochs is shown
    only when ``cfg.progress`` is true. Raises :class:`ConfigError` if the loss diverges.
    """
    import torch

    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    bar = _epoch_bar(cfg)
    epochs: Iterable[int] = range(cfg.epochs) if bar is None else bar
    last = float("nan")
    for _ in epochs:
        last = _train_epoch(opt, loss_fn, epoch_batches())
        if not np.isfinite(last):
            raise ConfigError(
                f"{cfg.desc}: the training loss became {last}; lower 'lr' (now {cfg.lr})"
            )
        if bar is not None:
            bar.set_postfix(loss=f"{last:.4f}")
    return last


def _epoch_bar(cfg: TrainConfig) -> Any:
    """A tqdm bar over the epochs when ``cfg.progress`` is true, else None."""
    if not cfg.progress:
        return None
    require_extra("tqdm", "torch")
    from tqdm.auto import tqdm

    return tqdm(range(cfg.epochs), desc=cfg.desc, unit="epoch")


def _train_epoch(opt: torch.optim.Optimizer, loss_fn: LossFn,
                 batches: Iterable[TorchBatch]) -> float:
    """One optimiser step per batch; returns the sample-weighted mean loss of the epoch."""
    import torch

    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for z, y, extra in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(z, y, extra)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        total += loss.detach() * y.shape[0]
        count += int(y.shape[0])
    return float(total) / max(count, 1)


# ---------------------------------------------------------------------- shared head base
class FisherTrainedHead(Head):
    """Shared parts of the heads trained on synthetic Fisher-space samples.

    Subclasses define ``__init__`` with the common hyperparameters (see
    :class:`~ghofl.heads.fishermix.FisherMixHead`) listed explicitly, since
    :meth:`~ghofl.heads.base.Head.get_params` reads that signature, store them with
    :meth:`_store_init_args` and implement :meth:`_train`.

    Fitted scalars common to both: ``k_f_``, ``fisher_shrinkage_`` (coefficient used),
    ``fisher_ridge_``, ``syn_covariance_`` (``"class"`` or ``"pooled"``), ``final_loss_`` and
    ``fit_seconds_`` (wall seconds per stage: ``fisher``, ``synthesis`` (class Gaussians and the
    fixed set), ``teacher`` (Proto-Hyper's scorers and teacher targets on the fixed set) and
    ``training``, which also holds on-the-fly synthesis and teacher calls when
    ``fresh_samples`` is on).
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

    def _store_init_args(self, args: dict[str, Any]) -> None:
        """Store the ``__init__`` arguments as attributes of the same names.

        ``args`` is ``locals()`` taken as the first statement of the subclass ``__init__``, so
        it holds exactly the parameters (and ``self``, which is skipped).
        """
        for name, value in args.items():
            if name != "self":
                setattr(self, name, value)

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
        self.fisher_shrinkage = check_owned_shrinkage(owner, "fisher_shrinkage",
                                                      self.fisher_shrinkage)
        check_fisher_params(self.fisher_energy, self.fisher_max_dim, self.fisher_min_dim, owner)
        check_number(owner, "tau", self.tau, lo=0.0, lo_open=True)
        check_int(owner, "n_per_class", self.n_per_class, lo=1)
        self.syn_shrink = check_owned_shrinkage(owner, "syn_shrink", self.syn_shrink)
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


def check_owned_shrinkage(owner: str, name: str, value: object) -> Shrinkage:
    """:func:`~ghofl.moments.shrinkage.check_shrinkage` with ``owner`` prefixed to its error."""
    try:
        return check_shrinkage(name, value)
    except ConfigError as exc:
        raise ConfigError(f"{owner}: {exc}") from None


__all__ = [
    "F64",
    "FisherTrainedHead",
    "LossFn",
    "TorchBatch",
    "TrainConfig",
    "check_owned_shrinkage",
    "run_training",
    "torch_session",
    "uniform_init",
]
