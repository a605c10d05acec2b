"""embed_dataset batching and the on-disk embedding cache (keys, hits, corruption, atomicity)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.cache import (
    cached_embeddings,
    default_cache_dir,
    embedding_cache_path,
    subset_key,
)
from ghofl.client.embed import dataset_key, embed_dataset, embed_dataset_cached
from ghofl.client.encoders import CallableEncoder
from ghofl.data.images import ArrayImageSource
from ghofl.data.text import TextDataset
from ghofl.errors import ConfigError
from ghofl.stats.meta import EncoderInfo
from tests.helpers_data import layout_files, make_image_zip, random_images


def _mean_rgb(resolution: int | None = None) -> CallableEncoder:
    return CallableEncoder(
        lambda b: np.asarray(b, dtype=np.float32).mean(axis=(1, 2)),
        "mean-rgb",
        3,
        preprocessing="mean over pixels",
        resolution=resolution,
    )


@pytest.fixture
def source() -> ArrayImageSource:
    return ArrayImageSource(random_images(10, (4, 4), seed=7), np.arange(10) % 3, ("a", "b", "c"))


class _Counter:
    """compute_fn that counts its calls."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.calls = 0
        self.x, self.y = x, y

    def __call__(self) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        return self.x, self.y


@pytest.fixture
def counter() -> _Counter:
    rng = np.random.default_rng(0)
    return _Counter(rng.normal(size=(6, 3)).astype(np.float32), np.arange(6) % 2)


