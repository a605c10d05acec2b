"""Hierarchical secure aggregation on Flower: ``regions`` in the run config runs one secure
round per region over that region's own nodes, then the top round among the regional
aggregators in the ServerApp (simulation engine on 127.0.0.1; the test stops exactly the
processes it started, by PID). Regions of identity-bound nodes are not built: the nodes run
with ``insecure-keys=true``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.client.job import ClientJob, client_statistics
from ghofl.integrations.flower._config import job_meta
from ghofl.integrations.flower.runner import LocalFlower
from ghofl.server.config import plan_from_config
from ghofl.server.run import FederationServer
from ghofl.server.simulation import _aggregate_regions
from ghofl.stats.codec import load_stats
from ghofl.stats.schema import schema_for
from tests.helpers import gaussian_mixture

pytestmark = pytest.mark.slow

APP = Path(__file__).resolve().parents[2] / "examples" / "flower_app"
CLIENTS, REGIONS = 6, 2


def _cfg(root: Path) -> dict[str, object]:
    x, y = gaussian_mixture(0, num_classes=3, dim=8, n=360)
    (root / "parts").mkdir(parents=True, exist_ok=True)
    for i, idx in enumerate(np.array_split(np.arange(360), CLIENTS)):
        np.savez(root / "parts" / f"client-{i}.npz", x=x[idx], y=y[idx])
    return {"protocol": "secure", "classes": json.dumps(["0", "1", "2"]), "clip_norm": 30.0,
            "heads": "nb", "seed": 0, "dim": 8, "regions": REGIONS, "expected-nodes": CLIENTS,
            "data-template": str(root / "parts" / "client-{partition_id}.npz"),
            "out-dir": str(root / "out"), "stage-timeout-s": 60.0, "wait-timeout-s": 60.0}


def _flat(stats: object) -> tuple[np.ndarray, np.ndarray]:
    ints, floats = schema_for("full").flatten(stats)  # type: ignore[arg-type]
    return np.asarray(ints), np.asarray(floats)


def test_regions_on_flower_equal_the_in_process_hierarchy_bit_for_bit(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    flower = LocalFlower(tmp_path / "work", "simulation",
                         node_configs=[{"insecure-keys": True}] * CLIENTS)
    try:
        flower.__enter__()
        res = flower.run(cfg, app_dir=APP, num_supernodes=CLIENTS)
    finally:
        flower.close()
        assert flower.survivors() == [], "processes started by the test survived"
    assert res["status"] == "ok", res.get("error")
    hier = res["hierarchy"]
    assert hier["included_regions"] == ["region-0", "region-1"]
    assert [r["clients"] for r in hier["regions"].values()] == [3, 3]
    assert hier["codec"]["num_clients"] == CLIENTS  # every region encodes with K = 6
    assert len(res["survivors"]) == CLIENTS
    got = load_stats(tmp_path / "out" / "total.ghs")

    # the same clients' statistics through the in-process hierarchy (and a flat round)
    job = plan_from_config(cfg).clients_job
    meta = job_meta(job, 8)
    makers = {f"c{i}": (lambda i=i: client_statistics(
        tmp_path / "parts" / f"client-{i}.npz", job)) for i in range(CLIENTS)}
    server = FederationServer(plan_from_config(cfg), list(makers), meta)
    ref = _aggregate_regions(server, makers, meta, np.random.default_rng(0))
    flat_cfg = {**cfg, "regions": 0}
    flat = FederationServer(plan_from_config(flat_cfg), list(makers), meta)
    from ghofl.secure import SecAggClient
    from ghofl.secure.transport import InMemoryTransport
    flat_total = flat.aggregate(InMemoryTransport(
        [SecAggClient(c, m, meta=meta, allow_unauthenticated=True, ledger=None)
         for c, m in makers.items()])).total
    for a, b in zip(_flat(got), _flat(ref.total), strict=True):
        np.testing.assert_array_equal(a, b)  # bit for bit
    for a, b in zip(_flat(got), _flat(flat_total), strict=True):
        np.testing.assert_array_equal(a, b)
    assert got.n_samples == 360


def test_regions_with_a_wrong_federation_size_are_refused(tmp_path: Path) -> None:
    """Every node sizes its codec by 'expected-nodes'; a ServerApp that sees another number of
    nodes refuses the run rather than decode words of two codecs."""
    from ghofl.errors import ConfigError
    from ghofl.integrations.flower.server_app import _aggregate

    cfg = {**_cfg(tmp_path), "expected-nodes": 5}
    meta = job_meta(plan_from_config(cfg).clients_job, 8)
    server = FederationServer(plan_from_config(cfg), [f"node-{i}" for i in range(6)], meta)
    with pytest.raises(ConfigError, match="'expected-nodes' = 5, but 6 nodes are connected"):
        _aggregate(server, object(), {f"node-{i}": i for i in range(6)}, 1.0, [], cfg, None)


def test_flower_run_cli_runs_regions(tmp_path: Path) -> None:
    """``ghofl flower-run --secure --regions 2``: the results name both regions and the total
    is the clients' total (bit for bit with the run-config path above, here to 1e-9)."""
    from ghofl.stats.client_stats import sum_stats
    from tests.helpers_cli import run_cli

    cfg = _cfg(tmp_path)
    out = tmp_path / "run"
    r = run_cli("flower-run", "--engine", "simulation", "--nodes", "4", "--secure",
                "--insecure-keys", "--clip", "30", "--classes", "0,1,2", "--regions", "2",
                "--heads", "nb",
                "--data-template", str(cfg["data-template"]), "--out", out,
                "--stage-timeout", "60", "--json", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "WARNING: secure aggregation without a roster (--insecure-keys): every relayed key " \
           "is taken on trust" in r.stderr
    res = json.loads(r.stdout)
    assert res["status"] == "ok" and res["authenticated"] is False
    assert res["hierarchy"]["included_regions"] == [
        "region-0", "region-1"]
    job = ClientJob(("0", "1", "2"), clip_norm=30.0)
    ref = sum_stats([client_statistics(tmp_path / "parts" / f"client-{i}.npz", job)
                     for i in range(4)])
    assert load_stats(out / "total.ghs").allclose(ref, rtol=1e-9, atol=1e-9)


def test_flower_run_refuses_regions_without_insecure_keys(tmp_path: Path) -> None:
    """Regions run without a roster: flower-run asks for --insecure-keys rather than run them
    unauthenticated silently, before starting anything."""
    from tests.helpers_cli import run_cli

    cfg = _cfg(tmp_path)
    r = run_cli("flower-run", "--engine", "simulation", "--nodes", "4", "--secure",
                "--clip", "30", "--classes", "0,1,2", "--regions", "2",
                "--data-template", str(cfg["data-template"]), "--out", tmp_path / "run",
                cwd=tmp_path, timeout=300)
    assert r.returncode == 2
    assert "--regions runs its regional rounds without a roster (regions of identity-bound " \
           "nodes are not built): add --insecure-keys to take the relayed keys on trust, or " \
           "drop --regions for an authenticated flat round" in r.stderr
    assert "WARNING" not in r.stderr and not (tmp_path / "run" / "flower").exists()
