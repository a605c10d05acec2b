"""Embed a dataset with a frozen encoder, batch by batch, optionally through the cache."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from ghofl.client.cache import cached_embeddings
from ghofl.client.encoders.base import Encoder
from ghofl.errors import ConfigError

__all__ = ["BatchSource", "dataset_key", "embed_dataset", "embed_dataset_cached"]

Indices = NDArray[np.integer[Any]] | Sequence[int]


class BatchSource(Protocol):
    """A dataset: ``labels`` (n,), ``len()``, ``load_batch(indices)`` (images or texts)."""

    @property
    def labels(self) -> NDArray[np.int64]:
        """Class index of every item, shape (n,)."""

    def __len__(self) -> int: ...

    def load_batch(self, indices: Any) -> Any:
        """The items at ``indices``: images or texts, as the encoder takes them."""


def _positions(indices: Indices | None, n: int) -> NDArray[np.int64]:
    if indices is None:
        return np.arange(n, dtype=np.int64)
    idx = np.asarray(indices)
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ConfigError(
            f"indices must be a 1-D array of integer positions; got shape {idx.shape}, "
            f"dtype {idx.dtype}"
        )
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ConfigError(
            f"indices must lie in [0, {n}) for a dataset of {n} items; got values from "
            f"{idx.min()} to {idx.max()}"
        )
    return idx.astype(np.int64)


def embed_dataset(
    source: BatchSource,
    encoder: Encoder,
    indices: Indices | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Embed ``source[indices]`` in batches.

    The next batch is decoded in a background thread while the current one is encoded.

    Parameters
    ----------
    source : BatchSource
        An image source (``load_batch`` -> uint8 (b, H, W, 3)) or a text dataset
        (``load_batch`` -> list of b strings).
    encoder : Encoder
        Maps a batch to float32 (b, d).
    indices : array of int, shape (m,), optional
        Positions to embed, in this order; all items when ``None``.
    batch_size : int, default 64
        Items per encoder call.
    progress : bool, default False
        Show a tqdm progress bar (rate and ETA) on stderr.

    Returns
    -------
    x : ndarray of float32, shape (m, d)
    y : ndarray of int64, shape (m,)
        ``source.labels[indices]``.
    """
    if int(batch_size) < 1:
        raise ConfigError(f"batch_size must be a positive integer; got {batch_size!r}")
    idx = _positions(indices, len(source))
    x = np.empty((idx.size, encoder.dim), dtype=np.float32)
    chunks = [idx[i : i + batch_size] for i in range(0, idx.size, batch_size)]
    bar = _progress_bar(idx.size, encoder.name) if progress else None
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(source.load_batch, chunks[0]) if chunks else None
            start = 0
            for k in range(len(chunks)):
                assert pending is not None
                batch = pending.result()
                if k + 1 < len(chunks):
                    pending = pool.submit(source.load_batch, chunks[k + 1])
                x[start : start + len(chunks[k])] = encoder.embed(batch)
                start += len(chunks[k])
                if bar is not None:
                    bar.update(len(chunks[k]))
    finally:
        if bar is not None:
            bar.close()
    y = np.asarray(source.labels, dtype=np.int64)[idx]
    return x, y


def _progress_bar(total: int, name: str) -> Any:
    from ghofl.errors import require_extra

    require_extra("tqdm", "torch")
    from tqdm.auto import tqdm

    return tqdm(
        total=total, desc=f"embedding ({name})", unit="item", mininterval=1.0, smoothing=0.1
    )


def dataset_key(dataset: str | os.PathLike[str] | BatchSource) -> str:
    """Cache key of a dataset.

    The name of a named dataset, else the name of the file/folder plus 8 hex of the SHA-256 of its
    absolute path, else the source's ``name`` attribute.
    """
    from ghofl.data.registry import available_datasets

    if isinstance(dataset, str | os.PathLike):
        key = str(dataset)
        if key.lower() in available_datasets():
            return key.lower()
        import hashlib

        path = Path(key).expanduser().resolve()
        return f"{path.stem}-{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    name = getattr(dataset, "name", None)
    if not name:
        raise ConfigError(
            "the dataset object has no 'name' attribute to key the cache; pass dataset_key="
        )
    return str(name)


def embed_dataset_cached(
    dataset: str | os.PathLike[str] | BatchSource,
    split: str,
    encoder: Encoder,
    indices: Indices | None = None,
    *,
    key: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Embeddings of ``dataset``/``split`` through the on-disk cache (computed once).

    Parameters
    ----------
    dataset : str, os.PathLike or BatchSource
        A named dataset (``cifar10``, ``trec``, ``sst2``, ``agnews``), an ImageFolder
        directory/zip, or a source object (with a ``name``). A name or path is only opened on a
        cache miss.
    split : str
        Split name (part of the cache key, and the split loaded for names/paths).
    encoder : Encoder
        Its fingerprint is part of the cache key.
    indices : array of int, optional
        Subset of positions (hashed into the key); ``None`` for all.
    key : str, optional
        Override the dataset part of the key (default :func:`dataset_key`).
    data_dir, cache_dir : path, optional
        Data directory (default ``GHOFL_DATA_DIR``) and cache root (default
        ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``).
    batch_size, progress
        As in :func:`embed_dataset`.

    Returns
    -------
    x : ndarray of float32, shape (m, d)
    y : ndarray of int64, shape (m,)
    """
    cache_key = key or dataset_key(dataset)

    def compute() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        if isinstance(dataset, str | os.PathLike):
            from ghofl.data.registry import load_dataset

            source: BatchSource = load_dataset(dataset, split, data_dir=data_dir)
        else:
            source = dataset
        return embed_dataset(source, encoder, indices, batch_size=batch_size, progress=progress)

    rows = (len(indices) if indices is not None
            else None if isinstance(dataset, str | os.PathLike) else len(dataset))
    return cached_embeddings(cache_key, split, encoder, indices, compute, cache_dir=cache_dir,
                             rows=rows)
