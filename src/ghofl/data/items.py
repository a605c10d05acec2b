r"""Unlabelled items to predict: image files, lines of a text file, rows of an embeddings archive.

The image and text readers yield :class:`Item` values one by one (never the whole data set),
each carrying the ``id`` a prediction is reported under and its content, or the reason it
cannot be read:

* :class:`ImageItems`: a single image file, a folder (searched recursively, so class folders
  work too) or a ``.zip`` archive (read in place) of images; ``id`` is the path relative to
  the folder (the member name inside a zip; the file name for a single file), in sorted order.
  Content: RGB uint8 (H, W, 3). An image Pillow cannot decode is an unreadable item.
* :class:`TextLineItems`: a UTF-8 text file, one item per non-blank line; ``id`` is the
  1-based line number (lines end at ``\n``; a trailing ``\r`` is dropped), as an editor
  shows it.
* :class:`EmbeddingRows`: the ``x`` (n, d) array of an embeddings ``.npz`` (what ``ghofl
  evaluate`` reads; ``y`` and ``classes`` are optional here), read in row blocks straight from
  the archive in blocks (:meth:`EmbeddingRows.blocks`); ``id`` is the 0-based row index.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.data.images import IMAGE_EXTENSIONS
from ghofl.errors import DataError, InputError

__all__ = [
    "EmbeddingRows",
    "ImageItems",
    "Item",
    "TextLineItems",
    "decode_image",
    "is_image_path",
]

_IGNORED = frozenset({"__MACOSX"})
#: Rows of an embeddings archive read at once (the reader's memory: block x d numbers).
ROW_BLOCK = 4096


@dataclass(frozen=True)
class Item:
    """One item: its ``id``, its content (``None`` if unreadable) and why it is unreadable."""

    id: str
    value: Any
    error: str = ""


def is_image_path(name: str) -> bool:
    """Whether a file name has an image extension (:data:`~ghofl.data.images.IMAGE_EXTENSIONS`)."""
    base = name.replace("\\", "/").rpartition("/")[2]
    dot = base.rfind(".")
    return dot > 0 and base[dot:].lower() in IMAGE_EXTENSIONS


def decode_image(raw: bytes, where: str) -> NDArray[np.uint8]:
    """Decode encoded image bytes to RGB uint8 (H, W, 3).

    Raises
    ------
    DataError
        The bytes are not an image Pillow can decode; the message names ``where``.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as img:
            return np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError) as exc:
        raise DataError(
            f"image {where} is corrupt or not an image Pillow can decode "
            f"({' '.join(str(exc).split())}); replace or remove the file, or pass "
            "--skip-unreadable"
        ) from exc


def _hidden(parts: tuple[str, ...] | list[str]) -> bool:
    return any(p.startswith(".") or p in _IGNORED for p in parts)


class ImageItems:
    """Images of a file, a folder (recursively) or a zip archive, in sorted ``id`` order.

    Parameters
    ----------
    path : str or os.PathLike
        An image file, a folder or a ``.zip`` archive.

    Attributes
    ----------
    ids : tuple of str
        Paths relative to ``path`` (zip member names; the file name of a single file).

    Raises
    ------
    DataError
        ``path`` does not exist, is not an image, folder or zip, or holds no image.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.is_zip = self.path.is_file() and zipfile.is_zipfile(self.path)
        if not self.path.exists():
            raise DataError(f"--data '{self.path}' does not exist; check the path")
        if self.path.is_dir():
            ids = sorted(
                p.relative_to(self.path).as_posix() for p in self.path.rglob("*")
                if p.is_file() and is_image_path(p.name)
                and not _hidden(p.relative_to(self.path).parts)
            )
        elif self.is_zip:
            with zipfile.ZipFile(self.path) as zf:
                ids = sorted(n for n in zf.namelist() if not n.endswith("/")
                             and is_image_path(n) and not _hidden(n.split("/")))
        elif is_image_path(self.path.name):
            ids = [self.path.name]
        else:
            raise DataError(
                f"--data '{self.path}' is neither an image file "
                f"({', '.join(sorted(IMAGE_EXTENSIONS))}), a folder nor a .zip archive of images"
            )
        if not ids:
            raise DataError(
                f"--data '{self.path}' holds no image files (extensions "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))}); point it at images"
            )
        self.ids: tuple[str, ...] = tuple(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def _where(self, item_id: str) -> str:
        if self.is_zip:
            return f"'{item_id}' inside archive '{self.path}'"
        return f"'{self.path}'" if self.path.is_file() else f"'{self.path / item_id}'"

    def __iter__(self) -> Iterator[Item]:
        zf = zipfile.ZipFile(self.path) if self.is_zip else None
        try:
            for item_id in self.ids:
                where = self._where(item_id)
                try:
                    if zf is not None:
                        raw = zf.read(item_id)
                    else:
                        target = self.path if self.path.is_file() else self.path / item_id
                        raw = target.read_bytes()
                    yield Item(item_id, decode_image(raw, where))
                except (OSError, zipfile.BadZipFile, KeyError) as exc:
                    yield Item(item_id, None, f"image {where} could not be read ({exc})")
                except DataError as exc:
                    yield Item(item_id, None, str(exc))
        finally:
            if zf is not None:
                zf.close()


class TextLineItems:
    """The non-blank lines of a UTF-8 text file (a UTF-8 byte-order mark is dropped).

    ``id`` is the 1-based line number. A line that is not valid UTF-8 is an unreadable item.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"--data '{self.path}' is not a text file; check the path")

    def __len__(self) -> int:
        n = 0
        with open(self.path, "rb") as f:
            for raw in f:
                n += bool(raw.strip())
        return n

    def __iter__(self) -> Iterator[Item]:
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]
                if not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as exc:
                    yield Item(str(number), None,
                               f"line {number} of '{self.path}' is not valid UTF-8 (byte "
                               f"{exc.start}); re-save the file as UTF-8")
                    continue
                yield Item(str(number), text)


