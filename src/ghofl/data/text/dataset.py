"""TextDataset, the labelled texts held in memory, built from parsed files.

:func:`read_text_dataset` reads a file of any supported format; :func:`infer_classes` and
:func:`to_text_dataset` map raw labels to classes; :func:`holdout_split` splits one file.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.data.text.parse import LabelledTexts, read_labelled_texts
from ghofl.errors import ConfigError, DataError

__all__ = [
    "TextDataset",
    "holdout_split",
    "infer_classes",
    "read_text_dataset",
    "text_fingerprint",
    "to_text_dataset",
]


_INTEGER = re.compile(r"[+-]?[0-9]+")


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
    blank_lines : int, default 0
        Blank lines (or rows) the reader skipped.
    encoding : str, default ""
        Encoding the file was decoded with (``""`` when not read from a file).
    """

    texts: list[str]
    labels: NDArray[np.int64]
    classes: tuple[str, ...]
    name: str = "text"
    split: str = ""
    note: str = field(default="")
    blank_lines: int = 0
    encoding: str = ""

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

    def subset(self, indices: Sequence[int] | NDArray[np.integer[Any]], split: str,
               note: str = "") -> TextDataset:
        """The items at ``indices`` (in that order) as a dataset of the same classes."""
        idx = np.asarray(indices, dtype=np.int64)
        return TextDataset(self.load_batch(idx), self.labels[idx], self.classes, self.name,
                           split, note or self.note, self.blank_lines, self.encoding)


def infer_classes(parts: Iterable[LabelledTexts], *, max_classes: int = 1000) -> tuple[str, ...]:
    """The class list of one or more parsed files: their distinct labels, sorted.

    In numeric order when every label is an integer (``"2" < "10"``), else in string order.

    Raises
    ------
    DataError
        More than ``max_classes`` distinct labels, or (at 20 items or more) more distinct
        labels than half the items: the first word of each line is not a label.
    """
    parts = list(parts)
    seen: dict[str, None] = {}
    n = 0
    for p in parts:
        seen.update(dict.fromkeys(p.labels))
        n += len(p.labels)
    labels = list(seen)
    if len(labels) > max_classes or (n >= 20 and 2 * len(labels) > n):
        where = ", ".join(f"'{p.path}'" for p in parts)
        raise DataError(
            f"{where} hold {len(labels)} distinct labels in {n} lines (e.g. "
            f"{', '.join(repr(x) for x in labels[:3])}): the first field of each line does not "
            "look like a class label; give files of '<label> <text>' lines, or CSV/TSV files "
            "with a label column (name it with label_column / --label-column), or give the "
            "class list (--classes) when the data truly has under two lines per class"
        )
    if all(_INTEGER.fullmatch(x) for x in labels):
        return tuple(sorted(labels, key=lambda x: (int(x), x)))
    return tuple(sorted(labels))


def to_text_dataset(
    part: LabelledTexts,
    classes: Sequence[str],
    *,
    name: str | None = None,
    split: str = "",
    indices_ok: bool = True,
) -> TextDataset:
    """Map the raw labels of ``part`` onto ``classes``.

    A label is looked up by name; when it is no class name and ``indices_ok``, an integer
    label ``i`` with ``0 <= i < len(classes)`` means ``classes[i]``.

    Raises
    ------
    DataError
        A label that is neither; the message names the file, the line, the label and the
        classes.
    """
    classes = tuple(classes)
    lookup = {c: i for i, c in enumerate(classes)}
    out = np.empty(len(part.labels), dtype=np.int64)
    for k, (label, lineno) in enumerate(zip(part.labels, part.lines, strict=True)):
        idx = lookup.get(label)
        if idx is None and indices_ok and _INTEGER.fullmatch(label):
            i = int(label)
            idx = i if 0 <= i < len(classes) else None
        if idx is None:
            shown = ", ".join(classes[:10]) + (", ..." if len(classes) > 10 else "")
            raise DataError(
                f"line {lineno} of '{part.path}' has the label {label!r}, which is not a class "
                f"of this dataset ({shown})"
                + (f" nor an index 0..{len(classes) - 1}" if indices_ok else "")
                + "; fix the label or give the full class list"
            )
        out[k] = idx
    note = f"{part.blank_lines} blank line(s) skipped" if part.blank_lines else ""
    return TextDataset(list(part.texts), out, classes, name or part.path.stem, split, note,
                       part.blank_lines, part.encoding)


def read_text_dataset(
    path: str | os.PathLike[str],
    *,
    classes: Sequence[str] | None = None,
    format: str = "auto",
    label_column: str | int | None = None,
    text_columns: Sequence[str | int] | None = None,
    name: str | None = None,
    split: str = "",
    coarse: bool = False,
) -> TextDataset:
    """Read a labelled text file of any supported format (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
    classes : sequence of str, optional
        The class list; labels are names in it or integer indices into it. ``None``: the
        file's distinct labels (:func:`infer_classes`).
    format, label_column, text_columns, coarse
        As in :func:`read_labelled_texts`.
    name, split : str
        Stored on the result (``name`` defaults to the file name without extension).

    Returns
    -------
    TextDataset
        With ``blank_lines`` and ``encoding`` set.
    """
    part = read_labelled_texts(path, format=format, label_column=label_column,
                               text_columns=text_columns, coarse=coarse)
    names = tuple(classes) if classes is not None else infer_classes([part])
    return to_text_dataset(part, names, name=name, split=split)


def holdout_split(
    full: TextDataset, split: str, *, test_fraction: float = 0.2, seed: int = 0
) -> TextDataset:
    """A deterministic stratified train/test split of one dataset.

    Per class (in index order, one ``numpy.random.default_rng(seed)``), the items are permuted
    and the first ``round((1 - test_fraction) * n_c)`` go to ``train``; each split keeps the
    file order. A class with a single item goes to ``train``.

    Parameters
    ----------
    full : TextDataset
    split : {"train", "test"}
    test_fraction : float in (0, 1), default 0.2
    seed : int, default 0
    """
    if split not in ("train", "test"):
        raise ConfigError(f"a held-out split must be 'train' or 'test'; got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must lie in (0, 1); got {test_fraction}")
    rng = np.random.default_rng(seed)
    train: list[NDArray[np.int64]] = [np.zeros(0, np.int64)]
    test: list[NDArray[np.int64]] = [np.zeros(0, np.int64)]
    for c in range(len(full.classes)):
        members = rng.permutation(np.flatnonzero(full.labels == c))
        k = round((1.0 - test_fraction) * members.size)
        train.append(members[:k])
        test.append(members[k:])
    idx = np.sort(np.concatenate(train if split == "train" else test))
    note = (
        f"split of one file by ghofl: stratified by class, {100 * (1 - test_fraction):g}% train "
        f"/ {100 * test_fraction:g}% test of every class, seeded permutation (seed {seed})"
    )
    if full.note:
        note += f"; {full.note}"
    return full.subset(idx, split, note)


def text_fingerprint(paths: Iterable[Path], options: Mapping[str, Any]) -> str:
    """16 hex of the SHA-256 of the files' bytes and the reading options (a cache key part)."""
    h = hashlib.sha256(repr(sorted(options.items())).encode())
    for p in paths:
        h.update(str(p.name).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]
