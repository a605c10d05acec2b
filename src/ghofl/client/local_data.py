"""A client's raw local data -> labelled embeddings, and the embeddings ``.npz`` it writes.

:func:`embed_local_data` is what ``ghofl embed`` and ``ghofl client-stats --data`` run: open a
dataset given by path (:mod:`ghofl.data.by_path`: text files of any supported format, image
layouts), embed it with a frozen encoder through the embedding cache (keyed by a fingerprint
of the content), and return ``x``, ``y``, the class names and the encoder's
:class:`~ghofl.stats.meta.EncoderInfo`.

The archive written by :func:`save_embeddings_npz` is the one ``ghofl client-stats
--embeddings`` reads (:func:`ghofl.data.embeddings.load_embeddings`)::

    x        float32 (n, d)   embeddings
    y        int64 (n,)       labels, indices into ``classes``
    classes  str (C,)         class names
    encoder  str ()           JSON of the EncoderInfo (name, dim, weights hash,
                              preprocessing, resolution): the payload's fingerprint
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import Encoder
from ghofl.data.by_path import DatasetSpec, open_path
from ghofl.errors import InputError, StatsFormatError
from ghofl.files import atomic_write
from ghofl.stats.meta import EncoderInfo

__all__ = [
    "LocalEmbeddings",
    "embed_local_data",
    "read_npz_encoder_info",
    "save_embeddings_npz",
]

ENCODER_KEY = "encoder"


@dataclass(frozen=True)
class LocalEmbeddings:
    """Embeddings of a client's local data.

    Attributes
    ----------
    x : ndarray of float32, shape (n, d)
    y : ndarray of int64, shape (n,)
        Indices into ``classes``.
    classes : tuple of str
        Class names of the data (the given class list, else the file's labels or the image
        class folders).
    info : EncoderInfo
        Fingerprint of the encoder.
    split : str
        The split read (``"all"``: a whole text file, or class folders at the root of an
        image layout).
    n_blank : int
        Blank lines the text reader skipped (0 for images).
    encoding : str
        Encoding of a text file (``""`` for images).
    """

    x: NDArray[np.float32]
    y: NDArray[np.int64]
    classes: tuple[str, ...]
    info: EncoderInfo
    split: str
    n_blank: int = 0
    encoding: str = ""


def embed_local_data(
    data: str | os.PathLike[str] | DatasetSpec,
    encoder: Encoder,
    *,
    split: str | None = None,
    classes: Sequence[str] | None = None,
    coarse: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 64,
    progress: bool = False,
) -> LocalEmbeddings:
    """Embed a client's raw data given by path.

    Parameters
    ----------
    data : path or DatasetSpec
        A text file (all of it), a folder of train/test text files, or an image layout
        (folder or zip); a :class:`DatasetSpec` carries reading options (format, label and
        text columns, held-out fraction).
    encoder : Encoder
        A text encoder for text, an image encoder for images.
    split : str, optional
        See :func:`ghofl.data.by_path.open_path` (default: the whole file of a single text
        file, else ``train``, else the class folders at the root of an image layout).
    classes : sequence of str, optional
        Text: the class list (labels are names in it or indices into it).
    coarse : bool, default False
        Text: keep the part of each label before ``':'``.
    cache_dir : path, optional
        Root of the embedding cache (default ``GHOFL_CACHE_DIR`` or ``~/.cache/ghofl``).
    batch_size : int, default 64
    progress : bool, default False

    Returns
    -------
    LocalEmbeddings

    Raises
    ------
    InputError
        A text encoder given images or an image encoder given texts.
    DataError
        Data that cannot be read (the message names the file, the line and the fix).
    """
    from ghofl.client.embed import embed_dataset_cached
    from ghofl.data.text import TextDataset

    spec = data if isinstance(data, DatasetSpec) else DatasetSpec(str(data))
    source, used = open_path(spec, split, classes, coarse=coarse)
    is_text = isinstance(source, TextDataset)
    if is_text != (encoder.info.resolution is None):
        kind = "text" if is_text else "images"
        raise InputError(
            f"'{spec.path}' holds {kind} but encoder {encoder.name!r} is "
            f"{'an image' if is_text else 'a text'} encoder; embed text with a text encoder "
            "(e.g. minilm) and images with an image encoder (e.g. efficientnet-lite0)"
        )
    key = spec.cache_key(classes, coarse=coarse) if is_text else spec.cache_key()
    x, y = embed_dataset_cached(source, used, encoder, key=key, cache_dir=cache_dir,
                                batch_size=batch_size, progress=progress)
    blank = source.blank_lines if is_text else 0
    encoding = source.encoding if is_text else ""
    return LocalEmbeddings(x, y, tuple(source.classes), encoder.info, used, blank, encoding)


def save_embeddings_npz(path: str | os.PathLike[str], emb: LocalEmbeddings) -> int:
    """Write ``emb`` as an embeddings archive (see the module docstring), atomically.

    Returns
    -------
    int
        Bytes written.
    """
    target = Path(path)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, x=np.ascontiguousarray(emb.x, dtype=np.float32),
                     y=np.ascontiguousarray(emb.y, dtype=np.int64),
                     classes=np.asarray(emb.classes, dtype=str),
                     encoder=np.asarray(json.dumps(emb.info.to_dict(), sort_keys=True)))
            fh.flush()
            os.fsync(fh.fileno())

    atomic_write(target, write)
    return target.stat().st_size


def read_npz_encoder_info(path: str | os.PathLike[str]) -> EncoderInfo | None:
    """The :class:`EncoderInfo` that ``ghofl embed`` stored in an embeddings archive.

    ``None`` when it stores none.

    Raises
    ------
    InputError
        The stored value is not the JSON of an EncoderInfo.
    """
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            if ENCODER_KEY not in z.files:
                return None
            raw: Any = z[ENCODER_KEY]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return None  # load_embeddings reports unreadable archives
    try:
        if raw.ndim != 0 or raw.dtype.kind != "U":
            raise ValueError(f"a {raw.dtype} array of shape {raw.shape}")
        return EncoderInfo.from_dict(json.loads(str(raw)))
    except (ValueError, StatsFormatError) as exc:
        raise InputError(
            f"'{path}': the array '{ENCODER_KEY}' must hold the JSON of the encoder's "
            f"fingerprint, as ghofl embed writes it ({' '.join(str(exc).split())}); embed the "
            "data again or remove that array"
        ) from None
