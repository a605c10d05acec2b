"""The Gaussian mechanism on the aggregate: central and distributed (docs/privacy.md).

Noise is added block by block to the flattened statistics vector
(:meth:`~ghofl.stats.schema.ModeSchema.flatten` order: counts, then the float segments).
Block b has L2 sensitivity Δ_b (:mod:`ghofl.privacy.sensitivity`) and receives a fraction f_b
of the budget (Σ_b f_b = 1, default equal). Dividing block b by s_b = Δ_b/√f_b gives a vector
of L2 sensitivity √(Σ_b f_b) = 1 (N1), so the Gaussian mechanism with noise multiplier z
(:func:`~ghofl.privacy.accounting.calibrate_noise_multiplier`) on it is (ε, δ)-DP; on the
original scale this is independent noise of standard deviation

    σ_b = z · Δ_b / √f_b                                                               (N2)

on every entry of block b.

* central: the server adds N(0, σ_b²) to each entry of the exact total;
* distributed: each of the n clients adds N(0, σ_b²/t) (t the secure-aggregation threshold,
  the fewest clients whose inputs can be in the sum) before the fixed-point encoding, so the
  sum over any s ≥ t survivors carries variance s·σ_b²/t ≥ σ_b² (N3), and the server never
  sees a noiseless sum. Each share is clamped at ±c·σ_b/√t (c = :data:`NOISE_CLAMP_SIGMAS`) so
  the public fixed-point bounds hold; the probability p that any clamp acts is added to δ as
  (1 + e^ε)·p (N4), below 1e-25 in practice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, InputError
from ghofl.privacy.accounting import calibrate_noise_multiplier, check_epsilon_delta
from ghofl.privacy.postprocess import postprocess
from ghofl.privacy.sensitivity import COUNTS, block_names, block_sensitivities
from ghofl.secure.bounds import TotalLimits, check_bounds, refuse_client_stats, refuse_total
from ghofl.secure.config import SessionParams
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
    "NoisyDecoder",
    "PrivateRelease",
    "block_sigmas",
    "draw_noise",
    "noise_share_encoder",
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
_HEADROOM = 2.0**62

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
        positive, summing to 1); default equal.
    """

    epsilon: float
    delta: float = DEFAULT_DELTA
    mode: DPMode = "central"
    fractions: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        eps, dlt = check_epsilon_delta(self.epsilon, self.delta)
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", dlt)
        if self.mode not in DP_MODES:
            raise ConfigError(
                f"the differential-privacy mode must be one of {', '.join(DP_MODES)}; got "
                f"{self.mode!r}"
            )


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
        Δ_b, f_b and σ_b = z·Δ_b/√f_b per block (N2).
    """

    config: DPConfig
    stats_mode: str
    clip_norm: float
    min_class_count: int
    noise_multiplier: float
    sensitivity: dict[str, float] = field(default_factory=dict)
    fractions: dict[str, float] = field(default_factory=dict)
    sigma: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready fields: budget, modes, calibration and accounting."""
        return {"epsilon": self.config.epsilon, "delta": self.config.delta,
                "dp_mode": self.config.mode, "stats_mode": self.stats_mode,
                "clip_norm": self.clip_norm, "min_class_count": self.min_class_count,
                "min_class_count_rule": "server, on the noised counts (post-processing)",
                "noise_multiplier": self.noise_multiplier,
                "sensitivity": dict(self.sensitivity), "fractions": dict(self.fractions),
                "sigma": dict(self.sigma), "accountant": "dp_accounting PLD (Gaussian)",
                "neighbouring": "add/remove one sample"}


def block_sigmas(sens: Mapping[str, float], fractions: Mapping[str, float],
                 noise_multiplier: float) -> dict[str, float]:
    """σ_b = z · Δ_b / √f_b per block (N2)."""
    return {b: noise_multiplier * sens[b] / math.sqrt(fractions[b]) for b in sens}


def _fractions(mode: str, given: Mapping[str, float] | None) -> dict[str, float]:
    names = block_names(mode)
    if given is None:
        return {b: 1.0 / len(names) for b in names}
    out = {str(k): float(v) for k, v in given.items()}
    if set(out) != set(names) or any(not (v > 0) for v in out.values()) or not math.isclose(
            sum(out.values()), 1.0, rel_tol=1e-9):
        raise ConfigError(
            f"the budget fractions for mode {mode!r} must give every block of {list(names)} a "
            f"positive share, summing to 1; got {dict(given)}"
        )
    return out


