"""The paper's torchvision backbones as feature extractors (``vision`` extra).

=================  ==============================================  ====
architecture       feature layer                                   d
=================  ==============================================  ====
resnet18           ``fc -> Identity``                              512
resnet50           ``fc -> Identity``                              2048
mobilenet_v2       ``classifier -> Identity``                      1280
efficientnet_b0    ``classifier -> Identity``                      1280
vgg16              ``classifier`` without its last Linear          4096
=================  ==============================================  ====

Preprocessing (inside the module): uint8 NHWC -> ``/255``, bilinear resize to ``resolution``
(default 224, align_corners=False), ImageNet mean/std. Weights: ``"imagenet"`` (torchvision's
IMAGENET1K_V1, from the torch hub cache or downloaded), a path to a local state dict, or ``None``
(random init from ``seed``; the fingerprint says so, for tests only).

No default clipping bound: the norms of these features have no tight bound by construction and
could not be measured where the other defaults were (torchvision was not installable there), so
:func:`~ghofl.client.encoders.default_clip_norm` returns ``None`` for them; choose the clipping
bound R from the norms of your own embeddings, e.g. with the rule of
``benchmarks/bench_clip_norms.py`` (1.25 times the largest norm, rounded up).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ghofl.errors import ConfigError, DataError, require_extra
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import torch

    from ghofl.client.encoders.base import Encoder

__all__ = [
    "TORCHVISION_BACKBONES",
    "build_torchvision_module",
    "torchvision_encoder",
    "torchvision_encoder_info",
]

TORCHVISION_BACKBONES: dict[str, int] = {
    "resnet18": 512,
    "resnet50": 2048,
    "mobilenet_v2": 1280,
    "efficientnet_b0": 1280,
    "vgg16": 4096,
}
Weights = str | os.PathLike[str] | None


def _check(arch: str, resolution: int) -> int:
    if arch not in TORCHVISION_BACKBONES:
        raise ConfigError(
            f"torchvision backbone must be one of {', '.join(TORCHVISION_BACKBONES)}; got {arch!r}"
        )
    if int(resolution) < 32:
        raise ConfigError(f"encoder resolution must be an integer >= 32 pixels; got {resolution!r}")
    return int(resolution)


def _preprocessing(arch: str, resolution: int) -> str:
    layer = "fc" if arch.startswith("resnet") else "classifier"
    return (
        f"uint8 RGB NHWC /255; bilinear resize to {resolution}x{resolution} (align_corners=False); "
        f"ImageNet mean/std; torchvision {arch} with {layer} removed"
    )


def _imagenet_weights(arch: str) -> Any:
    import torchvision

    return torchvision.models.get_model_weights(arch).IMAGENET1K_V1


def _weights_hash(arch: str, weights: Weights, seed: int) -> str:
    if weights is None:
        return f"random-init(seed={seed})"
    if isinstance(weights, str) and weights == "imagenet":
        require_extra("torchvision", "vision")
        return "torchvision:" + os.path.basename(str(_imagenet_weights(arch).url))
    from ghofl.client.encoders.efficientnet_lite import sha256_file

    path = Path(weights)
    if not path.is_file():
        raise DataError(
            f"weights file '{path}' for {arch} does not exist; pass weights='imagenet', a path to "
            "an existing state dict (.pth), or None for random weights"
        )
    return sha256_file(path)


def torchvision_encoder_info(
    arch: str, resolution: int = 224, weights: Weights = "imagenet", seed: int = 0
) -> EncoderInfo:
    """The :class:`EncoderInfo` of a torchvision backbone (``weights_hash`` names the weights)."""
    res = _check(arch, resolution)
    return EncoderInfo(
        arch, TORCHVISION_BACKBONES[arch], _weights_hash(arch, weights, seed),
        _preprocessing(arch, res), res,
    )


def _load_state_dict(model: torch.nn.Module, arch: str, path: Path) -> None:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise DataError(
            f"weights file '{path}' is not a state dict of a torchvision {arch} ({exc}); save one "
            "with torch.save(model.state_dict(), path) from the same architecture"
        ) from exc


def _build_backbone(arch: str, weights: Weights, seed: int) -> torch.nn.Module:
    import torch
    import torchvision

    constructor = getattr(torchvision.models, arch)
    if weights is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model: torch.nn.Module = constructor(weights=None)
        return model
    if isinstance(weights, str) and weights == "imagenet":
        enum = _imagenet_weights(arch)
        try:
            model = constructor(weights=enum)
        except (OSError, RuntimeError) as exc:
            hub = Path(torch.hub.get_dir()) / "checkpoints"
            raise DataError(
                f"the ImageNet weights of {arch} are not in the torch hub cache '{hub}' and could "
                f"not be downloaded ({exc}); connect once to download them, copy the file "
                f"'{os.path.basename(str(enum.url))}' into '{hub}', or pass weights=<path to a "
                "state dict .pth>"
            ) from exc
        return model
    model = constructor(weights=None)
    _load_state_dict(model, arch, Path(weights))
    return model


def build_torchvision_module(
    arch: str, resolution: int = 224, weights: Weights = "imagenet", seed: int = 0
) -> torch.nn.Module:
    """Build the eval-mode module ``(b, H, W, 3) [0, 255] -> (b, d)`` for ``arch``."""
    res = _check(arch, resolution)
    require_extra("torch", "torch")
    require_extra("torchvision", "vision")
    from ghofl.client.encoders._nets import (
        ImageNetPreprocess,
        PreprocessedBackbone,
        strip_classifier,
    )

    body = strip_classifier(arch, _build_backbone(arch, weights, seed))
    return PreprocessedBackbone(ImageNetPreprocess(res), body).eval()


def torchvision_encoder(
    arch: str,
    resolution: int = 224,
    backend: str = "onnx",
    *,
    weights: Weights = "imagenet",
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> Encoder:
    """A torchvision backbone encoder on the ``"onnx"`` or ``"torch"`` backend."""
    _check(arch, resolution)
    require_extra("torchvision", "vision")
    info = torchvision_encoder_info(arch, resolution, weights, seed)
    factory = functools.partial(build_torchvision_module, arch, resolution, weights, seed)
    if backend == "onnx":
        from ghofl.client.encoders.onnx_backend import OnnxEncoder

        return OnnxEncoder(factory, info, cache_dir=cache_dir, threads=threads)
    if backend == "torch":
        from ghofl.client.encoders.torch_module import TorchModuleEncoder

        return TorchModuleEncoder(factory(), info.name, info.dim, info=info)
    raise ConfigError(f"encoder backend must be 'onnx' or 'torch'; got {backend!r}")
