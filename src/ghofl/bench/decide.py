"""The one rule every DP section of BENCHMARKS.md decides its comparisons with.

Each cell is a set of per-seed accuracies, summarised as mean ± standard error of the mean
(sample standard deviation / √n). Two cells ``a`` and ``b`` (different seeds or different
methods: unpaired) compare through the difference of their means, ``diff = mean(a) −
mean(b)``, and the standard error of that difference, ``se = √(se_a² + se_b²)``.

- :func:`at_or_above`: ``a`` is at or above ``b`` (allowing ``margin`` points) when
  ``diff ≥ −max(margin, 2·se)``. With ``margin = 0`` this is "the mean difference is at least
  −2 standard errors of the difference".
- :func:`within`: ``a`` is within ``tol`` of ``b`` when ``|diff| ≤ max(tol, 2·se)`` (within
  ``tol``, or within 2 standard errors where those are larger).

- :func:`paired_lead`: two methods run on the *same* seeds (the same partitions, the same
  test rows) compare through the per-seed differences ``d_i = a_i − b_i``: ``diff =
  mean(d)``, ``se`` = standard error of the mean of ``d``; ``a`` leads when ``diff > 2·se``.
  The seed-to-seed spread both methods share (an easy or a hard partition) cancels in
  ``d_i``, so this is the comparison to use when the runs are paired, and only then.

A comparison with fewer than two seeds on either side has no standard error: it is
*undecided*, never passed or failed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ghofl.errors import ConfigError

__all__ = ["Comparison", "at_or_above", "fmt_mean_se", "mean_se", "paired_lead", "within"]

#: Standard errors of the difference that a shortfall must exceed to count.
SE_FACTOR = 2.0


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean of per-seed values (se ``nan`` for one value).

    Raises
    ------
    ConfigError
        ``values`` is empty.
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ConfigError("mean_se needs at least one per-seed value; got none (a cell with "
                          "no finished seed has nothing to summarise: leave it out)")
    if len(vals) < 2:
        return vals[0], math.nan
    return statistics.fmean(vals), statistics.stdev(vals) / math.sqrt(len(vals))


def fmt_mean_se(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    """``"mean ± se"`` of ``values`` times ``scale`` (``"mean"`` alone for one seed)."""
    m, se = mean_se(values)
    if math.isnan(se):
        return f"{scale * m:.{digits}f}"
    return f"{scale * m:.{digits}f} ± {scale * se:.{digits}f}"


@dataclass(frozen=True)
class Comparison:
    """A decided (or undecided) comparison of two per-seed cells, in the cells' unit × scale.

    Attributes
    ----------
    diff : float
        mean(a) − mean(b).
    se : float
        Standard error of the difference (``nan`` when undecided).
    bound : float
        The allowed shortfall (``at_or_above``) or distance (``within``).
    passed : bool or None
        The verdict; ``None`` when undecided (fewer than two seeds on a side).
    """

    diff: float
    se: float
    bound: float
    passed: bool | None

    def describe(self, yes: str, no: str) -> str:
        """``"+1.2 ± 0.4 pt: <yes|no|undecided>"`` for a section's verdict line."""
        verdict = "undecided (< 2 seeds)" if self.passed is None else (yes if self.passed else no)
        se = "" if math.isnan(self.se) else f" ± {self.se:.1f}"
        return f"{self.diff:+.1f}{se} pt: {verdict}"


def _diff(a: Sequence[float], b: Sequence[float], scale: float,
          b_exact: bool = False) -> tuple[float, float]:
    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    if b_exact:
        if len(set(b)) != 1:
            raise ConfigError(f"b_exact=True needs one value for b (a fixed reference); got "
                              f"{len(set(b))} different values: pass b_exact=False")
        sb = 0.0
    return scale * (ma - mb), scale * math.sqrt(sa * sa + sb * sb)


def at_or_above(a: Sequence[float], b: Sequence[float], margin: float = 0.0,
                scale: float = 100.0, b_exact: bool = False) -> Comparison:
    """Whether cell ``a`` is at or above cell ``b``: diff ≥ −max(margin, 2·se).

    Parameters
    ----------
    a, b : sequence of float, shapes (n_a,), (n_b,)
        Per-seed values (accuracies in [0, 1] with the default ``scale``).
    margin : float
        Allowed shortfall in scaled units (points), >= 0.
    scale : float
        Unit of ``diff``, ``se`` and ``margin`` (100: points of accuracy).
    b_exact : bool
        ``b`` is a fixed reference (one value, no seed-to-seed error: a deterministic run
        such as a non-private fit); only ``a``'s standard error counts.

    Raises
    ------
    ConfigError
        ``margin`` is negative, a cell is empty, or ``b_exact`` with differing ``b`` values.
    """
    if margin < 0:
        raise ConfigError(f"margin must be >= 0 points; got {margin}")
    diff, se = _diff(a, b, scale, b_exact)
    if math.isnan(se):
        return Comparison(diff, se, margin, None)
    bound = max(margin, SE_FACTOR * se)
    return Comparison(diff, se, bound, diff >= -bound)


def within(a: Sequence[float], b: Sequence[float], tol: float,
           scale: float = 100.0) -> Comparison:
    """Whether cell ``a`` is within ``tol`` of cell ``b``: |diff| ≤ max(tol, 2·se).

    Parameters
    ----------
    a, b : sequence of float, shapes (n_a,), (n_b,)
        Per-seed values.
    tol : float
        Allowed distance in scaled units (points), >= 0.
    scale : float
        Unit of ``diff``, ``se`` and ``tol``.

    Raises
    ------
    ConfigError
        ``tol`` is negative or a cell is empty.
    """
    if tol < 0:
        raise ConfigError(f"tol must be >= 0 points; got {tol}")
    diff, se = _diff(a, b, scale)
    if math.isnan(se):
        return Comparison(diff, se, tol, None)
    bound = max(tol, SE_FACTOR * se)
    return Comparison(diff, se, bound, abs(diff) <= bound)


def paired_lead(a: Sequence[float], b: Sequence[float], scale: float = 100.0) -> Comparison:
    """Whether ``a`` leads ``b`` on the same seeds: mean(a_i − b_i) > 2·se of that mean.

    Parameters
    ----------
    a, b : sequence of float, shapes (n,), (n,)
        Per-seed values of two methods, ``a[i]`` and ``b[i]`` measured on the same seed i.
    scale : float
        Unit of ``diff`` and ``se`` (100: points of accuracy).

    Raises
    ------
    ConfigError
        The cells are empty or of different lengths (the seeds are not paired).
    """
    if len(a) != len(b):
        raise ConfigError(f"paired_lead needs one value of each method per seed; got {len(a)} "
                          f"and {len(b)} values: compare the seeds both methods ran, or use "
                          "at_or_above for unpaired cells")
    diff, se = mean_se([float(x) - float(y) for x, y in zip(a, b, strict=True)])
    diff, se = scale * diff, scale * se
    if math.isnan(se):
        return Comparison(diff, se, math.nan, None)
    return Comparison(diff, se, SE_FACTOR * se, diff > SE_FACTOR * se)
