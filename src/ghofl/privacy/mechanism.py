"""The Gaussian mechanism on the aggregate: central and distributed (docs/privacy.md).

Noise is added block by block to the flattened statistics vector
(:meth:`~ghofl.stats.schema.ModeSchema.flatten` order: counts, then the float segments).
Block b has L2 sensitivity Δ_b (:mod:`ghofl.privacy.sensitivity`) and receives a fraction f_b
of the budget (Σ_b f_b = 1; :mod:`ghofl.privacy.split`). Dividing block b by s_b = Δ_b/√f_b
gives a vector of L2 sensitivity √(Σ_b f_b) = 1 (N1), so the Gaussian mechanism with noise
multiplier z (:func:`~ghofl.privacy.accounting.calibrate_noise_multiplier`) on it is
(ε, δ)-DP; on the original scale this is independent noise of standard deviation

    σ_b = z · Δ_b / √f_b                                                               (N2)

on every entry of block b, except the off-diagonal entries of a symmetric matrix, which get
σ_b/√2 (N2s): the mechanism noises the matrix in the coordinates (S_ii, √2·S_ij for i < j),
in which one sample's change z zᵀ has norm ‖z‖² ≤ R² = Δ_b, the same bound as for the plain
upper triangle (S4), so the same σ_b there is σ_b/√2 on S_ij (half the noise variance on
d(d − 1)/2 of the d(d + 1)/2 entries, for free).

* central: the server adds N(0, σ_b²) to each entry of the exact total;
* distributed (:mod:`ghofl.privacy.distributed`): each client adds a base share and removable
  level components whose sum over any s ≥ t survivors, after the server removed the levels
  released at s, carries variance σ_b² (N3', up to the ladder's granularity), and the server
  never sees a noiseless sum. Every share is clamped at ±c of its standard deviations
  (c = :data:`NOISE_CLAMP_SIGMAS`) so the public fixed-point bounds hold; the probability p
  that any clamp acts is added to δ as (1 + e^ε)·p (N4), below 1e-25 in practice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError
from ghofl.privacy.accounting import calibrate_noise_multiplier, check_epsilon_delta
from ghofl.privacy.postprocess import postprocess
from ghofl.privacy.prior import check_prior_option
from ghofl.privacy.sensitivity import COUNTS, block_sensitivities
from ghofl.privacy.split import SPLITS, auto_fractions, equal_fractions, given_fractions
from ghofl.privacy.subspace import check_subspace_option
from ghofl.secure.bounds import TotalLimits, check_bounds, refuse_total
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for

__all__ = [
    "COUNT_FRACTION_BITS",
    "DEFAULT_DELTA",
    "DP_MODES",
    "NOISE_CLAMP_SIGMAS",
    "DPConfig",
    "DPMode",
    "NoisePlan",
    "PrivateRelease",
    "block_sigmas",
    "check_meta_matches_plan",
    "draw_noise",
    "entry_scales",
    "plan_noise",
    "release_central",
    "truncation_probability",
]

DPMode = Literal["central", "distributed"]
DP_MODES: tuple[str, ...] = ("central", "distributed")
#: Default δ (below 1/n for any federation of fewer than 100,000 samples).
DEFAULT_DELTA = 1e-5
#: Distributed noise shares are clamped at this many of their standard deviations (N4).
NOISE_CLAMP_SIGMAS = 12.0
#: Distributed mode: noisy counts travel in the integer words as round(ñ · 2^this).
COUNT_FRACTION_BITS = 16

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class DPConfig:
    """What the user asks for.

    Parameters
    ----------
    epsilon : float
        Target ε > 0 of the single release.
    delta : float, default 1e-5
        Target δ in (0, 1).
    mode : {"central", "distributed"}, default "central"
        Who adds the noise: the server to the total, or every client a share before secure
        aggregation.
    fractions : mapping of str to float, optional
        Budget fraction f_b per block (keys :func:`~ghofl.privacy.sensitivity.block_names`,
        positive, summing to 1); overrides ``split``.
    split : {"auto", "equal"}, default "auto"
        How the budget is split when ``fractions`` is not given (:mod:`ghofl.privacy.split`):
        ``auto`` from the error model of the estimated moments (needs ``expected_samples``;
        equal without it), ``equal`` in equal shares.
    expected_samples : int, optional
        Public hint of the total number of samples N the release will sum (for ``auto``). It
        sets only how the budget is split: the guarantee holds whatever N turns out to be.
    subspace : str, default "auto"
        Where the server fits the release (:mod:`ghofl.privacy.subspace`; post-processing, no
        budget): ``auto`` projects the noisy total onto the first 0.4·d public principal
        directions of the encoder's default basis when the noise ratio
        ρ = σ_B·d/(R²·(N − C)) exceeds 0.12 and they keep 0.9 of the release's between-class
        energy (within two standard deviations of its noise), else keeps the whole space
        (and keeps it when no basis is known); ``auto:<fp>`` the same rule with that basis;
        ``none`` never; ``pca:<k>`` / ``pca:<k>:<fp>`` always k directions. The choice is
        stated in the release's notes.
    prior : str, default "auto"
        A public within-class covariance the server mixes the denoised pooled covariance of a
        ``pooled`` or ``gram`` release with (:mod:`ghofl.privacy.prior`; post-processing, no
        budget), at the weight that minimises an estimate of its Frobenius error: ``auto``
        the encoder's default (``ghofl covariance-prior``; none recorded: no prior),
        ``auto:<fp>`` that file, ``none`` never. The weight is stated in the release's notes.
    """

    epsilon: float
    delta: float = DEFAULT_DELTA
    mode: DPMode = "central"
    fractions: Mapping[str, float] | None = None
    split: str = "auto"
    expected_samples: int | None = None
    subspace: str = "auto"
    prior: str = "auto"

    def __post_init__(self) -> None:
        eps, dlt = check_epsilon_delta(self.epsilon, self.delta)
        object.__setattr__(self, "subspace", check_subspace_option(self.subspace))
        object.__setattr__(self, "prior", check_prior_option(self.prior))
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", dlt)
        if self.mode not in DP_MODES:
            raise ConfigError(
                f"the differential-privacy mode must be one of {', '.join(DP_MODES)}; got "
                f"{self.mode!r}"
            )
        if self.split not in SPLITS:
            raise ConfigError(
                f"the budget split must be one of {', '.join(SPLITS)}; got {self.split!r}"
            )
        n = self.expected_samples
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(
                f"expected_samples (the public hint of the number of samples, for the budget "
                f"split) must be a positive integer or None; got {n!r}"
            )

    def check_public_files(self) -> None:
        """Load the public files the options name (a basis, a covariance) on the server.

        So that a missing or corrupt file is refused before a round starts, not when its
        release is post-processed. ``auto`` without a fingerprint looks the encoder's default
        up at release time (none recorded: not used).

        Raises
        ------
        ConfigError
            A named file is missing from the public folders or does not match its fingerprint.
        """
        from ghofl.privacy.prior import load_prior, named_prior
        from ghofl.privacy.subspace import named_basis
        from ghofl.stats.projection import load_basis

        basis, prior = named_basis(self.subspace), named_prior(self.prior)
        if basis is not None:
            load_basis(basis)
        if prior is not None:
            load_prior(prior)


@dataclass(frozen=True)
class NoisePlan:
    """The calibrated mechanism for one upload mode and clipping bound.

    Attributes
    ----------
    config : DPConfig
    stats_mode : str
        Upload mode of the statistics.
    clip_norm : float
        R in the statistics space.
    min_class_count : int
        k of the minimum-count rule, applied by the server to the noised counts (a class whose
        noised count rounds below k becomes a placeholder); post-processing, so σ does not
        depend on it.
    noise_multiplier : float
        z for the unit-sensitivity scaled vector.
    sensitivity, fractions, sigma : dict of str to float
        Δ_b, f_b and σ_b = z·Δ_b/√f_b per block (N2). Empty until :meth:`shaped` when the
        ``auto`` split waits for C and d.
    shape : (int, int) or None
        (C, d) the split was chosen for (``None``: the split does not depend on them).
    unused : tuple of str
        Blocks no requested head reads (the ``auto`` split gives them the least budget).
    """

    config: DPConfig
    stats_mode: str
    clip_norm: float
    min_class_count: int
    noise_multiplier: float
    sensitivity: dict[str, float] = field(default_factory=dict)
    fractions: dict[str, float] = field(default_factory=dict)
    sigma: dict[str, float] = field(default_factory=dict)
    shape: tuple[int, int] | None = None
    unused: tuple[str, ...] = ()

    @property
    def resolved(self) -> bool:
        """Whether f_b and σ_b are known (else call :meth:`shaped` with C and d)."""
        return bool(self.sigma)

    def shaped(self, num_classes: int, dim: int) -> NoisePlan:
        """Return the plan for statistics of C classes in d dimensions.

        A plan whose split does not depend on the shape is returned as it is; an ``auto``
        plan chooses f_b for (C, d) (:func:`~ghofl.privacy.split.auto_fractions`).

        Raises
        ------
        ConfigError
            The plan was chosen for another (C, d).
        """
        key = (int(num_classes), int(dim))
        if self.shape is not None and self.shape != key:
            raise ConfigError(
                f"the noise was planned for C={self.shape[0]}, d={self.shape[1]} but the "
                f"statistics have C={key[0]}, d={key[1]}; plan the noise for the statistics "
                "released"
            )
        if self.resolved:
            return self
        frac = auto_fractions(self.stats_mode, key[0], key[1], self.noise_multiplier,
                              self.config.expected_samples, self.unused)
        return replace(self, fractions=frac, shape=key,
                       sigma=block_sigmas(self.sensitivity, frac, self.noise_multiplier))

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready fields: budget, modes, calibration and accounting."""
        split = "given" if self.config.fractions is not None else self.config.split
        return {"epsilon": self.config.epsilon, "delta": self.config.delta,
                "dp_mode": self.config.mode, "stats_mode": self.stats_mode,
                "clip_norm": self.clip_norm, "min_class_count": self.min_class_count,
                "min_class_count_rule": "server, on the noised counts (post-processing)",
                "noise_multiplier": self.noise_multiplier,
                "budget_split": split, "expected_samples": self.config.expected_samples,
                "subspace": self.config.subspace, "prior": self.config.prior,
                "sensitivity": dict(self.sensitivity), "fractions": dict(self.fractions),
                "sigma": dict(self.sigma),
                "off_diagonal_sigma": "sigma/sqrt(2) on symmetric matrices (N2s)",
                "accountant": "dp_accounting PLD (Gaussian)",
                "neighbouring": "add/remove one sample"}


