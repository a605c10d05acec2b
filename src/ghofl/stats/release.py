"""Statistics of a differentially private release that keep their public noise levels.

:class:`NoisyStats` is what :func:`ghofl.privacy.postprocess.postprocess` returns when it is
told the noise σ_b of each block: the heads' data-driven shrinkage and regularisation read
these levels (public: the mechanism's calibration, not the data) to weigh the release noise
in their criteria (:func:`ghofl.moments.criteria.release_noise`). Saved statistics keep them
(the header entry ``noise_sigma``, :mod:`ghofl.stats.header`), so a released total written
to a file and read back is fitted as in process. A ``full`` release also keeps the intensity
a_c by which the post-processing shrank each class covariance (``noise_shrinkage``, header
entry of that name), so the heads count only the noise it left. The class lives with the
statistics (not in :mod:`ghofl.privacy`) so that the readers of files can restore it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ghofl.errors import StatsValidationError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import Mode
from ghofl.stats.schema import ARRAY_NAMES, schema_for

__all__ = ["NOISE_BLOCKS", "NoisyStats", "noise_shrinkage_problem", "noise_sigma_problem"]

#: The blocks a noise level may name: the arrays of the statistics.
NOISE_BLOCKS: tuple[str, ...] = ARRAY_NAMES


def noise_sigma_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as the noise levels of a release, or None when valid.

    Valid: a mapping of block names (:data:`NOISE_BLOCKS`) to finite floats >= 0.
    """
    if not isinstance(value, Mapping):
        return f"a mapping of block names to standard deviations, not {type(value).__name__}"
    unknown = sorted(str(k)[:40] for k in value if k not in NOISE_BLOCKS)
    if unknown:
        return f"unknown block {unknown[0]!r} (blocks: {', '.join(NOISE_BLOCKS)})"
    bad = {k: v for k, v in value.items()
           if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
           or v < 0.0}
    if bad:
        return f"{bad!r:.80}: every level must be a finite standard deviation >= 0"
    return None


def noise_shrinkage_problem(value: Any, num_classes: int) -> str | None:
    """What is wrong with ``value`` as the post-processing intensities, or None when valid.

    Valid: a sequence of ``num_classes`` finite floats in [0, 1].
    """
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        return f"a list of one intensity per class, not {type(value).__name__}"
    if len(value) != num_classes:
        return f"{len(value)} intensities for {num_classes} classes"
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int | float)
           or not 0.0 <= v <= 1.0]  # NaN fails the comparison
    if bad:
        return f"{bad[0]!r:.40}: every intensity must be a float in [0, 1]"
    return None


