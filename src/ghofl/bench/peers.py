"""Pure helpers of the one-shot peers benchmark (``benchmarks/bench_peers.py``).

- :func:`split_validation`: each client's rows split into a fitting part and a validation part
  (the peers' hyperparameters, and ghofl's setting at a byte budget, are chosen on the latter);
- :func:`fed3r_system` / :func:`fed3r_weights` / :func:`linear_predict`: Fed3R at its best,
  with an intercept (the features augmented by a constant 1, built from the same sums) and a
  float64 Cholesky solve, or as the FedCOF repository ships it (float32 pseudo-inverse of
  G + λI with PyTorch's default cutoff, no intercept);
- :func:`fed3r_bytes`, :func:`largest_dim`: upload bytes per client and the largest projection
  dimension whose upload fits a byte budget;
- :func:`decide_lead`: the verdict of ghofl against a peer by :mod:`ghofl.bench.decide`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.bench.decide import Comparison, at_or_above
from ghofl.errors import ConfigError
from ghofl.heads.fed3r import fed3r_solution, normalize_columns
from ghofl.stats.schema import schema_for

__all__ = ["FED3R_LAMBDAS", "FEDCOF_GAMMAS", "PROJECTION_DIMS", "decide_lead", "fed3r_bytes",
           "fed3r_system", "fed3r_weights", "largest_dim", "linear_predict",
           "split_validation"]

F64 = NDArray[np.float64]
Solver = Literal["cholesky", "pinv32"]

#: Fed3R's absolute ridge penalties tried on the validation rows (Fed3R's default 0.01 among).
FED3R_LAMBDAS: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3, 1e4)
#: FedCOF's covariance shrinkages γ tried on the validation rows (FedCOF's default 1 among).
FEDCOF_GAMMAS: tuple[float, ...] = (1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)
#: Projection dimensions from which the budget-fitting ones are picked.
PROJECTION_DIMS: tuple[int, ...] = (8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160,
                                    192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024)


def split_validation(parts: Sequence[NDArray[np.int64]], fraction: float, seed: int
                     ) -> list[tuple[NDArray[np.int64], NDArray[np.int64]]]:
    """Each client's row indices split at random into (fit, validation).

    Parameters
    ----------
    parts : sequence of int arrays, shapes (n_k,)
        Row indices of each client.
    fraction : float in (0, 1)
        Share of each client's rows held out (rounded; a client with one row keeps it).
    seed : int
        Seed of the split.

    Returns
    -------
    list of (fit, val) int arrays, shapes (n_k − v_k,), (v_k,)

    Raises
    ------
    ConfigError
        ``fraction`` is not in (0, 1).
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"the validation fraction must lie in (0, 1); got {fraction} (use "
                          "e.g. 0.1 for 10 % of each client's rows)")
    rng = np.random.default_rng(seed)
    out = []
    for idx in parts:
        perm = rng.permutation(np.asarray(idx, dtype=np.int64))
        n_val = round(fraction * len(perm)) if len(perm) > 1 else 0
        out.append((np.sort(perm[n_val:]), np.sort(perm[:n_val])))
    return out


def fed3r_system(scatter: F64, sums: F64, counts: NDArray[Any], intercept: bool
                 ) -> tuple[F64, F64]:
    """Fed3R's (G, A) from ghofl's sums, with the features augmented by a constant 1.

    Parameters
    ----------
    scatter : (d, d) Σ x xᵀ;  sums : (C, d) class sums A_c;  counts : (C,) N_c
    intercept : bool
        Augment by 1: G' = [[G, Σx], [Σxᵀ, N]] (d + 1, d + 1), A' = [A, N_c] (C, d + 1).
    """
    if not intercept:
        return scatter, sums
    total = sums.sum(axis=0)
    n = float(np.sum(counts))
    g = np.block([[scatter, total[:, None]], [total[None, :], np.array([[n]])]])
    a = np.hstack([sums, np.asarray(counts, dtype=np.float64)[:, None]])
    return g, a


def fed3r_weights(g: F64, a: F64, lam: float, solver: Solver, normalize: bool) -> F64:
    """Fed3R's weights W (d', C) = (G + λI)⁻¹ Aᵀ.

    ``solver``: ``"cholesky"`` (float64, :func:`~ghofl.heads.fed3r.fed3r_solution`) or
    ``"pinv32"`` (the FedCOF repository's Fed3R server: ``torch.linalg.pinv`` of G + λI in
    float32, whose default cutoff drops singular values below d'·ε₃₂ times the largest).
    ``normalize`` divides each class's column by its norm (Fed3R's evaluation).

    Raises
    ------
    ConfigError
        An unknown solver.
    """
    if solver == "cholesky":
        w = fed3r_solution(g, a, lam)
    elif solver == "pinv32":
        m = (g + lam * np.eye(g.shape[0])).astype(np.float32)
        cutoff = g.shape[0] * float(np.finfo(np.float32).eps)
        w = (np.linalg.pinv(m, rtol=cutoff) @ a.T.astype(np.float32)).astype(np.float64)
    else:
        raise ConfigError(f"unknown Fed3R solver {solver!r}; use 'cholesky' or 'pinv32'")
    return normalize_columns(w) if normalize else w


def linear_predict(x: NDArray[Any], w: F64, intercept: bool) -> NDArray[np.int64]:
    """argmax_c of [x, 1]ᵀ w_c (``intercept``) or xᵀ w_c; x (n, d), w (d or d + 1, C)."""
    x = np.asarray(x, dtype=np.float64)
    scores = x @ w[:-1] + w[-1] if intercept else x @ w
    out: NDArray[np.int64] = np.argmax(scores, axis=1).astype(np.int64)
    return out


def fed3r_bytes(c: int, d: int, intercept: bool) -> int:
    """Float64 bytes of one Fed3R upload: G (upper triangle) and the class sums.

    With ``intercept`` the augmented G carries Σx and n, and A carries the class counts.
    """
    e = d + 1 if intercept else d
    return 8 * (e * (e + 1) // 2 + c * e)


def largest_dim(budget: float, c: int, mode: str, dtype: str, below: int,
                dims: Sequence[int] = PROJECTION_DIMS) -> int | None:
    """The largest k of ``dims`` (k < ``below``) whose ``mode`` upload at k fits ``budget``.

    Bytes of a (C, k) payload in transport ``dtype`` (:meth:`ModeSchema.nbytes`); ``None``
    when none fits.
    """
    fits = [k for k in dims if k < below
            and schema_for(mode).nbytes(c, k, float_dtype=dtype) <= budget]
    return max(fits) if fits else None


def decide_lead(ours: Sequence[float], peer: Sequence[float]) -> tuple[str, Comparison]:
    """``("lead" | "tie" | "behind" | "undecided", ours vs peer)`` by the two-SE rule.

    A lead (or a shortfall) is decided only when it exceeds twice the standard error of the
    difference (:func:`ghofl.bench.decide.at_or_above` both ways); fewer than two seeds on a
    side: undecided.
    """
    mine = at_or_above(ours, peer)
    if mine.passed is None:
        return "undecided", mine
    if not mine.passed:
        return "behind", mine
    theirs = at_or_above(peer, ours)
    return ("tie" if theirs.passed else "lead"), mine
