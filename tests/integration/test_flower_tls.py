"""A Flower 1.42 deployment on 127.0.0.1 over TLS with SuperNode authentication.

One federation, one run: the test makes a CA, the SuperLink's certificate and four SuperNode
key pairs; the SuperLink serves HTTPS with ``--enable-supernode-auth``; the keys of site-0,
site-1 and the untrusting node are registered (``flwr supernode register``), the rogue's is
not. The rogue (unregistered key) is refused by the SuperLink; the untrusting node (registered
key, but it trusts another CA) refuses the SuperLink's certificate; both exit without ever
being online. The secure run with expected-nodes = 2 then has exactly site-0 and site-1 as
survivors and their exact sum. Every process is stopped by PID and none survives. (The test is
about Flower's channel and SuperNode keys: the nodes hold no ghofl identities and run with
``insecure-keys=true``.)
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.integrations.flower.runner import LocalFlower
from ghofl.integrations.flower.tls import make_ca, make_loopback_credentials
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import sum_stats
from ghofl.stats.codec import load_stats
from tests.integration.test_flower import APP, CLASSES, CLIP, INSECURE, _closed, _config, _data

pytestmark = pytest.mark.slow

REGISTERED = {"site-0": 0, "site-1": 1}  # name -> partition id
ROGUE, UNTRUSTING = ("rogue", 2), ("untrusting", 3)
REFUSAL_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def secure_federation(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("tls")
    data = _data(root, 4)
    creds = make_loopback_credentials(root / "creds", [*REGISTERED, ROGUE[0], UNTRUSTING[0]])
    other_ca, _ = make_ca(root / "other-ca", common_name="a CA the SuperLink does not use")
    flower = LocalFlower(root / "work", "deployment", tls=creds, supernode_auth=True)
    try:
        flower.__enter__()
        node_ids = {name: flower.register_supernode(creds.node_keys[name][1])
                    for name in [*REGISTERED, UNTRUSTING[0]]}
        template = data["template"]
        bad = {
            ROGUE[0]: flower.add_supernode(ROGUE[1], 4, template.format(partition_id=ROGUE[1]),
                                           auth_key=creds.node_keys[ROGUE[0]][0]),
            UNTRUSTING[0]: flower.add_supernode(
                UNTRUSTING[1], 4, template.format(partition_id=UNTRUSTING[1]),
                auth_key=creds.node_keys[UNTRUSTING[0]][0], root_certificates=other_ca),
        }
        for name, part in REGISTERED.items():
            flower.add_supernode(part, 4, template.format(partition_id=part),
                                 auth_key=creds.node_keys[name][0], extra=INSECURE)
        for proc in bad.values():  # both give up before the run is submitted
            proc.wait(timeout=REFUSAL_TIMEOUT_S)
        yield {"flower": flower, "root": root, "data": data, "creds": creds,
               "node_ids": node_ids, "bad": bad}
    finally:
        _closed(flower)


def _log(fed: dict[str, Any], partition_id: int) -> str:
    flower: LocalFlower = fed["flower"]
    return flower.group.log(flower.nodes[partition_id]).read_text(errors="replace")


def test_unregistered_supernode_is_refused(secure_federation: dict[str, Any]) -> None:
    fed = secure_federation
    assert fed["bad"][ROGUE[0]].returncode not in (0, None)
    assert "Failed to activate SuperNode" in _log(fed, ROGUE[1])
    superlink_log = fed["flower"].group.log("superlink").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in superlink_log


def test_supernode_that_distrusts_the_certificate_does_not_connect(
        secure_federation: dict[str, Any]) -> None:
    fed = secure_federation
    assert fed["bad"][UNTRUSTING[0]].returncode not in (0, None)
    assert "CERTIFICATE_VERIFY_FAILED" in _log(fed, UNTRUSTING[1])
    # its key is registered, so only the certificate kept it out: never online
    statuses = fed["flower"].list_supernodes()
    assert statuses[fed["node_ids"][UNTRUSTING[0]]] == "registered"


def test_superlink_speaks_only_tls(secure_federation: dict[str, Any]) -> None:
    flower: LocalFlower = secure_federation["flower"]
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://127.0.0.1:{flower.port}/health", timeout=5)
    toml = (flower.workdir / "flwr_home" / "config.toml").read_text()
    assert "insecure" not in toml
    assert f"root-certificates = {json.dumps(str(secure_federation['creds'].ca_cert))}" in toml


def test_registered_nodes_run_over_tls_with_the_exact_sum(
        secure_federation: dict[str, Any]) -> None:
    fed = secure_federation
    flower, root, data = fed["flower"], fed["root"], fed["data"]
    res = flower.run(_config(root, data, "out", **{"expected-nodes": 2}), app_dir=APP)
    assert res["status"] == "ok", res.get("error")
    registered = {fed["node_ids"][name] for name in REGISTERED}
    assert sorted(res["survivors"]) == sorted(f"node-{n}" for n in registered)
    assert sorted(v["partition_id"] for v in res["nodes"].values()) == sorted(
        REGISTERED.values())
    assert res["dropped"] == {}
    statuses = flower.list_supernodes()
    assert set(statuses) == set(fed["node_ids"].values())  # the rogue is unknown to it
    assert {statuses[n] for n in registered} == {"online"}
    total = load_stats(root / "out" / "total.ghs")
    plain = sum_stats(compute_stats(data["xtr"][data["parts"][p]], data["ytr"][data["parts"][p]],
                                    CLASSES, "full", clip_norm=CLIP)
                      for p in REGISTERED.values())
    np.testing.assert_array_equal(total.counts, plain.counts)
    assert total.allclose(plain, rtol=1e-12)
    assert (root / "out" / "model" / "manifest.json").exists()
