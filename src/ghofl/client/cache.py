"""On-disk cache of embeddings, keyed by dataset, split, encoder fingerprint and subset.

Layout (``cache_dir``: argument, else ``GHOFL_CACHE_DIR``, else ``~/.cache/ghofl``)::

    <cache_dir>/embeddings/<dataset>/<split>/<encoder name>-r<resolution>-<fingerprint>/
        <indices key>.npz     x float32 (n, d), y int64 (n,)   (uncompressed)
        <indices key>.json    format, version, key fields, shapes, SHA-256 of x and y

The fingerprint (:meth:`EncoderInfo.fingerprint`) covers the encoder's weights hash,
preprocessing and resolution; the indices key is ``all`` or ``sub-<16 hex of SHA-256 of the
int64 indices>``. Both files are written atomically (:func:`ghofl.files.atomic_write`), data
first. A missing, unreadable or inconsistent pair (bad JSON, other version, ``np.load`` failure,
shape or checksum mismatch) is treated as a miss: recomputed and rewritten, never used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import Encoder
from ghofl.data.cache_dir import CACHE_DIR_ENV, default_cache_dir, subset_key
from ghofl.data.cache_dir import safe_name as _safe
from ghofl.errors import ConfigError
from ghofl.files import atomic_write
from ghofl.stats.meta import EncoderInfo

__all__ = [
    "CACHE_DIR_ENV",
    "CACHE_FORMAT",
    "CACHE_VERSION",
    "cached_embeddings",
    "default_cache_dir",
    "embedding_cache_path",
    "load_cached_embeddings",
    "save_cached_embeddings",
    "subset_key",
]

CACHE_FORMAT = "ghofl-embeddings"
CACHE_VERSION = 1
_log = logging.getLogger(__name__)

EmbeddingArrays = tuple[NDArray[np.float32], NDArray[np.int64]]


def _info(encoder: Encoder | EncoderInfo) -> EncoderInfo:
    return encoder if isinstance(encoder, EncoderInfo) else encoder.info


def embedding_cache_path(
    dataset_key: str,
    split: str,
    encoder: Encoder | EncoderInfo,
    indices: NDArray[np.integer[Any]] | Sequence[int] | str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Path of the ``.npz`` file for this key (its sidecar is the same path with ``.json``)."""
    info = _info(encoder)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    res = f"-r{info.resolution}" if info.resolution else ""
    enc = _safe(f"{info.name}{res}") + "-" + info.fingerprint()
    folder = root / "embeddings" / _safe(dataset_key) / _safe(split) / enc
    return folder / f"{subset_key(indices)}.npz"


def _sha256(a: NDArray[Any]) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).reshape(-1).data).hexdigest()


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """:func:`ghofl.files.atomic_write` through a binary file handle, synced before the rename."""

    def to_file(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())

    atomic_write(path, to_file)


def _validate(x: Any, y: Any, dim: int) -> EmbeddingArrays:
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2 or x.shape[1] != dim or y.shape != (x.shape[0],):
        raise ConfigError(
            f"embeddings to cache must be x of shape (n, {dim}) and y of shape (n,); got x "
            f"{x.shape} and y {y.shape}"
        )
    return np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64)


def save_cached_embeddings(
    path: Path, x: NDArray[Any], y: NDArray[Any], meta: dict[str, Any]
) -> None:
    """Write ``x``, ``y`` to ``path`` and the sidecar ``path.with_suffix('.json')``, atomically."""
    sidecar = {
        "format": CACHE_FORMAT,
        "version": CACHE_VERSION,
        **meta,
        "x_shape": list(x.shape),
        "y_shape": list(y.shape),
        "sha256_x": _sha256(x),
        "sha256_y": _sha256(y),
    }
    _atomic_write(path, lambda fh: np.savez(fh, x=x, y=y))
    _atomic_write(
        path.with_suffix(".json"), lambda fh: fh.write(json.dumps(sidecar, indent=1).encode())
    )