def block_sigmas(sens: Mapping[str, float], fractions: Mapping[str, float],
                 noise_multiplier: float) -> dict[str, float]:
    """σ_b = z · Δ_b / √f_b per block (N2)."""
    return {b: noise_multiplier * sens[b] / math.sqrt(fractions[b]) for b in sens}


def plan_noise(config: DPConfig, stats_mode: str, clip_norm: float | None,
               min_class_count: int = 1, num_classes: int | None = None,
               dim: int | None = None, unused: tuple[str, ...] = ()) -> NoisePlan:
    """Calibrate the mechanism: Δ_b, f_b, z and σ_b (N1, N2).

    ``min_class_count`` (k) is recorded for the post-processing threshold on the noised counts
    (:func:`~ghofl.privacy.postprocess.postprocess`); it does not change Δ_b or σ_b. The
    clients must keep every class (no client-side rule) for Δ_b to hold.

    With the ``auto`` split and an expected sample count, f_b depends on C and d: give them
    here, or call :meth:`NoisePlan.shaped` once they are known. ``unused`` names blocks no
    requested head reads.

    Raises
    ------
    ConfigError
        No clipping bound (the sensitivity would be unbounded), or invalid fractions.
    """
    if clip_norm is None:
        raise ConfigError(
            "differential privacy needs a per-sample clipping bound R (--clip R): without it "
            "one sample can change the statistics without limit"
        )
    sens = block_sensitivities(stats_mode, clip_norm)
    z = calibrate_noise_multiplier(config.epsilon, config.delta)
    base = NoisePlan(config, stats_mode, float(clip_norm), max(int(min_class_count), 1), z,
                     sens, unused=tuple(unused))
    if config.fractions is not None:
        fractions = given_fractions(stats_mode, config.fractions)
    elif config.split == "equal" or config.expected_samples is None:
        fractions = equal_fractions(stats_mode)
    elif num_classes is not None and dim is not None:
        return base.shaped(num_classes, dim)
    else:
        return base
    return replace(base, fractions=fractions, sigma=block_sigmas(sens, fractions, z))


