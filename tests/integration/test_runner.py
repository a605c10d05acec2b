"""`ghofl run` end to end on a tiny ImageFolder zip made here, with the real EfficientNet-Lite0
weights (eager torch, 32 px) and a private cache dir; plus config errors through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers_data import make_image_zip

pytestmark = pytest.mark.slow

CLASSES = ("red", "green", "blue")


def _tinted_zip(path: Path, n_train: int = 24, n_test: int = 8) -> Path:
    """Images whose colour depends on the class, so heads can beat chance."""
    rng = np.random.default_rng(0)
    files: dict[str, np.ndarray] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        for c, name in enumerate(CLASSES):
            for i in range(n):
                img = rng.integers(0, 80, size=(16, 16, 3))
                img[..., c] += 150
                files[f"{split}/{name}/{i:03d}.png"] = img.astype(np.uint8)
    return make_image_zip(path, files, top="tiny")


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GHOFL_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "ghofl.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def tiny_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("run")
    data = _tinted_zip(tmp / "tiny.zip")
    cfg = tmp / "exp.toml"
    cfg.write_text(
        f'name = "tiny"\ndatasets = ["{data}"]\nencoders = ["efficientnet-lite0"]\n'
        'resolution = 32\nbackend = "torch"\nalphas = [0.1, 1.0]\nclients = [2, 5]\n'
        'seeds = [0]\nheads = ["nb", "lda", "qda", "fedcgs", "fishermix"]\n'
        'modes = ["full", "pooled"]\nprojection_dims = [48]\nreferences = ["sklearn_lda", "logreg"]\n'
        "[head_params.fishermix]\nepochs = 2\nn_per_class = 100\n"
    )
    out = tmp / "out"
    return out, _run(["run", "--config", str(cfg), "--out", str(out)], tmp)


def test_run_writes_results_tables_and_plots(
    tiny_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = tiny_run
    assert proc.returncode == 0, proc.stderr
    data = json.loads((out / "results.json").read_text())
    recs = data["records"]
    fed = [r for r in recs if r["mode"] != "reference"]
    # 2 modes x 2 alphas x 2 client counts x 1 seed; qda only in full mode
    assert len(fed) == 2 * 2 * (5 + 4)
    assert {r["head"] for r in recs if r["mode"] == "reference"} == {"sklearn_lda", "logreg"}
    for r in fed:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["projection_dim"] == 48
        assert r["upload_bytes_per_client"] < 3 * 48 * 49 * 8  # statistics live in the 48-d space
    md = (out / "results.md").read_text()
    assert "mode `full`" in md and "mode `pooled`" in md and "Partition invariance" in md
    assert len(list(out.glob("*.png"))) == 2


def test_run_is_partition_invariant(
    tiny_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = tiny_run
    recs = json.loads((out / "results.json").read_text())["records"]
    for head in ("nb", "lda", "qda", "fishermix"):
        for seed in (0,):
            accs = {
                r["accuracy"]
                for r in recs
                if r["head"] == head and r["seed"] == seed and r["mode"] == "full"
            }
            assert len(accs) == 1, (head, seed, accs)


def test_resume_skips_finished_federations(
    tiny_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = tiny_run
    cfg_path = next(out.parent.glob("exp.toml"))
    before = (out / "results.json").read_text()
    proc = _run(["run", "--config", str(cfg_path), "--out", str(out), "--resume"], out.parent)
    assert proc.returncode == 0, proc.stderr
    assert "mode=full" not in proc.stderr  # nothing re-run
    assert (
        json.loads(before)["records"] == json.loads((out / "results.json").read_text())["records"]
    )


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('datasets = ["cifar10"]\nalphas = [0]\n', r"alphas must be positive numbers; got 0.0"),
        ('datasets = ["cifar10"]\nheads = ["svm"]\n', r"unknown head 'svm' in 'heads'"),
        ('datasets = ["cifar10"]\ncolour = 1\n', r"unknown key\(s\) colour; valid keys:"),
        ("alphas = [0.1]\n", r"the key 'datasets' is required"),
        ("datasets = [\n", r"is not valid TOML"),
        (
            'datasets = ["trec"]\nencoders = ["efficientnet-lite0"]\n',
            r"dataset 'trec' is a text dataset but encoder 'efficientnet-lite0' is not a text encoder",
        ),
    ],
)
def test_bad_configs_fail_with_one_line(
    body: str, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import re

    from tests.helpers_data import make_text_data_dir

    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    monkeypatch.setenv("GHOFL_DATA_DIR", str(make_text_data_dir(tmp_path / "data")))
    proc = _run(["run", "--config", str(cfg), "--out", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert re.search(match, proc.stderr), proc.stderr
    assert not (tmp_path / "o" / "results.json").exists()
