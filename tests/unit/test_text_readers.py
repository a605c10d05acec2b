"""Text readers: encodings, line splitting, blank lines, labels, CSV/TSV columns, datasets by
path (DatasetSpec), and the named TREC / SST-2 / AG News files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.data.by_path import DatasetSpec
from ghofl.data.registry import load_dataset
from ghofl.data.text import (
    AGNEWS_CLASSES,
    TREC_CLASSES,
    TextDataset,
    decode_text,
    holdout_split,
    read_agnews_csv,
    read_labelled_texts,
    read_sst2,
    read_text_dataset,
    read_trec,
    split_agnews,
    split_lines,
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


# ---------------------------------------------------------------------- encodings and lines
CP1252_LINES = "pos It\u2019s \u201cgreat\u201d\u2026 really\nneg Dull \u2013 and long\n"


def test_cp1252_with_ellipsis_is_decoded_as_cp1252_and_not_split_at_0x85(tmp_path: Path) -> None:
    raw = CP1252_LINES.encode("cp1252")
    assert b"\x85" in raw and b"\x93" in raw
    path = tmp_path / "reviews.txt"
    path.write_bytes(raw + b"7\n")  # line 3: a label without text
    with pytest.raises(DataError, match=r"line 3 of '.*reviews\.txt' is malformed: it holds the "
                       r"label '7' but no text"):
        read_text_dataset(path)
    path.write_bytes(raw)
    ds = read_text_dataset(path)
    assert ds.encoding == "cp1252"
    assert ds.texts == ["It\u2019s \u201cgreat\u201d\u2026 really", "Dull \u2013 and long"]
    assert ds.classes == ("neg", "pos") and ds.labels.tolist() == [1, 0]


@pytest.mark.parametrize(
    ("raw", "encoding", "text"),
    [
        ("caf\u00e9 \u2603".encode(), "utf-8", "caf\u00e9 \u2603"),
        (b"\xef\xbb\xbfcaf\xc3\xa9", "utf-8-sig", "caf\u00e9"),
        ("caf\u00e9".encode("utf-16-le").join([b"\xff\xfe", b""]), "utf-16-le", "caf\u00e9"),
        (b"\xfe\xff" + "caf\u00e9".encode("utf-16-be"), "utf-16-be", "caf\u00e9"),
        (b"\xff\xfe\x00\x00" + "ok".encode("utf-32-le"), "utf-32-le", "ok"),
        (b"caf\xe9", "latin-1", "caf\u00e9"),  # no byte in 0x80-0x9F: Latin-1 == cp1252
        (b"\x93hi\x94 \x85", "cp1252", "\u201chi\u201d \u2026"),
        (b"\x81\x93", "latin-1", "\x81\x93"),  # 0x81 is undefined in cp1252
    ],
)
def test_decode_text_detects_the_encoding(raw: bytes, encoding: str, text: str) -> None:
    assert decode_text(raw) == (text, encoding)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"1 a\x00b\n", r"NUL byte at offset 3: it is a binary file, or UTF-16/32 text without "
                        r"a byte-order mark"),
        (b"\xef\xbb\xbf1 caf\xe9\n", r"starts with a UTF-8 byte-order mark but byte 8 does not "
                                     r"decode as UTF-8; re-save the file as UTF-8"),
    ],
)
def test_undecodable_bytes_are_refused(raw: bytes, match: str) -> None:
    with pytest.raises(DataError, match=match):
        decode_text(raw, "text file 'x'")


def test_split_lines_breaks_only_at_cr_and_lf() -> None:
    text = "a\r\nb\rc\nd\u0085e\u2028f\x0cg\x1ch\n"
    assert split_lines(text) == ["a", "b", "c", "d\u0085e\u2028f\x0cg\x1ch"]
    assert split_lines("a\n\n") == ["a", ""] and split_lines("") == []
    assert "x\u2028y".splitlines() == ["x", "y"]  # what str.splitlines would have done


def test_blank_lines_are_skipped_counted_and_line_numbers_stay_right(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"a one\r\n\r\n  \t \r\nb two\r\n\r\nc\r\n")
    with pytest.raises(DataError, match=r"line 6 of .* holds the label 'c' but no text"):
        read_text_dataset(path)
    path.write_bytes(b"\n\na one\r\n\r\n  \t \r\nb two\r\n\r\n")
    ds = read_text_dataset(path)
    assert ds.texts == ["one", "two"] and ds.blank_lines == 5
    assert "5 blank line(s) skipped" in ds.note
    assert read_labelled_texts(path).lines == (3, 6)


def test_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(b"\n \n\r\n")
    with pytest.raises(DataError, match=r"holds no '<label> <text>' lines \(3 blank line\(s\)\)"):
        read_text_dataset(path)


# ---------------------------------------------------------------------- labels
def test_labels_are_sorted_numerically_when_integers_else_as_strings(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("10 ten\n2 two\n1 one\n2 two again\n")
    ds = read_text_dataset(path)
    assert ds.classes == ("1", "2", "10") and ds.labels.tolist() == [2, 1, 0, 1]
    path.write_text("b x\na y\n__label__c z\tw\n")
    ds = read_text_dataset(path)
    assert ds.classes == ("a", "b", "c") and ds.texts == ["x", "y", "z\tw"]


def test_given_classes_map_names_then_indices(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("pos good\n0 bad\nneg meh\n")
    ds = read_text_dataset(path, classes=("neg", "pos"))
    assert ds.labels.tolist() == [1, 0, 0]
    path.write_text("pos good\n\n2 bad\n")
    with pytest.raises(DataError, match=r"line 3 of .* has the label '2', which is not a class of "
                       r"this dataset \(neg, pos\) nor an index 0\.\.1"):
        read_text_dataset(path, classes=("neg", "pos"))


def test_a_file_without_labels_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    path.write_text("".join(f"word{i} and more text\n" for i in range(30)))
    with pytest.raises(DataError, match=r"hold 30 distinct labels in 30 lines .* does not look "
                       r"like a class label"):
        read_text_dataset(path)


# ---------------------------------------------------------------------- CSV / TSV
def test_csv_with_a_header_finds_the_label_column(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('text,Label\n"hello, world",pos\n\nbye,neg\n')
    ds = read_text_dataset(path)
    assert ds.texts == ["hello, world", "bye"] and ds.classes == ("neg", "pos")
    assert ds.blank_lines == 1


def test_csv_without_a_header_joins_the_text_columns_like_ag_news(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text('"3","Fears","Unions say, they are"\n"1","Multi","line one\nline two"\n')
    ds = read_text_dataset(path)
    assert ds.classes == ("1", "3") and ds.labels.tolist() == [1, 0]
    assert ds.texts == ["Fears. Unions say, they are", "Multi. line one\nline two"]


def test_generic_csv_reads_ag_news_as_the_named_reader(tmp_path: Path) -> None:
    root = make_text_data_dir(tmp_path)
    path = root / "text" / "agnews.test.csv"
    named, generic = read_agnews_csv(path), read_text_dataset(path)
    assert generic.texts == named.texts and generic.classes == ("1", "2", "3", "4")
    np.testing.assert_array_equal(generic.labels, named.labels)


def test_tsv_fields_are_literal_and_columns_can_be_chosen(tmp_path: Path) -> None:
    path = tmp_path / "d.tsv"
    path.write_text('id\tsentence\tlabel\n1\tit \'s a "charming" film\t1\n2\tbad , bad\t0\n')
    ds = read_text_dataset(path, text_columns=["sentence"])
    assert ds.texts == ['it \'s a "charming" film', "bad , bad"]
    assert ds.labels.tolist() == [1, 0]
    by_index = read_text_dataset(path, format="tsv", label_column=2, text_columns=[1])
    assert by_index.texts == ds.texts


@pytest.mark.parametrize(
    ("body", "kw", "error", "match"),
    [
        ('label,text\n1,"a\nb"\n2,x,extra\n', {}, DataError,
         r"line 4 of .* is malformed: expected 2 CSV fields like line 1 but got 3"),
        ("label,text\n1,a\n,b\n", {}, DataError,
         r"line 3 of .* is malformed: its label column \('label'\) is empty"),
        ("label,text\n1,a\n2, \n", {}, DataError,
         r"line 3 of .* is malformed: its text column \('text'\) is empty"),
        ("label,text\n1,a\n", {"label_column": "klass"}, ConfigError,
         r"the label column 'klass' is not in the header of .* \(line 1: label, text\)"),
        ("1,a\n", {"label_column": 5}, ConfigError,
         r"the label column index 5 is out of range: .* has 2 columns"),
        ("label,text\n1,a\n", {"text_columns": ["label"]}, ConfigError,
         r"the label column 'label' of .* is also a text column"),
        ("1\n2\n", {}, DataError, r"line 1 of .* has a single column"),
    ],
)
def test_bad_csv_rows_name_the_line_and_the_fix(
    tmp_path: Path, body: str, kw: dict[str, object], error: type[Exception], match: str
) -> None:
    path = tmp_path / "d.csv"
    path.write_text(body)
    with pytest.raises(error, match=match):
        read_text_dataset(path, **kw)  # type: ignore[arg-type]


def test_line_format_takes_no_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("1 a\n")
    with pytest.raises(ConfigError, match=r"is read as '<label> <text>' lines, which have no "
                       r"columns"):
        read_text_dataset(path, label_column=0)
    with pytest.raises(ConfigError, match=r"text format must be one of auto, lines, csv, tsv"):
        read_text_dataset(path, format="json")


# ---------------------------------------------------------------------- splits and paths
def test_holdout_split_is_stratified_disjoint_and_seeded() -> None:
    full = _full_agnews(10)
    train, test = holdout_split(full, "train"), holdout_split(full, "test")
    np.testing.assert_array_equal(np.bincount(test.labels), [2, 2, 2, 2])
    assert set(train.texts).isdisjoint(test.texts) and len(train) + len(test) == len(full)
    assert holdout_split(full, "test", seed=1).texts != test.texts
    assert "80% train / 20% test" in test.note
    with pytest.raises(ConfigError, match=r"test_fraction must lie in \(0, 1\); got 1.5"):
        holdout_split(full, "test", test_fraction=1.5)


def test_dataset_spec_reads_a_folder_of_train_and_test_files(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("a x\nb y\na z\n")
    (tmp_path / "test.txt").write_text("c w\n")  # a class only the test file has
    spec = DatasetSpec(str(tmp_path))
    assert spec.kind == "text"
    train, test = spec.load("train"), spec.load("test")
    assert train.classes == test.classes == ("a", "b", "c")
    assert test.labels.tolist() == [2] and len(train) == 3
    assert isinstance(load_dataset(tmp_path, "test"), TextDataset)


def test_dataset_spec_holds_out_part_of_a_single_file(tmp_path: Path) -> None:
    path = tmp_path / "all.txt"
    path.write_text("".join(f"{i % 2} text {i}\n" for i in range(20)))
    spec = DatasetSpec(str(path), test_fraction=0.25, split_seed=3)
    train, test = spec.load("train"), spec.load("test")
    assert (len(train), len(test)) == (16, 4) and set(train.texts).isdisjoint(test.texts)
    assert len(spec.load("all")) == 20
    assert len(load_dataset(str(path), "test")) == 4  # by path: 20% held out, seed 0


def test_cache_key_changes_with_the_content_and_the_options(tmp_path: Path) -> None:
    path = tmp_path / "d.txt"
    path.write_text("1 a\n0 b\n")
    key = DatasetSpec(str(path)).cache_key()
    assert key.startswith("d-") and key == DatasetSpec(str(path)).cache_key()
    assert DatasetSpec(str(path), test_fraction=0.5).cache_key() != key
    assert DatasetSpec(str(path)).cache_key(coarse=True) != key
    path.write_text("1 a\n0 c\n")
    assert DatasetSpec(str(path)).cache_key() != key


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"path": "x.txt", "colour": 1}, r"unknown key\(s\) colour in a dataset table"),
        ({"test": "x.txt"}, r"a dataset table needs 'path'"),
        ({"path": "x.txt", "test_fraction": 1}, r"test_fraction must be a number in \(0, 1\)"),
        ({"path": "x.zip", "test": "y.txt", "format": "images"},
         r"is an image dataset, which takes no test"),
        ({"path": "x.txt", "format": "xml"}, r"dataset format must be one of auto, lines"),
    ],
)
def test_bad_dataset_tables_are_refused(table: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DatasetSpec.from_mapping(table, "cfg.toml: datasets[0]")


def test_a_folder_with_two_train_files_is_ambiguous(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text("1 a\n")
    (tmp_path / "more.train.csv").write_text("label,text\n1,a\n")
    with pytest.raises(DataError, match=r"has several files named like a train split \(found: "
                       r"more\.train\.csv, train\.txt\)"):
        DatasetSpec(str(tmp_path)).load("train")
