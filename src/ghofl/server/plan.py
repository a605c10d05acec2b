"""The federation as one value: what the clients compute, how it is added, what is fitted.

A :class:`FederationPlan` holds the :class:`~ghofl.client.job.ClientJob` (what every client
computes), an :class:`AggregationSpec` (plain or secure sum, its settings, differential privacy,
the durable store, simulated drops) and the :class:`~ghofl.server.job.ServerJob` (which heads,
with which hyperparameters: the only place a preset is merged). Every rule that ties options
of different parts together is checked here, once, when the plan is built; its error, a
:class:`PlanError`, names the field, and each front end renders it in its own vocabulary
(:mod:`ghofl.server.fields`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, FieldError
from ghofl.errors import FieldNames as Naming
from ghofl.secure.config import SecAggConfig
from ghofl.secure.levels import MAX_NOISE_LEVELS
from ghofl.server.fields import FIELDS, part_fields

if TYPE_CHECKING:
    from ghofl.privacy import DPConfig, NoisePlan
    from ghofl.server.job import ServerJob
    from ghofl.stats.meta import Mode

__all__ = [
    "PROTOCOLS",
    "THREAT_MODEL_DEFAULTS",
    "AggregationSpec",
    "FederationPlan",
    "PlanError",
    "check_transport_dtype",
    "default_min_class_count",
]

Protocol = Literal["plain", "secure"]
Estimate = Literal["sum", "fedcof"]
PROTOCOLS: tuple[str, ...] = ("plain", "secure")


#: A broken rule of the plan (a :class:`~ghofl.errors.FieldError` naming the field).
PlanError = FieldError


# ---------------------------------------------------------------------- the rules
def check_transport_dtype(transport_dtype: str, protocol: str) -> None:
    """float32 transport is for plain uploads: the secure protocol sends fixed-point words."""
    if transport_dtype != "float64" and protocol == "secure":
        raise PlanError("client.transport_dtype", lambda n: (
            f"{n.name('client.transport_dtype')} {transport_dtype!r} applies to plain "
            "uploads; secure aggregation sends its own fixed-point encoding of the float64 "
            "sums, so " + n.reset((("client.transport_dtype", "float64"),
                                   ("aggregation.protocol", "plain")))))


def _check_clip(client: ClientJob, agg: AggregationSpec) -> None:
    """The secure sum's fixed-point range and DP's sensitivity both need a clipping bound."""
    if client.clip_norm is not None:
        return
    if agg.protocol == "secure":
        raise PlanError("client.clip_norm", lambda n: (
            f"{n.setting('aggregation.protocol', 'secure')} needs {n.ask('client.clip_norm')}"
            ": the fixed-point encoding of the secure sum needs a per-sample clipping bound"))
    if agg.dp is not None:
        raise PlanError("client.clip_norm", lambda n: (
            f"{n.name('aggregation.dp_epsilon')} needs {n.ask('client.clip_norm')}: "
            "without a per-sample clipping bound one sample can change the statistics "
            "without limit, and the sensitivity of the statistics depends on it"))


def _check_holdout(client: ClientJob, agg: AggregationSpec) -> None:
    if client.holdout_fraction > 0 and agg.dp is not None:
        raise PlanError("client.holdout_fraction", lambda n: (
            "differential privacy does not support a held-out section (held-out samples "
            "would count twice in the sensitivity); " + n.reset(
                (("client.holdout_fraction", 0.0), ("aggregation.dp_epsilon", 0.0)))))


def _check_distributed(agg: AggregationSpec) -> None:
    if agg.dp is not None and agg.dp.mode == "distributed" and agg.protocol != "secure":
        raise PlanError("aggregation.dp_mode", lambda n: (
            f"{n.setting('aggregation.dp_mode', 'distributed')} adds each client's noise "
            "share before secure aggregation, so it needs "
            f"{n.setting('aggregation.protocol', 'secure')}; add it, or use "
            f"{n.setting('aggregation.dp_mode', 'central')}"))


def _check_secure_only(agg: AggregationSpec) -> None:
    """Every secure-only field of :data:`~ghofl.server.fields.FIELDS` at its default."""
    if agg.protocol == "secure":
        return
    for spec in part_fields("aggregation"):
        if spec.secure_only and getattr(agg, spec.name) != spec.default:
            raise PlanError(spec.path, _secure_only_text(spec.path))


#: The threat model of the secure round (γ, δ, σ, η), by AggregationSpec field: its default.
THREAT_MODEL_DEFAULTS: Mapping[str, float] = {
    name: FIELDS[f"aggregation.{name}"].default
    for name in ("corrupt_fraction", "dropout_fraction", "sigma", "eta")}


def _check_threat_model(agg: AggregationSpec) -> None:
    """γ and δ in [0, 1) with γ + δ < 1; σ and η finite and > 0."""
    for name in THREAT_MODEL_DEFAULTS:
        path, value = f"aggregation.{name}", getattr(agg, name)
        fraction = name.endswith("fraction")
        number = (isinstance(value, int | float) and not isinstance(value, bool)
                  and math.isfinite(value))
        if not number or (not 0 <= value < 1 if fraction else value <= 0):
            raise PlanError(path, _threat_text(path, value, fraction))
    gamma, delta = agg.corrupt_fraction, agg.dropout_fraction
    if gamma + delta >= 1:
        raise PlanError("aggregation.dropout_fraction", lambda n: (
            f"{n.name('aggregation.corrupt_fraction')} + "
            f"{n.name('aggregation.dropout_fraction')} must be below 1 (some honest client "
            f"must be expected to survive); got {gamma:g} + {delta:g}: lower either"))


def _threat_text(path: str, value: object, fraction: bool) -> Callable[[Naming], str]:
    def text(n: Naming) -> str:
        if fraction:
            return (f"{n.name(path)} must be a fraction of the clients in [0, 1) (e.g. 0.2); "
                    f"got {value!r}")
        return (f"{n.name(path)} must be a number of bits > 0 (the target probability is "
                f"2^-bits; e.g. 40); got {value!r}")
    return text


def _check_regions(agg: AggregationSpec) -> None:
    if agg.regions is None:
        return
    if agg.regions < 2:
        raise PlanError("aggregation.regions", lambda n: (
            f"{n.name('aggregation.regions')} must be at least 2 (the top round adds the sums "
            f"of 2 or more regions); got {agg.regions}: leave it unset for one flat round"))
    if agg.dp is not None and agg.dp.mode == "distributed":
        raise PlanError("aggregation.regions", lambda n: (
            f"{n.name('aggregation.regions')} does not support "
            f"{n.setting('aggregation.dp_mode', 'distributed')} (the noise shares are sized "
            "for one flat round); use "
            f"{n.setting('aggregation.dp_mode', 'central')}, or leave regions unset"))


def _check_estimate(agg: AggregationSpec) -> None:
    """FedCOF's estimate reads each client's own upload: plain protocol, no DP, no store."""
    if agg.estimate == "sum":
        return
    if agg.estimate != "fedcof":
        raise PlanError("aggregation.estimate", lambda n: (
            f"{n.name('aggregation.estimate')} must be 'sum' or 'fedcof'; got "
            f"{agg.estimate!r}"))
    fedcof = "aggregation.estimate", "fedcof"
    if agg.protocol == "secure":
        raise PlanError("aggregation.estimate", lambda n: (
            f"{n.setting(*fedcof)} needs each client's own class means, which secure "
            "aggregation hides by design (the server learns only their sum); "
            + n.reset((("aggregation.estimate", "sum"), ("aggregation.protocol", "plain")))))
    if agg.dp is not None:
        raise PlanError("aggregation.estimate", lambda n: (
            f"{n.setting(*fedcof)} reads each client's own class means, which differential "
            "privacy does not cover (it noises only the total); "
            + n.reset((("aggregation.estimate", "sum"), ("aggregation.dp_epsilon", 0.0)))))
    if agg.store:
        raise PlanError("aggregation.estimate", lambda n: (
            f"{n.setting(*fedcof)} is computed from the payloads of one round, while "
            f"{n.name('aggregation.store')} holds the total of every round; "
            + n.reset((("aggregation.estimate", "sum"), ("aggregation.store", "")))))


def _secure_only_text(path: str) -> Callable[[Naming], str]:
    def text(n: Naming) -> str:
        return (f"{n.name(path)} only applies to the secure protocol; add "
                f"{n.setting('aggregation.protocol', 'secure')}")
    return text


def unused_blocks(mode: str, heads: tuple[str, ...]) -> tuple[str, ...]:
    """Blocks of ``mode`` that none of ``heads`` reads (the DP budget split skips them).

    Only the per-class diagonal ``sq_sums`` of ``pooled`` can be unused: every head whose
    ``min_mode`` fits ``gram`` (counts, sums and B) ignores it.
    """
    from ghofl.heads.registry import head_class
    from ghofl.stats.schema import mode_supports

    if mode != "pooled" or not heads or "all" in heads:
        return ()
    if all(mode_supports("gram", head_class(h).min_mode) for h in heads):
        return ("sq_sums",)
    return ()


def default_min_class_count(dp: DPConfig | None) -> int:
    """K of the minimum-count rule when the user gives none.

    :data:`~ghofl.privacy.DEFAULT_MIN_CLASS_COUNT` under DP (a threshold on the noised counts
    at the server), else the :class:`~ghofl.client.job.ClientJob` default (1: off).
    """
    from ghofl.privacy import DEFAULT_MIN_CLASS_COUNT

    if dp is not None:
        return DEFAULT_MIN_CLASS_COUNT
    return int(ClientJob.__dataclass_fields__["min_class_count"].default)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the values
@dataclass(frozen=True)
class AggregationSpec:
    """How the clients' statistics are added and released.

    Every default is that of :data:`~ghofl.server.fields.FIELDS` (``docs/file-formats.md``).

    Attributes
    ----------
    protocol : {"plain", "secure"}
        The one-stage plain sum, or the secure protocol (the server learns only the sum).
    threshold, neighbours : int or None
        Secure: fewest clients that must remain, neighbours per client on the SecAgg+ graph
        (``None``: the defaults of :class:`~ghofl.secure.SecAggConfig`).
    max_samples : int
        Secure: public maximum samples per client.
    limbs : {1, 2}
        Secure: 64-bit words per float statistic.
    corrupt_fraction, dropout_fraction : float
        Secure: γ and δ, the fractions of corrupt (colluding with the server) and dropped
        clients the round is sized for: 0 <= γ, δ < 1 and γ + δ < 1. γ also sets the default
        threshold (:func:`~ghofl.secure.config.consistency_threshold`).
    sigma, eta : float
        Secure: the targets, exposure <= 2^-σ and abort <= 2^-η per honest client per round
        (the graph degree and share threshold are sized by
        :func:`~ghofl.secure.graph_params.required_parameters`).
    dp : DPConfig or None
        Differential privacy of the release (``None``: none).
    store : str
        Path of a durable store that records every accepted contribution (plain protocol).
    drops : mapping of str to int
        Simulated drops: clients that vanish per stage (in-process transport only; with
        regions, in every region).
    regions : int or None
        Secure, in process: split the clients into this many public regions, each running
        the secure protocol, then one secure round over the regional sums
        (:mod:`ghofl.secure.hierarchy`); ``None``: one flat round.
    estimate : {"sum", "fedcof"}
        What the heads are fitted from: the total, or FedCOF's estimate of the second moments
        from each client's class means and counts (:mod:`ghofl.moments.fedcof`; plain
        protocol without DP or store).
    """

    protocol: Protocol = field(default=FIELDS["aggregation.protocol"].default)
    threshold: int | None = field(default=FIELDS["aggregation.threshold"].default)
    neighbours: int | None = field(default=FIELDS["aggregation.neighbours"].default)
    max_samples: int = field(default=FIELDS["aggregation.max_samples"].default)
    limbs: int = field(default=FIELDS["aggregation.limbs"].default)
    corrupt_fraction: float = field(default=FIELDS["aggregation.corrupt_fraction"].default)
    dropout_fraction: float = field(default=FIELDS["aggregation.dropout_fraction"].default)
    sigma: float = field(default=FIELDS["aggregation.sigma"].default)
    eta: float = field(default=FIELDS["aggregation.eta"].default)
    dp: DPConfig | None = None
    store: str = field(default=FIELDS["aggregation.store"].default)
    drops: Mapping[str, int] = field(
        default_factory=lambda: dict(FIELDS["aggregation.drops"].default))
    regions: int | None = field(default=FIELDS["aggregation.regions"].default)
    estimate: Estimate = field(default=FIELDS["aggregation.estimate"].default)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise PlanError("aggregation.protocol", lambda n: (
                f"{n.name('aggregation.protocol')} must be 'secure' or 'plain'; got "
                f"{self.protocol!r}"))
        object.__setattr__(self, "drops", dict(self.drops))
        _check_threat_model(self)
        _check_secure_only(self)
        _check_distributed(self)
        _check_regions(self)
        _check_estimate(self)
        if self.store and self.protocol == "secure":
            raise PlanError("aggregation.store", lambda n: (
                f"{n.name('aggregation.store')} records each client's contribution, which "
                "the secure protocol never shows the server; "
                + n.reset((("aggregation.store", ""), ("aggregation.protocol", "plain")))))

    def secagg_config(self, clip_norm: float) -> SecAggConfig:
        """The secure round's public parameters for clipping bound ``clip_norm``."""
        return SecAggConfig(clip_norm=clip_norm, threshold=self.threshold,
                            neighbours=self.neighbours, max_samples=self.max_samples,
                            limbs=self.limbs, corrupt_fraction=self.corrupt_fraction,
                            dropout_fraction=self.dropout_fraction, sigma=self.sigma,
                            eta=self.eta, noise_levels=MAX_NOISE_LEVELS if (
                                self.dp is not None and self.dp.mode == "distributed") else 0)


