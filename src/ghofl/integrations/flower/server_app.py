"""The Flower ServerApp of ghofl: wait for the nodes, aggregate, fit, save, score.

Run config keys (see ``examples/flower_app/pyproject.toml`` for the documented defaults):

* the plan (:func:`~ghofl.server.config.plan_from_config`): every key of
  :data:`~ghofl.server.fields.FIELDS` (``docs/file-formats.md``), spelt with underscores (a
  hyphenated spelling such as ``dp-epsilon`` is refused). ``protocol``: ``"plain"`` (the
  default) or ``"secure"``; the secure round: ``threshold`` (0 = the default), ``neighbours``
  (0 = default), ``max_samples``, ``limbs``, the threat model it is sized for
  (``corrupt_fraction``, ``dropout_fraction``, ``exposure_bits``, ``abort_bits``; each node
  accepts only rounds at least as strict as its own node config keys of the same names ask);
  its clipping bound is the client job's ``clip_norm``; the
  :class:`~ghofl.client.job.ClientJob` keys (``classes``, ``mode``, ``clip_norm``,
  ``holdout_fraction``, ``holdout_seed``, ``transport_dtype``, ...; float32 transport only
  with the plain protocol) and the :class:`~ghofl.server.job.ServerJob` keys (``heads``,
  ``head_params``, ``seed``, ``preset``, ...);
* differential privacy: ``dp_epsilon`` (0 = none), ``dp_delta``, ``dp_mode`` (``central``:
  the server noises the total; ``distributed``: every client adds a noise share, needs the
  secure protocol), ``dp_split``, ``dp_expected_samples``, ``dp_subspace``, ``dp_prior`` and
  ``min_class_count`` (0 = 5 with DP, a threshold on the noised counts at the server; else
  off); the spent (ε, δ) is recorded in the model directory's manifest (``privacy``) and in
  ``results.json``;
* ``roster`` (secure protocol): the federation's roster file (``ghofl roster build``); the
  server first binds every node to its roster identity (a signed answer to a fresh
  challenge; it waits up to ``wait-timeout-s`` for every connected node to answer, since this
  is each node's first message and may meet a cold start), then runs the round over the
  roster's ids with every signature checked. ``ghofl flower-run --secure`` generates the
  identities and sets it. ``""`` (the default) runs an unauthenticated round over
  ``node-<id>`` clients and prints a warning: every node refuses it, naming the fixes, unless
  its node config says ``insecure-keys=true``;
* ``dim``: embedding dimension (0 = from the test set or the encoder);
* ``federated-eval``: after the fit, every node scores the model on a held-out fraction of
  its rows (its statistics then come from the rest) and the total of their evaluation sums
  is aggregated with the run's protocol (:mod:`ghofl.integrations.flower.evaluation`):
  ``results.json`` then holds ``federated_evaluation`` and the model card its metrics; when
  the model has an OOD score, the nodes' histograms of their held-out rows' scores set its
  threshold (calibration ``"federated"``, ``federated_evaluation.ood``);
* ``expected-nodes``, ``wait-timeout-s``, ``stage-timeout-s``;
* ``client-timings`` (``false`` by default): every node's reply carries where its time went
  (:mod:`ghofl.integrations.flower.timing`), and ``results.json`` holds them as
  ``client_timings`` (stage -> client -> seconds by field);
* ``out-dir`` (required): receives ``model/`` (the model directory, written atomically),
  ``total.ghs`` (the aggregate the heads were fitted from) and ``results.json``;
  ``test-path``: an optional ``.npz`` test set scored on the server.

``results.json`` is written atomically: ``status: "ok"`` with the accuracy per head, per-stage
seconds (``stage_seconds``; ``server_seconds`` the server's own work within them: encoding,
decoding, adding the replies) and bytes, survivors, dropped and excluded clients (with each
node's partition id), or ``status: "failed"`` with the error and the nodes' refusals, if any
(then the ServerApp raises). ``flwr run --stream`` exits 0 even when the ServerApp raised:
read ``results.json``.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ghofl.errors import require_extra

require_extra("flwr", "flower")

from flwr.app import Context  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from ghofl.client.job import ClientJob  # noqa: E402
from ghofl.client.transforms import apply_feature_transform  # noqa: E402
from ghofl.data.embeddings import align_labels, load_embeddings  # noqa: E402
from ghofl.errors import ConfigError, GhoflError  # noqa: E402
from ghofl.files import write_json_atomic  # noqa: E402
from ghofl.integrations.flower import TIMINGS_KEY  # noqa: E402
from ghofl.integrations.flower._config import job_meta  # noqa: E402
from ghofl.integrations.flower.evaluation import eval_fraction  # noqa: E402
from ghofl.integrations.flower.timing import timings_requested  # noqa: E402
from ghofl.integrations.flower.transport import FlowerTransport  # noqa: E402
from ghofl.secure.binding import bind_addresses, hello_request  # noqa: E402
from ghofl.secure.hierarchy import Region, TopRound  # noqa: E402
from ghofl.secure.identity import Roster  # noqa: E402
from ghofl.server.config import cfg_float, cfg_int, cfg_str, plan_from_config  # noqa: E402
from ghofl.server.run import Aggregated, FederationServer  # noqa: E402
from ghofl.stats.codec import save_stats  # noqa: E402

__all__ = ["NO_ROSTER_WARNING", "RESULTS", "TOTAL", "app", "run_federation", "wait_for_nodes"]

RESULTS = "results.json"
#: The aggregate (sum of the survivors' statistics), what ``ghofl fit`` takes.
TOTAL = "total.ghs"

#: The line the ServerApp prints when it runs a secure round without a roster.
NO_ROSTER_WARNING = (
    "WARNING: secure aggregation without a roster (run config key 'roster' is empty): every "
    "relayed key is taken on trust, and each node refuses the round unless its node config "
    "says insecure-keys=true; give the run a roster (ghofl roster build) and each node its "
    "identity-key and roster")

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of ``flwr run``: see the module docstring."""
    cfg = dict(context.run_config)
    out_dir = Path(cfg_str(cfg, "out-dir") or "ghofl-flower-out")
    state: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        summary = run_federation(grid, cfg, out_dir, state)
    except BaseException as exc:
        failed = {"status": "failed",
                  "error": f"{type(exc).__name__}: {exc}{_refusals(state)}",
                  "seconds": time.perf_counter() - t0, **state,
                  "traceback": traceback.format_exc(limit=8)}
        write_json_atomic(out_dir / RESULTS, failed, default=str)
        raise
    summary["seconds"] = time.perf_counter() - t0
    write_json_atomic(out_dir / RESULTS, summary, default=str)


