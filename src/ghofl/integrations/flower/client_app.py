"""The Flower ClientApp of ghofl: answers one protocol request per QUERY message.

Each message may reach a fresh process (deployment engine), so the client half of the secure
protocol is rebuilt from ``context.state`` (a ConfigRecord written by
:meth:`~ghofl.secure.SecAggClient.to_state`) for every request and saved back after it.
The statistics are computed only when they are due (the ``mask`` stage of the secure protocol,
``input`` of the plain one) by :func:`ghofl.client.job.client_statistics`, from

* the node config key ``data-path`` (deployment: ``flower-supernode --node-config
  "data-path=/data/site.npz"``), or else
* the run config key ``data-template`` formatted with the node's ``partition-id``
  (simulation: ``"parts/client-{partition_id}.npz"``),

running the client half of the run's :class:`~ghofl.server.plan.FederationPlan`
(:func:`~ghofl.server.config.plan_from_config` of the run config, the plan the ServerApp runs):
the job :attr:`~ghofl.server.plan.FederationPlan.clients_job` (its ``holdout_fraction``,
``holdout_seed`` and ``transport_dtype`` included: the plain protocol's statistics then travel
with float32 sums), under distributed DP the noise shares of the plan's
:meth:`~ghofl.server.plan.FederationPlan.noise_plan`, and with regions the federation's
fixed-point codec of its :meth:`~ghofl.server.plan.FederationPlan.secagg_config`. The plan and
its noise plan are built once per run in each ClientApp process and kept for the run's later
messages that process handles (:func:`run_setup`: all of them on the simulation engine; on the
deployment engine each message may start a fresh process, which then builds them once).
With the node config key ``stats-cache`` (a folder
on the node's own disk) the statistics are computed once per data file and job and read back
in later rounds and runs (:mod:`ghofl.client.stats_cache`). Each reply also carries the node's
``partition-id``, the seconds it took and, at the stage that computed statistics, whether they
came from the cache (``stats-cached``) (ConfigRecord ``ghofl-client``); with the run config
key ``client-timings`` also where the message's time went on the node: process start, imports,
decoding, work, encoding (:mod:`ghofl.integrations.flower.timing`).

Identity (secure protocol): with the node config keys ``identity-key`` (the node's private
key file, ``ghofl keys new``) and ``roster`` (the federation's roster file, ``ghofl roster
build``), the node's client id is its roster id, it answers the server's identity request
(binding its Flower node id to that id with a signature) and it verifies every relayed key and
the consistency check against its roster. A node without them refuses every secure round,
naming both fixes, unless its node config says ``insecure-keys=true``: it then takes part
unauthenticated (its id is ``node-<Flower node id>``), takes relayed keys on trust (which holds
only against an honest-but-curious server and relay) and prints a warning saying so. The node's
own threat model, what it accepts from any server, is read from the node config keys
``corrupt_fraction``, ``dropout_fraction``, ``exposure_bits`` and ``abort_bits`` (defaults 1/3,
1/3, 40, 20; never from the run config, which is the server's): it refuses a round laxer than
they need.

Ledger (secure protocol): the node keeps the rounds its data entered in a round ledger
(:class:`~ghofl.secure.RoundLedger`), by default the file ``.ghofl-ledger-<name>.json`` next to
its data file (:func:`node_ledger`: ``<name>`` is its roster id, else ``partition-<partition
id>``); the node config key ``ledger`` names another file, or ``ledger="none"`` keeps none. The
node refuses a round id it has seen and a second round over the same data unless
``allow-repeat-rounds=true``: for the evaluation stage, a second round over the same held-out
rows, whatever the model scored or the noise share (the ledger records the digest of the
rows, :mod:`ghofl.integrations.flower.eval_node`). Every entry records the plan's (ε, δ)
(:meth:`RunSetup.privacy_cost`; 0 without DP).

Simulation: the simulation engine gives its nodes only ``partition-id`` and ``num-partitions``.
When the environment variable :data:`SIM_NODE_CONFIG_ENV` names a JSON file mapping partition
ids to node config keys (``{"0": {"identity-key": ..., "roster": ...}, ...}``), each node adds
its entry to its node config (:func:`effective_node_config`); ``ghofl flower-run`` writes it
for its simulated nodes. The variable is the node side's (the environment of the processes that
run the nodes), never the server's run config.

Evaluation stage (run config key ``federated-eval``,
:mod:`ghofl.integrations.flower.evaluation`): the node's statistics come from the rows it does
not hold out; the model message is answered by scoring the model on the held-out rows
(:func:`~ghofl.integrations.flower.eval_node.answer_model`), and the secure vector round that
follows (recognised by its advertised vector description) masks those sums.

A request the client refuses (out of order, other statistics, unreadable data, a run config
that is no valid plan) is answered with the reason instead of a protocol reply.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

#: Start of the ClientApp module's imports of ghofl (timed for the run config key
#: ``client-timings``, :mod:`ghofl.integrations.flower.timing`).
_LOAD_T0 = time.perf_counter()

from ghofl.errors import require_extra  # noqa: E402

require_extra("flwr", "flower")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402

from ghofl.data.cache_dir import safe_name  # noqa: E402
from ghofl.errors import ConfigError, GhoflError, ProtocolError  # noqa: E402
from ghofl.integrations.flower import (  # noqa: E402
    QUERY_ACTION,
    SIM_NODE_CONFIG_ENV,
    TIMINGS_KEY,
)
from ghofl.integrations.flower._config import job_meta, node_policy  # noqa: E402
from ghofl.integrations.flower._eval_keys import (  # noqa: E402
    MODEL_RECORD,
    eval_fraction,
    is_vector_meta,
)
from ghofl.integrations.flower.records import (  # noqa: E402
    message_from_record,
    message_to_record,
)
from ghofl.integrations.flower.timing import (  # noqa: E402
    DECODE,
    ENCODE,
    MessageClock,
    timings_requested,
)
from ghofl.integrations.flower.transport import CLIENT_INFO  # noqa: E402
from ghofl.privacy import NoisePlan, noise_share_encoder  # noqa: E402
from ghofl.secure import (  # noqa: E402
    ClientPolicy,
    IdentityKey,
    PlainClient,
    Roster,
    RoundLedger,
    SecAggClient,
)
from ghofl.secure.binding import answer_hello  # noqa: E402
from ghofl.secure.messages import (  # noqa: E402
    AdvertiseRequest,
    HelloRequest,
    PlainRequest,
    ServerMessage,
)
from ghofl.server.config import plan_from_config  # noqa: E402
from ghofl.stats.client_stats import ClientStats  # noqa: E402

#: Seconds the imports above took when this process loaded the module.
_LOAD_S = time.perf_counter() - _LOAD_T0

if TYPE_CHECKING:
    from ghofl.client.job import ClientJob
    from ghofl.secure.client import PayloadEncoder
    from ghofl.secure.config import SecAggConfig
    from ghofl.server.plan import FederationPlan

__all__ = ["INSECURE_KEYS_KEY", "LEDGER_KEY", "NO_ROSTER_WARNING", "SIM_NODE_CONFIG_ENV",
           "STATE_KEY", "STATS_CACHE_KEY", "NodeIdentity", "RunSetup", "app",
           "effective_node_config", "handle_query", "node_ledger", "run_setup"]

#: Key of the secure client's saved state in ``context.state``.
STATE_KEY = "ghofl-secagg"
#: Node config key of the node's statistics cache folder (see the module docstring).
STATS_CACHE_KEY = "stats-cache"
#: Node config key that lets a node without a roster take part, keys on trust.
INSECURE_KEYS_KEY = "insecure-keys"
#: Node config key of the node's round ledger file (``"none"``: no ledger).
LEDGER_KEY = "ledger"
#: The line a node without a roster prints when it takes part (``insecure-keys=true``).
NO_ROSTER_WARNING = (
    "WARNING: secure aggregation without a roster: every relayed key is taken on trust "
    "(node config insecure-keys=true), so the round holds only against an honest server and "
    "relay; give the node 'identity-key' and 'roster' to check them")
_NO_ROSTER = (
    "this node has no roster, so it cannot check the keys the server relays (a relay or a "
    "lying server could substitute them and read this node's statistics): give it the node "
    "config keys 'identity-key' and 'roster' (ghofl keys new, ghofl roster build; the server "
    "then needs the run config key 'roster'), or set the node config key 'insecure-keys=true' "
    "to take the relayed keys on trust")

app = ClientApp()


@app.query(QUERY_ACTION)
def query(msg: Message, context: Context) -> Message:
    """Answer one ghofl protocol request."""
    return Message(handle_query(msg.content, context), reply_to=msg)


def handle_query(content: RecordDict, context: Context) -> RecordDict:
    """Decode the request in ``content``, let the client half answer it, encode the reply.

    The reply's ``ghofl-client`` record holds the node's partition id and the handler's
    seconds; with the run config key ``client-timings`` also where the message's time went
    (:mod:`~ghofl.integrations.flower.timing`).
    """
    t0 = time.perf_counter()
    run_cfg = dict(context.run_config)
    clock = MessageClock(run_cfg.get(TIMINGS_KEY) is True, _LOAD_S, t0)
    part = context.node_config.get("partition-id", -1)
    partition = int(part) if isinstance(part, int) and not isinstance(part, bool) else -1
    info: dict[str, Any] = {"partition-id": partition}
    try:
        with clock.running():
            rd = _answer(content, context, run_cfg, info, clock)
    except (GhoflError, OSError) as exc:
        rd = RecordDict()
        info["refused"] = str(exc) or type(exc).__name__
    info["seconds"] = time.perf_counter() - t0
    info.update(clock.fields())
    rd[CLIENT_INFO] = ConfigRecord(info)
    return rd


def _answer(content: RecordDict, context: Context, run_cfg: dict[str, Any],
            info: dict[str, Any], clock: MessageClock) -> RecordDict:
    """The reply's records (:func:`handle_query`), decoding and encoding timed by ``clock``."""
    timings_requested(run_cfg, TIMINGS_KEY)
    node_cfg = effective_node_config(context.node_config)
    me = NodeIdentity.from_node_config(node_cfg, context.node_id)
    if MODEL_RECORD in content:  # the evaluation stage's model (flower.evaluation)
        from ghofl.integrations.flower.eval_node import answer_model  # the model's modules

        setup = run_setup(context.run_id, run_cfg)
        return answer_model(content, context, setup, data_source(node_cfg, run_cfg))
    with clock.phase(DECODE):
        request = message_from_record(content, ServerMessage)
    assert isinstance(request, ServerMessage)
    if isinstance(request, HelloRequest):
        hello = me.hello(request)
        with clock.phase(ENCODE):
            return message_to_record(hello)
    setup = run_setup(context.run_id, run_cfg)
    source = data_source(node_cfg, run_cfg)
    stats = _lazy(source, setup, node_cfg.get(STATS_CACHE_KEY), info)
    if isinstance(request, PlainRequest):
        reply = PlainClient(me.client_id, stats).handle(request)
    else:
        me.require_keys(request)
        client = _secure_client(me, request, context, source, stats, setup,
                                node_ledger(node_cfg, me, source))
        try:
            reply = client.handle(request)
        finally:
            context.state[STATE_KEY] = ConfigRecord(client.to_state())  # type: ignore[arg-type]
    with clock.phase(ENCODE):
        return message_to_record(reply, transport_dtype=setup.job.transport_dtype)


