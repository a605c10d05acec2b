"""Class-conditional Gaussian synthesis in the Fisher space (method.md §3, reference-notes §5).

For each class c (eq. S1)::

    z_f ~ N(μ_cᶠ, τ² Σ̃_cᶠ),   μ_cᶠ = Vᵀ μ_c,   Σ̃_cᶠ = Vᵀ shrink(Σ_c, a_syn) V

with the class covariances Σ_c when the statistics are mode ``full`` (``covariance="class"``)
and the pooled Σ_pool otherwise (``covariance="pooled"``). Samples are drawn as
z = μ_cᶠ + ε L_cᵀ with ε ~ N(0, I) and L_c the lower Cholesky factor of τ² Σ̃_cᶠ, computed once
per class (a ridge is added only if a factor does not exist, with a warning). With the pooled
covariance every class shares one factor: it is computed once and held once (``chols`` is then
a read-only broadcast view, C·k_f²·8 bytes never allocated: 8 GB at C = 1,000, k_f = 999), and
the rows of consecutive classes are drawn with one matrix product per chunk.

Randomness: every function takes an explicit ``numpy.random.Generator`` (PCG64); nothing uses a
global RNG. The fixed set (the paper) is drawn class by class, c = 0..C−1, one
``standard_normal((n, k_f))`` call each (for a shared factor, one call per chunk of whole
classes, which yields the same normal deviates in the same order). Samples can be stored as
float32 (``dtype``): from class factors they are computed in float64 and rounded once, from a
shared factor drawn and multiplied in float32. Fresh sampling (the
``SynthGaussianZ`` variant) draws a new class-balanced set every epoch in chunks, so memory is
O(chunk · k_f), never C·n·k_f.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import UnsupportedModeError
from ghofl.heads._linalg import stable_cholesky
from ghofl.heads.fisher import fisher_class_covariances, fisher_pooled_covariance
from ghofl.moments.core import Moments
from ghofl.moments.shrinkage import Shrinkage

F64 = NDArray[np.float64]
#: a float array of the training dtype (float64 or float32)
FArr = NDArray[np.floating[Any]]
I64 = NDArray[np.int64]
CovarianceSource = Literal["auto", "class", "pooled"]

#: samples generated per chunk when sampling fresh data (rounded to whole batches)
CHUNK_SAMPLES = 16384


@dataclass(frozen=True, eq=False)
class FisherGaussians:
    """Per-class Gaussians in the Fisher space, ready to sample.

    Attributes
    ----------
    means : ndarray, shape (C, k_f)
        μ_cᶠ.
    chols : ndarray, shape (C, k_f, k_f)
        Lower Cholesky factors L_c of τ² Σ̃_cᶠ; with the pooled covariance a read-only
        broadcast view of one factor (:attr:`shared`).
    source : {"class", "pooled"}
        Which covariance was used.
    tau : float
    """

    means: F64
    chols: F64
    source: Literal["class", "pooled"]
    tau: float

    @property
    def num_classes(self) -> int:
        """Number of classes C."""
        return int(self.means.shape[0])

    @property
    def dim(self) -> int:
        """Dimension of the Fisher space."""
        return int(self.means.shape[1])

    @property
    def shared(self) -> bool:
        """Whether every class uses one factor (held once, ``chols`` a broadcast view)."""
        return self.chols.shape[0] > 1 and self.chols.strides[0] == 0

    def covariances(self) -> F64:
        """τ² Σ̃_cᶠ = L_c L_cᵀ, shape (C, k_f, k_f) (a broadcast view when :attr:`shared`)."""
        if self.shared:
            one = self.chols[0] @ self.chols[0].T
            return np.broadcast_to(one, self.chols.shape)
        out: F64 = self.chols @ np.swapaxes(self.chols, 1, 2)
        return out

    def at_tau(self, tau: float) -> FisherGaussians:
        """The same Gaussians at covariance scale ``tau``.

        The factors are multiplied by tau/τ; a shared factor stays shared (held once).
        """
        ratio = float(tau) / self.tau
        chols = (np.broadcast_to(self.chols[0] * ratio, self.chols.shape) if self.shared
                 else self.chols * ratio)
        return FisherGaussians(means=self.means, chols=chols, source=self.source,
                               tau=float(tau))


def fisher_gaussians(
    moments: Moments,
    V: F64,
    tau: float = 0.9,
    shrinkage: Shrinkage = 0.05,
    covariance: CovarianceSource = "auto",
) -> FisherGaussians:
    """Build the class Gaussians of eq. S1.

    Parameters
    ----------
    moments : Moments
    V : ndarray, shape (d, k_f)
        Fisher directions (:func:`ghofl.heads.fisher.fisher_subspace`).
    tau : float, default 0.9
        Covariance scale τ (paper: ``syn_tau_base``, constant).
    shrinkage : float in [0, 1] or "auto", default 0.05
        a_syn (paper: ``syn_shrink``).
    covariance : {"auto", "class", "pooled"}, default "auto"
        ``"auto"`` uses class covariances when the statistics hold them (mode ``full``), else
        the pooled one; ``"class"`` requires mode ``full``.
    """
    if covariance == "class" and not moments.has_class_covariances:
        raise UnsupportedModeError(
            "synthesis from class covariances needs upload mode 'full'; these statistics are "
            f"mode {moments.meta.mode!r}. Use the pooled covariance (syn_class_cov=False) or "
            "recompute the statistics with --mode full"
        )
    use_class = covariance == "class" or (covariance == "auto" and moments.has_class_covariances)
    k, c_num = V.shape[1], moments.num_classes
    if use_class:
        covs = fisher_class_covariances(moments, V, shrinkage)
        chols = np.empty((c_num, k, k))
        for c in range(c_num):
            chols[c], _ = stable_cholesky(tau**2 * covs[c], "the synthesis covariance of class "
                                          f"{moments.meta.classes[c]!r}")
    else:
        one, _ = stable_cholesky(tau**2 * fisher_pooled_covariance(moments, V, shrinkage),
                                 "the pooled synthesis covariance")
        chols = np.broadcast_to(one, (c_num, k, k))
    means_f: F64 = moments.means @ V
    return FisherGaussians(means=means_f, chols=chols, source="class" if use_class else "pooled",
                           tau=float(tau))


def sample_class(g: FisherGaussians, c: int, n: int, rng: np.random.Generator) -> F64:
    """A sample of n rows of class c: μ_cᶠ + ε L_cᵀ, shape (n, k_f)."""
    eps = rng.standard_normal((n, g.dim))
    out: F64 = g.means[c] + eps @ g.chols[c].T
    return out


def _fill_sorted(g: FisherGaussians, y: I64, out: FArr, rng: np.random.Generator) -> None:
    """Rows of the classes ``y`` (sorted ascending) into ``out`` (len(y), k_f), in place.

    Per class one ``standard_normal`` call (class factors), or, for a shared factor, one call
    and one product for all rows: the same deviates in the same order; into a float32 ``out``
    the deviates and the product are float32 (half the work of float64).
    """
    if g.shared:
        dt = np.float32 if out.dtype == np.float32 else np.float64
        eps = rng.standard_normal((y.size, g.dim), dtype=dt)
        eps = eps @ g.chols[0].T.astype(dt)
        eps += g.means[y].astype(dt)
        out[...] = eps
        return
    starts = np.flatnonzero(np.r_[True, y[1:] != y[:-1]]) if y.size else np.zeros(0, int)
    for s, e in zip(starts, np.r_[starts[1:], y.size], strict=True):
        out[s:e] = sample_class(g, int(y[s]), int(e - s), rng)


def sample_fixed(g: FisherGaussians, n_per_class: int | I64, rng: np.random.Generator,
                 dtype: type[np.floating[Any]] = np.float64) -> tuple[FArr, I64]:
    """The paper's fixed, class-balanced set, class-blocked (c = 0..C−1).

    ``n_per_class`` is one count for every class, or an array (C,) of counts per class (e.g.
    proportional to the class priors). Rows are drawn in chunks of whole classes of about
    ``CHUNK_SAMPLES`` rows, so the float64 temporaries stay O(chunk · k_f).

    Returns ``(z (Σ n_c, k_f) of ``dtype``, y (Σ n_c,) int64)``.
    """
    counts = np.broadcast_to(np.asarray(n_per_class, dtype=np.int64), (g.num_classes,))
    y = np.repeat(np.arange(g.num_classes, dtype=np.int64), counts)
    z = np.empty((y.size, g.dim), dtype=dtype)
    start = rows = 0
    for c, n in enumerate(counts.tolist()):  # chunks of whole classes, ≈ CHUNK_SAMPLES rows
        rows += n
        if rows - start >= CHUNK_SAMPLES or c == g.num_classes - 1:
            _fill_sorted(g, y[start:rows], z[start:rows], rng)
            start = rows
    return z, y


def shuffled_batches(n_total: int, batch_size: int,
                     rng: np.random.Generator) -> Iterator[I64]:
    """One epoch of index batches over ``range(n_total)`` in a fresh random order."""
    perm = rng.permutation(n_total)
    for start in range(0, n_total, batch_size):
        yield perm[start:start + batch_size]


def fresh_batches(g: FisherGaussians, n_per_class: int, batch_size: int,
                  rng: np.random.Generator, chunk_samples: int = CHUNK_SAMPLES,
                  dtype: type[np.floating[Any]] = np.float64) -> Iterator[tuple[FArr, I64]]:
    """One epoch of newly drawn, shuffled batches ``(z (b, k_f), y (b,))``.

    Every class appears exactly ``n_per_class`` times per epoch. Samples are generated one
    chunk of ≈ ``chunk_samples`` rows (whole batches) at a time, class by class inside the
    chunk, so peak memory is O(chunk · k_f) plus the C·n labels.
    """
    labels = rng.permutation(np.repeat(np.arange(g.num_classes, dtype=np.int64), n_per_class))
    chunk = batch_size * max(1, chunk_samples // batch_size)
    for start in range(0, labels.size, chunk):
        y = labels[start:start + chunk]
        order = np.argsort(y, kind="stable")
        z_sorted = np.empty((y.size, g.dim), dtype=dtype)
        _fill_sorted(g, y[order], z_sorted, rng)
        z = np.empty_like(z_sorted)
        z[order] = z_sorted
        for b in range(0, y.size, batch_size):
            yield z[b:b + batch_size], y[b:b + batch_size]


__all__ = [
    "CHUNK_SAMPLES",
    "FArr",
    "FisherGaussians",
    "fisher_gaussians",
    "fresh_batches",
    "sample_class",
    "sample_fixed",
    "shuffled_batches",
]
