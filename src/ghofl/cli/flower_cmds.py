"""``ghofl flower-run``: a local Flower federation (simulation or deployment) on 127.0.0.1.

Needs the extra: ``pip install 'ghofl[flower]'``. Every process it starts (SuperLink,
SuperNodes, ``flwr run``, Ray) is stopped by PID before it returns.

With ``--secure`` the round is authenticated by default: the command makes a fresh identity key
per node and the roster (``OUT/flower/identities``: ``site-<i>.key`` and ``roster.json``),
gives node ``i`` its key and the roster (node config ``identity-key``, ``roster``; on the
simulation engine through
:data:`~ghofl.integrations.flower.SIM_NODE_CONFIG_ENV`) and the ServerApp the roster (run
config ``roster``). ``--identities DIR`` uses keys made beforehand; ``--insecure-keys`` runs
without any (each node then takes the relayed keys on trust: node config
``insecure-keys=true``, and a warning on stderr). Each node keeps its round ledger in
``OUT/flower/ledgers/node-<i>.json``, fresh for every run (the local nodes' data is the
user's, and is federated again on every run).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from ghofl.cli._options import (
    AggregationOptions,
    EvalFractionOption,
    FederatedEvalOption,
    ServerOptions,
    UploadOptions,
    aggregation_options,
    eval_fraction_of,
    federation,
    field_option,
    server_options,
    upload_options,
)
from ghofl.cli.app import app
from ghofl.cli.io import check_mode
from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, require_extra
from ghofl.server.config import plan_to_config
from ghofl.server.fields import FIELDS, ConfigValue
from ghofl.server.plan import THREAT_MODEL_DEFAULTS, AggregationSpec, FederationPlan

_ClassesOption = Annotated[str | None, field_option(
    "client.classes", help="Class names, comma-separated, or their number C (default: the test "
    "set's classes, else 0..max label).")]
_StatsCacheOption = Annotated[Path | None, typer.Option(
    "--stats-cache", help="Node i keeps its computed statistics in DIR/node-i (node config "
    "stats-cache) and reads them back in later runs over the same data and job.")]
_IdentitiesOption = Annotated[Path | None, typer.Option(
    "--identities", help="Secure: a folder with roster.json and one <client-id>.key per "
    "roster client (ghofl keys new, ghofl roster build); node i holds the i-th client's key "
    "(default: fresh keys and roster in OUT/flower/identities).")]
_InsecureKeysOption = Annotated[bool, typer.Option(
    "--insecure-keys", help="Secure: no identities or roster; every node takes the keys the "
    "server relays on trust (node config insecure-keys=true), which holds only against an "
    "honest server. Prints a warning.")]

#: The line ``--insecure-keys`` prints on stderr.
INSECURE_WARNING = ("WARNING: secure aggregation without a roster (--insecure-keys): every "
                    "relayed key is taken on trust, so the round holds only against an honest "
                    "server and relay; drop --insecure-keys to run with identities")


@app.command("flower-run")
@upload_options(exclude=("client.projection_dim", "client.projection_seed",
                         "client.projection_basis", "client.min_class_count"))
@aggregation_options(exclude=("aggregation.store", "aggregation.drops"))
@server_options()
def flower_run(
    data_template: Annotated[str, typer.Option(
        "--data-template",
        help="Each node's embeddings .npz, with {partition_id}: "
        "'parts/client-{partition_id}.npz'.")],
    out: Annotated[Path, typer.Option(
        "--out", help="Output folder: model/, total.ghs, results.json and the Flower logs.")],
    engine: Annotated[str, typer.Option(
        "--engine", help="'simulation' (Ray, one process) or 'deployment' (SuperLink + "
        "one SuperNode per node).")] = "simulation",
    nodes: Annotated[int, typer.Option("--nodes", help="Number of nodes (clients).")] = 2,
    test: Annotated[Path | None, typer.Option(
        "--test", help="Server-side test NPZ with x, y[, classes]: accuracy per head.")] = None,
    classes: _ClassesOption = None,
    stats_cache: _StatsCacheOption = None,
    *,
    server: ServerOptions,
    aggregation: AggregationOptions,
    upload: UploadOptions,
    stage_timeout: Annotated[float, typer.Option(
        "--stage-timeout", help="Seconds to wait for one stage's replies.")] = 120.0,
    app_dir: Annotated[Path | None, typer.Option(
        "--app", help="Flower app folder (default: examples/flower_app of the sources).")]
        = None,
    identities: _IdentitiesOption = None,
    insecure_keys: _InsecureKeysOption = False,
    federated_eval: FederatedEvalOption = False,
    eval_fraction: EvalFractionOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print results.json.")] = False,
) -> None:
    """Run a local Flower federation of ghofl clients and print the results.

    The clients compute their statistics (with --holdout and --transport-dtype); the server
    aggregates them, with --secure authenticated by default (fresh identities and roster
    unless --identities or --insecure-keys), releases them under --dp-epsilon, and fits the
    heads (with --preset and --param). With --federated-eval every node then scores the model
    on --eval-fraction of its rows (held out from its statistics) and the sums are added with
    the run's protocol (results.json "federated_evaluation", the model card). Exit status 2
    with one line when the run failed (read from results.json).
    """
    require_extra("flwr", "flower")
    from ghofl.integrations.flower.runner import run_local

    if engine not in ("simulation", "deployment"):
        raise ConfigError(f"--engine must be 'simulation' or 'deployment'; got {engine!r}")
    if nodes < 1:
        raise ConfigError(f"--nodes must be at least 1; got {nodes}")
    fraction = eval_fraction_of(federated_eval, eval_fraction)
    server_job, agg = server.job(), aggregation.spec()

    def plan_for(names: tuple[str, ...]) -> FederationPlan:
        return federation(names, upload, agg, server_job, mode=check_mode(upload["mode"]))

    plan_for(("0",))  # the plan's rules first: option errors before class-list errors
    plan = plan_for(tuple(_classes(classes, test)))
    out = out.resolve()
    template = data_template if Path(data_template).is_absolute() else str(
        Path.cwd() / data_template)
    cfg = _run_config(plan)
    cfg.update({"out-dir": str(out), "test-path": str(test.resolve()) if test else "",
                "stage-timeout-s": float(stage_timeout), "data-template": template,
                "federated-eval": fraction})
    if test is None:
        cfg["dim"] = _dim(template)
    node_extra = _node_configs(out / "flower", plan, nodes, cfg, identities=identities,
                               insecure_keys=insecure_keys, stats_cache=stats_cache)
    result = run_local(engine, nodes, cfg, out / "flower", data_template=template,  # type: ignore[arg-type]
                       app_dir=app_dir, node_extra=node_extra)
    _finish(result, as_json, engine, nodes, out)


def _finish(result: dict[str, Any], as_json: bool, engine: str, nodes: int, out: Path) -> None:
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
    if result.get("status") != "ok":
        typer.echo(f"ghofl: error: the Flower run failed: {result.get('error')}", err=True)
        raise typer.Exit(2)
    if not as_json:
        _report(result, engine, nodes, out)


#: Run-config keys always sent; the others only when they differ from the app's defaults (an
#: older app folder, given with --app, lacks them, and Flower refuses keys an app does not
#: declare).
_ALWAYS = tuple(FIELDS[p].key for p in (
    "aggregation.protocol", "client.classes", "client.mode", "client.clip_norm",
    "aggregation.threshold", "server.heads", "server.head_params", "server.seed"))


def _identity_nodes(folder: Path, nodes: int, cfg: dict[str, ConfigValue]
                    ) -> list[dict[str, object]]:
    """Node config of each node from an identities folder (roster.json + keys).

    Adds the roster to the run config ``cfg``.
    """
    from ghofl.secure.identity import IdentityKey, Roster

    roster = Roster.load(folder / "roster.json")
    if len(roster) != nodes:
        raise ConfigError(f"--identities: the roster lists {len(roster)} clients but --nodes is "
                          f"{nodes}; give one node per roster client")
    out: list[dict[str, object]] = []
    for client in roster.clients:
        key = folder / f"{client}.key"
        if IdentityKey.load(key).public != roster.keys[client]:
            raise ConfigError(f"--identities: {key} is not the key the roster lists for "
                              f"{client!r}")
        out.append({"identity-key": str(key.resolve()),
                    "roster": str((folder / "roster.json").resolve())})
    cfg["roster"] = str((folder / "roster.json").resolve())
    return out


def _node_configs(workdir: Path, plan: FederationPlan, nodes: int,
                  cfg: dict[str, ConfigValue], *, identities: Path | None = None,
                  insecure_keys: bool = False, stats_cache: Path | None = None
                  ) -> list[dict[str, object]] | None:
    """Extra node config of each local node (or None); may add ``roster`` to the run config.

    Secure: its identity files (``identities``, else fresh ones in ``workdir/identities``) or
    ``insecure-keys``, and its ledger ``workdir/ledgers/node-<i>.json`` (the folder emptied
    first). Then its own policy and its statistics cache, when asked for.
    """
    nodes_cfg: list[dict[str, object]] = [{} for _ in range(nodes)]
    if not plan.secure and (identities is not None or insecure_keys):
        raise ConfigError("--identities and --insecure-keys apply to --secure only: drop them "
                          "or add --secure")
    if plan.secure:
        from ghofl.integrations.flower.runner import make_identities

        if insecure_keys and identities is not None:
            raise ConfigError("--insecure-keys runs without identities: drop it or "
                              "--identities")
        if insecure_keys:
            typer.echo(INSECURE_WARNING, err=True)
            keys: list[dict[str, object]] = [{"insecure-keys": True}] * nodes
        else:
            if plan.aggregation.regions:
                raise ConfigError(
                    "--regions runs its regional rounds without a roster (regions of "
                    "identity-bound nodes are not built): add --insecure-keys to take the "
                    "relayed keys on trust, or drop --regions for an authenticated flat round")
            folder = identities or make_identities(workdir / "identities", nodes)
            keys = _identity_nodes(folder, nodes, cfg)
        ledgers = workdir / "ledgers"
        shutil.rmtree(ledgers, ignore_errors=True)
        nodes_cfg = [{**keys[i], "ledger": str(ledgers.resolve() / f"node-{i}.json")}
                     for i in range(nodes)]
    policy = _node_policy(plan.aggregation)
    for i, node in enumerate(nodes_cfg):
        node.update(policy)
        if stats_cache is not None:
            node["stats-cache"] = str(stats_cache.resolve() / f"node-{i}")
    return nodes_cfg if any(nodes_cfg) else None


def _node_policy(agg: AggregationSpec) -> dict[str, float]:
    """Node config of the local nodes' own policy: the server's threat model, where not default.

    The local nodes are the user's (as in ``ghofl simulate``), so they hold the same values.
    """
    return {FIELDS[f"aggregation.{name}"].key: float(getattr(agg, name))
            for name, default in THREAT_MODEL_DEFAULTS.items() if getattr(agg, name) != default}


def _run_config(plan: FederationPlan) -> dict[str, ConfigValue]:
    full = plan_to_config(plan)
    base = plan_to_config(FederationPlan(ClientJob(plan.client.classes)))
    return {k: v for k, v in full.items() if k in _ALWAYS or v != base[k]}


def _report(result: dict[str, Any], engine: str, nodes: int, out: Path) -> None:
    typer.echo(f"flower {engine}: {len(result['survivors'])} of {nodes} nodes in the sum, "
               f"dropped {result['dropped'] or 'none'}, excluded "
               f"{result['excluded'] or 'none'}; wall {result['wall_s']:.1f} s")
    for stage, secs in result.get("stage_seconds", {}).items():
        sent = result.get("bytes", {}).get(stage, {})
        typer.echo(f"  {stage:9s} {secs:7.2f} s  server sent {sent.get('server_sent', 0)} B"
                   f", received {sent.get('server_received', 0)} B")
    for name, acc in result.get("accuracy", {}).items():
        typer.echo(f"  {name:10s} accuracy {acc:.4f}")
    typer.echo(f"model: {out / 'model'}")


def _classes(spec: str | None, test: Path | None) -> list[str]:
    if spec:
        text = spec.strip()
        if text.isdigit():
            return [str(i) for i in range(int(text))]
        return [c.strip() for c in text.split(",")]
    if test is None:
        raise ConfigError("give --classes (names or their number) or a --test set to read them")
    from ghofl.data.embeddings import load_embeddings

    emb = load_embeddings(test, "--test")
    if emb.classes is not None:
        return list(emb.classes)
    return [str(i) for i in range(int(emb.y.max()) + 1)]


def _dim(template: str) -> int:
    from ghofl.data.embeddings import load_embeddings

    return int(load_embeddings(Path(template.format(partition_id=0)), "--data-template")
               .x.shape[1])
