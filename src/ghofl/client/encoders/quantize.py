"""Static int8 quantization of the ONNX encoders (ONNX Runtime), with its own fingerprint.

An int8 encoder is the float ONNX export of an encoder (:mod:`ghofl.client.encoders.onnx_backend`)
passed through ONNX Runtime's pre-processing (shape inference, graph fusion) and static
quantization (defaults, :class:`QuantSettings`): QDQ format that ONNX Runtime fuses into
QLinearConv/QLinearAdd kernels, symmetric int8 weights per output channel (7-bit in the
convolutions run as matrix products, which saturate on AVX2 CPUs without VNNI; 8-bit in the
depthwise ones), uint8 activations with ranges calibrated (min/max) on a fixed set of images.
The preprocessing inside the graph (cast, resize, normalisation), the stem and head
convolutions and the final global average stay in float. On an AVX2 CPU without VNNI the int8
kernels are not faster than the float ones (measured in BENCHMARKS.md); they are meant for CPUs
with VNNI or ARM dot-product instructions (not measured here). The quantized file is cached next
to the float exports (``<cache dir>/onnx/<name>-int8-<fingerprint>-<H>x<W>-<dtype>.onnx``).

Identity: the :class:`~ghofl.stats.meta.EncoderInfo` of an int8 encoder has the name
``<float name>-int8`` and a ``weights_hash`` that digests the float weights, the calibration images,
the quantization settings and the ONNX Runtime version, so statistics of an int8 encoder can never
be added to those of its float parent, nor to those of an int8 encoder calibrated differently.

Default calibration set: 256 CIFAR-10 training images (25 or 26 per class, stratified, seed 0)
read from ``GHOFL_DATA_DIR``; pass ``calibration=`` (uint8 (n, H, W, 3)) to use other images.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.onnx_backend import OnnxEncoder
from ghofl.errors import ConfigError, DataError, require_extra
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import torch

__all__ = [
    "INT8_SUFFIX",
    "QuantSettings",
    "QuantizedOnnxEncoder",
    "default_calibration_images",
    "int8_info",
    "quantize_onnx",
]

INT8_SUFFIX = "-int8"
DEFAULT_CALIBRATION_SIZE = 256


@dataclass(frozen=True)
class QuantSettings:
    """How a float ONNX encoder is quantized.

    Parameters
    ----------
    quant_format : {"qdq", "qoperator"}, default "qdq"
        QuantizeLinear/DequantizeLinear pairs that ONNX Runtime fuses into integer kernels, or
        integer operators written directly.
    per_channel : bool, default True
        One weight scale per output channel (needed by depthwise convolutions).
    reduce_range : bool, default True
        7-bit weights for the convolutions run as integer matrix products (pointwise, stem,
        head): avoids the overflow of the 16-bit pairwise sums of uint8 x int8 products
        (``vpmaddubsw``) on x86 CPUs without VNNI (AVX2), which otherwise costs a lot of
        accuracy (measured in BENCHMARKS.md, "Encoders: int8 settings tried").
    depthwise_8bit : bool, default True
        With ``reduce_range``, depthwise convolutions still get full 8-bit weights: ONNX
        Runtime's depthwise kernel does not use the saturating pairwise product, and the
        extra bit brings the features closer to the float ones (same section).
    weight_type : {"int8", "uint8"}, default "int8"
        Symmetric int8 weights, or asymmetric uint8 weights (U8U8 kernels: no saturation on
        AVX2, slower).
    op_types : tuple of str, default ("Conv", "Add", "Clip")
        Operator types to quantize.
    keep_float : tuple of str, default ("first", "last")
        Which convolutions stay float besides the preprocessing: ``"first"`` (the stem) and/or
        ``"last"`` (the 1x1 head convolution). The stem (3 input channels) is slower in
        int8 than in float on AVX2, and both are among the most sensitive layers.
    calibration : {"minmax", "percentile", "entropy"}, default "minmax"
        How activation ranges are chosen from the calibration images (on Lite0 min/max and
        percentile give the same feature cosine to float; ONNX Runtime's entropy calibrator
        keeps every activation of every calibration image in memory, too much at 224 px).
    calibration_batch : int, default 32
        Images per calibration batch.
    """

    quant_format: str = "qdq"
    per_channel: bool = True
    reduce_range: bool = True
    depthwise_8bit: bool = True
    weight_type: str = "int8"
    op_types: tuple[str, ...] = ("Conv", "Add", "Clip")
    keep_float: tuple[str, ...] = ("first", "last")
    calibration: str = "minmax"
    calibration_batch: int = 32

    def __post_init__(self) -> None:
        if self.quant_format not in ("qdq", "qoperator"):
            raise ConfigError(
                f"quant_format must be 'qdq' or 'qoperator'; got {self.quant_format!r}"
            )
        if self.weight_type not in ("int8", "uint8"):
            raise ConfigError(f"weight_type must be 'int8' or 'uint8'; got {self.weight_type!r}")
        if self.calibration not in ("minmax", "percentile", "entropy"):
            raise ConfigError(
                "calibration must be 'minmax', 'percentile' or 'entropy'; got "
                f"{self.calibration!r}"
            )
        bad = [k for k in self.keep_float if k not in ("first", "last")]
        if bad:
            raise ConfigError(f"keep_float entries must be 'first' or 'last'; got {bad[0]!r}")
        if int(self.calibration_batch) < 1:
            raise ConfigError(
                f"calibration_batch must be a positive integer; got {self.calibration_batch!r}"
            )

    def describe(self) -> str:
        """One line recorded in the encoder's preprocessing description."""
        parts = [
            self.quant_format.upper(),
            "per-channel" if self.per_channel else "per-tensor",
            ("7-bit " if self.reduce_range else "8-bit ") + self.weight_type + " weights"
            + (" (8-bit depthwise)" if self.reduce_range and self.depthwise_8bit else ""),
            "ops " + "+".join(self.op_types),
        ]
        parts.append(f"{self.calibration} calibration")
        if self.keep_float:
            parts.append("float " + "+".join(self.keep_float) + " conv")
        return ", ".join(parts)


