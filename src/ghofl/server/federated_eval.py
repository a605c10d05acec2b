"""One aggregation round of the clients' evaluation sums, with the statistics round's protocol.

Every client scores the fitted heads on its own held-out rows
(:func:`~ghofl.evaluation.federated.local_evaluation`) and the server learns only the total of
their :class:`~ghofl.evaluation.federated.EvaluationSums`. :func:`aggregate_evaluation` sends
them with the protocol of the statistics round:

* plain (``config=None``): each client's sums are checked against the public per-client bounds
  (:func:`~ghofl.evaluation.federated.vector_bounds`) and added in the clear;
* secure (a :class:`~ghofl.secure.SecAggConfig`): one secure round over the public vectors
  (:class:`~ghofl.secure.vectors.VectorMeta` of :meth:`EvaluationSums.to_vectors` with those
  bounds), with the same identities, roster and policy as the statistics round: the sums
  travel as exact fixed-point words (counts exact, floats to within the codec's error bound),
  a client whose sums exceed the bounds refuses before masking, dropouts after the key
  exchange are tolerated as in the statistics round, and the decoded total is checked against
  the bounds of its number of contributors, and a total within the bounds whose sums are
  inconsistent (e.g. bin counts that do not add up to the confusion counts) aborts the round
  (:func:`total_sums`);
* secure with distributed DP (``noise_multiplier``): every client adds its share of the
  Gaussian noise to its sums before masking (:func:`~ghofl.server.eval_privacy.
  evaluation_noise_share`), so the server decodes only a noisy total, which it post-processes
  (:func:`~ghofl.server.eval_privacy.release_noisy_total`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ghofl.errors import AggregationAbortedError, ConfigError, InputError
from ghofl.evaluation.federated import EvaluationSums, vector_bounds
from ghofl.secure import (
    DEFAULT_MAX_SAMPLES,
    ClientPolicy,
    IdentityKey,
    InMemoryTransport,
    Roster,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    VectorMeta,
    VectorPayload,
)
from ghofl.secure.vector_round import VectorSumReport, run_vector_sum
from ghofl.secure.vectors import refuse_client_vector
from ghofl.server.eval_privacy import (
    EvaluationRelease,
    evaluation_noise_share,
    noisy_evaluation_meta,
    release_noisy_total,
)

__all__ = ["EVALUATION_VECTORS", "EvaluationRound", "aggregate_evaluation", "evaluation_meta",
           "secure_evaluation_round", "total_sums"]

#: The name of the evaluation vectors in a round's public description.
EVALUATION_VECTORS = "evaluation"


@dataclass(frozen=True)
class EvaluationRound:
    """The total of the clients' evaluation sums and how it was aggregated.

    Attributes
    ----------
    total : EvaluationSums
        Sum over the clients in the total (``total.clients`` of them held rows).
    aggregation : dict
        ``protocol`` (``"plain"`` or ``"secure"``), ``seconds``, ``survivors``,
        ``survivor_ids``, ``dropped``, ``excluded``, ``refused`` and (secure) ``stages``,
        ``notes`` and ``params``.
    release : EvaluationRelease or None
        Distributed DP: how the clients' noise shares were released (``total`` is its
        post-processed sums); ``None`` otherwise (exact total).
    """

    total: EvaluationSums
    aggregation: dict[str, Any]
    release: EvaluationRelease | None = None


def evaluation_meta(layout: EvaluationSums, max_samples: int) -> VectorMeta:
    """The public description of the evaluation vectors of ``layout``'s classes, heads, bins.

    Parameters
    ----------
    layout : EvaluationSums
        Any sums of the federation (only the layout is used).
    max_samples : int
        M, the public maximum of held-out rows per client.
    """
    ib, fb = vector_bounds(layout, max_samples)
    return VectorMeta(EVALUATION_VECTORS, tuple(int(v) for v in ib),
                      tuple(float(v) for v in fb))


def total_sums(layout: EvaluationSums, total: VectorPayload) -> EvaluationSums:
    """The decoded exact total of a secure round as sums of ``layout``'s classes and heads.

    Raises
    ------
    AggregationAbortedError
        The total lies within the public bounds but no honest clients' sums add up to it
        (e.g. bin counts that do not add up to the confusion counts): a client sent
        inconsistent sums (poisoned), so nothing is released.
    """
    try:
        return EvaluationSums.from_vectors(layout.classes, tuple(layout.heads), layout.bins,
                                           total.ints, total.floats)
    except InputError as exc:
        raise AggregationAbortedError(
            "secure aggregation aborted: the evaluation total is within the public bounds but "
            "inconsistent (its sums do not fit together as honest clients' sums do): a client "
            f"sent inconsistent sums (poisoned), so nothing is released ({exc})") from None


def _zeros(layout: EvaluationSums) -> EvaluationSums:
    """Sums of a client without held-out rows (every entry 0, no client counted)."""
    ints, floats = layout.to_vectors()
    return EvaluationSums.from_vectors(layout.classes, tuple(layout.heads), layout.bins,
                                       np.zeros_like(ints), np.zeros_like(floats))


def aggregate_evaluation(sums: Mapping[str, EvaluationSums | None], *,
                         config: SecAggConfig | None = None,
                         identities: Mapping[str, IdentityKey] | None = None,
                         roster: Roster | None = None, policy: ClientPolicy | None = None,
                         drops: Mapping[str, int] | None = None, seed: int = 0,
                         max_samples: int | None = None, noise_multiplier: float | None = None,
                         noise_seed: int | None = None) -> EvaluationRound:
    """Aggregate every client's evaluation sums with the plain or the secure protocol.

    Parameters
    ----------
    sums : mapping of client id to EvaluationSums or None
        Each client's sums (``None``: no held-out row; it sends zeros in a secure round).
    config : SecAggConfig, optional
        The statistics round's configuration; ``None``: the plain protocol. Its dropout
        ladder, if any, is not used (the distributed shares follow the rule without a ladder,
        :mod:`ghofl.server.eval_privacy`).
    identities, roster, policy :
        The statistics round's identity keys (by client id), roster and client policy
        (secure protocol; with ``roster``, ``identities`` is required).
    drops : mapping of stage to int, optional
        Simulated dropouts (in-process transport), as in the statistics round.
    seed : int, default 0
        Seed of the simulated dropouts.
    max_samples : int, optional
        M, the public maximum of held-out rows per client the bounds are sized for (default:
        ``config.max_samples``, or :data:`~ghofl.secure.DEFAULT_MAX_SAMPLES` without config).
    noise_multiplier : float, optional
        Distributed DP (secure protocol only): z of the evaluation release; every client adds
        its noise share before masking and the total is released post-processed.
    noise_seed : int, optional
        Seed of the simulated clients' noise shares (default: OS entropy).

    Raises
    ------
    InputError
        No client holds a held-out row.
    ConfigError
        ``noise_multiplier`` with the plain protocol (distributed DP needs the secure one).
    AggregationAbortedError
        The secure round aborted (too few clients, a total beyond the public bounds).
    """
    present = [s for s in sums.values() if s is not None]
    if not present:
        raise InputError("no client holds a held-out row; give clients more rows or a "
                         "larger evaluation fraction")
    layout = present[0]
    if max_samples is None:
        max_samples = config.max_samples if config is not None else DEFAULT_MAX_SAMPLES
    if config is None:
        if noise_multiplier is not None:
            raise ConfigError("distributed DP of the evaluation needs the secure protocol (the "
                              "clients' noise shares are summed under masks); give config= or "
                              "leave noise_multiplier unset and noise the total centrally")
        return _plain(sums, evaluation_meta(layout, max_samples), layout)
    config = dataclasses.replace(config, noise_levels=0)
    filled = {c: s if s is not None else _zeros(layout) for c, s in sums.items()}
    if noise_multiplier is None:
        meta = evaluation_meta(layout, max_samples)
        payloads = {c: VectorPayload(meta, *s.to_vectors()) for c, s in filled.items()}
    else:
        t = config.for_clients(len(filled)).threshold
        meta = noisy_evaluation_meta(layout, max_samples, noise_multiplier, t)
        rngs = np.random.SeedSequence(noise_seed).spawn(len(filled))
        payloads = {c: evaluation_noise_share(s, meta, noise_multiplier, t,
                                              np.random.default_rng(r))
                    for (c, s), r in zip(filled.items(), rngs, strict=True)}
    out, server = _secure(payloads, config, identities, roster, policy, drops, seed)
    if noise_multiplier is None:
        return EvaluationRound(total_sums(layout, out.total), out.summary)
    release = release_noisy_total(layout, out.total, noise_multiplier, server.params,
                                  len(server.survivors))
    return EvaluationRound(release.sums, out.summary, release)


def _secure(payloads: Mapping[str, VectorPayload], config: SecAggConfig,
            identities: Mapping[str, IdentityKey] | None, roster: Roster | None,
            policy: ClientPolicy | None, drops: Mapping[str, int] | None, seed: int
            ) -> tuple[VectorSumReport, SecAggServer]:
    """One in-process secure round over ``payloads``: its report and its server half."""
    meta = next(iter(payloads.values())).meta
    keys = dict(identities or {})
    halves = [SecAggClient(c, p, identity=keys.get(c), roster=roster, policy=policy,
                           ledger=None, allow_unauthenticated=roster is None)
              for c, p in payloads.items()]
    server = SecAggServer(config, meta, list(payloads), roster=roster)
    return run_vector_sum(server, InMemoryTransport(halves, drops, seed=seed)), server


def _plain(sums: Mapping[str, EvaluationSums | None], meta: VectorMeta,
           layout: EvaluationSums) -> EvaluationRound:
    """The clear sum of the clients' sums, each refused when beyond the public bounds."""
    t0 = time.perf_counter()
    kept: list[str] = []
    refused: dict[str, str] = {}
    total = _zeros(layout)
    for client, s in sums.items():
        if s is None:
            continue
        try:
            refuse_client_vector(VectorPayload(meta, *s.to_vectors()))
        except InputError as exc:
            refused[client] = str(exc)
            continue
        total = total + s
        kept.append(client)
    return EvaluationRound(total, {
        "protocol": "plain", "seconds": time.perf_counter() - t0, "survivors": len(kept),
        "survivor_ids": kept, "dropped": dict.fromkeys(refused, "input"), "excluded": {},
        "refused": refused})


