"""Differential privacy of the federated evaluation release: sensitivity, noise, accounting.

Unit of privacy: as for the fitted statistics (:mod:`ghofl.privacy`), neighbouring federations
differ by adding or removing ONE row, here one held-out row of one client (a replacement is two
such steps). The evaluation is scored with heads fitted from the DP release of the training
statistics, so it is a second, adaptively chosen Gaussian mechanism on the same data set and the
two compose (sequential composition; no use is made of the training and held-out rows being
disjoint).

Sensitivity (L2, per head h of the H heads, all scored on the added row):

=======================  =================  ===========================================
block                    Δ_b                why
=======================  =================  ===========================================
confusion (C × C)        1                  one cell (true, predicted) changes by 1
bin_counts (B)           1                  one confidence bin changes by 1
bin_correct (B)          1                  that bin changes by 1 or 0
log_loss_sum             −log ε (≈ 36.04)   the row's loss, its probability clipped to
                                            [ε, 1 − ε] (:data:`LOG_LOSS_CAP`)
bin_confidence_sum (B)   1                  that bin changes by the confidence q ≤ 1
client accuracy (a, a²)  √2                 a and a² lie in [0, 1]: each changes by ≤ 1
=======================  =================  ===========================================

and once for the whole release, the number of clients: 1 (a client whose first held-out row is
the added one) and, when the model holds an OOD score, the OOD score histogram: 1 (one bin).
Dividing every block by its Δ_b leaves a vector of L2 sensitivity S = √(6·H + 1 + o) (six
blocks per head, each changing by at most 1, the client count, o = 1 with the histogram), so the
Gaussian mechanism of noise multiplier z adds N(0, (z·S·Δ_b)²) to every entry of block b and
the release is as private as one Gaussian mechanism of noise multiplier z (equal budget over
the blocks). The noisy sums are then post-processed (rounded, clamped, made consistent:
:func:`release_evaluation`), which costs no privacy.

Distributed mode (the plan's ``dp_mode = "distributed"``, secure protocol only): the server
never sees an exact total. Every client adds its share of the noise to its own sums before
masking (:func:`evaluation_noise_share`), with the statistics round's share rule without a
dropout ladder (:mod:`ghofl.privacy.distributed`): N(0, σ_e²/t) per entry, t the round's
threshold, clamped at ±c standard deviations of the share (c = ``NOISE_CLAMP_SIGMAS``). The sum
over the s ≥ t survivors then carries s·σ_e²/t ≥ σ_e² (:func:`~ghofl.privacy.distributed.
kept_variance`), and the release is accounted at the noise multiplier z·√(s/t) it keeps. The
shares travel as float entries of a public description (:func:`noisy_evaluation_meta`: every
entry a float bounded by the client's bound plus the clamped share), so the secure sum's
fixed-point words carry the noisy counts; the server only post-processes the decoded total
(:func:`release_noisy_total`). Clamping adds (1 + e^ε)·p to δ, p the probability that any
share was clamped (:func:`~ghofl.privacy.truncation_probability`).

Accounting: :func:`composed_epsilon` composes Gaussian mechanisms with the PLD accountant of
``dp_accounting`` (as :mod:`ghofl.privacy.accounting` calibrates them); :func:`charge_evaluation`
charges the evaluation release to a run's privacy report so that its total ε covers the fit and
the evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, require_extra
from ghofl.evaluation.federated import LOG_LOSS_CAP, EvaluationSums, vector_bounds
from ghofl.heads.ood import HIST_BINS
from ghofl.privacy import (
    NOISE_CLAMP_SIGMAS,
    check_epsilon_delta,
    truncation_probability,
)
from ghofl.privacy.distributed import kept_variance
from ghofl.secure import VectorMeta, VectorPayload
from ghofl.secure.config import SessionParams
from ghofl.secure.vectors import refuse_client_vector

__all__ = ["NOISY_EVALUATION_VECTORS", "EvaluationRelease", "charge_evaluation",
           "composed_epsilon", "evaluation_noise_share", "evaluation_sensitivity",
           "noisy_evaluation_meta", "release_evaluation", "release_noisy_total"]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
#: Blocks of one head in :meth:`EvaluationSums.to_vectors` order, with their L2 sensitivity.
_INT_BLOCKS = ("confusion", "bin_counts", "bin_correct")
_SENSITIVITY = {"confusion": 1.0, "bin_counts": 1.0, "bin_correct": 1.0,
                "log_loss_sum": LOG_LOSS_CAP, "bin_confidence_sum": 1.0,
                "client_accuracy": math.sqrt(2.0), "clients": 1.0}
_PLD_INTERVAL = 1e-3  # as ghofl.privacy.accounting: pessimistic, overstates ε by < 1e-3
#: The name of the noised evaluation vectors (distributed mode) in a round's description.
NOISY_EVALUATION_VECTORS = "evaluation+noise"
_CENTRAL = "central Gaussian noise added by the server to the evaluation sums"


def evaluation_sensitivity(sums: EvaluationSums) -> tuple[dict[str, float], float]:
    """Per-block L2 sensitivity Δ_b and the scaled sensitivity S = √(6·H + 1 + o).

    Parameters
    ----------
    sums : EvaluationSums
        Any sums of the release (only their layout is used).

    Raises
    ------
    ConfigError
        The sums carry entries this mechanism has no sensitivity for (it would release them
        without noise).
    """
    h, ood = len(sums.heads), _ood_bins(sums)
    sens = dict(_SENSITIVITY) | ({"ood_counts": 1.0} if ood else {})
    return sens, math.sqrt(6.0 * h + 1.0 + (1.0 if ood else 0.0))


def _ood_bins(sums: EvaluationSums) -> int:
    """Entries of the OOD score histogram in :meth:`EvaluationSums.to_vectors` (0: none)."""
    c, b, h = len(sums.classes), sums.bins, len(sums.heads)
    ints, floats = sums.to_vectors()
    extra = ints.size - (h * (c * c + 2 * b) + 1)
    if extra not in (0, HIST_BINS) or floats.shape != (h * (b + 3),):
        raise ConfigError(
            f"the evaluation sums carry {ints.size} integer and {floats.size} float entries, "
            f"not the {h * (c * c + 2 * b) + 1} (+{HIST_BINS} OOD bins) and {h * (b + 3)} whose "
            "sensitivity the DP evaluation release knows; give every new entry its "
            "sensitivity in ghofl.server.eval_privacy before releasing it under DP"
        )
    return extra


def _entry_sigmas(sums: EvaluationSums, noise_multiplier: float) -> tuple[F64, F64]:
    """σ of every int entry, shape (I,), and of every float entry, shape (F,)."""
    sens, scale = evaluation_sensitivity(sums)
    c, b = len(sums.classes), sums.bins
    z = noise_multiplier * scale
    per_int = np.concatenate([np.full(c * c, sens["confusion"]), np.full(b, sens["bin_counts"]),
                              np.full(b, sens["bin_correct"])])
    per_float = np.concatenate([[sens["log_loss_sum"]], np.full(b, sens["bin_confidence_sum"]),
                                np.full(2, sens["client_accuracy"])])
    h, ood = len(sums.heads), np.full(_ood_bins(sums), sens.get("ood_counts", 1.0))
    return (z * np.concatenate([np.tile(per_int, h), ood, [sens["clients"]]]),
            z * np.tile(per_float, h))


def _apportion(values: F64, total: int, caps: F64) -> I64:
    """Non-negative integers x ≤ caps summing to ``total`` (≤ Σ caps), close to ``values``.

    Proportional to the clipped values (to the caps when they are all 0), rounded by largest
    remainder.
    """
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    total = min(int(total), int(caps.sum()))  # never more than the caps hold (no endless loop)
    w = np.clip(values, 0.0, caps)
    if w.sum() <= 0:
        w = caps.astype(np.float64)
    target = w * (total / w.sum()) if w.sum() > 0 else np.zeros_like(w)
    x = np.minimum(np.floor(target), caps).astype(np.int64)
    order = np.argsort(-(target - x), kind="stable")
    left = int(total - x.sum())
    while left > 0:
        for j in order:
            if left == 0:
                break
            if x[j] < caps[j]:
                x[j] += 1
                left -= 1
    return x


def _consistent(sums: EvaluationSums, ints: F64, floats: F64) -> EvaluationSums:
    """Noisy vectors → the nearest-by-rounding valid :class:`EvaluationSums` (post-processing)."""
    c, b = len(sums.classes), sums.bins
    ni, nf = c * c + 2 * b, b + 3
    clients = max(int(np.rint(ints[-1])), 1)
    out_i: list[I64] = []
    out_f: list[F64] = []
    for k in range(len(sums.heads)):
        i, f = ints[k * ni:(k + 1) * ni], floats[k * nf:(k + 1) * nf]
        conf = np.maximum(np.rint(i[:c * c]), 0).astype(np.int64)
        n = int(conf.sum())
        counts = _apportion(i[c * c:c * c + b], n, np.full(b, float(n)))
        correct = _apportion(i[c * c + b:], int(np.trace(conf.reshape(c, c))),
                             counts.astype(np.float64))
        acc = float(np.clip(f[b + 1], 0.0, clients))
        out_i.append(np.concatenate([conf, counts, correct]))
        out_f.append(np.concatenate([[float(np.clip(f[0], 0.0, n * LOG_LOSS_CAP))],
                                     np.clip(f[1:1 + b], 0.0, counts.astype(np.float64)),
                                     [acc, float(np.clip(f[b + 2], 0.0, acc))]]))
    h = len(sums.heads)
    rows = int(out_i[0][:c * c].sum())  # the OOD histogram counts the first head's rows
    ood = _apportion(ints[h * ni:h * ni + _ood_bins(sums)], rows, np.full(_ood_bins(sums),
                                                                         float(rows)))
    return EvaluationSums.from_vectors(
        sums.classes, tuple(sums.heads), b,
        np.concatenate([*out_i, ood, [clients]]).astype(np.int64),
        np.concatenate(out_f).astype(np.float64))


@dataclass(frozen=True)
class EvaluationRelease:
    """The noised, post-processed evaluation sums and how they were noised.

    Attributes
    ----------
    sums : EvaluationSums
        Valid sums (rounded, clamped, consistent) to report metrics from.
    noise_multiplier : float
        z of the release (one Gaussian mechanism of this multiplier).
    sigma : dict of str to float
        σ per block (``confusion``, …, ``clients``) of the noise in the total.
    noise : str
        Who added the noise, in words.
    clamp_probability : float, default 0.0
        p, the probability that any client's share was clamped (distributed mode); the
        release then adds (1 + e^ε)·p to δ (:func:`charge_evaluation`).
    details : dict
        Distributed mode: ``survivors``, ``threshold``, ``kept_variance`` (in units of the
        calibrated variance), ``noise_multiplier_calibrated``.
    """

    sums: EvaluationSums
    noise_multiplier: float
    sigma: dict[str, float]
    noise: str = _CENTRAL
    clamp_probability: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


def release_evaluation(total: EvaluationSums, noise_multiplier: float,
                       rng: np.random.Generator) -> EvaluationRelease:
    """The Gaussian mechanism on the exact total of evaluation sums, then post-processing.

    Parameters
    ----------
    total : EvaluationSums
        The exact sums over the clients.
    noise_multiplier : float
        z > 0 (e.g. the run's :attr:`~ghofl.privacy.NoisePlan.noise_multiplier`).
    rng : numpy.random.Generator
        Source of the noise.

    Raises
    ------
    ConfigError
        ``noise_multiplier`` is not a finite number > 0, or the sums carry entries of unknown
        sensitivity.
    """
    _check_multiplier(noise_multiplier)
    s_int, s_float = _entry_sigmas(total, float(noise_multiplier))
    ints, floats = total.to_vectors()
    noisy_i = ints.astype(np.float64) + rng.normal(size=ints.shape) * s_int
    noisy_f = floats + rng.normal(size=floats.shape) * s_float
    sens, scale = evaluation_sensitivity(total)
    sigma = {k: float(noise_multiplier) * scale * v for k, v in sens.items()}
    return EvaluationRelease(_consistent(total, noisy_i, noisy_f), float(noise_multiplier), sigma)


def _check_multiplier(noise_multiplier: Any) -> None:
    if isinstance(noise_multiplier, bool) or not (
            isinstance(noise_multiplier, float | int) and math.isfinite(noise_multiplier)
            and noise_multiplier > 0):
        raise ConfigError(f"the evaluation noise multiplier must be a finite number > 0; got "
                          f"{noise_multiplier!r}")


def _share_sigmas(layout: EvaluationSums, noise_multiplier: float, threshold: int) -> F64:
    """σ of one client's share of every entry, shape (I + F,): σ_e/√t, ints first."""
    _check_multiplier(noise_multiplier)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ConfigError(f"the noise shares need the round's threshold t >= 1; got "
                          f"{threshold!r}")
    s_int, s_float = _entry_sigmas(layout, float(noise_multiplier))
    return np.concatenate([s_int, s_float]) / math.sqrt(threshold)


def noisy_evaluation_meta(layout: EvaluationSums, max_samples: int, noise_multiplier: float,
                          threshold: int) -> VectorMeta:
    """Public description of the noised evaluation vectors of a distributed-DP round.

    Every entry of :meth:`EvaluationSums.to_vectors` (ints first, then floats) is one float
    entry, bounded by its per-client bound (:func:`~ghofl.evaluation.federated.vector_bounds`)
    plus the clamped share, c·σ_e/√t, and signed.

    Parameters
    ----------
    layout : EvaluationSums
        Any sums of the federation (only the layout is used).
    max_samples : int
        M, the public maximum of held-out rows per client.
    noise_multiplier : float
        z of the evaluation release.
    threshold : int
        t, the round's threshold (the least number of survivors in a sum).

    Raises
    ------
    ConfigError
        ``noise_multiplier`` or ``threshold`` is invalid.
    """
    share = NOISE_CLAMP_SIGMAS * _share_sigmas(layout, noise_multiplier, threshold)
    ib, fb = vector_bounds(layout, max_samples)
    bounds = np.concatenate([ib.astype(np.float64), fb]) + share
    return VectorMeta(NOISY_EVALUATION_VECTORS, (), tuple(float(b) for b in bounds),
                      nonnegative=False)


def evaluation_noise_share(sums: EvaluationSums, meta: VectorMeta, noise_multiplier: float,
                           threshold: int, rng: np.random.Generator) -> VectorPayload:
    """Client side of distributed mode: the client's sums plus its share of the noise.

    Adds N(0, σ_e²/t) to every entry, clamped at ±c·σ_e/√t, before masking; the sum of s ≥ t
    survivors' shares carries s/t times the calibrated variance.

    Parameters
    ----------
    sums : EvaluationSums
        The client's exact sums (zeros for a client without held-out rows).
    meta : VectorMeta
        :func:`noisy_evaluation_meta` of the round.
    noise_multiplier, threshold :
        As for :func:`noisy_evaluation_meta`.
    rng : numpy.random.Generator
        Source of the share (OS entropy in deployment); never revealed.

    Returns
    -------
    VectorPayload
        No integer entry; float entries of shape (I + F,).

    Raises
    ------
    ConfigError
        ``meta`` does not describe these sums' noised vectors.
    InputError
        The sums exceed the public per-client bounds.
    """
    sd = _share_sigmas(sums, noise_multiplier, threshold)
    if meta.name != NOISY_EVALUATION_VECTORS or meta.n_float != sd.size or meta.n_int:
        raise ConfigError(
            f"the round describes {meta.n_float} {meta.name!r} float entries but these sums "
            f"have {sd.size} noised entries; build the description with noisy_evaluation_meta "
            "from sums of the same classes, heads and bins"
        )
    ints, floats = sums.to_vectors()
    noise = np.clip(rng.standard_normal(sd.size), -NOISE_CLAMP_SIGMAS, NOISE_CLAMP_SIGMAS)
    values = np.concatenate([ints.astype(np.float64), floats]) + noise * sd
    payload = VectorPayload(meta, np.zeros(0, dtype=np.int64), values)
    refuse_client_vector(payload)
    return payload


def release_noisy_total(layout: EvaluationSums, total: VectorPayload, noise_multiplier: float,
                        params: SessionParams, survivors: int) -> EvaluationRelease:
    """Server side of distributed mode: the decoded noisy total, post-processed only.

    Parameters
    ----------
    layout : EvaluationSums
        Any sums of the federation (only the layout is used).
    total : VectorPayload
        The secure sum of the survivors' :func:`evaluation_noise_share` payloads, shape
        (I + F,) of floats.
    noise_multiplier : float
        z the shares were drawn for.
    params : SessionParams
        The round's public parameters (its threshold t; no dropout ladder).
    survivors : int
        s, the clients in the sum (s ≥ t).

    Returns
    -------
    EvaluationRelease
        Accounted at the kept multiplier z·√(s/t).
    """
    n_int = layout.to_vectors()[0].size
    if total.floats.shape != (n_int + layout.to_vectors()[1].size,):
        raise ConfigError(f"the noised total holds {total.floats.size} entries, not the "
                          f"{n_int + layout.to_vectors()[1].size} of these evaluation sums; "
                          "give the layout of the round's sums")
    kappa = kept_variance(params, survivors)
    z_kept = float(noise_multiplier) * math.sqrt(kappa)
    sens, scale = evaluation_sensitivity(layout)
    sums = _consistent(layout, total.floats[:n_int], total.floats[n_int:])
    return EvaluationRelease(
        sums, z_kept, {k: z_kept * scale * v for k, v in sens.items()},
        noise=(f"distributed Gaussian noise: every client added a share of variance σ²/"
               f"{params.threshold} to its evaluation sums before masking, clamped at "
               f"{NOISE_CLAMP_SIGMAS:g} standard deviations; the server post-processed the "
               f"noisy total of {survivors} survivors (kept noise {kappa:.4f}·σ²)"),
        clamp_probability=truncation_probability(params.num_clients * total.floats.size),
        details={"survivors": int(survivors), "threshold": params.threshold,
                 "kept_variance": kappa, "noise_multiplier_calibrated": float(noise_multiplier)})


def composed_epsilon(noise_multipliers: Sequence[float], delta: float) -> float:
    """ε at ``delta`` of the composition of Gaussian mechanisms of these multipliers (PLD).

    Raises
    ------
    ConfigError
        No multiplier, or one that is not a finite number > 0, or δ outside (0, 1).
    """
    zs = [float(z) for z in noise_multipliers]
    if not zs or not all(math.isfinite(z) and z > 0 for z in zs):
        raise ConfigError(f"composition needs one or more finite noise multipliers > 0; got "
                          f"{list(noise_multipliers)!r}")
    check_epsilon_delta(1.0, delta)
    require_extra("dp_accounting", "privacy")
    import dp_accounting
    from dp_accounting import pld

    acc = pld.PLDAccountant(value_discretization_interval=_PLD_INTERVAL)
    for z in zs:
        acc.compose(dp_accounting.GaussianDpEvent(z))
    return float(acc.get_epsilon(float(delta)))


def charge_evaluation(privacy: dict[str, Any], release: EvaluationRelease) -> dict[str, Any]:
    """A run's privacy report with the evaluation release charged to it.

    The fit is accounted as the Gaussian mechanism it was, of the multiplier the report
    carries (``noise_multiplier_released``, else the plan's ``noise_multiplier``, which is
    never larger); composed with the evaluation's Gaussian mechanism at the run's δ. Any
    extra δ of the fit (the clamping term of distributed mode) is added to the total δ, and
    so is the evaluation's own clamping term (1 + e^ε)·p of distributed mode (ε the composed
    one, which bounds the evaluation's).

    Parameters
    ----------
    privacy : dict
        :meth:`~ghofl.privacy.PrivateRelease.to_dict` of the fit (``noise_multiplier_released``
        or ``noise_multiplier``, ``delta_spent``, ``delta``).
    release : EvaluationRelease

    Returns
    -------
    dict
        ``privacy`` plus ``evaluation`` (noise multiplier, σ per block, sensitivity, what
        added the noise) and ``epsilon_total``, ``delta_total`` covering fit and evaluation.

    Raises
    ------
    ConfigError
        ``privacy`` names no noise multiplier of the fit.
    """
    delta = float(privacy["delta"])
    z_fit = privacy.get("noise_multiplier_released", privacy.get("noise_multiplier"))
    if isinstance(z_fit, bool) or not isinstance(z_fit, int | float):
        raise ConfigError("the fit's privacy report names no noise multiplier "
                          "(noise_multiplier_released or noise_multiplier), so the evaluation "
                          "cannot be composed with it; pass PrivateRelease.to_dict() of the fit")
    eps = composed_epsilon((float(z_fit), release.noise_multiplier), delta)
    sens, scale = evaluation_sensitivity(release.sums)
    return {**privacy, "epsilon_total": eps,
            "delta_total": (delta + max(float(privacy["delta_spent"]) - delta, 0.0)
                            + (1.0 + math.exp(min(eps, 700.0))) * release.clamp_probability),
            "evaluation": {"noise_multiplier": release.noise_multiplier,
                           "sigma": dict(release.sigma), "sensitivity": sens,
                           "scaled_sensitivity": scale,
                           "neighbouring": "add/remove one held-out row",
                           "noise": release.noise,
                           "clamp_probability": release.clamp_probability,
                           **release.details,
                           "composition": "fit + evaluation, dp_accounting PLD (Gaussian)"}}
