"""Distributed mode: noise shares that add up to the central noise for any number of survivors.

"Add then remove" on the dropout ladder of the round (:mod:`ghofl.secure.levels`; Jiang et al.
2024, XNoise/Dordis): with threshold t, n clients and release points u_0 < … < u_{K-1} = n
(a_0 = t, a_{j+1} = u_j), every client adds

* a base share N(0, σ_b²/n), drawn from its own generator (OS entropy in deployment) and never
  revealed, before the fixed-point encoding, and
* for each level j an excess component of variance σ_b²(1/a_j − 1/a_{j+1}), expanded from the
  level's fresh seed (:func:`level_words`), added in the fixed-point integer domain.

At unmask the holders reveal the level-j seeds of the survivors only when the s survivors they
signed are at least u_j, so the server regenerates and subtracts exactly those components. A
survivor then keeps σ_b²/n + Σ_{j: u_j > s} σ_b²(1/a_j − 1/a_{j+1}) = σ_b²/a_J (a_J the largest
of t, u_0, … at most s) and the sum over s survivors carries

    s·σ_b²/a_J ∈ [σ_b², σ_b²·a_{J+1}/a_J)                                           (N3')

exactly σ_b² when s is a release point (every s with an integer ladder, n − t ≤ 16). A level
whose seed cannot be reconstructed stays in the sum (more noise, never less); the release's ε
is the accountant's for the noise actually kept (:class:`NoisyDecoder`). Without a ladder
(``release_points`` empty) a client adds N(0, σ_b²/t) as base share and nothing is removed.

Excess components are standard normals made from an AES-CTR keystream of the seed with the
polar method, whose logarithm is computed here from frexp, +, ×, ÷ only (IEEE-exact
operations), so client and server regenerate the same words on any platform; they are clamped
at ±c standard deviations like the base share (N4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, InputError
from ghofl.privacy.accounting import gaussian_epsilon
from ghofl.privacy.mechanism import (
    COUNT_FRACTION_BITS,
    NOISE_CLAMP_SIGMAS,
    NoisePlan,
    PrivateRelease,
    check_meta_matches_plan,
    draw_noise,
    entry_scales,
    truncation_probability,
)
from ghofl.privacy.postprocess import postprocess
from ghofl.privacy.sensitivity import COUNTS
from ghofl.secure import primitives as cr
from ghofl.secure.bounds import TotalLimits, check_bounds, refuse_client_stats, refuse_total
from ghofl.secure.config import SessionParams
from ghofl.secure.fixedpoint import HEADROOM_BITS
from ghofl.secure.levels import released_levels
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for

__all__ = ["NoiseShareEncoder", "NoisyDecoder", "kept_variance", "level_words",
           "noise_share_encoder", "standard_normals"]

_LN2 = 0.6931471805599453
_SQRT_HALF = 0.7071067811865476


def _ladder(params: SessionParams) -> tuple[int, ...]:
    """(a_0 = t, u_0, …, u_{K-1}) of the round."""
    return (params.threshold, *params.release_points)


def level_variances(params: SessionParams) -> tuple[float, tuple[float, ...]]:
    """(base, levels): the variance fractions of σ_b² a client adds: 1/a_K and 1/a_j − 1/a_{j+1}."""
    a = _ladder(params)
    return 1.0 / a[-1], tuple(1.0 / a[j] - 1.0 / a[j + 1] for j in range(len(a) - 1))


def kept_variance(params: SessionParams, survivors: int,
                  removed: Mapping[str, Sequence[int]] | None = None) -> float:
    """The noise variance of the sum over ``survivors`` survivors, in units of σ_b².

    Parameters
    ----------
    params : SessionParams
    survivors : int
        s, the clients in the sum.
    removed : mapping of str to sequence of int, optional
        Per survivor, the levels subtracted from the sum (the server half's
        ``levels_removed``); default: every level released at s, for every survivor.

    Returns
    -------
    float
        s·(1/a_K) + Σ_j (1/a_j − 1/a_{j+1})·(survivors that kept level j); at least 1 for s ≥ t.
    """
    base, levels = level_variances(params)
    if removed is None:
        gone = dict.fromkeys(released_levels(params.release_points, survivors), survivors)
    else:
        gone = {j: sum(j in set(r) for r in removed.values()) for j in range(len(levels))}
    return survivors * base + math.fsum(v * (survivors - gone.get(j, 0))
                                        for j, v in enumerate(levels))


def _log(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Ln x for x > 0 from frexp and the atanh series (only IEEE-exact operations)."""
    m, e = np.frexp(x)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = e - low
    f = (m - 1.0) / (m + 1.0)
    f2 = f * f
    acc = np.full_like(f, 1.0 / 25.0)
    for k in range(11, -1, -1):  # Σ_{k=0..12} f^(2k+1)/(2k+1), Horner in f²
        acc = acc * f2 + 1.0 / (2 * k + 1)
    return np.asarray(2.0 * f * acc + e * _LN2)


