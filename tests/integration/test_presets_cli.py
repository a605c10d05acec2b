"""Issue 10: ``--preset`` on ``ghofl simulate`` / ``ghofl fit`` and the config key ``preset``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghofl.bench.config import config_from_dict
from ghofl.errors import ConfigError
from tests.helpers import gaussian_mixture
from tests.helpers_cli import run_cli, write_npz


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("presets")
    x, y = gaussian_mixture(0, num_classes=3, dim=5, n=400)
    write_npz(root / "train.npz", x[:300], y[:300])
    write_npz(root / "test.npz", x[300:], y[300:])
    return root


def _simulate(ws: Path, *extra: str) -> dict[str, object]:
    out = ws / f"out{len(extra)}{abs(hash(extra))}.json"
    r = run_cli("simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                "--clients", "3", "--alpha", "1.0", "--heads", "nb,lda,qda", "--json", out, *extra, cwd=ws)
    assert r.returncode == 0, r.stderr
    data: dict[str, object] = json.loads(out.read_text())
    return data


def test_simulate_preset_paper_and_param_override(ws: Path) -> None:
    heads = _simulate(ws, "--preset", "paper", "--param", "qda.shrinkage=0.3")["heads"]
    assert heads["lda"]["params"]["shrinkage"] == 0.05  # type: ignore[index]
    assert heads["qda"]["params"]["shrinkage"] == 0.3  # type: ignore[index]
    assert heads["nb"]["params"] == {"var_smoothing": 0.0, "var_floor": 1e-6}  # type: ignore[index]
    default = _simulate(ws)["heads"]
    assert default["lda"]["params"]["shrinkage"] == "auto"  # type: ignore[index]


def test_fit_preset_and_unknown_preset(ws: Path) -> None:
    r = run_cli("client-stats", "--embeddings", ws / "train.npz", "--out", ws / "t.ghs",
                "--mode", "full", "--num-classes", "3", cwd=ws)
    assert r.returncode == 0, r.stderr
    r = run_cli("fit", ws / "t.ghs", "--heads", "lda", "--preset", "paper", "--out",
                ws / "model", cwd=ws)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((ws / "model" / "manifest.json").read_text())
    assert manifest["heads"]["lda"]["params"]["shrinkage"] == 0.05
    r = run_cli("fit", ws / "t.ghs", "--heads", "lda", "--preset", "fast", "--out",
                ws / "model2", cwd=ws)
    assert r.returncode == 2
    assert "unknown preset 'fast'; available presets: default, paper" in r.stderr
    assert not (ws / "model2").exists()


def test_experiment_config_preset_key() -> None:
    cfg = config_from_dict({"datasets": ["cifar10"], "preset": "paper"})
    assert cfg.preset == "paper"
    assert config_from_dict({"datasets": ["cifar10"]}).preset == "default"
    with pytest.raises(ConfigError, match="unknown preset 'x'; available presets"):
        config_from_dict({"datasets": ["cifar10"], "preset": "x"})
