"""Public principal-direction projection: basis, fingerprint, lookup, and refusal to mix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, IncompatibleStatsError, StatsFormatError
from ghofl.stats import ProjectionSpec, compute_stats, sum_stats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.projection import (
    BASIS_DIR_ENV,
    PCA_GENERATOR,
    basis_fingerprint,
    default_basis,
    load_basis,
    parse_projection,
    pca_basis,
    save_basis,
)
from tests.helpers import gaussian_mixture


@pytest.fixture()
def basis_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(BASIS_DIR_ENV, str(tmp_path))
    return tmp_path


def _public(seed: int, d: int = 10, n: int = 300) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)) @ np.diag(np.linspace(3.0, 0.5, d))


def test_pca_basis_is_orthonormal_top_eigenvectors() -> None:
    x = _public(0)
    v = pca_basis(x, 4)
    assert v.dtype == np.float32 and v.shape == (10, 4)
    np.testing.assert_allclose(v.T.astype(float) @ v, np.eye(4), atol=1e-6)
    _, u = np.linalg.eigh(np.cov(x, rowvar=False))
    top = u[:, ::-1][:, :4]
    np.testing.assert_allclose(np.abs(top.T @ v), np.eye(4), atol=1e-5)
    np.testing.assert_array_equal(pca_basis(x, 4), v)  # deterministic, signs included


@pytest.mark.parametrize(
    ("x", "k", "match"),
    [
        (np.zeros((1, 3)), 1, "at least 2 feature rows"),
        (np.zeros((5, 3)), 4, r"must be in 1\.\.3; got 4"),
        (np.full((5, 3), np.nan), 1, "NaN or infinite"),
    ],
)
def test_pca_basis_rejects_bad_input(x: np.ndarray, k: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        pca_basis(x, k)


def test_save_load_and_projection_matrix(basis_dir: Path) -> None:
    v = pca_basis(_public(1), 6)
    path, fp = save_basis(v, default_for="enc0123456789abc", source="test")
    assert path == basis_dir / f"{fp}.npy" and fp == basis_fingerprint(v)
    np.testing.assert_array_equal(load_basis(fp), v.astype(np.float64))
    assert default_basis("enc0123456789abc") == fp
    spec = ProjectionSpec(0, 10, 4, PCA_GENERATOR, fp)
    np.testing.assert_array_equal(spec.matrix(), v[:, :4].astype(np.float64))
    assert spec.kind == "pca" and spec.describe() == f"pca k=4 basis {fp}"
    x, y = gaussian_mixture(3, num_classes=3, dim=10, n=90)
    stats = compute_stats(x, y, 3, mode="pooled", projection=spec)
    np.testing.assert_allclose(stats.sums.sum(axis=0), x.sum(axis=0) @ v[:, :4], rtol=1e-5)


def test_tampered_or_missing_basis_is_refused(basis_dir: Path) -> None:
    _, fp = save_basis(pca_basis(_public(2), 5))
    with pytest.raises(ConfigError, match="no projection basis with fingerprint 0000000000000000"):
        ProjectionSpec(0, 10, 3, PCA_GENERATOR, "0000000000000000").matrix()
    path = basis_dir / f"{fp}.npy"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 1
    other = "f" * 16
    (basis_dir / f"{other}.npy").write_bytes(bytes(blob))
    with pytest.raises(ConfigError, match=f"has fingerprint [0-9a-f]{{16}}, not {other}"):
        ProjectionSpec(0, 10, 3, PCA_GENERATOR, other).matrix()
    with pytest.raises(ConfigError, match=r"has shape \(10, 5\); a projection .* to k=6"):
        ProjectionSpec(0, 10, 6, PCA_GENERATOR, fp).matrix()


def test_a_malformed_default_record_is_refused(basis_dir: Path) -> None:
    from ghofl.stats.projection import default_basis

    (basis_dir / "enc.json").write_text("[]")
    with pytest.raises(ConfigError, match=r"enc.json' is malformed .*rebuild it with ghofl "
                                          r"projection-basis"):
        default_basis("enc")
    (basis_dir / "enc.json").write_text('{"basis": "NOT-A-FINGERPRINT"}')
    with pytest.raises(ConfigError, match=r"names no valid basis fingerprint; rebuild it with "
                                          r"ghofl projection-basis"):
        default_basis("enc")


def test_payloads_with_other_basis_or_random_projection_cannot_be_added(basis_dir: Path) -> None:
    _, fa = save_basis(pca_basis(_public(3), 5))
    _, fb = save_basis(pca_basis(_public(4), 5))
    x, y = gaussian_mixture(4, num_classes=2, dim=10, n=80)
    a = compute_stats(x, y, 2, mode="pooled", projection=ProjectionSpec(0, 10, 4, PCA_GENERATOR, fa))
    b = compute_stats(x, y, 2, mode="pooled", projection=ProjectionSpec(0, 10, 4, PCA_GENERATOR, fb))
    r = compute_stats(x, y, 2, mode="pooled", projection=ProjectionSpec(0, 10, 4))
    assert sum_stats([a, a]).counts.sum() == 160
    for other in (b, r):
        with pytest.raises(IncompatibleStatsError, match="projection"):
            sum_stats([a, other])


def test_metadata_round_trip_and_random_metadata_unchanged() -> None:
    spec = ProjectionSpec(0, 10, 4, PCA_GENERATOR, "0123456789abcdef")
    meta = StatsMeta("pooled", 4, ("a", "b"), projection=spec)
    assert StatsMeta.from_dict(meta.to_dict()).projection == spec
    assert "basis" not in ProjectionSpec(3, 10, 4).to_dict()
    bad = meta.to_dict()
    bad["projection"]["basis"] = "xyz"
    with pytest.raises(StatsFormatError, match="needs the 16-hex-digit fingerprint"):
        StatsMeta.from_dict(bad)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"generator": PCA_GENERATOR}, "needs the 16-hex-digit fingerprint of its basis"),
        ({"generator": "gauss"}, "unknown projection generator 'gauss'"),
        ({"basis": "0123456789abcdef"}, "takes no basis"),
    ],
)
def test_spec_validation(kwargs: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ProjectionSpec(0, 10, 4, **kwargs)


def test_parse_projection(basis_dir: Path) -> None:
    _, fp = save_basis(pca_basis(_public(5), 8), default_for="feedfacefeedface")
    assert parse_projection("none", 10) is None
    assert parse_projection("random:4", 10) == ProjectionSpec(0, 10, 4)
    assert parse_projection("random:4:7", 10) == ProjectionSpec(7, 10, 4)
    want = ProjectionSpec(0, 10, 4, PCA_GENERATOR, fp)
    assert parse_projection("pca:4", 10, "feedfacefeedface") == want
    assert parse_projection(f"pca:4:{fp}", 10) == want
    with pytest.raises(ConfigError, match="no principal-direction basis is recorded"):
        parse_projection("pca:4", 10, "0000000000000000")
    with pytest.raises(ConfigError, match="needs the encoder's default basis"):
        parse_projection("pca:4", 10)
    for text in ("pca", "svd:4", "pca:x", "random:4:s"):
        with pytest.raises(ConfigError, match=f"invalid projection '{text}'"):
            parse_projection(text, 10)


def test_client_job_carries_the_basis(basis_dir: Path) -> None:
    _, fp = save_basis(pca_basis(_public(6), 5))
    job = ClientJob(classes=("a", "b"), mode="pooled", projection_dim=3, projection_basis=fp)
    from ghofl.server.config import plan_from_config, plan_to_config
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import FederationPlan

    plan = FederationPlan(job, server=ServerJob(("lda",)))  # heads the pooled mode supports
    assert plan_from_config(plan_to_config(plan)).client == job
    assert job.projection(10) == ProjectionSpec(0, 10, 3, PCA_GENERATOR, fp)
    with pytest.raises(ConfigError, match="projection_basis must be '' or the 16-hex-digit"):
        ClientJob(classes=("a", "b"), projection_dim=3, projection_basis="zz")
    with pytest.raises(ConfigError, match="with ClientJob projection_dim set"):
        ClientJob(classes=("a", "b"), projection_basis=fp)


def test_cli_builds_a_basis_and_client_stats_use_it(
    basis_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from ghofl.cli.main import main
    from ghofl.stats import EncoderInfo, load_stats

    info = EncoderInfo("lite0", 10)
    enc = np.asarray(json.dumps(info.to_dict(), sort_keys=True))
    np.savez(tmp_path / "public.npz", x=_public(7), y=np.zeros(300, dtype=np.int64), encoder=enc)
    x, y = gaussian_mixture(8, num_classes=3, dim=10, n=120)
    np.savez(tmp_path / "client.npz", x=x, y=y, encoder=enc)
    assert main(["projection-basis", "--embeddings", str(tmp_path / "public.npz"), "--k",
                 "6"]) == 0
    fp = default_basis(info.fingerprint())
    assert f"fingerprint {fp}" in capsys.readouterr().out
    out = tmp_path / "c.ghs"
    assert main(["client-stats", "--embeddings", str(tmp_path / "client.npz"), "--out", str(out),
                 "--mode", "pooled", "--num-classes", "3", "--projection-dim", "4",
                 "--projection-basis", "default"]) == 0
    assert load_stats(out).meta.projection == ProjectionSpec(0, 10, 4, PCA_GENERATOR, fp)
    assert main(["client-stats", "--embeddings", str(tmp_path / "client.npz"), "--out",
                 str(tmp_path / "d.ghs"), "--num-classes", "3",
                 "--projection-basis", fp]) == 2
    assert "--projection-basis needs --projection-dim" in capsys.readouterr().err


def test_simulate_with_a_principal_direction_projection(
    basis_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from ghofl.cli.main import main

    _, fp = save_basis(pca_basis(_public(9), 6))
    x, y = gaussian_mixture(10, num_classes=3, dim=10, n=240)
    np.savez(tmp_path / "tr.npz", x=x[:180], y=y[:180])
    np.savez(tmp_path / "te.npz", x=x[180:], y=y[180:])
    out = tmp_path / "o.json"
    assert main(["simulate", "--train", str(tmp_path / "tr.npz"), "--test",
                 str(tmp_path / "te.npz"), "--clients", "3", "--alpha", "1", "--mode", "pooled",
                 "--heads", "lda,ridge", "--projection-dim", "5", "--projection-basis", fp,
                 "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["projection_dim"] == 5 and set(res["heads"]) == {"lda", "ridge"}
    assert main(["simulate", "--train", str(tmp_path / "tr.npz"), "--test",
                 str(tmp_path / "te.npz"), "--clients", "3", "--alpha", "1", "--mode", "pooled",
                 "--projection-dim", "5", "--projection-basis", "default"]) == 2
    assert "needs the encoder's fingerprint" in capsys.readouterr().err


def test_experiment_config_projection_key() -> None:
    from ghofl.bench.config import config_from_dict

    cfg = config_from_dict({"datasets": ["cifar10"], "projection": "pca",
                            "projection_dims": [64]})
    assert cfg.projection == "pca" and cfg.projection_dims == (64,)
    assert config_from_dict({"datasets": ["cifar10"]}).projection == "random"
    with pytest.raises(ConfigError, match="projection must be 'random' or 'pca'; got 'svd'"):
        config_from_dict({"datasets": ["cifar10"], "projection": "svd"})
