"""``ghofl export``: head-only and encoder + head ONNX files, and the refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.heads import make_head
from ghofl.model.directory import load_model, save_model
from ghofl.stats import compute_stats
from ghofl.stats.meta import EncoderInfo
from tests.helpers import gaussian_mixture
from tests.helpers_cli import tree

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = gaussian_mixture(1, num_classes=3, dim=5, n=150)
    stats = compute_stats(x, y, ("a", "b", "c"), encoder=EncoderInfo("my-own-model", 5))
    heads = {n: make_head(n).fit_from_stats(stats) for n in ("nb", "lda", "qda")}
    return save_model(tmp_path_factory.mktemp("exp") / "model", heads, stats_meta=stats.meta)


def _run(model: Any, x: np.ndarray, input_name: str = "embeddings") -> list[Any]:
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return list(sess.run(["probabilities", "label"], {input_name: x}))


def test_head_only_export_runs_in_onnx_runtime(model_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "qda.onnx"
    assert main(["export", str(model_dir), "--head", "qda", "--out", str(out),
                 "--head-only"]) == 0
    assert f"wrote {out} (head-only graph" in capsys.readouterr().out
    heads, _ = load_model(model_dir)
    x = np.random.default_rng(0).normal(size=(20, 5)).astype(np.float32)
    proba, label = _run(out, x)
    np.testing.assert_allclose(proba, heads["qda"].predict_proba(x), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(label, heads["qda"].predict(x))
    import onnx

    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(props["ghofl.classes"]) == ["a", "b", "c"]
    assert props["ghofl.head"] == "qda"
    # --force replaces an existing file
    assert main(["export", str(model_dir), "--head", "lda", "--out", str(out), "--head-only",
                 "--force"]) == 0
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert props["ghofl.head"] == "lda"


BAD = [
    ("missing-head", ["--head", "ridge", "--out", "m.onnx", "--head-only"],
     r"has no head 'ridge'; its heads: nb, lda, qda"),
    ("extension", ["--head", "lda", "--out", "m.pt", "--head-only"],
     r"--out 'm.pt' must end in \.onnx"),
    ("exists", ["--head", "lda", "--out", "old.onnx", "--head-only"],
     r"--out 'old.onnx' already exists; pass --force"),
    ("no-onnx-path", ["--head", "lda", "--out", "m.onnx"],
     r"encoder 'my-own-model' has no ONNX path.*--head-only"),
    ("size-head-only", ["--head", "lda", "--out", "m.onnx", "--head-only", "--image-size", "32"],
     r"--image-size applies to the full graph only"),
    ("bad-size", ["--head", "lda", "--out", "m.onnx", "--image-size", "32x"],
     r"invalid image size '32x'; give H or HxW"),
]


@pytest.mark.parametrize(("args", "pattern"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_refusals_are_one_clear_line(model_dir: Path, tmp_path: Path, args: list[str],
                                     pattern: str, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.onnx").write_bytes(b"keep me")
    rc = main(["export", str(model_dir), *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and re.search(pattern, lines[0]), err
    assert tree(tmp_path) == ["old.onnx"] and (tmp_path / "old.onnx").read_bytes() == b"keep me"


@pytest.mark.slow
def test_full_graph_matches_encoder_and_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """EfficientNet-Lite0 (resolution 32) + LDA as one file, on decoded uint8 images."""
    pytest.importorskip("torch")
    pytest.importorskip("efficientnet_lite_pytorch")
    from ghofl.client.encoders import get_encoder
    from ghofl.client.transforms import apply_feature_transform, transformed_info

    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    try:
        encoder = get_encoder("efficientnet-lite0", resolution=32, cache_dir=tmp_path / "cache")
    except Exception as exc:  # weights package absent
        pytest.skip(f"efficientnet-lite0 is not available: {exc}")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(48, 32, 32, 3), dtype=np.uint8)
    y = np.arange(48) % 3
    feats = apply_feature_transform(encoder.embed(images), "sqrt")
    info = transformed_info(encoder.info, "sqrt")
    stats = compute_stats(feats, y, ("a", "b", "c"), mode="full", encoder=info)
    head = make_head("lda", shrinkage=0.5).fit_from_stats(stats)
    model = save_model(tmp_path / "model", {"lda": head}, stats_meta=stats.meta)
    out = tmp_path / "full.onnx"
    assert main(["export", str(model), "--head", "lda", "--out", str(out),
                 "--image-size", "32x32"]) == 0
    assert "encoder + head graph" in capsys.readouterr().out
    probe = rng.integers(0, 256, size=(6, 32, 32, 3), dtype=np.uint8)
    proba, label = _run(out, probe, "images")
    want = head.predict_proba(apply_feature_transform(encoder.embed(probe), "sqrt"))
    np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(label, np.argmax(want, axis=1))
