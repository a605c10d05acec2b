"""CIFAR-10 from its official python archive (``cifar-10-python.tar.gz``), read without torchvision.

The archive (Krizhevsky, 2009; https://www.cs.toronto.edu/~kriz/cifar.html) holds
``cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta, readme.html}``. Every batch is
a Python 2 pickle of a dict whose ``data`` is a uint8 array (10000, 3072) (channel-major: 1024
red, 1024 green, 1024 blue values of a 32×32 image, rows first) and whose ``labels`` is a list of
10000 ints; ``batches.meta`` names the classes (``label_names``). These are the canonical pixels
(the ImageFolder ``cifar10.zip`` holds JPEG re-encodings of them), so the two sources get
different embedding-cache keys (``cifar10-python`` here, ``cifar10`` for the zip).

The pickles are read member by member straight from the compressed archive (nothing is
extracted) by a restricted unpickler that can build nothing but plain containers, strings,
numbers and plain numeric numpy arrays: a tampered archive whose pickles name any other
callable is refused before that callable is looked up, so it cannot run code.

:func:`ensure_cifar10_archive` finds the archive in the data directory or the cache, or
downloads it (:func:`ghofl.data.download.download_file`: progress bar, MD5 check, atomic).
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.data.images import ArrayImageSource
from ghofl.errors import DataError

__all__ = [
    "CIFAR10_ARCHIVE",
    "CIFAR10_FOLDER",
    "CIFAR10_MD5",
    "CIFAR10_URL",
    "CIFAR10_URL_ENV",
    "CifarArchiveSource",
    "cached_archive_path",
    "cifar10_url",
    "ensure_cifar10_archive",
    "find_cifar10_archive",
    "manual_download_hint",
    "read_cifar10_archive",
    "safe_unpickle",
]

#: Official address of the archive and its published MD5 (about 163 MiB).
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_FOLDER = "cifar-10-batches-py"
#: Environment variable naming a mirror of the archive (same bytes, same MD5).
CIFAR10_URL_ENV = "GHOFL_CIFAR10_URL"
#: Cache key of the canonical pixels (the ImageFolder zip keeps ``cifar10``).
SOURCE_NAME = "cifar10-python"

_SPLIT_MEMBERS = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}
_META = "batches.meta"
_MAX_MEMBER_BYTES = 64 << 20  # a real batch pickle is about 31 MB
_SIDE = 32
_PIXELS = 3 * _SIDE * _SIDE


@dataclass(frozen=True, eq=False)
class CifarArchiveSource(ArrayImageSource):
    """CIFAR-10 images read from the python archive, held in memory (uint8 (n, 32, 32, 3))."""

    @property
    def cache_key(self) -> str:
        """Dataset part of the embedding-cache key: ``cifar10-python`` (canonical pixels).

        Distinct from ``cifar10`` (the ImageFolder zip of JPEG re-encodings).
        """
        return SOURCE_NAME


class _NdarrayMarker:
    """Stand-in for ``numpy.ndarray`` inside a pickle.

    Accepted as the array type argument of ``_reconstruct`` but not callable, so a pickle cannot
    allocate arrays of its choosing.
    """


_NDARRAY = _NdarrayMarker()


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> NDArray[Any]:
    """Safe stand-in for ``numpy.core.multiarray._reconstruct``.

    An empty array that the pickle's BUILD step then fills (``ndarray.__setstate__``,
    bounded by the pickle's bytes).
    """
    if subtype is not _NDARRAY or tuple(shape) != (0,):
        raise pickle.UnpicklingError("array reconstruction with unexpected arguments")
    return np.empty((0,), dtype=np.uint8)


def _dtype(spec: Any, align: Any = 0, copy: Any = 1) -> np.dtype[Any]:
    """Safe stand-in for ``numpy.dtype``: plain integer, unsigned, float or bool types only."""
    text = spec.decode("ascii") if isinstance(spec, bytes) else spec
    if not isinstance(text, str) or len(text) > 4:
        raise pickle.UnpicklingError(f"unexpected numpy dtype {spec!r}")
    dt = np.dtype(text)
    if dt.kind not in "biuf" or dt.itemsize > 8 or dt.fields is not None or dt.subdtype:
        raise pickle.UnpicklingError(f"unexpected numpy dtype {spec!r}")
    return np.dtype(text, bool(align), True)  # a copy, which the pickle's BUILD may set up


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _dtype,
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the numpy names a CIFAR batch needs, to safe stand-ins."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"the pickle refers to {module}.{name}, which a CIFAR batch never does"
            ) from None


def safe_unpickle(data: bytes, what: str) -> Any:
    """Unpickle ``data`` (a CIFAR batch), allowing only plain data.

    Nothing but containers, strings, numbers and plain numeric numpy arrays.

    Parameters
    ----------
    data : bytes
        The pickle (Python 2 or 3, any protocol); Python 2 strings come back as ``bytes``.
    what : str
        Name used in error messages (archive and member).

    Raises
    ------
    DataError
        The pickle is malformed or names any other callable (e.g. ``os.system``); nothing in it
        is executed.
    """
    try:
        return _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, MemoryError, UnicodeDecodeError, OverflowError) as exc:
        raise DataError(
            f"{what} is not a genuine CIFAR-10 batch ({exc}); it was not used and nothing in it "
            f"was run. Delete the file and download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})"
        ) from None


def _text_key(key: Any) -> Any:
    return key.decode("latin-1") if isinstance(key, bytes) else key


def _as_dict(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise DataError(f"{what} holds a {type(obj).__name__}, not the dict of a CIFAR-10 batch; "
                        f"download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})")
    return {_text_key(k): v for k, v in obj.items()}


def _parse_batch(obj: Any, what: str) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    d = _as_dict(obj, what)
    data, labels = d.get("data"), d.get("labels")
    if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2
            or data.shape[1] != _PIXELS):
        got = (f"dtype {data.dtype}, shape {data.shape}" if isinstance(data, np.ndarray)
               else type(data).__name__)
        raise DataError(f"{what}: 'data' must be a uint8 array of shape (n, {_PIXELS}); got "
                        f"{got}. Download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})")
    if not isinstance(labels, list | np.ndarray) or len(labels) != data.shape[0]:
        raise DataError(f"{what}: 'labels' must be a list of {data.shape[0]} ints (one per "
                        f"image); download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})")
    try:
        y = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise DataError(f"{what}: 'labels' must be ints; download {CIFAR10_URL} again") from None
    images = data.reshape(-1, 3, _SIDE, _SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), y


def _parse_meta(obj: Any, what: str) -> tuple[str, ...]:
    names = _as_dict(obj, what).get("label_names")
    if not isinstance(names, list) or not names or not all(
        isinstance(n, bytes | str) for n in names
    ):
        raise DataError(f"{what}: 'label_names' must be a non-empty list of class names; "
                        f"download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})")
    return tuple(n.decode("utf-8") if isinstance(n, bytes) else n for n in names)


def _archive_members(path: Path, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
    """(base name, bytes) of the wanted members of a .tar.gz, stopping once all are read."""
    try:
        with tarfile.open(path, "r:*") as tf:
            left = set(wanted)
            for member in tf:
                base = member.name.rstrip("/").rpartition("/")[2]
                if base not in left or not member.isfile():
                    continue
                if member.size > _MAX_MEMBER_BYTES:
                    raise DataError(f"'{path}': member {member.name} is {member.size:,} bytes, "
                                    "far more than a CIFAR-10 batch; it is not the official "
                                    f"archive. Download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})")
                fh = tf.extractfile(member)
                assert fh is not None  # a regular file
                yield base, fh.read()
                left.discard(base)
                if not left:
                    return
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise DataError(f"'{path}' is not a readable .tar.gz archive ({exc}); delete it and "
                        f"download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})") from None


def _folder_members(folder: Path, wanted: set[str]) -> Iterator[tuple[str, bytes]]:
    for base in sorted(wanted):
        p = folder / base
        if p.is_file():
            if p.stat().st_size > _MAX_MEMBER_BYTES:
                raise DataError(f"'{p}' is {p.stat().st_size:,} bytes, far more than a "
                                f"CIFAR-10 batch; download {CIFAR10_URL} again")
            yield base, p.read_bytes()


def _batches_folder(path: Path) -> Path | None:
    """The folder holding the batch files when ``path`` is an extracted archive, else None."""
    for cand in (path, path / CIFAR10_FOLDER):
        if (cand / _META).is_file():
            return cand
    return None


def read_cifar10_archive(
    path: str | os.PathLike[str], split: str = "train"
) -> CifarArchiveSource:
    """Read one split of CIFAR-10 from the official python archive.

    Parameters
    ----------
    path : path
        ``cifar-10-python.tar.gz``, or the folder it extracts to (``cifar-10-batches-py``, or
        its parent).
    split : {"train", "test"}
        ``train``: the 50,000 images of ``data_batch_1..5`` in order; ``test``: the 10,000 of
        ``test_batch``.

    Returns
    -------
    CifarArchiveSource
        An :class:`~ghofl.data.images.ArrayImageSource`: images uint8 (n, 32, 32, 3) RGB,
        labels int64 (n,), the class names of ``batches.meta``, name ``"cifar10-python"``
        (the embedding-cache key).

    Raises
    ------
    DataError
        A missing file or member, a corrupt archive, or a batch that is not a genuine CIFAR-10
        pickle (including one that tries to run code: it is refused unexecuted).
    """
    if split not in _SPLIT_MEMBERS:
        raise DataError(f"CIFAR-10 has splits 'train' and 'test'; got split {split!r}")
    p = Path(path).expanduser()
    wanted = set(_SPLIT_MEMBERS[split]) | {_META}
    members: Callable[[], Iterator[tuple[str, bytes]]]
    folder = _batches_folder(p) if p.is_dir() else None
    if folder is not None:
        members = lambda: _folder_members(folder, wanted)  # noqa: E731
    elif p.is_file():
        members = lambda: _archive_members(p, wanted)  # noqa: E731
    else:
        raise DataError(f"'{p}' is neither {CIFAR10_ARCHIVE} nor a {CIFAR10_FOLDER} folder "
                        f"holding {_META}; {manual_download_hint(None)}")
    found: dict[str, bytes] = dict(members())
    missing = sorted(wanted - set(found))
    if missing:
        raise DataError(f"'{p}' lacks {', '.join(missing)}, so it is not a complete CIFAR-10 "
                        f"python archive; download {CIFAR10_URL} again (MD5 {CIFAR10_MD5})")
    classes = _parse_meta(safe_unpickle(found[_META], f"'{p}' ({_META})"), f"'{p}' ({_META})")
    images, labels = [], []
    for base in _SPLIT_MEMBERS[split]:
        what = f"'{p}' ({base})"
        x, y = _parse_batch(safe_unpickle(found.pop(base), what), what)
        if y.size and (y.min() < 0 or y.max() >= len(classes)):
            raise DataError(f"{what}: labels must lie in [0, {len(classes)}); got values from "
                            f"{y.min()} to {y.max()}. Download {CIFAR10_URL} again")
        images.append(x)
        labels.append(y)
    return CifarArchiveSource(np.concatenate(images), np.concatenate(labels), classes,
                              name=SOURCE_NAME)


def cifar10_url() -> str:
    """The archive's address: ``GHOFL_CIFAR10_URL`` (a mirror) when set, else the official one."""
    return os.environ.get(CIFAR10_URL_ENV, "").strip() or CIFAR10_URL


