"""``--encoder hf:DIR`` end to end on a tiny local BERT: ``client-stats --data`` for two sites,
``aggregate``, ``fit``, ``evaluate --data`` and ``predict`` on raw text (the model's recorded
encoder ``hf:<folder name>`` rebuilt from the folder of that name), ``embed``; a site whose
weights differ refused by ``aggregate``; the Flower client config's ``encoder`` key."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.server.config import plan_from_config, plan_to_config
from ghofl.server.plan import FederationPlan
from ghofl.stats import load_stats
from tests.helpers_cli import main_ok as _ok

pytest.importorskip("torch", reason="hf: encoders need torch (install ghofl[text])")
pytest.importorskip("transformers", reason="hf: encoders need transformers (ghofl[text])")
pytest.importorskip("sentence_transformers", reason="needs sentence-transformers (ghofl[text])")

from tests.helpers_text_models import tiny_bert

CLASSES = ("pets", "colours")
TOPICS = {"pets": ("cat", "dog", "bird", "fish"), "colours": ("red", "blue", "green")}


def _lines(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        for label, words in TOPICS.items():
            picked = " ".join(rng.choice(words, size=3))
            out.append(f"{label} the {picked} {'runs' if i % 2 else 'sleeps'}")
    return out


@pytest.fixture
def sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for k in range(2):
        (tmp_path / f"site{k}.txt").write_text("\n".join(_lines(6, k)) + "\n", encoding="utf-8")
    (tmp_path / "test.txt").write_text("\n".join(_lines(4, 9)) + "\n", encoding="utf-8")
    return tmp_path


def test_two_sites_aggregate_fit_evaluate_predict(
        sites: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tiny_bert(sites / "tinybert", seed=0)
    classes = ",".join(CLASSES)
    for k in range(2):
        _ok(["client-stats", "--data", f"site{k}.txt", "--encoder", f"hf:{model}", "--classes",
             classes, "--out", f"s{k}.ghs"], capsys)
    enc = load_stats(Path("s0.ghs")).meta.encoder
    assert enc is not None and enc.name == "hf:tinybert" and enc.dim == 16
    assert enc.resolution is None and "mean pooling" in enc.preprocessing
    _ok(["aggregate", "s0.ghs", "s1.ghs", "--out", "total.ghs"], capsys)
    assert load_stats(Path("total.ghs")).n_samples == 24
    _ok(["fit", "total.ghs", "--heads", "nb,lda", "--out", "model"], capsys)

    # the model records hf:tinybert; run from the folder holding it, it is rebuilt from there
    _ok(["evaluate", "model", "--data", "test.txt", "--json", "scores.json"], capsys)
    found = re.findall(r'"accuracy": ([0-9.]+)', Path("scores.json").read_text())
    assert found and min(float(a) for a in found) >= 0.75  # chance: 1/2
    texts = ["the fish bird cat sleeps", "the red blue green runs", "the dog dog fish runs"]
    Path("new.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    _ok(["predict", "model", "--data", "new.txt", "--out", "p.jsonl"], capsys)
    rows = [json.loads(line) for line in Path("p.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["1", "2", "3"]
    assert [r["label"] for r in rows] == ["pets", "colours", "pets"]

    _ok(["embed", "--data", "site0.txt", "--encoder", f"hf:{model}", "--out", "e.npz"], capsys)
    with np.load("e.npz") as z:
        assert z["x"].shape == (12, 16) and json.loads(str(z["encoder"]))["name"] == enc.name


def test_a_site_with_other_weights_is_refused(
        sites: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ours = tiny_bert(sites / "a" / "tinybert", seed=0)
    theirs = tiny_bert(sites / "b" / "tinybert", seed=1)  # same name, other weights
    for k, folder in enumerate((ours, theirs)):
        _ok(["client-stats", "--data", f"site{k}.txt", "--encoder", f"hf:{folder}", "--classes",
             ",".join(CLASSES), "--out", f"s{k}.ghs"], capsys)
    rc = main(["aggregate", "s0.ghs", "s1.ghs", "--out", "t.ghs"])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(r"differ in encoder", err), err
    assert not Path("t.ghs").exists()


def test_missing_folder_is_one_line(sites: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["client-stats", "--data", "site0.txt", "--encoder", "hf:./none", "--out",
               "x.ghs"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "model folder 'none' does not exist" in err[0], err


def test_flower_client_config_takes_an_hf_folder(tmp_path: Path) -> None:
    model = tiny_bert(tmp_path / "tinybert", seed=0)
    job = plan_from_config({"classes": json.dumps(list(CLASSES)), "encoder": f"hf:{model}"}).client
    info = job.encoder_info()
    assert info is not None and info.name == "hf:tinybert" and info.resolution is None
    assert info == job.build_encoder().info
    assert plan_to_config(FederationPlan(job))["encoder"] == f"hf:{model}"


def test_predict_elsewhere_needs_the_folder_and_checks_it(
        sites: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On another machine the recorded ``hf:tinybert`` is found by --encoder-file DIR (its
    fingerprint checked) or inside the model directory; another model's folder is refused."""
    model = tiny_bert(sites / "clients" / "tinybert", seed=0)
    other = tiny_bert(sites / "other" / "tinybert", seed=1)
    _ok(["client-stats", "--data", "site0.txt", "--encoder", f"hf:{model}", "--classes",
         ",".join(CLASSES), "--out", "s0.ghs"], capsys)
    _ok(["fit", "s0.ghs", "--heads", "lda", "--out", "model"], capsys)
    elsewhere = sites / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "new.txt").write_text("the cat dog runs\nthe red blue sleeps\n", "utf-8")
    monkeypatch.chdir(elsewhere)
    args = ["predict", str(sites / "model"), "--data", "new.txt", "--out", "p.csv"]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and re.search(r"cannot be loaded here .*--encoder-file PATH", err), err
    assert not Path("p.csv").exists()
    rc = main([*args, "--encoder-file", str(other)])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(r"has fingerprint \w+, but the model", err), err
    assert not Path("p.csv").exists()
    _ok([*args, "--encoder-file", str(model)], capsys)
    assert len(Path("p.csv").read_text().splitlines()) == 3
    # a model directory that ships its encoder folder needs no flag
    import shutil

    shutil.copytree(model, sites / "model" / "tinybert")
    Path("p.csv").unlink()
    _ok(args, capsys)
    assert len(Path("p.csv").read_text().splitlines()) == 3


