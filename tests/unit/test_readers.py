"""ImageFolder readers (directory and zip), torchvision loader plumbing, registry, subsample."""

from __future__ import annotations

import importlib.machinery
import multiprocessing
import pickle
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ghofl.data.images import ArrayImageSource, ImageFolderSource, load_torchvision_dataset
from ghofl.data.registry import available_datasets, default_data_dir, load_dataset, subsample
from ghofl.errors import ConfigError, DataError, MissingExtraError
from tests.helpers_data import (
    encode_png,
    layout_files,
    make_image_folder,
    make_image_zip,
    random_images,
    real_cifar_zip,
)

pytest.importorskip("PIL", reason="image decoding needs Pillow (install ghofl[torch])")


@pytest.fixture
def files() -> dict[str, np.ndarray]:
    return layout_files(classes=("dog", "cat", "bird"), n_per_class=3, size=(8, 6))


def _expected(files: dict[str, np.ndarray]) -> tuple[list[str], np.ndarray, np.ndarray]:
    keys = sorted(files, key=lambda k: (k.split("/")[1], k))
    classes = sorted({k.split("/")[1] for k in files})
    labels = np.array([classes.index(k.split("/")[1]) for k in keys])
    return classes, labels, np.stack([files[k] for k in keys])


def test_directory_layout_is_read_in_sorted_class_order(tmp_path: Path, files: dict) -> None:
    src = ImageFolderSource(make_image_folder(tmp_path / "ds", files), "train")
    classes, labels, images = _expected(files)
    assert src.classes == ("bird", "cat", "dog") == tuple(classes)
    assert src.labels.dtype == np.int64
    np.testing.assert_array_equal(src.labels, labels)
    batch = src.load_batch(np.arange(len(src)))
    assert batch.dtype == np.uint8 and batch.shape == (9, 8, 6, 3)
    np.testing.assert_array_equal(batch, images)


def test_zip_layout_matches_directory_layout(tmp_path: Path, files: dict) -> None:
    src_dir = ImageFolderSource(make_image_folder(tmp_path / "ds", files), "train")
    src_zip = ImageFolderSource(make_image_zip(tmp_path / "ds.zip", files, top="ds"), "train")
    assert src_zip.is_zip and src_zip.classes == src_dir.classes
    np.testing.assert_array_equal(src_zip.labels, src_dir.labels)
    idx = [8, 0, 4]
    np.testing.assert_array_equal(src_zip.load_batch(idx), src_dir.load_batch(idx))
    assert src_zip.members[0] == "ds/train/bird/000.png"


def test_zip_without_top_folder_and_split_none(tmp_path: Path, files: dict) -> None:
    flat = {k.removeprefix("train/"): v for k, v in files.items()}
    src = ImageFolderSource(make_image_zip(tmp_path / "flat.zip", flat, top=""), split=None)
    assert src.classes == ("bird", "cat", "dog") and len(src) == 9


def test_zip_is_read_in_place_without_extracting(tmp_path: Path, files: dict) -> None:
    path = make_image_zip(tmp_path / "ds.zip", files)
    ImageFolderSource(path, "train").load_batch(range(9))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.zip"]


def test_source_survives_pickling_and_reopens_the_archive(tmp_path: Path, files: dict) -> None:
    src = ImageFolderSource(make_image_zip(tmp_path / "ds.zip", files), "train")
    first = src.load_batch([1, 2])
    clone = pickle.loads(pickle.dumps(src))
    assert clone._zip is None
    np.testing.assert_array_equal(clone.load_batch([1, 2]), first)


def _load_two(src: ImageFolderSource) -> np.ndarray:
    return src.load_batch([0, 5])


@pytest.mark.skipif(sys.platform != "linux", reason="fork start method is Linux-only here")
def test_archive_is_reopened_in_a_forked_worker(tmp_path: Path, files: dict) -> None:
    src = ImageFolderSource(make_image_zip(tmp_path / "ds.zip", files), "train")
    expected = src.load_batch([0, 5])  # parent opened the archive before forking
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply(_load_two, (src,))
    np.testing.assert_array_equal(got, expected)