def standard_normals(seed: bytes, size: int) -> NDArray[np.float64]:
    """``size`` standard normals determined by ``seed`` alone (polar method on AES-CTR words).

    The same on every IEEE-754 platform: the keystream is exact and every operation after it
    is correctly rounded (:func:`_log` avoids the platform's logarithm).
    """
    pairs = size // 2 + 1
    words = 2 * (int(pairs * 1.3) + 64)
    while True:
        u = np.ldexp((cr.mask_words(seed, words) >> np.uint64(11)).astype(np.float64), -52) - 1.0
        x, y = u[0::2], u[1::2]
        r = x * x + y * y
        ok = (r > 0.0) & (r < 1.0)
        if int(ok.sum()) >= pairs:
            break
        words *= 2  # a longer keystream has the same prefix: the first accepted pairs stay
        # (reached with probability far below 1e-30 for any size)
    x, y, r = x[ok][:pairs], y[ok][:pairs], r[ok][:pairs]
    scale = np.sqrt(-2.0 * _log(r) / r)
    return np.stack([x * scale, y * scale], axis=1).reshape(-1)[:size]


def level_words(plan: NoisePlan, params: SessionParams, meta: StatsMeta, level: int,
                seed: bytes) -> NDArray[np.uint64]:
    """The words level ``level``'s excess component adds, from its seed.

    Standard normals (:func:`standard_normals`), clamped at ±c, times σ_b·√(1/a_j − 1/a_{j+1}),
    in the codec's integer domain: counts as round(x·2^16) in the count words, floats as
    round(x·2^e1) in the high limb (the low limb, ``n_clipped`` and the holdout stay 0).

    Returns
    -------
    ndarray of uint64, shape (codec.length(meta),)
    """
    sd = math.sqrt(level_variances(params)[1][level])
    plan = plan.shaped(meta.num_classes, meta.dim)
    codec = params.codec
    sch = schema_for(meta.mode)
    c = meta.num_classes
    n_int = sum(s.size for s in sch.int_layout(c, meta.dim, meta.has_holdout))
    layout = sch.float_layout(c, meta.dim)
    z = standard_normals(seed, c + (layout[-1].stop if layout else 0))
    np.clip(z, -NOISE_CLAMP_SIGMAS, NOISE_CLAMP_SIGMAS, out=z)
    words = np.zeros(codec.length(meta), np.int64)
    words[:c] = np.rint(np.ldexp(z[:c] * (sd * plan.sigma[COUNTS]), COUNT_FRACTION_BITS))
    for seg in layout:
        e1 = codec.exponents(seg.kind)[0]
        part = z[c + seg.offset : c + seg.stop] * (sd * plan.sigma[seg.name])
        scales = entry_scales(meta.mode, seg.name, c, meta.dim)
        if scales is not None:  # σ_b/√2 off the diagonal, as the base share (N2s)
            part *= scales
        words[n_int + seg.offset : n_int + seg.stop] = np.rint(np.ldexp(part, e1))
    return words.view(np.uint64)


