"""Bring your own encoder: ``torchscript:PATH`` and ``onnx:PATH`` image model files.

Every model is built in a temporary folder (:mod:`tests.helpers_models`); the references are
computed independently with torch (antialiased bilinear resize, normalisation, the same
convolution).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import available_encoders, get_encoder
from ghofl.client.encoders.contract import contract_file, resize_images, resize_matrix
from ghofl.errors import ConfigError, DataError, IncompatibleStatsError, InputError
from ghofl.stats import compute_stats, sum_stats
from tests.helpers_data import random_images

torch = pytest.importorskip("torch", reason="model-file encoder tests need torch")
pytest.importorskip("onnx", reason="model-file encoder tests need onnx")
pytest.importorskip("onnxruntime", reason="model-file encoder tests need onnxruntime")
F = torch.nn.functional

from tests.helpers_models import (  # noqa: E402  (after the skips)
    PoolNet,
    RawNet,
    SpatialNet,
    onnx_model,
    reference,
    script,
)

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    return {
        "raw": script(RawNet(0), d / "raw.pt"),
        "float": script(PoolNet(0), d / "float.pt"),
        "float_b": script(PoolNet(1), d / "float_b.pt"),
        "spatial": script(SpatialNet(), d / "spatial.pt"),
        "nchw": onnx_model(d / "nchw.onnx", 0),
        "nchw_b": onnx_model(d / "nchw_b.onnx", 1),
        "static": onnx_model(d / "static.onnx", 0, uint8_nhwc=True, size=(12, 12)),
        "unpooled": onnx_model(d / "unpooled.onnx", 0, pooled=False),
        "two": onnx_model(d / "two.onnx", 0, two_outputs=True),
    }


def _copy(src: Path, dst: Path, contract: dict[str, Any] | None = None) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    if contract is not None:
        dst.with_name(dst.name + ".json").write_text(json.dumps(contract))
    return dst


# --------------------------------------------------------------------------- resize
@pytest.mark.parametrize(("src", "dst"), [((8, 8), (20, 13)), ((37, 50), (9, 16)),
                                          ((10, 10), (10, 10)), ((7, 30), (14, 6))])
def test_resize_is_torch_antialiased_bilinear(src: tuple[int, int],
                                              dst: tuple[int, int]) -> None:
    x = random_images(3, src, seed=sum(src))
    ref = F.interpolate(torch.from_numpy(x).permute(0, 3, 1, 2).float(), size=dst,
                        mode="bilinear", align_corners=False, antialias=True)
    np.testing.assert_allclose(resize_images(x, *dst), ref.permute(0, 2, 3, 1).numpy(),
                               atol=2e-3)


@pytest.mark.parametrize(("n_in", "n_out"), [(1, 5), (5, 1), (7, 3), (3, 7), (6, 6)])
def test_resize_weights_are_a_partition_of_unity(n_in: int, n_out: int) -> None:
    w = resize_matrix(n_in, n_out)
    assert w.shape == (n_out, n_in) and (w >= 0).all()
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    if n_in == n_out:
        np.testing.assert_allclose(w, np.eye(n_in))


# --------------------------------------------------------------------------- torchscript
def test_torchscript_without_contract_takes_the_loaders_uint8_images(
        models: dict[str, Path]) -> None:
    enc = get_encoder(f"torchscript:{models['raw']}")
    imgs = random_images(5, (9, 11), seed=3)
    np.testing.assert_allclose(enc.embed(imgs), reference(imgs, 0, None), rtol=1e-5,
                               atol=1e-6)
    assert enc.name == "torchscript:raw" and enc.dim == 4
    assert enc.embed(imgs[:0]).shape == (0, 4)


def test_torchscript_float_contract_from_the_json_beside_it(
        models: dict[str, Path], tmp_path: Path) -> None:
    path = _copy(models["float"], tmp_path / "net.pt",
                 {"dtype": "float32", "size": [10, 12], **IMAGENET})
    enc = get_encoder(f"torchscript:{path}")
    imgs = random_images(4, (16, 16), seed=4)
    np.testing.assert_allclose(enc.embed(imgs), reference(imgs, 0, (10, 12), **IMAGENET),
                               rtol=1e-4, atol=1e-5)
    assert enc.info.resolution == 10 and '"layout": "NCHW"' in enc.info.preprocessing


# --------------------------------------------------------------------------- onnx
def test_onnx_float_model_with_a_dynamic_size_uses_the_resolution(
        models: dict[str, Path]) -> None:
    enc = get_encoder(f"onnx:{models['nchw']}", resolution=14, **IMAGENET)
    imgs = random_images(3, (20, 17), seed=5)
    np.testing.assert_allclose(enc.embed(imgs), reference(imgs, 0, (14, 14), **IMAGENET),
                               rtol=1e-4, atol=1e-5)
    assert enc.info.resolution == 14


def test_onnx_uint8_nhwc_model_states_its_own_layout_and_size(models: dict[str, Path]) -> None:
    enc = get_encoder(f"onnx:{models['static']}", resolution=224)
    assert enc.contract.layout == "NHWC" and enc.contract.dtype == "uint8"
    assert enc.contract.size == (12, 12) and enc.contract.resize == "bilinear"
    imgs = random_images(3, (12, 12), seed=6)
    np.testing.assert_allclose(enc.embed(imgs), reference(imgs, 0, None), rtol=1e-4,
                               atol=1e-5)
    assert enc.embed(random_images(2, (30, 20), seed=7)).shape == (2, 4)


def test_onnx_output_is_chosen_by_name_among_several(models: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"has 2 outputs \(y, m\); name the one to use with "
                                          r"the contract key 'output'"):
        get_encoder(f"onnx:{models['two']}")
    enc = get_encoder(f"onnx:{models['two']}", output="y", resolution=8)
    imgs = random_images(2, (8, 8), seed=8)
    np.testing.assert_allclose(enc.embed(imgs), reference(imgs, 0, None), rtol=1e-4,
                               atol=1e-5)
    with pytest.raises(ConfigError, match=r"has no output named 'z'; its outputs are y, m"):
        get_encoder(f"onnx:{models['two']}", output="z")


def test_encoders_survive_pickling(models: dict[str, Path]) -> None:
    imgs = random_images(2, (12, 12), seed=9)
    for name in (f"onnx:{models['static']}", f"torchscript:{models['raw']}"):
        enc = get_encoder(name)
        again = pickle.loads(pickle.dumps(enc))
        np.testing.assert_array_equal(again.embed(imgs), enc.embed(imgs))
        assert again.info == enc.info


# --------------------------------------------------------------------------- errors
ERRORS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("torchscript:{d}/nope.pt", {}, DataError,
     r"torchscript model file '.*nope\.pt' does not exist; give the path"),
    ("onnx:{d}", {}, DataError, r"onnx model file '.*' is a directory"),
    ("onnx:", {}, ConfigError, r"encoder 'onnx:' needs a model file path"),
    ("torchscript:{nchw}", {}, ConfigError, r"is not a TorchScript file"),
    ("onnx:{raw}", {}, ConfigError, r"ONNX Runtime cannot load '.*raw\.pt'"),
    ("torchscript:{spatial}", {"dtype": "float32", "size": 8}, ConfigError,
     r"must return embeddings of shape \(batch, d\); for a batch of 2 it returned shape "
     r"\(2, 4, 6, 6\)"),
    ("onnx:{unpooled}", {}, ConfigError,
     r"output 'p' has rank 4 .*ghofl needs embeddings of shape \(batch, d\)"),
    ("torchscript:{raw}", {"dim": 8}, ConfigError,
     r"returns embeddings of dimension 4 but its input contract declares dim 8"),
    ("onnx:{nchw}", {"dim": 3}, ConfigError, r"dimension 4 but its input contract declares dim 3"),
    ("onnx:{static}", {"size": [16, 16]}, ConfigError,
     r"contract says size 16x16 but input 'x' .* takes 12x12; set size to \[12, 12\]"),
    ("onnx:{static}", {"dtype": "float32"}, ConfigError,
     r"contract says dtype float32 but input 'x' .* takes uint8; set dtype to uint8"),
    ("onnx:{nchw}", {"layout": "nhwc"}, ConfigError,
     r"contract says layout NHWC but input 'x' .*its channel axis of 3 is elsewhere"),
    ("onnx:{nchw}", {"size": 2}, ConfigError,
     r"does not accept the input its contract describes \(a float32 tensor of shape "
     r"\(2, 3, 2, 2\), NCHW\): \S+"),
    ("onnx:{nchw}", {"input": "pixels"}, ConfigError, r"has no input named 'pixels'; its inputs are x"),
    ("torchscript:{float}", {}, ConfigError,
     r"does not accept the input its contract describes \(a uint8 tensor of shape "
     r"\(2, 224, 224, 3\), NHWC\): .*; fix the input contract"),
    ("torchscript:{raw}", {"mean": [0.5, 0.5, 0.5], "dtype": "uint8"}, ConfigError,
     r"a uint8 input takes the raw pixels, so mean cannot apply"),
    ("torchscript:{raw}", {"input": "x"}, ConfigError,
     r"does not accept the option\(s\) input"),
    ("onnx:{nchw}", {"std": [1, 0, 1]}, ConfigError,
     r"std must be a list of 3 finite positive numbers"),
    ("onnx:{nchw}", {"size": "big"}, ConfigError, r"size must be an integer or a pair"),
    ("torchscript:{raw}", {"resize": "bilinear"}, ConfigError,
     r"resize 'bilinear' needs a size; set size"),
    ("onnx:{nchw}", {"contract": {"layuot": "NCHW"}}, ConfigError,
     r"input contract: unknown key\(s\) layuot; the input contract takes name, dim"),
    ("onnx:{nchw}", {"layout": "CHW"}, ConfigError, r"layout must be one of NCHW, NHWC; got 'CHW'"),
]


@pytest.mark.parametrize(("name", "kw", "error", "pattern"), ERRORS)
def test_model_file_errors(models: dict[str, Path], tmp_path: Path, name: str,
                           kw: dict[str, Any], error: type[Exception], pattern: str) -> None:
    spec = name.format(d=tmp_path, **{k: str(v) for k, v in models.items()})
    with pytest.raises(error, match=pattern):
        get_encoder(spec, **kw)


def test_resize_none_refuses_images_of_another_size(models: dict[str, Path]) -> None:
    enc = get_encoder(f"onnx:{models['static']}", resize="none")
    with pytest.raises(InputError, match=r"takes images of 12x12 \(its input contract has "
                                         r"resize 'none'\); got 9x9"):
        enc.embed(random_images(1, (9, 9)))


@pytest.mark.parametrize(("text", "pattern"), [
    ("{not json", r"input contract '.*m\.onnx\.json' is not valid JSON"),
    ("[1, 2]", r"input contract '.*m\.onnx\.json' must hold a JSON object; got list"),
    ('{"scale": -1}', r"input contract '.*m\.onnx\.json': scale must be a positive number"),
])
def test_bad_contract_files(models: dict[str, Path], tmp_path: Path, text: str,
                            pattern: str) -> None:
    path = _copy(models["nchw"], tmp_path / "m.onnx")
    (tmp_path / "m.onnx.json").write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        get_encoder(f"onnx:{path}")


def test_contract_file_next_to_the_model(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    assert contract_file(model) is None
    (tmp_path / "m.json").write_text("{}")
    assert contract_file(model) == tmp_path / "m.json"
    (tmp_path / "m.onnx.json").write_text("{}")
    assert contract_file(model) == tmp_path / "m.onnx.json"
    with pytest.raises(DataError, match=r"input contract file '.*other\.json' does not exist"):
        get_encoder(f"onnx:{model}", contract=tmp_path / "other.json")


# --------------------------------------------------------------------------- fingerprints
def test_fingerprint_covers_the_weights_and_the_contract(models: dict[str, Path],
                                                         tmp_path: Path) -> None:
    def fp(path: Path, **kw: Any) -> str:
        return get_encoder(f"onnx:{path}", resolution=16, **kw).info.fingerprint()

    base = fp(models["nchw"])
    assert fp(_copy(models["nchw"], tmp_path / "site1" / "nchw.onnx")) == base
    assert fp(_copy(models["nchw"], tmp_path / "site2" / "nchw.onnx", {"size": 16})) == base
    assert fp(_copy(models["nchw_b"], tmp_path / "site3" / "nchw.onnx")) != base  # weights
    assert fp(models["nchw"], **IMAGENET) != base  # normalisation
    assert fp(models["nchw"], size=15) != base  # size
    assert fp(models["nchw"], contract={"name": "mine"}) != base
    enc = get_encoder(f"onnx:{models['nchw']}")
    import hashlib

    assert enc.info.weights_hash == hashlib.sha256(models["nchw"].read_bytes()).hexdigest()


@pytest.mark.parametrize("pair", [("float", "float_b"), ("float", "float")])
def test_statistics_of_different_model_files_are_refused(models: dict[str, Path],
                                                         pair: tuple[str, str]) -> None:
    a = get_encoder(f"torchscript:{models[pair[0]]}", dtype="float32", size=8)
    b = get_encoder(f"torchscript:{models[pair[1]]}", dtype="float32", size=8,
                    **({"mean": [0.5, 0.5, 0.5]} if pair[0] == pair[1] else {}))
    assert a.name == b.name or pair[0] != pair[1]
    imgs = random_images(6, (8, 8), seed=10)
    y = np.array([0, 1, 0, 1, 0, 1])
    sa = compute_stats(a.embed(imgs), y, 2, "full", a.info)
    sb = compute_stats(b.embed(imgs), y, 2, "full", b.info)
    with pytest.raises(IncompatibleStatsError, match=r"differ in encoder"):
        sum_stats([sa, sb])
    with pytest.raises(IncompatibleStatsError, match=r"differ in encoder"):
        _ = sa + sb
    assert (sa + sa).n_samples == 12


def test_available_encoders_name_the_model_file_kinds() -> None:
    names = available_encoders()
    assert "onnx:PATH" in names and "torchscript:PATH" in names
    with pytest.raises(ConfigError, match=r"a model file as onnx:PATH or torchscript:PATH"):
        get_encoder("alexnet")
