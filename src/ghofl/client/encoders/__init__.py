"""Frozen encoders: raw images or texts -> float32 embeddings (b, d).

``get_encoder(name, resolution=224, backend="onnx")`` builds the built-in encoders;
``CallableEncoder`` and ``TorchModuleEncoder`` wrap your own. Importing this package imports
neither torch nor onnxruntime; they are loaded when an encoder is built.
"""

from ghofl.client.encoders.base import CallableEncoder, Encoder
from ghofl.client.encoders.factory import available_encoders, get_encoder
from ghofl.client.encoders.torch_module import TorchModuleEncoder

__all__ = [
    "CallableEncoder",
    "Encoder",
    "TorchModuleEncoder",
    "available_encoders",
    "get_encoder",
]
