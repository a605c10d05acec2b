"""Image sources: ImageFolder layouts read from a directory or in place from a zip archive.

An ImageFolder layout is ``<root>/<split>/<class>/<image>``; the class index of an image is the
position of its class folder in the sorted list of class folder names (as in torchvision's
``ImageFolder``). A zip archive is read in place with random access (never extracted) and may
hold the layout at its top level or under one top-level folder (``cifar10.zip`` holds
``cifar10/train/<class>/NNNN.jpg``).

Every source exposes the same small surface (:class:`ImageSource`): ``classes``, ``labels``,
``len(source)`` and ``load_batch(indices) -> uint8 (b, H, W, 3)``. Decoding uses Pillow, which is
imported lazily (``torch`` extra).
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, DataError, require_extra

__all__ = [
    "IMAGE_EXTENSIONS",
    "LAYOUT_HINT",
    "ArrayImageSource",
    "ImageFolderSource",
    "ImageSource",
    "check_resize",
    "load_torchvision_dataset",
]

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".gif", ".webp", ".tif", ".tiff"}
)
LAYOUT_HINT = (
    "<root>/<split>/<class>/<image>.jpg, as a directory or as a .zip archive holding that layout "
    "(optionally under one top-level folder, e.g. cifar10.zip -> cifar10/train/airplane/0000.jpg)"
)
_IGNORED_DIRS = frozenset({"__MACOSX"})

Indices = Sequence[int] | NDArray[np.integer[Any]]


@runtime_checkable
class ImageSource(Protocol):
    """What the embedding pipeline needs from an image dataset."""

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; label ``c`` refers to ``classes[c]``."""
        ...

    @property
    def labels(self) -> NDArray[np.int64]:
        """Labels of every item, shape (n,), values in ``[0, len(classes))``."""
        ...

    def __len__(self) -> int: ...

    def load_batch(self, indices: Indices) -> NDArray[np.uint8]:
        """Decode the items at ``indices`` into a uint8 array of shape (b, H, W, 3)."""
        ...


def _as_index_array(indices: Indices, n: int, what: str) -> NDArray[np.int64]:
    idx = np.asarray(indices)
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ConfigError(
            f"indices given to {what}.load_batch must be a 1-D sequence of integers; "
            f"got an array of shape {idx.shape} and dtype {idx.dtype}"
        )
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ConfigError(
            f"indices given to {what}.load_batch must lie in [0, {n}); "
            f"got values from {idx.min()} to {idx.max()}"
        )
    return idx


def check_resize(resize: tuple[int, int] | None) -> tuple[int, int] | None:
    """The ``resize`` option of an image source, checked: None or (height, width) as ints.

    Raises
    ------
    ConfigError
        ``resize`` is not None and not a pair of positive integers.
    """
    if resize is None:
        return None
    if len(resize) != 2 or min(int(v) for v in resize) < 1:
        raise ConfigError(
            f"resize must be None or a pair (height, width) of positive integers; got {resize!r}"
        )
    return int(resize[0]), int(resize[1])


def _is_image_name(name: str) -> bool:
    base = name.rpartition("/")[2]
    dot = base.rfind(".")
    return dot > 0 and base[dot:].lower() in IMAGE_EXTENSIONS


@dataclass(frozen=True)
class _Listing:
    """Result of scanning a layout: member names (sorted by class, then name) and labels."""

    members: tuple[str, ...]
    labels: NDArray[np.int64]
    classes: tuple[str, ...]


def _build_listing(per_class: dict[str, list[str]], where: str) -> _Listing:
    if not per_class:
        raise DataError(
            f"no class folders were found in {where}; expected the layout {LAYOUT_HINT}"
        )
    classes = tuple(sorted(per_class))
    members: list[str] = []
    labels: list[NDArray[np.int64]] = []
    for c, name in enumerate(classes):
        files = sorted(per_class[name])
        if not files:
            raise DataError(
                f"class folder '{name}' in {where} contains no images (looked for "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}); every class folder must hold at least "
                "one image, so add images or remove the empty folder"
            )
        members.extend(files)
        labels.append(np.full(len(files), c, dtype=np.int64))
    return _Listing(tuple(members), np.concatenate(labels), classes)


def _scan_directory(root: Path, split: str | None) -> _Listing:
    base = root if split is None else root / split
    if not base.is_dir():
        found = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        raise DataError(
            f"split folder '{split}' was not found in directory '{root}' (found folders: "
            f"{found or 'none'}); expected the layout {LAYOUT_HINT}"
        )
    per_class: dict[str, list[str]] = {}
    for entry in sorted(os.scandir(base), key=lambda e: e.name):
        if not entry.is_dir() or entry.name.startswith(".") or entry.name in _IGNORED_DIRS:
            continue
        files: list[str] = []
        for dirpath, dirnames, filenames in os.walk(entry.path):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            files.extend(os.path.join(rel, f) for f in filenames if _is_image_name(f))
        per_class[entry.name] = files
    return _build_listing(per_class, f"directory '{base}'")


