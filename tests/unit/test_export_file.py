"""Full-graph export of a user's model file (:mod:`ghofl.model.export_file`): the input contract
as ONNX nodes agrees with :func:`~ghofl.client.encoders.contract.prepare_images`, the rebuilt
encoder keeps the recorded fingerprint, and encoder + head in ONNX Runtime match the encoder
and the head in Python."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.encoders import get_encoder
from ghofl.client.encoders.contract import InputContract, prepare_images
from ghofl.errors import ConfigError, DataError, InputError

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from ghofl.client.encoders.recorded import (  # noqa: E402
    model_file_kind,
    rebuild_model_file_encoder,
    recorded_contract,
)
from ghofl.client.transforms import apply_feature_transform, transformed_info  # noqa: E402
from ghofl.heads import make_head  # noqa: E402
from ghofl.model.export import full_graph  # noqa: E402
from ghofl.model.export_file import PREPARED, preprocess_graph  # noqa: E402
from ghofl.stats import compute_stats  # noqa: E402
from tests.helpers_models import RawNet, onnx_model, script  # noqa: E402

IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
CONTRACTS = [
    ("upsample-nchw", (10, 10), InputContract((12, 12), "bilinear", "NCHW", "float32",
                                              1 / 255, **IMAGENET)),
    ("shrink-nhwc-nonsquare", (20, 16), InputContract((7, 9), "bilinear", "NHWC", "float32")),
    ("same-size", (8, 8), InputContract((8, 8), "bilinear", "NCHW", "float32", 0.5)),
    ("float16", (13, 11), InputContract((6, 6), "bilinear", "NCHW", "float16", 1 / 255,
                                        **IMAGENET)),
    ("uint8-resized", (13, 11), InputContract((8, 8), "bilinear", "NHWC", "uint8", 1.0)),
    ("uint8-raw", (9, 7), InputContract(None, "none", "NHWC", "uint8", 1.0)),
    ("uint8-raw-nchw", (9, 7), InputContract(None, "none", "NCHW", "uint8", 1.0)),
]


def _session(model: Any) -> Any:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("size", "contract"), [c[1:] for c in CONTRACTS],
                         ids=[c[0] for c in CONTRACTS])
def test_preprocessing_graph_matches_prepare_images(size: tuple[int, int],
                                                    contract: InputContract) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, *size, 3), dtype=np.uint8)
    want = prepare_images(images, contract, "m")
    (got,) = _session(preprocess_graph(contract, size)).run([PREPARED], {"images": images})
    assert got.dtype == want.dtype and got.shape == want.shape
    if contract.dtype == "uint8":  # rounding may differ by one where a value ends in .5
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
        assert diff.max() <= 1 and np.mean(diff == 0) > 0.99
    else:
        tol = 2e-3 if contract.dtype == "float16" else 1e-5
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                                   atol=tol, rtol=0)


def test_dynamic_size_without_a_contract_size() -> None:
    contract = InputContract(None, "none", "NCHW", "uint8", 1.0)
    sess = _session(preprocess_graph(contract, None))
    for size in ((5, 6), (11, 4)):
        images = np.random.default_rng(1).integers(0, 256, size=(2, *size, 3), dtype=np.uint8)
        (got,) = sess.run([PREPARED], {"images": images})
        np.testing.assert_array_equal(got, prepare_images(images, contract, "m"))


def _onnx_opset13(folder: Path) -> Path:
    """Float NCHW at 12x12, ImageNet normalisation, stored at opset 13 (converted to 17)."""
    import onnx

    path = onnx_model(folder / "net.onnx", 0)
    model = onnx.load(str(path))
    model.opset_import[0].version = 13  # Conv, GlobalAveragePool, Flatten: the same in 13
    onnx.save(model, str(path))
    (folder / "net.json").write_text(json.dumps({"size": 12, **IMAGENET}))
    return path


def _onnx_uint8(folder: Path) -> Path:
    """uint8 NHWC at a static 8x8: the graph resizes, rounds and casts to uint8."""
    return onnx_model(folder / "net.onnx", 0, uint8_nhwc=True, size=(8, 8))


def _onnx_float16_two_outputs(folder: Path) -> Path:
    """float16 input and a float16 output chosen among two (cast to float32 for the head)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = onnx_model(folder / "net.onnx", 0, two_outputs=True)
    model = onnx.load(str(path))
    g = model.graph
    g.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    for init in g.initializer:
        arr = numpy_helper.to_array(init).astype(np.float16)
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
    g.node.append(helper.make_node("Identity", ["y"], ["y16"]))
    g.output[0].CopyFrom(helper.make_tensor_value_info("y16", TensorProto.FLOAT16, ["n", 4]))
    g.output[1].type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    (folder / "net.json").write_text(json.dumps({"size": 10, "output": "y16"}))
    return path


