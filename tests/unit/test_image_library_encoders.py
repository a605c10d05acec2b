"""``timm:NAME[@WEIGHTS]`` and ``open_clip:MODEL@TAG`` with small fake ``timm`` / ``open_clip``
modules (the packages need torchvision, which the pinned torch cannot have): the calls made to
the libraries, the preprocessing from their data configs against a by-hand oracle, the ONNX
backend, the fingerprint (weights and preprocessing), errors and the missing-extra message."""

from __future__ import annotations

import importlib.machinery
import math
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import get_encoder
from ghofl.errors import ConfigError, DataError, MissingExtraError
from tests.helpers_data import random_images

torch = pytest.importorskip("torch", reason="library encoders need torch")
nn = torch.nn
F = torch.nn.functional

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


class TinyNet(nn.Module):
    """float NCHW -> (b, 4): a seeded 3x3 convolution and global average pooling."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: Any) -> Any:
        return self.conv(x).mean(dim=(2, 3))

    def encode_image(self, x: Any) -> Any:
        return self.forward(x) * 2.0


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def _load(path: str, seed: int) -> TinyNet:
    net = TinyNet(seed)
    net.load_state_dict(torch.load(path, weights_only=True))
    return net


@pytest.fixture
def fake_timm(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A ``timm`` with one model, ``tiny_net`` (pretrained weights: seed 0); ``state`` controls
    its data config and whether pretrained weights are 'cached' (``offline``)."""
    state: dict[str, Any] = {"calls": [], "offline": False, "config": {
        "input_size": (3, 16, 16), "interpolation": "bicubic", "mean": MEAN, "std": STD,
        "crop_pct": 0.875, "crop_mode": "center"}}

    def create_model(name: str, pretrained: bool = False, num_classes: int = 1000,
                     pretrained_cfg_overlay: dict[str, Any] | None = None) -> nn.Module:
        state["calls"].append({"name": name, "pretrained": pretrained,
                               "num_classes": num_classes, "overlay": pretrained_cfg_overlay})
        if pretrained_cfg_overlay:
            return _load(pretrained_cfg_overlay["file"], 5)
        if state["offline"]:
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")
        return TinyNet(0)

    def resolve_data_config(args: dict[str, Any], model: Any = None) -> dict[str, Any]:
        assert args == {} and isinstance(model, TinyNet)
        return dict(state["config"])

    data = _module("timm.data", resolve_data_config=resolve_data_config)
    timm = _module("timm", create_model=create_model, data=data,
                   is_model=lambda name: name == "tiny_net")
    monkeypatch.setitem(sys.modules, "timm", timm)
    monkeypatch.setitem(sys.modules, "timm.data", data)
    return state


