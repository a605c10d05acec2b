"""The input contract of a user's image model file (``onnx:PATH``, ``torchscript:PATH``).

ghofl's image loader decodes every image to uint8 RGB, shape (b, H, W, 3), at its own size.
The contract says how to turn that batch into the tensor the model takes::

    v      uint8 pixel values in [0, 255] (or floats in that range)
    resize to ``size`` (H, W), bilinear (antialiased when shrinking), unless ``resize`` = none
    x    = (v * scale - mean) / std        per channel, float inputs only
    cast to ``dtype``, transpose to ``layout``

It is read from a small JSON file beside the model, ``PATH.json`` (``model.onnx.json``) or
``<stem>.json`` (``model.json``), the first that exists, and from keyword arguments of
:func:`~ghofl.client.encoders.get_encoder` (which win over the file). Keys, all optional:

========  ===========================  ====================================================
key       value                        meaning (default)
========  ===========================  ====================================================
name      str                          encoder name recorded in the fingerprint
                                       (``onnx:<stem>`` / ``torchscript:<stem>``)
dim       int                          expected embedding dimension d (checked; default:
                                       what the model returns)
size      int or [H, W]                model input size (the model's static size, else
                                       the ``resolution`` argument for float inputs; none
                                       for uint8 inputs)
resize    "bilinear" or "none"         how images reach ``size`` (bilinear when a size is
                                       set); ``none``: images must already have it
layout    "NCHW" or "NHWC"             tensor layout (the model's, else NCHW for float and
                                       NHWC for uint8)
dtype     "float32", "float16",        tensor dtype (the model's; TorchScript: float32
          "uint8"                      when scale, mean or std is set, else uint8)
scale     float                        factor applied to the pixel values first (1/255)
mean      [r, g, b]                    subtracted after scaling ([0, 0, 0])
std       [r, g, b]                    divisor after the mean (positive; [1, 1, 1])
input     str                          ONNX only: the input tensor (needed when several)
output    str                          ONNX only: the (batch, d) output (needed when several)
========  ===========================  ====================================================

A uint8 input takes the raw pixels: ``scale``, ``mean`` and ``std`` apply to float inputs only.
ImageNet-normalised models (torchvision, timm) take ``"mean": [0.485, 0.456, 0.406], "std":
[0.229, 0.224, 0.225]``. The resolved contract is recorded in the encoder's fingerprint, so the
same file with another normalisation gives statistics that are refused when added.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, DataError

__all__ = [
    "CONTRACT_KEYS",
    "InputContract",
    "check_contract",
    "contract_file",
    "prepare_images",
    "read_contract",
    "resize_images",
    "resize_matrix",
    "resolve_contract",
]

LAYOUTS = ("NCHW", "NHWC")
INPUT_DTYPES = ("float32", "float16", "uint8")
RESIZES = ("bilinear", "none")
CONTRACT_KEYS = ("name", "dim", "size", "resize", "layout", "dtype", "scale", "mean", "std",
                 "input", "output")


@dataclass(frozen=True)
class InputContract:
    """A resolved input contract (every field set; see the module docstring).

    Attributes
    ----------
    size : tuple of int (H, W) or None
        Model input size; ``None`` with ``resize="none"``: images go in at their own size.
    resize : {"bilinear", "none"}
    layout : {"NCHW", "NHWC"}
    dtype : {"float32", "float16", "uint8"}
    scale : float
    mean, std : tuple of 3 floats
    """

    size: tuple[int, int] | None
    resize: str
    layout: str
    dtype: str
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def describe(self) -> str:
        """Canonical text of the contract, recorded as the fingerprint's preprocessing."""
        return "input contract " + json.dumps(asdict(self), sort_keys=True)

    def input_shape(self, batch: int, height: int, width: int) -> tuple[int, int, int, int]:
        """Shape of the model input for ``batch`` images of (height, width)."""
        h, w = self.size or (height, width)
        return (batch, 3, h, w) if self.layout == "NCHW" else (batch, h, w, 3)


def contract_file(model: Path) -> Path | None:
    """The contract JSON beside ``model``: ``<model>.json`` or ``<stem>.json``, else ``None``."""
    for cand in (model.with_name(model.name + ".json"), model.with_suffix(".json")):
        if cand != model and cand.is_file():
            return cand
    return None


