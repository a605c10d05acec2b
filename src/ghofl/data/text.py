"""Text datasets: ``label text`` line files (TREC, SST-2) and the AG News CSV.

All readers return a :class:`TextDataset` (``texts``, int64 ``labels``, ``classes``), whose
``load_batch(indices) -> list[str]`` mirrors the image sources so the same embedding loop
serves both.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, DataError

__all__ = [
    "AGNEWS_CLASSES",
    "AGNEWS_SPLIT_NOTE",
    "SST2_CLASSES",
    "TREC_CLASSES",
    "TextDataset",
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


@dataclass(frozen=True, eq=False)
class TextDataset:
    """A labelled text dataset held in memory.

    Parameters
    ----------
    texts : list of str, length n
        The documents.
    labels : ndarray of int64, shape (n,)
        Labels in ``[0, len(classes))``.
    classes : tuple of str
        Class names; label ``c`` refers to ``classes[c]``.
    name : str
        Dataset name (used in messages and cache keys).
    split : str
        Split name.
    note : str
        Provenance remarks (e.g. how a split was derived).
    """

    texts: list[str]
    labels: NDArray[np.int64]
    classes: tuple[str, ...]
    name: str = "text"
    split: str = ""
    note: str = field(default="")

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels).astype(np.int64)
        if labels.shape != (len(self.texts),):
            raise DataError(
                f"TextDataset '{self.name}' has {len(self.texts)} texts but labels of shape "
                f"{labels.shape}; give one label per text"
            )
        if labels.size and (labels.min() < 0 or labels.max() >= len(self.classes)):
            raise DataError(
                f"TextDataset '{self.name}' labels must lie in [0, {len(self.classes)}); got "
                f"values from {labels.min()} to {labels.max()}"
            )
        labels.setflags(write=False)
        object.__setattr__(self, "labels", labels)

    def __len__(self) -> int:
        return len(self.texts)

    def load_batch(self, indices: Sequence[int] | NDArray[np.integer[Any]]) -> list[str]:
        """Return the texts at ``indices`` (a list of length b)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(self))):
            raise ConfigError(
                f"indices given to TextDataset.load_batch must be a 1-D sequence of integers in "
                f"[0, {len(self)}); got shape {idx.shape}"
            )
        return [self.texts[i] for i in idx.tolist()]



def _read_text(path: Path) -> str:
    if not path.is_file():
        raise DataError(
            f"text dataset file '{path}' does not exist; put the file there or set "
            "GHOFL_DATA_DIR to the directory holding text/<file>"
        )
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")  # e.g. TREC.train.all is ISO-8859-1


def read_label_text_file(
    path: str | os.PathLike[str],
    label_map: Mapping[str, int],
    classes: Sequence[str],
    *,
    name: str = "text",
    split: str = "",
    coarse: bool = False,
) -> TextDataset:
    """Read a file of ``label text`` lines (label, one space, the text).

    Parameters
    ----------
    path : str or os.PathLike
        The file (UTF-8, falling back to Latin-1).
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
        On a line without text or with an unknown label, naming the line number.
    """
    path = Path(path)
    texts: list[str] = []
    labels: list[int] = []
    for lineno, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        label, _, text = line.strip().partition(" ")
        if coarse:
            label = label.partition(":")[0]
        if label not in label_map or not text.strip():
            raise DataError(
                f"line {lineno} of '{path}' is malformed: expected '<label> <text>' with a label "
                f"in {sorted(label_map)}; got {line[:60]!r}"
            )
        texts.append(text.strip())
        labels.append(label_map[label])
    if not texts:
        raise DataError(f"text dataset file '{path}' holds no '<label> <text>' lines")
    return TextDataset(texts, np.asarray(labels, dtype=np.int64), tuple(classes), name, split)


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
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    header = next(reader, None)
    if header is None or tuple(h.strip().lower() for h in header) != AGNEWS_HEADER:
        raise DataError(
            f"line 1 of '{path}' must be the header 'label,title,description'; got "
            f"{','.join(header or [])!r}"
        )
    texts: list[str] = []
    labels: list[int] = []
    for row in reader:
        if not row:
            continue
        if len(row) != 3 or row[0].strip() not in {"1", "2", "3", "4"}:
            raise DataError(
                f"line {reader.line_num} of '{path}' is malformed: expected 3 fields "
                f"'label,title,description' with a label in 1..4; got {len(row)} field(s) "
                f"starting {','.join(row)[:60]!r}"
            )
        texts.append(f"{row[1].strip()}. {row[2].strip()}")
        labels.append(int(row[0]) - 1)
    if not texts:
        raise DataError(f"AG News file '{path}' holds a header but no rows")
    return TextDataset(texts, np.asarray(labels, dtype=np.int64), AGNEWS_CLASSES, "agnews")


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
