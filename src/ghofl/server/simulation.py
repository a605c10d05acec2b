"""In-process one-shot federation: partition → client statistics → aggregate → heads → accuracy.

Used by ``ghofl simulate`` and by the experiment runner. This module only orchestrates: it
partitions the training set, gives each simulated client its own rows, which it turns into
statistics with the client function of every deployment (:func:`ghofl.client.job.
client_statistics`, computed when its protocol asks for them), runs an aggregation protocol
over the in-memory transport — the plain one-stage sum, or the secure protocol of
:mod:`ghofl.secure` — and hands the total to the server function of every deployment
(:func:`ghofl.server.job.run_server_job`), which fits and scores every head from the total
alone, exactly what a real server sees.

The one entry point is :func:`simulate`: a :class:`~ghofl.server.plan.FederationPlan` (the value
the Flower apps and the CLI run too) and a :class:`Population` (how the training set is split
into clients)::

    plan = FederationPlan(ClientJob(("cat", "dog"), "full", clip_norm=30.0),
                          AggregationSpec("secure"), ServerJob(("nb", "lda"), seed=0))
    result = simulate(plan, (x_train, y_train), (x_test, y_test), Population(10, alpha=0.1))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.job import client_statistics
from ghofl.client.transforms import apply_feature_transform, transformed_dim, transformed_info
from ghofl.data.embeddings import check_labelled_embeddings
from ghofl.data.partition import dirichlet_partition
from ghofl.errors import InputError
from ghofl.evaluation.federated import federated_ood_report, local_evaluation, report
from ghofl.evaluation.split import held_out_mask
from ghofl.heads.build import build_heads, head_defaults, to_jsonable
from ghofl.heads.ood import MahalanobisOOD, ood_or_none
from ghofl.privacy import noise_share_encoder
from ghofl.secure import InMemoryTransport, PlainClient, SecAggClient, SecAggConfig
from ghofl.secure.hierarchy import Region, TopRound, region_codec, region_encoder
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.policy import ClientPolicy
from ghofl.server.eval_privacy import charge_evaluation, release_evaluation
from ghofl.server.federated_eval import aggregate_evaluation
from ghofl.server.plan import FederationPlan
from ghofl.server.run import Aggregated, FederationServer
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import through_transport
from ghofl.stats.meta import EncoderInfo, Mode, StatsMeta
from ghofl.stats.schema import schema_for

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

__all__ = [
    "HeadResult",
    "Population",
    "SimulationResult",
    "build_heads",  # re-exported from ghofl.heads.build
    "check_labelled_embeddings",  # re-exported from ghofl.data.embeddings
    "head_defaults",  # re-exported from ghofl.heads.build
    "simulate",
    "to_jsonable",  # re-exported from ghofl.heads.build
]


@dataclass(frozen=True)
class HeadResult:
    """Outcome of one head in a simulation.

    Attributes
    ----------
    accuracy : float
        Test accuracy in [0, 1].
    fit_seconds : float
        Server time to fit the head from the aggregate.
    predict_seconds : float
        Time to predict the whole test set.
    params : dict
        The head's hyperparameters (``get_params()`` after fitting).
    """

    accuracy: float
    fit_seconds: float
    predict_seconds: float
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values."""
        return {
            "accuracy": self.accuracy,
            "fit_seconds": self.fit_seconds,
            "predict_seconds": self.predict_seconds,
            "params": {k: to_jsonable(v) for k, v in self.params.items()},
        }