def load_cached_embeddings(path: Path, info: EncoderInfo | None = None) -> EmbeddingArrays | None:
    """Return the cached ``(x, y)`` at ``path`` if present and intact, else ``None``.

    Intact means: the sidecar parses, has this format and version (and, when ``info`` is given,
    its fingerprint), and the arrays load with the recorded shapes, dtypes and checksums.
    """
    sidecar = path.with_suffix(".json")
    if not path.is_file() or not sidecar.is_file():
        return None
    try:
        meta = json.loads(sidecar.read_text())
        if meta.get("format") != CACHE_FORMAT or meta.get("version") != CACHE_VERSION:
            raise ValueError(f"format {meta.get('format')!r} version {meta.get('version')!r}")
        if info is not None and meta.get("fingerprint") != info.fingerprint():
            raise ValueError("encoder fingerprint differs")
        with np.load(path, allow_pickle=False) as npz:
            x, y = npz["x"], npz["y"]
        if (
            x.dtype != np.float32 or y.dtype != np.int64
            or list(x.shape) != meta["x_shape"] or list(y.shape) != meta["y_shape"]
            or _sha256(x) != meta["sha256_x"] or _sha256(y) != meta["sha256_y"]
        ):
            raise ValueError("shape, dtype or checksum mismatch")
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
        _log.warning("ignoring corrupt embedding cache %s (%s); recomputing", path, exc)
        return None
    return x, y


def cached_embeddings(
    dataset_key: str,
    split: str,
    encoder: Encoder | EncoderInfo,
    indices_key: NDArray[np.integer[Any]] | Sequence[int] | str | None,
    compute_fn: Callable[[], tuple[NDArray[Any], NDArray[Any]]],
    cache_dir: str | os.PathLike[str] | None = None,
    rows: int | None = None,
) -> EmbeddingArrays:
    """Return cached embeddings for the key, or compute, store and return them.

    Parameters
    ----------
    dataset_key : str
        Dataset identity, e.g. ``"cifar10"``.
    split : str
        Split name, e.g. ``"train"``.
    encoder : Encoder or EncoderInfo
        Its fingerprint (weights, preprocessing, resolution) is part of the key.
    indices_key : array of int, str or None
        The subset: ``None`` (everything) -> ``"all"``; an index array is hashed; a string is
        used as is.
    compute_fn : callable
        ``() -> (x (n, d), y (n,))``, called only on a miss (or a corrupt entry).
    cache_dir : str or os.PathLike or None
        Root of the cache; ``None`` uses ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``.
    rows : int, optional
        The number of rows the entry must hold (the length of the source when ``indices_key`` is
        ``None``): an entry of another length (a source of the same name that grew or shrank)
        is recomputed and replaced, never returned.

    Returns
    -------
    x : ndarray of float32, shape (n, d)
    y : ndarray of int64, shape (n,)
    """
    info = _info(encoder)
    path = embedding_cache_path(dataset_key, split, info, indices_key, cache_dir)
    hit = load_cached_embeddings(path, info)
    if hit is not None and (rows is None or len(hit[1]) == rows):
        return hit
    if indices_key is not None and not isinstance(indices_key, str):
        # A subset of a split whose full embeddings are cached is a slice of them: no encoding.
        whole = load_cached_embeddings(
            embedding_cache_path(dataset_key, split, info, None, cache_dir), info
        )
        idx = np.asarray(indices_key, dtype=np.int64)
        if whole is not None and (idx.size == 0 or (idx.min() >= 0 and idx.max() < len(whole[1]))):
            return np.ascontiguousarray(whole[0][idx]), whole[1][idx]
    x, y = _validate(*compute_fn(), dim=info.dim)
    meta = {
        "dataset": dataset_key,
        "split": split,
        "indices": subset_key(indices_key),
        "encoder": info.to_dict(),
        "fingerprint": info.fingerprint(),
    }
    save_cached_embeddings(path, x, y, meta)
    return x, y

