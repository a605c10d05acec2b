"""A Flower node's identity, ledger and simulated node config (issue 38, items 4 and 6).

A node is authenticated by default: without ``identity-key`` and ``roster`` it refuses every
secure round, naming both fixes, unless its node config says ``insecure-keys=true`` (then it
warns). Its round ledger lies beside its data unless ``ledger`` says otherwise. ``ghofl
flower-run --secure`` gives its local nodes fresh identities and a roster by default, and the
ServerApp binds them within ``wait-timeout-s`` (their first message meets a cold start), not
the stage timeout.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from flwr.app import Context, RecordDict

from ghofl.cli.main import main
from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, ProtocolError
from ghofl.integrations.flower import SIM_NODE_CONFIG_ENV, server_app
from ghofl.integrations.flower.client_app import (
    NO_ROSTER_WARNING,
    NodeIdentity,
    effective_node_config,
    handle_query,
    node_ledger,
)
from ghofl.integrations.flower.records import message_from_record, message_to_record
from ghofl.integrations.flower.runner import identity_node_config, make_identities
from ghofl.integrations.flower.transport import CLIENT_INFO
from ghofl.secure import SecAggServer
from ghofl.secure.binding import hello_request
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.messages import AdvertiseKeys
from ghofl.server import AggregationSpec, FederationPlan
from ghofl.server.config import plan_to_config
from ghofl.stats.accumulate import compute_stats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import write_npz

CLIP = 6.0
CLASSES = ("0", "1", "2")
NO_ROSTER = (r"^this node has no roster, so it cannot check the keys the server relays \(a relay "
             r"or a lying server could substitute them and read this node's statistics\): give "
             r"it the node config keys 'identity-key' and 'roster' \(ghofl keys new, ghofl "
             r"roster build; the server then needs the run config key 'roster'\), or set the "
             r"node config key 'insecure-keys=true' to take the relayed keys on trust$")


def _node_data(tmp_path: Path) -> tuple[Path, dict[str, Any], Any]:
    """A node's data file, the run config of a secure job and the statistics' metadata."""
    x, y = gaussian_mixture(0, 3, 4, n=30)
    path = write_npz(tmp_path / "me.npz", x / np.linalg.norm(x, axis=1, keepdims=True), y)
    job = ClientJob(CLASSES, clip_norm=CLIP)
    run_cfg = {**plan_to_config(FederationPlan(job, AggregationSpec("secure"))),
               "data-template": ""}
    meta = compute_stats(x[:3], y[:3], CLASSES, "full", clip_norm=CLIP).meta
    return path, run_cfg, meta


def _advertise(meta: Any, client: str) -> RecordDict:
    """The advertise request of an unauthenticated server for ``client`` (and two others)."""
    server = SecAggServer(AggregationSpec("secure").secagg_config(CLIP), meta,
                          [client, "node-8", "node-9"])
    return message_to_record(server.requests()[client])


def test_a_node_without_a_roster_refuses_a_secure_round_naming_both_fixes(
        tmp_path: Path) -> None:
    data, run_cfg, meta = _node_data(tmp_path)
    me = NodeIdentity.from_node_config({"data-path": str(data)}, 7)
    assert me.client_id == "node-7" and me.roster is None and not me.insecure_keys
    assert not me.policy.allow_unauthenticated
    request = message_from_record(_advertise(meta, "node-7"))
    with pytest.raises(ProtocolError, match=NO_ROSTER):
        me.require_keys(request)  # type: ignore[arg-type]
    # through the ClientApp handler: the refusal is the node's answer, nothing else
    ctx = Context(1, 7, {"data-path": str(data)}, RecordDict(), run_cfg)
    reply = handle_query(_advertise(meta, "node-7"), ctx)
    info = reply[CLIENT_INFO]
    assert isinstance(info["refused"], str)
    with pytest.raises(ProtocolError, match=NO_ROSTER):
        raise ProtocolError(info["refused"])
    assert not list(tmp_path.glob(".ghofl-ledger-*"))  # refused before any ledger entry


def test_insecure_keys_takes_part_and_prints_one_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, run_cfg, meta = _node_data(tmp_path)
    node = {"data-path": str(data), "insecure-keys": True, "partition-id": 3}
    me = NodeIdentity.from_node_config(node, 7)
    assert me.insecure_keys and me.policy.allow_unauthenticated
    ctx = Context(1, 7, node, RecordDict(), run_cfg)  # type: ignore[arg-type]
    reply = handle_query(_advertise(meta, "node-7"), ctx)
    assert "refused" not in reply[CLIENT_INFO], reply[CLIENT_INFO].get("refused")
    assert isinstance(message_from_record(reply), AdvertiseKeys)
    err = capsys.readouterr().err
    assert err.count(NO_ROSTER_WARNING) == 1
    assert NO_ROSTER_WARNING.startswith("WARNING: secure aggregation without a roster: every "
                                        "relayed key is taken on trust")


@pytest.mark.parametrize(("node", "match"), [
    ({"identity-key": "k.key"},
     r"^give this node both 'identity-key' and 'roster' in its node config \(or neither and "
     r"'insecure-keys=true', for an unauthenticated node\)$"),
    ({"roster": "r.json", "insecure-keys": True},
     r"^give this node both 'identity-key' and 'roster'"),
    ({"identity-key": "k.key", "roster": "r.json", "insecure-keys": True},
     r"^this node has a roster and 'insecure-keys=true': remove 'insecure-keys' from its node "
     r"config \(a node with a roster checks every relayed key\)$"),
    ({"insecure-keys": "yes"},
     r"^node config key 'insecure-keys' must be true or false; got 'yes': fix it in this "
     r"SuperNode's --node-config$"),
])
def test_bad_identity_node_configs_are_refused_naming_the_fix(node: dict[str, Any],
                                                              match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        NodeIdentity.from_node_config(node, 7)


def test_the_default_ledger_lies_beside_the_data(tmp_path: Path) -> None:
    data = tmp_path / "site" / "data.npz"
    data.parent.mkdir()
    keys = {"site-a": IdentityKey.generate(), "site/b": IdentityKey.generate()}
    keys["site-a"].save(tmp_path / "a.key", "site-a")
    Roster.from_identities(keys).save(tmp_path / "roster.json")
    authed = NodeIdentity.from_node_config(
        {"identity-key": str(tmp_path / "a.key"), "roster": str(tmp_path / "roster.json")}, 7)
    ledger = node_ledger({}, authed, data)
    assert ledger is not None and not ledger.allow_repeat
    assert ledger.path == data.parent.resolve() / ".ghofl-ledger-site-a.json"
    # without a roster: named by the partition id (stable across restarts), else the address
    part = NodeIdentity.from_node_config({"insecure-keys": True, "partition-id": 3}, 7)
    by_part = node_ledger({}, part, data)
    assert by_part is not None and by_part.path.name == ".ghofl-ledger-partition-3.json"
    bare = NodeIdentity.from_node_config({"insecure-keys": True}, 7)
    by_address = node_ledger({}, bare, data)
    assert by_address is not None and by_address.path.name == ".ghofl-ledger-node-7.json"
    # overridden, switched off, repeats allowed
    own = node_ledger({"ledger": str(tmp_path / "l.json"), "allow-repeat-rounds": True}, authed,
                      data)
    assert own is not None and own.path == tmp_path / "l.json" and own.allow_repeat
    assert node_ledger({"ledger": "none"}, authed, data) is None
    assert node_ledger({"ledger": "None"}, authed, data) is None
    with pytest.raises(ConfigError, match=r"^node config key 'ledger' must be a file path or "
                                          r"\"none\"; got 3: fix it in this SuperNode's "
                                          r"--node-config$"):
        node_ledger({"ledger": 3}, authed, data)
    with pytest.raises(ConfigError, match=r"^node config key 'allow-repeat-rounds' must be "
                                          r"true or false; got 'yes'"):
        node_ledger({"allow-repeat-rounds": "yes"}, authed, data)
    assert not list(data.parent.iterdir())  # nothing is written before a round


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to any folder")
def test_an_unwritable_data_folder_asks_for_a_ledger_path(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        me = NodeIdentity.from_node_config({"insecure-keys": True}, 7)
        with pytest.raises(ConfigError, match=r"this node's round ledger goes beside its data "
                                              r"by default, but .* is not writable: give the "
                                              r"node config key 'ledger' a writable file path"):
            node_ledger({}, me, folder / "data.npz")
    finally:
        folder.chmod(0o700)


def test_simulated_nodes_read_their_node_config_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIM_NODE_CONFIG_ENV, raising=False)
    assert effective_node_config({"partition-id": 1}) == {"partition-id": 1}
    table = tmp_path / "nodes.json"
    table.write_text(json.dumps({"1": {"roster": "r.json", "partition-id": 9}}))
    monkeypatch.setenv(SIM_NODE_CONFIG_ENV, str(table))
    # the node's own keys are kept
    assert effective_node_config({"partition-id": 1}) == {"partition-id": 1, "roster": "r.json"}
    assert effective_node_config({"partition-id": 2}) == {"partition-id": 2}
    table.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=rf"^{SIM_NODE_CONFIG_ENV}=.*nodes\.json: not a "
                                          r"readable JSON object of node configs by partition "
                                          r"id .*; fix the file or unset the variable$"):
        effective_node_config({"partition-id": 1})


def _secure_plan(**agg: Any) -> FederationPlan:
    return FederationPlan(ClientJob(CLASSES, clip_norm=CLIP), AggregationSpec("secure", **agg))


def test_flower_run_secure_generates_identities_and_a_roster_by_default(tmp_path: Path) -> None:
    from ghofl.cli.flower_cmds import _node_configs

    cfg: dict[str, Any] = {}
    nodes = _node_configs(tmp_path / "flower", _secure_plan(), 3, cfg)
    assert nodes is not None and len(nodes) == 3
    roster = Roster.load(cfg["roster"])
    assert Path(cfg["roster"]) == (tmp_path / "flower" / "identities" / "roster.json").resolve()
    assert sorted(roster.clients) == ["site-0", "site-1", "site-2"]
    for i, node in enumerate(nodes):
        assert node["roster"] == cfg["roster"] and "insecure-keys" not in node
        key = IdentityKey.load(str(node["identity-key"]))
        assert key.public in roster.keys.values()
        assert node["ledger"] == str((tmp_path / "flower" / "ledgers" / f"node-{i}.json")
                                     .resolve())
    assert len({str(n["identity-key"]) for n in nodes}) == 3
    # a second run gets fresh keys, and fresh ledgers
    (tmp_path / "flower" / "ledgers").mkdir()
    (tmp_path / "flower" / "ledgers" / "node-0.json").write_text("{}")
    again: dict[str, Any] = {}
    assert _node_configs(tmp_path / "flower", _secure_plan(), 3, again) is not None
    assert Roster.load(again["roster"]).keys != roster.keys
    assert not (tmp_path / "flower" / "ledgers").exists()
    # the plain protocol needs none of it
    plain = FederationPlan(ClientJob(CLASSES), AggregationSpec("plain"))
    assert _node_configs(tmp_path / "p", plain, 3, {}) is None


def test_flower_run_insecure_keys_and_its_errors(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from ghofl.cli.flower_cmds import INSECURE_WARNING, _node_configs

    cfg: dict[str, Any] = {}
    nodes = _node_configs(tmp_path / "flower", _secure_plan(), 2, cfg, insecure_keys=True,
                          stats_cache=tmp_path / "cache")
    assert nodes is not None and "roster" not in cfg
    assert [n["insecure-keys"] for n in nodes] == [True, True]
    assert nodes[1]["stats-cache"] == str((tmp_path / "cache" / "node-1").resolve())
    assert capsys.readouterr().err.strip() == INSECURE_WARNING
    assert not (tmp_path / "flower" / "identities").exists()
    with pytest.raises(ConfigError, match=r"^--regions runs its regional rounds without a "
                                          r"roster .*: add --insecure-keys to take the relayed "
                                          r"keys on trust, or drop --regions"):
        _node_configs(tmp_path / "r", _secure_plan(regions=2), 4, {})
    assert _node_configs(tmp_path / "r", _secure_plan(regions=2), 4, {},
                         insecure_keys=True) is not None


def test_the_cli_parses_insecure_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--insecure-keys`` is an option of flower-run (checked before any process starts)."""
    x, y = gaussian_mixture(0, 3, 4, n=12)
    write_npz(tmp_path / "p-0.npz", x, y)
    base = ["flower-run", "--data-template", str(tmp_path / "p-{partition_id}.npz"), "--out",
            str(tmp_path / "o"), "--classes", "3", "--insecure-keys"]
    assert main([*base, "--plain"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--identities and --insecure-keys apply to --secure only: drop them or add --secure")
    assert main([*base, "--secure", "--clip", "5", "--identities", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--insecure-keys runs without identities: drop it or --identities")
    assert not (tmp_path / "o").exists()


class _HelloGrid:
    """A Flower grid whose nodes answer through ghofl's ClientApp handler, each after its own
    cold start (``delays`` seconds after the push): only the identity exchange is driven."""

    def __init__(self, folder: Path, delays: list[float]) -> None:
        self.folder, self.delays = folder, delays
        self.pushed: dict[str, tuple[int, Any, float]] = {}

    def get_node_ids(self) -> list[int]:
        return list(range(len(self.delays)))

    def push_messages(self, messages: list[Any]) -> list[str]:
        now = time.monotonic()
        for m in messages:
            self.pushed[f"m{m.metadata.dst_node_id}"] = (m.metadata.dst_node_id, m.content, now)
        return [f"m{m.metadata.dst_node_id}" for m in messages]

    def pull_messages(self, ids: set[str]) -> list[Any]:
        out = []
        for mid in sorted(ids):
            node, content, at = self.pushed[mid]
            if time.monotonic() - at < self.delays[node]:
                continue
            node_cfg = identity_node_config(self.folder, node)
            ctx = Context(1, node, node_cfg, RecordDict(), {})  # type: ignore[arg-type]
            out.append(SimpleNamespace(
                metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                has_error=lambda: False, content=handle_query(content, ctx)))
        return out


def test_the_server_binds_nodes_slower_than_a_stage_within_the_wait_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity request is each node's first message: nodes whose answer comes after the
    stage timeout (a cold start on a loaded machine) are still bound, because the exchange
    waits for every connected node within ``wait-timeout-s``; run_federation gives it that."""
    from flwr.supercore.task_identity import TaskIdentity

    for attr in ("_run_id", "_node_id", "_task_id"):  # what a ServerApp process has set
        monkeypatch.setattr(TaskIdentity, attr, 1)
    folder = make_identities(tmp_path / "ids", 3)
    roster = Roster.load(folder / "roster.json")
    state: dict[str, Any] = {}
    grid = _HelloGrid(folder, [0.0, 0.6, 1.2])
    bound = server_app._bind(grid, {f"node-{i}": i for i in range(3)}, roster, 30.0, state)
    assert sorted(bound) == ["site-0", "site-1", "site-2"] and state["unbound"] == []
    assert state["identity_problems"] == {}

    seen: dict[str, float] = {}

    def fake_bind(grid: Any, ids: Any, roster: Any, timeout: float, state: Any) -> Any:
        seen["timeout"] = timeout
        raise KeyboardInterrupt  # stop here: only the binding's deadline is under test

    monkeypatch.setattr(server_app, "_bind", fake_bind)
    cfg = {"protocol": "secure", "classes": json.dumps(list(CLASSES)), "clip_norm": CLIP,
           "dim": 4, "heads": "nb", "roster": str(folder / "roster.json"),
           "expected-nodes": 3, "stage-timeout-s": 5.0, "wait-timeout-s": 400.0}
    with pytest.raises(KeyboardInterrupt):
        server_app.run_federation(grid, cfg, tmp_path / "out", {})
    assert seen["timeout"] == 400.0


def test_a_failed_run_names_the_nodes_refusals() -> None:
    state = {"problems": {"node-1": "advertise: refused: no roster; fix A",
                          "node-2": "advertise: refused: no roster; fix A",
                          "node-3": "advertise: no reply within 60 s"},
             "identity_problems": {"node-4": "hello: refused: key not on the roster"}}
    assert server_app._refusals(state) == ("; node-4 refused: key not on the roster"
                                           "; node-1, node-2 refused: no roster; fix A")
    assert server_app._refusals({}) == ""


def test_the_server_warns_when_it_runs_a_secure_round_without_a_roster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def stop(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(server_app, "_aggregate", stop)
    cfg = {"protocol": "secure", "classes": json.dumps(list(CLASSES)), "clip_norm": CLIP,
           "dim": 4, "heads": "nb", "expected-nodes": 3}
    grid = SimpleNamespace(get_node_ids=lambda: [1, 2, 3])
    state: dict[str, Any] = {}
    with pytest.raises(KeyboardInterrupt):
        server_app.run_federation(grid, cfg, tmp_path / "out", state)
    assert capsys.readouterr().err.strip() == server_app.NO_ROSTER_WARNING
    assert state["authenticated"] is False
    assert server_app.NO_ROSTER_WARNING == (
        "WARNING: secure aggregation without a roster (run config key 'roster' is empty): "
        "every relayed key is taken on trust, and each node refuses the round unless its node "
        "config says insecure-keys=true; give the run a roster (ghofl roster build) and each "
        "node its identity-key and roster")


def test_hello_is_refused_without_identity_naming_the_fix() -> None:
    me = NodeIdentity.from_node_config({"insecure-keys": True}, 7)
    keys = {"site-a": IdentityKey.generate()}
    with pytest.raises(ProtocolError, match=r"^the server asked for this node's identity, but "
                                            r"the node has no 'identity-key' and 'roster' in its "
                                            r"node config: give it both"):
        me.hello(hello_request(Roster.from_identities(keys)))


def test_a_dead_node_is_reported_by_flower_not_as_a_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower answers a message to a node whose heartbeats stopped with an error reply from
    the SuperLink (not from the node): the stage ends then, and the node's problem says so."""
    from flwr.supercore.task_identity import TaskIdentity

    from ghofl.integrations.flower.transport import FlowerTransport

    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)
    keys = {"site-a": IdentityKey.generate(), "site-b": IdentityKey.generate()}
    request = hello_request(Roster.from_identities(keys))
    unavailable = SimpleNamespace(
        metadata=SimpleNamespace(src_node_id=0, reply_to_message_id="m1"),
        has_error=lambda: True, error=SimpleNamespace(code=5, reason="node unavailable"))
    grid = SimpleNamespace(push_messages=lambda ms: ["m0", "m1"],
                           pull_messages=lambda ids: [unavailable] if "m1" in ids else [])
    transport = FlowerTransport(grid, {"node-7": 7, "node-8": 8}, timeout_s=0.5)
    assert list(transport.exchange("hello", {"node-7": request, "node-8": request})) == []
    assert transport.problems == {"node-8": "hello: Flower error 5: node unavailable",
                                  "node-7": "hello: no reply within 0.5 s"}
