"""Tiny image models written in a temporary folder for the model-file encoder tests.

Import after ``pytest.importorskip("torch")`` and ``pytest.importorskip("onnx")``:
``from tests.helpers_models import ...``. TorchScript modules are scripted from tiny conv nets;
ONNX graphs are written with ``onnx.helper`` (a seeded 3x3 convolution, global average pooling,
flattening). :func:`reference` computes their output independently with torch (antialiased
bilinear resize, normalisation, the same convolution). Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

nn = torch.nn
F = torch.nn.functional


def conv_weights(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(4, 3, 3, 3)).astype(np.float32),
            rng.normal(size=4).astype(np.float32))


class PoolNet(nn.Module):
    """float NCHW (b, 3, H, W) -> (b, 4): a 3x3 convolution and global average pooling."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        w, b = conv_weights(seed)
        with torch.no_grad():
            self.conv.weight.copy_(torch.from_numpy(w))
            self.conv.bias.copy_(torch.from_numpy(b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean(dim=(2, 3))


class RawNet(nn.Module):
    """uint8 NHWC (b, H, W, 3) -> (b, 4): the loader's images, converted inside."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.net = PoolNet(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 3, 1, 2).float() / 255.0)


class SpatialNet(nn.Module):
    """float NCHW -> (b, 4, h, w): no pooling (a wrong output rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def script(module: nn.Module, path: Path) -> Path:
    torch.jit.save(torch.jit.script(module.eval()), str(path))
    return path


def onnx_model(path: Path, seed: int = 0, *, uint8_nhwc: bool = False,
                size: tuple[int, int] | None = None, pooled: bool = True,
                two_outputs: bool = False) -> Path:
    """x -> [Cast, Transpose, /255 for uint8 NHWC] -> Conv -> GlobalAveragePool -> Flatten."""
    from onnx import TensorProto, helper, numpy_helper

    w, b = conv_weights(seed)
    h, wd = size if size is not None else ("h", "w")
    nodes, src = [], "x"
    if uint8_nhwc:
        nodes += [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                  helper.make_node("Transpose", ["xf"], ["xt"], perm=[0, 3, 1, 2]),
                  helper.make_node("Mul", ["xt", "inv255"], ["xs"])]
        src = "xs"
        x = helper.make_tensor_value_info("x", TensorProto.UINT8, ["n", h, wd, 3])
    else:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, h, wd])
    nodes += [helper.make_node("Conv", [src, "w", "b"], ["c"]),
              helper.make_node("GlobalAveragePool", ["c"], ["p"])]
    outs = [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", 4, 1, 1])]
    if pooled:
        nodes.append(helper.make_node("Flatten", ["p"], ["y"]))
        outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])]
    if two_outputs:
        nodes.append(helper.make_node("ReduceMax", ["c"], ["m"], axes=[2, 3], keepdims=0))
        outs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, ["n", 4]))
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array(1 / 255, dtype=np.float32), "inv255")]
    graph = helper.make_graph(nodes, "tiny", [x], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def reference(images: np.ndarray, seed: int, size: tuple[int, int] | None,
               mean: Any = (0.0, 0.0, 0.0), std: Any = (1.0, 1.0, 1.0)) -> np.ndarray:
    """The conv net of ``seed`` on images resized (torch, antialiased) and normalised."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    if size is not None and tuple(x.shape[2:]) != size:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    x = (x / 255.0 - m) / s
    w, b = conv_weights(seed)
    out = F.conv2d(x, torch.from_numpy(w), torch.from_numpy(b)).mean(dim=(2, 3))
    return np.asarray(out.numpy())
