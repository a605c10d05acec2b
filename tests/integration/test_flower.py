"""End-to-end runs of ghofl on Flower 1.42 (simulation and deployment engines on 127.0.0.1).

Every test starts its own SuperLink (and SuperNodes), stops exactly those processes by PID and
checks that none survives. The deployment tests share one federation (3 SuperNodes) for the
equality, restart and above-threshold fault runs; the below-threshold fault has its own.

The simulated nodes and the authenticated deployment hold identity keys and a roster (the
default); the shared deployment's nodes run with ``insecure-keys=true`` and, since they
federate the same data more than once, ``allow-repeat-rounds=true``. Every node's round ledger
lies beside its data, under the test's temporary folder.

No test relies on a fixed wait: the ServerApp waits for the expected nodes and, with a roster,
for every node's answer to the identity request (its first message, which meets the node's cold
start) within the generous ``wait-timeout-s``; a stage's timeout only decides when a node
killed on purpose is given up, and Flower reports a dead node's messages as undeliverable
once its heartbeats stop.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.client.job import ClientJob
from ghofl.data.partition import dirichlet_partition
from ghofl.integrations.flower.runner import LocalFlower, identity_node_config, make_identities
from ghofl.model.directory import load_model
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan
from ghofl.server.simulation import Population, simulate
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import sum_stats
from ghofl.stats.codec import load_stats
from ghofl.store import AggregationStore
from tests.helpers import gaussian_mixture
from tests.integration.flower_fault_app import KILL_KEY

pytestmark = pytest.mark.slow

CLIP = 30.0
SEED = 0
ALPHA = 0.5
HEADS = "nb,lda,qda"
CLASSES = ("0", "1", "2")
APP = Path(__file__).resolve().parents[2] / "examples" / "flower_app"
#: The fault tests' ClientApp: ghofl's, plus a node config key that crashes a node on cue.
FAULT_APP = Path(__file__).resolve().parent / "flower_fault_app.py"
#: The shared deployment's nodes: no identities (keys on trust), the same data in every run.
INSECURE = {"insecure-keys": True, "allow-repeat-rounds": True}


def _data(root: Path, clients: int) -> dict[str, Any]:
    """Train/test split of one Gaussian mixture (d=8, C=3); client i's rows of a seeded
    Dirichlet partition in parts/client-{i}.npz; the test set in test.npz."""
    x, y = gaussian_mixture(0, num_classes=3, dim=8, n=800)
    xtr, ytr, xte, yte = x[:600], y[:600], x[600:], y[600:]
    parts = dirichlet_partition(ytr, clients, ALPHA, SEED)
    (root / "parts").mkdir(parents=True, exist_ok=True)
    for i, idx in enumerate(parts):
        np.savez(root / "parts" / f"client-{i}.npz", x=xtr[idx], y=ytr[idx])
    np.savez(root / "test.npz", x=xte, y=yte)
    return {"xtr": xtr, "ytr": ytr, "xte": xte, "yte": yte, "parts": parts,
            "template": str(root / "parts" / "client-{partition_id}.npz")}


def _config(root: Path, data: dict[str, Any], out: str, **extra: Any) -> dict[str, Any]:
    return {"protocol": "secure", "classes": json.dumps(list(CLASSES)), "clip_norm": CLIP,
            "heads": HEADS, "seed": SEED, "data-template": data["template"],
            "out-dir": str(root / out), "test-path": str(root / "test.npz"),
            "stage-timeout-s": 120.0, "wait-timeout-s": WAIT_S, **extra}


#: Seconds the ServerApp may wait for the nodes and their first answers: generous, since a
#: wait on a condition ends as soon as it holds (a loaded 2-core machine starts 5 SuperNodes,
#: their SuperExecs and ClientApp processes slowly).
WAIT_S = 600.0


def _simulated(root: Path, nodes: int) -> tuple[LocalFlower, dict[str, str]]:
    """A simulation federation whose nodes hold fresh identity keys, and the run config's roster."""
    ids = make_identities(root / "ids", nodes)
    flower = LocalFlower(root / "work", "simulation",
                         node_configs=[identity_node_config(ids, i) for i in range(nodes)])
    return flower, {"roster": str(ids / "roster.json")}