def wait_for_nodes(grid: Any, expected: int, timeout_s: float, poll_s: float = 0.5
                   ) -> list[int]:
    """Poll ``grid.get_node_ids()`` until ``expected`` nodes are connected; return them.

    All connected nodes, sorted.

    Raises
    ------
    ConfigError
        Fewer nodes connected within ``timeout_s`` seconds.
    """
    if expected < 1:
        raise ConfigError(f"expected-nodes must be at least 1; got {expected}")
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"only {len(nodes)} of the {expected} expected Flower nodes connected within "
                f"{timeout_s:g} s (wait-timeout-s); start the missing SuperNodes or lower "
                "expected-nodes"
            )
        time.sleep(poll_s)


def run_federation(grid: Any, cfg: Mapping[str, Any], out_dir: Path,
                   state: dict[str, Any]) -> dict[str, Any]:
    """The whole server side; fills ``state`` as it goes (for the failure report).

    Raises
    ------
    ConfigError
        Among others: the run config key ``client-timings`` is no boolean (checked before
        any node is asked, which would each refuse every message).
    """
    timings_requested(cfg, TIMINGS_KEY)
    plan = plan_from_config(cfg)
    if plan.aggregation.dp is not None:  # a named public file refused before any node is asked
        plan.aggregation.dp.check_public_files()
    protocol = plan.aggregation.protocol
    state["protocol"] = protocol
    test = _load_test(cfg_str(cfg, "test-path"), plan.client)
    dim = cfg_int(cfg, "dim") or (None if test is None else int(test[0].shape[1]))
    meta = job_meta(plan.client, dim)

    t_wait = time.perf_counter()
    nodes = wait_for_nodes(grid, cfg_int(cfg, "expected-nodes", 2),
                           cfg_float(cfg, "wait-timeout-s", 120.0))
    state["wait_seconds"] = time.perf_counter() - t_wait
    ids = {f"node-{n}": n for n in nodes}
    timeout = cfg_float(cfg, "stage-timeout-s", 60.0)
    roster = Roster.load(cfg_str(cfg, "roster")) if cfg_str(cfg, "roster") else None
    if protocol == "secure":
        state["authenticated"] = roster is not None
    if roster is not None:
        if protocol != "secure":
            raise ConfigError("the run config key 'roster' applies to the secure protocol only")
        ids = _bind(grid, ids, roster, max(timeout, cfg_float(cfg, "wait-timeout-s", 120.0)),
                    state)
    elif protocol == "secure":
        print(NO_ROSTER_WARNING, file=sys.stderr, flush=True)
    state["nodes"] = {c: {"node_id": n} for c, n in ids.items()}
    if plan.aggregation.store:
        state["store"] = plan.aggregation.store
    transports: list[FlowerTransport] = []
    clients = list(roster.clients) if roster is not None else list(ids)
    server = FederationServer(plan, clients, meta, roster=roster,
                              store_id=lambda c: _store_id(c, transports[0]))
    try:
        out = _aggregate(server, grid, ids, timeout, transports, cfg, roster)
    finally:
        _record_rounds(state, transports, getattr(server, "half", None))  # no half: regions
    report = out.report
    if server.store_head is not None:  # evidence against a rolled-back store (verify --expect)
        state.update(store_head=server.store_head.digest,
                     store_contributions=server.store_head.count)
    agg = report.to_dict()
    if out.hierarchy is not None:
        state.update(hierarchy=out.hierarchy.to_dict(), dropped=dict(report.dropped),
                     excluded=dict(report.excluded))
    state.update(survivors=agg["survivor_ids"], aggregation=agg,
                 bytes={s: {"server_sent": r.server_sent_bytes,
                            "server_received": r.server_received_bytes}
                        for s, r in report.stages.items()})
    total = out.total
    extra: dict[str, Any] = {"source": f"flower ({protocol} protocol, {len(ids)} nodes)",
                             "aggregation": {"protocol": agg["protocol"],
                                             "clients": agg["survivors"],
                                             "threshold": agg["params"].get("threshold")}}
    if out.privacy is not None:
        extra["privacy"] = state["privacy"] = out.privacy
    save_stats(total, out_dir / TOTAL)
    t_fit = time.perf_counter()
    result = server.fit(total, out_dir=out_dir / "model", test=test, extra=extra)
    state["fit_seconds"] = time.perf_counter() - t_fit
    if eval_fraction(cfg) > 0:
        _evaluate(grid, plan, out_dir / "model", ids, roster, timeout, eval_fraction(cfg),
                  state)
    server_summary = result.to_dict()
    accuracy = {name: h["accuracy"] for name, h in server_summary["heads"].items()
                if "accuracy" in h}
    return {"status": "ok", **state, "accuracy": accuracy, "server": server_summary,
            "n_samples": total.n_samples, "n_clipped": total.n_clipped}