class NodeIdentity:
    """What a node is, from its node config: client id, identity key, roster, policy.

    Parameters
    ----------
    client_id : str
    identity : IdentityKey or None
    roster : Roster or None
    address : str
        The node's transport address (``node-<Flower node id>``).
    policy : ClientPolicy, optional
        What the node accepts (default :class:`~ghofl.secure.ClientPolicy`).
    insecure_keys : bool, default False
        The node config key ``insecure-keys``: without a roster, take part with relayed keys
        taken on trust (else the node refuses every secure round).
    partition : int or None
        The node's ``partition-id`` (names its default ledger when it has no roster).
    """

    def __init__(self, client_id: str, identity: IdentityKey | None, roster: Roster | None,
                 address: str, policy: ClientPolicy | None = None, *,
                 insecure_keys: bool = False, partition: int | None = None) -> None:
        self.client_id, self.identity, self.roster = client_id, identity, roster
        self.address, self.partition = address, partition
        self.insecure_keys = insecure_keys and roster is None
        self.policy = policy or ClientPolicy(allow_unauthenticated=self.insecure_keys)

    @classmethod
    def from_node_config(cls, node_cfg: Mapping[str, Any], node_id: int) -> NodeIdentity:
        """Read ``identity-key``, ``roster``, ``insecure-keys`` and the policy.

        The policy keys are :data:`~ghofl.integrations.flower._config.POLICY_KEYS`
        (:func:`~ghofl.integrations.flower._config.node_policy`).

        Raises
        ------
        ConfigError
            Only one of ``identity-key`` and ``roster``, or ``insecure-keys=true`` beside a
            roster, or ``insecure-keys`` not a boolean.
        ProtocolError
            The identity key is not on the roster.
        """
        address = f"node-{node_id}"
        key_path, roster_path = node_cfg.get("identity-key"), node_cfg.get("roster")
        if bool(key_path) != bool(roster_path):
            raise ConfigError(
                "give this node both 'identity-key' and 'roster' in its node config (or "
                "neither and 'insecure-keys=true', for an unauthenticated node)"
            )
        insecure = _insecure_keys(node_cfg)
        if insecure and roster_path:
            raise ConfigError(
                "this node has a roster and 'insecure-keys=true': remove 'insecure-keys' from "
                "its node config (a node with a roster checks every relayed key)"
            )
        identity = IdentityKey.load(str(key_path)) if key_path else None
        roster = Roster.load(str(roster_path)) if roster_path else None
        client_id = address
        if identity is not None and roster is not None:
            found = next((c for c, k in roster.keys.items() if k == identity.public), None)
            if found is None:
                raise ProtocolError(
                    "this node's identity key is not on its roster; rebuild the roster with "
                    "this node's public key"
                )
            client_id = found
        part = node_cfg.get("partition-id")
        return cls(client_id, identity, roster, address,
                   node_policy(node_cfg, roster is not None, insecure_keys=insecure),
                   insecure_keys=insecure,
                   partition=part if isinstance(part, int) and not isinstance(part, bool)
                   else None)

    def hello(self, request: HelloRequest) -> Any:
        """Answer the server's identity request."""
        if self.identity is None or self.roster is None:
            raise ProtocolError(
                "the server asked for this node's identity, but the node has no "
                "'identity-key' and 'roster' in its node config: give it both (ghofl keys "
                "new, ghofl roster build)"
            )
        return answer_hello(request, self.identity, self.roster, self.address)

    def require_keys(self, request: ServerMessage) -> None:
        """Refuse a secure round without a roster unless ``insecure-keys``; else warn once.

        The warning (:data:`NO_ROSTER_WARNING`, on stderr) is printed at the round's first
        stage.

        Raises
        ------
        ProtocolError
            The node has no roster and its node config does not say ``insecure-keys=true``.
        """
        if self.roster is not None:
            return
        if not self.insecure_keys:
            raise ProtocolError(_NO_ROSTER)
        if isinstance(request, AdvertiseRequest):
            print(NO_ROSTER_WARNING, file=sys.stderr, flush=True)