def _reference(data: dict[str, Any], clients: int) -> dict[str, np.ndarray]:
    plan = FederationPlan(ClientJob(CLASSES, clip_norm=CLIP), AggregationSpec("secure"),
                          ServerJob(tuple(HEADS.split(",")), seed=SEED))
    sim = simulate(plan, (data["xtr"], data["ytr"]), (data["xte"], data["yte"]),
                   Population(clients, ALPHA))
    return sim.predictions


def _predictions(model_dir: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    heads, _ = load_model(model_dir)
    return {name: head.predict(x) for name, head in heads.items()}


def _assert_same_predictions(model_dir: Path, data: dict[str, Any], ref: dict[str, Any]) -> None:
    got = _predictions(model_dir, data["xte"])
    assert set(got) == set(ref) == set(HEADS.split(","))
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


def _closed(flower: LocalFlower) -> None:
    flower.close()
    assert flower.survivors() == [], "processes started by the test survived"


def test_simulation_secure_matches_in_process(tmp_path: Path) -> None:
    data = _data(tmp_path, 10)
    flower, roster = _simulated(tmp_path, 10)
    try:
        flower.__enter__()
        res = flower.run(_config(tmp_path, data, "out", **roster, **{"expected-nodes": 10}),
                         app_dir=APP, num_supernodes=10)
    finally:
        _closed(flower)
    assert res["status"] == "ok", res.get("error")
    assert res["authenticated"] and res["identity_problems"] == {}
    assert sorted(res["survivors"]) == sorted(f"site-{i}" for i in range(10))
    assert res["dropped"] == {}
    assert set(res["stage_seconds"]) == {"advertise", "reveal", "share", "mask", "consistency", "unmask"}
    assert res["bytes"]["mask"]["server_received"] > 0
    _assert_same_predictions(tmp_path / "out" / "model", data, _reference(data, 10))
    card = (tmp_path / "out" / "model" / "MODEL_CARD.md").read_text()
    threshold = res["aggregation"]["params"]["threshold"]
    assert "- Clients: 10\n" in card and "- Aggregation protocol: secure\n" in card
    assert f"threshold: {threshold} clients" in card


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalFlower, Path,
                                                                          dict[str, Any]]]:
    root = tmp_path_factory.mktemp("deployment")
    data = _data(root, 3)
    flower = LocalFlower(root / "work", "deployment")
    try:
        flower.__enter__()
        for i in range(3):
            flower.add_supernode(i, 3, data["template"].format(partition_id=i), extra=INSECURE)
        yield flower, root, data
    finally:
        _closed(flower)


def test_deployment_secure_matches_in_process(deployment: Any) -> None:
    flower, root, data = deployment
    res = flower.run(_config(root, data, "run-a", **{"expected-nodes": 3}), app_dir=APP)
    assert res["status"] == "ok", res.get("error")
    assert sorted(n["partition_id"] for n in res["nodes"].values()) == [0, 1, 2]
    _assert_same_predictions(root / "run-a" / "model", data, _reference(data, 3))


def test_superlink_restart_keeps_the_first_model(deployment: Any) -> None:
    flower, root, data = deployment
    model = root / "run-a" / "model"
    if not model.exists():  # run alone: make the first run here
        res = flower.run(_config(root, data, "run-a", **{"expected-nodes": 3}), app_dir=APP)
        assert res["status"] == "ok", res.get("error")
    files = {p.name: p.read_bytes() for p in model.iterdir()}
    before = _predictions(model, data["xte"])
    flower.restart_superlink()
    res = flower.run(_config(root, data, "run-b", protocol="plain", store=str(root / "fed.db"),
                             **{"expected-nodes": 3}), app_dir=APP)
    assert res["status"] == "ok", res.get("error")
    # plain mode records every accepted contribution in the durable store
    with AggregationStore(root / "fed.db") as store:
        assert sorted(c.client_id for c in store.contributions()) == [
            "partition-0", "partition-1", "partition-2"]
        assert store.total().allclose(load_stats(root / "run-b" / "total.ghs"), rtol=1e-12)
    assert {p.name: p.read_bytes() for p in model.iterdir()} == files
    manifest = json.loads((model / "manifest.json").read_text())
    assert set(manifest["heads"]) == set(HEADS.split(","))
    after = _predictions(model, data["xte"])
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])


