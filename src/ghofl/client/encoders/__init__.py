"""Frozen encoders: raw images or texts -> float32 embeddings (b, d).

``get_encoder(name, resolution=224, backend="onnx")`` builds the built-in encoders;
``CallableEncoder`` and ``TorchModuleEncoder`` wrap your own. ``default_clip_norm(info,
transform)`` gives the default per-sample L2 clipping bound R of a shipped encoder (``None`` for
others). Importing this package imports neither torch nor onnxruntime; they are loaded when an
encoder is built.
"""

from ghofl.client.encoders.base import CallableEncoder, Encoder
from ghofl.client.encoders.clipping import (
    DEFAULT_CLIP_NORMS,
    DP_CLIP_NORMS,
    default_clip_norm,
    dp_clip_norm,
    recommended_clip_norm,
)
from ghofl.client.encoders.factory import available_encoders, get_encoder
from ghofl.client.encoders.torch_module import TorchModuleEncoder

__all__ = [
    "DEFAULT_CLIP_NORMS",
    "DP_CLIP_NORMS",
    "CallableEncoder",
    "Encoder",
    "TorchModuleEncoder",
    "available_encoders",
    "default_clip_norm",
    "dp_clip_norm",
    "get_encoder",
    "recommended_clip_norm",
]
