"""Static int8 quantization of ONNX encoders: plumbing on a tiny network, identity, caching."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, IncompatibleStatsError
from ghofl.stats import compute_stats
from ghofl.stats.meta import EncoderInfo

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from ghofl.client.encoders.quantize import (  # noqa: E402
    QuantizedOnnxEncoder,
    QuantSettings,
    int8_info,
)


class _Pre(torch.nn.Module):  # type: ignore[misc]
    def forward(self, x: Any) -> Any:
        return (x.permute(0, 3, 1, 2).float() - 127.0) / 128.0


class _Tiny(torch.nn.Module):  # type: ignore[misc]
    """uint8 (b, H, W, 3) -> (b, 16): stem conv, depthwise conv, 1x1 conv, ReLU6, mean."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.preprocess = _Pre()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.head = torch.nn.Conv2d(8, 16, 1)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=g) * 0.3

    def forward(self, x: Any) -> Any:
        h = torch.clamp(self.stem(self.preprocess(x)), 0, 6)
        h = torch.clamp(self.dw(h), 0, 6) + h
        return torch.clamp(self.head(h), 0, 6).mean(dim=(2, 3))


INFO = EncoderInfo("tiny", 16, "abc", "toy preprocessing", 16)


def _images(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    from ghofl.client.encoders.onnx_backend import OnnxEncoder

    cache = tmp_path_factory.mktemp("onnx-cache")
    flt = OnnxEncoder(_Tiny, INFO, cache_dir=cache, threads=1)
    q = QuantizedOnnxEncoder(_Tiny, INFO, _images(24, seed=1), cache_dir=cache, threads=1)
    return flt, q, cache


def test_int8_encoder_is_close_to_float_and_cached(encoders: tuple[Any, Any, Path]) -> None:
    flt, q, cache = encoders
    x = _images(10, seed=2)
    a, b = flt.embed(x), q.embed(x)
    assert b.shape == (10, 16) and b.dtype == np.float32
    cos = np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert float(cos.min()) > 0.95
    qpath = q.onnx_path(16, 16)
    assert qpath.is_file() and qpath.name.startswith("tiny-int8-")
    assert flt.onnx_path(16, 16).is_file()
    import onnx

    ops = {n.op_type for n in onnx.load(str(qpath)).graph.node}
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    stamp = qpath.stat().st_mtime_ns
    again = QuantizedOnnxEncoder(_Tiny, INFO, _images(24, seed=1), cache_dir=cache, threads=1)
    np.testing.assert_array_equal(again.embed(x), b)
    assert qpath.stat().st_mtime_ns == stamp  # reused, not re-quantized


def test_int8_identity_differs_from_float_and_from_other_calibrations() -> None:
    cal = _images(24, seed=1)
    info = int8_info(INFO, cal, QuantSettings())
    assert info.name == "tiny-int8" and info.dim == 16 and info.resolution == 16
    assert info.fingerprint() != INFO.fingerprint()
    assert "int8" in info.preprocessing and "24 images" in info.preprocessing
    assert int8_info(INFO, cal, QuantSettings()) == info  # a pure function of its inputs
    assert int8_info(INFO, _images(24, seed=9), QuantSettings()).fingerprint() != info.fingerprint()
    other = QuantSettings(per_channel=False)
    assert int8_info(INFO, cal, other).fingerprint() != info.fingerprint()
    seven_bit_dw = QuantSettings(depthwise_8bit=False)
    assert int8_info(INFO, cal, seven_bit_dw).fingerprint() != info.fingerprint()
    assert "8-bit depthwise" in info.preprocessing
    assert "8-bit depthwise" not in int8_info(INFO, cal, seven_bit_dw).preprocessing


def test_statistics_of_int8_and_float_encoders_refuse_to_merge() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 16)), np.arange(20) % 2
    int8 = int8_info(INFO, _images(8), QuantSettings())
    a = compute_stats(x, y, ["a", "b"], encoder=INFO)
    b = compute_stats(x, y, ["a", "b"], encoder=int8)
    with pytest.raises(IncompatibleStatsError, match="differ in encoder"):
        _ = a + b


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"quant_format": "int4"}, "quant_format must be 'qdq' or 'qoperator'"),
        ({"keep_float": ("middle",)}, "keep_float entries must be 'first' or 'last'"),
        ({"calibration_batch": 0}, "calibration_batch must be a positive integer"),
        ({"weight_type": "int4"}, "weight_type must be 'int8' or 'uint8'"),
        ({"calibration": "mse"}, "calibration must be 'minmax', 'percentile' or 'entropy'"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        QuantSettings(**kwargs)


def _int8_weight_ranges(path: Path) -> dict[str, int]:
    """Largest |q| of the quantized 4-d conv weights, keyed "dw" (one input channel per group)
    or "dense"."""
    import onnx
    from onnx import numpy_helper

    out: dict[str, int] = {}
    for init in onnx.load(str(path)).graph.initializer:
        w = numpy_helper.to_array(init)
        if w.dtype == np.int8 and w.ndim == 4:
            kind = "dw" if w.shape[1] == 1 else "dense"
            out[kind] = max(out.get(kind, 0), int(np.abs(w.astype(np.int32)).max()))
    return out


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (QuantSettings(keep_float=()), {"dw": 127, "dense": 64}),
        (QuantSettings(keep_float=(), depthwise_8bit=False), {"dw": 64, "dense": 64}),
        (QuantSettings(), {"dw": 127}),  # stem and head stay float
        (QuantSettings(keep_float=(), reduce_range=False), {"dw": 127, "dense": 127}),
        (QuantSettings(keep_float=(), per_channel=False), {"dw": 127, "dense": 64}),
    ],
)
def test_weight_bits_follow_the_settings(
    settings: QuantSettings, expected: dict[str, int], tmp_path: Path
) -> None:
    q = QuantizedOnnxEncoder(_Tiny, INFO, _images(16, seed=1), settings, cache_dir=tmp_path)
    out = q.embed(_images(3, seed=2))
    assert out.shape == (3, 16) and np.all(np.isfinite(out))
    assert _int8_weight_ranges(q.onnx_path(16, 16)) == expected