def test_nodes_killed_at_each_stage_above_threshold(deployment: Any) -> None:
    """Three more SuperNodes (copies of clients 0, 1, 2) SIGKILL themselves at the share, mask
    and unmask stages of one secure round (the advertise stage is covered below the threshold).
    The round finishes with the survivors' exact sum; the node killed at unmask had already sent
    its masked input, so its statistics are in the sum."""
    flower, root, data = deployment
    stages = {3: "share", 4: "mask", 5: "unmask"}
    for part, stage in stages.items():
        flower.add_supernode(part, 6, data["template"].format(partition_id=part - 3),
                             extra={**INSECURE, KILL_KEY: stage})
    res = flower.run(_config(root, data, "run-kill", threshold=3,
                             **{"expected-nodes": 6, "stage-timeout-s": 35.0}), app_dir=APP,
                     client_app=FAULT_APP)
    assert res["status"] == "ok", res.get("error")
    by_partition = {v["partition_id"]: c for c, v in res["nodes"].items()}
    assert res["dropped"] == {by_partition[p]: s for p, s in stages.items()}
    in_sum = [0, 1, 2, 5]
    assert sorted(res["survivors"]) == sorted(by_partition[p] for p in in_sum)
    total = load_stats(root / "run-kill" / "total.ghs")
    rows = [data["parts"][p if p < 3 else p - 3] for p in in_sum]
    plain = sum_stats(compute_stats(data["xtr"][idx], data["ytr"][idx], CLASSES, "full",
                                    clip_norm=CLIP) for idx in rows)
    np.testing.assert_array_equal(total.counts, plain.counts)
    assert total.allclose(plain, rtol=1e-12)
    assert (root / "run-kill" / "model" / "manifest.json").exists()


NAMES = ("site-a", "site-b", "site-c", "site-d", "stranger")


@pytest.fixture(scope="module")
def authenticated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[
        LocalFlower, Path, dict[str, Any]]]:
    """Five SuperNodes with identity keys: site-a, -b, -c and -d are on the federation's
    roster (site-d SIGKILLs itself at its first advertise request), the stranger's key is not."""
    from ghofl.secure.identity import IdentityKey, Roster

    root = tmp_path_factory.mktemp("authenticated")
    data = _data(root, 3)
    keys = {}
    for name in NAMES:
        keys[name] = key = IdentityKey.generate()
        key.save(root / f"{name}.key", name)
    Roster({n: k.public for n, k in keys.items() if n != "stranger"}).save(root / "roster.json")
    flower = LocalFlower(root / "work", "deployment")
    try:
        flower.__enter__()
        for i, name in enumerate(NAMES):
            extra = {"identity-key": str(root / f"{name}.key"), "roster": str(root / "roster.json")}
            if name == "site-d":
                extra[KILL_KEY] = "advertise"
            flower.add_supernode(i, len(NAMES), data["template"].format(partition_id=min(i, 2)),
                                 extra=extra)
        yield flower, root, data
    finally:
        _closed(flower)


def test_deployment_with_identities_binds_the_roster_and_refuses_a_stranger(
        authenticated: Any) -> None:
    """The ServerApp binds every node to its roster id (signed answers to its challenge); the
    stranger binds to nothing and contributes nothing; site-d dies at advertise (a dropout);
    the round runs authenticated (signed keys, consistency check) with the exact sum of
    site-a, -b and -c."""
    flower, root, data = authenticated
    res = flower.run(_config(root, data, "out", roster=str(root / "roster.json"),
                             **{"expected-nodes": 5}), app_dir=APP, timeout_s=1500,
                     client_app=FAULT_APP)
    assert res["status"] == "ok", (res.get("error"), res.get("identity_problems"))
    assert res["authenticated"]
    assert sorted(res["survivors"]) == ["site-a", "site-b", "site-c"]
    assert res["dropped"] == {"site-d": "advertise"} and set(res["unbound"]) <= {"site-d"}
    (why,) = res["identity_problems"].values()
    assert "identity key is not on its roster" in why
    assert res["aggregation"]["excluded"] == {}
    total = load_stats(root / "out" / "total.ghs")
    plain = sum_stats(compute_stats(data["xtr"][idx], data["ytr"][idx], CLASSES, "full",
                                    clip_norm=CLIP) for idx in data["parts"])
    np.testing.assert_array_equal(total.counts, plain.counts)
    assert total.allclose(plain, rtol=1e-12)


