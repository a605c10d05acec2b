"""The :class:`Encoder` protocol and the wrapper for any Python callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, InputError
from ghofl.stats.meta import EncoderInfo

__all__ = ["CallableEncoder", "Encoder", "InfoEncoder", "as_image_batch", "check_embeddings"]


@runtime_checkable
class Encoder(Protocol):
    """A frozen encoder: a batch of raw inputs -> float32 embeddings of shape (b, dim).

    ``batch`` is a uint8 (or float, values in [0, 255]) array of RGB images of shape
    (b, H, W, 3) for image encoders, or a list of b strings for text encoders. ``info``
    identifies the encoder (weights, preprocessing, resolution); its fingerprint keys caches
    and must match between clients whose statistics are added.
    """

    @property
    def name(self) -> str:
        """The encoder's name."""

    @property
    def dim(self) -> int:
        """The embedding dimension."""

    @property
    def info(self) -> EncoderInfo:
        """The encoder's identity, recorded in the statistics' metadata."""

    def embed(self, batch: Any) -> NDArray[np.float32]:
        """Embeddings of ``batch``, float32 of shape (b, dim)."""


def check_embeddings(out: Any, batch_size: int, dim: int, name: str) -> NDArray[np.float32]:
    """Validate an encoder output and return it as a C-contiguous float32 (b, dim) array."""
    arr = np.asarray(out)
    if arr.ndim != 2 or arr.shape != (batch_size, dim):
        raise ConfigError(
            f"encoder {name!r} must return an array of shape ({batch_size}, {dim}) for a batch of "
            f"{batch_size}; got shape {arr.shape}; check the declared dim"
        )
    return np.ascontiguousarray(arr, dtype=np.float32)


def as_image_batch(batch: Any, name: str) -> NDArray[Any]:
    """Check that ``batch`` is an (b, H, W, 3) uint8 or float32 array of RGB images."""
    arr = np.asarray(batch)
    if arr.ndim != 4 or arr.shape[3] != 3:
        raise InputError(
            f"image encoder {name!r} expects a batch of RGB images of shape (b, H, W, 3); "
            f"got shape {arr.shape}"
        )
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if np.issubdtype(arr.dtype, np.floating):
        return np.ascontiguousarray(arr, dtype=np.float32)
    raise InputError(
        f"image encoder {name!r} expects uint8 images (or floats in [0, 255]); "
        f"got dtype {arr.dtype}"
    )


class InfoEncoder:
    """Mixin giving ``name``, ``dim`` and ``info`` from the ``_info`` an encoder sets."""

    _info: EncoderInfo

    @property
    def name(self) -> str:
        """The encoder's name."""
        return self._info.name

    @property
    def dim(self) -> int:
        """The embedding dimension."""
        return self._info.dim

    @property
    def info(self) -> EncoderInfo:
        """The encoder's identity."""
        return self._info


class CallableEncoder(InfoEncoder):
    """Wrap any callable ``fn(batch) -> array (b, dim)`` as an :class:`Encoder`.

    Parameters
    ----------
    fn : callable
        Maps a batch (images (b, H, W, 3) or a list of b strings) to an array of shape (b, dim).
    name : str
        Encoder name.
    dim : int
        Embedding dimension d.
    weights_hash, preprocessing : str
        Recorded in :attr:`info` (they define the fingerprint: give a weights hash when the
        callable has learned weights, so caches and statistics tell versions apart).
    resolution : int or None
        Input resolution of an image encoder, recorded in :attr:`info`.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        name: str,
        dim: int,
        *,
        weights_hash: str = "",
        preprocessing: str = "",
        resolution: int | None = None,
    ) -> None:
        if int(dim) < 1:
            raise ConfigError(f"encoder dim must be a positive integer; got {dim!r}")
        self._fn = fn
        self._info = EncoderInfo(str(name), int(dim), weights_hash, preprocessing, resolution)


    def embed(self, batch: Any) -> NDArray[np.float32]:
        """Return ``fn(batch)`` checked to be float32 of shape (len(batch), dim)."""
        return check_embeddings(self._fn(batch), len(batch), self.dim, self.name)

    def __repr__(self) -> str:
        return f"CallableEncoder(name={self.name!r}, dim={self.dim})"