class NoiseShareEncoder:
    """Distributed mode, client side: the encoder of a :class:`~ghofl.secure.SecAggClient`.

    Adds the base share N(0, σ_b²/a_K), clamped (N4), before the fixed-point encoding; the
    client adds the level components (:meth:`expand`) to the words. Counts travel as
    round(ñ_c · 2^16) in the integer words; ``n_clipped`` is withheld (0). The public bounds
    stay safe: base share and levels add at most c·σ_b·(1/√a_K + Σ_j √(1/a_j − 1/a_{j+1})) to an
    entry, i.e. as much as that over R^p samples would, and the client must hold that many
    samples fewer than M.

    Raises (when called)
    --------------------
    InputError
        The statistics do not match the round, or the client's samples plus the noise margin
        exceed the public maximum M.
    ConfigError
        The round's K·M is too large for the scaled counts to fit in 62 bits.
    """

    def __init__(self, plan: NoisePlan, rng: np.random.Generator) -> None:
        self.plan = plan
        self._rng = rng

    def expand(self, params: SessionParams, meta: StatsMeta, level: int,
               seed: bytes) -> NDArray[np.uint64]:
        """Level ``level``'s words (:func:`level_words`)."""
        return level_words(self.plan, params, meta, level, seed)

    def __call__(self, stats: ClientStats, params: SessionParams) -> NDArray[np.uint64]:
        """The words of ``stats`` with the base share added (before the levels)."""
        check_meta_matches_plan(stats.meta, self.plan)
        plan = self.plan.shaped(stats.num_classes, stats.dim)
        codec = params.codec
        if stats.meta.clip_norm != codec.clip_norm:
            raise InputError(
                f"secure aggregation uses the public clipping bound R={codec.clip_norm:g} but "
                f"these statistics were computed with R={stats.meta.clip_norm!r}"
            )
        ints, floats = schema_for(plan.stats_mode).flatten(stats)
        refuse_client_stats(stats, codec.max_samples, (ints, floats))
        base, levels = level_variances(params)
        margin = _noise_margin(plan, math.sqrt(base) + math.fsum(map(math.sqrt, levels)))
        if stats.n_samples + margin > codec.max_samples:
            raise InputError(
                f"this client holds {stats.n_samples} samples and its noise share may add as "
                f"much as {margin:.3g} samples would, more than the public maximum "
                f"M={codec.max_samples} per client; raise max_samples for the federation"
            )
        words_bound = params.num_clients * (codec.max_samples + margin) * 2.0**COUNT_FRACTION_BITS
        if words_bound >= 2.0**HEADROOM_BITS:
            raise ConfigError(
                f"num_clients × (max_samples + noise margin) × 2^{COUNT_FRACTION_BITS} = "
                f"{words_bound:.3g} does not fit in 62 bits, so the noisy counts could wrap; "
                "lower max_samples"
            )
        c = stats.num_classes
        dc, df = draw_noise(plan, c, stats.dim, self._rng, scale=math.sqrt(base),
                            clamp=NOISE_CLAMP_SIGMAS)
        words = np.zeros_like(ints)
        words[:c] = np.rint(np.ldexp(ints[:c].astype(np.float64) + dc, COUNT_FRACTION_BITS))
        return codec.encode_vectors(stats.meta, words, floats + df)


def noise_share_encoder(plan: NoisePlan, rng: np.random.Generator) -> NoiseShareEncoder:
    """The :class:`NoiseShareEncoder` of ``plan``, drawing its base shares from ``rng``."""
    return NoiseShareEncoder(plan, rng)


def _noise_margin(plan: NoisePlan, share: float) -> float:
    """Largest clamped noise of any float block, in samples: max_b c·σ_b·share / R^p_b."""
    powers = {"first": 1, "second": 2}
    kinds = {a.name: a.kind for a in schema_for(plan.stats_mode).float_arrays}
    return max(NOISE_CLAMP_SIGMAS * plan.sigma[b] * share / plan.clip_norm ** powers[k]
               for b, k in kinds.items())