def _ort_version() -> str:
    require_extra("onnxruntime", "torch")
    import onnxruntime

    return str(onnxruntime.__version__)


def _calibration_digest(images: NDArray[np.uint8]) -> str:
    h = hashlib.sha256(str(images.shape).encode())
    h.update(np.ascontiguousarray(images).tobytes())
    return h.hexdigest()


def check_calibration(images: Any) -> NDArray[np.uint8]:
    """Validate calibration images: uint8 (n, H, W, 3) with n >= 1."""
    arr = np.asarray(images)
    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[3] != 3 or arr.shape[0] < 1:
        raise ConfigError(
            "int8 calibration images must be a non-empty uint8 array of shape (n, H, W, 3); got "
            f"dtype {arr.dtype} and shape {arr.shape}; pass e.g. a few hundred training images"
        )
    return np.ascontiguousarray(arr)


def default_calibration_images(
    data_dir: str | os.PathLike[str] | None = None,
    n: int = DEFAULT_CALIBRATION_SIZE,
    seed: int = 0,
) -> NDArray[np.uint8]:
    """``n`` CIFAR-10 training images, stratified (``subsample`` with ``seed``), trimmed to n.

    Raises
    ------
    DataError
        When CIFAR-10 is not found (names ``GHOFL_DATA_DIR`` and the ``calibration=`` option).
    """
    from ghofl.data.registry import load_dataset, subsample

    try:
        src = load_dataset("cifar10", "train", data_dir=data_dir)
    except DataError as exc:
        raise DataError(
            "the int8 encoders are calibrated by default on CIFAR-10 training images, which were "
            f"not found ({exc}); set GHOFL_DATA_DIR, or pass calibration= (uint8 images of shape "
            "(n, H, W, 3)) to get_encoder"
        ) from exc
    per_class = -(-int(n) // len(src.classes))
    idx = subsample(src.labels, per_class=per_class, seed=seed)
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(idx, size=min(int(n), idx.size), replace=False))
    return np.asarray(src.load_batch(keep), dtype=np.uint8)