@dataclass(frozen=True)
class SimulationResult:
    """Everything one simulated federation measured; :meth:`to_dict` is the JSON contract.

    Attributes
    ----------
    heads : dict of str to HeadResult
        Per head, in the order requested.
    clients, alpha, seed, mode, projection_dim, projection_seed :
        The configuration simulated (``projection_dim`` is ``None`` without projection).
    upload_bytes_per_client : int
        Array bytes of one client's payload (:func:`~ghofl.stats.payload_nbytes`); the same
        for every client because it depends only on mode, classes and dimension.
    n_train, n_test, num_classes : int
    classes : list of str
        Class names; predictions index into it.
    stage_seconds : dict of str to float
        ``partition``, ``client_stats`` (all clients, sequentially), ``client_stats_max``
        (slowest single client), ``aggregate``, and ``fit/<head>``, ``evaluate/<head>``.
    client_sizes : list of int
        Training samples per client (length ``clients``).
    aggregation : dict
        :meth:`~ghofl.secure.AggregationReport.to_dict` of the protocol run: ``protocol``
        (``"plain"`` or ``"secure"``), per-stage seconds and bytes, survivors, dropped and
        excluded clients, public parameters; with regions also ``hierarchy``
        (:meth:`~ghofl.secure.hierarchy.HierarchicalReport.to_dict`: each region's status,
        the regions in the total, the top round).
    clip_norm : float or None
        Per-sample L2 clipping bound R applied by every client.
    n_clipped : int
        Training samples (of the surviving clients) that clipping scaled down (0 under
        differential privacy: withheld).
    min_class_count : int
        k of the minimum-count rule (1: off): applied by every client without DP, by the
        server to the noised counts under DP.
    suppressed : dict of str to int
        ``{"classes": client-class pairs the clients dropped by the rule, "samples": rows
        dropped}`` (none under DP; the release's notes name the classes the server dropped).
    privacy : dict or None
        :meth:`~ghofl.privacy.PrivateRelease.to_dict` of a DP run (spent ε and δ, σ per block,
        sensitivities, post-processing notes); with a federated evaluation also
        ``evaluation`` (its noise) and ``epsilon_total``, ``delta_total`` covering the fit and
        the evaluation (:func:`ghofl.server.eval_privacy.charge_evaluation`); ``None`` without
        DP.
    holdout_fraction : float
        Fraction of its samples every client held out (held-out section; 0.0: none).
    transport_dtype : str
        Dtype of the float sums of the plain uploads (``"float64"`` or ``"float32"``).
    feature_transform : str
        Elementwise transform the clients applied before the statistics (``"none"``,
        ``"sqrt"``, ``"x+sqrt"``).
    federated_evaluation : dict or None
        With :attr:`Population.eval_fraction` > 0: ``{"eval_fraction", "clients", "n",
        "aggregation", "protocol", "heads": {NAME: metrics}, "ood"}``, the metrics of
        :func:`ghofl.evaluation.federated.report` of the total of every client's evaluation
        sums on its own held-out rows, aggregated with the plan's protocol (``protocol``: the
        round's report, :func:`ghofl.server.federated_eval.aggregate_evaluation`) and, under
        DP, noised (by the server; under distributed DP in shares by the clients) and charged
        to ``privacy`` (``None`` without).
    predictions : dict of str to ndarray of int64, shape (n_test,)
        Test predictions per head (not part of :meth:`to_dict`).
    """

    heads: dict[str, HeadResult]
    clients: int
    alpha: float
    seed: int
    mode: Mode
    projection_dim: int | None
    projection_seed: int | None
    upload_bytes_per_client: int
    n_train: int
    n_test: int
    num_classes: int
    classes: list[str]
    stage_seconds: dict[str, float]
    client_sizes: list[int]
    aggregation: dict[str, Any] = field(default_factory=dict)
    clip_norm: float | None = None
    n_clipped: int = 0
    min_class_count: int = 1
    suppressed: dict[str, int] = field(default_factory=dict)
    privacy: dict[str, Any] | None = None
    predictions: dict[str, I64] = field(default_factory=dict, repr=False)
    holdout_fraction: float = 0.0
    transport_dtype: str = "float64"
    feature_transform: str = "none"
    federated_evaluation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary: every attribute but ``predictions``, plus ``ghofl_version``.

        ``heads`` maps each head name to ``{"accuracy", "fit_seconds", "predict_seconds",
        "params"}``.
        """
        from ghofl import __version__

        return {
            "heads": {name: r.to_dict() for name, r in self.heads.items()},
            "clients": self.clients,
            "alpha": self.alpha,
            "seed": self.seed,
            "mode": self.mode,
            "projection_dim": self.projection_dim,
            "projection_seed": self.projection_seed,
            "upload_bytes_per_client": self.upload_bytes_per_client,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "num_classes": self.num_classes,
            "classes": list(self.classes),
            "stage_seconds": dict(self.stage_seconds),
            "client_sizes": list(self.client_sizes),
            "clip_norm": self.clip_norm,
            "n_clipped": self.n_clipped,
            "min_class_count": self.min_class_count,
            "suppressed": dict(self.suppressed),
            "privacy": None if self.privacy is None else dict(self.privacy),
            "holdout_fraction": self.holdout_fraction,
            "transport_dtype": self.transport_dtype,
            "feature_transform": self.feature_transform,
            "federated_evaluation": self.federated_evaluation,
            "aggregation": dict(self.aggregation),
            "ghofl_version": __version__,
        }


@dataclass(frozen=True)
class Population:
    """What only a simulation has: how the training set is split into clients.

    Attributes
    ----------
    clients : int
        Number of clients K (Dirichlet partition of the training set).
    alpha : float
        Dirichlet concentration of the label skew.
    min_per_client : int, default 0
        Redraw the partition until every client holds at least this many samples.
    encoder : EncoderInfo, optional
        Encoder fingerprint stored in the payloads.
    eval_fraction : float, default 0.0
        Probability with which every client holds out each of its rows (a hash of the row
        keyed by the server job's seed, :mod:`ghofl.evaluation.split`) and scores the fitted
        heads on them (federated evaluation); its statistics come from the rest. 0.0: no
        federated evaluation.
    """

    clients: int
    alpha: float
    min_per_client: int = 0
    encoder: EncoderInfo | None = None
    eval_fraction: float = 0.0


def _aggregate(plan: FederationPlan, ids: list[str], makers: list[Callable[[], ClientStats]],
               meta: Any, noise_seeds: list[np.random.SeedSequence]
               ) -> tuple[Any, Any, dict[str, IdentityKey]]:
    """The plan's server, its aggregate of the simulated clients and their identity keys.

    Flat or in regions; the identity keys (secure protocol; empty with the plain one) serve
    the federated evaluation round too.
    """
    noise_rng = np.random.default_rng(noise_seeds[-1])
    identities = {cid: IdentityKey.generate() for cid in ids} if plan.secure else {}
    if plan.aggregation.regions is None:
        roster, halves = _client_halves(plan, ids, makers, meta, noise_seeds, identities)
        server = FederationServer(plan, ids, meta, roster=roster)
        out = server.aggregate(InMemoryTransport(halves, plan.aggregation.drops,
                                                 seed=plan.server.seed), noise_rng=noise_rng)
        return server, out, identities
    server = FederationServer(plan, ids, meta)
    return server, _aggregate_regions(server, dict(zip(ids, makers, strict=True)), meta,
                                      noise_rng, identities), identities


def _head_results(fitted: Any, scores: Mapping[str, Any], stages: dict[str, float]
                  ) -> dict[str, HeadResult]:
    """Accuracy, fit and predict seconds and parameters per head; their stages recorded."""
    results: dict[str, HeadResult] = {}
    for name, head in fitted.heads.items():
        stages[f"fit/{name}"] = fitted.fit_seconds[name]
        stages[f"evaluate/{name}"] = scores[name].seconds
        results[name] = HeadResult(accuracy=scores[name].accuracy,
                                   fit_seconds=fitted.fit_seconds[name],
                                   predict_seconds=scores[name].seconds,
                                   params=head.get_params())
    return results


def simulate(plan: FederationPlan, train: tuple[NDArray[Any], NDArray[Any]],
             test: tuple[NDArray[Any], NDArray[Any]], population: Population
             ) -> SimulationResult:
    """Run ``plan`` in process: partition, client statistics, the plan's server, scores.

    Parameters
    ----------
    plan : FederationPlan
        The federation (its server job's seed seeds the partition, the simulated drops and
        the DP noise).
    train, test : pair (x (n, d), y (n,))
        Labelled embeddings.
    population : Population
        The clients to split ``train`` into.

    Returns
    -------
    SimulationResult
    """
    plan = _with_expected_samples(plan, len(train[1]))
    job, server_job, clients_job = plan.client, plan.server, plan.clients_job
    heads = server_job.build_heads(plan.fit_mode)  # checked before work; fitted below
    class_names, c = job.classes, len(job.classes)
    xtr, ytr = check_labelled_embeddings(train[0], train[1], c, "training")
    xte, yte = _check_test(test, c, xtr.shape[1], population.encoder)
    encoder, clients = population.encoder, population.clients

    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    parts = dirichlet_partition(ytr, clients, population.alpha, server_job.seed,
                                min_per_client=population.min_per_client)
    parts, held = _held_out(parts, xtr, ytr, population.eval_fraction, server_job.seed)
    stages["partition"] = time.perf_counter() - t0

    ids = [f"client-{i:0{len(str(max(clients - 1, 1)))}d}" for i in range(clients)]
    client_seconds: list[float] = []

    def stats_of(idx: I64) -> Callable[[], ClientStats]:
        def make() -> ClientStats:  # each client sees only its own rows
            t = time.perf_counter()
            out = client_statistics((xtr[idx], ytr[idx]), clients_job, encoder_info=encoder,
                                    sample_ids=idx)
            out = through_transport(out, job.transport_dtype)  # as the server would read it
            client_seconds.append(time.perf_counter() - t)
            return out
        return make

    info = None if encoder is None else transformed_info(encoder, job.feature_transform)
    meta = job.stats_meta(transformed_dim(xtr.shape[1], job.feature_transform), info)
    xte = apply_feature_transform(xte, job.feature_transform)
    noise_seeds = np.random.SeedSequence([server_job.seed, 0x0D1FF]).spawn(clients + 1)
    makers = [stats_of(idx) for idx in parts]
    server, out, identities = _aggregate(plan, ids, makers, meta, noise_seeds)
    stages["client_stats"] = float(sum(client_seconds))
    stages["client_stats_max"] = max(client_seconds, default=0.0)
    stages["aggregate"] = max(out.seconds - stages["client_stats"], 0.0)

    fitted = server.fit(out.total, test=(xte, yte), heads=heads)
    scores = fitted.scores or {}
    results = _head_results(fitted, scores, stages)
    federated, privacy = _evaluate_if_asked(plan, population, fitted.heads, (xtr, ytr), held,
                                            identities or ids, out, stages)
    return SimulationResult(
        heads=results,
        clients=int(clients),
        alpha=float(population.alpha),
        seed=server_job.seed,
        mode=job.mode,
        projection_dim=job.projection_dim,
        projection_seed=None if job.projection_dim is None else job.projection_seed,
        upload_bytes_per_client=schema_for(job.mode).nbytes(
            c, meta.dim, holdout=meta.has_holdout, float_dtype=job.transport_dtype),
        n_train=int(sum(p.size for p in parts)),
        n_test=int(yte.size),
        num_classes=c,
        classes=list(class_names),
        stage_seconds=stages,
        client_sizes=[int(p.size) for p in parts],
        aggregation={**out.report.to_dict(), **({} if out.hierarchy is None else
                                                {"hierarchy": out.hierarchy.to_dict()})},
        clip_norm=job.clip_norm,
        n_clipped=out.total.n_clipped,
        min_class_count=job.min_class_count,
        suppressed=_suppressed(ytr, parts, c, clients_job.min_class_count),
        privacy=privacy,
        predictions={name: score.predictions for name, score in scores.items()},
        holdout_fraction=job.holdout_fraction,
        transport_dtype=job.transport_dtype,
        feature_transform=job.feature_transform,
        federated_evaluation=federated,
    )


def _evaluate_if_asked(plan: FederationPlan, population: Population, heads: Mapping[str, Any],
                       train: tuple[F64, I64], held: Sequence[I64],
                       clients: Mapping[str, IdentityKey] | Sequence[str],
                       out: Any, stages: dict[str, float]
                       ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The federated evaluation when ``population.eval_fraction`` > 0 (else ``None``).

    Returns the report and the privacy record (the aggregation's, charged for the evaluation
    under DP); records the stage's seconds in ``stages``.
    """
    if population.eval_fraction <= 0:
        return None, out.privacy
    t0 = time.perf_counter()
    federated, privacy = _federated_evaluation(
        heads, apply_feature_transform(train[0], plan.client.feature_transform), train[1],
        held, plan, clients, out.privacy, ood_or_none(out.total))
    federated["eval_fraction"] = population.eval_fraction
    stages["federated_evaluation"] = time.perf_counter() - t0
    return federated, privacy


def _held_out(parts: list[I64], x: F64, y: I64, fraction: float, seed: int
              ) -> tuple[list[I64], list[I64]]:
    """Every client's rows split into (training rows, held-out rows).

    Row by row (:func:`~ghofl.evaluation.split.held_out_mask`, keyed by ``seed``, the rule of
    the Flower nodes): whether a row is held out depends on that row only, never on how many
    rows its client holds; a client may hold out none (it then sends zero sums).
    """
    train, held = [], []
    for idx in parts:
        mask = held_out_mask(x[idx], y[idx], fraction, seed)
        held.append(idx[mask])
        train.append(idx[~mask])
    return train, held


def _federated_evaluation(heads: Mapping[str, Any], x: F64, y: I64, held: Sequence[I64],
                          plan: FederationPlan, clients: Mapping[str, IdentityKey] | Sequence[str],
                          privacy: dict[str, Any] | None, ood: MahalanobisOOD | None = None
                          ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Every client's evaluation sums on its held-out rows, aggregated; their report per head.

    The sums travel with the plan's protocol (:func:`~ghofl.server.federated_eval.
    aggregate_evaluation`: with the secure one, the statistics round's identity keys
    ``clients``, its configuration, policy and simulated drops). Under central DP the server
    noises the total (:func:`~ghofl.server.eval_privacy.release_evaluation`, the fit's noise
    multiplier); under distributed DP the clients add noise shares before masking and the
    server only post-processes; either release is charged to ``privacy`` (returned with
    ``epsilon_total``). The noise (of the shares and of the central release) is drawn from
    the plan's seed, as the simulated statistics round's is: reproducible, which a
    simulation wants, and no secret from whoever knows the plan (a simulation property;
    deployments, :mod:`ghofl.integrations.flower`, draw noise from OS entropy). ``n`` is the
    released total's number of rows (noised under DP). With the
    model's OOD score ``ood``: its threshold calibrated from the total of the clients' score
    histograms (``"ood"``, :func:`federated_ood_report`).
    """
    sums = {cid: local_evaluation(heads, x[idx], y[idx], what="held-out", ood=ood)
            if idx.size else None for cid, idx in zip(clients, held, strict=True)}
    noise = plan.noise_plan()
    shares = noise is not None and privacy is not None and plan.distributed_dp
    if plan.secure:
        assert isinstance(clients, Mapping)
        cfg = plan.secagg_config()
        rnd = aggregate_evaluation(sums, config=cfg, identities=clients,
                                   roster=Roster.from_identities(clients), policy=_policy(cfg),
                                   drops=plan.aggregation.drops, seed=plan.server.seed,
                                   noise_multiplier=noise.noise_multiplier if (
                                       shares and noise is not None) else None,
                                   noise_seed=plan.server.seed)
        how = (f"secure aggregation: {rnd.aggregation['survivors']} of {len(sums)} clients' "
               "evaluation sums in the total")
    else:
        rnd = aggregate_evaluation(sums)
        how = "plain sum in process"
    total = rnd.total
    if rnd.release is not None and privacy is not None:
        privacy = charge_evaluation(privacy, rnd.release)
        how += ", Gaussian noise added in shares by the clients (distributed DP)"
    elif noise is not None and privacy is not None:
        rng = np.random.default_rng(np.random.SeedSequence([plan.server.seed, 0xE7A2]))
        release = release_evaluation(total, noise.noise_multiplier, rng)
        total, privacy = release.sums, charge_evaluation(privacy, release)
        how += ", Gaussian noise added by the server (DP)"
    return {"clients": total.clients, "n": next(iter(total.heads.values())).n,
            "aggregation": how, "protocol": rnd.aggregation,
            "heads": report(total), "ood": federated_ood_report(total, ood)}, privacy


def _with_expected_samples(plan: FederationPlan, n: int) -> FederationPlan:
    """The plan with its DP budget split told the simulated federation's sample count.

    In a simulation the number of training samples is public (the caller chose it); it only
    steers the ``auto`` budget split (:mod:`ghofl.privacy.split`), never the guarantee.
    """
    dp = plan.aggregation.dp
    if dp is None or dp.expected_samples is not None or dp.fractions is not None:
        return plan
    return replace(plan, aggregation=replace(plan.aggregation,
                                             dp=replace(dp, expected_samples=int(n))))


def _client_halves(plan: FederationPlan, ids: Sequence[str],
                   stats: Sequence[Callable[[], ClientStats]], meta: StatsMeta,
                   noise_seeds: Sequence[np.random.SeedSequence],
                   identities: Mapping[str, IdentityKey] | None = None
                   ) -> tuple[Roster | None, list[SecAggClient] | list[PlainClient]]:
    """The federation's roster and the clients' protocol halves.

    With their noise shares under distributed DP. Secure clients get fresh identity keys; their
    policy accepts the plan's own threshold and degree, and they keep no round ledger (the
    simulated clients are the user's, whose data the user holds whole).
    """
    if not plan.secure:
        return None, [PlainClient(cid, make) for cid, make in zip(ids, stats, strict=True)]
    if not identities:
        identities = {cid: IdentityKey.generate() for cid in ids}
    roster = Roster.from_identities(identities)
    policy = _policy(plan.secagg_config())
    noise = plan.noise_plan() if plan.distributed_dp else None
    return roster, [
        SecAggClient(cid, make, meta=meta, encode=None if noise is None else
                     noise_share_encoder(noise, np.random.default_rng(noise_seeds[i])),
                     identity=identities[cid], roster=roster, policy=policy, ledger=None)
        for i, (cid, make) in enumerate(zip(ids, stats, strict=True))]


def _policy(cfg: SecAggConfig) -> ClientPolicy:
    """What the simulated clients accept: the plan's own threshold and degree."""
    return ClientPolicy(corrupt_fraction=cfg.corrupt_fraction,
                        dropout_fraction=cfg.dropout_fraction, sigma=cfg.sigma, eta=cfg.eta,
                        trust_server=cfg.threshold is not None, min_neighbours=cfg.neighbours)


def _aggregate_regions(server: FederationServer, stats: Mapping[str, Callable[[], ClientStats]],
                       meta: StatsMeta, noise_rng: np.random.Generator,
                       identities: Mapping[str, IdentityKey] | None = None) -> Aggregated:
    """The plan's regions, each a secure round in process, then the top round.

    Every client gets a fresh identity key on its region's roster and encodes with the
    federation's codec; a region's clients are built when its round starts, and the plan's
    simulated drops apply in every region (seeded per region).
    """
    plan = server.plan
    cfg, seed = plan.secagg_config(), plan.server.seed
    encode = region_encoder(region_codec(cfg, len(stats)))
    policy = _policy(cfg)
    if not identities:
        identities = {c: IdentityKey.generate() for c in stats}
    rosters = {r.name: Roster.from_identities({c: identities[c] for c in r.clients})
               for r in server.regions}
    index = {r.name: i for i, r in enumerate(server.regions)}

    def transport_for(region: Region) -> InMemoryTransport:
        halves = [SecAggClient(c, stats[c], meta=meta, encode=encode, identity=identities[c],
                               roster=rosters[region.name], policy=policy, ledger=None)
                  for c in region.clients]
        drop_seed = int(np.random.SeedSequence([seed, index[region.name]]).generate_state(1)[0])
        return InMemoryTransport(halves, plan.aggregation.drops, seed=drop_seed)

    return server.aggregate_regions(transport_for, rosters=rosters, top=TopRound(seed=seed),
                                    noise_rng=noise_rng)


def _check_test(test: tuple[NDArray[Any], NDArray[Any]], c: int, d: int,
                encoder: EncoderInfo | None) -> tuple[NDArray[np.float64], I64]:
    xte, yte = check_labelled_embeddings(test[0], test[1], c, "test")
    if xte.shape[1] != d:
        raise InputError(
            f"test embeddings have d={xte.shape[1]} but training embeddings have "
            f"d={d}; embed both with the same encoder"
        )
    if yte.size == 0:
        raise InputError("the test set is empty; accuracy needs at least one test sample")
    if encoder is not None and encoder.dim != d:
        raise InputError(
            f"encoder {encoder.name!r} declares d={encoder.dim} but the embeddings have "
            f"d={d}; pass the EncoderInfo of the encoder that produced them"
        )
    return xte, yte


# ---------------------------------------------------------------------- helpers
def _suppressed(y: I64, parts: Sequence[I64], num_classes: int, k: int) -> dict[str, int]:
    """Client-class pairs (and their rows) the minimum-count rule drops."""
    classes = samples = 0
    for idx in parts:
        counts = np.bincount(y[idx], minlength=num_classes)
        small = (counts > 0) & (counts < k)
        classes += int(small.sum())
        samples += int(counts[small].sum())
    return {"classes": classes, "samples": samples}