def test_node_killed_below_threshold_fails_cleanly(authenticated: Any) -> None:
    """With t = 4 of the roster's 4, the lost site-d leaves too few: the run fails with no
    model and no total."""
    flower, root, data = authenticated
    res = flower.run(_config(root, data, "below", threshold=4, roster=str(root / "roster.json"),
                             **{"expected-nodes": 4}), app_dir=APP, timeout_s=1500,
                     client_app=FAULT_APP)
    assert res["status"] == "failed"
    assert "AggregationAbortedError" in res["error"], res["error"]
    assert list(res["dropped"]) == ["site-d"]
    assert not (root / "below" / "model").exists()
    assert not (root / "below" / "total.ghs").exists()


def test_simulation_distributed_dp_records_the_spent_budget(tmp_path: Path) -> None:
    """Distributed DP over the secure protocol: clients add their noise shares before masking,
    the server post-processes the noisy total, and the spent (ε, δ) lands in results.json and
    in the model directory's manifest."""
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    data = _data(tmp_path, 4)
    flower, roster = _simulated(tmp_path, 4)
    try:
        flower.__enter__()
        res = flower.run(_config(tmp_path, data, "out", threshold=3, **roster,
                                 **{"expected-nodes": 4, "dp_epsilon": 4.0, "dp_delta": 1e-5,
                                    "dp_mode": "distributed"}),
                         app_dir=APP, num_supernodes=4)
    finally:
        _closed(flower)
    assert res["status"] == "ok", res.get("error")
    privacy = res["privacy"]
    assert privacy["dp_mode"] == "distributed" and privacy["epsilon"] == 4.0
    assert privacy["epsilon_spent"] <= 4.0 + 1e-9 and privacy["delta_spent"] <= 1e-5
    assert privacy["distributed_noise"]["kept_variance"] == pytest.approx(1.0, rel=1e-12)
    assert privacy["postprocessing"]
    manifest = json.loads((tmp_path / "out" / "model" / "manifest.json").read_text())
    assert manifest["privacy"]["epsilon_spent"] == privacy["epsilon_spent"]
    noisy = load_stats(tmp_path / "out" / "total.ghs")
    exact = sum_stats(compute_stats(data["xtr"][idx], data["ytr"][idx], CLASSES, "full",
                                    clip_norm=CLIP) for idx in data["parts"])
    assert not noisy.allclose(exact, rtol=1e-6)  # the server never saw the noiseless sum


def test_simulated_nodes_without_a_roster_refuse_and_the_error_says_how_to_fix_it(
        tmp_path: Path) -> None:
    """No identities and no insecure-keys: every node refuses the unauthenticated round at its
    first stage, and the run's error carries the nodes' refusal, naming both fixes."""
    data = _data(tmp_path, 3)
    flower = LocalFlower(tmp_path / "work", "simulation")
    try:
        flower.__enter__()
        res = flower.run(_config(tmp_path, data, "out", **{"expected-nodes": 3}), app_dir=APP,
                         num_supernodes=3)
    finally:
        _closed(flower)
    assert res["status"] == "failed" and res["authenticated"] is False
    assert "AggregationAbortedError" in res["error"], res["error"]
    assert "refused: this node has no roster, so it cannot check the keys the server relays" \
           in res["error"], res["error"]
    assert "give it the node config keys 'identity-key' and 'roster'" in res["error"]
    assert "or set the node config key 'insecure-keys=true'" in res["error"]
    assert not (tmp_path / "out" / "model").exists()
    assert not list((tmp_path / "parts").glob(".ghofl-ledger-*"))