@pytest.mark.parametrize("head", ["lda", "qda", "ridge"])
def test_export_of_a_plain_transformers_folder_matches_predict(
        sites: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        head: str) -> None:
    """hf: plain transformers folder (mean pooling) → full text graph from token ids, run by
    plain ONNX Runtime with the tokenizer file beside it: predict's labels and probabilities;
    from another folder the model folder is given by --encoder-file."""
    ort = pytest.importorskip("onnxruntime")
    tokenizers = pytest.importorskip("tokenizers")
    model = tiny_bert(sites / "clients" / "tinybert", seed=0)
    for k in range(2):
        _ok(["client-stats", "--data", f"site{k}.txt", "--encoder", f"hf:{model}", "--classes",
             ",".join(CLASSES), "--out", f"s{k}.ghs"], capsys)
    _ok(["aggregate", "s0.ghs", "s1.ghs", "--out", "total.ghs"], capsys)
    _ok(["fit", "total.ghs", "--heads", head, "--out", "model"], capsys)
    texts = ["the fish bird cat sleeps", "the red blue green runs", "a dog", "green green"]
    Path("new.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    elsewhere = sites / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    m = str(sites / "model")
    rc = main(["export", m, "--head", head, "--out", "g.onnx"])
    assert rc == 2 and "--encoder-file PATH" in capsys.readouterr().err
    out = _ok(["export", m, "--head", head, "--out", "g.onnx", "--encoder-file", str(model)],
              capsys)
    assert "g.tokenizer.json" in out
    _ok(["predict", m, "--data", str(sites / "new.txt"), "--out", "p.jsonl", "--encoder-file",
         str(model)], capsys)
    rows = [json.loads(line) for line in Path("p.jsonl").read_text().splitlines()]
    want = np.array([[r[f"p_{c}"] for c in CLASSES] for r in rows])
    enc = tokenizers.Tokenizer.from_file("g.tokenizer.json").encode_batch(texts)
    feeds = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
             "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}
    proba, label = ort.InferenceSession("g.onnx", providers=["CPUExecutionProvider"]).run(
        ["probabilities", "label"], feeds)
    np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
    assert [CLASSES[i] for i in label] == [r["label"] for r in rows]