def entry_scales(stats_mode: str, name: str, num_classes: int, dim: int) -> F64 | None:
    """Per-entry multiplier of σ_b in a packed float segment: 1/√2 off the diagonal (N2s).

    Returns ``None`` for an array that is not symmetric (every entry gets σ_b).
    """
    spec = schema_for(stats_mode).spec(name)
    if not spec.symmetric:
        return None
    iu, ju = np.triu_indices(dim)
    tri = np.where(iu == ju, 1.0, math.sqrt(0.5))
    reps = spec.packed_size(num_classes, dim) // tri.size
    return np.asarray(np.tile(tri, reps))


def draw_noise(plan: NoisePlan, num_classes: int, dim: int, rng: np.random.Generator,
               scale: float = 1.0, clamp: float | None = None) -> tuple[F64, F64]:
    """Gaussian noise for one flattened payload, block by block (N2, N2s).

    Parameters
    ----------
    plan : NoisePlan
        Shaped for (C, d) by :meth:`NoisePlan.shaped` here when it is not yet.
    num_classes, dim : int
        C and d of the statistics.
    rng : numpy.random.Generator
    scale : float, default 1.0
        Multiplies every σ_b (1/√t for a distributed share).
    clamp : float, optional
        Clamp each entry at ±clamp·(its standard deviation).

    Returns
    -------
    counts : ndarray, shape (C,)
    floats : ndarray, shape (F,), layout ``schema_for(plan.stats_mode).float_layout``.
    """
    plan = plan.shaped(num_classes, dim)

    def gauss(sigma: float, size: int, entries: F64 | None = None) -> F64:
        out = rng.standard_normal(size)
        if clamp is not None:
            np.clip(out, -clamp, clamp, out=out)
        out *= sigma * scale
        if entries is not None:
            out *= entries
        return np.asarray(out)

    counts = gauss(plan.sigma[COUNTS], num_classes)
    layout = schema_for(plan.stats_mode).float_layout(num_classes, dim)
    floats = np.empty(layout[-1].stop if layout else 0)
    for seg in layout:
        floats[seg.offset : seg.stop] = gauss(
            plan.sigma[seg.name], seg.size,
            entry_scales(plan.stats_mode, seg.name, num_classes, dim))
    return counts, floats


