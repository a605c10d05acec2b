"""How the privacy budget is split across the blocks of the release (docs/privacy.md).

Block b receives a fraction f_b of the budget (Σ_b f_b = 1) and noise σ_b = z·Δ_b/√f_b
(:mod:`ghofl.privacy.mechanism`, N2). The ``"auto"`` split chooses f from what is public: the
upload mode, C, d, the noise multiplier z, the expected number of samples N (a public hint:
``DPConfig.expected_samples``) and whether any requested head reads the per-class diagonal.

Error model. Measured in units of its signal, a block's noise has, per entry, a noise-to-signal
ratio ρ_b = z·k_b/(√f_b · N_c) with N_c = N/C and (data on the scale of the clip R, d dims)

=================  ==========  =====================================================
block              entries E   k_b (ρ_b = z·k_b/(√f_b·N_c))
=================  ==========  =====================================================
``counts``         C·(d + 1)   1            (a count error scales every moment)   (F1)
``sums``           C·d         √d           (mean entry R/√d)                     (F2)
``class_scatter``  C·d         2·d^1.5      (spectral error 2√d·σ/N_c vs R²/d)    (F3)
``sq_sums``        C·d         d            (variance entry R²/d)                 (F4)
``scatter``        d           2·d^1.5/C    (one matrix over all N samples)       (F5)
=================  ==========  =====================================================

While every ρ_b is small, the total error Σ_b E_b ρ_b² is least for f_b ∝ √E_b·k_b (F6): the
second moments, with d times more entries of d times larger relative noise, take most of the
budget. When the second moments cannot be estimated at any share (ρ ≥ 1: few samples for d,
or a small ε), budget moved to them is lost, while the means stay estimable; the split then
returns toward equal shares. ``auto`` interpolates: the second moments get
w·F* + (1 − w)·F_eq of the budget, F* their share under (F6), F_eq their equal share, and
w = 1/(1 + ρ²) with ρ the second moments' noise-to-signal ratio at F* (F7); counts and sums
share the rest in the ratio (F6) gives them. Blocks no requested head reads get
:data:`UNUSED_FRACTION`. Without an expected sample count the split is equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ghofl.errors import ConfigError
from ghofl.privacy.sensitivity import COUNTS, block_names

__all__ = ["SPLITS", "UNUSED_FRACTION", "auto_fractions", "equal_fractions", "given_fractions"]

#: Named budget splits: ``auto`` (F6, F7) and ``equal``.
SPLITS: tuple[str, ...] = ("auto", "equal")
#: Budget fraction of a block that no requested head reads.
UNUSED_FRACTION = 1e-3
_SECOND = ("class_scatter", "sq_sums", "scatter")


def equal_fractions(mode: str) -> dict[str, float]:
    """f_b = 1/B for the B blocks of ``mode``."""
    names = block_names(mode)
    return {b: 1.0 / len(names) for b in names}


def given_fractions(mode: str, given: Mapping[str, float]) -> dict[str, float]:
    """Check user fractions: every block of ``mode``, positive, summing to 1."""
    names = block_names(mode)
    out = {str(k): float(v) for k, v in given.items()}
    if set(out) != set(names) or any(not (v > 0) for v in out.values()) or not math.isclose(
            sum(out.values()), 1.0, rel_tol=1e-9):
        raise ConfigError(
            f"the budget fractions for mode {mode!r} must give every block of {list(names)} a "
            f"positive share, summing to 1; got {dict(given)}"
        )
    return out


def _coefficients(mode: str, c: int, d: int) -> dict[str, tuple[float, float]]:
    """(E_b, k_b) per block of ``mode`` (F1–F5)."""
    table = {COUNTS: (c * (d + 1.0), 1.0), "sums": (c * float(d), math.sqrt(d)),
             "class_scatter": (c * float(d), 2.0 * d**1.5), "sq_sums": (c * float(d), float(d)),
             "scatter": (float(d), 2.0 * d**1.5 / c)}
    return {b: table[b] for b in block_names(mode)}


def auto_fractions(mode: str, num_classes: int, dim: int, noise_multiplier: float,
                   expected_samples: int | None, unused: Iterable[str] = ()) -> dict[str, float]:
    """The ``auto`` split (F6, F7) for one release.

    Parameters
    ----------
    mode : str
        Upload mode (its blocks: :func:`~ghofl.privacy.sensitivity.block_names`).
    num_classes, dim : int
        C and d of the statistics.
    noise_multiplier : float
        z of the calibrated mechanism.
    expected_samples : int or None
        Public hint of the total sample count N; ``None`` gives the equal split.
    unused : iterable of str
        Blocks that no requested head reads; they get :data:`UNUSED_FRACTION`.

    Returns
    -------
    dict of str to float
        f_b per block, positive, summing to 1.
    """
    if expected_samples is None:
        return equal_fractions(mode)
    coef = _coefficients(mode, int(num_classes), int(dim))
    skip = set(unused) & set(coef)
    live = {b: v for b, v in coef.items() if b not in skip}
    weight = {b: math.sqrt(e) * k for b, (e, k) in live.items()}  # (F6)
    total = sum(weight.values())
    opt = {b: w / total for b, w in weight.items()}
    second = [b for b in live if b in _SECOND]
    f_opt = sum(opt[b] for b in second)
    n_c = max(float(expected_samples) / num_classes, 1.0)
    if second and f_opt < 1.0:
        rho = max(noise_multiplier * live[b][1] / (math.sqrt(opt[b]) * n_c) for b in second)
        w = 1.0 / (1.0 + rho * rho)  # (F7)
        f_second = w * f_opt + (1.0 - w) * len(second) / len(live)
        out = {b: (opt[b] / f_opt * f_second if b in second
                   else opt[b] / (1.0 - f_opt) * (1.0 - f_second)) for b in live}
    else:
        out = opt
    scale = 1.0 - UNUSED_FRACTION * len(skip)
    res = {b: out[b] * scale for b in live}
    res.update({b: UNUSED_FRACTION for b in skip})
    return {b: res[b] for b in coef}
