"""open_clip vision transformers on the default ONNX backend: a tiny ViT with the layout of
open_clip's ``VisionTransformer`` (patch convolution, class token, ``nn.MultiheadAttention``
blocks with ``batch_first=True``, projection), its weights made by the test, served by a small
fake ``open_clip`` (the package is not installed). In eval mode under inference mode PyTorch
runs such attention through the fused ``aten::_native_multi_head_attention`` kernel, which the
TorchScript-based ONNX exporter cannot convert; the encoder's export takes the composite path
instead. Checked: ``embed`` (ONNX) against eager PyTorch to 1e-4, ``ghofl export`` (encoder +
head graph) against the torch encoder and the head to 1e-4, and that the fast-path setting is
restored."""

from __future__ import annotations

import importlib.machinery
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import get_encoder
from tests.helpers_data import random_images

torch = pytest.importorskip("torch", reason="library encoders need torch")
pytest.importorskip("onnx", reason="the ONNX backend needs onnx (install ghofl[torch])")
ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (install ghofl[torch])")
nn = torch.nn

WIDTH, HEADS, PATCH, SIZE, OUT = 16, 2, 4, 16, 8
MEAN, STD = (0.48, 0.46, 0.41), (0.27, 0.26, 0.28)


class Block(nn.Module):
    """open_clip's ``ResidualAttentionBlock``: pre-norm attention and MLP, batch first."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: Any) -> Any:
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=None)[0]
        return x + self.mlp(self.ln_2(x))


class TinyViT(nn.Module):
    """open_clip's ``VisionTransformer`` in small: float NCHW (b, 3, 16, 16) -> (b, 8)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        tokens = (SIZE // PATCH) ** 2 + 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.conv1 = nn.Conv2d(3, WIDTH, PATCH, stride=PATCH, bias=False)
            self.class_embedding = nn.Parameter(0.5 * torch.randn(WIDTH))
            self.positional_embedding = nn.Parameter(0.5 * torch.randn(tokens, WIDTH))
            self.ln_pre = nn.LayerNorm(WIDTH)
            self.resblocks = nn.ModuleList([Block(), Block()])
            self.ln_post = nn.LayerNorm(WIDTH)
            self.proj = nn.Parameter(0.3 * torch.randn(WIDTH, OUT))

    def forward(self, x: Any) -> Any:
        x = self.conv1(x).flatten(2).transpose(1, 2)  # (b, tokens - 1, width)
        cls = self.class_embedding.expand(x.shape[0], 1, -1)
        x = self.ln_pre(torch.cat([cls, x], dim=1) + self.positional_embedding)
        for block in self.resblocks:
            x = block(x)
        return self.ln_post(x[:, 0]) @ self.proj


class TinyCLIP(nn.Module):
    """The model open_clip returns: ``visual`` and ``encode_image``."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.visual = TinyViT(seed)

    def encode_image(self, x: Any) -> Any:
        return self.visual(x)


class Resize:
    def __init__(self, size: int) -> None:
        self.size, self.interpolation = size, types.SimpleNamespace(value="bilinear")


class CenterCrop:
    def __init__(self, size: int) -> None:
        self.size = [size, size]


class Normalize:
    def __init__(self) -> None:
        self.mean, self.std = MEAN, STD


@pytest.fixture
def fake_open_clip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An ``open_clip`` with one model, ``Tiny-ViT``, tag ``t0`` (seed 0); caches in tmp."""

    def create_model_and_transforms(name: str, pretrained: str | None = None
                                    ) -> tuple[nn.Module, Any, Any]:
        assert name == "Tiny-ViT" and pretrained == "t0"
        steps = [Resize(SIZE), CenterCrop(SIZE), Normalize()]
        return TinyCLIP(0), None, types.SimpleNamespace(transforms=steps)

    clip = types.ModuleType("open_clip")
    clip.__spec__ = importlib.machinery.ModuleSpec("open_clip", None)
    clip.create_model_and_transforms = create_model_and_transforms  # type: ignore[attr-defined]
    clip.list_models = lambda: ["Tiny-ViT"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "open_clip", clip)
    monkeypatch.setenv("GHOFL_CACHE_DIR", str(tmp_path / "cache"))