def test_bad_calibration_images_are_refused() -> None:
    with pytest.raises(ConfigError, match="calibration images must be a non-empty uint8"):
        QuantizedOnnxEncoder(_Tiny, INFO, np.zeros((4, 16, 16, 3), np.float32))


def test_factory_names_and_backend_check() -> None:
    from ghofl.client.encoders import available_encoders, get_encoder

    assert "efficientnet-lite0-int8" in available_encoders()
    with pytest.raises(ConfigError, match="runs on ONNX Runtime only"):
        get_encoder("efficientnet-lite0-int8", backend="torch", calibration=_images(4))
    with pytest.raises(ConfigError, match="does not accept the option"):
        get_encoder("efficientnet-lite0-int8", seed=3)


@pytest.mark.parametrize(("n", "batch", "expected"), [(256, 32, 32), (40, 32, 20), (7, 32, 7), (13, 4, 1)])
def test_calibration_batches_have_equal_sizes(n: int, batch: int, expected: int) -> None:
    from ghofl.client.encoders.quantize import _equal_batch

    assert _equal_batch(n, batch) == expected


def test_histogram_calibration_with_uneven_image_count(tmp_path: Path) -> None:
    settings = QuantSettings(calibration="percentile", calibration_batch=4)
    q = QuantizedOnnxEncoder(_Tiny, INFO, _images(10, seed=3), settings, cache_dir=tmp_path)
    out = q.embed(_images(3, seed=4))
    assert out.shape == (3, 16) and np.all(np.isfinite(out))
    assert "percentile calibration" in q.info.preprocessing
