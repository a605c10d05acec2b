"""The OOD threshold from the clients' held-out rows on the command line (issue 45).

``evaluate --local`` files carry the histogram of the clients' OOD scores; ``evaluate --report
TOTAL.ghe --update-card MODEL`` sets the model's threshold from it (calibration "federated"),
after which ``predict`` flags ``ood``; ``simulate --federated-eval`` reports the same
calibration; ``predict`` and the exported graph of a model-file encoder (``onnx:`` and
``torchscript:``) agree on ``ood_score``, and on ``ood`` once calibrated."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.heads.ood import score_histogram
from ghofl.model.directory import MANIFEST, load_model, load_ood
from ghofl.stats import compute_stats, save_stats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import main_ok, write_npz

C, D = 3, 5


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A model fitted from statistics alone, three clients' held-out archives, train/test."""
    x, y = gaussian_mixture(3, num_classes=C, dim=D, n=600, sep=1.5)
    write_npz(tmp_path / "train.npz", x[:300], y[:300])
    write_npz(tmp_path / "test.npz", x[300:360], y[300:360])
    save_stats(compute_stats(x[:300], y[:300], C, "full"), tmp_path / "total.ghs")
    assert main(["fit", str(tmp_path / "total.ghs"), "--heads", "nb,lda", "--out",
                 str(tmp_path / "model")]) == 0
    for i, idx in enumerate(np.array_split(np.arange(360, 600), 3)):
        write_npz(tmp_path / f"held{i}.npz", x[idx], y[idx])
    return tmp_path


def _fails(args: list[Any], capsys: Any, match: str) -> None:
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert match in err, err


def test_report_update_card_calibrates_from_the_clients_histograms(ws: Path,
                                                                   capsys: Any) -> None:
    for i in range(3):
        main_ok(["evaluate", ws / "model", "--embeddings", ws / f"held{i}.npz", "--local",
                 "--out", ws / f"c{i}.ghe"], capsys)
    main_ok(["aggregate-eval", *(ws / f"c{i}.ghe" for i in range(3)), "--out",
             ws / "total.ghe"], capsys)
    assert json.loads((ws / "model" / MANIFEST).read_text())["ood"]["calibration"] == "none"
    out = main_ok(["evaluate", "--report", ws / "total.ghe", "--update-card", ws / "model",
                   "--ood-fpr", "0.1"], capsys)
    assert "from 240 held-out rows of 3 clients at false-positive rate 0.1 (federated " \
        "histogram)" in out
    _, manifest = load_model(ws / "model")  # still signed: the digest was recomputed
    entry = manifest["ood"]
    assert entry["calibration"] == "federated" and entry["fpr"] == 0.1
    assert entry["n_calibration"] == 240 and entry["rule"].startswith("federated: ")
    ood = load_ood(ws / "model", manifest)
    assert ood is not None and ood.threshold_ == entry["threshold"]
    held = np.concatenate([np.load(ws / f"held{i}.npz")["x"] for i in range(3)])
    scores = ood.score(held)
    edges = ood.bin_edges()
    counts = score_histogram(scores, edges)
    cum = np.cumsum(counts)
    assert entry["threshold"] == edges[int(np.searchsorted(cum, 217))]  # r = ceil(241·0.9)
    assert float(np.mean(scores > entry["threshold"])) <= 0.1
    card = (ws / "model" / "MODEL_CARD.md").read_text()
    assert "calibrated on 240 held-out in-distribution items of the clients" in card
    main_ok(["predict", ws / "model", "--data", ws / "test.npz", "--out", ws / "p.jsonl"],
            capsys)
    rows = [json.loads(line) for line in (ws / "p.jsonl").read_text().splitlines()]
    assert [r["ood"] for r in rows] == [r["ood_score"] > entry["threshold"] for r in rows]


