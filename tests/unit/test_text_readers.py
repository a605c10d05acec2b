"""Text readers: TREC / SST-2 line files, the AG News CSV and its documented 80/20 split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.data.registry import load_dataset
from ghofl.data.text import (
    AGNEWS_CLASSES,
    TREC_CLASSES,
    TextDataset,
    read_agnews_csv,
    read_sst2,
    read_trec,
    split_agnews,
)
from ghofl.errors import ConfigError, DataError
from tests.helpers_data import make_text_data_dir, real_data_dir


def test_trec_numeric_and_coarse_string_labels_share_classes(tmp_path: Path) -> None:
    path = tmp_path / "trec.txt"
    path.write_text("0 How far ?\nDESC:manner How do you do ?\nNUM:date When ?\n5 How many ?\n")
    ds = read_trec(path, "train")
    assert ds.classes == TREC_CLASSES == ("DESC", "ENTY", "ABBR", "HUM", "LOC", "NUM")
    np.testing.assert_array_equal(ds.labels, [0, 0, 5, 5])
    assert ds.labels.dtype == np.int64
    assert ds.texts[1] == "How do you do ?"


def test_latin1_files_are_decoded(tmp_path: Path) -> None:
    path = tmp_path / "trec.txt"
    path.write_bytes("1 What is a caf\xe9 ?\n".encode("latin-1"))
    assert read_trec(path).texts == ["What is a café ?"]


def test_sst2_reads_binary_labels(tmp_path: Path) -> None:
    path = tmp_path / "sst"
    path.write_text("1 good film\n\n0 bad film\n")
    ds = read_sst2(path, "dev")
    assert ds.classes == ("negative", "positive") and ds.split == "dev"
    np.testing.assert_array_equal(ds.labels, [1, 0])
    assert ds.load_batch([1, 0]) == ["bad film", "good film"]


def test_malformed_line_names_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "sst"
    path.write_text("1 good\n0 bad\n7 what label\n")
    with pytest.raises(DataError, match=r"line 3 of '.*sst' is malformed"):
        read_sst2(path)
    path.write_text("1 good\n0\n")
    with pytest.raises(DataError, match=r"line 2 of .* malformed"):
        read_sst2(path)


def test_missing_file_names_the_env_var(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist.*GHOFL_DATA_DIR"):
        read_sst2(tmp_path / "nope")


def test_agnews_joins_title_and_description_and_maps_labels(tmp_path: Path) -> None:
    path = tmp_path / "ag.csv"
    path.write_text(
        'label,title,description\n3,Fears,"Unions say, they are disappointed"\n'
        '1,Multi,"line one\nline two"\n4,Space,Launch date\n'
    )
    ds = read_agnews_csv(path)
    assert ds.classes == AGNEWS_CLASSES == ("World", "Sports", "Business", "Sci/Tech")
    np.testing.assert_array_equal(ds.labels, [2, 0, 3])
    assert ds.texts[0] == "Fears. Unions say, they are disappointed"
    assert ds.texts[1] == "Multi. line one\nline two"


def test_agnews_wrong_header_is_reported_on_line_1(tmp_path: Path) -> None:
    path = tmp_path / "ag.csv"
    path.write_text("class,title,text\n1,a,b\n")
    with pytest.raises(
        DataError, match=r"line 1 of .* must be the header 'label,title,description'"
    ):
        read_agnews_csv(path)


@pytest.mark.parametrize("bad_row", ["2,only two fields", "5,title,label out of range"])
def test_agnews_malformed_row_names_its_line(tmp_path: Path, bad_row: str) -> None:
    path = tmp_path / "ag.csv"
    path.write_text(f'label,title,description\n1,a,"x\ny"\n{bad_row}\n')
    with pytest.raises(DataError, match=r"line 4 of .* is malformed: expected 3 fields"):
        read_agnews_csv(path)


def _full_agnews(n_per_class: int = 10) -> TextDataset:
    labels = np.repeat(np.arange(4), n_per_class)
    texts = [f"doc {i}" for i in range(labels.size)]
    return TextDataset(texts, labels, AGNEWS_CLASSES, "agnews")


def test_agnews_split_is_stratified_disjoint_and_deterministic() -> None:
    full = _full_agnews()
    train, test = split_agnews(full, "train"), split_agnews(full, "test")
    np.testing.assert_array_equal(np.bincount(train.labels), [8, 8, 8, 8])
    np.testing.assert_array_equal(np.bincount(test.labels), [2, 2, 2, 2])
    assert set(train.texts).isdisjoint(test.texts)
    assert set(train.texts) | set(test.texts) == set(full.texts)
    assert split_agnews(full, "test").texts == test.texts
    assert split_agnews(full, "test", seed=1).texts != test.texts
    assert "80% train / 20% test" in train.note and "not the official" in test.note


def test_agnews_split_rejects_unknown_split() -> None:
    with pytest.raises(ConfigError, match="AG News split must be 'train' or 'test'"):
        split_agnews(_full_agnews(), "dev")


def test_registry_loads_text_datasets_from_data_dir(tmp_path: Path) -> None:
    root = make_text_data_dir(tmp_path)
    assert len(load_dataset("trec", "train", data_dir=root)) == 24
    assert load_dataset("trec", "test", data_dir=root).labels.tolist() == [0, 5]
    assert len(load_dataset("sst2", "validation", data_dir=root)) == 4
    ag_train = load_dataset("agnews", "train", data_dir=root)
    assert isinstance(ag_train, TextDataset)
    assert len(ag_train) == 64 and len(load_dataset("agnews", "test", data_dir=root)) == 16
    with pytest.raises(ConfigError, match="has splits train, test; got split 'dev'"):
        load_dataset("trec", "dev", data_dir=root)


def test_registry_missing_text_file_names_expected_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"expects the file 'TREC\.train\.all'.*text/TREC"):
        load_dataset("trec", "train", data_dir=tmp_path)


def _real_root() -> Path:
    root = real_data_dir()
    if root is None or not (root / "text").is_dir():
        pytest.skip("text data not found: set GHOFL_DATA_DIR to the folder holding text/")
    return root


@pytest.mark.realdata
@pytest.mark.parametrize(
    ("name", "split", "n"),
    [
        ("trec", "train", 5452),
        ("trec", "test", 500),
        ("sst2", "train", 6920),
        ("sst2", "dev", 872),
        ("sst2", "test", 1821),
        ("agnews", "train", 6080),
        ("agnews", "test", 1520),
    ],
)
def test_real_text_files_have_the_documented_sizes(name: str, split: str, n: int) -> None:
    assert len(load_dataset(name, split, data_dir=_real_root())) == n


@pytest.mark.realdata
def test_real_trec_label_counts_match_trec6() -> None:
    np.testing.assert_array_equal(
        np.bincount(load_dataset("trec", "train", data_dir=_real_root()).labels),
        [1162, 1250, 86, 1223, 835, 896],
    )