@dataclass(frozen=True, eq=False)
class NoisyStats(ClientStats):
    """Post-processed statistics of a differentially private release, with its noise levels.

    Adding or subtracting them (on either side) is refused: the sum's noise would no longer
    be the one recorded.

    Parameters
    ----------
    meta, counts, sums, sq_sums, class_scatter, scatter, n_clipped
        As :class:`~ghofl.stats.ClientStats` (no held-out section).
    noise_sigma : mapping of str to float
        σ_b per block of the noise in the release (``NoisePlan.sigma``, times √κ for the
        noise a distributed release kept): σ_b on every entry of a vector block and on the
        diagonal of a symmetric one, σ_b/√2 off its diagonal.
    noise_shrinkage : sequence of float, length C, or None
        a_c, the weight the post-processing of a ``full`` release (P2n, :func:`ghofl.
        privacy.postprocess.noise_aware_covariances`) gave the rescaled pooled covariance in
        class c's covariance, so that (1 − a_c) of its noise remains (1 for a class whose
        noisy covariance it discarded); None when not recorded (other modes, older files).

    Raises
    ------
    StatsValidationError
        ``noise_sigma`` names an unknown block or holds a level that is not a finite
        standard deviation >= 0, or ``noise_shrinkage`` is not one intensity in [0, 1] per
        class.
    """

    noise_sigma: Mapping[str, float] = field(default_factory=dict)
    noise_shrinkage: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "noise_sigma", _checked(self.noise_sigma))
        object.__setattr__(self, "noise_shrinkage",
                           _checked_shrinkage(self.noise_shrinkage, self.num_classes))

    @classmethod
    def of(cls, stats: ClientStats, noise_sigma: Mapping[str, float],
           noise_shrinkage: Sequence[float] | None = None) -> NoisyStats:
        """``stats`` (valid, without a held-out section) with the noise levels given.

        The arrays are shared, not re-validated, and keep the tolerance of their rounding.
        ``noise_shrinkage``: the post-processing intensities, as the class.

        Raises
        ------
        StatsValidationError
            As the class, or ``stats`` has a held-out section.
        """
        sigma = _checked(noise_sigma)
        shrink = _checked_shrinkage(noise_shrinkage, stats.num_classes)
        if stats.holdout is not None:
            raise StatsValidationError(
                "a differentially private release has no held-out section; drop it "
                "(ClientStats.without_holdout) before the release"
            )
        out = cls._trusted(stats.meta, stats.counts, stats.sums, stats.sq_sums,
                           stats.class_scatter, stats.scatter, stats.n_clipped,
                           stats._magnitude)
        object.__setattr__(out, "noise_sigma", sigma)
        object.__setattr__(out, "noise_shrinkage", shrink)
        assert isinstance(out, NoisyStats)
        return out

    def total_scatter_sigma(self) -> float:
        """σ of the noise on the diagonal of B = :attr:`total_scatter`.

        σ_B of a stored ``scatter``; in ``full`` mode B = Σ_c S_c carries √C·σ_S.
        """
        if "scatter" in self.noise_sigma or self.class_scatter is None:
            return self.noise_sigma.get("scatter", 0.0)
        return math.sqrt(self.num_classes) * self.noise_sigma.get("class_scatter", 0.0)

    def __add__(self, other: ClientStats) -> ClientStats:
        raise _refused()

    def __sub__(self, other: ClientStats) -> ClientStats:
        raise _refused()

    def _combine(self, other: ClientStats, sign: int) -> ClientStats:
        raise _refused()

    def __radd__(self, other: object) -> ClientStats:
        if isinstance(other, int) and other == 0:  # builtin sum() of one release
            return self
        raise _refused()

    def __rsub__(self, other: object) -> ClientStats:
        raise _refused()

    def to_mode(self, mode: Mode) -> ClientStats:
        """Convert to a lower mode (see ClientStats.to_mode), keeping the noise levels.

        A block read from a richer one gains its level: ``sq_sums`` = diag S_c the level of
        ``class_scatter``, ``scatter`` = Σ_c S_c :meth:`total_scatter_sigma`. The
        post-processing intensities are kept (the blocks read from S_c keep its shrinkage).
        """
        if mode == self.mode:
            return self
        out = ClientStats.to_mode(self, mode)
        sigma = dict(self.noise_sigma)
        for spec in schema_for(mode).arrays:
            if spec.name not in sigma and spec.name == "scatter":
                sigma["scatter"] = self.total_scatter_sigma()
            elif spec.name not in sigma and "class_scatter" in sigma and spec.name == "sq_sums":
                sigma["sq_sums"] = sigma["class_scatter"]
        return NoisyStats.of(out, sigma, self.noise_shrinkage)


def _checked(noise_sigma: Any) -> dict[str, float]:
    problem = noise_sigma_problem(noise_sigma)
    if problem is not None:
        raise StatsValidationError(
            f"noise_sigma must map every block to a finite standard deviation >= 0; got "
            f"{problem}; pass the release's NoisePlan.sigma"
        )
    return {str(k): float(v) for k, v in noise_sigma.items()}


def _checked_shrinkage(value: Any, num_classes: int) -> tuple[float, ...] | None:
    if value is None:
        return None
    problem = noise_shrinkage_problem(value, num_classes)
    if problem is not None:
        raise StatsValidationError(
            f"noise_shrinkage must hold one post-processing intensity in [0, 1] per class; "
            f"got {problem}; pass the intensities the post-processing returned, or None"
        )
    return tuple(float(v) for v in value)


def _refused() -> StatsValidationError:
    return StatsValidationError(
        "a differentially private release is not added to other statistics (its noise "
        "levels would no longer hold): add the exact statistics, then release their sum"
    )
