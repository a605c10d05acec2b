"""Pre-flight estimates: warn before a fit that will not fit in memory or will take very long.

:func:`estimate_fit` gives a rough peak working memory (bytes, beyond the statistics total the
server already holds) and a rough amount of work (floating-point operations) for fitting one
head from statistics of C classes in dimension d, from the shapes the head allocates:

* upload mode ``full``: the total holds C per-class d × d second moments, M = C·d²·8 bytes;
  the moments add about 0.1·M of working memory, ``qda`` its per-class factors and precisions
  (1.2·M more) and C·d³·4 flops (eigendecompositions, Cholesky factors, inverses);
* the trainable heads (``fishermix``, ``protohyper``): the training and held-out synthetic
  sets, C·n and C·m rows in the Fisher space of k_f = min(C − 1, d, ``fisher_max_dim``)
  dimensions (n, m: ``n_per_class`` and ``val_per_class`` or their automatic values) in the
  training dtype (float32 from C·k_f > 10⁵), a float64 sampling chunk, the parameters with
  their gradients and AdamW state (6·C·k_f·8), the synthesis factors (one k_f × k_f, or C in
  mode ``full`` when N_c > k_f) and blocks of held-out scores; Proto-Hyper adds its targets
  (C·n, 2C), the held-out base logits (C·m, C), float64 scoring blocks and, with QDA_f (mode
  ``full``), C precisions and covariances. Work: sampling, epochs·(6·C·n + 2·C·m)·C·k_f for
  FisherMix's layer and its held-out scoring (float32 counted at half), Proto-Hyper's teacher
  and base on every row and QDA_f C·k_f²·2 per row, all dense products counted at
  1/``GEMM_SPEEDUP``, plus ``KD_OPS`` per row and class per epoch for Proto-Hyper's loss;
  every epoch is assumed to run (early stopping may end sooner);
* ``ridge``, ``fed3r``, ``fedcof`` (the heads with ``n_calibration``): their temperature
  calibration scores C·n synthetic rows (n: ``n_calibration``)
  against C classes, with about 8 copies of the (C·n, C) scores: 8·C²·n·8 bytes (16 GB at
  C = 1,000 and the default n = 256);
* every other head: a few d × d matrices, C·d² + 10·d³ flops.

:func:`preflight` compares the estimates with the memory available now (``MemAvailable`` of
``/proc/meminfo``) and with ``max_seconds`` at ``flop_rate`` and warns
(:class:`ResourceEstimateWarning`) for each head that exceeds either, saying what to do. It
never changes a head or its fit: :func:`ghofl.server.job.run_server_job` (``ghofl fit``, the
simulator, the Flower server) calls it before fitting. The estimates are deliberately simple
(rough, within a small factor of the peak memory and time of a fit).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ghofl.errors import GhoflWarning
from ghofl.heads.base import Head
from ghofl.stats.meta import Mode

__all__ = ["FitEstimate", "ResourceEstimateWarning", "available_memory", "estimate_fit",
           "preflight"]

#: floating-point operations per second assumed per CPU core (a rough, conservative rate)
FLOP_RATE_PER_CORE = 2.5e9
#: estimated fit seconds above which :func:`preflight` warns
MAX_SECONDS = 600.0
#: how many times faster than ``FLOP_RATE_PER_CORE`` the trainable heads' dense matrix
#: products (sampling, the layer, scoring) are counted: BLAS matrix products run far above
#: the per-core rate; 4 keeps the estimate conservative on a loaded machine
GEMM_SPEEDUP = 4.0
#: nominal operations per row and class of one epoch of Proto-Hyper's elementwise KD loss
#: (softmaxes, KL, cross-entropy, their gradients)
KD_OPS = 300.0
#: heads trained on synthetic samples
TRAINABLE = frozenset({"fishermix", "protohyper"})


class ResourceEstimateWarning(GhoflWarning):
    """A head's estimated memory or time is beyond the machine (see :func:`preflight`)."""


