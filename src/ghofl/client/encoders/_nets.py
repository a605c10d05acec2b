"""torch modules of the image encoders (preprocessing inside the graph).

This module imports torch at import time; the rest of ghofl imports it only inside functions,
after :func:`ghofl.errors.require_extra` has checked that torch is installed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _nhwc_to_nchw_float(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2).to(torch.float32)


def _resize(x: torch.Tensor, resolution: int) -> torch.Tensor:
    if x.shape[-2] == resolution and x.shape[-1] == resolution:
        return x
    return F.interpolate(x, size=(resolution, resolution), mode="bilinear", align_corners=False)


class LitePreprocess(nn.Module):
    """uint8/float NHWC RGB in [0, 255] -> float NCHW, bilinear resize, ``(v - 127) / 128``.

    Input shape (b, H, W, 3); output shape (b, 3, resolution, resolution). This is the
    TF-Lite convention of the EfficientNet-Lite weights (``(x*255 - 127)/128`` for x in [0, 1]).
    """

    def __init__(self, resolution: int) -> None:
        super().__init__()
        self.resolution = int(resolution)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (_resize(_nhwc_to_nchw_float(x), self.resolution) - 127.0) / 128.0


class ImageNetPreprocess(nn.Module):
    """uint8/float NHWC RGB in [0, 255] -> ``/255``, bilinear resize, ImageNet mean/std.

    Input shape (b, H, W, 3); output shape (b, 3, resolution, resolution).
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, resolution: int) -> None:
        super().__init__()
        self.resolution = int(resolution)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _resize(_nhwc_to_nchw_float(x) / 255.0, self.resolution)
        return (x - self.mean) / self.std


class LiteFeatures(nn.Module):
    """EfficientNet-Lite feature extractor: preprocessing, ``extract_features``, global mean.

    Maps (b, H, W, 3) images in [0, 255] to (b, 1280) features.
    """

    def __init__(self, net: nn.Module, resolution: int) -> None:
        super().__init__()
        self.preprocess = LitePreprocess(resolution)
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats: torch.Tensor = self.net.extract_features(self.preprocess(x))  # type: ignore[operator]
        return feats.mean(dim=(2, 3))


class PreprocessedBackbone(nn.Module):
    """``body(preprocess(x))`` flattened to (b, d)."""

    def __init__(self, preprocess: nn.Module, body: nn.Module) -> None:
        super().__init__()
        self.preprocess = preprocess
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(self.preprocess(x))
        return out.flatten(1)


def strip_classifier(arch: str, model: nn.Module) -> nn.Module:
    """Replace the classification layer of a torchvision model so it returns features.

    resnet*: ``fc -> Identity`` (512 / 2048); mobilenet_v2, efficientnet_b0:
    ``classifier -> Identity`` (1280); vgg16: ``classifier`` without its last Linear (4096).
    """
    if arch.startswith("resnet"):
        model.fc = nn.Identity()
    elif arch in ("mobilenet_v2", "efficientnet_b0"):
        model.classifier = nn.Identity()
    elif arch == "vgg16":
        classifier = model.classifier
        assert isinstance(classifier, nn.Module)
        children = list(classifier.children())
        model.classifier = nn.Sequential(*children[:-1])
    else:  # pragma: no cover - guarded by the caller
        raise KeyError(arch)
    return model


class CropPreprocess(nn.Module):
    """uint8/float NHWC RGB in [0, 255] -> ``/255``, resize, center crop, mean/std.

    The preprocessing of a library's data config (timm, open_clip) with fixed sizes, so the
    module exports to ONNX: the image is resized to ``resize`` (h, w) (the aspect ratio is not
    kept; no antialiasing; bicubic results clamped to [0, 1]), then its center ``crop`` (h, w)
    is normalised. Input (b, H, W, 3); output (b, 3, crop_h, crop_w).
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, resize: tuple[int, int], crop: tuple[int, int],
                 mean: tuple[float, ...], std: tuple[float, ...],
                 interpolation: str = "bilinear") -> None:
        super().__init__()
        self.resize = (int(resize[0]), int(resize[1]))
        self.crop = (int(crop[0]), int(crop[1]))
        self.interpolation = interpolation
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _nhwc_to_nchw_float(x) / 255.0
        if tuple(x.shape[-2:]) != self.resize:
            corners = None if self.interpolation == "nearest" else False
            x = F.interpolate(x, size=self.resize, mode=self.interpolation,
                              align_corners=corners)
            if self.interpolation == "bicubic":
                x = x.clamp(0.0, 1.0)
        top = (self.resize[0] - self.crop[0]) // 2
        left = (self.resize[1] - self.crop[1]) // 2
        x = x[:, :, top:top + self.crop[0], left:left + self.crop[1]]
        return (x - self.mean) / self.std


class LibraryFeatures(nn.Module):
    """``features(preprocess(x))`` flattened to (b, d); ``features`` is a bound method or module."""

    def __init__(self, preprocess: nn.Module, model: nn.Module, method: str = "forward") -> None:
        super().__init__()
        self.preprocess = preprocess
        self.model = model
        self.method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = getattr(self.model, self.method)(self.preprocess(x))
        return out.flatten(1)


def state_dict_sha256(module: nn.Module) -> str:
    """Hex SHA-256 of a module's state dict: every tensor's name, dtype, shape and bytes."""
    import hashlib

    h = hashlib.sha256()
    for key, value in sorted(module.state_dict().items()):
        t = value.detach().cpu().contiguous()
        h.update(f"{key}\t{t.dtype}\t{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