def _str_choice(raw: Any, key: str, choices: tuple[str, ...], where: str) -> str:
    value = raw.upper() if key == "layout" and isinstance(raw, str) else raw
    if value not in choices:
        raise ConfigError(f"{where}: {key} must be one of {', '.join(choices)}; got {raw!r}")
    return str(value)


def _positive_int(raw: Any, key: str, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | np.integer) or int(raw) < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer; got {raw!r}")
    return int(raw)


def _triple(raw: Any, key: str, where: str, positive: bool) -> tuple[float, float, float]:
    ok = isinstance(raw, list | tuple) and len(raw) == 3 and all(
        isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in raw)
    if not ok or (positive and min(raw) <= 0):
        kind = "positive " if positive else ""
        raise ConfigError(f"{where}: {key} must be a list of 3 finite {kind}numbers (one per "
                          f"RGB channel, for values scaled by 'scale'); got {raw!r}")
    return float(raw[0]), float(raw[1]), float(raw[2])


def _size(raw: Any, where: str) -> tuple[int, int]:
    if isinstance(raw, list | tuple) and len(raw) == 2:
        return _positive_int(raw[0], "size", where), _positive_int(raw[1], "size", where)
    if isinstance(raw, int) and not isinstance(raw, bool):
        side = _positive_int(raw, "size", where)
        return side, side
    raise ConfigError(f"{where}: size must be an integer or a pair [height, width]; got {raw!r}")


def _check_value(key: str, raw: Any, where: str) -> Any:
    """One validated contract value (``size`` as a (H, W) pair, ``mean``/``std`` as triples)."""
    if key in ("name", "input", "output"):
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError(f"{where}: {key} must be a non-empty string; got {raw!r}")
        return raw.strip()
    if key == "dim":
        return _positive_int(raw, key, where)
    if key == "size":
        return _size(raw, where)
    if key in ("resize", "layout", "dtype"):
        choices = {"resize": RESIZES, "layout": LAYOUTS, "dtype": INPUT_DTYPES}[key]
        return _str_choice(raw, key, choices, where)
    if key == "scale":
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw < np.inf:
            raise ConfigError(f"{where}: scale must be a positive number; got {raw!r}")
        return float(raw)
    return _triple(raw, key, where, positive=key == "std")


def check_contract(raw: Mapping[str, Any], where: str,
                   keys: tuple[str, ...] = CONTRACT_KEYS) -> dict[str, Any]:
    """Validate the given contract keys (``None`` values are dropped); unknown keys are errors."""
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; the input contract "
                          f"takes {', '.join(keys)}")
    return {k: _check_value(k, v, where) for k, v in raw.items() if v is not None}


def read_contract(
    model: Path, given: Mapping[str, Any] | str | os.PathLike[str] | None,
    overrides: Mapping[str, Any], keys: tuple[str, ...] = CONTRACT_KEYS,
) -> dict[str, Any]:
    """The validated contract values of ``model``.

    Read from the JSON beside it (or ``given``: a mapping or a JSON path), updated with
    ``overrides`` (keyword arguments), each validated.
    """
    values: dict[str, Any] = {}
    if isinstance(given, Mapping):
        values.update(check_contract(given, "input contract", keys))
    else:
        path = Path(given).expanduser() if given is not None else contract_file(model)
        if path is not None:
            values.update(check_contract(_load_json(path), f"input contract '{path}'", keys))
    values.update(check_contract(overrides, "input contract option", keys))
    return values


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DataError(f"input contract file '{path}' does not exist; check the path") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"input contract '{path}' is not valid JSON ({exc}); write an "
                          'object such as {"size": 224, "layout": "NCHW"}') from exc
    if not isinstance(data, dict):
        raise ConfigError(f"input contract '{path}' must hold a JSON object; got "
                          f"{type(data).__name__}")
    return data