@dataclass(frozen=True)
class FitEstimate:
    """Rough cost of one head's fit.

    Attributes
    ----------
    memory_bytes : float
        Peak working memory beyond the statistics total.
    flops : float
        Floating-point operations.
    """

    memory_bytes: float
    flops: float

    def seconds(self, flop_rate: float) -> float:
        """Estimated wall seconds at ``flop_rate`` operations per second."""
        return self.flops / flop_rate


def _trainable(head: Head, mode: Mode, c: int, d: int, min_count: int | None) -> FitEstimate:
    """Working memory and work of FisherMix / Proto-Hyper (module docstring, bullet 2)."""
    # lazy: the training module loads the LDA head, which the Flower client app must not
    from ghofl.heads import _training as tr
    from ghofl.heads.synthesis import CHUNK_SAMPLES

    cap = getattr(head, "fisher_max_dim", None)
    k = max(1, min(c - 1, d, int(cap) if cap else c))
    dtype = getattr(head, "train_dtype", "auto")
    b = 4.0 if dtype == "float32" or (dtype == "auto" and c * k > tr.AUTO_FLOAT32_LAYER) else 8.0
    n = getattr(head, "n_per_class", None)
    base = getattr(head, "base", "lda")
    qda = head.name == "protohyper" and mode == "full" and (
        base != "lda" or (getattr(head, "teacher", "") == "informative"
                          and (n is not None or tr.qda_teacher_affordable(c, k))))
    if n is None:
        n = tr.auto_train_samples_per_class(c, k)
        n = min(n, tr.auto_qda_samples_per_class(c, k)) if qda else n
    m = getattr(head, "val_per_class", None)
    rows, val = float(c) * int(n), float(c) * (tr.auto_val_per_class(c) if m is None else int(m))
    syn = getattr(head, "syn_class_cov", "auto")
    class_syn = mode == "full" and syn is not False and (
        syn is True or min_count is None or min_count > k)
    factors = c * k * k * 8.0 if class_syn else k * k * 8.0
    chunk = 8.0 if class_syn else b  # a shared factor samples in the training dtype
    # the two synthetic sets, the sampling chunk, the parameters with their gradients, AdamW
    # moments and casts, the class covariances and their factors
    memory = ((rows + val) * k * b + 2.0 * CHUNK_SAMPLES * k * chunk + 6.0 * c * k * 8.0
              + 2.0 * factors)
    # sampling (ε Lᵀ, C Cholesky factors); float32 work counted at half the float64 cost
    gemm = 2.0 * (rows + val) * k * k * chunk / 8.0 + (c * k**3 / 3.0 if class_syn else 0.0)
    epochs = float(getattr(head, "epochs", 40))
    if head.name == "fishermix":
        memory += 1.5 * tr.VAL_SCORE_BYTES * b / 8.0 + 4.0 * int(getattr(head, "batch_size",
                                                                          2048)) * c * b
        gemm += epochs * (6.0 * rows + 2.0 * val) * c * k * b / 8.0
        return FitEstimate(memory, gemm / GEMM_SPEEDUP)
    from ghofl.heads.protohyper import score_rows

    # targets [teacher | base] (rows, 2C), held-out base logits, float64 scoring blocks
    memory += (2.0 * rows + val) * c * b + 12.0 * score_rows(c) * c * 8.0
    # teacher and base (LDA_f, NB_f) on every row; the elementwise KD loss per row and class
    gemm += 4.0 * (rows + 2.0 * val) * c * k
    if qda:  # QDA_f precisions and covariances; QDA_f scoring of every row
        memory += 2.0 * c * k * k * 8.0
        gemm += 2.0 * (rows + val) * c * k * k + c * k**3
    return FitEstimate(memory, gemm / GEMM_SPEEDUP + epochs * rows * c * KD_OPS)


