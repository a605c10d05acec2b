"""Your own encoder end to end (issue 20): two clients' image folders -> ``client-stats
--encoder onnx:<file>`` (and ``torchscript:<file>``) -> ``aggregate`` -> ``fit --heads all`` ->
``predict`` on new images -> ``export`` of every head; plain ONNX Runtime on the decoded uint8
images gives ``predict``'s labels and probabilities. Then the refusals: another model file, a
missing one, a corrupt one."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from tests.helpers_cli import main_ok as _ok
from tests.helpers_data import layout_files, make_image_folder

pytest.importorskip("torch", reason="model-file encoders need torch")
pytest.importorskip("onnx", reason="export needs onnx")
ort = pytest.importorskip("onnxruntime", reason="model-file encoders need onnxruntime")
pytest.importorskip("PIL", reason="image decoding needs Pillow")

from tests.helpers_models import RawNet, onnx_model, script  # noqa: E402

CLASSES = ("cat", "dog")
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
#: the most ONNX Runtime's probabilities may differ from ``ghofl predict``'s
TOL = 1e-4


def _model(kind: str, folder: Path, seed: int = 0) -> Path:
    """ONNX: float NCHW at 12x12 with ImageNet normalisation (images are 10x10, so the graph
    resizes); TorchScript: the raw uint8 images, no contract (dynamic image size)."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "torchscript":
        return script(RawNet(seed), folder / "net.pt")
    (folder / "net.json").write_text(json.dumps({"size": 12, **IMAGENET}))
    return onnx_model(folder / "net.onnx", seed)