def resolve_contract(values: Mapping[str, Any], resolution: int, where: str) -> InputContract:
    """Fill the unset fields of validated contract ``values`` with the defaults.

    ``layout`` and ``dtype`` must be set by the caller: they depend on the model.
    """
    dtype, layout = values["dtype"], values["layout"]
    size = values.get("size")
    if size is None and dtype != "uint8" and values.get("resize") != "none":
        size = (int(resolution), int(resolution))
    resize = values.get("resize", "bilinear" if size is not None else "none")
    if resize == "bilinear" and size is None:
        raise ConfigError(f"{where}: resize 'bilinear' needs a size; set size (e.g. 224)")
    if dtype == "uint8":
        given = sorted(k for k in ("scale", "mean", "std") if k in values)
        if given:
            raise ConfigError(f"{where}: a uint8 input takes the raw pixels, so {', '.join(given)}"
                              " cannot apply; drop them or use dtype float32")
        return InputContract(size, resize, layout, dtype, 1.0, (0.0,) * 3, (1.0,) * 3)
    return InputContract(size, resize, layout, dtype, values.get("scale", 1.0 / 255.0),
                         values.get("mean", (0.0, 0.0, 0.0)), values.get("std", (1.0, 1.0, 1.0)))


# --------------------------------------------------------------------------- preprocessing
def resize_matrix(n_in: int, n_out: int) -> NDArray[np.float64]:
    """Bilinear resampling weights (n_out, n_in), pixel centres aligned (``align_corners=False``).

    Shrinking widens the triangle filter by the scale factor (antialiasing, as PIL and
    ``torch.nn.functional.interpolate(..., antialias=True)`` do); enlarging is plain bilinear
    interpolation (renormalising the weights at the border is the same as repeating the border
    pixels). Rows sum to 1.
    """
    scale = n_in / n_out
    support = max(scale, 1.0)
    centres = (np.arange(n_out) + 0.5) * scale
    pos = np.arange(n_in) + 0.5
    w: NDArray[np.float64] = np.clip(
        1.0 - np.abs(pos[None, :] - centres[:, None]) / support, 0.0, None)
    out: NDArray[np.float64] = w / w.sum(axis=1, keepdims=True)
    return out


def resize_images(x: NDArray[Any], height: int, width: int) -> NDArray[np.float32]:
    """Resize images (b, H, W, 3) to (b, height, width, 3), float32, by :func:`resize_matrix`."""
    if x.shape[1:3] == (height, width):
        return x.astype(np.float32, copy=False)
    wh = resize_matrix(x.shape[1], height).astype(np.float32)
    ww = resize_matrix(x.shape[2], width).astype(np.float32)
    out = np.einsum("ih,bhwc->biwc", wh, x.astype(np.float32, copy=False), optimize=True)
    res: NDArray[np.float32] = np.einsum("jw,biwc->bijc", ww, out, optimize=True)
    return res


def prepare_images(x: NDArray[Any], contract: InputContract, name: str) -> NDArray[Any]:
    """Turn decoded images (b, H, W, 3) (uint8, or floats in [0, 255]) into the model input.

    Returns
    -------
    ndarray
        Of ``contract.dtype``, shape (b, 3, h, w) (NCHW) or (b, h, w, 3) (NHWC), C-contiguous.

    Raises
    ------
    InputError
        With ``resize="none"``, images whose size differs from the contract's.
    """
    from ghofl.errors import InputError

    if contract.size is not None and x.shape[1:3] != contract.size:
        if contract.resize == "none":
            raise InputError(
                f"encoder {name!r} takes images of {contract.size[0]}x{contract.size[1]} "
                f"(its input contract has resize 'none'); got {x.shape[1]}x{x.shape[2]}; resize "
                "the images or set resize to 'bilinear'")
        x = resize_images(x, *contract.size)
    if contract.dtype == "uint8":
        out: NDArray[Any] = np.clip(np.rint(x), 0, 255).astype(np.uint8) \
            if x.dtype != np.uint8 else x
    else:
        mean = np.asarray(contract.mean, dtype=np.float32)
        std = np.asarray(contract.std, dtype=np.float32)
        out = (x.astype(np.float32, copy=False) * np.float32(contract.scale) - mean) / std
        out = out.astype(contract.dtype, copy=False)
    if contract.layout == "NCHW":
        out = out.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(out)
