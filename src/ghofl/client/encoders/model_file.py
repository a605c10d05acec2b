"""A user's image model file as an :class:`~ghofl.client.encoders.Encoder`.

The shared part of ``onnx:PATH`` and ``torchscript:PATH``.

The encoder checks the file, reads its input contract (:mod:`ghofl.client.encoders.contract`),
runs the model once on two blank images to learn (and check) its output dimension, and records
an :class:`~ghofl.stats.meta.EncoderInfo` whose ``weights_hash`` is the SHA-256 of the file's
bytes and whose ``preprocessing`` is the resolved contract: a different file, or the same file
with another contract, gives another fingerprint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import InfoEncoder, as_image_batch, check_embeddings
from ghofl.client.encoders.contract import InputContract, prepare_images, read_contract
from ghofl.errors import ConfigError, DataError
from ghofl.stats.meta import EncoderInfo

__all__ = ["ImageFileEncoder", "model_path"]


def model_path(path: str | os.PathLike[str], kind: str) -> Path:
    """``path`` (``~`` expanded) when it is an existing file, else a :class:`DataError`."""
    text = str(path).strip()
    if not text:
        raise ConfigError(f"encoder '{kind}:' needs a model file path, e.g. {kind}:model.onnx")
    p = Path(text).expanduser()
    if not p.is_file():
        where = "is a directory" if p.is_dir() else "does not exist"
        raise DataError(f"{kind} model file '{p}' {where}; give the path of the model file "
                        f"(--encoder {kind}:PATH)")
    return p


class ImageFileEncoder(InfoEncoder):
    """Base of the model-file image encoders: contract, probe, fingerprint, :meth:`embed`.

    Parameters
    ----------
    path : str or os.PathLike
        The model file.
    resolution : int, default 224
        Input size of a float model whose contract and file give none.
    contract : mapping, path or None
        The input contract (a mapping, or a JSON file); ``None`` reads the JSON beside the
        model, if any.
    **options
        Contract keys given directly (they win over the file).

    Notes
    -----
    Subclasses set :attr:`kind` and :attr:`keys` and implement :meth:`_load`,
    :meth:`_resolve` and :meth:`_run`.
    """

    kind: ClassVar[str] = ""
    keys: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        resolution: int = 224,
        contract: Mapping[str, Any] | str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> None:
        from ghofl.client.encoders.efficientnet_lite import sha256_file

        self.path = model_path(path, self.kind)
        values = read_contract(self.path, contract, options, self.keys)
        self._model: Any = None
        self.contract: InputContract = self._resolve(values, int(resolution))
        dim = self._probe(values.get("dim"), int(resolution))
        size = self.contract.size
        self._info = EncoderInfo(
            values.get("name", f"{self.kind}:{self.path.stem}"), dim, sha256_file(self.path),
            self._describe(), size[0] if size is not None else int(resolution))

    # ----------------------------------------------------------------- subclass hooks
    def _load(self) -> Any:
        """Open the model file (called once, lazily)."""
        raise NotImplementedError

    def _resolve(self, values: dict[str, Any], resolution: int) -> InputContract:
        """The full contract from the given ``values`` and what the model file states."""
        raise NotImplementedError

    def _run(self, x: NDArray[Any]) -> NDArray[Any]:
        """The model's output for the prepared input ``x``."""
        raise NotImplementedError

    def _describe(self) -> str:
        return self.contract.describe()

    def _error_text(self, exc: BaseException) -> str:
        """The informative line of a runtime's error (TorchScript puts the cause last)."""
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        return lines[-1][:300] if lines else type(exc).__name__

    # ----------------------------------------------------------------- shared
    @property
    def model(self) -> Any:
        """The loaded model (loaded on first use, again after unpickling)."""
        if self._model is None:
            self._model = self._load()
        return self._model

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_model"] = None
        return state

    def _where(self) -> str:
        return f"{self.kind} model '{self.path}'"

    def _probe(self, expected_dim: int | None, resolution: int) -> int:
        """Run the model on two blank images; return its output dimension d (checked)."""
        h, w = self.contract.size or (resolution, resolution)
        x = prepare_images(np.zeros((2, h, w, 3), dtype=np.uint8), self.contract, self.kind)
        try:
            out = np.asarray(self._run(x))
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"{self._where()} does not accept the input its contract describes (a "
                f"{self.contract.dtype} tensor of shape {x.shape}, {self.contract.layout}): "
                f"{self._error_text(exc)}; fix the input contract (size, layout, dtype) in the "
                "JSON beside the model") from exc
        if out.ndim != 2 or out.shape[0] != 2:
            raise ConfigError(
                f"{self._where()} must return embeddings of shape (batch, d); for a batch of 2 "
                f"it returned shape {out.shape}; export the model with its pooling and "
                "flattening included (or choose the pooled output)")
        if expected_dim is not None and expected_dim != out.shape[1]:
            raise ConfigError(
                f"{self._where()} returns embeddings of dimension {out.shape[1]} but its input "
                f"contract declares dim {expected_dim}; fix dim or use the matching model file")
        return int(out.shape[1])

    def embed(self, batch: Any) -> NDArray[np.float32]:
        """Embed images (b, H, W, 3) (uint8, or float in [0, 255]); returns float32 (b, dim)."""
        x = as_image_batch(batch, self.name)
        if x.shape[0] == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self._run(prepare_images(x, self.contract, self.name))
        return check_embeddings(out, x.shape[0], self.dim, self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path='{self.path}', name={self.name!r}, dim={self.dim})"