@dataclass(frozen=True)
class FederationPlan:
    """One federation, declared: checked as a whole when built.

    Attributes
    ----------
    client : ClientJob
    aggregation : AggregationSpec
    server : ServerJob

    Raises
    ------
    PlanError
        A rule tying parts together is broken (float32 transport with the secure protocol,
        secure or DP without a clipping bound, a held-out section under DP, distributed DP
        without the secure protocol, secure-only settings with the plain sum, a threat model
        out of range: γ or δ outside [0, 1), γ + δ >= 1, σ or η not > 0).
    ConfigError
        The secure round's parameters are invalid.
    UnsupportedModeError
        A head needs a richer upload mode than the clients compute.
    """

    client: ClientJob
    aggregation: AggregationSpec = field(default_factory=AggregationSpec)
    server: ServerJob = field(default_factory=lambda: _default_server())

    def __post_init__(self) -> None:
        agg = self.aggregation
        check_transport_dtype(self.client.transport_dtype, agg.protocol)
        _check_clip(self.client, agg)
        _check_holdout(self.client, agg)
        if agg.protocol == "secure":
            assert self.client.clip_norm is not None
            agg.secagg_config(self.client.clip_norm)
        from ghofl.heads.build import check_heads_mode

        check_heads_mode(self.server.heads, self.client.mode,  # before any client works
                         estimate=agg.estimate)
        self.noise_plan()  # calibrate once: a budget it cannot meet fails here

    @property
    def secure(self) -> bool:
        """Whether the plan aggregates with the secure protocol."""
        return self.aggregation.protocol == "secure"

    @property
    def fit_mode(self) -> Mode:
        """The mode of what the heads are fitted from: the upload mode, or that of the estimate.

        FedCOF's estimate (``aggregation.estimate = "fedcof"``) is built in mode ``pooled``,
        or ``full`` when a head needs it (:func:`~ghofl.heads.build.estimate_mode`).
        """
        from ghofl.heads.build import estimate_mode

        return estimate_mode(self.server.heads, self.client.mode, self.aggregation.estimate)

    @property
    def distributed_dp(self) -> bool:
        """Whether the clients add the DP noise in shares (distributed DP)."""
        dp = self.aggregation.dp
        return dp is not None and dp.mode == "distributed"

    @property
    def clients_job(self) -> ClientJob:
        """The job every client runs: :attr:`client`, without the minimum-count rule under DP.

        Under DP the rule's k is a threshold the server applies to the noised counts
        (post-processing, free of privacy cost); a client-side rule would let one sample
        release a class of k and multiply the sensitivity by k.
        """
        if self.aggregation.dp is None or self.client.min_class_count == 1:
            return self.client
        return replace(self.client, min_class_count=1)

    def secagg_config(self) -> SecAggConfig:
        """The secure round's parameters (the plan's clipping bound; secure plans only)."""
        if not self.secure or self.client.clip_norm is None:
            raise ConfigError("secagg_config() is for plans with the secure protocol")
        return self.aggregation.secagg_config(self.client.clip_norm)

    def noise_plan(self) -> NoisePlan | None:
        """The calibrated Gaussian mechanism (``None`` without DP), calibrated once per plan."""
        return self._noise_plan

    @functools.cached_property
    def _noise_plan(self) -> NoisePlan | None:
        dp = self.aggregation.dp
        if dp is None:
            return None
        from ghofl.privacy import plan_noise

        return plan_noise(dp, self.client.mode, self.client.clip_norm,
                          self.client.min_class_count, len(self.client.classes),
                          self.client.projection_dim, unused_blocks(self.client.mode,
                                                                    self.server.heads))

    def describe(self) -> dict[str, Any]:
        """JSON-ready summary of the plan: every field of :data:`~ghofl.server.fields.FIELDS`.

        ``{"client": {name: value}, "aggregation": {...}, "server": {...}}``, each value as the
        plan holds it (tuples as lists; ``None``: derived or unset, e.g. ``dp_epsilon``
        without DP).
        """
        out: dict[str, dict[str, Any]] = {"client": {}, "aggregation": {}, "server": {}}
        for spec in FIELDS.values():
            out[spec.part][spec.name] = _jsonable(spec.value(self))
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def _default_server() -> ServerJob:
    """``ServerJob()`` (the table's heads), importing ghofl.server.job on first use.

    So a client reading the plan's constants does not load the server's modules.
    """
    from ghofl.server.job import ServerJob

    return ServerJob()
