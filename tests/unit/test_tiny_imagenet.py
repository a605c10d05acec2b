"""Tiny-ImageNet reader: official layout from a zip (in place) or a folder, the full archive's
extras, split aliases, every corrupt-layout error, the registry name and paths, and the runner."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.data.registry import available_datasets, dataset_splits, load_dataset
from ghofl.data.tiny_imagenet import (
    TinyImageNetSource,
    find_tiny_imagenet_root,
    is_tiny_imagenet,
)
from ghofl.errors import ConfigError, DataError
from tests.helpers_data import (
    layout_files,
    make_image_zip,
    real_data_dir,
    tiny_imagenet_files,
    write_files,
)

WNIDS = ("n02000002", "n01000001", "n03000003")  # wnids.txt order; classes are sorted
SORTED = tuple(sorted(WNIDS))
TOP = "tiny-imagenet-200"


def _make(tmp_path: Path, kind: str, files: dict[str, bytes] | None = None) -> Path:
    """The layout as a zip with/without its top folder, the folder, or the folder above it."""
    files = tiny_imagenet_files(WNIDS) if files is None else files
    if kind == "zip":
        return make_image_zip(tmp_path / "tiny-imagenet-200.zip", dict(files), top=TOP)
    if kind == "zip-flat":
        return make_image_zip(tmp_path / "flat.zip", dict(files), top="")
    write_files(tmp_path / TOP, files)
    return tmp_path / TOP if kind == "folder" else tmp_path


@pytest.mark.parametrize("kind", ["zip", "zip-flat", "folder", "parent"])
def test_reads_both_splits_with_sorted_wnid_labels(tmp_path: Path, kind: str) -> None:
    path = _make(tmp_path, kind)
    train = TinyImageNetSource(path, "train")
    assert train.classes == SORTED and len(train) == 6
    np.testing.assert_array_equal(train.labels, [0, 0, 1, 1, 2, 2])
    assert train.class_names == tuple(f"name of {w}" for w in SORTED)
    assert [m.rsplit("/", 1)[1] for m in train.members[:2]] == [
        f"{SORTED[0]}_0.JPEG",
        f"{SORTED[0]}_1.JPEG",
    ]
    test = TinyImageNetSource(path, "test")
    assert len(test) == 6 and test.classes == SORTED
    # val_j is labelled WNIDS[j % 3]; its class index is that wnid's sorted position
    np.testing.assert_array_equal(test.labels, [SORTED.index(WNIDS[j % 3]) for j in range(6)])
    batch = test.load_batch([0, 5])
    assert batch.shape == (2, 8, 8, 3) and batch.dtype == np.uint8
    assert test.name == "tiny-imagenet" and test.image_shape == (8, 8)


@pytest.mark.parametrize("kind", ["zip", "folder"])
def test_full_official_archive_layout(tmp_path: Path, kind: str) -> None:
    """Boxes files and the unlabelled test/ folder are ignored; files sort naturally."""
    ids = (499, 10, 0, 123, 7)
    files = tiny_imagenet_files(WNIDS, train_ids=ids, n_val=12, official=True)
    if kind == "zip":  # with the directory entries the official zip has
        dirs = ("", "train", *(f"train/{w}/images" for w in WNIDS), "val/images", "test/images")
        path = make_image_zip(tmp_path / "t.zip", dict(files), top=TOP, empty_dirs=dirs)
    else:
        path = _make(tmp_path, kind, files)
    train = TinyImageNetSource(path, "train")
    assert len(train) == 15 and np.bincount(train.labels).tolist() == [5, 5, 5]
    names = [m.rsplit("/", 1)[1] for m in train.members[:5]]
    assert names == [f"{SORTED[0]}_{i}.JPEG" for i in sorted(ids)]
    test = TinyImageNetSource(path, "test")
    assert [m.rsplit("/", 1)[1] for m in test.members] == [f"val_{j}.JPEG" for j in range(12)]
    assert not any("test/" in m for m in (*train.members, *test.members))


@pytest.mark.parametrize("alias", ["val", "validation"])
def test_val_aliases_mean_the_labelled_test_split(tmp_path: Path, alias: str) -> None:
    path = _make(tmp_path, "zip")
    a, b = TinyImageNetSource(path, "test"), TinyImageNetSource(path, alias)
    assert a.members == b.members
    np.testing.assert_array_equal(a.labels, b.labels)


def test_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Tiny-ImageNet has splits train and test .* got split 'dev'"):
        TinyImageNetSource(_make(tmp_path, "zip"), "dev")


def test_words_txt_is_optional(tmp_path: Path) -> None:
    files = tiny_imagenet_files(WNIDS)
    del files["words.txt"]
    assert TinyImageNetSource(_make(tmp_path, "zip", files)).class_names == SORTED


def test_source_pickles_and_reads_after(tmp_path: Path) -> None:
    src = TinyImageNetSource(_make(tmp_path, "zip"), "train")
    first = src.load_batch([3])
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone.load_batch([3]), first)
    src.close()


def _edit(change: str) -> dict[str, bytes]:
    files = tiny_imagenet_files(WNIDS)
    ann = files["val/val_annotations.txt"].decode()
    if change == "no-wnids":
        del files["wnids.txt"]
    elif change == "empty-wnids":
        files["wnids.txt"] = b"\n\n"
    elif change == "bad-wnid":
        files["wnids.txt"] += b"goldfish\n"
    elif change == "dup-wnid":
        files["wnids.txt"] += b"n01000001\n"
    elif change == "no-annotations":
        del files["val/val_annotations.txt"]
    elif change == "unknown-wnid":
        files["val/val_annotations.txt"] = ann.replace(WNIDS[0], "n04444444", 1).encode()
    elif change == "missing-image":
        del files["val/images/val_4.JPEG"]
    elif change == "unlabelled-image":
        files["val/val_annotations.txt"] = "".join(ann.splitlines(True)[:-1]).encode()
    elif change == "twice":
        files["val/val_annotations.txt"] = (ann + ann.splitlines(True)[0]).encode()
    elif change == "malformed":
        files["val/val_annotations.txt"] = (ann + "val_0.JPEG only\n").encode()
    elif change == "extra-class":
        files["train/n05555555/images/n05555555_0.JPEG"] = files[
            f"train/{WNIDS[0]}/images/{WNIDS[0]}_0.JPEG"
        ]
    elif change == "empty-class":
        for i in (0, 1):
            del files[f"train/{WNIDS[2]}/images/{WNIDS[2]}_{i}.JPEG"]
    return files


@pytest.mark.parametrize(
    ("change", "split", "match"),
    [
        ("no-wnids", "train", r"holds no wnids.txt, so it is not Tiny-ImageNet; re-extract"),
        ("empty-wnids", "train", r"wnids.txt in .* is empty; it must list one wnid per line"),
        ("bad-wnid", "train", r"holds 'goldfish', which is not a WordNet id"),
        ("dup-wnid", "test", r"lists 'n01000001' twice"),
        ("no-annotations", "test", r"has no val/val_annotations.txt in its Tiny-ImageNet folder"),
        (
            "unknown-wnid",
            "test",
            r"line 1 of val/val_annotations.txt .* labels val_0.JPEG with wnid 'n04444444', "
            r"which wnids.txt does not list; use the wnids.txt and annotations of the same",
        ),
        ("missing-image", "test", r"line 5 of .* names val/images/val_4.JPEG, which does not exist"),
        ("unlabelled-image", "test", r"1 image\(s\) in val/images .* no line in .* \(first: val_5.JPEG\)"),
        ("twice", "test", r"labels val_0.JPEG twice \(line 7\)"),
        ("malformed", "test", r"line 7 of val/val_annotations.txt .* is malformed"),
        (
            "extra-class",
            "train",
            r"class folder train/n05555555/, which wnids.txt does not list; add the wnid",
        ),
        (
            "empty-class",
            "train",
            r"no training images for 1 of the 3 wnids of wnids.txt \(first: train/n03000003/images",
        ),
    ],
)
@pytest.mark.parametrize("kind", ["zip", "folder"])
def test_corrupt_layouts_name_the_problem_and_the_fix(
    tmp_path: Path, kind: str, change: str, split: str, match: str
) -> None:
    path = _make(tmp_path, kind, _edit(change))
    if change == "no-wnids" and kind == "folder":
        match = r"holds no wnids.txt \(nor does any folder directly inside it\)"
    with pytest.raises(DataError, match=match):
        TinyImageNetSource(path, split)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"Tiny-ImageNet path '.*nowhere.zip' does not exist"):
        TinyImageNetSource(tmp_path / "nowhere.zip")
    (tmp_path / "notzip.zip").write_bytes(b"plain bytes")
    with pytest.raises(DataError, match=r"is neither a directory nor a zip archive; re-extract"):
        TinyImageNetSource(tmp_path / "notzip.zip")
    deep = make_image_zip(tmp_path / "deep.zip", tiny_imagenet_files(WNIDS), top="a/b")
    with pytest.raises(DataError, match=r"only at 'a/b/wnids.txt', deeper than one folder"):
        TinyImageNetSource(deep)
    for name in ("x", "y"):
        write_files(tmp_path / "two" / name, tiny_imagenet_files(WNIDS))
    with pytest.raises(DataError, match=r"holds several Tiny-ImageNet folders \(x, y\)"):
        TinyImageNetSource(tmp_path / "two")


def test_corrupt_image_is_named(tmp_path: Path) -> None:
    files = tiny_imagenet_files(WNIDS)
    files["val/images/val_2.JPEG"] = b"not a jpeg"
    src = TinyImageNetSource(_make(tmp_path, "zip", files), "test")
    with pytest.raises(DataError, match=r"'tiny-imagenet-200/val/images/val_2.JPEG' inside .* is corrupt"):
        src.load_batch([2])


def test_detection(tmp_path: Path) -> None:
    assert find_tiny_imagenet_root(_make(tmp_path, "zip")) == "tiny-imagenet-200/"
    assert find_tiny_imagenet_root(_make(tmp_path, "zip-flat")) == ""
    assert find_tiny_imagenet_root(_make(tmp_path, "parent")) == "tiny-imagenet-200/"
    assert find_tiny_imagenet_root(tmp_path / TOP) == ""
    other = make_image_zip(tmp_path / "folder.zip", dict(layout_files()), top="ds")
    assert not is_tiny_imagenet(other) and not is_tiny_imagenet(tmp_path / "missing")


# ----------------------------------------------------------------------- registry and runner
@pytest.mark.parametrize("kind", ["zip", "folder"])
def test_registry_by_name_and_by_path(tmp_path: Path, kind: str) -> None:
    _make(tmp_path, kind if kind == "zip" else "parent")
    assert "tiny-imagenet" in available_datasets()
    assert dataset_splits("tiny-imagenet") == ("train", "test")
    by_name = load_dataset("tiny-imagenet", "test", data_dir=tmp_path)
    assert isinstance(by_name, TinyImageNetSource) and len(by_name) == 6
    path = tmp_path / ("tiny-imagenet-200.zip" if kind == "zip" else TOP)
    by_path = load_dataset(str(path), "train")
    assert isinstance(by_path, TinyImageNetSource) and by_path.classes == SORTED
    # an ordinary ImageFolder zip is still read as one
    plain = make_image_zip(tmp_path / "plain.zip", dict(layout_files()), top="ds")
    assert type(load_dataset(str(plain), "train")).__name__ == "ImageFolderSource"


def test_registry_name_without_the_files(tmp_path: Path) -> None:
    with pytest.raises(
        DataError,
        match=r"dataset 'tiny-imagenet' expects '.*tiny-imagenet-200.zip' or a folder "
        r"'.*tiny-imagenet-200', neither of which exists",
    ):
        load_dataset("tiny-imagenet", "train", data_dir=tmp_path)


def _mean_rgb_encoder(*_args: Any, **_kw: Any) -> Any:
    from ghofl.client.encoders import CallableEncoder

    return CallableEncoder(
        lambda b: np.asarray(b, dtype=np.float32).mean(axis=(1, 2)),
        "mean-rgb",
        3,
        preprocessing="mean over pixels",
        resolution=8,
    )


@pytest.mark.parametrize("by", ["name", "zip", "folder"])
def test_runner_takes_tiny_imagenet_by_name_and_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    import ghofl.client.encoders as encoders
    from ghofl.bench.config import ExperimentConfig
    from ghofl.bench.runner import run_experiment

    files = tiny_imagenet_files(WNIDS, train_ids=range(4), n_val=9)
    data = tmp_path / "data"
    data.mkdir()
    zip_path = make_image_zip(data / "tiny-imagenet-200.zip", dict(files), top=TOP)
    folder = write_files(tmp_path / "extracted" / TOP, files)
    dataset = {"name": "tiny-imagenet", "zip": str(zip_path), "folder": str(folder)}[by]
    monkeypatch.setattr(encoders, "get_encoder", _mean_rgb_encoder)
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ExperimentConfig(
        datasets=(dataset,),
        data_dir=str(data),
        heads=("nb", "lda"),
        clients=(2,),
        references=("sklearn_lda",),
    )
    records = run_experiment(cfg, tmp_path / "out")
    fed = [r for r in records if r["mode"] != "reference"]
    assert {r["head"] for r in fed} == {"nb", "lda"}
    assert all(r["n_train"] == 12 and r["n_test"] == 9 for r in records)
    assert {r["dataset"] for r in records} == {dataset}
    assert (tmp_path / "out" / "results.json").is_file()


# ----------------------------------------------------------------------- the real archive
def test_real_archive_when_present() -> None:
    root = real_data_dir()
    if root is None or not (root / "tiny-imagenet-200.zip").is_file():
        pytest.skip("tiny-imagenet-200.zip is not in the data directory")
    train = load_dataset("tiny-imagenet", "train", data_dir=root)
    test = load_dataset("tiny-imagenet", "test", data_dir=root)
    assert isinstance(train, TinyImageNetSource) and isinstance(test, TinyImageNetSource)
    assert len(train.classes) == 200 and train.classes == test.classes
    assert len(test) == 10_000 and np.bincount(test.labels, minlength=200).tolist() == [50] * 200
    assert np.bincount(train.labels, minlength=200).min() >= 100
    assert train.class_names[train.classes.index("n01443537")].startswith("goldfish")
    assert test.load_batch([0]).shape == (1, 64, 64, 3)
