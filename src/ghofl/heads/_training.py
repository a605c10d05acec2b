"""Machinery shared by the heads trained on synthetic Fisher-space samples.

:class:`FisherTrainedHead` owns the hyperparameters common to
:class:`~ghofl.heads.fishermix.FisherMixHead` and :class:`~ghofl.heads.protohyper.ProtoHyperHead`
(Fisher subspace, synthesis, AdamW and seeding) and their constraints table, the Fisher
subspace and class Gaussians, the seeded batch sources and the fit-time bookkeeping.
:func:`torch_session` and :func:`run_training` are the deterministic torch context and the
generic minibatch loop.
The public names are re-exported by :mod:`ghofl.heads.fishermix`.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, require_extra
from ghofl.heads._linalg import project_rows
from ghofl.heads._params import BOOL, Constraint, Integer, Options, Real, ShrinkageParam
from ghofl.heads.base import Head, check_finite_inputs
from ghofl.heads.fisher import FisherSubspace, fisher_subspace
from ghofl.heads.synthesis import (
    FArr,
    FisherGaussians,
    fisher_gaussians,
    fresh_batches,
    sample_fixed,
    shuffled_batches,
)
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import Shrinkage
from ghofl.stats.meta import Mode

if TYPE_CHECKING:
    import torch

F64 = NDArray[np.float64]
#: one training batch (z, y, extra targets or None) as torch tensors
TorchBatch = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor | None"]
#: a training loss on one batch: (z, y, extra targets or None) -> scalar tensor
LossFn = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor | None"], "torch.Tensor"]


#: stages of ``fit_seconds_``
STAGES = ("fisher", "synthesis", "teacher", "selection", "training")
#: the paper's synthetic samples per class (``syn_ns_per_class``)
PAPER_PER_CLASS = 4000
#: total synthetic training samples per epoch aimed at by ``n_per_class=None`` for large C
AUTO_TOTAL_SAMPLES = 200_000
#: lower bound on the automatic samples per class
AUTO_MIN_PER_CLASS = 1000
#: held-out synthetic rows aimed at by ``val_per_class=None``, and the per-class bounds
AUTO_VAL_TOTAL = 50_000
AUTO_VAL_MAX = 1000
AUTO_VAL_MIN = 100
#: multiply-adds of one epoch's forward pass (rows · C · k_f) aimed at by the automatic
#: synthetic sample count at large C (see :func:`auto_train_samples_per_class`)
AUTO_TRAIN_MACS = 2e9
#: layer size C·k_f above which ``train_dtype="auto"`` trains and scores in float32
AUTO_FLOAT32_LAYER = 100_000
#: bytes of (rows, C) logits scored at once on the held-out set
VAL_SCORE_BYTES = 1 << 25
#: multiply-adds of QDA_f scoring (C·k_f² per row) aimed at by Proto-Hyper's automatic
#: synthetic sample count when its base or teacher uses QDA_f (see
#: :func:`auto_qda_samples_per_class`)
AUTO_QDA_MACS = 2e11


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
    after_epoch: Callable[[int], bool] | None = None,
) -> tuple[float, int]:
    """Minimise ``loss_fn`` with AdamW over at most ``cfg.epochs`` passes of ``epoch_batches()``.

    ``after_epoch(e)`` is called after epoch e = 1, 2, …; returning True stops training (early
    stopping). Returns ``(sample-weighted mean loss of the last epoch run, epochs run)``. A
    tqdm bar over epochs is shown only when ``cfg.progress`` is true. Raises
    :class:`ConfigError` if the loss diverges.
    """
    import torch

    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    bar = _epoch_bar(cfg)
    epochs: Iterable[int] = range(cfg.epochs) if bar is None else bar
    last = float("nan")
    run = 0
    for _ in epochs:
        last = _train_epoch(opt, loss_fn, epoch_batches())
        run += 1
        if not np.isfinite(last):
            raise ConfigError(
                f"{cfg.desc}: the training loss became {last}; lower 'lr' (now {cfg.lr})"
            )
        if bar is not None:
            bar.set_postfix(loss=f"{last:.4f}")
        if after_epoch is not None and after_epoch(run):
            break
    if bar is not None:
        bar.close()
    return last, run


class CheckpointSelector:
    """Model selection on held-out synthetic samples, with early stopping.

    The starting parameters (epoch 0: the closed-form base) are the first candidate. After
    every epoch :meth:`offer` receives which held-out rows the current parameters classify
    correctly. A checkpoint can replace the base only when it is *significantly* more accurate
    on the same rows: with a = rows it gets right and the base gets wrong, and b the converse,
    it needs a − b > z·√(a + b) (a one-sided paired sign test; z = 0 asks for any strict
    gain). Among such checkpoints the most accurate one is kept (ties: the earliest). The kept
    accuracy is therefore never below the base's (``best_score >= base_score`` always holds),
    and gains within the noise of the held-out set keep the closed-form base. Training stops
    once ``patience`` epochs in a row brought no new highest accuracy, significant or not
    (``patience=None``: never).

    Parameters
    ----------
    base_correct : ndarray of bool, shape (m,)
        Held-out rows the starting parameters classify correctly.
    base_state : list of ndarray
        Snapshot of the starting parameters.
    patience : int or None
    z : float, default 2.0
        Significance threshold of the paired test.

    Attributes
    ----------
    base_score, best_score : float
        Held-out accuracy of the base and of the kept parameters.
    best_epoch : int
        Epoch of the kept parameters, 0 when the base is kept.
    state : list of ndarray
        The kept parameters.
    history : list of float
        Held-out accuracy of every epoch offered, epoch 0 first.
    """

    def __init__(self, base_correct: NDArray[np.bool_], base_state: list[F64],
                 patience: int | None, z: float = 2.0) -> None:
        self.base_correct = np.asarray(base_correct, dtype=bool)
        self.base_score = _mean(self.base_correct)
        self.best_score = self.base_score
        self.best_epoch = 0
        self.state = [np.array(a, copy=True) for a in base_state]
        self.patience = patience
        self.z = float(z)
        self.history = [self.base_score]
        self._top, self._top_epoch = self.base_score, 0

    def significant(self, correct: NDArray[np.bool_]) -> bool:
        """Whether rows ``correct`` beat the base: a − b > z·√(a + b) and a > b."""
        gain = int(np.count_nonzero(correct & ~self.base_correct))
        loss = int(np.count_nonzero(~correct & self.base_correct))
        return gain > loss and gain - loss > self.z * np.sqrt(gain + loss)

    def offer(self, epoch: int, correct: NDArray[np.bool_],
              snapshot: Callable[[], list[F64]]) -> bool:
        """Record epoch ``epoch``; returns True when training should stop.

        ``snapshot()`` is called (and its arrays copied) only when the epoch is kept.
        """
        correct = np.asarray(correct, dtype=bool)
        score = _mean(correct)
        self.history.append(score)
        if score > self.best_score and self.significant(correct):
            self.best_score, self.best_epoch = score, int(epoch)
            self.state = [np.array(a, copy=True) for a in snapshot()]
        if score > self._top:
            self._top, self._top_epoch = score, int(epoch)
        return self.patience is not None and epoch - self._top_epoch >= self.patience


def _mean(mask: NDArray[np.bool_]) -> float:
    return float(np.mean(mask)) if mask.size else 0.0


def accuracy(logits: F64, y: NDArray[np.int64]) -> float:
    """Share of rows whose arg-max equals ``y``; logits (n, C), y (n,)."""
    return float(np.mean(np.argmax(logits, axis=1) == y)) if y.size else 0.0


def auto_val_per_class(num_classes: int) -> int:
    """Held-out synthetic samples per class when ``val_per_class=None``.

    1000 per class while the set stays at most 50,000 rows (C ≤ 50), then 50,000 / C (at
    least 100): enough rows to resolve accuracy differences of about half a point, at a
    scoring cost per epoch that stays small next to the training epoch.
    """
    per_class = AUTO_VAL_TOTAL // max(num_classes, 1)
    return int(max(AUTO_VAL_MIN, min(AUTO_VAL_MAX, per_class)))


def auto_samples_per_class(num_classes: int) -> int:
    """Synthetic training samples per class when ``n_per_class=None``.

    4000 (the paper's value) up to C = 50, then 200,000 / C (at least 1000 per class): an
    epoch then holds about 200,000 samples whatever C. The heads use it through
    :func:`auto_train_samples_per_class`, which also bounds the cost of an epoch once k_f is
    known (large C; issue 11).
    """
    per_class = AUTO_TOTAL_SAMPLES // max(num_classes, 1)
    return int(max(AUTO_MIN_PER_CLASS, min(PAPER_PER_CLASS, per_class)))


def auto_train_samples_per_class(num_classes: int, k_f: int) -> int:
    """Synthetic training samples per class when ``n_per_class=None``, given k_f.

    :func:`auto_samples_per_class`, capped so that one epoch's forward pass through a
    C × k_f layer costs at most ``AUTO_TRAIN_MACS`` = 2·10⁹ multiply-adds (C·n rows ·
    C · k_f), and at least 100 per class. The cap only binds for large C (at k_f = C − 1:
    from C = 101 on); at C = 200, k_f = 199 it gives 251 per class (50,200 rows per epoch
    instead of 200,000), which bounds the 40 epochs of training to about a minute on 2 cores.
    """
    n = auto_samples_per_class(num_classes)
    cap = int(AUTO_TRAIN_MACS // max(float(num_classes) ** 2 * float(k_f), 1.0))
    return int(max(AUTO_VAL_MIN, min(n, cap)))


def auto_qda_samples_per_class(num_classes: int, k_f: int) -> int:
    """Synthetic training samples per class when every row is scored by QDA_f (Proto-Hyper).

    :func:`auto_samples_per_class`, capped so that scoring the C·n rows costs at most
    ``AUTO_QDA_MACS`` = 2·10¹¹ multiply-adds (C·k_f² per row), and at least 100 per class.
    The cap only binds for large C (at k_f = C − 1: from C = 101 on); at C = 200, k_f = 199
    it gives 126 per class, where the uncapped 1000 took minutes of QDA_f scoring alone.
    """
    n = auto_samples_per_class(num_classes)
    cost = float(num_classes) ** 2 * float(k_f) ** 2
    cap = int(AUTO_QDA_MACS // max(cost, 1.0))
    return int(max(AUTO_VAL_MIN, min(n, cap)))


def qda_teacher_affordable(num_classes: int, k_f: int) -> bool:
    """Whether QDA_f can score 100 synthetic rows per class within its budget.

    ``AUTO_VAL_MIN`` = 100 rows per class, ``AUTO_QDA_MACS``: C·100 rows · C·k_f² ≤ 2·10¹¹.
    True up to C ≈ 210 at k_f = C − 1 (C = 200, k_f = 199: 126 rows per class affordable);
    False at C = 1,000, k_f = 512, where QDA_f scoring of the 100,000 rows alone would be
    2.6·10¹³ multiply-adds and its C precisions 2.1 GB. Without an explicit ``n_per_class``
    the head then uses the LDA_f teacher (see :class:`~ghofl.heads.protohyper.ProtoHyperHead`).
    """
    cost = float(num_classes) ** 2 * float(k_f) ** 2 * AUTO_VAL_MIN
    return cost <= AUTO_QDA_MACS


@contextmanager
def blas_threads(limit: int | None) -> Iterator[None]:
    """Limit the BLAS/LAPACK threads of numpy and SciPy to ``limit`` inside the block.

    Used around loops of small per-class factorisations (k_f × k_f eigh, Cholesky, slogdet),
    which multi-threaded OpenBLAS runs far slower on a loaded machine, its threads
    synchronising at every block. ``threadpoolctl`` is a core
    dependency; with ``limit=None`` the block runs unchanged.
    """
    if limit is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(limit), user_api="blas"):
        yield


def synthesis_covariance(syn_class_cov: bool | str, moments: Moments,
                         k_f: int) -> Literal["auto", "pooled"]:
    """The covariance source passed to :func:`~ghofl.heads.synthesis.fisher_gaussians`.

    ``False``: pooled. ``True``: class covariances when the statistics hold them (mode
    ``full``; the paper). ``"auto"``: class covariances only when, in addition, every class
    has more samples than Fisher dimensions (N_c > k_f), so that each class covariance in the
    Fisher space is estimated with full rank; otherwise the pooled one. With N_c ≤ k_f (e.g.
    Tiny-ImageNet: 100 images per class, k_f = 199) the shrunk class Gaussians are mostly
    shrinkage target, and a head trained and selected on samples from them moved away from
    LDA on held-out synthetic samples while losing accuracy on real test data (FisherMix fell
    below LDA).
    """
    if syn_class_cov is False:
        return "pooled"
    if syn_class_cov is True or not moments.has_class_covariances:
        return "auto"
    return "auto" if int(np.min(moments.counts)) > int(k_f) else "pooled"


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

    Model selection (``val_per_class`` None or > 0, the default): a held-out synthetic set of
    ``val_per_class`` samples per class (None: :func:`auto_val_per_class`) is drawn at τ = 1
    from the same class Gaussians (the estimated data distribution, its own seeded stream,
    never trained on). The starting parameters, the closed-form base, are scored on it first;
    after every epoch the current parameters are scored, the most accurate checkpoint that
    beats the base significantly (paired sign test at ``selection_z``) is kept, and training
    stops after ``patience`` epochs without a new best accuracy (:class:`CheckpointSelector`).
    The fitted head is therefore never less accurate than its base on the held-out synthetic
    samples. With ``val_per_class=0`` all ``epochs`` run and the last weights are kept (the
    paper).

    Fitted scalars common to both: ``k_f_``, ``fisher_shrinkage_`` (coefficient used),
    ``fisher_ridge_``, ``syn_covariance_`` (``"class"`` or ``"pooled"``), ``n_per_class_``
    (synthetic samples per class used), ``val_per_class_`` (held-out ones), ``epochs_run_``,
    ``selected_epoch_`` (0: the base was kept; None without selection),
    ``base_val_accuracy_`` and ``val_accuracy_`` (held-out synthetic accuracy of the base and
    of the fitted head; None without selection),
    ``final_loss_`` and ``fit_seconds_`` (wall seconds per stage: ``fisher``, ``synthesis``
    (class Gaussians and the fixed set),
    ``training``, which also holds on-the-fly synthesis and teacher calls when
    ``fresh_samples`` is on).
    """

    min_mode = "gram"
    min_samples = 2
    #: ``fit(X, y)`` computes mode-``full`` statistics, so class covariances are used
    fit_mode: ClassVar[Mode | None] = "full"
    parameter_constraints: ClassVar[dict[str, Constraint]] = {
        "fisher_shrinkage": ShrinkageParam(),
        "fisher_energy": Real(lo=0.0, hi=1.0, lo_open=True),
        "fisher_max_dim": Integer(lo=1, none_ok=True),
        "fisher_min_dim": Integer(lo=1),
        "tau": Real(lo=0.0, lo_open=True),
        "n_per_class": Integer(lo=1, none_ok=True),
        "val_per_class": Integer(lo=0, none_ok=True),
        "patience": Integer(lo=1, none_ok=True),
        "selection_z": Real(lo=0.0),
        "syn_shrink": ShrinkageParam(),
        "syn_class_cov": Options((True, False, "auto")),
        "fresh_samples": BOOL,
        "center": BOOL,
        "prior_correction": BOOL,
        "lr": Real(lo=0.0, lo_open=True),
        "weight_decay": Real(lo=0.0),
        "batch_size": Integer(lo=1),
        "epochs": Integer(lo=1),
        "seed": Integer(lo=0),
        "num_threads": Integer(lo=1, none_ok=True),
        "train_dtype": Options(("auto", "float64", "float32")),
        "progress": BOOL,
    }

    fisher_shrinkage: Shrinkage
    fisher_energy: float
    fisher_max_dim: int | None
    fisher_min_dim: int
    tau: float
    n_per_class: int | None
    val_per_class: int | None
    patience: int | None
    selection_z: float
    syn_shrink: Shrinkage
    syn_class_cov: bool | Literal["auto"]
    fresh_samples: bool
    center: bool
    prior_correction: bool
    lr: float
    weight_decay: float
    batch_size: int
    epochs: int
    seed: int
    num_threads: int | None
    train_dtype: Literal["auto", "float64", "float32"]
    progress: bool

    def _store_init_args(self, args: dict[str, Any]) -> None:
        """Store the ``__init__`` arguments as attributes of the same names.

        ``args`` is ``locals()`` taken as the first statement of the subclass ``__init__``, so
        it holds exactly the parameters (and ``self``, which is skipped).
        """
        for name, value in args.items():
            if name != "self":
                setattr(self, name, value)

    def _fisher_and_gaussians(self, moments: Moments) -> tuple[FisherSubspace, FisherGaussians]:
        """Fisher subspace and class Gaussians; sets the common fitted scalars.

        Both run with one BLAS thread (:func:`blas_threads`): they are eigen- and Cholesky
        factorisations (d × d, then C of k_f × k_f), which OpenBLAS runs several times slower
        with 2 threads on a loaded 2-core machine.
        """
        with self._timed("fisher"), blas_threads(1):
            fs = fisher_subspace(moments, self.params_["fisher_shrinkage"], self.fisher_energy,
                                 self.fisher_max_dim, self.fisher_min_dim)
        with self._timed("synthesis"), blas_threads(1):
            g = fisher_gaussians(moments, fs.V, self.tau, self.params_["syn_shrink"],
                                 synthesis_covariance(self.syn_class_cov, moments, fs.k_f))
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

    def _val_rng(self) -> np.random.Generator:
        """The generator of the held-out synthetic set: the 4th child of ``SeedSequence(seed)``.

        The first three are those of :meth:`_rngs`, unchanged.
        """
        return np.random.default_rng(np.random.SeedSequence(int(self.seed)).spawn(4)[3])

    def _samples_per_class(self, num_classes: int) -> int:
        """``n_per_class``, or :func:`auto_train_samples_per_class` when it is None.

        The automatic count uses the fitted ``k_f_``.
        """
        if self.n_per_class is None:
            return auto_train_samples_per_class(num_classes, int(self.k_f_))
        return int(self.n_per_class)

    def _np_dtype(self, num_classes: int) -> type[np.floating[Any]]:
        """The dtype of the synthetic rows, their targets and the heavy products.

        ``train_dtype``; ``"auto"`` is float32 when the layer has more than
        ``AUTO_FLOAT32_LAYER`` = 10⁵ entries C·k_f (from C ≈ 317 at k_f = C − 1), else float64.
        The parameters (and so the starting base, kept by model selection) stay float64.
        """
        if self.train_dtype == "float32" or (
                self.train_dtype == "auto" and num_classes * int(self.k_f_) > AUTO_FLOAT32_LAYER):
            return np.float32
        return np.float64

    def _validation_set(self, g: FisherGaussians,
                        priors: F64) -> tuple[FArr, NDArray[np.int64]] | None:
        """Held-out synthetic samples ``(z (≈C·m, k_f), y)`` drawn at τ = 1, or None (m = 0).

        m = ``val_per_class``, or :func:`auto_val_per_class` when it is None. Class c gets
        max(1, round(C·m·π_c)) rows (π: the class priors of the statistics), so that held-out
        accuracy weighs the classes as the data do. Rows are of the training dtype.
        """
        m = (auto_val_per_class(g.num_classes) if self.val_per_class is None
             else int(self.val_per_class))
        self.val_per_class_ = m
        if m == 0:
            return None
        counts = np.maximum(np.rint(g.num_classes * m * priors), 1).astype(np.int64)
        return sample_fixed(g.at_tau(1.0), counts, self._val_rng(),
                            self._np_dtype(g.num_classes))

    def _train_selected(
        self,
        params: list[torch.Tensor],
        loss_fn: LossFn,
        epoch_source: Callable[[], Iterable[TorchBatch]],
        val_logits: Callable[[FArr, slice], FArr] | None,
        val: tuple[FArr, NDArray[np.int64]] | None,
    ) -> None:
        """Train ``params`` in place with model selection on ``val`` (when given).

        ``val_logits(z, rows)`` scores the held-out rows ``z = z_val[rows]`` with the current
        parameters (numpy, (len, C)); it is called on blocks of rows (``VAL_SCORE_BYTES`` of
        logits each). Sets ``final_loss_``, ``epochs_run_``, ``selected_epoch_``,
        ``base_val_accuracy_`` and ``val_accuracy_``; on return ``params`` hold the kept
        checkpoint.
        """
        cfg = self._train_config()
        if val is None or val_logits is None:
            self.final_loss_, self.epochs_run_ = run_training(params, loss_fn, epoch_source, cfg)
            self.selected_epoch_ = self.base_val_accuracy_ = self.val_accuracy_ = None
            return
        z_val, y_val = val
        block = max(1, VAL_SCORE_BYTES // (8 * max(self._num_classes, 1)))

        def snapshot() -> list[F64]:
            return [p.detach().numpy() for p in params]

        def correct() -> NDArray[np.bool_]:
            out = np.empty(y_val.size, dtype=bool)
            for s in range(0, y_val.size, block):
                rows = slice(s, s + block)
                out[rows] = np.argmax(val_logits(z_val[rows], rows), axis=1) == y_val[rows]
            return out

        with self._timed("selection"):
            selector = CheckpointSelector(correct(), snapshot(), self.patience,
                                          float(self.selection_z))

        def after_epoch(epoch: int) -> bool:
            with self._timed("selection"):
                return selector.offer(epoch, correct(), snapshot)

        self.final_loss_, self.epochs_run_ = run_training(params, loss_fn, epoch_source, cfg,
                                                          after_epoch)
        import torch

        with torch.no_grad():
            for p, kept in zip(params, selector.state, strict=True):
                p.copy_(torch.from_numpy(kept))
        self.selected_epoch_ = selector.best_epoch
        self.base_val_accuracy_ = selector.base_score
        self.val_accuracy_ = selector.best_score

    def _epoch_source(
        self, g: FisherGaussians, extra_fn: Callable[[FArr], FArr] | None,
    ) -> Callable[[], Iterable[TorchBatch]]:
        """A callable returning one epoch of torch batches (fixed set or fresh draws).

        Fixed set: drawn once (in the training dtype) and reshuffled every epoch (rows gathered
        per batch, wrapped as tensors without copying); ``extra_fn`` (e.g. teacher targets) is
        evaluated once on it. Fresh: new samples every epoch, ``extra_fn`` evaluated per batch.
        """
        import torch

        syn_rng, order_rng, _ = self._rngs()
        n_per_class = self._samples_per_class(g.num_classes)
        self.n_per_class_ = n_per_class
        dtype = self._np_dtype(g.num_classes)
        if self.fresh_samples:
            def fresh() -> Iterator[TorchBatch]:
                for z, y in fresh_batches(g, n_per_class, self.batch_size, syn_rng,
                                          dtype=dtype):
                    extra = None if extra_fn is None else torch.from_numpy(extra_fn(z))
                    yield torch.from_numpy(z), torch.from_numpy(y), extra
            return fresh
        with self._timed("synthesis"):
            z_np, y_np = sample_fixed(g, n_per_class, syn_rng, dtype)
        with self._timed("teacher"):
            e_np = None if extra_fn is None else extra_fn(z_np)

        def fixed() -> Iterator[TorchBatch]:
            # np.take gathers rows faster than torch advanced indexing
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
        self.fit_seconds_ = dict.fromkeys(STAGES, 0.0)
        self._num_classes = moments.num_classes
        fs, g = self._fisher_and_gaussians(moments)
        with torch_session(self.num_threads):
            self._train(moments, fs, g)
        other = sum(self.fit_seconds_.values())
        self.fit_seconds_["training"] = time.perf_counter() - start - other

    @abstractmethod
    def _train(self, moments: Moments, fs: FisherSubspace, g: FisherGaussians) -> None:
        """Train inside the torch session and store numpy fitted arrays."""

    # ------------------------------------------------------------------ prediction
    def _scores(self, X: NDArray[Any]) -> F64:
        """Scores (n, C) of raw inputs, the finiteness check read off z_f = X V_.

        Every check and message of :meth:`~ghofl.heads.base.Head._prepare`, but ``X`` is read
        once, in its own dtype, by the product (:func:`~ghofl.heads._linalg.project_rows`
        casts a float32 or integer ``X`` to float64 block by block, and a finite z_f proves
        ``X`` finite), and checked itself only when z_f is not finite.
        """
        X = self._validated_input(X)
        if X.dtype.itemsize > 8:  # long double: cast as a whole, its overflow to inf refused
            X = np.asarray(X, dtype=np.float64)
        if self.meta_.projection is not None:
            Z = np.asarray(X, dtype=np.float64)
            check_finite_inputs(Z)
            return self._decision(self.meta_.projection.apply(Z))
        z, finite = project_rows(X, self.V_, check_finite=True)
        if not finite:  # a NaN or an infinity in X, or an overflow in X V_
            check_finite_inputs(X)
        return self._fisher_decision(z)

    def _decision(self, Z: F64) -> F64:
        """Scores (n, C) on inputs in the statistics space: :meth:`_fisher_decision` of Z V_."""
        return self._fisher_decision(project_rows(Z, self.V_)[0])

    @abstractmethod
    def _fisher_decision(self, z: F64) -> F64:
        """Scores (n, C) on Fisher features z_f = Z V_ (n, k_f), in numpy float64."""


__all__ = [
    "F64",
    "STAGES",
    "CheckpointSelector",
    "FisherTrainedHead",
    "LossFn",
    "TorchBatch",
    "TrainConfig",
    "accuracy",
    "auto_qda_samples_per_class",
    "auto_samples_per_class",
    "auto_train_samples_per_class",
    "auto_val_per_class",
    "blas_threads",
    "qda_teacher_affordable",
    "run_training",
    "synthesis_covariance",
    "torch_session",
    "uniform_init",
]