def test_report_ood_refusals(ws: Path, capsys: Any) -> None:
    main_ok(["evaluate", ws / "model", "--embeddings", ws / "held0.npz", "--local", "--out",
             ws / "c0.ghe"], capsys)
    _fails(["evaluate", "--report", ws / "c0.ghe", "--ood-fpr", "0.1"], capsys,
           "with --report, --ood-fpr is the rate of the OOD threshold that --update-card "
           "sets; add --update-card MODEL_DIR")
    _fails(["evaluate", "--report", ws / "c0.ghe", "--calibrate-ood"], capsys,
           "--calibrate-ood calibrates on --embeddings or --data rows; with --report, "
           "--update-card sets the OOD threshold from the clients' histogram")
    before = (ws / "model" / MANIFEST).read_text()
    _fails(["evaluate", "--report", ws / "c0.ghe", "--update-card", ws / "model",
            "--ood-fpr", "0.01"], capsys, "needs at least 99 in-distribution rows; got 80")
    assert (ws / "model" / MANIFEST).read_text() == before  # refused before any write


def test_simulate_reports_the_federated_ood_calibration(ws: Path, capsys: Any) -> None:
    out = main_ok(["simulate", "--train", ws / "train.npz", "--test", ws / "test.npz",
                   "--clients", "4", "--alpha", "1", "--seed", "2", "--heads", "lda",
                   "--federated-eval", "--eval-fraction", "0.3", "--json", ws / "s.json"],
                  capsys)
    fed = json.loads((ws / "s.json").read_text())["federated_evaluation"]
    ood = fed["ood"]
    assert ood["calibration"] == "federated" and ood["n"] == fed["n"] and ood["fpr"] == 0.05
    assert 0 <= ood["held_out_flagged"] <= 0.05 and ood["threshold"] > 0
    assert f"OOD threshold {ood['threshold']:.6g} calibrated from the clients' score " \
        f"histograms ({ood['n']} held-out rows" in out


# ------------------------------------------------------------ model-file encoders
@pytest.mark.parametrize("kind", ["onnx", "torchscript"])
def test_model_file_export_outputs_ood_score_and_flag_like_predict(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any,
) -> None:
    pytest.importorskip("PIL", reason="image decoding needs Pillow")
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from tests.helpers_data import layout_files, make_image_folder
    from tests.integration.test_byo_export_cli import CLASSES, _decoded, _fitted

    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    model_dir, model_file = _fitted(tmp_path, kind, "lda")
    here = tmp_path / f"encoder{model_file.suffix}"
    shutil.copyfile(model_file, here)
    new = make_image_folder(tmp_path / "new", {
        k.partition("/")[2]: v for k, v in layout_files(CLASSES, 4, (10, 10), seed=7).items()})
    size = ["--image-size", "10x10"] if kind == "onnx" else []
    for calibrated in (False, True):
        out, onnx_file = tmp_path / f"p{calibrated}.csv", tmp_path / f"m{calibrated}.onnx"
        main_ok(["predict", model_dir, "--data", new, "--out", out, "--encoder-file", here],
                capsys)
        main_ok(["export", model_dir, "--out", onnx_file, "--encoder-file", here, *size],
                capsys)
        rows = list(csv.DictReader(out.open(encoding="utf-8")))
        sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        got = dict(zip(names, sess.run(None, {"images": _decoded(new, [r["id"] for r in rows])}),
                       strict=True))
        np.testing.assert_allclose(got["ood_score"], [float(r["ood_score"]) for r in rows],
                                   atol=1e-4, rtol=1e-6)
        assert ("ood" in names) is calibrated and ("ood" in rows[0]) is calibrated
        if calibrated:
            assert got["ood"].tolist() == [r["ood"] == "true" for r in rows]
            continue
        for i in range(2):  # the clients' own image folders, labelled: federated evaluation
            main_ok(["evaluate", model_dir, "--data", tmp_path / f"site{i}", "--local",
                     "--out", tmp_path / f"c{i}.ghe", "--encoder-file", here], capsys)
        main_ok(["aggregate-eval", tmp_path / "c0.ghe", tmp_path / "c1.ghe", "--out",
                 tmp_path / "t.ghe"], capsys)
        main_ok(["evaluate", "--report", tmp_path / "t.ghe", "--update-card", model_dir,
                 "--ood-fpr", "0.25"], capsys)