def _oracle(images: np.ndarray) -> np.ndarray:
    """By hand: /255, (no resize at 16x16), mean/std, the ViT in eager PyTorch."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.inference_mode():
        return np.asarray(TinyCLIP(0).eval().encode_image(x).numpy())


def test_the_fused_attention_kernel_is_what_the_tracer_cannot_export(
        fake_open_clip: None, tmp_path: Path) -> None:
    """The problem this guards against: the plain export of the module fails."""
    from ghofl.client.encoders.onnx_backend import mha_slow_path

    enc = get_encoder("open_clip:Tiny-ViT@t0", backend="torch")
    example = torch.from_numpy(random_images(2, (SIZE, SIZE)))
    with torch.inference_mode(), warnings.catch_warnings(), \
            pytest.raises(Exception, match="_native_multi_head_attention"):
        warnings.simplefilter("ignore")
        torch.onnx.export(enc.module, (example,), str(tmp_path / "plain.onnx"), dynamo=False,
                          opset_version=17)
    assert torch.backends.mha.get_fastpath_enabled()
    with pytest.raises(RuntimeError, match="boom"), mha_slow_path():
        assert not torch.backends.mha.get_fastpath_enabled()
        raise RuntimeError("boom")
    assert torch.backends.mha.get_fastpath_enabled()  # restored, also after an error


def test_vit_embeds_on_the_default_onnx_backend(fake_open_clip: None) -> None:
    onnx_enc = get_encoder("open_clip:Tiny-ViT@t0")  # the default backend
    torch_enc = get_encoder("open_clip:Tiny-ViT@t0", backend="torch")
    assert type(onnx_enc).__name__ == "OnnxEncoder" and onnx_enc.info == torch_enc.info
    imgs = random_images(5, (SIZE, SIZE), seed=1)  # another batch size than the export's 2
    got = onnx_enc.embed(imgs)
    np.testing.assert_allclose(torch_enc.embed(imgs), _oracle(imgs), atol=1e-5, rtol=0)
    np.testing.assert_allclose(got, _oracle(imgs), atol=1e-4, rtol=0)
    assert np.abs(got).max() > 0.1  # not a degenerate output
    assert torch.backends.mha.get_fastpath_enabled()  # eager runs keep the fused kernel
    import onnx

    path = onnx_enc.onnx_path(SIZE, SIZE)
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert "Softmax" in ops and "MatMul" in ops  # the attention as plain ONNX operators


def test_vit_model_exports_encoder_and_head(fake_open_clip: None, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``ghofl export`` of a model fitted on the ViT's embeddings: one graph from the uint8
    images, agreeing with the torch encoder and the head to 1e-4."""
    from ghofl.cli.main import main
    from ghofl.heads.registry import make_head
    from ghofl.model.directory import save_model
    from ghofl.stats import compute_stats

    enc = get_encoder("open_clip:Tiny-ViT@t0", backend="torch")
    imgs = random_images(60, (SIZE, SIZE), seed=2)
    y = np.arange(60) % 3
    stats = compute_stats(enc.embed(imgs), y, ("a", "b", "c"), mode="full", encoder=enc.info)
    head = make_head("lda", shrinkage=0.3).fit_from_stats(stats)
    model = save_model(tmp_path / "model", {"lda": head}, stats_meta=stats.meta)
    out = tmp_path / "vit-lda.onnx"
    assert main(["export", str(model), "--head", "lda", "--out", str(out)]) == 0
    assert "encoder + head graph" in capsys.readouterr().out
    probe = random_images(7, (SIZE, SIZE), seed=3)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    proba, label = sess.run(["probabilities", "label"], {"images": probe})
    want = head.predict_proba(enc.embed(probe))
    np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(label, want.argmax(axis=1))
