"""FedCOF: class covariances estimated from the spread of the clients' class means.

FedCOF (Goswami et al., "Covariances for free", NeurIPS 2025) has each client k upload only its
class counts n_kc and class means μ_kc (ghofl mode ``means``: n_kc and A_kc = n_kc μ_kc). With
the global class mean μ_c = Σ_k A_kc / N_c, N_c = Σ_k n_kc and K_c the number of clients that
hold class c, the server estimates the class covariance by

    Σ̂_c = 1/(K_c − 1) · Σ_k n_kc (μ_kc − μ_c)(μ_kc − μ_c)ᵀ          (K_c ≥ 2; 0 when K_c = 1)

Unbiasedness: when each client's samples of class c are independent draws from one
distribution with covariance Σ_c (whatever the number n_kc each client holds), μ_kc has
covariance Σ_c/n_kc and E[Σ_k n_kc μ_kc μ_kcᵀ − N_c μ_c μ_cᵀ] = K_c Σ_c − Σ_c, so
E[Σ̂_c] = Σ_c. The estimate has K_c − 1 degrees of freedom instead of N_c − 1: it is noisy for
few clients, and it depends on the partition (one client per class gives 0), unlike the sums of
every other ghofl mode, which are partition-invariant.

What the server sees: the estimator needs every client's means, not only their sum, so it runs on
plain uploads only. Under secure aggregation the server would need, per class,
Σ_k A_kc A_kcᵀ / n_kc (then Σ_k n_kc (μ_kc − μ_c)(μ_kc − μ_c)ᵀ = Σ_k A_kc A_kcᵀ/n_kc −
A_c A_cᵀ/N_c); that is a (d, d) matrix per class per client, the size of mode ``full`` (and of
``pooled`` if summed over classes, which needs the weights 1/(K_c − 1) that the clients do not
know). At that upload size mode ``full``/``pooled`` gives the exact covariances, so ghofl offers
FedCOF's estimate only on plain ``means`` uploads (:func:`fedcof_statistics`).

:func:`fedcof_statistics` returns statistics whose second moments are the FedCOF estimates,
S_c = (N_c − 1) Σ̂_c + A_c A_cᵀ / N_c (the sums of x xᵀ a class with that covariance would
have), in mode ``pooled`` (B = Σ_c S_c and D_c = diag S_c; no (C, d, d) array) or ``full``, so
every ghofl head fits from them (LDA, ridge, QDA with ``full``, ...), and the ``fedcof`` head
(:mod:`ghofl.heads.fedcof`) is FedCOF's own classifier on them.

Degrees of freedom: the statistics are an :class:`~ghofl.moments.estimated.EstimatedStats`
carrying what the estimate really has, K_c − 1 per class (``class_dof``) and, for the pooled
within-class scatter Σ_c (N_c − 1) Σ̂_c, Satterthwaite's ν = (Σ_c (N_c − 1))² /
Σ_c (N_c − 1)²/(K_c − 1) (``scatter_dof``; ≈ Σ_c (K_c − 1), a few hundred for 100 clients,
tens for 10, instead of N − C). The heads' data-driven shrinkage reads these
(:meth:`Moments.pooled_dof <ghofl.moments.core.Moments.pooled_dof>`), so it shrinks the
estimate as much as its noise asks for.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import StatsValidationError
from ghofl.moments.estimated import EstimatedStats, pooled_effective_dof
from ghofl.stats.client_stats import ClientStats, sum_stats
from ghofl.stats.meta import Mode

F64 = NDArray[np.float64]

__all__ = ["client_spread", "fedcof_covariances", "fedcof_statistics"]


def client_spread(counts: NDArray[np.int64], sums: F64) -> tuple[F64, NDArray[np.int64]]:
    """Rows v_kc = (A_kc − n_kc μ_c)/√n_kc of every (client, class) pair with n_kc > 0.

    Parameters
    ----------
    counts : ndarray of int64, shape (K, C)
        n_kc per client and class.
    sums : ndarray, shape (K, C, d)
        A_kc per client and class.

    Returns
    -------
    rows : ndarray, shape (M, d)
        One row per pair with n_kc > 0 (M pairs), so that Σ_k n_kc (μ_kc − μ_c)(μ_kc − μ_c)ᵀ
        is the sum of v vᵀ over the rows of class c.
    classes : ndarray of int64, shape (M,)
        The class of each row.
    """
    n_c = counts.sum(axis=0)
    mu = sums.sum(axis=0) / np.maximum(n_c, 1)[:, None]  # (C, d) global class means
    k_idx, c_idx = np.nonzero(counts > 0)
    n = counts[k_idx, c_idx].astype(np.float64)
    rows: F64 = (sums[k_idx, c_idx] - n[:, None] * mu[c_idx]) / np.sqrt(n)[:, None]
    return rows, c_idx.astype(np.int64)


def _stack(clients: Sequence[ClientStats]) -> tuple[ClientStats, NDArray[np.int64], F64]:
    """The total, counts (K, C) and sums (K, C, d) of every client.

    ``sum_stats`` checks that the payloads are compatible.
    """
    if len(clients) == 0:
        raise StatsValidationError(
            "FedCOF needs the statistics of each client (at least one); got none"
        )
    total = sum_stats([s.without_holdout() for s in clients])
    counts = np.stack([s.counts for s in clients])
    sums = np.stack([s.sums for s in clients])
    return total, counts, sums


def fedcof_covariances(clients: Sequence[ClientStats]) -> tuple[F64, NDArray[np.int64]]:
    """FedCOF's class covariance estimates Σ̂_c (module docstring) from per-client statistics.

    Parameters
    ----------
    clients : sequence of ClientStats
        One payload per client, of any mode (only counts and sums are read).

    Returns
    -------
    covariances : ndarray, shape (C, d, d)
        Σ̂_c; zero for classes held by fewer than two clients.
    clients_per_class : ndarray of int64, shape (C,)
        K_c, the number of clients holding class c.
    """
    _, counts, sums = _stack(clients)
    rows, cls = client_spread(counts, sums)
    k_c = (counts > 0).sum(axis=0)
    c, d = counts.shape[1], sums.shape[2]
    out = np.zeros((c, d, d))
    for j in range(c):
        if k_c[j] >= 2:
            v = rows[cls == j]
            out[j] = v.T @ v / (k_c[j] - 1)
    return out, k_c.astype(np.int64)


def fedcof_statistics(clients: Sequence[ClientStats], mode: Mode = "pooled") -> EstimatedStats:
    """Statistics whose second moments are FedCOF's estimates (module docstring).

    Parameters
    ----------
    clients : sequence of ClientStats
        One payload per client (any mode; counts and sums are read), e.g. mode ``means``.
    mode : {"pooled", "full"}, default "pooled"
        ``pooled``: B = Σ_c S_c and D_c = diag S_c (O(d²) memory); ``full``: every S_c.

    Returns
    -------
    EstimatedStats
        Counts and sums are the exact totals; the second moments are estimates, with their
        degrees of freedom (module docstring).
    """
    if mode not in ("pooled", "full"):
        raise StatsValidationError(
            f"FedCOF statistics are built in mode 'pooled' or 'full'; got {mode!r}"
        )
    total, counts, sums = _stack(clients)
    rows, cls = client_spread(counts, sums)
    k_c = (counts > 0).sum(axis=0)
    n_c = total.counts.astype(np.float64)
    # weight of class c's spread: (N_c − 1)/(K_c − 1) (0 when K_c < 2), applied to its rows
    w = np.where(k_c >= 2, (n_c - 1.0) / np.maximum(k_c - 1, 1), 0.0)
    wrows = rows * np.sqrt(w[cls])[:, None]
    mean_part = total.sums / np.maximum(n_c, 1.0)[:, None]  # rows A_c/N_c: A_c A_cᵀ/N_c = N_c m mᵀ
    meta = total.meta.with_mode(mode)
    c, d = total.num_classes, total.dim
    class_dof = np.maximum(k_c - 1, 0).astype(np.float64)
    dof = pooled_effective_dof(class_dof, np.maximum(n_c - 1.0, 0.0))
    if mode == "full":
        scatter = np.zeros((c, d, d))
        for j in range(c):
            v = wrows[cls == j]
            scatter[j] = v.T @ v + n_c[j] * np.outer(mean_part[j], mean_part[j])
        scatter = 0.5 * (scatter + scatter.transpose(0, 2, 1))
        return EstimatedStats(meta, counts=total.counts.copy(), sums=total.sums.copy(),
                              class_scatter=scatter, scatter_dof=dof,
                              class_dof=class_dof)
    sq = np.zeros((c, d))
    np.add.at(sq, cls, wrows**2)
    sq += n_c[:, None] * mean_part**2
    b = wrows.T @ wrows + (mean_part.T * n_c) @ mean_part
    b = 0.5 * (b + b.T)
    np.fill_diagonal(b, sq.sum(axis=0))  # diag(B) = Σ_c D_c exactly, not only to rounding
    return EstimatedStats(meta, counts=total.counts.copy(), sums=total.sums.copy(), sq_sums=sq,
                          scatter=b, scatter_dof=dof, class_dof=class_dof)