def _insecure_keys(node_cfg: Mapping[str, Any]) -> bool:
    value = node_cfg.get(INSECURE_KEYS_KEY, False)
    if not isinstance(value, bool):
        raise ConfigError(f"node config key 'insecure-keys' must be true or false; got "
                          f"{value!r}: fix it in this SuperNode's --node-config")
    return value


def node_ledger(node_cfg: Mapping[str, Any], me: NodeIdentity,
                source: Path) -> RoundLedger | None:
    """The node's round ledger: node config ``ledger``, else a file beside its data.

    The default file is ``.ghofl-ledger-<name>.json`` in the folder of the node's data file
    ``source``, where ``<name>`` is the node's roster id, else ``partition-<partition id>``,
    else its transport address (made file-safe): stable across restarts of the node, and one
    per node even when nodes share a data folder. ``ledger="none"`` keeps no ledger;
    ``allow-repeat-rounds=true`` lets the same data enter more than one round.

    Raises
    ------
    ConfigError
        ``ledger`` or ``allow-repeat-rounds`` is of the wrong type, or the default ledger's
        folder is not writable.
    """
    value = node_cfg.get(LEDGER_KEY, "")
    repeat = node_cfg.get("allow-repeat-rounds", False)
    if not isinstance(value, str):
        raise ConfigError(f"node config key 'ledger' must be a file path or \"none\"; got "
                          f"{value!r}: fix it in this SuperNode's --node-config")
    if not isinstance(repeat, bool):
        raise ConfigError(f"node config key 'allow-repeat-rounds' must be true or false; got "
                          f"{repeat!r}: fix it in this SuperNode's --node-config")
    if value.strip().lower() == "none":
        return None
    if value:
        return RoundLedger(value, allow_repeat=repeat)
    name = (me.client_id if me.roster is not None else
            f"partition-{me.partition}" if me.partition is not None else me.address)
    folder = source.resolve().parent
    if not os.access(folder, os.W_OK):
        raise ConfigError(
            f"this node's round ledger goes beside its data by default, but {folder} is not "
            "writable: give the node config key 'ledger' a writable file path (or "
            "ledger=\"none\" to keep no ledger)")
    return RoundLedger(folder / f".ghofl-ledger-{safe_name(name)}.json", allow_repeat=repeat)