def estimate_fit(head: Head, mode: Mode, num_classes: int, dim: int,
                 min_count: int | None = None) -> FitEstimate:
    """Rough peak memory and work of fitting ``head`` (module docstring).

    Parameters
    ----------
    head : Head
        The (unfitted) head, with its hyperparameters.
    mode : {"full", "pooled", "diag", "means"}
        Upload mode of the statistics.
    num_classes : int
        C.
    dim : int
        d of the statistics (after any projection).
    min_count : int, optional
        Fewest samples of a class, min N_c: the trainable heads synthesise from class
        covariances in mode ``full`` only when N_c > k_f (``syn_class_cov="auto"``); None
        assumes they do.

    Returns
    -------
    FitEstimate
    """
    c, d = int(num_classes), int(dim)
    per_class = c * d * d * 8.0 if mode == "full" else 0.0
    base = FitEstimate(0.1 * per_class + 4 * d * d * 8.0, c * d * d + 10.0 * d**3)
    if head.name == "qda":
        return FitEstimate(base.memory_bytes + 1.2 * per_class, base.flops + 4.0 * c * d**3)
    if getattr(head, "n_calibration", None):
        from ghofl.heads.ridge import calibration_rows_per_class

        rows = float(c) * calibration_rows_per_class(int(getattr(head, "n_calibration", 0)), c)
        # the (rows, C) score array, its own-class column, one block of the objective
        return FitEstimate(base.memory_bytes + 2.0 * rows * c * 8.0,
                           base.flops + rows * (d * d + 2.0 * d * c + 20.0 * c))
    if head.name in TRAINABLE:
        extra = _trainable(head, mode, c, d, min_count)
        return FitEstimate(base.memory_bytes + extra.memory_bytes, base.flops + extra.flops)
    return base


def available_memory() -> int | None:
    """Bytes of memory available now (``MemAvailable`` of ``/proc/meminfo``), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _gb(b: float) -> str:
    return f"{b / 1e9:.1f} GB"


def preflight(models: Mapping[str, Head], mode: Mode, num_classes: int, dim: int, *,
              min_count: int | None = None, available: int | None = None,
              flop_rate: float | None = None,
              max_seconds: float = MAX_SECONDS) -> dict[str, FitEstimate]:
    """Warn, before fitting, for every head whose estimated memory or time is beyond the machine.

    Parameters
    ----------
    models : mapping of str to Head
        The heads about to be fitted.
    mode : {"full", "pooled", "diag", "means"}
        Upload mode of the statistics.
    num_classes, dim : int
        C and d of the statistics.
    min_count : int, optional
        Fewest samples of a class (see :func:`estimate_fit`).
    available : int, optional
        Available memory in bytes (default :func:`available_memory`; unknown: no memory check).
    flop_rate : float, optional
        Operations per second (default ``FLOP_RATE_PER_CORE`` times the CPU count).
    max_seconds : float, default 600
        Estimated fit seconds above which a head is reported.

    Returns
    -------
    dict of str to FitEstimate
        The estimate of every head.

    Warns
    -----
    ResourceEstimateWarning
        Per head over either limit, with the estimate and what to do.
    """
    avail = available_memory() if available is None else available
    rate = flop_rate or FLOP_RATE_PER_CORE * (os.cpu_count() or 1)
    out: dict[str, FitEstimate] = {}
    for name, head in models.items():
        est = out[name] = estimate_fit(head, mode, num_classes, dim, min_count)
        where = f"head {name!r} at C = {num_classes}, d = {dim} (mode {mode!r})"
        if avail is not None and est.memory_bytes > avail:
            warnings.warn(
                f"{where}: estimated memory {_gb(est.memory_bytes)} exceeds the "
                f"{_gb(avail)} available; the fit may fail or swap. "
                + ("Lower n_calibration (e.g. 32) or set it to 0. "
                   if getattr(head, "n_calibration", None) else "")
                + "Use a public projection (--projection-dim) or a lighter upload mode, or fit "
                "this head on a larger machine", ResourceEstimateWarning, stacklevel=2)
        secs = est.seconds(rate)
        if math.isfinite(secs) and secs > max_seconds:
            tip = ("fewer epochs or n_per_class" if name in TRAINABLE
                   else "a public projection (--projection-dim) or a lighter head")
            warnings.warn(
                f"{where}: estimated time {secs / 60:.0f} min exceeds {max_seconds / 60:.0f} "
                f"min (about {est.flops:.1e} operations at {rate:.1e}/s); consider {tip}",
                ResourceEstimateWarning, stacklevel=2)
    return out