MODELS = {
    "onnx-opset13": _onnx_opset13,
    "onnx-uint8-nhwc": _onnx_uint8,
    "onnx-float16-two-outputs": _onnx_float16_two_outputs,
    "torchscript-raw": lambda folder: script(RawNet(0), folder / "net.pt"),
}


@pytest.mark.parametrize("variant", list(MODELS))
def test_full_graph_matches_the_encoder_and_the_head(variant: str, tmp_path: Path) -> None:
    path = MODELS[variant](tmp_path)
    kind = "torchscript" if variant.startswith("torchscript") else "onnx"
    encoder = get_encoder(f"{kind}:{path}")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(40, 14, 14, 3), dtype=np.uint8)
    y = np.arange(40) % 3
    info = transformed_info(encoder.info, "sqrt")
    assert model_file_kind(info) == kind
    stats = compute_stats(apply_feature_transform(encoder.embed(images), "sqrt"), y,
                          ("a", "b", "c"), mode="full", encoder=info)
    head = make_head("qda").fit_from_stats(stats)
    model = full_graph(head, "qda", (14, 14), encoder_file=path)
    probe = rng.integers(0, 256, size=(6, 14, 14, 3), dtype=np.uint8)
    proba, label = _session(model).run(["probabilities", "label"], {"images": probe})
    want = head.predict_proba(apply_feature_transform(encoder.embed(probe), "sqrt"))
    # float16: one float16 rounding of the input or of an activation (1e-3 relative) moves
    # the QDA probabilities by up to ~1e-2
    tol = 2e-2 if "float16" in variant else 1e-4
    np.testing.assert_allclose(proba, want, atol=tol, rtol=0)
    np.testing.assert_array_equal(label, np.argmax(want, axis=1))
    assert [o.name for o in model.graph.output] == ["probabilities", "label"]
    props = {p.key: p.value for p in model.metadata_props}
    assert props["ghofl.encoder_fingerprint"] == info.fingerprint()
    assert props["ghofl.image_size"] == "14x14"
    assert props["ghofl.encoder_file_sha256"] == info.weights_hash
    contract = json.loads(props["ghofl.input_contract"])
    assert contract["input"] == "images" and contract["shape"] == ["N", 14, 14, 3]
    assert contract["model_input_contract"]["layout"] == encoder.contract.layout


def test_rebuilt_encoder_keeps_the_fingerprint_without_the_json(tmp_path: Path) -> None:
    """The recorded contract rebuilds the encoder; the JSON beside the file is not needed."""
    (tmp_path / "a").mkdir()
    path = onnx_model(tmp_path / "a" / "net.onnx", 0)
    (tmp_path / "a" / "net.json").write_text(json.dumps({"size": 12, **IMAGENET}))
    info = get_encoder(f"onnx:{path}").info
    moved = tmp_path / "b" / "copy.onnx"
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    values = recorded_contract(info)
    assert values["input"] == "x" and values["output"] == "y" and values["size"] == [12, 12]
    assert rebuild_model_file_encoder(info, "'m'", moved).info == info


def test_lookup_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = script(RawNet(0), tmp_path / "net.pt")
    info = get_encoder(f"torchscript:{path}").info
    assert info.name == "torchscript:net"
    # found by its recorded name in the current directory (net -> net.pt)
    assert rebuild_model_file_encoder(info, "'m'").info == info
    path.rename(tmp_path / "elsewhere.pt")
    with pytest.raises(DataError, match=r"model file is not here.*--encoder-file PATH"):
        rebuild_model_file_encoder(info, "'m'")
    with pytest.raises(DataError, match=r"--encoder-file '.*none\.pt' does not exist"):
        rebuild_model_file_encoder(info, "'m'", tmp_path / "none.pt")
    (tmp_path / "bad.pt").write_bytes(b"not a model")
    with pytest.raises(InputError, match=rf"fingerprint {info.fingerprint()}.*'.*bad\.pt' has "
                       r"SHA-256 [0-9a-f]{16} \(no fingerprint: ghofl cannot load it as "
                       r"torchscript:PATH .*\): another or a corrupt file"):
        rebuild_model_file_encoder(info, "'m'", tmp_path / "bad.pt")
    # the model directory is searched after the current directory
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere.pt").rename(tmp_path / "model" / "net.pt")
    assert rebuild_model_file_encoder(info, "'m'", model_dir=tmp_path / "model").info == info


def test_resize_none_refuses_another_image_size(tmp_path: Path) -> None:
    path = onnx_model(tmp_path / "net.onnx", 0, size=(8, 8))
    encoder = get_encoder(f"onnx:{path}", resize="none")
    stats = compute_stats(encoder.embed(np.zeros((6, 8, 8, 3), np.uint8)), np.arange(6) % 2,
                          ("a", "b"), encoder=encoder.info)
    head = make_head("nb").fit_from_stats(stats)
    with pytest.raises(ConfigError, match=r"exactly 8x8.*--image-size 8x8"):
        full_graph(head, "nb", (10, 10), encoder_file=path)