def effective_node_config(node_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The node config, with this node's entry of the :data:`SIM_NODE_CONFIG_ENV` file added.

    Keys the node config already holds are kept. Without the variable: the node config as is.

    Raises
    ------
    ConfigError
        The file named by the variable is unreadable or not a JSON object of objects.
    """
    out = dict(node_cfg)
    path = os.environ.get(SIM_NODE_CONFIG_ENV)
    if not path:
        return out
    try:
        table = json.loads(Path(path).read_text())
        extra = table.get(str(out.get("partition-id")), {})
        if not isinstance(extra, dict):
            raise ValueError("an entry is not an object")
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(
            f"{SIM_NODE_CONFIG_ENV}={path}: not a readable JSON object of node configs by "
            f"partition id ({exc}); fix the file or unset the variable") from exc
    return {**extra, **out}


def data_source(node_cfg: Mapping[str, Any], run_cfg: Mapping[str, Any]) -> Path:
    """The node's data: node config ``data-path``, else run config ``data-template``."""
    path = node_cfg.get("data-path")
    if isinstance(path, str) and path:
        return Path(path)
    template = run_cfg.get("data-template")
    part = node_cfg.get("partition-id")
    if not isinstance(template, str) or not template or part is None:
        raise ProtocolError(
            "this node has no data: give it the node config key 'data-path', or give the run "
            "the config key 'data-template' (e.g. 'parts/client-{partition_id}.npz') and the "
            "node a 'partition-id'"
        )
    return Path(template.format(partition_id=part))


def _lazy(source: Path, setup: RunSetup, cache: object, info: dict[str, Any]
          ) -> Callable[[], ClientStats]:
    """The statistics, computed (or read from the node's cache) only when called.

    With the run's evaluation stage, of the node's training part only (never cached: the
    cache is keyed by the whole file).
    """
    def make() -> ClientStats:
        from ghofl.client.stats_cache import cached_statistics

        if eval_fraction(setup.run_config) > 0.0:  # the evaluation stage's modules, then only
            from ghofl.integrations.flower.eval_node import node_statistics

            part = node_statistics(source, setup, setup.run_config)
            if part is not None:
                info["stats-cached"] = False
                return part
        stats, info["stats-cached"] = cached_statistics(
            source, setup.job, str(cache) if isinstance(cache, str) and cache else None)
        return stats
    return make


def _secure_client(me: NodeIdentity, request: ServerMessage, context: Context, source: Path,
                   stats: Callable[[], ClientStats], setup: RunSetup,
                   ledger: RoundLedger | None) -> SecAggClient:
    encode = setup.encoder()
    client_id = me.client_id
    kw: dict[str, Any] = {"identity": me.identity, "roster": me.roster, "policy": me.policy,
                          "ledger": ledger, "allow_unauthenticated": me.insecure_keys,
                          "privacy_cost": setup.privacy_cost()}
    if isinstance(request, AdvertiseRequest):  # a new round: forget any earlier one
        if is_vector_meta(request.meta):  # the evaluation stage's vector round
            from ghofl.integrations.flower.eval_node import round_payload

            return SecAggClient(client_id, round_payload(context, setup, request.meta,
                                                         request.params), **kw)
        return SecAggClient(client_id, stats, meta=job_meta(setup.job, _input_dim(source)),
                            encode=encode, **kw)
    saved = context.state.get(STATE_KEY)
    if not isinstance(saved, ConfigRecord):
        raise ProtocolError(
            f"client {client_id!r} received a {request.stage} request but holds no state of "
            "this round (it missed the advertise stage)"
        )
    if is_vector_meta(str(saved.get("meta", ""))):
        from ghofl.integrations.flower.eval_node import saved_payload

        return SecAggClient.from_state(dict(saved), saved_payload(context), **kw)
    return SecAggClient.from_state(dict(saved), stats, encode=encode, **kw)


#: The run config key of the federation's size (read by the ServerApp too), which sizes every
#: region's codec in a run with regions.
FEDERATION_SIZE_KEY = "expected-nodes"


@dataclass(frozen=True)
class RunSetup:
    """The client half of one run's plan, built once per run (:func:`run_setup`).

    Attributes
    ----------
    plan : FederationPlan
        :func:`~ghofl.server.config.plan_from_config` of the run config.
    job : ClientJob
        The job the node runs, ``plan.clients_job`` (under DP without the minimum-count
        rule, which the server applies to the noised counts).
    secagg : SecAggConfig or None
        ``plan.secagg_config()`` (secure plans; ``None`` for the plain sum).
    noise : NoisePlan or None
        ``plan.noise_plan()`` under distributed DP (the noise shares' plan), else ``None``.
    federation_size : int or None
        With regions: the federation's size (the run config key :data:`FEDERATION_SIZE_KEY`),
        the K of every region's fixed-point codec; ``None`` for one flat round.
    run_config : dict
        The run config itself (its evaluation stage key,
        :data:`~ghofl.integrations.flower.evaluation.EVAL_KEY`).
    """

    plan: FederationPlan
    job: ClientJob
    secagg: SecAggConfig | None
    noise: NoisePlan | None
    federation_size: int | None
    run_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_run_config(cls, run_cfg: Mapping[str, Any]) -> RunSetup:
        """Build the plan of ``run_cfg`` and its client half.

        Raises
        ------
        ConfigError
            The run config is no valid plan (the message names its keys).
        ProtocolError
            The plan has regions but the run config no federation size.
        """
        plan = plan_from_config(run_cfg)
        size = None
        if plan.aggregation.regions is not None:
            size = run_cfg.get(FEDERATION_SIZE_KEY)
            if not isinstance(size, int) or isinstance(size, bool) or size < 2:
                raise ProtocolError(
                    f"a run with regions must give the run config key {FEDERATION_SIZE_KEY!r} "
                    "(the federation's size, which sizes every region's codec)")
        return cls(plan, plan.clients_job, plan.secagg_config() if plan.secure else None,
                   plan.noise_plan() if plan.distributed_dp else None, size, dict(run_cfg))

    def privacy_cost(self) -> tuple[float, float]:
        """(ε, δ) one round spends on the node's data, for its ledger: the plan's DP budget.

        The statistics release and the evaluation release (the same noise multiplier) each
        spend at most the plan's (ε, δ); (0, 0) without DP.
        """
        dp = self.plan.aggregation.dp
        return (0.0, 0.0) if dp is None else (float(dp.epsilon), float(dp.delta))

    def encoder(self) -> PayloadEncoder | None:
        """The secure client's payload encoder for one round (``None``: the default codec).

        Distributed DP: the masked input carries a noise share of :attr:`noise`, drawn from
        OS entropy when it is due. Regions: the federation's codec
        (:func:`~ghofl.secure.hierarchy.region_encoder` of :attr:`secagg` and
        :attr:`federation_size`), so the regional sums add up to the flat round's words; the
        node refuses a regional round whose public parameters differ from the plan's.
        """
        if self.noise is not None:
            return noise_share_encoder(self.noise, np.random.default_rng())
        if self.federation_size is not None and self.secagg is not None:
            from ghofl.secure.hierarchy import region_codec, region_encoder

            return region_encoder(region_codec(self.secagg, self.federation_size))
        return None


#: Runs whose setup this process keeps (a long-lived ClientApp process may serve many runs).
_KEPT_RUNS = 8
_RUNS: dict[tuple[int, str], RunSetup] = {}


def run_setup(run_id: int, run_cfg: Mapping[str, Any]) -> RunSetup:
    """The :class:`RunSetup` of run ``run_id``: built on its first message, then kept.

    Every later message of the run reaching this process reuses it, so the plan is checked
    and its noise plan calibrated once per run and process, not once per stage (a deployment
    that starts a process per message builds it once in each). The key holds the run
    config as well as the run id (a run id names one run config; the key stays right where
    one is reused). The :data:`_KEPT_RUNS` most recent runs are kept; a setup that fails is
    not.

    Raises
    ------
    ConfigError, ProtocolError
        As :meth:`RunSetup.from_run_config`.
    """
    key = (int(run_id), json.dumps(dict(run_cfg), sort_keys=True, default=str))
    setup = _RUNS.get(key)
    if setup is None:
        setup = _RUNS[key] = RunSetup.from_run_config(run_cfg)
        while len(_RUNS) > _KEPT_RUNS:
            del _RUNS[next(iter(_RUNS))]
    return setup


def _input_dim(source: Path) -> int | None:
    """Dimension of an embeddings archive (None for raw data).

    Read from the header of its ``x`` array, without loading the data; an archive whose header
    cannot be read that way is loaded (and validated) whole.
    """
    if source.suffix.lower() != ".npz":
        return None
    shape = npz_shape(source, "x")
    if shape is not None and len(shape) == 2:
        return int(shape[1])
    from ghofl.data.embeddings import load_embeddings

    return int(load_embeddings(source, "data-path").x.shape[1])


def npz_shape(path: Path, name: str) -> tuple[int, ...] | None:
    """Shape of the array ``name`` of an ``.npz`` archive, from its header only.

    None when the archive has no such member or its header is not a plain ``.npy`` one.
    """
    import zipfile

    from numpy.lib import format as npy

    try:
        with zipfile.ZipFile(path) as zf, zf.open(f"{name}.npy") as f:
            read = (npy.read_array_header_1_0 if npy.read_magic(f) == (1, 0)
                    else npy.read_array_header_2_0)
            shape, _, _ = read(f)
    except (KeyError, OSError, ValueError, zipfile.BadZipFile):
        return None
    return tuple(int(n) for n in shape)