def plan_noise(config: DPConfig, stats_mode: str, clip_norm: float | None,
               min_class_count: int = 1) -> NoisePlan:
    """Calibrate the mechanism: Δ_b, f_b, z and σ_b (N1, N2).

    ``min_class_count`` (k) is recorded for the post-processing threshold on the noised counts
    (:func:`~ghofl.privacy.postprocess.postprocess`); it does not change Δ_b or σ_b. The
    clients must keep every class (no client-side rule) for Δ_b to hold.

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
    fractions = _fractions(stats_mode, config.fractions)
    z = calibrate_noise_multiplier(config.epsilon, config.delta)
    return NoisePlan(config, stats_mode, float(clip_norm), max(int(min_class_count), 1), z,
                     sens, fractions, block_sigmas(sens, fractions, z))


def draw_noise(plan: NoisePlan, num_classes: int, dim: int, rng: np.random.Generator,
               scale: float = 1.0, clamp: float | None = None) -> tuple[F64, F64]:
    """Gaussian noise for one flattened payload, block by block.

    Parameters
    ----------
    plan : NoisePlan
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
    def gauss(sigma: float, size: int) -> F64:
        out = rng.standard_normal(size)
        if clamp is not None:
            np.clip(out, -clamp, clamp, out=out)
        return np.asarray(out * (sigma * scale))

    counts = gauss(plan.sigma[COUNTS], num_classes)
    layout = schema_for(plan.stats_mode).float_layout(num_classes, dim)
    floats = np.empty(layout[-1].stop if layout else 0)
    for seg in layout:
        floats[seg.offset : seg.stop] = gauss(plan.sigma[seg.name], seg.size)
    return counts, floats


def truncation_probability(entries: int, clamp: float = NOISE_CLAMP_SIGMAS) -> float:
    """Upper bound on the probability that any of ``entries`` clamped shares was clamped.

    entries · P(|Z| > c) = entries · erfc(c/√2) (N4).
    """
    from scipy.special import erfc  # on first use: scipy costs ~0.1 s to import

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
    """

    stats: ClientStats
    plan: NoisePlan
    epsilon_spent: float
    delta_spent: float
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields plus the budget spent and the post-processing notes."""
        return {**self.plan.to_dict(), "epsilon_spent": self.epsilon_spent,
                "delta_spent": self.delta_spent, "postprocessing": list(self.notes)}


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
    _check_meta(total.meta, plan)
    ints, floats = schema_for(plan.stats_mode).flatten(total)
    if limits is not None:
        refuse_total(check_bounds(total.meta, ints, floats, limits), limits,
                     "the central DP release")
    c = total.num_classes
    dc, df = draw_noise(plan, c, total.dim, rng)
    stats, notes = postprocess(total.meta, ints[:c].astype(np.float64) + dc, floats + df,
                               plan.min_class_count, plan.sigma)
    return PrivateRelease(stats, plan, plan.config.epsilon, plan.config.delta,
                          ("central Gaussian noise added by the server", *notes))


def _check_meta(meta: StatsMeta, plan: NoisePlan) -> None:
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


def noise_share_encoder(plan: NoisePlan, rng: np.random.Generator
                        ) -> Callable[[ClientStats, SessionParams], NDArray[np.uint64]]:
    """Distributed mode, client side: the noise-share encoder of a secure-aggregation client.

    The encoder a :class:`~ghofl.secure.SecAggClient` uses to add its noise share N(0, σ_b²/t),
    clamped (N3, N4), before the fixed-point encoding.

    Counts travel as round(ñ_c · 2^16) in the integer words; ``n_clipped`` is withheld (0).
    The public bounds stay safe: a share adds at most c·σ_b/√t to an entry, i.e. as much as
    c·σ_b/(√t·R^p) samples would, and the client must hold that many samples fewer than M.

    Raises (when called)
    --------------------
    InputError
        The statistics do not match the round, or the client's samples plus the noise margin
        exceed the public maximum M.
    ConfigError
        The round's K·M is too large for the scaled counts to fit in 62 bits.
    """
    def encode(stats: ClientStats, params: SessionParams) -> NDArray[np.uint64]:
        _check_meta(stats.meta, plan)
        codec = params.codec
        if stats.meta.clip_norm != codec.clip_norm:
            raise InputError(
                f"secure aggregation uses the public clipping bound R={codec.clip_norm:g} but "
                f"these statistics were computed with R={stats.meta.clip_norm!r}"
            )
        ints, floats = schema_for(plan.stats_mode).flatten(stats)
        refuse_client_stats(stats, codec.max_samples, (ints, floats))
        share = 1.0 / math.sqrt(params.threshold)
        margin = _noise_margin(plan, share)
        if stats.n_samples + margin > codec.max_samples:
            raise InputError(
                f"this client holds {stats.n_samples} samples and its noise share may add as "
                f"much as {margin:.3g} samples would, more than the public maximum "
                f"M={codec.max_samples} per client; raise max_samples for the federation"
            )
        words_bound = params.num_clients * (codec.max_samples + margin) * 2.0**COUNT_FRACTION_BITS
        if words_bound >= _HEADROOM:
            raise ConfigError(
                f"num_clients × (max_samples + noise margin) × 2^{COUNT_FRACTION_BITS} = "
                f"{words_bound:.3g} does not fit in 62 bits, so the noisy counts could wrap; "
                "lower max_samples"
            )
        c = stats.num_classes
        dc, df = draw_noise(plan, c, stats.dim, rng, scale=share, clamp=NOISE_CLAMP_SIGMAS)
        words = np.zeros_like(ints)
        words[:c] = np.rint(np.ldexp(ints[:c].astype(np.float64) + dc, COUNT_FRACTION_BITS))
        return codec.encode_vectors(stats.meta, words, floats + df)

    return encode


