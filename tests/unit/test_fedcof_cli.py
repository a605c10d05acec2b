"""FedCOF's estimate from the command line: ``--estimate fedcof`` on plain ``means`` uploads.

``ghofl simulate`` and ``ghofl aggregate`` build FedCOF's estimate of the second moments from
each client's class means and counts (:func:`ghofl.moments.fedcof.fedcof_statistics`) and fit
every head from it; under secure aggregation, differential privacy or a store the plan refuses
it in one line with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ghofl.cli.main import build_command
from ghofl.data.partition import dirichlet_partition
from ghofl.errors import ConfigError, FieldError, StatsValidationError, UnsupportedModeError
from ghofl.heads.build import check_heads_mode, estimate_mode
from ghofl.model.directory import load_model
from ghofl.moments.estimated import EstimatedStats
from ghofl.moments.fedcof import fedcof_statistics
from ghofl.server.config import plan_from_config
from ghofl.server.estimate import FedCOFEstimate
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec
from ghofl.server.run import FederationServer
from ghofl.stats import compute_stats, load_stats, save_stats
from ghofl.stats.client_stats import ClientStats, sum_stats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import write_npz

C, D = 4, 5
HEADS = "ncm,fedcof,lda,ridge"


@pytest.fixture()
def data(tmp_path: Path) -> tuple[Path, Path, Any, Any]:
    x, y = gaussian_mixture(3, num_classes=C, dim=D, n=600)
    xt, yt = gaussian_mixture(3, num_classes=C, dim=D, n=1200)
    return (write_npz(tmp_path / "train.npz", x, y), write_npz(tmp_path / "test.npz", xt[600:],
                                                               yt[600:]), x, y)


def _capture_fit(monkeypatch: pytest.MonkeyPatch) -> list[ClientStats]:
    """The totals FederationServer.fit is given (the heads are fitted from them)."""
    seen: list[ClientStats] = []
    original = FederationServer.fit

    def fit(self: FederationServer, total: ClientStats, **kw: Any) -> Any:
        seen.append(total)
        return original(self, total, **kw)

    monkeypatch.setattr(FederationServer, "fit", fit)
    return seen


def _close(a: Any, b: Any) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(float(np.abs(b).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(a, b, rtol=0.0, atol=1e-12 * scale)


def _same_estimate(got: ClientStats, want: EstimatedStats) -> None:
    assert isinstance(got, EstimatedStats) and got.mode == want.mode == "pooled"
    assert np.array_equal(got.counts, want.counts)
    for name in ("sums", "sq_sums", "scatter", "class_dof"):
        _close(getattr(got, name), getattr(want, name))
    assert got.scatter_dof == pytest.approx(want.scatter_dof, rel=1e-12)


def test_simulate_fits_every_head_from_fedcofs_estimate_of_the_same_partition(
        data: tuple[Path, Path, Any, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    train, test, x, y = data
    seen = _capture_fit(monkeypatch)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(build_command(), [
        "simulate", "--train", str(train), "--test", str(test), "--clients", "6", "--alpha",
        "0.5", "--seed", "3", "--mode", "means", "--heads", HEADS, "--estimate", "fedcof",
        "--json", str(out)])
    assert r.exit_code == 0, r.output
    parts = dirichlet_partition(y, 6, 0.5, 3)  # the partition simulate draws with --seed 3
    clients = [compute_stats(x[idx], y[idx], C, mode="means") for idx in parts]
    want = fedcof_statistics(clients)
    assert len(seen) == 1
    _same_estimate(seen[0], want)
    result = json.loads(out.read_text())
    assert list(result["heads"]) == HEADS.split(",") and result["mode"] == "means"
    xt, yt = np.load(test)["x"], np.load(test)["y"]
    for name in ("lda", "fedcof"):  # each head is the one fitted from the estimate
        ref = ServerJob((name,), seed=3).build_heads()[name]
        acc = float(np.mean(ref.fit_from_stats(want).predict(xt) == yt))
        assert result["heads"][name]["accuracy"] == pytest.approx(acc, abs=1e-12)


def test_simulate_refuses_fedcof_under_secure_aggregation_in_one_line(
        data: tuple[Path, Path, Any, Any]) -> None:
    train, test, _, _ = data
    r = CliRunner().invoke(build_command(), [
        "simulate", "--train", str(train), "--test", str(test), "--clients", "4", "--alpha",
        "1", "--mode", "means", "--heads", HEADS, "--estimate", "fedcof", "--secure",
        "--clip", "50"])
    assert isinstance(r.exception, ConfigError)
    with pytest.raises(ConfigError, match=(
            r"^--estimate fedcof needs each client's own class means, which secure aggregation "
            r"hides by design \(the server learns only their sum\); drop --estimate or "
            r"--secure$")):
        raise r.exception


def test_simulate_without_the_estimate_refuses_fedcof_on_means_naming_it(
        data: tuple[Path, Path, Any, Any]) -> None:
    train, test, _, _ = data
    r = CliRunner().invoke(build_command(), [
        "simulate", "--train", str(train), "--test", str(test), "--clients", "4", "--alpha",
        "1", "--mode", "means", "--heads", "ncm,fedcof"])
    assert isinstance(r.exception, UnsupportedModeError)
    with pytest.raises(UnsupportedModeError, match=(
            r"^head 'fedcof' needs upload mode 'gram' or richer .* statistics are mode "
            r"'means'; .* \(--mode gram\) or, on plain uploads, fit it from FedCOF's covariance "
            r"estimate of the clients' class means \(--estimate fedcof\) or drop 'fedcof'")):
        raise r.exception


def test_heads_mode_rule_with_the_estimate() -> None:
    check_heads_mode(["ncm", "fedcof", "lda", "ridge", "nb"], "means", estimate="fedcof")
    assert estimate_mode(["ncm", "lda"], "means", "fedcof") == "pooled"
    assert estimate_mode(["lda", "qda"], "means", "fedcof") == "full"  # QDA: every class
    assert estimate_mode(["lda"], "gram", "sum") == "gram"
    with pytest.raises(UnsupportedModeError, match=r"^head 'qda' needs upload mode 'full' .* "
                                                   r"\(--mode full\) or drop 'qda'"):
        check_heads_mode(["qda"], "means")  # no estimate hint: pooled cannot serve QDA
    with pytest.raises(ConfigError, match=r"^estimate must be one of sum, fedcof; got 'x'$"):
        estimate_mode(["lda"], "means", "x")


@pytest.mark.parametrize(("cfg", "message"), [
    ({"estimate": "x"}, r"^run config: estimate must be one of sum, fedcof; got 'x'$"),
    ({"estimate": "fedcof", "store": "s.db"},
     r"^run config: estimate = \"fedcof\" is computed from the payloads of one round, while "
     r"store holds the total of every round; set estimate = \"sum\" or store = \"\"$"),
    ({"estimate": "fedcof", "protocol": "secure", "clip_norm": 1.0},
     r"^run config: estimate = \"fedcof\" needs each client's own class means, which secure "
     r"aggregation hides by design"),
])
def test_run_config_refusals(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_from_config({"classes": "a,b", "mode": "means", "heads": "ncm", **cfg})


def test_the_estimate_refuses_differential_privacy_and_unknown_values() -> None:
    from ghofl.privacy import DPConfig

    with pytest.raises(FieldError, match=(
            r"reads each client's own class means, which differential privacy does not cover "
            r"\(it noises only the total\); set AggregationSpec estimate = \"sum\" or ")):
        AggregationSpec(estimate="fedcof", dp=DPConfig(1.0))
    with pytest.raises(FieldError, match=r"estimate must be 'sum' or 'fedcof'; got 'avg'$"):
        AggregationSpec(estimate="avg")  # type: ignore[arg-type]


def test_the_servers_estimate_checks_what_it_kept() -> None:
    x, y = gaussian_mixture(1, num_classes=3, dim=4, n=90)
    a, b = (compute_stats(x[s], y[s], 3, mode="means") for s in (slice(0, 50), slice(50, 90)))
    est = FedCOFEstimate("pooled")
    with pytest.raises(StatsValidationError, match=r"needs the upload of at least one client"):
        est.estimate(a)
    est.add("a", a)
    with pytest.raises(StatsValidationError, match=(
            r"^FedCOF's estimate holds 50 samples from 1 uploads but the total holds 90: "
            r"every accepted upload must reach the estimate$")):
        est.estimate(sum_stats([a, b]))
    est.add("b", b)
    _same_estimate(est.estimate(sum_stats([a, b])), fedcof_statistics([a, b]))


def _payloads(tmp_path: Path, x: Any, y: Any) -> tuple[list[Path], list[ClientStats]]:
    parts = dirichlet_partition(y, 5, 0.5, 1)
    clients = [compute_stats(x[idx], y[idx], C, mode="means") for idx in parts]
    paths = [tmp_path / f"c{i}.ghs" for i in range(len(clients))]
    for path, stats in zip(paths, clients, strict=True):
        save_stats(stats, path)
    return paths, clients


def test_aggregate_fits_the_heads_from_the_estimate_and_writes_the_exact_sum(
        data: tuple[Path, Path, Any, Any], tmp_path: Path) -> None:
    _, test, x, y = data
    paths, clients = _payloads(tmp_path, x, y)
    model, total = tmp_path / "model", tmp_path / "total.ghs"
    r = CliRunner().invoke(build_command(), [
        "aggregate", *map(str, paths), "--estimate", "fedcof", "--heads", HEADS, "--model",
        str(model), "--out", str(total)])
    assert r.exit_code == 0, r.output
    assert "FedCOF's estimate from 5 uploads" in r.output
    exact = load_stats(total)
    assert exact.mode == "means" and np.allclose(exact.sums, sum_stats(clients).sums)
    heads, _ = load_model(model)
    assert list(heads) == HEADS.split(",")
    want = fedcof_statistics(clients)
    xt = np.load(test)["x"]
    for name in ("lda", "fedcof", "ridge"):
        ref = ServerJob((name,)).build_heads()[name]
        assert np.array_equal(heads[name].predict(xt), ref.fit_from_stats(want).predict(xt))


@pytest.mark.parametrize(("extra", "message"), [
    (["--estimate", "fedcof", "--out", "t.ghs"],
     r"^--estimate fedcof fits the heads from FedCOF's estimate, which no statistics file can "
     r"hold \(its degrees of freedom are not in the format\); give --model DIR"),
    (["--model", "m", "--out", "t.ghs"],
     r"^--model writes the heads fitted from FedCOF's estimate; add --estimate fedcof, or "
     r"write the sum with --out and fit it with ghofl fit$"),
    (["--estimate", "fedcof", "--model", "m", "--store", "s.db"],
     r"^--estimate fedcof is computed from the payloads of one round, while --store holds the "
     r"total of every round; drop --estimate or --store$"),
    (["--estimate", "mean", "--model", "m"],
     r"^--estimate must be one of sum, fedcof; got 'mean'$"),
])
def test_aggregate_refusals(data: tuple[Path, Path, Any, Any], tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch, extra: list[str],
                            message: str) -> None:
    _, _, x, y = data
    paths, _ = _payloads(tmp_path, x, y)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(build_command(), ["aggregate", *map(str, paths), *extra])
    assert isinstance(r.exception, ConfigError), r.output
    with pytest.raises(ConfigError, match=message):
        raise r.exception
    assert not (tmp_path / "m").exists() and not (tmp_path / "t.ghs").exists()
