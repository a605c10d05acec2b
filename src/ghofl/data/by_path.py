"""Datasets given by path, with a content-fingerprinted cache key.

The data are text files (one file, a train/test pair, or a folder holding both) or image
layouts (ImageFolder folders or zips).

A :class:`DatasetSpec` says where the data is and how to read it; it is what a ``ghofl run``
config entry (a path string or a ``{path = ..., test = ...}`` table), ``ghofl embed --data``
and ``ghofl client-stats --data`` describe::

    path          str    a text file, a folder holding train/test text files, or an image
                         layout (folder or .zip with <split>/<class>/<image>)
    test          str    text only: the test file (default: a held-out part of ``path``)
    name          str    name in tables and records (default: the file or folder name)
    format        str    auto (default), lines, csv, tsv or images
    label_column  str|int  CSV/TSV: header name or 0-based index of the label column
    text_columns  list   CSV/TSV: names or indices of the text columns (default: the others)
    test_fraction float  held-out test fraction of every class when there is no test file
                         (default 0.2)
    split_seed    int    seed of that held-out split (default 0)

**Text.** A folder is searched for one file whose name has the word ``train`` and at most one
with ``test`` (words split at ``.``, ``_``, ``-``: ``train.txt``, ``TREC.train.all``,
``sst2_test.tsv``). Without a test file, ``test_fraction`` of every class (seeded, stratified,
:func:`~ghofl.data.text.holdout_split`) is the test split and the rest the train split. The
class list is the union of the labels of all files of the dataset (:func:`infer_classes`), so
train and test agree.

**Images.** Read by :func:`open_image_layout` (ImageFolder folders/zips with ``train/`` and
``test/`` split folders, Tiny-ImageNet), which :func:`ghofl.data.registry.load_dataset` uses for
image paths too.

**Cache key.** ``<name>-<16 hex>``: for text, the SHA-256 of the files' bytes and of every
reading option; for images, of the absolute path and the size and modification time of the
zip, or of every file under the folder. A changed file gets a new key, so cached embeddings
are never served stale.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ghofl.data.images import ImageFolderSource
from ghofl.data.text import (
    TextDataset,
    holdout_split,
    infer_classes,
    read_labelled_texts,
    text_fingerprint,
    text_format_of,
    to_text_dataset,
)
from ghofl.data.tiny_imagenet import TinyImageNetSource, is_tiny_imagenet
from ghofl.errors import ConfigError, DataError

__all__ = ["DATASET_FORMATS", "DatasetSpec", "find_text_files", "open_image_layout", "open_path"]

#: ``format`` values of a :class:`DatasetSpec`.
DATASET_FORMATS: tuple[str, ...] = ("auto", "lines", "csv", "tsv", "images")
_WORD = re.compile(r"[._\-\s]+")
_SPLITS = ("train", "test")


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset given by path (see the module docstring for the fields)."""

    path: str
    test: str | None = None
    name: str | None = None
    format: str = "auto"
    label_column: str | int | None = None
    text_columns: tuple[str | int, ...] = ()
    test_fraction: float = 0.2
    split_seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.path, str | os.PathLike) or not str(self.path).strip():
            raise ConfigError(f"a dataset path must be a non-empty string; got {self.path!r}")
        object.__setattr__(self, "path", str(self.path))
        if self.test is not None:
            object.__setattr__(self, "test", str(self.test))
        if self.format not in DATASET_FORMATS:
            raise ConfigError(
                f"dataset format must be one of {', '.join(DATASET_FORMATS)}; got "
                f"{self.format!r}"
            )
        frac = self.test_fraction
        if isinstance(frac, bool) or not isinstance(frac, int | float) or not 0 < frac < 1:
            raise ConfigError(
                f"test_fraction must be a number in (0, 1), e.g. 0.2; got {frac!r}"
            )
        if isinstance(self.split_seed, bool) or not isinstance(self.split_seed, int) \
                or self.split_seed < 0:
            raise ConfigError(f"split_seed must be an integer >= 0; got {self.split_seed!r}")
        cols = self.text_columns
        if isinstance(cols, str | int):
            cols = (cols,)
        object.__setattr__(self, "text_columns", tuple(cols))
        for c in (self.label_column, *self.text_columns):
            if c is not None and (isinstance(c, bool) or not isinstance(c, str | int)):
                raise ConfigError(
                    f"label_column and text_columns take header names or 0-based indices; "
                    f"got {c!r}"
                )
        if self.kind == "images" and (self.test is not None or self.label_column is not None
                                      or self.text_columns):
            raise ConfigError(
                f"'{self.path}' is an image dataset, which takes no test, label_column or "
                "text_columns: its layout holds the train/ and test/ split folders"
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "dataset") -> DatasetSpec:
        """Build a spec from a TOML table / JSON object, rejecting unknown keys."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {', '.join(unknown)} in a dataset table; valid keys: "
                f"{', '.join(sorted(known))}"
            )
        if "path" not in data:
            raise ConfigError(
                f"{where}: a dataset table needs 'path', e.g. {{path = \"data/train.txt\", "
                "test = \"data/test.txt\"}"
            )
        kw = dict(data)
        if isinstance(kw.get("text_columns"), list):
            kw["text_columns"] = tuple(kw["text_columns"])
        try:
            return cls(**kw)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data (``text_columns`` as a list)."""
        out = asdict(self)
        out["text_columns"] = list(self.text_columns)
        return out

    # ------------------------------------------------------------------ identity
    @property
    def label(self) -> str:
        """Name in tables and records: ``name``, else the file or folder name."""
        if self.name:
            return self.name
        p = Path(self.path)
        return p.stem if p.suffix.lower() in (".zip", ".txt", ".csv", ".tsv", ".tab") else p.name

    @property
    def kind(self) -> str:
        """``"text"`` or ``"images"``."""
        if self.format == "images":
            return "images"
        if self.format != "auto" or self.test is not None:
            return "text"
        p = Path(self.path).expanduser()
        if p.is_dir():
            return "text" if _text_candidates(p)[0] else "images"
        return "images" if p.suffix.lower() == ".zip" else "text"

    def text_files(self) -> tuple[Path, Path | None]:
        """The (train, test) files of a text dataset; test is ``None`` for a held-out split."""
        p = Path(self.path).expanduser()
        if p.is_dir():
            train, test = find_text_files(p)
        else:
            train, test = p, None
        if not train.is_file():
            raise DataError(
                f"text dataset file '{train}' does not exist; give the path of a text file, a "
                "folder holding train/test text files, or an image layout"
            )
        if self.test is not None:
            test = Path(self.test).expanduser()
            if not test.is_file():
                raise DataError(f"test file '{test}' of dataset '{self.path}' does not exist; "
                                "check the path")
        return train, test

    def cache_key(self, classes: Sequence[str] | None = None, *, coarse: bool = False) -> str:
        """Dataset part of the embedding cache key: name plus a content fingerprint.

        The fingerprint covers the files and, for text, every option that changes the texts or
        labels read.
        """
        if self.kind == "text":
            train, test = self.text_files()
            opts = {k: v for k, v in self.to_dict().items() if k not in ("path", "test", "name")}
            opts["classes"] = list(classes) if classes is not None else None
            opts["coarse"] = coarse
            opts["has_test"] = test is not None
            files = [train] + ([test] if test is not None else [])
            return f"{self.label}-{text_fingerprint(files, opts)}"
        return f"{self.label}-{_image_fingerprint(Path(self.path).expanduser())}"

    # ------------------------------------------------------------------ loading
    def load(self, split: str, classes: Sequence[str] | None = None, *,
             coarse: bool = False) -> Any:
        """The ``split`` of this dataset.

        Parameters
        ----------
        split : str
            ``"train"`` or ``"test"`` (text); a split folder (images); ``"all"`` for the whole
            train file of a text dataset (no held-out part removed).
        classes : sequence of str, optional
            Text: the class list (labels are names in it or indices into it); default the
            labels of all files of the dataset.
        coarse : bool, default False
            Text: keep only the part of each label before ``':'``.

        Returns
        -------
        TextDataset or an image source
        """
        if self.kind == "images":
            return open_image_layout(Path(self.path).expanduser(), split)
        return self._load_text(split, classes, coarse)

    def _load_text(self, split: str, classes: Sequence[str] | None, coarse: bool) -> TextDataset:
        if split not in (*_SPLITS, "all"):
            raise ConfigError(
                f"text dataset '{self.path}' has the splits train, test and all; got {split!r}"
            )
        train_path, test_path = self.text_files()
        opts: dict[str, Any] = {"label_column": self.label_column,
                                "text_columns": self.text_columns or None, "coarse": coarse}
        fmt = self.format
        train = read_labelled_texts(train_path, format=text_format_of(train_path, fmt), **opts)
        parts = [train]
        test = None
        if test_path is not None:
            test = read_labelled_texts(test_path, format=text_format_of(test_path, fmt), **opts)
            parts.append(test)
        names = tuple(classes) if classes is not None else infer_classes(parts)
        if split == "test" and test is not None:
            return to_text_dataset(test, names, name=self.label, split="test")
        whole = to_text_dataset(train, names, name=self.label, split=split)
        if split == "all" or test is not None:
            return whole
        return holdout_split(whole, split, test_fraction=self.test_fraction,
                             seed=self.split_seed)


