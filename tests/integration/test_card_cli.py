"""The model in use through the CLI (issue 45): ``fit --license``, ``evaluate --update-card``
(test data and federated sums), the card's front matter read by Hugging Face's parser, the
default head used by ``predict`` and ``export``, and a head served without the others' files.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.evaluation.federated import local_evaluation, report, save_evaluation
from ghofl.model.card import CARD_FILE
from ghofl.model.directory import MANIFEST, load_model
from ghofl.model.manifest import manifest_digest
from ghofl.stats import compute_stats, save_stats
from tests.helpers_cli import write_npz

CLASSES = ("a", "b", "c")


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n)
    means = np.array([[0.0, 0, 0, 0], [2.0, 0, 1, 0], [0.0, 2, 0, 1]])
    return means[y] + rng.standard_normal((y.size, 4)), y


def _run(args: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """nb, lda and qda fitted from statistics with a held-out section, licence MIT."""
    x, y = _data(60, 0)
    stats = compute_stats(x, y, CLASSES, mode="full", holdout_fraction=0.3)
    save_stats(stats, tmp_path / "total.ghs")
    write_npz(tmp_path / "test.npz", *_data(40, 1))
    rc, _, err = _run(["fit", tmp_path / "total.ghs", "--heads", "nb,lda,qda", "--license",
                       "MIT", "--out", tmp_path / "m"], capsys)
    assert rc == 0, err
    assert "default head: " in err
    return tmp_path / "m"


def _card_data(path: Path) -> dict[str, Any]:
    """The card's metadata, read by huggingface_hub when installed, else by PyYAML."""
    text = path.read_text(encoding="utf-8")
    if importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub import ModelCard

        card = ModelCard.load(path)
        assert ModelCard(text).data.to_dict() == card.data.to_dict()
        return dict(card.data.to_dict())
    yaml = pytest.importorskip("yaml", reason="needs huggingface_hub or PyYAML")
    return dict(yaml.safe_load(text.split("---\n")[1]))