def _record_rounds(state: dict[str, Any], transports: list[FlowerTransport], half: Any) -> None:
    """Record the rounds' traffic into ``state``.

    Each node's partition id, the seconds per stage, the nodes' timings (run config
    ``client-timings``; with the identity exchange's), the dropped, excluded and failing
    clients.
    """
    stage_seconds: dict[str, float] = {}
    server_seconds: dict[str, float] = {}
    timings: dict[str, dict[str, dict[str, float]]] = state.get("client_timings", {})
    for transport in transports:
        for c, part in transport.partitions.items():
            state["nodes"][c]["partition_id"] = part
        for stage, secs in transport.stage_seconds.items():
            stage_seconds[stage] = stage_seconds.get(stage, 0.0) + secs
        for stage, secs in transport.server_seconds.items():
            server_seconds[stage] = server_seconds.get(stage, 0.0) + secs
        for stage, by_client in transport.client_timings.items():
            timings.setdefault(stage, {}).update(by_client)
    if timings:
        state["client_timings"] = timings
    state.update(
        stage_seconds=stage_seconds,
        server_seconds=server_seconds,
        dropped=dict(half.dropped) if half else {},
        excluded=dict(half.excluded) if half else {},
        problems={c: w for t in transports for c, w in t.problems.items()},
    )


def _evaluate(grid: Any, plan: Any, model_dir: Path, ids: Mapping[str, int],
              roster: Roster | None, timeout: float, fraction: float,
              state: dict[str, Any]) -> None:
    """The evaluation stage (:mod:`ghofl.integrations.flower.evaluation`), into ``state``.

    Its report goes to ``state["federated_evaluation"]`` (``results.json``), the privacy
    report charged with it to ``state["privacy"]``, and the metrics to the model card. A
    failed stage leaves the fitted model as it is: ``federated_evaluation`` then holds
    ``status: "failed"`` and the error.
    """
    from ghofl.integrations.flower.eval_server import run_evaluation
    from ghofl.model.card import CARD_FILE
    from ghofl.model.card_update import evaluation_entry, record_evaluation

    try:
        fed, privacy = run_evaluation(grid, plan, model_dir, ids, roster, timeout, fraction,
                                      state.get("privacy"))
    except GhoflError as exc:
        state["federated_evaluation"] = {"status": "failed",
                                         "error": f"{type(exc).__name__}: {exc}"}
        return
    fed["status"] = "ok"
    total = fed.pop("total")
    state["federated_evaluation"] = fed
    if privacy is not None:
        state["privacy"] = privacy
    if (model_dir / CARD_FILE).is_file():
        record_evaluation(model_dir, evaluation_entry("flower federated evaluation",
                                                      "federated", total))
        fed["card"] = str(model_dir / CARD_FILE)


