"""Named datasets resolved from a data directory, and stratified subsampling.

The data directory is the ``data_dir`` argument when given, else the ``GHOFL_DATA_DIR``
environment variable. It holds::

    cifar10.zip       (or a cifar10/ folder) ImageFolder: cifar10/<split>/<class>/*.jpg
    cifar-10-python.tar.gz (or cifar-10-batches-py/) the official python archive, read by
                      ghofl.data.cifar_archive; also found in <cache dir>/data/ (where
                      ``ghofl demo`` downloads it), so cifar10 needs no data directory there
    text/TREC.train.all, text/TREC.test.all
    text/stsa.binary.train, text/stsa.binary.dev, text/stsa.binary.test
    text/agnews.test.csv  (split 80/20 into train/test by ghofl, see ghofl.data.text)
    tiny-imagenet-200.zip (or a tiny-imagenet-200/ folder) the official Tiny-ImageNet layout;
                          split "test" is its labelled val/ set (see ghofl.data.tiny_imagenet)

Text files are also accepted directly in the data directory (without ``text/``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.data.by_path import DatasetSpec, open_image_layout
from ghofl.data.images import LAYOUT_HINT, ArrayImageSource, ImageFolderSource
from ghofl.data.text import TextDataset, read_agnews_csv, read_sst2, read_trec, split_agnews
from ghofl.data.tiny_imagenet import TINY_IMAGENET_LAYOUT, TinyImageNetSource
from ghofl.errors import ConfigError, DataError

__all__ = [
    "DATA_DIR_ENV",
    "available_datasets",
    "dataset_splits",
    "default_data_dir",
    "load_dataset",
    "subsample",
]

DATA_DIR_ENV = "GHOFL_DATA_DIR"

_TEXT_FILES: dict[str, dict[str, str]] = {
    "trec": {"train": "TREC.train.all", "test": "TREC.test.all"},
    "sst2": {"train": "stsa.binary.train", "dev": "stsa.binary.dev", "test": "stsa.binary.test"},
    "agnews": {"train": "agnews.test.csv", "test": "agnews.test.csv"},
}
_EXPECTED: dict[str, str] = {
    "cifar10": "cifar10.zip (or a cifar10/ folder) with cifar10/{train,test}/<class>/*.jpg, "
    "or the official cifar-10-python.tar.gz (or its cifar-10-batches-py/ folder)",
    "trec": "text/TREC.train.all and text/TREC.test.all",
    "sst2": "text/stsa.binary.{train,dev,test}",
    "agnews": "text/agnews.test.csv (split 80/20 into train/test by ghofl)",
    "tiny-imagenet": "tiny-imagenet-200.zip (or a tiny-imagenet-200/ folder) with "
    + TINY_IMAGENET_LAYOUT,
}

Dataset = ImageFolderSource | ArrayImageSource | TextDataset


def available_datasets() -> tuple[str, ...]:
    """Names accepted by :func:`load_dataset` besides paths."""
    return tuple(_EXPECTED)


def dataset_splits(name: str) -> tuple[str, ...]:
    """Splits of a named dataset, e.g. ``("train", "test")``."""
    if name in ("cifar10", "tiny-imagenet"):
        return ("train", "test")
    if name not in _TEXT_FILES:
        raise ConfigError(_unknown_message(name))
    return tuple(_TEXT_FILES[name])


def default_data_dir() -> Path | None:
    """The directory named by ``GHOFL_DATA_DIR``, or ``None`` when the variable is unset."""
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else None


def _unknown_message(name: str) -> str:
    return (
        f"dataset {name!r} is neither a known name ({', '.join(_EXPECTED)}) nor an existing "
        f"ImageFolder directory or .zip archive (layout {LAYOUT_HINT}) nor an existing text "
        "file of '<label> <text>' lines or CSV/TSV rows"
    )


def _resolve_data_dir(name: str, data_dir: str | os.PathLike[str] | None) -> Path:
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if root is None or not root.is_dir():
        where = "no data directory was given" if root is None else f"'{root}' is not a directory"
        raise DataError(
            f"dataset {name!r} needs a data directory but {where}; set the {DATA_DIR_ENV} "
            f"environment variable or pass data_dir= pointing to a folder that holds "
            f"{_EXPECTED[name]} (known datasets: {_describe_known()})"
        )
    return root


def _describe_known() -> str:
    return "; ".join(f"{k}: {v}" for k, v in _EXPECTED.items())


def _find_file(root: Path, name: str, filename: str) -> Path:
    for candidate in (root / "text" / filename, root / filename):
        if candidate.is_file():
            return candidate
    raise DataError(
        f"dataset {name!r} expects the file '{filename}' in '{root / 'text'}' (or '{root}'), "
        f"which does not exist; the {DATA_DIR_ENV} directory should hold {_EXPECTED[name]}"
    )


def _load_text(name: str, split: str, root: Path) -> TextDataset:
    files = _TEXT_FILES[name]
    if split == "validation":
        split = "dev"
    if split not in files:
        raise ConfigError(
            f"dataset {name!r} has splits {', '.join(files)}; got split {split!r}"
        )
    path = _find_file(root, name, files[split])
    readers: dict[str, Callable[[Path, str], TextDataset]] = {"trec": read_trec, "sst2": read_sst2}
    if name == "agnews":
        return split_agnews(read_agnews_csv(path), split)
    return readers[name](path, split)


def _load_cifar10(
    split: str, data_dir: str | os.PathLike[str] | None
) -> ImageFolderSource | ArrayImageSource:
    """The CIFAR-10 image source: an ImageFolder layout, else the official python archive.

    The ImageFolder zip/folder of the data directory has cache key ``cifar10``; otherwise the
    official python archive there or in the cache is read (key ``cifar10-python``).
    """
    from ghofl.data.cifar_archive import (
        find_cifar10_archive,
        manual_download_hint,
        read_cifar10_archive,
    )

    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if root is not None and not root.is_dir():
        raise DataError(
            f"dataset 'cifar10' needs a data directory but '{root}' is not a directory; set the "
            f"{DATA_DIR_ENV} environment variable or pass data_dir= pointing to a folder that "
            f"holds {_EXPECTED['cifar10']}"
        )
    if root is not None:
        for candidate in (root / "cifar10.zip", root / "cifar10"):
            if candidate.exists():
                return ImageFolderSource(candidate, split, name="cifar10")
    archive = find_cifar10_archive(root)
    if archive is not None:
        return read_cifar10_archive(archive, split)
    where = (f"'{root}' holds neither" if root is not None
             else f"{DATA_DIR_ENV} is not set, so there is no")
    raise DataError(
        f"dataset 'cifar10' was not found: {where} cifar10.zip (ImageFolder), "
        f"cifar-10-python.tar.gz nor cifar-10-batches-py/; `ghofl demo` downloads the archive "
        f"by itself, or {manual_download_hint(root)}"
    )


def _load_tiny_imagenet(split: str, root: Path) -> TinyImageNetSource:
    for candidate in (root / "tiny-imagenet-200.zip", root / "tiny-imagenet-200"):
        if candidate.exists():
            return TinyImageNetSource(candidate, split)
    raise DataError(
        f"dataset 'tiny-imagenet' expects '{root / 'tiny-imagenet-200.zip'}' or a folder "
        f"'{root / 'tiny-imagenet-200'}', neither of which exists; the {DATA_DIR_ENV} directory "
        f"should hold {_EXPECTED['tiny-imagenet']}"
    )


def load_dataset(
    name_or_path: str | os.PathLike[str] | DatasetSpec,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
) -> Dataset:
    """Load a named dataset or an ImageFolder directory / zip archive.

    Parameters
    ----------
    name_or_path : str, os.PathLike or DatasetSpec
        ``"cifar10"``, ``"trec"``, ``"sst2"``, ``"agnews"``, ``"tiny-imagenet"``, or the path
        of an ImageFolder directory or ``.zip`` archive, or of a Tiny-ImageNet zip or folder
        (recognised by its ``wnids.txt``), or of a text file or a folder of train/test text
        files (:mod:`ghofl.data.by_path`; one file is split 80/20, seed 0), or a
        :class:`~ghofl.data.by_path.DatasetSpec`.
    split : str, default "train"
        Split folder (images) or split name (text: ``train``/``test``, SST-2 also ``dev``).
    data_dir : str or os.PathLike or None
        Directory holding the named datasets; ``None`` uses ``GHOFL_DATA_DIR``.

    Returns
    -------
    ImageFolderSource or TextDataset
        Images decode to uint8 (b, H, W, 3) through ``load_batch``; texts are ``list[str]``.

    Raises
    ------
    DataError
        If the data directory or an expected file is missing; the message lists the known
        names and the expected files.
    """
    if isinstance(name_or_path, DatasetSpec):
        loaded: Dataset = name_or_path.load(split)
        return loaded
    key = str(name_or_path)
    if key.lower() in _EXPECTED:
        name = key.lower()
        if name == "cifar10":
            return _load_cifar10(split, data_dir)
        root = _resolve_data_dir(name, data_dir)
        if name == "tiny-imagenet":
            return _load_tiny_imagenet(split, root)
        return _load_text(name, split, root)
    path = Path(key).expanduser()
    if path.exists() and DatasetSpec(key).kind == "text":  # text file(s) by path
        text: Dataset = DatasetSpec(key).load(split)
        return text
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".zip"):
        return open_image_layout(path, split)
    raise DataError(_unknown_message(key) + f"; known datasets need: {_describe_known()}")


def subsample(
    labels: NDArray[np.integer[Any]] | Sequence[int],
    *,
    per_class: int | None = None,
    fraction: float | None = None,
    seed: int = 0,
) -> NDArray[np.int64]:
    """Stratified random subset of positions, sorted ascending.

    Parameters
    ----------
    labels : array of int, shape (n,)
        Labels of the full dataset.
    per_class : int, optional
        Keep ``min(per_class, n_c)`` items of every class ``c``.
    fraction : float in (0, 1], optional
        Keep ``max(1, round(fraction * n_c))`` items of every class. Give exactly one of
        ``per_class`` and ``fraction``.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``; the result is a pure function of the inputs.

    Returns
    -------
    ndarray of int64, shape (m,)
        Sorted positions into ``labels``.
    """
    y = np.asarray(labels)
    if y.ndim != 1 or not (y.size == 0 or np.issubdtype(y.dtype, np.integer)):
        raise ConfigError(
            f"subsample labels must be a 1-D integer array; got shape {y.shape}, dtype {y.dtype}"
        )
    if (per_class is None) == (fraction is None):
        raise ConfigError(
            "subsample needs exactly one of per_class (items per class) or fraction (0 < f <= 1); "
            f"got per_class={per_class!r}, fraction={fraction!r}"
        )
    if per_class is not None and int(per_class) < 1:
        raise ConfigError(f"subsample per_class must be a positive integer; got {per_class!r}")
    if fraction is not None and not 0.0 < float(fraction) <= 1.0:
        raise ConfigError(f"subsample fraction must lie in (0, 1]; got {fraction!r}")
    rng = np.random.default_rng(seed)
    keep: list[NDArray[np.int64]] = []
    for c in np.unique(y):
        members = np.flatnonzero(y == c)
        if per_class is not None:
            k = min(int(per_class), members.size)
        else:
            k = max(1, round(float(fraction or 1.0) * members.size))
        keep.append(rng.choice(members, size=k, replace=False))
    return np.sort(np.concatenate(keep)).astype(np.int64) if keep else np.zeros(0, np.int64)