# --------------------------------------------------------------------------- embed_dataset
@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_embed_dataset_is_independent_of_batch_size(
    source: ArrayImageSource, batch_size: int
) -> None:
    x, y = embed_dataset(source, _mean_rgb(), batch_size=batch_size)
    assert x.dtype == np.float32 and x.shape == (10, 3) and y.dtype == np.int64
    np.testing.assert_allclose(x, source.images.mean(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_array_equal(y, np.arange(10) % 3)


def test_embed_dataset_follows_the_given_indices(source: ArrayImageSource) -> None:
    idx = np.array([9, 2, 5])
    x, y = embed_dataset(source, _mean_rgb(), indices=idx, batch_size=2)
    np.testing.assert_allclose(x, source.images[idx].mean(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_array_equal(y, [0, 2, 2])
    x0, y0 = embed_dataset(source, _mean_rgb(), indices=np.array([], dtype=np.int64))
    assert x0.shape == (0, 3) and y0.shape == (0,)


def test_embed_dataset_rejects_bad_indices_and_batch_size(source: ArrayImageSource) -> None:
    with pytest.raises(ConfigError, match=r"indices must lie in \[0, 10\)"):
        embed_dataset(source, _mean_rgb(), indices=[10])
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        embed_dataset(source, _mean_rgb(), batch_size=0)


def test_embed_dataset_works_on_text() -> None:
    ds = TextDataset(["a", "bbb", "cc"], np.array([0, 1, 0]), ("x", "y"))
    enc = CallableEncoder(lambda b: np.array([[len(t)] for t in b]), "len", 1)
    x, y = embed_dataset(ds, enc, batch_size=2)
    np.testing.assert_array_equal(x[:, 0], [1, 3, 2])
    np.testing.assert_array_equal(y, [0, 1, 0])


def test_progress_bar_only_when_asked(
    source: ArrayImageSource, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm", reason="progress bars need tqdm (install ghofl[torch])")
    embed_dataset(source, _mean_rgb(), batch_size=4)
    assert capsys.readouterr() == ("", "")
    embed_dataset(source, _mean_rgb(), batch_size=4, progress=True)
    err = capsys.readouterr().err
    assert "10/10" in err and "item/s" in err


# --------------------------------------------------------------------------- cache
def test_default_cache_dir_honours_the_env_var(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("GHOFL_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "ghofl"


def test_cache_key_includes_dataset_split_fingerprint_and_subset(tmp_path: Path) -> None:
    enc = _mean_rgb(resolution=224)
    path = embedding_cache_path("cifar10", "train", enc, None, tmp_path)
    fp = enc.info.fingerprint()
    assert path == tmp_path / "embeddings/cifar10/train" / f"mean-rgb-r224-{fp}" / "all.npz"
    other_res = embedding_cache_path("cifar10", "train", _mean_rgb(resolution=160), None, tmp_path)
    assert other_res != path
    assert subset_key(np.array([1, 2])) == subset_key([1, 2]) != subset_key([2, 1])
    assert subset_key(None) == "all" and subset_key([1, 2]).startswith("sub-")
    assert "/" not in embedding_cache_path("../evil/x", "train", enc, None, tmp_path).parts[-4]


def test_second_call_is_served_from_the_cache(tmp_path: Path, counter: _Counter) -> None:
    info = EncoderInfo("enc", 3, "w", "p", 32)
    x1, _ = cached_embeddings("ds", "train", info, None, counter, cache_dir=tmp_path)
    x2, y2 = cached_embeddings("ds", "train", info, None, counter, cache_dir=tmp_path)
    assert counter.calls == 1
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y2, counter.y)
    assert y2.dtype == np.int64 and x2.dtype == np.float32
    # a subset of a split whose full embeddings are cached is sliced from them, not encoded
    xs, ys = cached_embeddings("ds", "train", info, np.array([4, 1]), counter, cache_dir=tmp_path)
    assert counter.calls == 1
    np.testing.assert_array_equal(xs, x1[[4, 1]])
    np.testing.assert_array_equal(ys, counter.y[[4, 1]])
    cached_embeddings("ds", "test", info, None, counter, cache_dir=tmp_path)
    assert counter.calls == 2
    cached_embeddings("ds", "test2", info, np.arange(3), counter, cache_dir=tmp_path)
    assert counter.calls == 3
    assert not list(tmp_path.rglob("*.tmp"))
    meta = json.loads(
        embedding_cache_path("ds", "train", info, None, tmp_path).with_suffix(".json").read_text()
    )
    assert meta["fingerprint"] == info.fingerprint() and meta["x_shape"] == [6, 3]


def test_a_source_whose_length_changed_is_embedded_again(tmp_path: Path) -> None:
    """A source keyed by its name alone: an entry of another length is replaced, not served."""
    enc = _mean_rgb()
    images = random_images(10, (4, 4), seed=3)
    small = ArrayImageSource(images[:4], np.arange(4) % 2, ("a", "b"), name="grows")
    big = ArrayImageSource(images, np.arange(10) % 2, ("a", "b"), name="grows")
    x4, _ = embed_dataset_cached(small, "test", enc, None, cache_dir=tmp_path)
    x10, y10 = embed_dataset_cached(big, "test", enc, None, cache_dir=tmp_path)
    assert x4.shape == (4, 3) and x10.shape == (10, 3) and len(y10) == 10
    np.testing.assert_array_equal(x10, embed_dataset(big, enc)[0])
    x10b, _ = embed_dataset_cached(big, "test", enc, None, cache_dir=tmp_path)
    np.testing.assert_array_equal(x10b, x10)


def _corrupt_npz(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _corrupt_json(path: Path) -> None:
    path.with_suffix(".json").write_text("{not json")


def _tamper_values(path: Path) -> None:
    with np.load(path) as npz:
        x, y = npz["x"] + 1.0, npz["y"]
    with open(path, "wb") as fh:
        np.savez(fh, x=x, y=y)


def _drop_sidecar(path: Path) -> None:
    path.with_suffix(".json").unlink()


@pytest.mark.parametrize("damage", [_corrupt_npz, _corrupt_json, _tamper_values, _drop_sidecar])
def test_damaged_cache_entry_is_recomputed_not_used(
    tmp_path: Path, counter: _Counter, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    info = EncoderInfo("enc", 3)
    cached_embeddings("ds", "train", info, None, counter, cache_dir=tmp_path)
    damage(embedding_cache_path("ds", "train", info, None, tmp_path))
    x, _ = cached_embeddings("ds", "train", info, None, counter, cache_dir=tmp_path)
    assert counter.calls == 2
    np.testing.assert_array_equal(x, counter.x)
    cached_embeddings("ds", "train", info, None, counter, cache_dir=tmp_path)
    assert counter.calls == 2  # rewritten intact


def test_compute_fn_with_wrong_shape_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"x of shape \(n, 4\).*got x \(6, 3\)"):
        cached_embeddings(
            "ds",
            "train",
            EncoderInfo("enc", 4),
            None,
            _Counter(np.zeros((6, 3)), np.zeros(6)),
            cache_dir=tmp_path,
        )


def test_embed_dataset_cached_opens_the_dataset_only_on_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("PIL", reason="image decoding needs Pillow (install ghofl[torch])")
    data = tmp_path / "data"
    data.mkdir()
    make_image_zip(data / "cifar10.zip", layout_files(split="test", size=(4, 4)), top="cifar10")
    kw: dict[str, Any] = {"data_dir": data, "cache_dir": tmp_path / "cache", "batch_size": 4}
    x1, y1 = embed_dataset_cached("cifar10", "test", _mean_rgb(), **kw)
    assert x1.shape == (6, 3) and y1.tolist() == [0, 0, 0, 1, 1, 1]

    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the dataset must not be opened on a cache hit")

    monkeypatch.setattr("ghofl.data.registry.load_dataset", fail)
    x2, _ = embed_dataset_cached("cifar10", "test", _mean_rgb(), **kw)
    np.testing.assert_array_equal(x1, x2)
    assert (tmp_path / "cache/embeddings/cifar10/test").is_dir()


def test_dataset_key_of_names_paths_and_sources(tmp_path: Path, source: ArrayImageSource) -> None:
    assert dataset_key("CIFAR10") == "cifar10"
    assert dataset_key(tmp_path / "mine.zip").startswith("mine-")
    assert dataset_key(source) == "array"