def _fail(args: list[Any], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _run(args: list[Any]) -> None:
    assert main([str(a) for a in args]) == 0, args


def _fitted(root: Path, kind: str, heads: str) -> tuple[Path, Path]:
    """(model directory, model file): two clients' statistics aggregated and fitted."""
    model = _model(kind, root / "clients-model")
    for i in range(2):
        files = {k.partition("/")[2]: v
                 for k, v in layout_files(CLASSES, 8, (10, 10), seed=i).items()}
        site = make_image_folder(root / f"site{i}", files)
        _run(["client-stats", "--data", site, "--encoder", f"{kind}:{model}", "--out",
              root / f"site{i}.ghs", "--classes", ",".join(CLASSES)])
    _run(["aggregate", root / "site0.ghs", root / "site1.ghs", "--out", root / "total.ghs"])
    _run(["fit", root / "total.ghs", "--heads", heads, "--out", root / "model"])
    return root / "model", model


def _decoded(folder: Path, ids: list[str]) -> np.ndarray:
    """The images as the export docs say to feed them: RGB uint8, stacked (N, H, W, 3)."""
    from PIL import Image

    return np.stack([np.asarray(Image.open(folder / i).convert("RGB"), dtype=np.uint8)
                     for i in ids])


@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
def test_onnx_runtime_on_the_export_matches_predict(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    model_dir, clients_file = _fitted(tmp_path, kind, "all")
    # "another machine": the model file lives elsewhere, under another name
    here = tmp_path / "here" / f"encoder{clients_file.suffix}"
    here.parent.mkdir()
    shutil.copyfile(clients_file, here)
    shutil.rmtree(clients_file.parent)
    new = make_image_folder(tmp_path / "new", {
        k.partition("/")[2]: v for k, v in layout_files(CLASSES, 4, (10, 10), seed=7).items()})
    heads = json.loads((model_dir / "manifest.json").read_text())["heads"]
    assert len(heads) >= 10
    recorded = json.loads((model_dir / "manifest.json").read_text())["stats"]["encoder"]
    size = ["--image-size", "10x10"] if kind == "onnx" else []  # torchscript: dynamic
    deltas = {}
    for head in heads:
        out = tmp_path / f"{head}.csv"
        _ok(["predict", model_dir, "--data", new, "--out", out, "--head", head,
             "--encoder-file", here], capsys)
        onnx_file = tmp_path / f"{head}.onnx"
        assert "encoder + head graph" in _ok(
            ["export", model_dir, "--head", head, "--out", onnx_file, "--encoder-file", here,
             *size], capsys)
        rows = list(csv.DictReader(out.open(encoding="utf-8")))
        sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        proba, label = sess.run(["probabilities", "label"],
                                {"images": _decoded(new, [r["id"] for r in rows])})
        want = np.array([[float(r[f"p_{c}"]) for c in CLASSES] for r in rows])
        deltas[head] = float(np.abs(proba - want).max())
        assert deltas[head] <= TOL, (head, deltas[head])
        assert [CLASSES[i] for i in label] == [r["label"] for r in rows], head
        props = sess.get_modelmeta().custom_metadata_map
        assert json.loads(props["ghofl.encoder"]) == recorded
        assert props["ghofl.head"] == head
    print(f"max |dp| ORT vs predict ({kind}):", json.dumps(deltas))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(model directory fitted with onnx:net, its model file, new images)."""
    root = tmp_path_factory.mktemp("byo")
    model_dir, model = _fitted(root, "onnx", "nb,lda")
    new = make_image_folder(root / "new", {
        k.partition("/")[2]: v for k, v in layout_files(CLASSES, 2, (10, 10), seed=9).items()})
    return model_dir, model, new


def _predict(model_dir: Path, new: Path, tmp_path: Path, *extra: Any) -> list[Any]:
    return ["predict", model_dir, "--data", new, "--out", tmp_path / "p.csv", *extra]


def _export(model_dir: Path, tmp_path: Path, *extra: Any) -> list[Any]:
    return ["export", model_dir, "--head", "lda", "--out", tmp_path / "m.onnx",
            "--image-size", "10x10", *extra]


def test_the_model_file_is_found_by_its_recorded_name(
    fitted: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model_dir, model, new = fitted
    monkeypatch.chdir(tmp_path)
    line = _fail(_predict(model_dir, new, tmp_path), capsys)
    assert re.search(r"encoder 'onnx:net', whose model file is not here.*--encoder-file PATH",
                     line), line
    line = _fail(_export(model_dir, tmp_path), capsys)
    assert re.search(r"model file is not here.*--encoder-file PATH", line), line
    shutil.copyfile(model, tmp_path / "net.onnx")  # onnx:net -> ./net.onnx
    _ok(_predict(model_dir, new, tmp_path), capsys)
    _ok(_export(model_dir, tmp_path), capsys)
    _ok(["evaluate", model_dir, "--data", new, "--encoder-file", model], capsys)


@pytest.mark.parametrize("command", ["predict", "export"])
def test_another_or_a_corrupt_model_file_is_refused(
    command: str, fitted: tuple[Path, Path, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model_dir, _, new = fitted
    args = (_predict(model_dir, new, tmp_path) if command == "predict"
            else _export(model_dir, tmp_path))
    fp = json.loads((model_dir / "manifest.json").read_text())["stats"]["encoder"]
    other = _model("onnx", tmp_path / "other", seed=1)  # same architecture, other weights
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(other.read_bytes()[:100])
    found = {other: r"fingerprint [0-9a-f]{16}",
             corrupt: r"no fingerprint: ghofl cannot load it as onnx:PATH with the recorded contract"}
    for bad, what in found.items():
        line = _fail([*args, "--encoder-file", bad], capsys)
        assert re.search(
            rf"fitted with encoder 'onnx:net' \(fingerprint [0-9a-f]{{16}}, model file "
            rf"SHA-256 {fp['weights_hash'][:16]}\), but '.*{bad.name}' has SHA-256 "
            rf"[0-9a-f]{{16}} \({what}\): another or a corrupt file; give the model file the "
            r"clients used with --encoder-file PATH", line), line
    line = _fail([*args, "--encoder-file", tmp_path / "missing.onnx"], capsys)
    assert re.search(r"--encoder-file '.*missing\.onnx' does not exist", line), line
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "m.onnx").exists()


def test_a_corrupt_model_file_is_refused_by_client_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    files = {k.partition("/")[2]: v for k, v in layout_files(CLASSES, 2, (10, 10)).items()}
    site = make_image_folder(tmp_path / "site", files)
    (tmp_path / "net.onnx").write_bytes(b"\x08\x07garbage")
    line = _fail(["client-stats", "--data", site, "--encoder", f"onnx:{tmp_path}/net.onnx",
                  "--out", tmp_path / "a.ghs", "--classes", ",".join(CLASSES)], capsys)
    assert re.search(r"ONNX Runtime cannot load '.*net\.onnx'.*give a valid \.onnx", line), line


def test_encoder_file_where_it_does_not_apply(
    fitted: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    model_dir, model, _ = fitted
    line = _fail(["export", model_dir, "--head", "lda", "--out", tmp_path / "m.onnx",
                  "--head-only", "--encoder-file", model], capsys)
    assert "--encoder-file applies to the full graph only" in line
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.zeros((2, 4), np.float32))
    line = _fail(["predict", model_dir, "--data", npz, "--out", tmp_path / "p.csv",
                  "--encoder-file", model], capsys)
    assert "embeddings input needs no encoder, so drop it" in line
