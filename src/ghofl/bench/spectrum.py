"""Seeded class-conditional Gaussian data with a power-law spectrum, at many classes.

For the many-class scale benchmark (issue 23: C = 1,000). One random orthonormal basis U
(QR of a d × d standard normal matrix) and eigenvalues λ_i ∝ i^-``decay`` (i = 1..d) scaled so
that Σ λ_i = ``trace``, as the embeddings of pretrained encoders look (a few strong directions,
a long tail). The shared covariance is Σ = U diag(λ) Uᵀ. Class c has

* mean μ_c = U (√λ ∘ g_c)·``separation``, g_c ~ N(0, I_d): the class means spread along the
  same spectrum as the noise, so the squared Mahalanobis distance between two classes under Σ
  is about 2·d·``separation``²;
* covariance Σ_c = U diag(λ ∘ s_c²) Uᵀ, a perturbation of Σ: the per-direction scales
  s_c = exp(``class_jitter``·h_c), h_c ~ N(0, I_d), give every class its own spectrum in the
  shared eigenbasis (``class_jitter = 0``: one shared covariance).

Samples are x = μ_c + U (√λ ∘ s_c ∘ z), z ~ N(0, I_d). :func:`draw` returns labelled samples of
chosen classes; :func:`class_statistics` accumulates the clients' statistics of ``per_class``
samples of every class in chunks of classes (:class:`~ghofl.stats.accumulate.StatsAccumulator`),
so the statistics are the exact sums of samples that were drawn, with the whole training set
never in memory. Everything comes from ``numpy.random.default_rng(seed)`` in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.stats.accumulate import StatsAccumulator
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import Mode

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

__all__ = ["SpectrumClasses", "class_statistics", "draw", "spectrum_classes"]


@dataclass(frozen=True)
class SpectrumClasses:
    """The parameters of a generated class-conditional distribution.

    Attributes
    ----------
    basis : ndarray, shape (d, d)
        Orthonormal eigenbasis U of the shared covariance (columns).
    eigenvalues : ndarray, shape (d,)
        λ, decreasing, summing to the trace.
    means : ndarray, shape (C, d)
        Class means μ_c.
    scales : ndarray, shape (C, d)
        Per-class standard deviations √λ ∘ s_c along the columns of U.
    """

    basis: F64
    eigenvalues: F64
    means: F64
    scales: F64

    @property
    def num_classes(self) -> int:
        """Number of classes C."""
        return int(self.means.shape[0])

    @property
    def dim(self) -> int:
        """Dimension d."""
        return int(self.means.shape[1])


def spectrum_classes(seed: int, dim: int, num_classes: int, *, decay: float = 1.0,
                     trace: float = 100.0, separation: float = 0.1,
                     class_jitter: float = 0.25) -> SpectrumClasses:
    """Draw the parameters of a power-law-spectrum class-conditional Gaussian (module docstring).

    Parameters
    ----------
    seed : int
        Seed of ``numpy.random.default_rng``.
    dim : int
        Dimension d (at least 1).
    num_classes : int
        Number of classes C (at least 2).
    decay : float, default 1.0
        Eigenvalues λ_i ∝ i^-decay.
    trace : float, default 100.0
        Σ λ_i.
    separation : float, default 0.1
        Scale of the class means along the spectrum.
    class_jitter : float, default 0.25
        Standard deviation of the log per-class scales (0: a shared covariance).

    Returns
    -------
    SpectrumClasses
    """
    if dim < 1 or num_classes < 2:
        raise ConfigError(f"need dim >= 1 and num_classes >= 2; got {dim}, {num_classes}")
    if trace <= 0 or separation < 0 or class_jitter < 0:
        raise ConfigError("trace must be > 0, separation and class_jitter >= 0")
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    basis = np.ascontiguousarray(q * np.sign(np.diag(r)))
    lam = np.arange(1, dim + 1, dtype=np.float64) ** -float(decay)
    lam *= trace / lam.sum()
    root = np.sqrt(lam)
    means = (rng.standard_normal((num_classes, dim)) * root * separation) @ basis.T
    scales = root * np.exp(class_jitter * rng.standard_normal((num_classes, dim)))
    return SpectrumClasses(basis, lam, np.ascontiguousarray(means), scales)


def draw(gen: SpectrumClasses, y: I64, rng: np.random.Generator) -> F64:
    """Samples x_i of the classes ``y`` (n,): μ_y + U (scales_y ∘ z), z ~ N(0, I).

    Parameters
    ----------
    gen : SpectrumClasses
    y : ndarray of int64, shape (n,)
        Class of each sample.
    rng : numpy.random.Generator
        Source of z.

    Returns
    -------
    ndarray, shape (n, d)
    """
    z = rng.standard_normal((y.size, gen.dim)) * gen.scales[y]
    x: F64 = gen.means[y] + z @ gen.basis.T
    return x


def class_statistics(gen: SpectrumClasses, per_class: int, mode: Mode, seed: int,
                     classes_per_chunk: int = 100) -> ClientStats:
    """Statistics of ``per_class`` fresh samples of every class, accumulated chunk by chunk.

    Parameters
    ----------
    gen : SpectrumClasses
    per_class : int
        Samples per class N_c.
    mode : {"full", "pooled", "diag", "means"}
        Upload mode of the statistics.
    seed : int
        Seed of the samples (independent of the parameters' seed).
    classes_per_chunk : int, default 100
        Classes drawn at once (memory: ``classes_per_chunk·per_class·d`` floats).

    Returns
    -------
    ClientStats
        Exact sums over the drawn samples.
    """
    rng = np.random.default_rng(seed)
    acc = StatsAccumulator(gen.num_classes, gen.dim, mode)
    for start in range(0, gen.num_classes, classes_per_chunk):
        stop = min(start + classes_per_chunk, gen.num_classes)
        y = np.repeat(np.arange(start, stop, dtype=np.int64), per_class)
        acc.update(draw(gen, y, rng), y)
    return acc.result()