def secure_evaluation_round(config: SecAggConfig, layout: EvaluationSums, clients: list[str],
                            roster: Roster | None, transport: Any,
                            noise_multiplier: float | None = None
                            ) -> tuple[EvaluationSums, dict[str, Any],
                                       EvaluationRelease | None]:
    """The server half of one secure evaluation round over a deployment's ``transport``.

    Parameters
    ----------
    config : SecAggConfig
        The statistics round's configuration (its dropout levels are not used here).
    layout : EvaluationSums
        Any value of the round's shape (classes, heads, bins, histogram); its values unused.
    clients : list of str
        The round's invited clients (with a roster: exactly the roster's ids; the transport
        may reach only some of them, the others are the round's dropouts).
    roster : Roster or None
    transport : object
        A :class:`~ghofl.secure.transport.Transport` reaching the clients (e.g. Flower's).
    noise_multiplier : float, optional
        With distributed DP: the clients add their noise shares, sized for this multiplier.

    Returns
    -------
    total : EvaluationSums
        The (released, with DP) total of the survivors' sums.
    summary : dict
        The round's stage report.
    release : EvaluationRelease or None
        With DP: the release (noise, post-processing).
    """
    config = dataclasses.replace(config, noise_levels=0)
    params = config.for_clients(len(clients))
    meta = (evaluation_meta(layout, config.max_samples) if noise_multiplier is None else
            noisy_evaluation_meta(layout, config.max_samples, noise_multiplier,
                                  params.threshold))
    server = SecAggServer(config, meta, list(clients), roster=roster)
    out = run_vector_sum(server, transport)
    if noise_multiplier is None:
        return total_sums(layout, out.total), dict(out.summary), None
    release = release_noisy_total(layout, out.total, noise_multiplier, server.params,
                                  len(server.survivors))
    return release.sums, dict(out.summary), release

