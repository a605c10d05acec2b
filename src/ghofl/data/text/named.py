"""The named text datasets: TREC-6, SST-2 and AG News, read from their published files."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ghofl.data.text.dataset import TextDataset
from ghofl.data.text.decode import read_text_file
from ghofl.data.text.parse import csv_rows, read_labelled_texts
from ghofl.errors import ConfigError, DataError

__all__ = [
    "AGNEWS_CLASSES",
    "AGNEWS_SPLIT_NOTE",
    "SST2_CLASSES",
    "TREC_CLASSES",
    "read_agnews_csv",
    "read_label_text_file",
    "read_sst2",
    "read_trec",
    "split_agnews",
]


#: TREC-6 coarse question types, in the order of the numeric labels of the harvardnlp files
#: (0 = DESC ... 5 = NUM); ``DESC:manner``-style labels map to the same indices.
TREC_CLASSES: tuple[str, ...] = ("DESC", "ENTY", "ABBR", "HUM", "LOC", "NUM")
SST2_CLASSES: tuple[str, ...] = ("negative", "positive")
#: AG News classes; CSV labels 1..4 map to indices 0..3.
AGNEWS_CLASSES: tuple[str, ...] = ("World", "Sports", "Business", "Sci/Tech")
AGNEWS_HEADER = ("label", "title", "description")
AGNEWS_SPLIT_NOTE = (
    "AG News: only the official test CSV (7,600 rows) is available offline, so ghofl splits it "
    "into train/test: stratified by class, {train_pct}% train / {test_pct}% test of every class "
    "(1,520 / 380 per class at 80/20), with a seeded permutation (seed {seed}); these are not "
    "the official AG News splits."
)


def read_label_text_file(
    path: str | os.PathLike[str],
    label_map: Mapping[str, int],
    classes: Sequence[str],
    *,
    name: str = "text",
    split: str = "",
    coarse: bool = False,
) -> TextDataset:
    """Read a file of ``label text`` lines with a fixed label mapping.

    Parameters
    ----------
    path : str or os.PathLike
        The file (encoding detected by :func:`decode_text`).
    label_map : mapping of str to int
        Raw label (after ``coarse`` truncation) to class index.
    classes : sequence of str
        Class names.
    name, split : str
        Stored on the result.
    coarse : bool, default False
        Keep only the part of the label before ``':'`` (TREC ``DESC:manner`` -> ``DESC``).

    Returns
    -------
    TextDataset

    Raises
    ------
    DataError
        On a line without text or with an unknown label, naming the 1-based line number.
    """
    part = read_labelled_texts(path, format="lines", coarse=coarse)
    labels = np.empty(len(part.labels), dtype=np.int64)
    for k, (label, lineno) in enumerate(zip(part.labels, part.lines, strict=True)):
        if label not in label_map:
            raise DataError(
                f"line {lineno} of '{part.path}' is malformed: expected '<label> <text>' with a "
                f"label in {sorted(label_map)}; got the label {label!r}; fix the label"
            )
        labels[k] = label_map[label]
    note = f"{part.blank_lines} blank line(s) skipped" if part.blank_lines else ""
    return TextDataset(list(part.texts), labels, tuple(classes), name, split, note,
                       part.blank_lines, part.encoding)


def read_trec(path: str | os.PathLike[str], split: str = "") -> TextDataset:
    """Read TREC-6 (``TREC.train.all`` / ``TREC.test.all``).

    Labels are either numeric (0..5, the harvardnlp files) or ``COARSE:fine`` strings; both map
    to :data:`TREC_CLASSES` (the fine label is dropped).
    """
    label_map = {str(i): i for i in range(len(TREC_CLASSES))}
    label_map.update({c: i for i, c in enumerate(TREC_CLASSES)})
    return read_label_text_file(
        path, label_map, TREC_CLASSES, name="trec", split=split, coarse=True
    )


def read_sst2(path: str | os.PathLike[str], split: str = "") -> TextDataset:
    """Read SST-2 (``stsa.binary.*``): labels 0 (negative) / 1 (positive)."""
    return read_label_text_file(path, {"0": 0, "1": 1}, SST2_CLASSES, name="sst2", split=split)


def read_agnews_csv(path: str | os.PathLike[str]) -> TextDataset:
    """Read an AG News CSV with header ``label,title,description`` and labels 1..4.

    The text of a row is ``title + ". " + description``; labels 1..4 map to 0..3
    (:data:`AGNEWS_CLASSES`: World, Sports, Business, Sci/Tech).

    Raises
    ------
    DataError
        On a wrong header, a row without three fields or a label outside 1..4, naming the line.
    """
    path = Path(path)
    text, encoding = read_text_file(path)
    rows = csv_rows(csv.reader(io.StringIO(text, newline="")), path, "csv")
    header = rows[0][1] if rows else None
    if header is None or tuple(h.strip().lower() for h in header) != AGNEWS_HEADER:
        raise DataError(
            f"line 1 of '{path}' must be the header 'label,title,description'; got "
            f"{','.join(header or [])!r}"
        )
    texts: list[str] = []
    labels: list[int] = []
    blank = 0
    for lineno, row in rows[1:]:
        if not any(c.strip() for c in row):
            blank += 1
            continue
        if len(row) != 3 or row[0].strip() not in {"1", "2", "3", "4"}:
            raise DataError(
                f"line {lineno} of '{path}' is malformed: expected 3 fields "
                f"'label,title,description' with a label in 1..4; got {len(row)} field(s) "
                f"starting {','.join(row)[:60]!r}"
            )
        texts.append(f"{row[1].strip()}. {row[2].strip()}")
        labels.append(int(row[0]) - 1)
    if not texts:
        raise DataError(f"AG News file '{path}' holds a header but no rows")
    return TextDataset(texts, np.asarray(labels, dtype=np.int64), AGNEWS_CLASSES, "agnews",
                       blank_lines=blank, encoding=encoding)


def split_agnews(
    full: TextDataset, split: str, *, train_fraction: float = 0.8, seed: int = 0
) -> TextDataset:
    """Split AG News deterministically: stratified, seeded, ``train_fraction`` to train.

    Per class, the items are permuted with ``numpy.random.default_rng(seed)`` (one generator,
    classes in index order) and the first ``round(train_fraction * n_c)`` go to ``train``; each
    split keeps the original file order. The result's ``note`` says so.

    Parameters
    ----------
    full : TextDataset
        The whole CSV, as from :func:`read_agnews_csv`.
    split : {"train", "test"}
        Which part to return.
    train_fraction : float, default 0.8
        Fraction of every class that goes to ``train``.
    seed : int, default 0
        Seed of the permutation.
    """
    if split not in ("train", "test"):
        raise ConfigError(f"AG News split must be 'train' or 'test'; got {split!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ConfigError(f"train_fraction must lie in (0, 1); got {train_fraction}")
    rng = np.random.default_rng(seed)
    train: list[NDArray[np.int64]] = []
    test: list[NDArray[np.int64]] = []
    for c in range(len(full.classes)):
        members = rng.permutation(np.flatnonzero(full.labels == c))
        k = round(train_fraction * members.size)
        train.append(members[:k])
        test.append(members[k:])
    idx = np.sort(np.concatenate(train if split == "train" else test))
    pct = round(100 * train_fraction)
    note = AGNEWS_SPLIT_NOTE.format(train_pct=pct, test_pct=100 - pct, seed=seed)
    return TextDataset(full.load_batch(idx), full.labels[idx], full.classes, full.name, split, note)
