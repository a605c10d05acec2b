"""L2 sensitivity of the flattened statistics vector under per-sample clipping (docs/privacy.md).

Neighbouring datasets differ by adding or removing one sample z of class c with ‖z‖ ≤ R (z is
the vector the client accumulates: after the feature transform, the projection and the
clipping). Each block of the flattened vector (:meth:`~ghofl.stats.schema.ModeSchema.flatten`
order) changes by:

=================  ============  ========================================================
block              change        L2 norm of the change
=================  ============  ========================================================
``counts``         e_c           1                                                  (S1)
``sums``           z             ‖z‖ ≤ R                                            (S2)
``sq_sums``        z⊙z           ‖z‖₄² ≤ ‖z‖² ≤ R²                                  (S3)
``class_scatter``  triu(z zᵀ)    √((‖z‖⁴ + ‖z‖₄⁴)/2) ≤ ‖z‖² ≤ R²                     (S4)
``scatter``        triu(z zᵀ)    as (S4)                                            (S5)
=================  ============  ========================================================

(S4): the packed upper triangle holds z_i z_j once for i ≤ j, so its squared norm is
Σ_{i≤j} z_i² z_j² = (‖z‖⁴ + Σ_i z_i⁴)/2, which reaches R⁴ exactly when z lies on one axis.
Every bound is attained by the same sample (z = R·e_j), so the joint worst case is the blocks'
worst cases at once. The bounds hold only if the clients keep every class: a client-side
minimum-count rule (drop classes with fewer than k samples) would let one sample lift a class
from k − 1 to k samples and release k samples at once. Under differential privacy the rule is
therefore applied by the server to the noised counts instead (post-processing,
:func:`~ghofl.privacy.postprocess.clamp_counts`), and the clients keep every class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.stats.schema import Kind, schema_for

__all__ = [
    "COUNTS",
    "block_names",
    "block_sensitivities",
    "flat_change",
    "packed_outer_norm",
    "weighted_sensitivity",
]

#: Name of the counts block (the others are the float segments of the schema).
COUNTS = "counts"
_POWER: dict[Kind, int] = {"count": 0, "first": 1, "second": 2}


def block_names(mode: str) -> tuple[str, ...]:
    """Blocks of the noised vector of ``mode``.

    ``counts`` then the float segments in ``schema_for(mode).float_layout`` order (``n_clipped`` is
    withheld under DP, not noised).
    """
    return (COUNTS, *(a.name for a in schema_for(mode).float_arrays))


def block_sensitivities(mode: str, clip_norm: float) -> dict[str, float]:
    """Δ_b, the L2 sensitivity of each block (S1–S5).

    Parameters
    ----------
    mode : {"full", "pooled", "gram", "diag", "means"}
    clip_norm : float
        R > 0, in the statistics space (after the projection).

    Returns
    -------
    dict of str to float
        ``{block: R^p}`` with p = 0 (counts), 1 (sums), 2 (second moments).
    """
    r = float(clip_norm)
    if not (math.isfinite(r) and r > 0):
        raise ConfigError(
            f"the clipping bound R must be a finite number > 0 for differential privacy; got "
            f"{clip_norm!r}"
        )
    kinds = {a.name: a.kind for a in schema_for(mode).float_arrays}
    out = {COUNTS: 1.0}
    out.update({name: r ** _POWER[kind] for name, kind in kinds.items()})
    return out


def weighted_sensitivity(sens: Mapping[str, float], scales: Mapping[str, float]) -> float:
    """L2 sensitivity √(Σ_b (Δ_b / s_b)²) of the vector with block b divided by ``scales[b]``."""
    return math.sqrt(sum((sens[b] / scales[b]) ** 2 for b in sens))


def packed_outer_norm(z: NDArray[np.float64]) -> float:
    """‖triu(z zᵀ)‖₂ of the packed upper triangle, closed form of (S4).

    Parameters
    ----------
    z : ndarray, shape (d,)
    """
    n2 = float(z @ z)
    n4 = float(np.sum(z**4))
    return math.sqrt(max((n2 * n2 + n4) / 2.0, 0.0))


def flat_change(before: tuple[NDArray[np.int64], NDArray[np.float64]],
                after: tuple[NDArray[np.int64], NDArray[np.float64]],
                mode: str, num_classes: int, dim: int) -> dict[str, float]:
    """Per-block L2 norm of the change between two flattened payloads (for checks and tests).

    Parameters
    ----------
    before, after : (ints (C + 1,), floats (F,))
        ``schema_for(mode).flatten`` of two payloads.
    """
    sch = schema_for(mode)
    out = {COUNTS: float(np.linalg.norm(
        (after[0][:num_classes] - before[0][:num_classes]).astype(np.float64)))}
    for seg in sch.float_layout(num_classes, dim):
        sl = slice(seg.offset, seg.stop)
        out[seg.name] = float(np.linalg.norm(after[1][sl] - before[1][sl]))
    return out