def truncation_probability(entries: int, clamp: float = NOISE_CLAMP_SIGMAS) -> float:
    """Upper bound on the probability that any of ``entries`` clamped shares was clamped.

    entries · P(|Z| > c) = entries · erfc(c/√2) (N4).
    """
    from scipy.special import erfc  # on first use: scipy is slow to import

    return float(min(1.0, entries * erfc(clamp / math.sqrt(2.0))))


@dataclass(frozen=True)
class PrivateRelease:
    """Post-processed statistics of a DP release and what was spent.

    Attributes
    ----------
    stats : ClientStats
        Valid statistics the heads are fitted from.
    plan : NoisePlan
    epsilon_spent, delta_spent : float
        The guarantee of the release (δ includes the clamping term (N4) in distributed mode).
    notes : tuple of str
        Post-processing steps, in words.
    noise : dict
        Distributed mode: survivors s, threshold, release points, how many survivors' level
        components were removed per level, the kept variance κ (in σ²) and z·√κ; empty in
        central mode.
    """

    stats: ClientStats
    plan: NoisePlan
    epsilon_spent: float
    delta_spent: float
    notes: tuple[str, ...]
    noise: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields, the budget spent, the notes and (distributed) the noise kept.

        ``noise_multiplier_released`` is the multiplier of the Gaussian mechanism the release
        was (central: the plan's; distributed: the kept z·√κ), which a later release composes
        with (:func:`ghofl.server.eval_privacy.charge_evaluation`).
        """
        z = float(self.noise.get("noise_multiplier_kept", self.plan.noise_multiplier))
        out = {**self.plan.to_dict(), "epsilon_spent": self.epsilon_spent,
               "delta_spent": self.delta_spent, "noise_multiplier_released": z,
               "postprocessing": list(self.notes)}
        if self.noise:
            out["distributed_noise"] = dict(self.noise)
        return out


def release_central(total: ClientStats, plan: NoisePlan, rng: np.random.Generator,
                    limits: TotalLimits | None = None) -> PrivateRelease:
    """Central mode: the server noises the exact total (N2) and post-processes it.

    Parameters
    ----------
    total : ClientStats
        The exact aggregate, mode ``plan.stats_mode``.
    plan : NoisePlan
    rng : numpy.random.Generator
        Source of the noise (use an unseeded, OS-entropy generator in deployment).
    limits : TotalLimits, optional
        Public bounds the exact total is checked against before any noise is drawn.

    Raises
    ------
    TotalOutOfBoundsError
        ``total`` fails ``limits``; nothing is released.
    """
    check_meta_matches_plan(total.meta, plan)
    plan = plan.shaped(total.num_classes, total.dim)
    ints, floats = schema_for(plan.stats_mode).flatten(total)
    if limits is not None:
        refuse_total(check_bounds(total.meta, ints, floats, limits), limits,
                     "the central DP release")
    c = total.num_classes
    dc, df = draw_noise(plan, c, total.dim, rng)
    stats, notes = postprocess(total.meta, ints[:c].astype(np.float64) + dc, floats + df,
                               plan.min_class_count, plan.sigma, plan.config.subspace,
                               plan.config.prior)
    return PrivateRelease(stats, plan, plan.config.epsilon, plan.config.delta,
                          ("central Gaussian noise added by the server", *notes))


def check_meta_matches_plan(meta: StatsMeta, plan: NoisePlan) -> None:
    """Refuse statistics of metadata ``meta`` that ``plan``'s noise was not calibrated for.

    Raises
    ------
    ConfigError
        ``meta`` has a held-out section, or its mode or clipping bound differs from the plan's.
    """
    if meta.has_holdout:
        raise ConfigError(
            f"differential privacy does not support statistics with a held-out section "
            f"(holdout fraction {meta.holdout_fraction:g}): every held-out sample would count "
            "twice in the sensitivity the noise is calibrated for; use holdout 0 with DP"
        )
    if meta.mode != plan.stats_mode or meta.clip_norm != plan.clip_norm:
        raise ConfigError(
            f"the noise was calibrated for mode {plan.stats_mode!r} and R={plan.clip_norm:g} "
            f"but the statistics have mode {meta.mode!r} and R={meta.clip_norm!r}; plan the "
            "noise for the statistics released"
        )