def _oracle(images: np.ndarray, net: TinyNet, resize: tuple[int, int], crop: tuple[int, int],
            mode: str, method: str = "forward") -> np.ndarray:
    """By hand: /255, resize, clamp (bicubic), center crop, mean/std, the network."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = F.interpolate(x, size=resize, mode=mode, align_corners=False)
    x = x.clamp(0, 1) if mode == "bicubic" else x
    top, left = (resize[0] - crop[0]) // 2, (resize[1] - crop[1]) // 2
    x = x[:, :, top:top + crop[0], left:left + crop[1]]
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.no_grad():
        return np.asarray(getattr(net, method)(x).numpy())


def test_timm_pretrained_features_and_preprocessing(fake_timm: dict[str, Any]) -> None:
    enc = get_encoder("timm:tiny_net", backend="torch")
    assert fake_timm["calls"] == [{"name": "tiny_net", "pretrained": True, "num_classes": 0,
                                   "overlay": None}]
    imgs = random_images(3, (20, 24))
    side = math.floor(16 / 0.875)
    expected = _oracle(imgs, TinyNet(0), (side, side), (16, 16), "bicubic")
    np.testing.assert_allclose(enc.embed(imgs), expected, atol=1e-5, rtol=0)
    info = enc.info
    assert (info.name, info.dim, info.resolution) == ("timm:tiny_net", 4, 16)
    assert f"bicubic resize to {side}x{side}" in info.preprocessing
    assert "center crop 16x16" in info.preprocessing and "mean=[0.5, 0.4, 0.3]" in info.preprocessing
    from ghofl.client.encoders._nets import state_dict_sha256

    assert info.weights_hash == state_dict_sha256(TinyNet(0))


def test_timm_onnx_backend_matches_torch(fake_timm: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (install ghofl[torch])")
    fake_timm["config"]["interpolation"] = "bilinear"
    imgs = random_images(2, (18, 18))
    t = get_encoder("timm:tiny_net", backend="torch")
    o = get_encoder("timm:tiny_net", backend="onnx", cache_dir=tmp_path)
    assert np.abs(t.embed(imgs) - o.embed(imgs)).max() <= 1e-4 and t.info == o.info


def test_timm_local_weights_file(fake_timm: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "w.pth"
    torch.save(TinyNet(7).state_dict(), path)
    enc = get_encoder(f"timm:tiny_net@{path}", backend="torch")
    assert fake_timm["calls"][-1]["overlay"] == {"file": str(path)}
    assert enc.info.name == "timm:tiny_net@w.pth"
    imgs = random_images(2, (16, 16))
    side = math.floor(16 / 0.875)
    np.testing.assert_allclose(enc.embed(imgs), _oracle(imgs, TinyNet(7), (side, side),
                                                        (16, 16), "bicubic"), atol=1e-5, rtol=0)
    pretrained = get_encoder("timm:tiny_net", backend="torch").info
    assert enc.info.weights_hash != pretrained.weights_hash
    same = get_encoder("timm:tiny_net", backend="torch", weights=str(path)).info
    assert same == enc.info  # the weights option is the same as @PATH
    torch.save(TinyNet(0).state_dict(), tmp_path / "w0.pth")  # the pretrained weights, as a file
    assert get_encoder(f"timm:tiny_net@{tmp_path / 'w0.pth'}",
                       backend="torch").info.weights_hash == pretrained.weights_hash


def test_timm_fingerprint_follows_the_data_config(fake_timm: dict[str, Any]) -> None:
    fp = get_encoder("timm:tiny_net", backend="torch").info.fingerprint()
    assert get_encoder("timm:tiny_net", backend="torch").info.fingerprint() == fp
    fake_timm["config"]["std"] = (0.3, 0.3, 0.3)
    assert get_encoder("timm:tiny_net", backend="torch").info.fingerprint() != fp
    fake_timm["config"].update(std=STD, crop_mode="squash")
    squash = get_encoder("timm:tiny_net", backend="torch").info
    assert squash.fingerprint() != fp and "resize to 16x16" in squash.preprocessing


def test_timm_errors(fake_timm: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown timm model 'nope'.*timm\.list_models"):
        get_encoder("timm:nope")
    with pytest.raises(DataError, match=r"timm weights file '.*missing\.pth' does not exist"):
        get_encoder(f"timm:tiny_net@{tmp_path}/missing.pth")
    with pytest.raises(ConfigError, match=r"names its weights twice"):
        get_encoder(f"timm:tiny_net@{tmp_path}/a.pth", weights="b.pth")
    with pytest.raises(ConfigError, match=r"'timm:' needs a model name"):
        get_encoder("timm:")
    with pytest.raises(ConfigError, match=r"does not accept the option\(s\) max_length"):
        get_encoder("timm:tiny_net", max_length=3)
    with pytest.raises(ConfigError, match=r"backend must be 'onnx' or 'torch'"):
        get_encoder("timm:tiny_net", backend="tf")
    fake_timm["offline"] = True
    with pytest.raises(DataError, match=r"pretrained weights of timm model 'tiny_net' could not "
                                        r"be loaded.*--encoder timm:tiny_net@/path/to/weights"):
        get_encoder("timm:tiny_net")


class Resize:
    def __init__(self, size: int, interpolation: Any) -> None:
        self.size, self.interpolation = size, interpolation


class CenterCrop:
    def __init__(self, size: int) -> None:
        self.size = [size, size]


class Normalize:
    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = mean, std


class ToTensor:
    pass


@pytest.fixture
def fake_open_clip(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """An ``open_clip`` with one model, ``Tiny-CLIP``, and tags ``tag0`` / ``tag1`` (seeds)."""
    state: dict[str, Any] = {"calls": [], "steps": None}
    bicubic = types.SimpleNamespace(value="bicubic")

    def create_model_and_transforms(name: str, pretrained: str | None = None
                                    ) -> tuple[nn.Module, Any, Any]:
        state["calls"].append((name, pretrained))
        if pretrained in ("tag0", "tag1"):
            net = TinyNet(int(pretrained[-1]))
        elif pretrained and Path(pretrained).is_file():
            net = _load(pretrained, 5)
        else:
            raise RuntimeError(f"Pretrained weights ({pretrained}) not found for model {name}.")
        steps = state["steps"] or [Resize(20, bicubic), CenterCrop(16), ToTensor(),
                                   Normalize(MEAN, STD)]
        return net, None, types.SimpleNamespace(transforms=steps)

    clip = _module("open_clip", create_model_and_transforms=create_model_and_transforms,
                   list_models=lambda: ["Tiny-CLIP"])
    monkeypatch.setitem(sys.modules, "open_clip", clip)
    return state


def test_open_clip_encode_image_and_preprocessing(fake_open_clip: dict[str, Any]) -> None:
    enc = get_encoder("open_clip:Tiny-CLIP@tag0", backend="torch")
    assert fake_open_clip["calls"] == [("Tiny-CLIP", "tag0")]
    imgs = random_images(3, (24, 20))
    expected = _oracle(imgs, TinyNet(0), (20, 20), (16, 16), "bicubic", "encode_image")
    np.testing.assert_allclose(enc.embed(imgs), expected, atol=1e-5, rtol=0)
    info = enc.info
    assert (info.name, info.dim, info.resolution) == ("open_clip:Tiny-CLIP@tag0", 4, 16)
    assert "encode_image" in info.preprocessing and "bicubic resize to 20x20" in info.preprocessing
    other = get_encoder("open_clip:Tiny-CLIP@tag1", backend="torch").info
    assert other.weights_hash != info.weights_hash and other.fingerprint() != info.fingerprint()


def test_open_clip_local_weights_and_onnx(fake_open_clip: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (install ghofl[torch])")
    path = tmp_path / "clip.pt"
    torch.save(TinyNet(0).state_dict(), path)
    enc = get_encoder("open_clip:Tiny-CLIP", weights=str(path), backend="torch")
    assert fake_open_clip["calls"][-1] == ("Tiny-CLIP", str(path))
    assert enc.info.name == "open_clip:Tiny-CLIP@clip.pt"
    tagged = get_encoder("open_clip:Tiny-CLIP@tag0", backend="torch").info
    assert enc.info.weights_hash == tagged.weights_hash  # the same weights, by content
    o = get_encoder(f"open_clip:Tiny-CLIP@{path}", cache_dir=tmp_path / "cache")
    imgs = random_images(2, (20, 20))
    assert np.abs(o.embed(imgs) - enc.embed(imgs)).max() <= 1e-4 and o.info == enc.info


def test_open_clip_errors(fake_open_clip: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"open_clip:Tiny-CLIP needs its pretrained weights: "
                                          r"open_clip:Tiny-CLIP@TAG"):
        get_encoder("open_clip:Tiny-CLIP")
    with pytest.raises(ConfigError, match=r"unknown open_clip model 'Big'.*list_models"):
        get_encoder("open_clip:Big@tag0")
    with pytest.raises(DataError, match=r"'nope' weights of open_clip model 'Tiny-CLIP' could "
                                        r"not be loaded.*RuntimeError"):
        get_encoder("open_clip:Tiny-CLIP@nope")
    with pytest.raises(DataError, match=r"open_clip weights file '.*none\.pt' does not exist"):
        get_encoder(f"open_clip:Tiny-CLIP@{tmp_path}/none.pt")
    fake_open_clip["steps"] = [ToTensor()]
    with pytest.raises(ConfigError, match=r"could not read the image size and normalisation"):
        get_encoder("open_clip:Tiny-CLIP@tag0")


@pytest.mark.parametrize(("name", "module", "extra"), [
    ("timm:resnet50", "timm", "timm"),
    ("open_clip:ViT-B-32@laion2b_s34b_b79k", "open_clip", "open_clip"),
])
def test_without_the_package_the_error_names_the_extra(
        monkeypatch: pytest.MonkeyPatch, name: str, module: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError, match=rf"'{module}'.*pip install 'ghofl\[{extra}\]'"):
        get_encoder(name)


def test_available_encoders_name_the_library_kinds() -> None:
    from ghofl.client.encoders import available_encoders

    names: Callable[[], tuple[str, ...]] = available_encoders
    assert {"hf:NAME_OR_DIR", "timm:NAME", "open_clip:MODEL@TAG"} <= set(names())


def test_timm_full_graph_export_matches_the_encoder_and_head(
        fake_timm: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ghofl export`` of a timm: model: the library's ONNX export + head in one file, the
    encoder rebuilt from the recorded name and checked; other weights are refused."""
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (install ghofl[torch])")
    from ghofl.errors import ConfigError
    from ghofl.heads.registry import make_head
    from ghofl.model.directory import save_model
    from ghofl.model.export import export_model
    from ghofl.stats import compute_stats

    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))
    fake_timm["config"]["interpolation"] = "bilinear"
    enc = get_encoder("timm:tiny_net", backend="onnx", cache_dir=tmp_path / "cache")
    imgs = random_images(40, (20, 24))
    y = np.arange(40) % 2
    stats = compute_stats(enc.embed(imgs), y, ("a", "b"), mode="full", encoder=enc.info)
    head = make_head("lda", shrinkage=0.3).fit_from_stats(stats)
    model = save_model(tmp_path / "model", {"lda": head}, stats_meta=stats.meta)
    out = export_model(model, "lda", tmp_path / "g.onnx", image_size=(20, 24))
    probe = random_images(5, (20, 24), seed=3)
    proba, label = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(
        ["probabilities", "label"], {"images": probe})
    want = head.predict_proba(enc.embed(probe))
    np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(label, want.argmax(axis=1))
    # the local library now gives other weights: the export is refused, nothing written
    fake_timm["config"]["mean"] = (0.1, 0.1, 0.1)
    with pytest.raises(ConfigError, match=r"has fingerprint \w+, but the model was fitted"):
        export_model(model, "lda", tmp_path / "h.onnx", image_size=(20, 24))
    assert not (tmp_path / "h.onnx").exists()