class NoisyDecoder:
    """Distributed mode, server side: the ``decode`` of a :class:`~ghofl.secure.SecAggServer`.

    Regenerates level components (:meth:`expand`, called by the server half for the released
    levels), decodes the unmasked sum, checks it against the public bounds widened by the noise
    kept (σ_b·√κ per block, κ = :func:`kept_variance`), post-processes it into valid
    statistics and keeps the :class:`~ghofl.privacy.PrivateRelease` in :attr:`release`, whose
    ε is the accountant's for noise multiplier z·√κ (at most the target).

    Parameters
    ----------
    plan : NoisePlan
    contributors : callable returning int, optional
        How many clients are in the sum (the server half's survivors); default the round's n.
    removed : callable returning a mapping of str to tuple of int, optional
        The levels subtracted per survivor (the server half's ``levels_removed``); default:
        every released level of every survivor.

    Raises (when called)
    --------------------
    TotalOutOfBoundsError
        The noisy total fails the bounds (a client sent statistics beyond them); nothing is
        released (:attr:`release` stays ``None``).
    """

    def __init__(self, plan: NoisePlan, contributors: Callable[[], int] | None = None,
                 removed: Callable[[], Mapping[str, Sequence[int]]] | None = None) -> None:
        self.plan = plan
        self.release: PrivateRelease | None = None
        self._contributors = contributors
        self._removed = removed

    def expand(self, params: SessionParams, meta: StatsMeta, level: int,
               seed: bytes) -> NDArray[np.uint64]:
        """Level ``level``'s words (:func:`level_words`), as the client added them."""
        return level_words(self.plan, params, meta, level, seed)

    def _survivors(self, params: SessionParams) -> int:
        s = params.num_clients if self._contributors is None else self._contributors()
        return min(max(int(s), 1), params.num_clients)

    def kept(self, params: SessionParams) -> float:
        """κ: the noise variance in the sum, in units of σ_b² (:func:`kept_variance`)."""
        removed = None if self._removed is None else self._removed()
        return kept_variance(params, self._survivors(params), removed)

    def limits(self, params: SessionParams) -> TotalLimits:
        """The bounds a noisy total of this round is checked against."""
        s, spread = self._survivors(params), math.sqrt(self.kept(params))
        noise = {b: sigma * spread for b, sigma in self.plan.sigma.items()}
        return TotalLimits.for_codec(params.codec, s, noise,
                                     count_error=s * 2.0 ** -(COUNT_FRACTION_BITS + 1))

    def __call__(self, params: SessionParams, meta: StatsMeta,
                 words: NDArray[np.uint64]) -> ClientStats:
        """Decode the noised total, check its bounds and post-process it into statistics."""
        check_meta_matches_plan(meta, self.plan)
        self.plan = self.plan.shaped(meta.num_classes, meta.dim)
        ints, floats = params.codec.decode_vectors(meta, words)
        c = meta.num_classes
        counts = np.ldexp(ints[:c].astype(np.float64), -COUNT_FRACTION_BITS)
        limits = self.limits(params)
        refuse_total(check_bounds(meta, np.concatenate([counts, ints[c:]]), floats, limits),
                     limits, "the distributed DP release")
        kappa = self.kept(params)
        spread = math.sqrt(kappa)
        stats, notes = postprocess(meta, counts, floats, self.plan.min_class_count,
                                   {b: sig * spread for b, sig in self.plan.sigma.items()},
                                   self.plan.config.subspace, self.plan.config.prior)
        self.release = self._release(params, stats, kappa, c + floats.size, notes)
        return stats

    def _release(self, params: SessionParams, stats: ClientStats, kappa: float, entries: int,
                 notes: Sequence[str]) -> PrivateRelease:
        cfg, s = self.plan.config, self._survivors(params)
        z_kept = self.plan.noise_multiplier * math.sqrt(kappa)
        eps = cfg.epsilon if kappa <= 1.0 + 1e-12 else min(
            cfg.epsilon, gaussian_epsilon(z_kept, cfg.delta))
        levels = len(params.release_points)
        p = truncation_probability(params.num_clients * entries * (1 + levels))
        delta = cfg.delta + (1.0 + math.exp(cfg.epsilon)) * p
        removed = None if self._removed is None else self._removed()
        per_level = [s if removed is None and u <= s else
                     sum(j in set(r) for r in (removed or {}).values())
                     for j, u in enumerate(params.release_points)]
        details: dict[str, Any] = {
            "survivors": s, "threshold": params.threshold, "clients": params.num_clients,
            "release_points": list(params.release_points), "removed_per_level": per_level,
            "kept_variance": kappa, "noise_multiplier_kept": z_kept}
        base = f"σ²/{_ladder(params)[-1]}"
        return PrivateRelease(stats, self.plan, eps, delta, (
            f"distributed Gaussian noise: every client added a base share of variance {base} "
            f"and {levels} removable levels, clamped at {NOISE_CLAMP_SIGMAS:g} standard "
            f"deviations; {sum(per_level)} level components of the {s} survivors removed, "
            f"kept noise {kappa:.4f}·σ² (ε spent {eps:.4g})", *notes), details)
