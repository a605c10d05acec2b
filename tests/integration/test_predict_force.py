"""``ghofl predict --force`` as ``ghofl export --force``, and ``ghofl evaluate --embeddings``
checking the encoder an archive of ``ghofl embed`` records, as ``predict`` does.

In process, on a model fitted from statistics of seeded embeddings (d = 3) with a recorded
encoder; the archives are written by hand in the layout ``ghofl embed`` writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.client.transforms import apply_feature_transform, transformed_info
from ghofl.heads import make_head
from ghofl.model.directory import save_model
from ghofl.stats import compute_stats
from ghofl.stats.meta import EncoderInfo
from tests.helpers import gaussian_mixture
from tests.helpers_cli import tree

CLASSES = ("a", "b", "c")
ENCODER = EncoderInfo("my-encoder", 3, "f" * 64, "my preprocessing", 32)


def _run(args: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    x, y = gaussian_mixture(seed, num_classes=3, dim=3, n=90)
    return np.abs(np.asarray(x, dtype=np.float32)) + 1.0, np.asarray(y)  # >= 0 for sqrt


def _model(root: Path, transform: str = "none") -> Path:
    x, y = _data(0)
    feats = apply_feature_transform(x, transform) if transform != "none" else x
    stats = compute_stats(feats, y, CLASSES, mode="full",
                          encoder=transformed_info(ENCODER, transform))
    heads = {n: make_head(n).fit_from_stats(stats) for n in ("lda", "nb")}
    return save_model(root / f"model-{transform}", heads, stats_meta=stats.meta)


def _embedded(path: Path, info: EncoderInfo | None, seed: int = 1) -> Path:
    """An archive as ``ghofl embed`` writes it (x, y, classes and the encoder record)."""
    x, y = _data(seed)
    arrays: dict[str, Any] = {"x": x, "y": y, "classes": np.asarray(CLASSES)}
    if info is not None:
        arrays["encoder"] = np.asarray(json.dumps(info.to_dict(), sort_keys=True))
    np.savez(path, **arrays)
    return path


def test_predict_refuses_an_existing_out_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path)
    data = _embedded(tmp_path / "x.npz", None)
    out = tmp_path / "p.csv"
    out.write_text("keep me\n", encoding="utf-8")
    before = tree(tmp_path)
    rc, _, err = _run(["predict", model, "--data", data, "--out", out], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert err == (f"ghofl: error: --out '{out}' already exists; pass --force to replace it, "
                   "or choose another path\n")
    assert out.read_text(encoding="utf-8") == "keep me\n" and tree(tmp_path) == before
    # --force replaces it
    rc, msg, _ = _run(["predict", model, "--data", data, "--out", out, "--force"], capsys)
    assert rc == 0 and f"wrote {out}: 90 predictions" in msg
    assert out.read_text(encoding="utf-8").startswith("id,label,p_a,p_b,p_c")
    # the same refusal, word for word, as ghofl export's
    onnx_out = tmp_path / "m.onnx"
    onnx_out.write_bytes(b"")
    rc, _, export_err = _run(["export", model, "--head", "lda", "--out", onnx_out,
                              "--head-only"], capsys)
    assert rc == 2 and export_err == err.replace(str(out), str(onnx_out))


def test_evaluate_refuses_embeddings_of_another_encoder_as_predict_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path)
    other = EncoderInfo("my-encoder", 3, "e" * 64, "my preprocessing", 32)  # other weights
    data = _embedded(tmp_path / "other.npz", other)
    rc, _, err = _run(["evaluate", model, "--embeddings", data], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert (f"ghofl: error: the local encoder 'my-encoder' has fingerprint "
            f"{other.fingerprint()}, but the model in '{model}' was fitted on embeddings of "
            f"encoder fingerprint {ENCODER.fingerprint()}") in err
    assert "they differ in weights_hash" in err
    rc, _, predict_err = _run(["predict", model, "--data", data, "--out", tmp_path / "p.csv"],
                              capsys)
    assert rc == 2 and predict_err == err  # the same message
    # the clients' encoder, and an archive without a record, are scored alike
    same = _embedded(tmp_path / "same.npz", ENCODER)
    plain = _embedded(tmp_path / "plain.npz", None)
    rc, same_out, _ = _run(["evaluate", model, "--embeddings", same], capsys)
    assert rc == 0
    rc, plain_out, _ = _run(["evaluate", model, "--embeddings", plain], capsys)
    assert rc == 0 and same_out == plain_out and "lda" in same_out


def test_evaluate_raw_embeddings_need_the_clients_feature_transform(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _model(tmp_path, "sqrt")
    data = _embedded(tmp_path / "raw.npz", ENCODER)  # raw encoder output, as embed writes it
    rc, _, err = _run(["evaluate", model, "--embeddings", data], capsys)
    assert rc == 2 and err == (f"ghofl: error: '{data}' holds raw my-encoder embeddings "
                               "(written by ghofl embed) and the clients applied "
                               "--feature-transform sqrt; pass --feature-transform sqrt\n")
    rc, _, predict_err = _run(["predict", model, "--data", data, "--out", tmp_path / "p.csv"],
                              capsys)
    assert rc == 2 and predict_err == err
    rc, out, _ = _run(["evaluate", model, "--embeddings", data, "--feature-transform", "sqrt"],
                      capsys)
    assert rc == 0 and "lda" in out and "nb" in out
