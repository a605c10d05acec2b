"""ghofl's Flower ClientApp runs the client half of the run config's plan, built once per run.

Whole secure rounds are driven in process through the ClientApp handler
(:func:`~ghofl.integrations.flower.client_app.handle_query`), each node with its own Flower
``Context`` (node config, state) of one run id, against the plan's own server
(:class:`~ghofl.server.run.FederationServer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from flwr.app import Context, RecordDict

import ghofl.privacy
from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, ProtocolError
from ghofl.integrations.flower import client_app
from ghofl.integrations.flower._config import job_meta
from ghofl.integrations.flower.client_app import (
    FEDERATION_SIZE_KEY,
    handle_query,
    run_setup,
)
from ghofl.integrations.flower.records import message_from_record, message_to_record
from ghofl.integrations.flower.transport import CLIENT_INFO
from ghofl.privacy import DPConfig
from ghofl.secure import InMemoryTransport
from ghofl.secure.messages import ClientMessage, ServerMessage
from ghofl.server.config import plan_from_config, plan_to_config
from ghofl.server.fields import FIELDS
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.run import FederationServer
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import sum_stats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import write_npz

CLIP = 6.0
CLASSES = ("0", "1", "2")
NODES = 4
DIM = 4


def _run_config(mode: str, **agg: Any) -> dict[str, Any]:
    """A secure run config with DP in ``mode``; ``min_class_count`` 0 (the default: 5 under DP)."""
    plan = FederationPlan(ClientJob(CLASSES, clip_norm=CLIP),
                          AggregationSpec("secure", dp=DPConfig(4.0, 1e-5, mode), **agg),  # type: ignore[arg-type]
                          ServerJob(("nb",)))
    return {**plan_to_config(plan), FIELDS["client.min_class_count"].key: 0}


def _node_data(folder: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each node's rows; node 0 holds only 2 samples of class 2 (under DP's default k = 5)."""
    folder.mkdir(parents=True, exist_ok=True)
    x, y = gaussian_mixture(0, 3, DIM, n=160)
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    out = []
    for i in range(NODES):
        rows = np.arange(i, 160, NODES)
        if i == 0:
            rows = np.concatenate([rows[y[rows] != 2], rows[y[rows] == 2][:2]])
        write_npz(folder / f"node-{i}.npz", x[rows], y[rows])
        out.append((x[rows], y[rows]))
    return out


class _Node:
    """One node answering through the ClientApp handler, with its own context."""

    def __init__(self, i: int, run_id: int, folder: Path, run_cfg: dict[str, Any]) -> None:
        self.client_id = f"node-{i}"
        node_cfg = {"data-path": str(folder / f"node-{i}.npz"), "partition-id": i,
                    "insecure-keys": True, "ledger": "none"}
        self.context = Context(run_id, i, node_cfg, RecordDict(), run_cfg)  # type: ignore[arg-type]
        self.messages = 0

    def handle(self, request: ServerMessage) -> ClientMessage:
        self.messages += 1
        reply = handle_query(message_to_record(request), self.context)
        refused = reply[CLIENT_INFO].get("refused")
        if refused is not None:
            raise ProtocolError(str(refused))
        message = message_from_record(reply, ClientMessage)
        assert isinstance(message, ClientMessage)
        return message


def _server(run_cfg: dict[str, Any]) -> FederationServer:
    """The server of the run config's plan, for :data:`NODES` nodes."""
    plan = plan_from_config(run_cfg)
    return FederationServer(plan, [f"node-{i}" for i in range(NODES)],
                            job_meta(plan.clients_job, DIM))


def _round(server: FederationServer, folder: Path, run_id: int,
           run_cfg: dict[str, Any]) -> tuple[Any, list[_Node]]:
    """One secure round of ``server`` over :data:`NODES` nodes of run ``run_id``."""
    nodes = [_Node(i, run_id, folder, run_cfg) for i in range(NODES)]
    return server.aggregate(InMemoryTransport(nodes), noise_rng=np.random.default_rng(0)), nodes