def test_missing_path_names_the_path_and_the_env_var(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nowhere\.zip' does not exist.*GHOFL_DATA_DIR"):
        ImageFolderSource(tmp_path / "nowhere.zip", "train")


def test_missing_split_lists_found_folders(tmp_path: Path, files: dict) -> None:
    path = make_image_zip(tmp_path / "ds.zip", files)
    with pytest.raises(DataError, match=r"split folder 'val' was not found.*found folders"):
        ImageFolderSource(path, "val")
    with pytest.raises(DataError, match=r"split folder 'test' was not found in directory"):
        ImageFolderSource(make_image_folder(tmp_path / "d", files), "test")


def test_empty_class_folder_is_an_error_in_a_directory(tmp_path: Path, files: dict) -> None:
    root = make_image_folder(tmp_path / "ds", files, empty_dirs=["train/empty"])
    with pytest.raises(DataError, match=r"class folder 'empty' .* contains no images"):
        ImageFolderSource(root, "train")


def test_empty_class_folder_is_an_error_in_a_zip(tmp_path: Path, files: dict) -> None:
    path = make_image_zip(tmp_path / "ds.zip", files, empty_dirs=["train/empty"])
    with pytest.raises(DataError, match=r"class folder 'empty' .* contains no images"):
        ImageFolderSource(path, "train")


def test_non_image_files_are_ignored(tmp_path: Path, files: dict) -> None:
    raw: dict[str, np.ndarray | bytes] = dict(files)
    raw["train/cat/README.md"] = b"not an image"
    raw["README.md"] = b"top-level readme"
    assert len(ImageFolderSource(make_image_zip(tmp_path / "ds.zip", raw), "train")) == 9


def test_corrupt_image_names_the_member_inside_the_archive(tmp_path: Path, files: dict) -> None:
    raw: dict[str, np.ndarray | bytes] = dict(files)
    raw["train/cat/001.png"] = encode_png(files["train/cat/001.png"])[:40]  # truncated
    src = ImageFolderSource(make_image_zip(tmp_path / "ds.zip", raw), "train")
    i = src.members.index("ds/train/cat/001.png")
    with pytest.raises(DataError, match=r"'ds/train/cat/001\.png' inside archive .* corrupt"):
        src.load_batch([i])
    src.load_batch([0])  # the other files still decode


def test_image_of_another_size_names_file_and_expected_size(tmp_path: Path, files: dict) -> None:
    files = dict(files)
    files["train/dog/002.png"] = random_images(1, (10, 6), seed=5)[0]
    src = ImageFolderSource(make_image_zip(tmp_path / "ds.zip", files), "train")
    i = src.members.index("ds/train/dog/002.png")
    with pytest.raises(DataError, match=r"dog/002\.png' .* is 10x6 .* images are 8x6"):
        src.load_batch([0, i])
    resized = ImageFolderSource(tmp_path / "ds.zip", "train", resize=(8, 6))
    assert resized.load_batch([0, i]).shape == (2, 8, 6, 3)


def test_grayscale_images_are_converted_to_rgb(tmp_path: Path) -> None:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.full((4, 4), 77, np.uint8), mode="L").save(buf, format="PNG")
    path = make_image_zip(tmp_path / "g.zip", {"train/a/0.png": buf.getvalue()})
    batch = ImageFolderSource(path, "train").load_batch([0])
    assert batch.shape == (1, 4, 4, 3) and (batch == 77).all()


def test_file_that_is_not_a_zip_is_rejected(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.zip"
    bogus.write_bytes(b"hello")
    with pytest.raises(DataError, match="neither a directory nor a zip archive"):
        ImageFolderSource(bogus, "train")


def test_out_of_range_indices_are_a_config_error(tmp_path: Path, files: dict) -> None:
    src = ImageFolderSource(make_image_zip(tmp_path / "ds.zip", files), "train")
    with pytest.raises(ConfigError, match=r"must lie in \[0, 9\)"):
        src.load_batch([9])


def test_array_source_validates_its_inputs() -> None:
    imgs = random_images(4)
    src = ArrayImageSource(imgs, np.array([0, 1, 1, 0]), ("a", "b"))
    np.testing.assert_array_equal(src.load_batch([2, 0]), imgs[[2, 0]])
    with pytest.raises(DataError, match=r"labels must lie in \[0, 2\)"):
        ArrayImageSource(imgs, np.array([0, 1, 2, 0]), ("a", "b"))
    with pytest.raises(DataError, match=r"uint8 array of shape \(n, H, W, 3\)"):
        ArrayImageSource(imgs.astype(np.float32), np.zeros(4), ("a",))  # type: ignore[arg-type]


def test_torchvision_loader_names_the_vision_extra_when_absent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(MissingExtraError, match=r"ghofl\[vision\]"):
        load_torchvision_dataset("cifar10", tmp_path, "train")


def _fake_torchvision_datasets(fail: bool) -> types.ModuleType:
    class CIFAR10:
        classes = ("airplane", "automobile")

        def __init__(self, root: str, train: bool, download: bool) -> None:
            if fail:
                raise RuntimeError("Dataset not found or corrupted.")
            self.data = random_images(3, (32, 32), seed=int(train))
            self.targets = [0, 1, 1]

    tv = types.ModuleType("torchvision")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    tv.datasets = types.SimpleNamespace(CIFAR10=CIFAR10, CIFAR100=CIFAR10)  # type: ignore[attr-defined]
    return tv


def test_torchvision_loader_returns_an_in_memory_uint8_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision_datasets(fail=False))
    src = load_torchvision_dataset("cifar10", tmp_path, "test")
    assert src.classes == ("airplane", "automobile")
    assert src.load_batch([0, 1, 2]).shape == (3, 32, 32, 3)
    np.testing.assert_array_equal(src.labels, [0, 1, 1])


