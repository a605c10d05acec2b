"""``timm:NAME`` and ``open_clip:MODEL@TAG``: image encoders of two model libraries.

``timm:NAME[@WEIGHTS_FILE]`` (``timm`` extra) builds ``timm.create_model(NAME, pretrained=True,
num_classes=0)``: the network with its classifier removed, so it returns its pooled features.
The pretrained weights come as timm provides them: from the Hugging Face cache when they are
there (no network used), else downloaded once into it; when they are not cached and cannot be
downloaded (``HF_HUB_OFFLINE`` set, or the hub does not answer) the error is one line naming
the fix, without the hub's retries (:mod:`ghofl.client.encoders.hub`). ``@WEIGHTS_FILE`` (or
the ``weights`` option) loads a local ``.safetensors``/``.pth`` file instead, through timm's
``pretrained_cfg_overlay``.

``open_clip:MODEL@TAG`` (``open_clip`` extra) builds ``open_clip.create_model_and_transforms(
MODEL, pretrained=TAG)`` and embeds with ``encode_image`` (not normalised). ``TAG`` is a
pretrained tag (``open_clip.list_pretrained_tags_by_model(MODEL)``, e.g. ``laion2b_s34b_b79k``)
or a local weights file; ``open_clip:hf-hub:ORG/NAME`` needs none. Pretrained weights are
looked up as timm's are (the Hugging Face cache first).

A vision transformer's attention layers (``torch.nn.MultiheadAttention``) export to ONNX
through their composite path (:func:`~ghofl.client.encoders.onnx_backend.mha_slow_path`), so
ViT models run on the default ONNX backend and export with their head.

Preprocessing comes from the library's own data config: timm's ``resolve_data_config``
(``input_size``, ``crop_pct``, ``crop_mode``, ``interpolation``, ``mean``, ``std``), or the
``Resize``/``CenterCrop``/``Normalize`` steps of open_clip's evaluation transform. It runs
inside the encoder's graph (:class:`~ghofl.client.encoders._nets.CropPreprocess`): ``/255``,
resize to a fixed square (timm: ``floor(size / crop_pct)``; the aspect ratio is not kept and
there is no antialiasing, as in the other built-in image encoders), center crop, mean/std. The
``resolution`` argument of :func:`~ghofl.client.encoders.get_encoder` is ignored: the crop size
is recorded as the resolution.

Fingerprint: ``weights_hash`` is the SHA-256 of the loaded network's state dict (every tensor's
name, dtype, shape and bytes), so the same weights from the hub or from a local file agree, and
``preprocessing`` records the resolved sizes, interpolation, mean and std. The name is the spec
with a weights file reduced to its file name (``timm:resnet18@resnet18.safetensors``), so sites
whose copies sit at different paths agree.

Both run on ONNX Runtime (default; exported once and cached) or eager PyTorch. No default
clipping bound (:func:`~ghofl.client.encoders.default_clip_norm` returns ``None``).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ghofl.errors import ConfigError, DataError, require_extra
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import torch

    from ghofl.client.encoders.base import Encoder

__all__ = ["open_clip_encoder", "split_spec", "timm_encoder"]

T = TypeVar("T")
_WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
_PIL_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic"}
_MODES = ("nearest", "bilinear", "bicubic")


def split_spec(kind: str, spec: str, weights: str | os.PathLike[str] | None) -> tuple[str, str]:
    """``NAME@WEIGHTS`` -> (NAME, WEIGHTS); ``weights`` (the option) instead of ``@WEIGHTS``.

    Raises
    ------
    ConfigError
        An empty name, or weights given both ways.
    """
    name, _, at = str(spec).strip().partition("@")
    name, at = name.strip(), at.strip()
    if not name:
        raise ConfigError(f"encoder '{kind}:' needs a model name, e.g. {kind}:"
                          + ("resnet50" if kind == "timm" else "ViT-B-32@laion2b_s34b_b79k"))
    if at and weights is not None:
        raise ConfigError(f"encoder '{kind}:{spec}' names its weights twice (after '@' and in "
                          "the weights option); give one")
    return name, at or ("" if weights is None else str(weights))


def _weights_file(kind: str, value: str, *, required: bool) -> Path | None:
    """The local weights file ``value`` names; ``None`` for a tag (when not ``required``)."""
    path = Path(value).expanduser()
    if path.is_file():
        return path
    looks_like_file = ("/" in value or "\\" in value or value.lower().endswith(_WEIGHT_SUFFIXES))
    if required or looks_like_file:
        where = "is a directory" if path.is_dir() else "does not exist"
        raise DataError(f"{kind} weights file '{path}' {where}; give an existing .safetensors or "
                        f".pth file ({kind}:NAME@PATH)")
    return None


def _size_pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    seq = [int(v) for v in value]
    return (seq[0], seq[0]) if len(seq) == 1 else (seq[-2], seq[-1])


def _mode(value: Any) -> str:
    if isinstance(value, int):
        return _PIL_MODES.get(value, "bilinear")
    text = str(getattr(value, "value", value)).lower()
    return text if text in _MODES else "bilinear"


def _floats(values: Sequence[Any]) -> tuple[float, ...]:
    out = tuple(round(float(v), 6) for v in values)
    if len(out) == 1:
        out = out * 3
    if len(out) != 3:
        raise ConfigError(f"image mean/std must have 3 values (RGB); got {list(values)}")
    return out


def _describe(lib: str, resize: tuple[int, int], crop: tuple[int, int], mode: str,
              mean: tuple[float, ...], std: tuple[float, ...]) -> str:
    return (f"{lib}; uint8 RGB NHWC /255; {mode} resize to {resize[0]}x{resize[1]} (aspect "
            f"ratio not kept, no antialias); center crop {crop[0]}x{crop[1]}; "
            f"mean={list(mean)} std={list(std)}")


def _same(module: torch.nn.Module) -> torch.nn.Module:
    return module


def _finish(module: torch.nn.Module, name: str, preprocessing: str, crop: tuple[int, int],
            weights_of: torch.nn.Module, backend: str,
            options: dict[str, Any]) -> Encoder:
    """Probe the output dimension, record the fingerprint, wrap for the backend."""
    import torch

    from ghofl.client.encoders._nets import state_dict_sha256

    module = module.eval()
    with torch.inference_mode():
        out = module(torch.zeros((2, crop[0], crop[1], 3), dtype=torch.uint8))
    if out.ndim != 2 or out.shape[0] != 2:
        raise ConfigError(f"encoder {name!r} returns features of shape {tuple(out.shape)} for a "
                          "batch of 2, not (batch, d); choose a model with pooled features")
    info = EncoderInfo(name, int(out.shape[1]), state_dict_sha256(weights_of), preprocessing,
                       crop[0])
    if backend == "onnx":
        from ghofl.client.encoders.onnx_backend import OnnxEncoder

        return OnnxEncoder(functools.partial(_same, module), info, **options)
    if backend == "torch":
        from ghofl.client.encoders.torch_module import TorchModuleEncoder

        return TorchModuleEncoder(module, info.name, info.dim, info=info)
    raise ConfigError(f"encoder backend must be 'onnx' or 'torch'; got {backend!r}")


def _weights_error(kind: str, model: str, source: str, exc: BaseException) -> DataError:
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return DataError(
        f"the {source} weights of {kind} model '{model}' could not be loaded "
        f"({type(exc).__name__}: {first}); {_local_weights_fix(kind, model)}")


def _local_weights_fix(kind: str, model: str) -> str:
    return f"give a local weights file: --encoder {kind}:{model}@/path/to/weights.safetensors"


def _load_pretrained(kind: str, model: str, source: str, build: Callable[[], T]) -> T:
    """``build()`` with hub weights from the cache first (:func:`~.hub.cache_first`).

    Raises
    ------
    DataError
        The weights are not cached and cannot be downloaded (offline, or the hub does not
        answer), or they cannot be loaded; one line naming the fix.
    """
    from ghofl.client.encoders.hub import cache_first

    try:
        return cache_first(lambda _local_only: build(),
                           f"the {source} weights of {kind} model '{model}' are",
                           _local_weights_fix(kind, model))
    except DataError:
        raise
    except Exception as exc:
        raise _weights_error(kind, model, source, exc) from exc


def _timm_preprocess(cfg: dict[str, Any]) -> tuple[tuple[int, int], tuple[int, int], str,
                                                   tuple[float, ...], tuple[float, ...]]:
    crop = _size_pair(cfg.get("input_size", (3, 224, 224)))
    pct = float(cfg.get("crop_pct") or 0.875)
    resize = crop
    if cfg.get("crop_mode", "center") != "squash":
        resize = (max(crop[0], math.floor(crop[0] / pct)), max(crop[1], math.floor(crop[1] / pct)))
    mean = _floats(cfg.get("mean", (0.485, 0.456, 0.406)))
    std = _floats(cfg.get("std", (0.229, 0.224, 0.225)))
    return resize, crop, _mode(cfg.get("interpolation", "bilinear")), mean, std


def timm_encoder(spec: str, backend: str = "onnx", *, weights: str | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 threads: int | None = None) -> Encoder:
    """The encoder of ``timm:SPEC`` (module docstring).

    Parameters
    ----------
    spec : str
        ``NAME`` or ``NAME@WEIGHTS_FILE``.
    backend : {"onnx", "torch"}, default "onnx"
    weights : str or None
        A local weights file (instead of ``@WEIGHTS_FILE``); ``None``: timm's pretrained ones.
    cache_dir, threads
        Of the ONNX backend (:class:`~ghofl.client.encoders.onnx_backend.OnnxEncoder`).

    Raises
    ------
    ConfigError
        An unknown model or a bad spec.
    DataError
        Weights that cannot be loaded (not cached offline, a missing file).
    MissingExtraError
        Without the ``timm`` extra.
    """
    require_extra("torch", "timm")
    require_extra("timm", "timm")
    import timm
    import timm.data

    from ghofl.client.encoders._nets import CropPreprocess, LibraryFeatures

    model_name, given = split_spec("timm", spec, weights)
    path = _weights_file("timm", given, required=True) if given else None
    is_model = getattr(timm, "is_model", None)
    if is_model is not None and not is_model(model_name):
        raise ConfigError(f"unknown timm model {model_name!r}; list the names with "
                          "timm.list_models() (e.g. timm:resnet50, timm:vit_small_patch16_224)")
    kwargs: dict[str, Any] = {"pretrained": True, "num_classes": 0}
    if path is not None:
        kwargs["pretrained_cfg_overlay"] = {"file": str(path)}
    if path is not None:
        try:
            net = timm.create_model(model_name, **kwargs)
        except Exception as exc:
            raise _weights_error("timm", model_name, "local", exc) from exc
    else:
        net = _load_pretrained("timm", model_name, "pretrained",
                               lambda: timm.create_model(model_name, **kwargs))
    resize, crop, mode, mean, std = _timm_preprocess(
        dict(timm.data.resolve_data_config({}, model=net)))
    name = f"timm:{model_name}" + (f"@{path.name}" if path is not None else "")
    module = LibraryFeatures(CropPreprocess(resize, crop, mean, std, mode), net)
    desc = _describe(f"timm {model_name} num_classes=0 (pooled features)", resize, crop, mode,
                     mean, std)
    return _finish(module, name, desc, crop, net, backend,
                   {"cache_dir": cache_dir, "threads": threads})


def _clip_preprocess(transform: Any, where: str) -> tuple[
        tuple[int, int], tuple[int, int], str, tuple[float, ...], tuple[float, ...]]:
    """Sizes, interpolation, mean and std of an open_clip evaluation transform."""
    resize = crop = None
    mode, mean, std = "bilinear", None, None
    for step in getattr(transform, "transforms", [transform]):
        cls = type(step).__name__
        if "Resize" in cls and hasattr(step, "size"):
            resize, mode = _size_pair(step.size), _mode(getattr(step, "interpolation", mode))
        elif cls == "CenterCrop" and hasattr(step, "size"):
            crop = _size_pair(step.size)
        elif hasattr(step, "mean") and hasattr(step, "std"):
            mean, std = _floats(step.mean), _floats(step.std)
    size = crop or resize
    if size is None or mean is None or std is None:
        raise ConfigError(f"could not read the image size and normalisation of {where} from its "
                          "evaluation transform (expected Resize/CenterCrop and Normalize steps)")
    return resize or size, size, mode, mean, std


def open_clip_encoder(spec: str, backend: str = "onnx", *, weights: str | None = None,
                      cache_dir: str | os.PathLike[str] | None = None,
                      threads: int | None = None) -> Encoder:
    """The encoder of ``open_clip:SPEC`` (module docstring).

    Parameters
    ----------
    spec : str
        ``MODEL@TAG``, ``MODEL@WEIGHTS_FILE`` or ``hf-hub:ORG/NAME``.
    backend : {"onnx", "torch"}, default "onnx"
    weights : str or None
        A pretrained tag or local weights file (instead of ``@...``).
    cache_dir, threads
        Of the ONNX backend.

    Raises
    ------
    ConfigError
        An unknown model, no weights named, or a transform without size or normalisation.
    DataError
        Weights that cannot be loaded (not cached offline, a missing file).
    MissingExtraError
        Without the ``open_clip`` extra.
    """
    require_extra("torch", "open_clip")
    require_extra("open_clip", "open_clip")
    import open_clip

    from ghofl.client.encoders._nets import CropPreprocess, LibraryFeatures

    model_name, given = split_spec("open_clip", spec, weights)
    hub = model_name.startswith("hf-hub:")
    if not given and not hub:
        raise ConfigError(
            f"open_clip:{model_name} needs its pretrained weights: open_clip:{model_name}@TAG "
            f"(tags: open_clip.list_pretrained_tags_by_model('{model_name}')) or "
            f"open_clip:{model_name}@/path/to/weights file")
    lister = getattr(open_clip, "list_models", None)
    if not hub and lister is not None and model_name not in lister():
        raise ConfigError(f"unknown open_clip model {model_name!r}; list the names with "
                          "open_clip.list_models() (e.g. open_clip:ViT-B-32@laion2b_s34b_b79k)")
    path = _weights_file("open_clip", given, required=False) if given else None
    pretrained = str(path) if path is not None else (given or None)

    def create() -> Any:
        return open_clip.create_model_and_transforms(model_name, pretrained=pretrained)

    if path is not None:
        try:
            net, _, transform = create()
        except Exception as exc:
            raise _weights_error("open_clip", model_name, "local", exc) from exc
    else:
        net, _, transform = _load_pretrained("open_clip", model_name, f"'{given or model_name}'",
                                             create)
    resize, crop, mode, mean, std = _clip_preprocess(transform, f"open_clip:{model_name}")
    tag = path.name if path is not None else given
    name = f"open_clip:{model_name}" + (f"@{tag}" if tag else "")
    module = LibraryFeatures(CropPreprocess(resize, crop, mean, std, mode), net, "encode_image")
    desc = _describe(f"open_clip {model_name} encode_image (not normalised)", resize, crop, mode,
                     mean, std)
    return _finish(module, name, desc, crop, net, backend,
                   {"cache_dir": cache_dir, "threads": threads})