def test_one_run_builds_its_plan_and_calibrates_its_noise_once_over_every_stage_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distributed-DP round: every stage message of every node of the run reuses the setup
    its first message built (one plan, one noise calibration); a second run builds its own."""
    _node_data(tmp_path)
    cfg = _run_config("distributed")
    servers = [_server(cfg), _server(cfg)]  # the server's own plans are not counted
    monkeypatch.setattr(client_app, "_RUNS", {})
    calls = {"plan": 0, "noise": 0}
    calibrate, build = ghofl.privacy.plan_noise, plan_from_config

    def counted_noise(*args: Any, **kw: Any) -> Any:
        calls["noise"] += 1
        return calibrate(*args, **kw)

    def counted_build(run_cfg: Any) -> FederationPlan:
        calls["plan"] += 1
        return build(run_cfg)

    monkeypatch.setattr(ghofl.privacy, "plan_noise", counted_noise)
    monkeypatch.setattr(client_app, "plan_from_config", counted_build)

    result, nodes = _round(servers[0], tmp_path, 11, cfg)
    assert sorted(result.report.survivors) == [n.client_id for n in nodes]
    assert all(n.messages >= 5 for n in nodes)  # advertise ... unmask: one setup for them all
    assert calls == {"plan": 1, "noise": 1}
    assert result.privacy is not None and result.privacy["dp_mode"] == "distributed"

    _round(servers[1], tmp_path, 12, cfg)  # another run id: its own setup, once
    assert calls == {"plan": 2, "noise": 2}


def test_the_node_runs_the_plans_clients_job(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Under central DP the plan's rule is k = 5, applied by the server to the noised counts;
    the clients' job (``plan.clients_job``) keeps every class: node 0's 2 samples of class 2
    are in the exact sum."""
    data = _node_data(tmp_path)
    cfg = _run_config("central")
    monkeypatch.setattr(client_app, "_RUNS", {})
    plan = plan_from_config(cfg)
    setup = run_setup(21, cfg)
    assert setup.job == plan.clients_job and setup.job.min_class_count == 1
    assert plan.client.min_class_count == 5
    assert setup.secagg == plan.secagg_config() and setup.noise is None
    assert run_setup(21, cfg) is setup
    assert (data[0][1] == 2).sum() == 2
    result, _ = _round(_server(cfg), tmp_path, 21, cfg)
    exact = sum_stats(compute_stats(x, y, CLASSES, "full", clip_norm=CLIP) for x, y in data)
    np.testing.assert_array_equal(result.report.total.counts, exact.counts)
    assert result.report.total.allclose(exact, rtol=1e-12)


def test_a_run_config_that_is_no_plan_is_refused_with_the_plans_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_app, "_RUNS", {})
    bad = {**_run_config("central"), FIELDS["client.clip_norm"].key: 0.0}
    with pytest.raises(ConfigError, match=r"^run config: .*clip"):
        run_setup(31, bad)
    assert client_app._RUNS == {}  # a failed setup is not kept
    regions = _run_config("central", regions=2)
    with pytest.raises(ProtocolError, match=(
            rf"^a run with regions must give the run config key '{FEDERATION_SIZE_KEY}' \(the "
            r"federation's size, which sizes every region's codec\)$")):
        run_setup(32, regions)
    setup = run_setup(33, {**regions, FEDERATION_SIZE_KEY: 6})
    assert setup.federation_size == 6 and setup.encoder() is not None
    # through the handler: the node answers with the refusal, nothing else
    _node_data(tmp_path)
    node = _Node(0, 34, tmp_path, regions)
    with pytest.raises(ProtocolError, match=r"^a run with regions must give"):
        _round_first_request(node, regions)


def _round_first_request(node: _Node, run_cfg: dict[str, Any]) -> None:
    """Send ``node`` the advertise request of a server of the run config's plan."""
    from ghofl.secure import SecAggServer

    plan = plan_from_config({**run_cfg, FIELDS["aggregation.regions"].key: 0})
    server = SecAggServer(plan.secagg_config(), job_meta(plan.clients_job, DIM),
                          [node.client_id, "node-8", "node-9"])
    node.handle(server.requests()[node.client_id])


def test_the_setup_is_kept_per_run_and_for_a_few_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_app, "_RUNS", {})
    central, distributed = _run_config("central"), _run_config("distributed")
    first = run_setup(41, central)
    assert run_setup(41, central) is first
    other = run_setup(41, distributed)  # one run id, another config: never the first's
    assert other is not first and other.noise is not None and first.noise is None
    for run_id in range(50, 50 + client_app._KEPT_RUNS):
        run_setup(run_id, central)
    assert len(client_app._RUNS) == client_app._KEPT_RUNS
    assert run_setup(41, central) is not first  # the oldest runs were let go


def test_a_run_can_swap_the_apps_client_app_for_a_test_one(tmp_path: Path) -> None:
    """``LocalFlower.run(client_app=FILE)`` submits a copy of the app whose ClientApp is the
    file's ``app`` (the fault tests' crashing node); the ServerApp and the config stay."""
    import tomllib

    from ghofl.integrations.flower.runner import app_with_client

    root = Path(__file__).resolve().parents[2]
    app, fault = root / "examples" / "flower_app", root / "tests" / "integration" / \
        "flower_fault_app.py"
    dest = tmp_path / "app"
    dest.mkdir()
    (dest / "stale.py").write_text("left from an earlier run")
    assert app_with_client(app, fault, dest) == dest
    ours, theirs = (tomllib.loads((d / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
                    for d in (dest, app))
    assert ours["components"] == {**theirs["components"], "clientapp": "flower_fault_app:app"}
    assert ours["config"] == theirs["config"]
    assert (dest / "flower_fault_app.py").read_bytes() == fault.read_bytes()
    assert (dest / "README.md").is_file() and not (dest / "stale.py").exists()
    with pytest.raises(ConfigError, match=r"^client_app must be a Python file whose 'app' is "
                                          r"the ClientApp; got .*README\.md$"):
        app_with_client(app, app / "README.md", tmp_path / "x")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "pyproject.toml").write_text('[tool.flwr.app.components]\nserverapp = "a:b"\n')
    with pytest.raises(ConfigError, match=r"pyproject\.toml names no ClientApp \(one line "
                                          r"'clientapp = \.\.\.' under "
                                          r"\[tool\.flwr\.app\.components\]\); give the folder "
                                          r"of a Flower app$"):
        app_with_client(bare, fault, tmp_path / "y")