def int8_info(
    float_info: EncoderInfo, calibration: NDArray[np.uint8], settings: QuantSettings
) -> EncoderInfo:
    """The identity of the int8 version of ``float_info``: new name, new weights hash."""
    blob = "|".join(
        [
            float_info.fingerprint(),
            float_info.weights_hash,
            _calibration_digest(calibration),
            repr(sorted(asdict(settings).items())),
            f"onnxruntime {_ort_version()}",
        ]
    )
    return EncoderInfo(
        name=float_info.name + INT8_SUFFIX,
        dim=float_info.dim,
        weights_hash=hashlib.sha256(blob.encode()).hexdigest(),
        preprocessing=(
            f"{float_info.preprocessing}; static int8 quantization ({settings.describe()}; "
            f"calibrated on {calibration.shape[0]} images; onnxruntime {_ort_version()})"
        ),
        resolution=float_info.resolution,
    )


def _resize_all(images: NDArray[np.uint8], height: int, width: int) -> NDArray[np.uint8]:
    if images.shape[1:3] == (height, width):
        return images
    from PIL import Image

    return np.stack(
        [
            np.asarray(Image.fromarray(im).resize((width, height), Image.Resampling.BILINEAR))
            for im in images
        ]
    ).astype(np.uint8)


def _equal_batch(n: int, batch: int) -> int:
    """Largest divisor of ``n`` not above ``batch``.

    ONNX Runtime's histogram calibrators stack the outputs of all batches, so every
    batch must have the same size.
    """
    return max(b for b in range(1, min(n, batch) + 1) if n % b == 0)


def _reader(images: NDArray[Any], input_name: str, batch: int) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    batch = _equal_batch(len(images), batch)

    class _Batches(CalibrationDataReader):  # type: ignore[misc]
        """Feeds the calibration images to the calibrator, ``batch`` at a time."""

        def __init__(self) -> None:
            self._it: Iterator[dict[str, NDArray[Any]]] = iter(
                {input_name: images[i : i + batch]} for i in range(0, len(images), batch)
            )

        def get_next(self) -> dict[str, NDArray[Any]] | None:
            return next(self._it, None)

    return _Batches()


def _float_nodes(model_path: Path, keep_float: tuple[str, ...]) -> list[str]:
    """Names of the nodes to leave in float: the preprocessing, the reduction, chosen convs."""
    import onnx

    nodes = onnx.load(str(model_path), load_external_data=False).graph.node
    names = [
        n.name for n in nodes if n.name.startswith("/preprocess/") or n.op_type == "ReduceMean"
    ]
    convs = [n.name for n in nodes if n.op_type == "Conv"]
    if convs and "first" in keep_float:
        names.append(convs[0])
    if convs and "last" in keep_float:
        names.append(convs[-1])
    return names


def _full_range_weights(
    model_path: Path, settings: QuantSettings, excluded: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """ONNX Runtime ``TensorQuantOverrides`` giving the depthwise convolution weights 8 bits.

    Used when ``reduce_range`` gives the other weights 7 (empty when not asked for).
    """
    import onnx

    if not (settings.reduce_range and settings.depthwise_8bit):
        return {}
    skip = set(excluded)
    nodes = onnx.load(str(model_path), load_external_data=False).graph.node
    override: dict[str, Any] = {"reduce_range": False}
    if settings.per_channel:
        override["axis"] = 0
    return {
        n.input[1]: [dict(override)]
        for n in nodes
        if n.op_type == "Conv"
        and n.name not in skip
        and any(a.name == "group" and a.i > 1 for a in n.attribute)
    }


def quantize_onnx(
    float_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    calibration: NDArray[np.uint8],
    settings: QuantSettings | None = None,
    input_name: str = "x",
) -> Path:
    """Quantize the float ONNX encoder ``float_path`` into ``out_path`` (written atomically).

    Parameters
    ----------
    float_path, out_path : path
        Input (float32 model, input ``x`` of shape (b, H, W, 3)) and output files.
    calibration : ndarray of uint8, shape (n, H', W', 3)
        Calibration images; resized (bilinear) to the model's H x W when they differ.
    settings : QuantSettings, optional
        Defaults: QDQ, per-channel, 7-bit weights (8-bit depthwise), Conv/Add/Clip, float stem
        and head convolutions, min/max calibration.
    input_name : str, default "x"

    Returns
    -------
    Path
        ``out_path``.
    """
    require_extra("onnxruntime", "torch")
    require_extra("onnx", "torch")
    import onnx
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )

    cfg = settings or QuantSettings()
    images = check_calibration(calibration)
    src = Path(float_path)
    model = onnx.load(str(src), load_external_data=False)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    height, width = int(dims[1].dim_value), int(dims[2].dim_value)
    if height > 0 and width > 0:
        images = _resize_all(images, height, width)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=False)
        staged = Path(tmp) / "int8.onnx"
        excluded = _float_nodes(pre, cfg.keep_float)
        quantize_static(
            str(pre),
            str(staged),
            _reader(images, input_name, int(cfg.calibration_batch)),
            quant_format=QuantFormat.QDQ if cfg.quant_format == "qdq" else QuantFormat.QOperator,
            op_types_to_quantize=list(cfg.op_types),
            per_channel=cfg.per_channel,
            reduce_range=cfg.reduce_range,
            activation_type=QuantType.QUInt8,
            calibrate_method={
                "minmax": CalibrationMethod.MinMax,
                "percentile": CalibrationMethod.Percentile,
                "entropy": CalibrationMethod.Entropy,
            }[cfg.calibration],
            weight_type=QuantType.QInt8 if cfg.weight_type == "int8" else QuantType.QUInt8,
            nodes_to_exclude=excluded,
            extra_options={
                "ActivationSymmetric": False,
                "WeightSymmetric": cfg.weight_type == "int8",
                "TensorQuantOverrides": _full_range_weights(pre, cfg, excluded),
            },
        )
        os.chmod(staged, 0o644)
        os.replace(staged, out)
    return out