def test_evaluate_update_card_records_the_table_and_keeps_the_model_signed(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _card_data(model / CARD_FILE)
    assert before["license"] == "MIT" and before["library_name"] == "ghofl"
    assert "model-index" not in before
    rc, out, err = _run(["evaluate", model, "--embeddings", tmp_path / "test.npz",
                         "--update-card"], capsys)
    assert rc == 0, err
    assert "recorded the evaluation" in err and "accuracy" in out
    loaded = load_model(model)  # re-signed: the digest still verifies
    manifest = loaded.manifest
    assert manifest["digest"] == manifest_digest(manifest)
    (entry,) = manifest["evaluations"]
    x, y = _data(40, 1)
    want = report(local_evaluation(loaded, x, y))
    assert entry["kind"] == "test" and entry["n"] == 120
    for head in ("nb", "lda", "qda"):
        for key in ("accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece"):
            assert entry["heads"][head][key] == pytest.approx(want[head][key])
    data = _card_data(model / CARD_FILE)
    assert data["license"] == "MIT"
    metrics = data["model-index"][0]["results"][0]["metrics"]
    acc = [m["value"] for m in metrics if m["name"] == "accuracy (lda)"]
    assert acc == [pytest.approx(want["lda"]["accuracy"])]
    text = (model / CARD_FILE).read_text()
    assert "| head | accuracy | balanced accuracy | macro-F1 | log-loss | ECE |" in text
    # the same data again replaces its entry
    assert _run(["evaluate", model, "--embeddings", tmp_path / "test.npz", "--update-card"],
                capsys)[0] == 0
    assert len(load_model(model).manifest["evaluations"]) == 1


def test_federated_report_is_recorded_as_federated(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = load_model(model)
    parts = [local_evaluation(loaded, *_data(20, s)) for s in (3, 4)]
    save_evaluation(tmp_path / "total.ghe", parts[0] + parts[1])
    rc, out, err = _run(["evaluate", "--report", tmp_path / "total.ghe", "--update-card",
                         model], capsys)
    assert rc == 0, err
    assert "balanced" in out or "lda" in out
    (entry,) = load_model(model).manifest["evaluations"]
    assert entry["kind"] == "federated" and entry["clients"] == 2 and entry["n"] == 120
    assert "Federated evaluation (sums of 2 clients' held-out rows" in (
        model / CARD_FILE).read_text()
    rc, _, err = _run(["evaluate", "--report", tmp_path / "total.ghe", model], capsys)
    assert rc == 2
    assert "a model directory only with --update-card, to record the federated evaluation" in err
    rc, _, err = _run(["evaluate", "--report", tmp_path / "total.ghe", "--update-card"], capsys)
    assert rc == 2 and "--report --update-card records the federated evaluation in a model: " \
        "give its directory" in err


def test_an_unsigned_model_stays_unsigned_after_update(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = json.loads((model / MANIFEST).read_text())
    del manifest["digest"]
    (model / MANIFEST).write_text(json.dumps(manifest))
    args = ["evaluate", model, "--embeddings", tmp_path / "test.npz", "--update-card"]
    rc, _, err = _run(args, capsys)
    assert rc == 2 and "lacks its digest" in err
    rc, _, err = _run([*args, "--allow-unsigned-model"], capsys)
    assert rc == 0, err
    assert "loading the unsigned model" in err
    written = json.loads((model / MANIFEST).read_text())
    assert "digest" not in written and written["evaluations"]
    rc, _, err = _run(["evaluate", model, "--embeddings", tmp_path / "test.npz"], capsys)
    assert rc == 2 and "lacks its digest" in err


def test_predict_and_export_use_the_default_head_and_say_so(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = load_model(model).manifest
    default = manifest["default_head"]
    assert manifest["default_head_rule"].startswith(
        "best estimated accuracy on the clients' held-out statistics (lda ")
    rc, out, err = _run(["predict", model, "--data", tmp_path / "test.npz", "--out",
                         tmp_path / "p.csv"], capsys)
    assert rc == 0, err
    assert err.strip().splitlines()[-1].startswith(
        f"used head {default!r}, the model's default head (best estimated")
    assert f"with head {default!r}" in out
    if importlib.util.find_spec("onnx") is not None:
        rc, out, err = _run(["export", model, "--head-only", "--out", tmp_path / "m.onnx"],
                            capsys)
        assert rc == 0, err
        assert f"head {default}" in out and "the model's default head" in err


def test_help_states_the_default_head_rule(capsys: pytest.CaptureFixture[str]) -> None:
    for cmd in ("predict", "fit"):
        rc, out, _ = _run([cmd, "--help"], capsys)
        assert rc == 0
        flat = " ".join(out.replace("│", " ").split())
        assert "otherwise lda when fitted" in flat, cmd


def test_a_head_loads_without_the_others(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (model / "lda.ghh").unlink()
    rc, out, err = _run(["predict", model, "--data", tmp_path / "test.npz", "--head", "nb",
                         "--out", tmp_path / "p.csv"], capsys)
    assert rc == 0, err
    rc, _, err = _run(["predict", model, "--data", tmp_path / "test.npz", "--head", "lda",
                       "--out", tmp_path / "q.csv"], capsys)
    assert rc == 2
    assert err.strip().splitlines()[-1].startswith(
        "ghofl: error: head 'lda' is listed in the manifest, but its file 'lda.ghh' is "
        "missing from the model directory")
    rc, out, err = _run(["evaluate", model, "--embeddings", tmp_path / "test.npz"], capsys)
    assert rc == 0, err
    assert "head 'lda' not evaluated: its file 'lda.ghh' is missing" in err
    assert "nb" in out and "qda" in out and "lda" not in out
    rc, _, err = _run(["evaluate", model, "--embeddings", tmp_path / "test.npz", "--head",
                       "lda"], capsys)
    assert rc == 2 and "its file 'lda.ghh' is missing" in err
    # a present file that differs from its sha256 is still refused, for every head
    (model / "qda.ghh").write_bytes((model / "nb.ghh").read_bytes())
    rc, _, err = _run(["predict", model, "--data", tmp_path / "test.npz", "--head", "nb",
                       "--out", tmp_path / "r.csv"], capsys)
    assert rc == 2 and "qda" in err


def test_fit_refuses_a_license_that_is_not_spdx(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x, y = _data(20, 0)
    save_stats(compute_stats(x, y, CLASSES, mode="full"), tmp_path / "t.ghs")
    rc, _, err = _run(["fit", tmp_path / "t.ghs", "--license", "my licence!", "--out",
                       tmp_path / "m"], capsys)
    assert rc == 2
    assert "--license 'my licence!' is not an SPDX licence identifier" in err
