"""``torchscript:PATH``: a TorchScript image encoder file (``torch`` extra).

The module is loaded on the CPU with ``torch.jit.load`` and called in eval mode under
``torch.inference_mode()``. Its input follows the input contract
(:mod:`ghofl.client.encoders.contract`); without one it takes the decoded images as ghofl's
image loader gives them: a uint8 tensor (b, H, W, 3), so the module does its own conversion,
resizing and normalisation. A contract with ``dtype`` float32 makes it a float NCHW tensor,
resized to ``size`` (default the ``resolution`` argument) and normalised. A contract that
normalises (``scale``, ``mean`` or ``std``) without a ``dtype`` means float32, since a uint8
input takes the raw pixels: ``{"size": 224, "mean": [...], "std": [...]}`` is a float32 NCHW
input. The output must be (b, d).

Save a model for it with ``torch.jit.save(torch.jit.script(model.eval()), "model.pt")`` (or
``torch.jit.trace``).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.contract import InputContract, resolve_contract
from ghofl.client.encoders.model_file import ImageFileEncoder
from ghofl.errors import ConfigError, require_extra

__all__ = ["TorchScriptEncoder"]


def _default_dtype(values: dict[str, Any]) -> str:
    """``float32`` when the contract normalises (``scale``, ``mean`` or ``std``), else ``uint8``."""
    return "float32" if any(k in values for k in ("scale", "mean", "std")) else "uint8"


class TorchScriptEncoder(ImageFileEncoder):
    """A TorchScript file as an image encoder (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.pt`` file written by ``torch.jit.save``.
    resolution : int, default 224
        Input size of a float contract that gives none.
    contract : mapping, path or None
        Input contract; ``None``: the JSON beside the model, if any.
    **options
        Contract keys (``name``, ``dim``, ``size``, ``resize``, ``layout``, ``dtype``, ``scale``,
        ``mean``, ``std``).
    """

    kind = "torchscript"
    keys = ("name", "dim", "size", "resize", "layout", "dtype", "scale", "mean", "std")

    def _load(self) -> Any:
        require_extra("torch", "torch")
        import torch

        try:
            with warnings.catch_warnings():  # torch.jit.load is deprecated in recent torch
                warnings.simplefilter("ignore", DeprecationWarning)
                module = torch.jit.load(  # type: ignore[no-untyped-call]
                    str(self.path), map_location="cpu")
        except Exception as exc:
            raise ConfigError(
                f"'{self.path}' is not a TorchScript file ({type(exc).__name__}); save one with "
                "torch.jit.save(torch.jit.script(model.eval()), PATH)") from exc
        return module.eval()

    def _resolve(self, values: dict[str, Any], resolution: int) -> InputContract:
        self.model  # noqa: B018 - load now, so a bad file fails before the contract
        dtype = values.get("dtype", _default_dtype(values))
        layout = values.get("layout", "NHWC" if dtype == "uint8" else "NCHW")
        return resolve_contract({**values, "dtype": dtype, "layout": layout}, resolution,
                                f"input contract of {self._where()}")

    def _run(self, x: NDArray[Any]) -> NDArray[Any]:
        import torch

        with torch.inference_mode():
            out = self.model(torch.from_numpy(x))
        if not isinstance(out, torch.Tensor):
            raise ConfigError(
                f"{self._where()} must return one tensor of shape (batch, d); it returned "
                f"{type(out).__name__}")
        return np.asarray(out.float().cpu().numpy())