def test_torchvision_loader_offline_error_names_data_dir_and_layout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", _fake_torchvision_datasets(fail=True))
    with pytest.raises(DataError, match=r"pass download=True.*GHOFL_DATA_DIR.*<split>/<class>"):
        load_torchvision_dataset("cifar10", tmp_path, "train")
    with pytest.raises(ConfigError, match="must be one of cifar10, cifar100, svhn"):
        load_torchvision_dataset("mnist", tmp_path, "train")


def test_registry_resolves_cifar10_from_data_dir_and_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: dict
) -> None:
    make_image_zip(tmp_path / "cifar10.zip", {**files, **layout_files(split="test")}, "cifar10")
    src = load_dataset("cifar10", "test", data_dir=tmp_path)
    assert isinstance(src, ImageFolderSource) and src.name == "cifar10" and len(src) == 6
    monkeypatch.setenv("GHOFL_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    assert len(load_dataset("cifar10", "train")) == 9


def test_registry_missing_data_dir_names_env_var_and_known_datasets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GHOFL_DATA_DIR", raising=False)
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))  # no downloaded archive
    assert default_data_dir() is None
    with pytest.raises(DataError, match=r"no data directory was given; set the GHOFL_DATA_DIR"):
        load_dataset("trec", "train")
    # cifar10 may also come from the python archive in the cache (see test_cifar_archive.py)
    with pytest.raises(DataError, match=r"GHOFL_DATA_DIR is not set, so there is no cifar10\.zip "
                       r"\(ImageFolder\), cifar-10-python\.tar\.gz nor cifar-10-batches-py/"):
        load_dataset("cifar10", "train")
    with pytest.raises(DataError, match=r"'.*' holds neither cifar10\.zip \(ImageFolder\), "
                       r"cifar-10-python\.tar\.gz nor cifar-10-batches-py/; `ghofl demo` "
                       r"downloads the archive by itself, or download https://"):
        load_dataset("cifar10", "train", data_dir=tmp_path)


def test_registry_unknown_name_lists_known_names(tmp_path: Path) -> None:
    assert available_datasets() == ("cifar10", "trec", "sst2", "agnews", "tiny-imagenet")
    with pytest.raises(DataError, match=r"'imagenet' is neither a known name \(cifar10, trec"):
        load_dataset("imagenet", "train", data_dir=tmp_path)


def test_registry_accepts_a_zip_path(tmp_path: Path, files: dict) -> None:
    path = make_image_zip(tmp_path / "mine.zip", files)
    assert len(load_dataset(path, "train")) == 9


def test_subsample_per_class_is_stratified_sorted_and_seeded() -> None:
    y = np.repeat(np.arange(3), [10, 5, 2])
    idx = subsample(y, per_class=4, seed=1)
    assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(np.bincount(y[idx]), [4, 4, 2])
    np.testing.assert_array_equal(idx, subsample(y, per_class=4, seed=1))
    assert not np.array_equal(idx, subsample(y, per_class=4, seed=2))


def test_subsample_fraction_keeps_at_least_one_per_class() -> None:
    y = np.repeat(np.arange(3), [10, 5, 1])
    np.testing.assert_array_equal(np.bincount(y[subsample(y, fraction=0.2)]), [2, 1, 1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of per_class"),
        ({"per_class": 2, "fraction": 0.5}, "exactly one of per_class"),
        ({"per_class": 0}, "per_class must be a positive integer"),
        ({"fraction": 1.5}, r"fraction must lie in \(0, 1\]"),
    ],
)
def test_subsample_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        subsample(np.zeros(4, dtype=np.int64), **kwargs)


@pytest.mark.realdata
def test_real_cifar10_zip_reads_in_place() -> None:
    path = real_cifar_zip()
    if path is None:
        pytest.skip("cifar10.zip not found: set GHOFL_DATA_DIR to the folder holding it")
    src = ImageFolderSource(path, "test")
    assert len(src) == 10_000 and src.classes[:3] == ("airplane", "automobile", "bird")
    np.testing.assert_array_equal(np.bincount(src.labels), np.full(10, 1000))
    batch = src.load_batch(np.arange(0, 10_000, 500))
    assert batch.shape == (20, 32, 32, 3) and batch.dtype == np.uint8
    assert zipfile.is_zipfile(path)
