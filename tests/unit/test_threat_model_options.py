"""The threat model of the secure round as options (issue 19): γ (``--corrupt-fraction``), δ
(``--dropout-fraction``), σ (``--exposure-bits``) and η (``--abort-bits``).

They are declared once in FIELDS (plan field, config key, CLI flag), checked by the plan (each
error names its option in every vocabulary), carried by the run config, taken by ``ghofl
simulate`` (whose simulated clients hold the same policy) and ``ghofl flower-run``, and sized
into the graph by :func:`~ghofl.secure.graph_params.required_parameters`. A Flower node's own
policy comes from its node config, never the server's run config: a node refuses a server
that asks for a laxer round than its own values need.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.client.job import ClientJob
from ghofl.errors import AggregationAbortedError, ConfigError
from ghofl.integrations.flower._config import POLICY_KEYS, node_policy
from ghofl.secure import InMemoryTransport, SecAggConfig, run_aggregation
from ghofl.secure.config import consistency_threshold
from ghofl.secure.graph_params import required_parameters
from ghofl.server import CLI, CONFIG, FIELDS, LIBRARY, AggregationSpec, FederationPlan, PlanError
from ghofl.server.config import plan_from_config, plan_to_config
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import sum_stats
from tests.helpers import gaussian_mixture, secure_federation
from tests.helpers_cli import write_npz

CLIP = 6.0
FLAGS = {"aggregation.corrupt_fraction": ("--corrupt-fraction", "corrupt_fraction"),
         "aggregation.dropout_fraction": ("--dropout-fraction", "dropout_fraction"),
         "aggregation.sigma": ("--exposure-bits", "exposure_bits"),
         "aggregation.eta": ("--abort-bits", "abort_bits")}
#: n = 24 clients at γ = 0.2, δ = 0.1, σ = 30, η = 15: a sparse graph (k = 8, t_s = 5) and
#: t = 15, where the defaults need k = 18 and t = 17.
N = 24
LAX: dict[str, Any] = {"corrupt_fraction": 0.2, "dropout_fraction": 0.1, "sigma": 30.0,
                      "eta": 15.0}


def test_the_four_options_are_declared_once_with_flag_and_key() -> None:
    for path, (flag, key) in FLAGS.items():
        assert FIELDS[path].flag == flag and FIELDS[path].key == key
    assert dict(POLICY_KEYS) == {p.split(".")[1]: k for p, (_, k) in FLAGS.items()}


BAD: list[tuple[dict[str, Any], str, str, str]] = [
    ({"corrupt_fraction": 1.0}, "aggregation.corrupt_fraction",
     r"^--corrupt-fraction must be a fraction of the clients in \[0, 1\) \(e\.g\. 0\.2\); "
     r"got 1\.0$", r"^corrupt_fraction must be a fraction"),
    ({"dropout_fraction": -0.1}, "aggregation.dropout_fraction",
     r"^--dropout-fraction must be a fraction of the clients in \[0, 1\)", r"^dropout_fraction"),
    ({"corrupt_fraction": 0.5, "dropout_fraction": 0.5}, "aggregation.dropout_fraction",
     r"^--corrupt-fraction \+ --dropout-fraction must be below 1 \(some honest client must be "
     r"expected to survive\); got 0\.5 \+ 0\.5: lower either$",
     r"^corrupt_fraction \+ dropout_fraction must be below 1"),
    ({"sigma": 0.0}, "aggregation.sigma",
     r"^--exposure-bits must be a number of bits > 0 \(the target probability is 2\^-bits; "
     r"e\.g\. 40\); got 0\.0$", r"^exposure_bits must be a number of bits > 0"),
    ({"eta": math.nan}, "aggregation.eta", r"^--abort-bits must be a number of bits > 0",
     r"^abort_bits must be"),
]


@pytest.mark.parametrize(("values", "field", "cli", "config"), BAD,
                         ids=["gamma-1", "delta-negative", "sum-1", "sigma-0", "eta-nan"])
def test_out_of_range_values_are_plan_errors_naming_the_option(values: dict[str, Any],
                                                               field: str, cli: str,
                                                               config: str) -> None:
    with pytest.raises(PlanError, match=r"^AggregationSpec ") as info:
        AggregationSpec("secure", **values)
    assert info.value.field == field
    assert re.search(cli, info.value.render(CLI)), info.value.render(CLI)
    assert re.search(config, info.value.render(CONFIG)), info.value.render(CONFIG)


@pytest.mark.parametrize("path", sorted(FLAGS))
def test_each_option_only_applies_to_the_secure_protocol(path: str) -> None:
    name = path.split(".")[1]
    with pytest.raises(PlanError, match=rf"^AggregationSpec {name} only applies to the secure "
                       r"protocol") as info:
        AggregationSpec(**{name: 0.05 if name.endswith("fraction") else 8.0})  # type: ignore[arg-type]
    assert info.value.render(CLI) == f"{FLAGS[path][0]} only applies to the secure protocol; " \
                                     "add --secure"


def test_the_run_config_carries_them_and_names_bad_keys() -> None:
    plan = FederationPlan(ClientJob(("a", "b"), clip_norm=2.0), AggregationSpec("secure", **LAX))
    cfg = plan_to_config(plan)
    assert {k: cfg[k] for _, k in FLAGS.values()} == {
        "corrupt_fraction": 0.2, "dropout_fraction": 0.1, "exposure_bits": 30.0,
        "abort_bits": 15.0}
    assert plan_from_config(cfg) == plan
    cfg_ = plan.secagg_config()
    assert (cfg_.corrupt_fraction, cfg_.dropout_fraction, cfg_.sigma, cfg_.eta) == (
        0.2, 0.1, 30.0, 15.0)
    with pytest.raises(ConfigError, match=r"^run config: exposure_bits must be a number of bits "
                       r"> 0 .*; got -1\.0$"):
        plan_from_config({**cfg, "exposure_bits": -1.0})
    with pytest.raises(ConfigError, match=r"run config key 'abort_bits' must be a number; got "
                       r"'x'"):
        plan_from_config({**cfg, "abort_bits": "x"})


def test_the_default_threshold_follows_the_corrupt_fraction() -> None:
    params = AggregationSpec("secure", **LAX).secagg_config(CLIP).for_clients(N)
    k, t_s = required_parameters(N, 0.2, 0.1, 30.0, 15.0)
    assert (params.threshold, params.neighbours, params.share_threshold) == (
        consistency_threshold(N, 0.2), k, t_s) == (15, 8, 5)
    default = SecAggConfig(clip_norm=CLIP).for_clients(N)
    assert (default.threshold, default.neighbours) == (17, required_parameters(N)[0]) == (17, 18)


# ---------------------------------------------------------------------- ghofl simulate
@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("threat")
    x, y = gaussian_mixture(4, num_classes=3, dim=4, n=1200)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True) / (CLIP * 0.9), 1.0)
    write_npz(root / "train.npz", x[:960], y[:960])
    write_npz(root / "test.npz", x[960:], y[960:])
    return root


def _simulate(ws: Path, out: Path, *extra: str) -> int:
    return main(["simulate", "--train", str(ws / "train.npz"), "--test", str(ws / "test.npz"),
                 "--clients", str(N), "--alpha", "100", "--heads", "nb", "--secure",
                 "--clip", str(CLIP), "--json", str(out), *extra])


def test_simulate_sizes_the_graph_from_the_given_threat_model(ws: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    """The flags reach the server (t, k, t_s from required_parameters) and the simulated
    clients' policy (they accept the sparser graph); the sum is exact (same accuracy as the
    plain run)."""
    rc = _simulate(ws, tmp_path / "lax.json", "--corrupt-fraction", "0.2", "--dropout-fraction",
                   "0.1", "--exposure-bits", "30", "--abort-bits", "15")
    assert rc == 0, capsys.readouterr().err
    res = json.loads((tmp_path / "lax.json").read_text())
    params = res["aggregation"]["params"]
    assert (params["threshold"], params["neighbours"], params["shares_needed"]) == (15, 8, 5)
    assert res["aggregation"]["survivors"] == N
    rc = main(["simulate", "--train", str(ws / "train.npz"), "--test", str(ws / "test.npz"),
               "--clients", str(N), "--alpha", "100", "--heads", "nb", "--clip", str(CLIP),
               "--json", str(tmp_path / "plain.json")])
    assert rc == 0
    plain = json.loads((tmp_path / "plain.json").read_text())
    assert res["heads"]["nb"]["accuracy"] == plain["heads"]["nb"]["accuracy"]


@pytest.mark.parametrize(("args", "match"), [
    (["--corrupt-fraction", "1.5"], r"--corrupt-fraction must be a fraction of the clients in "
                                    r"\[0, 1\) \(e\.g\. 0\.2\); got 1\.5"),
    (["--corrupt-fraction", "0.6", "--dropout-fraction", "0.4"],
     r"--corrupt-fraction \+ --dropout-fraction must be below 1"),
    (["--abort-bits", "-3"], r"--abort-bits must be a number of bits > 0"),
    (["--exposure-bits", "forty"], r"Invalid value for '--exposure-bits'"),
])
def test_simulate_refuses_bad_values_naming_the_flag(ws: Path, tmp_path: Path, args: list[str],
                                                     match: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert _simulate(ws, tmp_path / "x.json", *args) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert not (tmp_path / "x.json").exists()


def test_simulate_refuses_them_without_secure(ws: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--train", str(ws / "train.npz"), "--test", str(ws / "test.npz"),
               "--clients", "3", "--alpha", "1", "--dropout-fraction", "0.1"])
    assert rc == 2
    assert "--dropout-fraction only applies to the secure protocol; add --secure" in \
        capsys.readouterr().err


def test_flower_run_gives_its_local_nodes_the_same_policy_on_both_engines(
        tmp_path: Path) -> None:
    """The local nodes are the user's: flower-run gives each the server's values where they
    differ from the defaults, through its node config (the simulated nodes' through
    GHOFL_SIM_NODE_CONFIG), so they accept the laxer round."""
    pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")
    from ghofl.cli.flower_cmds import _node_configs, _node_policy

    agg = AggregationSpec("secure", **LAX)
    assert _node_policy(agg) == {"corrupt_fraction": 0.2, "dropout_fraction": 0.1,
                                 "exposure_bits": 30.0, "abort_bits": 15.0}
    assert _node_policy(AggregationSpec("secure")) == {}
    assert _node_policy(AggregationSpec("secure", sigma=50.0)) == {"exposure_bits": 50.0}
    plan = FederationPlan(ClientJob(("0", "1"), clip_norm=CLIP), agg)
    nodes = _node_configs(tmp_path, plan, 3, {}, insecure_keys=True)
    assert nodes is not None and len(nodes) == 3
    assert all(n["corrupt_fraction"] == 0.2 and n["abort_bits"] == 15.0 for n in nodes)


# ---------------------------------------------------------------------- the client's own policy
def _payloads(n: int) -> list[Any]:
    out = []
    for i in range(n):
        x, y = gaussian_mixture(i, 3, 4, n=20)
        out.append(compute_stats(x, y, 3, "pooled", clip_norm=CLIP))
    return out


def test_a_node_refuses_a_server_that_asks_for_a_laxer_round() -> None:
    """The server sizes its round for γ = 0.2 (t = 15, k = 8); nodes with the default policy
    (empty node config) refuse it at once, naming the threshold; nodes whose own node config
    holds the same values take part, and the sum is exact."""
    ids = [f"site-{i:02d}" for i in range(N)]
    payloads = _payloads(N)
    server_cfg = SecAggConfig(clip_norm=CLIP, **LAX)
    strict = node_policy({}, authenticated=True)
    clients, server, _, _ = secure_federation(ids, list(payloads), server_cfg, policy=strict)
    transport = InMemoryTransport(clients)  # type: ignore[arg-type]
    with pytest.raises(AggregationAbortedError, match=r"advertise"):
        run_aggregation(server, transport)  # type: ignore[arg-type]
    refused = transport.traffic["advertise"].refused
    assert set(refused) == set(ids)
    assert all("threshold t=15 for 24 clients; this client accepts t between 17 and 24 "
               "(corrupt fraction 0.333) (outside this client's policy)" in why
               for why in refused.values()), refused
    own = node_policy({POLICY_KEYS[k]: v for k, v in LAX.items()}, authenticated=True)
    clients, server, _, _ = secure_federation(ids, list(payloads), server_cfg, policy=own)
    report = run_aggregation(server, InMemoryTransport(clients))  # type: ignore[arg-type]
    assert report.params["neighbours"] == 8 and len(report.survivors) == N
    expected = sum_stats(payloads)
    assert np.array_equal(report.total.counts, expected.counts)
    assert report.total.allclose(expected, rtol=1e-12)


def test_a_node_refuses_a_laxer_exposure_target_alone() -> None:
    """σ alone: at n = 30, γ = 0.2, δ = 0.1 a server sized for 2^-10 (k = 10, t_s = 6) holds too
    few shares per secret for a node that wants 2^-40 on that graph (7)."""
    n = 30
    ids = [f"site-{i:02d}" for i in range(n)]
    server_cfg = SecAggConfig(clip_norm=CLIP, corrupt_fraction=0.2, dropout_fraction=0.1,
                              sigma=10.0, eta=15.0)
    own = node_policy({"corrupt_fraction": 0.2, "dropout_fraction": 0.1, "abort_bits": 15.0},
                      authenticated=True)
    clients, server, _, _ = secure_federation(ids, _payloads(n), server_cfg, policy=own)
    transport = InMemoryTransport(clients)  # type: ignore[arg-type]
    with pytest.raises(AggregationAbortedError, match=r"advertise"):
        run_aggregation(server, transport)  # type: ignore[arg-type]
    refused = transport.traffic["advertise"].refused
    assert set(refused) == set(ids)
    assert all("a share threshold of 6 for 10 neighbours; this client needs at least 7 "
               "(corrupt fraction 0.2, exposure <= 2^-40)" in why for why in refused.values())


@pytest.mark.parametrize(("cfg", "match"), [
    ({"corrupt_fraction": 1.0}, r"^node config key 'corrupt_fraction' must be a fraction in "
                                r"\[0, 1\); got 1\.0: fix it in this SuperNode's --node-config$"),
    ({"dropout_fraction": "0.1"}, r"^node config key 'dropout_fraction' must be a fraction"),
    ({"exposure_bits": 0}, r"^node config key 'exposure_bits' must be a number of bits > 0"),
    ({"abort_bits": True}, r"^node config key 'abort_bits' must be a number of bits > 0"),
])
def test_bad_node_config_values_are_refused_naming_the_key(cfg: dict[str, Any],
                                                           match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        node_policy(cfg, authenticated=True)


def test_the_library_names_the_fields() -> None:
    with pytest.raises(PlanError, match=r"^AggregationSpec sigma must be a number of bits"):
        AggregationSpec("secure", sigma=-1.0)
    assert LIBRARY.name("aggregation.eta") == "AggregationSpec eta"


def test_the_flower_client_app_takes_its_policy_from_the_node_config(tmp_path: Path) -> None:
    """ghofl's ClientApp handler, given the advertise request of a server sized for γ = 0.2:
    a node with no policy keys answers with the refusal; one whose node config holds the same
    values answers with its keys. The run config (the server's) holds the lax values in both
    cases, and does not change what the node accepts."""
    pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")
    from flwr.app import Context, RecordDict

    from ghofl.integrations.flower.client_app import handle_query
    from ghofl.integrations.flower.records import message_from_record, message_to_record
    from ghofl.integrations.flower.transport import CLIENT_INFO
    from ghofl.secure import SecAggServer
    from ghofl.secure.identity import IdentityKey, Roster
    from ghofl.secure.messages import AdvertiseKeys

    keys = {f"site-{i:02d}": IdentityKey.generate() for i in range(N)}
    keys["site-00"].save(tmp_path / "me.key", "site-00")
    Roster.from_identities(keys).save(tmp_path / "roster.json")
    x, y = gaussian_mixture(0, 3, 4, n=30)
    write_npz(tmp_path / "me.npz", x / np.linalg.norm(x, axis=1, keepdims=True), y)
    job = ClientJob(("0", "1", "2"), clip_norm=CLIP)
    spec = AggregationSpec("secure", **LAX)
    run_cfg = {**plan_to_config(FederationPlan(job, spec)), "data-template": ""}
    meta = compute_stats(x[:3], y[:3], ("0", "1", "2"), "full", clip_norm=CLIP).meta
    server = SecAggServer(spec.secagg_config(CLIP), meta, roster=Roster.from_identities(keys))
    request = message_to_record(server.requests()["site-00"])
    node = {"identity-key": str(tmp_path / "me.key"), "roster": str(tmp_path / "roster.json"),
            "data-path": str(tmp_path / "me.npz")}
    for own, accepted in (({}, False), ({POLICY_KEYS[k]: v for k, v in LAX.items()}, True)):
        ctx = Context(1, 7, {**node, **own}, RecordDict(), run_cfg)  # type: ignore[arg-type]
        reply = handle_query(request, ctx)
        info = reply[CLIENT_INFO]
        if accepted:
            assert "refused" not in info, info.get("refused")
            assert isinstance(message_from_record(reply), AdvertiseKeys)
        else:
            assert "threshold t=15 for 24 clients; this client accepts t between 17 and 24" \
                in str(info["refused"])