def cached_archive_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where a downloaded archive is kept: ``<cache dir>/data/cifar-10-python.tar.gz``.

    The cache dir is the argument, else ``GHOFL_CACHE_DIR``, else ``~/.cache/ghofl``.
    """
    from ghofl.data.cache_dir import default_cache_dir

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "data" / CIFAR10_ARCHIVE


def _places(data_dir: str | os.PathLike[str] | None,
            cache_dir: str | os.PathLike[str] | None) -> str:
    places = [f"'{Path(data_dir) / CIFAR10_ARCHIVE}'"] if data_dir is not None else []
    places.append(f"'{cached_archive_path(cache_dir)}'")
    return (f"put it, unchanged, at {' or '.join(places)}"
            + ("" if data_dir is not None else " (or in the folder named by GHOFL_DATA_DIR)"))


def manual_download_hint(data_dir: str | os.PathLike[str] | None,
                         cache_dir: str | os.PathLike[str] | None = None) -> str:
    """One sentence telling a user without internet what to download and where to put it."""
    return (f"download {CIFAR10_URL} (MD5 {CIFAR10_MD5}, about 163 MiB) and "
            + _places(data_dir, cache_dir))


def find_cifar10_archive(data_dir: str | os.PathLike[str] | None,
                         cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The python archive (or its extracted folder) in ``data_dir``, else the cached download.

    ``None`` when there is neither.
    """
    cands: list[Path] = []
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        cands += [root / CIFAR10_ARCHIVE, root / CIFAR10_FOLDER]
    cands.append(cached_archive_path(cache_dir))
    for c in cands:
        if c.is_file() or (c.is_dir() and _batches_folder(c) is not None):
            return c
    return None


