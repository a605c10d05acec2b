"""Library encoders without their weights: one line naming the fix, no retries.

A fake ``timm`` (the package is not installed) gets its pretrained weights as timm does, with
the real ``huggingface_hub.hf_hub_download``; the hub cache is a temporary folder and the hub
endpoint a local port where nothing listens, so the hub's network error is the real one and
nothing leaves the machine. Unfixed, the hub retries five times with backoff (about 23 s) and
logs two warnings a try before an error whose hint names a variable that was not set.
"""

from __future__ import annotations

import importlib.machinery
import logging
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from ghofl.client.encoders import get_encoder
from ghofl.errors import DataError

torch = pytest.importorskip("torch", reason="library encoders need torch")
hub = pytest.importorskip("huggingface_hub", reason="needs huggingface_hub")
nn = torch.nn

DEAD_ENDPOINT = "http://127.0.0.1:9"  # the discard port: connection refused
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class TinyNet(nn.Module):
    """float NCHW -> (b, 4): a seeded 3x3 convolution and global average pooling."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: Any) -> Any:
        return self.conv(x).mean(dim=(2, 3))


@pytest.fixture
def offline_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty hub cache, downloads on (no offline variable) and a hub that does not answer;
    returns the cache folder."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", DEAD_ENDPOINT)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        DEAD_ENDPOINT + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "ghofl-cache"))
    return cache


@pytest.fixture
def fake_timm(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``timm`` with one model, ``tiny_net``, whose pretrained weights are the hub file
    ``timm/tiny_net`` / ``model.pth``, fetched with ``hf_hub_download`` as timm does."""

    def create_model(name: str, pretrained: bool = False, num_classes: int = 1000) -> nn.Module:
        net = TinyNet()
        if pretrained:
            path = hub.hf_hub_download(f"timm/{name}", "model.pth")
            net.load_state_dict(torch.load(path, weights_only=True))
        return net

    def module(name: str, **attrs: Any) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__dict__.update(attrs)
        return mod

    data = module("timm.data", resolve_data_config=lambda args, model=None: {
        "input_size": (3, 8, 8), "interpolation": "bilinear", "crop_pct": 1.0})
    timm = module("timm", create_model=create_model, data=data,
                  is_model=lambda name: name == "tiny_net")
    monkeypatch.setitem(sys.modules, "timm", timm)
    monkeypatch.setitem(sys.modules, "timm.data", data)


def _cache_weights(cache: Path, net: nn.Module) -> None:
    """``timm/tiny_net`` / ``model.pth`` as ``hf_hub_download`` leaves it in the cache."""
    repo = cache / "models--timm--tiny_net"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    torch.save(net.state_dict(), snap / "model.pth")


def _embed_cli(tmp_path: Path, encoder: str) -> int:
    from ghofl.cli.main import main
    from tests.helpers_data import make_image_folder, random_images

    imgs = random_images(4, (8, 8))
    folder = make_image_folder(tmp_path / "images",
                               {f"{'ab'[i % 2]}/{i}.png": img for i, img in enumerate(imgs)})
    return main(["embed", "--encoder", encoder, "--data", str(folder), "--out",
                 str(tmp_path / "e.npz")])


def test_not_cached_and_no_hub_is_one_line_without_retries(
        offline_hub: Path, fake_timm: None, tmp_path: Path,
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    start = time.monotonic()
    assert _embed_cli(tmp_path, "timm:tiny_net") == 2
    assert time.monotonic() - start < 15  # the hub's five retries alone sleep 23 s
    err = capfd.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ghofl: error: the pretrained weights of timm model 'tiny_net' "
                               f"are not in the local cache ({offline_hub})")
    assert f"the Hugging Face hub ({DEAD_ENDPOINT}) cannot be reached (" in lines[0]
    assert "HF_HUB_OFFLINE" not in lines[0]  # the variable is not set: no hint about it
    assert "--encoder timm:tiny_net@/path/to/weights.safetensors" in lines[0]
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]
    assert not (tmp_path / "e.npz").exists()


def test_not_cached_with_downloads_off_names_the_variable(
        offline_hub: Path, fake_timm: None, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError, match=r"^the pretrained weights of timm model 'tiny_net' are "
                       r"not in the local cache \(.*\) and downloads are off \(HF_HUB_OFFLINE=1\); "
                       r"download them once with network \(unset HF_HUB_OFFLINE\), or give a "
                       r"local weights file: --encoder timm:tiny_net@/path/to/weights"):
        get_encoder("timm:tiny_net", backend="torch")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(DataError, match=r"downloads are off \(TRANSFORMERS_OFFLINE=1\); download "
                                        r"them once with network \(unset TRANSFORMERS_OFFLINE\)"):
        get_encoder("timm:tiny_net", backend="torch")
    assert capfd.readouterr().err == ""


def test_cached_weights_load_without_network_and_without_output(
        offline_hub: Path, fake_timm: None, capfd: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from ghofl.client.encoders._nets import state_dict_sha256
    from tests.helpers_data import random_images

    _cache_weights(offline_hub, TinyNet(seed=7))
    start = time.monotonic()
    enc = get_encoder("timm:tiny_net", backend="torch")
    assert time.monotonic() - start < 15
    assert enc.info.weights_hash == state_dict_sha256(TinyNet(seed=7))  # the cached weights
    assert enc.embed(random_images(2, (8, 8))).shape == (2, 4)
    assert np.isfinite(enc.embed(random_images(2, (8, 8)))).all()
    assert capfd.readouterr().err == ""


def test_a_failure_that_is_not_a_cache_miss_keeps_its_own_message(
        offline_hub: Path, fake_timm: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(repo_id: str, filename: str, **kw: Any) -> str:
        raise RuntimeError("checkpoint is corrupt")

    monkeypatch.setattr(hub, "hf_hub_download", broken)
    with pytest.raises(DataError, match=r"pretrained weights of timm model 'tiny_net' could not "
                                        r"be loaded \(RuntimeError: checkpoint is corrupt\); give "
                                        r"a local weights file"):
        get_encoder("timm:tiny_net", backend="torch")


def test_hf_hub_id_not_cached_and_no_hub_is_one_line(
        offline_hub: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        get_encoder("hf:ghofl-test/no-such-model")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("Hugging Face hub model 'ghofl-test/no-such-model' is not in the "
                              f"local cache ({offline_hub}) and the Hugging Face hub "
                              f"({DEAD_ENDPOINT}) cannot be reached (")
    assert "download it once with network; e.g. hf download ghofl-test/no-such-model" in message
    assert "HF_HUB_OFFLINE" not in message
    assert not [r for r in caplog.records if r.name.startswith("huggingface_hub")]


def test_hub_helpers() -> None:
    from huggingface_hub.errors import LocalEntryNotFoundError

    from ghofl.client.encoders.hub import is_cache_miss

    try:
        try:
            raise LocalEntryNotFoundError("not cached")
        except LocalEntryNotFoundError as exc:
            raise RuntimeError("wrapped by the library") from exc
    except RuntimeError as wrapped:
        assert is_cache_miss(wrapped)
    assert not is_cache_miss(RuntimeError("unknown tag"))