def open_path(
    spec: DatasetSpec, split: str | None = None, classes: Sequence[str] | None = None,
    *, coarse: bool = False,
) -> tuple[Any, str]:
    """Open the data of one client (``ghofl embed`` / ``client-stats --data``).

    ``split=None`` picks: the whole file of a single text file (``all``), ``train`` of a folder
    of text files, and for an image layout ``train`` when it has that split folder, else the
    class folders at its root.

    Returns
    -------
    dataset : TextDataset or an image source
    split : str
        The split read (``"all"`` for class folders at the root of an image layout).
    """
    if spec.kind == "text":
        if split is None:
            single = not Path(spec.path).expanduser().is_dir() and spec.test is None
            split = "all" if single else "train"
        return spec.load(split, classes, coarse=coarse), split
    path = Path(spec.path).expanduser()
    if split is not None or (path.is_dir() and (path / "train").is_dir()):
        return spec.load(split or "train"), split or "train"
    try:
        return spec.load("train"), "train"
    except DataError:
        try:
            return ImageFolderSource(path, None, name=spec.label), "all"
        except DataError:
            raise DataError(
                f"'{path}' holds neither a train/ split folder nor class folders of images; "
                "give --split with the name of its split folder, or the layout "
                "<root>/<class>/<image> or <root>/train/<class>/<image>"
            ) from None