def _aggregate(server: FederationServer, grid: Any, ids: Mapping[str, int], timeout: float,
               transports: list[FlowerTransport], cfg: Mapping[str, Any],
               roster: Roster | None) -> Aggregated:
    """The secure or plain round(s): flat, or one per region and the top round.

    With regions each region's round runs over that region's own nodes, and the top round among
    the regional aggregators runs here in the ServerApp.

    ``transports`` receives each round's transport as it starts (for the failure report).
    Central DP noise comes from OS entropy.
    """
    if not server.regions:
        transports.append(FlowerTransport(grid, dict(ids), timeout))
        return server.aggregate(transports[0])
    if roster is not None:
        raise ConfigError(
            "regions with identity-bound nodes (run config key 'roster') are not built: each "
            "region would need its own roster; run the regions unauthenticated or flat"
        )
    expected = cfg_int(cfg, "expected-nodes", 2)
    if len(ids) != expected:
        raise ConfigError(
            f"with regions every node encodes with the codec of the whole federation, sized "
            f"by the run config key 'expected-nodes' = {expected}, but {len(ids)} nodes are "
            "connected; set 'expected-nodes' to the number of nodes"
        )

    def transport_for(region: Region) -> FlowerTransport:
        transports.append(FlowerTransport(grid, {c: ids[c] for c in region.clients}, timeout))
        return transports[-1]

    return server.aggregate_regions(transport_for, top=TopRound())


def _bind(grid: Any, ids: dict[str, int], roster: Roster, timeout: float,
          state: dict[str, Any]) -> dict[str, int]:
    """Roster id → Flower node id, from every node's signed answer to one identity request.

    The identity request is each node's first message of the run: its answer may wait for the
    node's cold start (Flower's SuperExec picking up the task, a fresh ClientApp process
    installing the app and importing ghofl, on a loaded machine). So the exchange ends when
    every connected node has answered (or Flower reports it gone), and only ``timeout``
    (``wait-timeout-s`` when longer than the stage timeout) bounds it; it is not a stage of the
    round, whose replies then come from warm nodes. Nodes that answer badly (or not at all)
    are left out and listed in ``state``.
    """
    request = hello_request(roster)
    transport = FlowerTransport(grid, ids, timeout)
    bound, problems = bind_addresses(request, transport.exchange("hello", dict.fromkeys(
        ids, request)), roster)
    problems.update({a: why for a, why in transport.problems.items() if a not in problems})
    state["identity_problems"] = problems
    state["identity_seconds"] = transport.stage_seconds.get("hello", 0.0)
    if transport.client_timings:
        state["client_timings"] = dict(transport.client_timings)
    state["unbound"] = sorted(set(roster.clients) - set(bound))
    return {name: ids[address] for name, address in bound.items()}


def _refusals(state: Mapping[str, Any]) -> str:
    """The nodes' distinct refusals of a failed run (three at most), for its error line.

    From the identity exchange and the round's stages; "" when no node refused.
    """
    reasons: dict[str, list[str]] = {}
    for key in ("identity_problems", "problems"):
        for client, why in dict(state.get(key) or {}).items():
            _, _, text = str(why).partition("refused: ")
            if text:
                reasons.setdefault(text, []).append(client)
    return "".join(f"; {', '.join(sorted(c))} refused: {why}"
                   for why, c in list(reasons.items())[:3])


def _store_id(client: str, transport: FlowerTransport) -> str:
    """The store's id of a node's contribution.

    Its partition id when it reported one (stable across runs, so re-running is
    idempotent), else its Flower node id.
    """
    part = transport.partitions.get(client)
    return f"partition-{part}" if part is not None else client


def _load_test(path: str, job: ClientJob) -> tuple[Any, Any] | None:
    if not path:
        return None
    emb = load_embeddings(Path(path), "test-path")
    labels = align_labels(emb.y, emb.classes, job.classes, f"'{path}'")
    # the heads score what the clients summed: the job's transform of the embeddings
    return apply_feature_transform(emb.x, job.feature_transform), labels