class QuantizedOnnxEncoder(OnnxEncoder):
    """An int8 encoder: the float export of ``module_factory``, statically quantized and cached.

    Parameters
    ----------
    module_factory : callable
        Builds the float torch module (as for :class:`OnnxEncoder`).
    float_info : EncoderInfo
        Identity of the float encoder (its fingerprint keys the float export).
    calibration : ndarray of uint8, shape (n, H, W, 3)
        Calibration images (part of the identity).
    settings : QuantSettings, optional
    cache_dir, threads
        As for :class:`OnnxEncoder`.
    """

    def __init__(
        self,
        module_factory: Callable[[], torch.nn.Module],
        float_info: EncoderInfo,
        calibration: NDArray[np.uint8],
        settings: QuantSettings | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = None,
    ) -> None:
        self.settings = settings or QuantSettings()
        self._calibration = check_calibration(calibration)
        info = int8_info(float_info, self._calibration, self.settings)
        super().__init__(module_factory, info, cache_dir=cache_dir, threads=threads)
        self._float = OnnxEncoder(module_factory, float_info, cache_dir=cache_dir, threads=threads)

    def __repr__(self) -> str:
        return f"QuantizedOnnxEncoder(name={self.name!r}, dim={self.dim}, backend='onnx')"

    def _build_model(self, path: Path, height: int, width: int, dtype: str) -> None:
        float_path = self._float.onnx_path(height, width, dtype)
        if not float_path.is_file():
            self._float.export(height, width, dtype)
        quantize_onnx(float_path, path, self._calibration, self.settings)


def int8_lite_encoder(
    variant: str = "efficientnet-lite0",
    resolution: int = 224,
    backend: str = "onnx",
    *,
    calibration: NDArray[np.uint8] | None = None,
    settings: QuantSettings | None = None,
    weights_path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    threads: int | None = None,
) -> QuantizedOnnxEncoder:
    """The int8 EfficientNet-Lite encoder ``<variant>-int8`` (ONNX Runtime only).

    ``calibration=None`` uses :func:`default_calibration_images` (CIFAR-10 training images from
    ``GHOFL_DATA_DIR``).
    """
    import functools

    from ghofl.client.encoders.efficientnet_lite import build_lite_module, lite_encoder_info

    if backend != "onnx":
        raise ConfigError(
            f"the int8 encoder {variant + INT8_SUFFIX!r} runs on ONNX Runtime only; use "
            f"backend='onnx' (got {backend!r}), or the float encoder {variant!r} for torch"
        )
    info = lite_encoder_info(variant, resolution, weights_path)
    images = default_calibration_images() if calibration is None else calibration
    factory = functools.partial(build_lite_module, variant, resolution, weights_path)
    return QuantizedOnnxEncoder(
        factory, info, images, settings, cache_dir=cache_dir, threads=threads
    )