def ensure_cifar10_archive(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    url: str | None = None,
    md5: str = CIFAR10_MD5,
    progress: bool = True,
    timeout: float = 60.0,
) -> Path:
    """The CIFAR-10 python archive: found (:func:`find_cifar10_archive`) or downloaded.

    A download goes to :func:`cached_archive_path` and is kept only when its MD5 is ``md5``.

    Parameters
    ----------
    data_dir : path, optional
        Searched first (``cifar-10-python.tar.gz`` or ``cifar-10-batches-py/``).
    cache_dir : path, optional
        Cache root (default ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``).
    url : str, optional
        Where to download from (default :func:`cifar10_url`).
    md5 : str
        Expected MD5 of the archive (the published one by default).
    progress : bool, default True
        Show a progress bar.
    timeout : float, default 60
        Seconds before an unresponsive server counts as offline.

    Raises
    ------
    DataError
        Offline or a bad download: the message names the URL, the MD5 and where to put the
        file by hand.
    """
    from ghofl.data.download import download_file

    found = find_cifar10_archive(data_dir, cache_dir)
    if found is not None:
        return found
    src = url or cifar10_url()
    dest = cached_archive_path(cache_dir)
    return download_file(src, dest, md5=md5, progress=progress, timeout=timeout,
                         manual_hint=_places(data_dir, cache_dir),
                         desc="CIFAR-10 (python archive)")
