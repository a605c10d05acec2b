"""Your own encoder from the command line and the Flower client config: ``ghofl client-stats
--data <image folder> --encoder onnx:<file>`` (and ``torchscript:<file>``) on tiny models built
in a temporary folder, the payload's fingerprint, and two sites whose model files differ
refused by ``ghofl aggregate``."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.server.config import plan_from_config, plan_to_config
from ghofl.server.plan import FederationPlan
from ghofl.stats import load_stats
from tests.helpers_cli import main_ok as _ok
from tests.helpers_data import layout_files, make_image_folder

torch = pytest.importorskip("torch", reason="model-file encoders need torch")
pytest.importorskip("onnx", reason="model-file encoders need onnx")
pytest.importorskip("onnxruntime", reason="model-file encoders need onnxruntime")
pytest.importorskip("PIL", reason="image decoding needs Pillow")

from tests.helpers_models import PoolNet, RawNet, onnx_model, reference, script  # noqa: E402

CLASSES = ("cat", "dog")
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def _model(kind: str, folder: Path, seed: int) -> Path:
    """A tiny model of ``kind`` with its input contract (float NCHW, 12 px, ImageNet
    normalisation; TorchScript: the raw uint8 images, no contract)."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "torchscript":
        return script(RawNet(seed), folder / "net.pt")
    path = onnx_model(folder / "net.onnx", seed)
    (folder / "net.json").write_text(json.dumps({"size": 12, **IMAGENET}))
    return path


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict[str, Any]]:
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    files = {k.partition("/")[2]: v for k, v in layout_files(CLASSES, 3, (10, 10)).items()}
    return make_image_folder(tmp_path / "site", files), files


@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
def test_client_stats_with_a_model_file(
    kind: str, tmp_path: Path, site: tuple[Path, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    data, files = site
    model = _model(kind, tmp_path / "m0", seed=0)
    _ok(["client-stats", "--data", data, "--encoder", f"{kind}:{model}", "--out",
         tmp_path / "a.ghs", "--classes", ",".join(CLASSES)], capsys)
    stats = load_stats(tmp_path / "a.ghs")
    enc = stats.meta.encoder
    assert enc is not None and enc.name == f"{kind}:net" and enc.dim == 4
    assert enc.weights_hash == hashlib.sha256(model.read_bytes()).hexdigest()
    assert stats.counts.tolist() == [3, 3]
    for c, name in enumerate(CLASSES):
        imgs = np.stack([files[k] for k in sorted(files) if k.startswith(name + "/")])
        expected = (reference(imgs, 0, (12, 12), **IMAGENET) if kind == "onnx"
                    else reference(imgs, 0, None))
        np.testing.assert_allclose(stats.sums[c], expected.sum(axis=0), rtol=1e-4, atol=1e-4)

    # a second site with other weights: its payload is refused when summed
    other = _model(kind, tmp_path / "m1", seed=1)
    _ok(["client-stats", "--data", data, "--encoder", f"{kind}:{other}", "--out",
         tmp_path / "b.ghs", "--classes", ",".join(CLASSES)], capsys)
    rc = main(["aggregate", str(tmp_path / "a.ghs"), str(tmp_path / "b.ghs"), "--out",
               str(tmp_path / "t.ghs")])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(r"differ in encoder", err), err
    assert not (tmp_path / "t.ghs").exists()


def test_embed_names_a_missing_model_file(tmp_path: Path, site: tuple[Path, dict[str, Any]],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["embed", "--data", str(site[0]), "--encoder", f"onnx:{tmp_path}/none.onnx",
               "--out", str(tmp_path / "x.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert re.search(r"onnx model file '.*none\.onnx' does not exist", err[0]), err


def test_flower_client_config_takes_a_model_file(tmp_path: Path) -> None:
    model = script(PoolNet(0), tmp_path / "pool.pt")
    (tmp_path / "pool.json").write_text(json.dumps({"dtype": "float32", "size": 8}))
    job = plan_from_config({"classes": json.dumps(list(CLASSES)),
                            "encoder": f"torchscript:{model}"}).client
    info = job.encoder_info()
    assert info is not None and info.name == "torchscript:pool" and info.resolution == 8
    assert info == job.build_encoder().info
    assert plan_to_config(FederationPlan(job))["encoder"] == f"torchscript:{model}"