def _zip_tree(names: Sequence[str]) -> tuple[set[str], list[str]]:
    """Return (all directories, explicit or implied; all file names) of a zip listing."""
    dirs: set[str] = set()
    files: list[str] = []
    for name in names:
        if name.endswith("/"):
            parent = name.rstrip("/")
        else:
            files.append(name)
            parent = name.rpartition("/")[0]
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    return dirs, files


def _zip_base(dirs: set[str], split: str | None, where: str) -> str:
    tops = sorted(d for d in dirs if "/" not in d and d not in _IGNORED_DIRS)
    if split is None:
        # Class folders at the root, or under a single top-level folder.
        return tops[0] if len(tops) == 1 and any(d.startswith(tops[0] + "/") for d in dirs) else ""
    candidates = [c for c in [split, *(f"{t}/{split}" for t in tops)] if c in dirs]
    if not candidates:
        found = sorted({d.split("/")[-1] for d in dirs if d.count("/") <= 1})
        raise DataError(
            f"split folder '{split}' was not found in {where} (found folders: {found or 'none'}); "
            f"expected the layout {LAYOUT_HINT}"
        )
    if len(candidates) > 1:
        raise DataError(
            f"split folder '{split}' is ambiguous in {where}: it exists as {candidates}; "
            "keep a single ImageFolder layout per archive"
        )
    return candidates[0]


def _scan_zip(zf: zipfile.ZipFile, path: Path, split: str | None) -> _Listing:
    names = zf.namelist()
    where = f"archive '{path}'"
    dirs, files = _zip_tree(names)
    base = _zip_base(dirs, split, where)
    prefix = f"{base}/" if base else ""
    per_class: dict[str, list[str]] = {}
    for d in dirs:
        if d.startswith(prefix) and "/" not in d[len(prefix) :]:
            name = d[len(prefix) :]
            if name and not name.startswith(".") and name not in _IGNORED_DIRS:
                per_class[name] = []
    for f in files:
        if f.startswith(prefix) and _is_image_name(f):
            parts = f[len(prefix) :].split("/")
            if len(parts) >= 2 and parts[0] in per_class:
                per_class[parts[0]].append(f)
    return _build_listing(per_class, f"folder '{base or '.'}' of {where}")