def _noise_margin(plan: NoisePlan, share: float) -> float:
    """Largest clamped share of any float block, in samples: max_b c·σ_b·share / R^p_b."""
    powers = {"first": 1, "second": 2}
    kinds = {a.name: a.kind for a in schema_for(plan.stats_mode).float_arrays}
    return max(NOISE_CLAMP_SIGMAS * plan.sigma[b] * share / plan.clip_norm ** powers[k]
               for b, k in kinds.items())


class NoisyDecoder:
    """Distributed mode, server side: the ``decode`` of a :class:`~ghofl.secure.SecAggServer`.

    Decodes the unmasked sum of noisy payloads, checks it against the public bounds widened
    by the public noise (:func:`~ghofl.secure.bounds.check_bounds` with the total's σ_b·√(s/t)
    per block, s the clients in the sum), post-processes it into valid statistics and keeps
    the :class:`PrivateRelease` in :attr:`release`.

    Parameters
    ----------
    plan : NoisePlan
    contributors : callable returning int, optional
        How many clients are in the sum (the server half's survivors); default the round's n.

    Raises (when called)
    --------------------
    TotalOutOfBoundsError
        The noisy total fails the bounds (a client sent statistics beyond them); nothing is
        released (:attr:`release` stays ``None``).
    """

    def __init__(self, plan: NoisePlan, contributors: Callable[[], int] | None = None) -> None:
        self.plan = plan
        self.release: PrivateRelease | None = None
        self._contributors = contributors

    def limits(self, params: SessionParams) -> TotalLimits:
        """The bounds a noisy total of this round is checked against."""
        s = params.num_clients if self._contributors is None else self._contributors()
        s = min(max(int(s), 1), params.num_clients)
        spread = math.sqrt(s / params.threshold)  # s shares of variance σ²/t each (N3)
        noise = {b: sigma * spread for b, sigma in self.plan.sigma.items()}
        return TotalLimits.for_codec(params.codec, s, noise,
                                     count_error=s * 2.0 ** -(COUNT_FRACTION_BITS + 1))

    def __call__(self, params: SessionParams, meta: StatsMeta,
                 words: NDArray[np.uint64]) -> ClientStats:
        """Decode the noised total, check its bounds and post-process it into statistics."""
        _check_meta(meta, self.plan)
        ints, floats = params.codec.decode_vectors(meta, words)
        c = meta.num_classes
        counts = np.ldexp(ints[:c].astype(np.float64), -COUNT_FRACTION_BITS)
        limits = self.limits(params)
        refuse_total(check_bounds(meta, np.concatenate([counts, ints[c:]]), floats, limits),
                     limits, "the distributed DP release")
        survivors = params.num_clients if self._contributors is None else self._contributors()
        spread = math.sqrt(min(max(int(survivors), 1), params.num_clients) / params.threshold)
        stats, notes = postprocess(meta, counts, floats, self.plan.min_class_count,
                                   {b: sig * spread for b, sig in self.plan.sigma.items()})
        entries = params.num_clients * (c + floats.size)
        p = truncation_probability(entries)
        delta = self.plan.config.delta + (1.0 + math.exp(self.plan.config.epsilon)) * p
        self.release = PrivateRelease(
            stats, self.plan, self.plan.config.epsilon, delta,
            (f"distributed Gaussian noise: every client added a share of variance σ²/t with "
             f"t={params.threshold}, clamped at {NOISE_CLAMP_SIGMAS:g} standard deviations",
             *notes))
        return stats
