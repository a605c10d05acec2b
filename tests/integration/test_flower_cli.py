"""``ghofl flower-run`` with --holdout, --holdout-seed, --transport-dtype and --preset: the
options share their declarations with ``ghofl simulate`` / ``client-stats`` / ``fit`` (their
bad values and help texts are checked in test_cli.py), and one local Flower run (simulation
engine) uses them all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.client.job import ClientJob, client_statistics
from ghofl.stats.client_stats import sum_stats
from ghofl.stats.codec import load_stats, read_stats_file, through_transport
from tests.helpers import gaussian_mixture
from tests.helpers_cli import run_cli, write_npz

pytestmark = pytest.mark.slow

CLASSES = ("0", "1", "2")


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two clients' archives (d=6, C=3) in parts/ and a test set."""
    root = tmp_path_factory.mktemp("flower_cli")
    x, y = gaussian_mixture(2, num_classes=3, dim=6, n=360)
    (root / "parts").mkdir()
    write_npz(root / "parts" / "client-0.npz", x[:150], y[:150])
    write_npz(root / "parts" / "client-1.npz", x[150:300], y[150:300])
    write_npz(root / "test.npz", x[300:], y[300:])
    return root


def test_flower_run_with_holdout_float32_and_preset(ws: Path, tmp_path: Path) -> None:
    """A plain-protocol simulation run of two nodes: each client uploads a held-out section in
    float32, and the server fits the heads with the paper preset and one --param. The total is the sum of the
    clients' float32-rounded payloads. run_local stops every process it started, by PID, and
    fails the run when one survives."""
    out = tmp_path / "run"
    r = run_cli("flower-run", "--engine", "simulation", "--nodes", "2", "--plain",
                "--data-template", ws / "parts" / "client-{partition_id}.npz",
                "--test", ws / "test.npz", "--heads", "nb,lda", "--out", out,
                "--holdout", "0.2", "--holdout-seed", "3", "--transport-dtype", "float32",
                "--preset", "paper", "--param", "nb.var_floor=1e-5", "--stage-timeout", "60",
                "--json",
                cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["status"] == "ok" and len(res["survivors"]) == 2
    total, _ = read_stats_file(out / "total.ghs")
    assert total.holdout is not None and total.meta.holdout_fraction == 0.2
    job = ClientJob(CLASSES, "full", holdout_fraction=0.2, holdout_seed=3,
                    transport_dtype="float32")
    ref = sum_stats(through_transport(client_statistics(ws / "parts" / f"client-{i}.npz", job),
                                      "float32") for i in range(2))
    assert total.allclose(ref, rtol=1e-12)
    assert not total.allclose(sum_stats(client_statistics(ws / "parts" / f"client-{i}.npz",
                                                          job) for i in range(2)), rtol=1e-12)
    assert load_stats(out / "total.ghs").holdout is not None
    manifest = json.loads((out / "model" / "manifest.json").read_text())
    assert manifest["heads"]["lda"]["params"]["shrinkage"] == 0.05  # the paper preset
    assert manifest["heads"]["nb"]["params"]["var_smoothing"] == 0.0  # the paper preset
    assert manifest["heads"]["nb"]["params"]["var_floor"] == 1e-5  # --param overrides it
    assert manifest["stats"]["holdout_fraction"] == 0.2
    assert set(res["accuracy"]) == {"nb", "lda"}
    assert np.isfinite(list(res["accuracy"].values())).all()


def test_flower_run_secure_is_authenticated_by_default_and_can_run_again(
        ws: Path, tmp_path: Path) -> None:
    """``flower-run --secure`` (simulation engine) gives its nodes fresh identities and the
    server the roster: every node binds to its roster id and the round is authenticated. A
    second run over the same data and --out is not refused by the nodes' ledgers (each run's
    are fresh, in OUT/flower/ledgers), and no ledger is left beside the data."""
    out = tmp_path / "run"
    args: list[str | Path] = [
        "flower-run", "--engine", "simulation", "--nodes", "2", "--secure", "--clip", "30",
        "--data-template", ws / "parts" / "client-{partition_id}.npz", "--test",
        ws / "test.npz", "--heads", "nb", "--out", out, "--json"]
    for _ in range(2):
        r = run_cli(*args, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        res = json.loads(r.stdout)
        assert res["status"] == "ok" and res["authenticated"] is True
        assert sorted(res["survivors"]) == ["site-0", "site-1"]
        assert res["identity_problems"] == {} and res["unbound"] == []
        assert "WARNING" not in r.stderr
    assert sorted(p.name for p in (out / "flower" / "identities").iterdir()) == [
        "roster.json", "site-0.key", "site-0.key.pub", "site-1.key", "site-1.key.pub"]
    assert sorted(p.name for p in (out / "flower" / "ledgers").iterdir()) == [
        "node-0.json", "node-1.json"]
    assert not list((ws / "parts").glob(".ghofl-ledger-*"))


def test_flower_run_federated_eval_through_the_secure_round(ws: Path, tmp_path: Path) -> None:
    """``flower-run --secure --federated-eval``: after the fit every node scores the model on a
    share of its rows held out from its statistics, and the sums go through a secure round
    with the same identities and roster; results.json reports them per head."""
    out = tmp_path / "run"
    r = run_cli("flower-run", "--engine", "simulation", "--nodes", "2", "--secure", "--clip",
                "30", "--data-template", ws / "parts" / "client-{partition_id}.npz",
                "--test", ws / "test.npz", "--heads", "nb,lda", "--out", out,
                "--federated-eval", "--eval-fraction", "0.25", "--json", cwd=tmp_path,
                timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    fed = res["federated_evaluation"]
    assert res["status"] == "ok" and fed["eval_fraction"] == 0.25
    assert set(fed["heads"]) == {"nb", "lda"}
    for metrics in fed["heads"].values():
        assert 0 < metrics["n"] < 300 and 0.0 <= metrics["accuracy"] <= 1.0
    total, _ = read_stats_file(out / "total.ghs")
    assert total.n_samples + next(iter(fed["heads"].values()))["n"] == 300  # disjoint rows


def test_flower_run_eval_fraction_needs_federated_eval(ws: Path, tmp_path: Path) -> None:
    r = run_cli("flower-run", "--nodes", "2", "--data-template",
                ws / "parts" / "client-{partition_id}.npz", "--out", tmp_path / "o",
                "--eval-fraction", "0.3", cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert "--eval-fraction applies with --federated-eval only" in r.stderr