def open_image_layout(path: Path, split: str) -> ImageFolderSource | TinyImageNetSource:
    """The ``split`` of the image layout at ``path``.

    The layout is a Tiny-ImageNet zip or folder (recognised by its ``wnids.txt``), else an
    ImageFolder directory or ``.zip`` archive.
    """
    if is_tiny_imagenet(path):
        return TinyImageNetSource(path, split)
    return ImageFolderSource(path, split)


def find_text_files(folder: Path) -> tuple[Path, Path | None]:
    """The train file and the test file (or ``None``) of a folder of text files."""
    train, test = _text_candidates(folder)
    if len(train) != 1 or len(test) > 1:
        found = sorted(p.name for p in folder.iterdir() if p.is_file())
        what = ("no file" if not train else "several files") if len(train) != 1 else \
            "several test files"
        raise DataError(
            f"folder '{folder}' has {what} named like a train split (found: "
            f"{', '.join(found) or 'nothing'}); it must hold one file with the word 'train' in "
            "its name (e.g. train.txt) and at most one with 'test', or give the files as "
            "{path = \"train file\", test = \"test file\"}"
        )
    return train[0], (test[0] if test else None)


def _text_candidates(folder: Path) -> tuple[list[Path], list[Path]]:
    train: list[Path] = []
    test: list[Path] = []
    for p in sorted(folder.iterdir()):
        if not p.is_file() or p.name.startswith(".") or p.suffix.lower() == ".zip":
            continue
        words = {w.lower() for w in _WORD.split(p.name)}
        if "train" in words:
            train.append(p)
        elif "test" in words:
            test.append(p)
    return train, test


def _image_fingerprint(path: Path) -> str:
    h = hashlib.sha256(str(path.resolve()).encode())
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for f in sorted(files):
                st = os.stat(os.path.join(root, f))
                rel = os.path.relpath(os.path.join(root, f), path)
                h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    elif path.exists():
        st = path.stat()
        h.update(f"{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]
