"""Run any torch module (eager PyTorch, eval mode, no grad) as an :class:`Encoder`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import InfoEncoder, as_image_batch, check_embeddings
from ghofl.errors import ConfigError, require_extra
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import torch

__all__ = ["TorchModuleEncoder"]


class TorchModuleEncoder(InfoEncoder):
    """A torch module ``(b, ...) -> (b, dim)`` as an :class:`Encoder`.

    Parameters
    ----------
    module : torch.nn.Module
        Put in eval mode; called under ``torch.inference_mode()``. Outputs are flattened to
        (b, -1).
    name : str
        Encoder name.
    dim : int
        Embedding dimension d.
    preprocess : callable or None
        Maps the raw batch to the module's input tensor. ``None``: an image batch (b, H, W, 3)
        is passed as a tensor unchanged (uint8 stays uint8), so the module must do its own
        float conversion, resizing and normalisation (as the built-in encoders do).
    info : EncoderInfo or None
        Identity of the encoder; by default built from ``name``, ``dim``, ``weights_hash``,
        ``preprocessing`` and ``resolution``.
    weights_hash, preprocessing : str
        Used when ``info`` is None.
    resolution : int or None
        Used when ``info`` is None.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        name: str,
        dim: int,
        preprocess: Callable[[Any], torch.Tensor] | None = None,
        *,
        info: EncoderInfo | None = None,
        weights_hash: str = "",
        preprocessing: str = "",
        resolution: int | None = None,
    ) -> None:
        require_extra("torch", "torch")
        if int(dim) < 1:
            raise ConfigError(f"encoder dim must be a positive integer; got {dim!r}")
        if info is not None and (info.name != name or info.dim != int(dim)):
            raise ConfigError(
                f"TorchModuleEncoder info describes {info.name!r} with dim {info.dim} but the "
                f"encoder was given name {name!r} and dim {dim}; make them agree"
            )
        self.module = module.eval()
        self._preprocess = preprocess
        self._info = info or EncoderInfo(
            str(name), int(dim), weights_hash, preprocessing, resolution
        )


    def embed(self, batch: Any) -> NDArray[np.float32]:
        """Embed one batch; returns float32 of shape (b, dim)."""
        import torch

        if self._preprocess is not None:
            x = self._preprocess(batch)
        else:
            x = torch.from_numpy(as_image_batch(batch, self.name))
        with torch.inference_mode():
            out = self.module(x)
        out = out.reshape(out.shape[0], -1).float().cpu().numpy()
        return check_embeddings(out, len(batch), self.dim, self.name)

    def __repr__(self) -> str:
        return f"TorchModuleEncoder(name={self.name!r}, dim={self.dim}, backend='torch')"