class ImageFolderSource:
    """An ImageFolder layout read from a directory or, in place, from a zip archive.

    Parameters
    ----------
    path : str or os.PathLike
        A directory or a ``.zip`` archive holding ``<split>/<class>/<image>`` (a zip may hold
        it under one top-level folder).
    split : str or None, default "train"
        Name of the split folder; ``None`` when ``path`` holds the class folders directly.
    resize : tuple of int (height, width) or None, default None
        When given, every image is resized (bilinear) to this size. When ``None`` every image
        must have the size of the first image, otherwise :meth:`load_batch` raises
        :class:`~ghofl.errors.DataError` naming the file and the expected size.
    name : str or None
        Name used in messages and cache keys; defaults to the file or folder name.

    Attributes
    ----------
    classes : tuple of str
        Sorted class folder names; label ``c`` refers to ``classes[c]``.
    labels : ndarray of int64, shape (n,)
        Label of every image, ordered by class, then by file name.
    members : tuple of str
        Archive member names (zip) or paths relative to ``path`` (directory), shape (n,).

    Raises
    ------
    DataError
        If the path, the split folder or any class folder's images are missing. An empty class
        folder is an error (its class would have no examples).

    Notes
    -----
    The archive is opened lazily, once per process: the open handle is dropped when the object
    is pickled and reopened after a fork, so the source is safe to share with worker processes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str | None = "train",
        *,
        resize: tuple[int, int] | None = None,
        name: str | None = None,
    ) -> None:
        self.path = Path(path)
        self.split = split
        self.resize = check_resize(resize)
        if not self.path.exists():
            raise DataError(
                f"image dataset path '{self.path}' does not exist; point to a directory or .zip "
                f"archive with the layout {LAYOUT_HINT} (named datasets are looked up in the "
                "directory given by the GHOFL_DATA_DIR environment variable)"
            )
        self.is_zip = not self.path.is_dir()
        if self.is_zip and not zipfile.is_zipfile(self.path):
            raise DataError(
                f"image dataset path '{self.path}' is neither a directory nor a zip archive; "
                f"expected the layout {LAYOUT_HINT}"
            )
        self._zip: zipfile.ZipFile | None = None
        self._zip_pid: int | None = None
        if self.is_zip:
            listing = _scan_zip(self._archive(), self.path, split)
        else:
            listing = _scan_directory(self.path, split)
        self.members = listing.members
        self.labels: NDArray[np.int64] = listing.labels
        self.labels.setflags(write=False)
        self.classes: tuple[str, ...] = listing.classes
        self.name = name if name is not None else self.path.stem
        self._first_shape: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.members)

    def __repr__(self) -> str:
        return (
            f"ImageFolderSource(path='{self.path}', split={self.split!r}, n={len(self)}, "
            f"classes={len(self.classes)})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_zip"] = None
        state["_zip_pid"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def close(self) -> None:
        """Close the archive handle of this process (reopened on the next read)."""
        if self._zip is not None and self._zip_pid == os.getpid():
            self._zip.close()
        self._zip = None
        self._zip_pid = None

    def __enter__(self) -> ImageFolderSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _archive(self) -> zipfile.ZipFile:
        if self._zip is None or self._zip_pid != os.getpid():
            try:
                self._zip = zipfile.ZipFile(self.path)
            except (zipfile.BadZipFile, OSError) as exc:
                raise DataError(
                    f"archive '{self.path}' could not be read as a zip file ({exc}); "
                    "re-download or re-create it"
                ) from exc
            self._zip_pid = os.getpid()
        return self._zip

    def describe(self, i: int) -> str:
        """Human-readable location of item ``i`` for error messages."""
        if self.is_zip:
            return f"'{self.members[i]}' inside archive '{self.path}'"
        return f"'{self.path / self.members[i]}'"

    def read_bytes(self, i: int) -> bytes:
        """Return the encoded bytes of item ``i``."""
        try:
            if self.is_zip:
                return self._archive().read(self.members[i])
            return (self.path / self.members[i]).read_bytes()
        except (OSError, zipfile.BadZipFile, KeyError) as exc:
            raise DataError(f"image {self.describe(i)} could not be read ({exc})") from exc

    def _decode(self, i: int) -> NDArray[np.uint8]:
        from PIL import Image

        try:
            with Image.open(io.BytesIO(self.read_bytes(i))) as img:
                rgb = img.convert("RGB")
                if self.resize is not None and rgb.size != (self.resize[1], self.resize[0]):
                    rgb = rgb.resize((self.resize[1], self.resize[0]), Image.Resampling.BILINEAR)
                return np.asarray(rgb, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as exc:
            raise DataError(
                f"image {self.describe(i)} is corrupt or not an image Pillow can decode ({exc}); "
                "replace or remove the file"
            ) from exc

    @property
    def image_shape(self) -> tuple[int, int]:
        """(height, width) of every decoded image: ``resize`` or the size of the first image."""
        if self.resize is not None:
            return self.resize
        if self._first_shape is None:
            h, w = self._decode(0).shape[:2]
            self._first_shape = (int(h), int(w))
        return self._first_shape

    def load_batch(self, indices: Indices) -> NDArray[np.uint8]:
        """Decode the images at ``indices``.

        Parameters
        ----------
        indices : sequence of int, shape (b,)
            Positions in ``[0, len(self))``.

        Returns
        -------
        ndarray of uint8, shape (b, H, W, 3)
            RGB images, H and W as in :attr:`image_shape`.
        """
        require_extra("PIL", "torch")
        idx = _as_index_array(indices, len(self), "ImageFolderSource")
        h, w = self.image_shape
        out = np.empty((idx.size, h, w, 3), dtype=np.uint8)
        for j, i in enumerate(idx.tolist()):
            img = self._decode(i)
            if img.shape[:2] != (h, w):
                raise DataError(
                    f"image {self.describe(i)} is {img.shape[0]}x{img.shape[1]} (height x width) "
                    f"but the dataset's images are {h}x{w} (the size of {self.describe(0)}); "
                    "resize the images beforehand or pass resize=(height, width)"
                )
            out[j] = img
        return out

    def iter_batches(self, batch_size: int) -> Iterator[NDArray[np.uint8]]:
        """Yield consecutive decoded batches of at most ``batch_size`` images."""
        for start in range(0, len(self), batch_size):
            yield self.load_batch(np.arange(start, min(start + batch_size, len(self))))


@dataclass(frozen=True, eq=False)
class ArrayImageSource:
    """An image dataset held in memory.

    Parameters
    ----------
    images : ndarray of uint8, shape (n, H, W, 3)
        RGB images.
    labels : ndarray of int, shape (n,)
        Labels in ``[0, len(classes))``.
    classes : tuple of str
        Class names.
    name : str
        Name used in messages and cache keys.
    """

    images: NDArray[np.uint8]
    labels: NDArray[np.int64]
    classes: tuple[str, ...]
    name: str = "array"

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or self.images.shape[3] != 3:
            raise DataError(
                "ArrayImageSource images must be a uint8 array of shape (n, H, W, 3); got dtype "
                f"{self.images.dtype} and shape {self.images.shape}"
            )
        labels = np.asarray(self.labels).astype(np.int64)
        if labels.shape != (self.images.shape[0],):
            raise DataError(
                f"ArrayImageSource labels must have shape ({self.images.shape[0]},) to match the "
                f"images; got {labels.shape}"
            )
        if labels.size and (labels.min() < 0 or labels.max() >= len(self.classes)):
            raise DataError(
                f"ArrayImageSource labels must lie in [0, {len(self.classes)}) for "
                f"{len(self.classes)} classes; got values from {labels.min()} to {labels.max()}"
            )
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def load_batch(self, indices: Indices) -> NDArray[np.uint8]:
        """Return the images at ``indices``, uint8 of shape (b, H, W, 3)."""
        idx = _as_index_array(indices, len(self), "ArrayImageSource")
        return np.ascontiguousarray(self.images[idx])


_TORCHVISION_DATASETS = ("cifar10", "cifar100", "svhn")


def load_torchvision_dataset(
    name: str,
    root: str | os.PathLike[str] | None = None,
    split: str = "train",
    download: bool = False,
) -> ArrayImageSource:
    """Load CIFAR-10, CIFAR-100 or SVHN through ``torchvision.datasets`` into memory.

    For users with internet access (``download=True``) or with torchvision's files already
    under ``root``. Offline, use an ImageFolder directory or zip through
    :func:`ghofl.data.registry.load_dataset` instead.

    Parameters
    ----------
    name : {"cifar10", "cifar100", "svhn"}
        Dataset name.
    root : str or os.PathLike or None
        torchvision's dataset folder; ``None`` uses ``$GHOFL_DATA_DIR/torchvision``.
    split : str, default "train"
        ``"train"`` or ``"test"`` (SVHN also ``"extra"``).
    download : bool, default False
        Let torchvision download the files when they are missing.

    Returns
    -------
    ArrayImageSource
        Images uint8 (n, 32, 32, 3), labels int64 (n,), class names.

    Raises
    ------
    MissingExtraError
        If torchvision is not installed (``vision`` extra).
    DataError
        If the files are missing (and ``download`` is False) or the download failed.
    """
    key = name.lower().replace("-", "").replace("_", "")
    if key not in _TORCHVISION_DATASETS:
        raise ConfigError(
            f"torchvision dataset name must be one of {', '.join(_TORCHVISION_DATASETS)}; "
            f"got {name!r}"
        )
    splits = ("train", "test", "extra") if key == "svhn" else ("train", "test")
    if split not in splits:
        raise ConfigError(f"split for {key} must be one of {', '.join(splits)}; got {split!r}")
    root_path = _torchvision_root(root)
    require_extra("torchvision", "vision")
    import torchvision

    try:
        if key == "svhn":
            ds = torchvision.datasets.SVHN(str(root_path), split=split, download=download)
            images = np.ascontiguousarray(np.transpose(np.asarray(ds.data), (0, 2, 3, 1)))
            labels = np.asarray(ds.labels)
            classes: tuple[str, ...] = tuple(str(i) for i in range(10))
        else:
            tv_datasets = torchvision.datasets
            cls = tv_datasets.CIFAR10 if key == "cifar10" else tv_datasets.CIFAR100
            ds = cls(str(root_path), train=split == "train", download=download)
            images = np.asarray(ds.data)
            labels = np.asarray(ds.targets)
            classes = tuple(str(c) for c in ds.classes)
    except (RuntimeError, OSError) as exc:
        raise DataError(
            f"torchvision could not load {key} ({split}) from '{root_path}' ({exc}); "
            + ("check the internet connection, or " if download else "pass download=True, or ")
            + "use an offline copy: put an ImageFolder zip or folder in the directory named by "
            f"GHOFL_DATA_DIR with the layout {LAYOUT_HINT}"
        ) from exc
    return ArrayImageSource(images.astype(np.uint8), labels.astype(np.int64), classes, name=key)


def _torchvision_root(root: str | os.PathLike[str] | None) -> Path:
    if root is not None:
        return Path(root)
    env = os.environ.get("GHOFL_DATA_DIR")
    if not env:
        raise ConfigError(
            "load_torchvision_dataset needs a root folder; pass root=... or set the "
            "GHOFL_DATA_DIR environment variable (files then go to $GHOFL_DATA_DIR/torchvision)"
        )
    return Path(env) / "torchvision"