class EmbeddingRows:
    """Rows of the ``x`` array of an embeddings ``.npz``, read in blocks of :data:`ROW_BLOCK`.

    Attributes
    ----------
    n, dim : int
        Shape of ``x``.
    encoder : dict or None
        The archive's ``encoder`` record (JSON written by ``ghofl embed``), if any.

    Raises
    ------
    InputError
        Missing or unreadable archive, or no 2-D numeric ``x``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        fix = "write it with numpy.savez(path, x=embeddings) or ghofl embed"
        if not self.path.is_file():
            raise InputError(f"--data '{self.path}' is not an embeddings file; check the path")
        try:
            with zipfile.ZipFile(self.path) as zf:
                names = set(zf.namelist())
                if "x.npy" not in names:
                    raise InputError(
                        f"'{self.path}' has no array 'x' (it holds: "
                        f"{', '.join(sorted(n.removesuffix('.npy') for n in names)) or 'nothing'}"
                        f"); {fix}"
                    )
                with zf.open("x.npy") as f:
                    shape, fortran, dtype = _npy_header(f)
                self.encoder = _encoder_record(zf) if "encoder.npy" in names else None
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise InputError(
                f"'{self.path}' is not a readable .npz archive ({' '.join(str(exc).split())}); "
                f"{fix}"
            ) from exc
        if len(shape) != 2 or dtype.kind not in "fiu":
            raise InputError(
                f"'{self.path}': x must be a 2-D numeric array (n, d); got shape {shape} and "
                f"dtype {dtype}"
            )
        self.n, self.dim = int(shape[0]), int(shape[1])
        self._fortran = fortran
        self._dtype = dtype

    def __len__(self) -> int:
        return self.n

    def blocks(self, block: int = ROW_BLOCK) -> Iterator[NDArray[Any]]:
        """Yield consecutive row blocks of ``x``, each (≤ block, d), in the stored dtype."""
        if self._fortran:  # column-major: rows are not contiguous, read the whole array
            with np.load(self.path, allow_pickle=False) as z:
                x = z["x"]
            for start in range(0, self.n, block):
                yield np.ascontiguousarray(x[start : start + block])
            return
        row_bytes = self.dim * self._dtype.itemsize
        with zipfile.ZipFile(self.path) as zf, zf.open("x.npy") as f:
            _npy_header(f)
            for start in range(0, self.n, block):
                rows = min(block, self.n - start)
                buf = f.read(rows * row_bytes)
                if len(buf) != rows * row_bytes:
                    raise InputError(
                        f"'{self.path}': x is truncated after row "
                        f"{start + len(buf) // max(row_bytes, 1)} of {self.n}; the file is "
                        "corrupt, write it again"
                    )
                yield np.frombuffer(buf, dtype=self._dtype).reshape(rows, self.dim)


def _npy_header(f: IO[bytes]) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    if dtype.hasobject:
        raise ValueError("x holds Python objects")
    return tuple(int(s) for s in shape), bool(fortran), dtype


def _encoder_record(zf: zipfile.ZipFile) -> dict[str, Any] | None:
    with zf.open("encoder.npy") as f:
        raw = np.lib.format.read_array(f, allow_pickle=False)
    if raw.ndim != 0 or raw.dtype.kind != "U":
        return None
    try:
        record = json.loads(str(raw))
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
