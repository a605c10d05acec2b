"""The README's input-contract example, exactly as printed, for a ``torchscript:`` model file.

The README shows ``{"size": 224, "mean": [...], "std": [...]}`` (no ``dtype``) as the JSON
beside the model. For a TorchScript file (whose dtype the file does not fix) a contract that
normalises means float32 NCHW; the test reads the example from README.md, writes it beside a
scripted module whose weights it makes, and checks the embeddings against the preprocessing by
hand.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import get_encoder
from ghofl.client.encoders.contract import resize_images
from ghofl.errors import ConfigError
from tests.helpers_data import REPO, random_images

torch = pytest.importorskip("torch", reason="torchscript: needs torch")


def readme_contract() -> dict[str, Any]:
    """The JSON object the README gives as the example input contract."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("The **input contract**"):]
    found = re.search(r"`(\{[^`]*\})`", section)
    assert found is not None, "the README no longer shows an input-contract example"
    contract: dict[str, Any] = json.loads(found.group(1))
    return contract


class Net(torch.nn.Module):  # type: ignore[misc]
    """float NCHW -> (b, 4): a seeded 3x3 convolution and global average pooling."""

    def __init__(self) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean(dim=(2, 3))


class RawNet(torch.nn.Module):  # type: ignore[misc]
    """uint8 NHWC -> (b, 4): its own conversion, then :class:`Net`."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x.permute(0, 3, 1, 2).float())
        return out


def _scripted(tmp_path: Path, module: Any = None) -> Path:
    path = tmp_path / "derm.pt"
    with warnings.catch_warnings():  # torch.jit.script/save are deprecated in recent torch
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script((module or Net()).eval()), str(path))
    return path


def test_the_readme_example_contract_works_for_a_torchscript_file(tmp_path: Path) -> None:
    contract = readme_contract()
    assert "dtype" not in contract and {"size", "mean", "std"} <= set(contract)
    model = _scripted(tmp_path)
    (tmp_path / "derm.json").write_text(json.dumps(contract), encoding="utf-8")  # <stem>.json
    enc = get_encoder(f"torchscript:{model}")
    assert enc.info.dim == 4 and enc.info.resolution == contract["size"]
    assert '"dtype": "float32"' in enc.info.preprocessing
    assert '"layout": "NCHW"' in enc.info.preprocessing
    imgs = random_images(2, (40, 30))
    size = contract["size"]
    x = resize_images(imgs, size, size) / 255.0
    x = (x - np.asarray(contract["mean"], np.float32)) / np.asarray(contract["std"], np.float32)
    with torch.inference_mode():
        want = Net().eval()(torch.from_numpy(x.astype(np.float32).transpose(0, 3, 1, 2)))
    np.testing.assert_allclose(enc.embed(imgs), want.numpy(), atol=1e-5, rtol=0)


def test_uint8_stays_the_default_without_normalisation_and_refuses_it_when_named(
        tmp_path: Path) -> None:
    model = _scripted(tmp_path)
    with pytest.raises(ConfigError, match=r"a uint8 input takes the raw pixels, so mean, std "
                                          r"cannot apply; drop them or use dtype float32"):
        get_encoder(f"torchscript:{model}", contract={**readme_contract(), "dtype": "uint8"})
    raw = get_encoder(f"torchscript:{_scripted(tmp_path, RawNet())}", contract={"size": 8})
    assert '"dtype": "uint8"' in raw.info.preprocessing and '"layout": "NHWC"' in \
        raw.info.preprocessing
