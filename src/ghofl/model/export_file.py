"""Full-graph export for a user's own image model (``onnx:PATH``, ``torchscript:PATH``).

One ONNX graph from the decoded images to the head's outputs::

    images         uint8 (N, H, W, 3)   decoded RGB, as ghofl's image loader gives them
    preprocessing  the input contract (:mod:`ghofl.client.encoders.contract`) as ONNX nodes:
                   bilinear resize to ``size`` by ghofl's own weights
                   (:func:`~ghofl.client.encoders.contract.resize_matrix`, two constant
                   MatMuls), ``(v * scale - mean) / std``, cast to the model's dtype, layout
    model          the ONNX file itself (converted to opset 17 if it has another), or the
                   TorchScript module converted by ``torch.onnx.export`` (``dynamo=False``)
    head           the head graph (:func:`~ghofl.model.onnx_graph.head_graph`): recorded
                   feature transform, projection, scores; ``probabilities`` float32 (N, C)
                   and ``label`` int64 (N,); with the model's OOD score ``ood_score``
                   float64 (N,), and ``ood`` bool (N,) once its threshold is calibrated

The encoder is rebuilt from the file (:mod:`ghofl.client.encoders.recorded`; ``--encoder-file``
or the recorded name) and must have the recorded fingerprint. The image size H×W is the
``image_size`` asked for, else the contract's ``size``; a contract without a size (the
TorchScript default: raw uint8 images at their own size) gives dynamic H and W.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ghofl.client.encoders.contract import InputContract, resize_matrix
from ghofl.errors import ConfigError, require_extra
from ghofl.heads.base import Head
from ghofl.model.onnx_graph import INPUT_NAME, OPSET, GraphBuilder, head_outputs

if TYPE_CHECKING:
    import onnx

    from ghofl.client.encoders.model_file import ImageFileEncoder
    from ghofl.heads.ood import MahalanobisOOD

__all__ = ["PREPARED", "model_file_full_graph", "preprocess_graph"]

#: Output of the preprocessing graph (the model's input tensor).
PREPARED = "prepared"
_IMAGES = "images"
_HINT = "or export the head alone with --head-only (input: the encoder's embeddings)"
_PERM = {("NHWC", "NCHW"): [0, 3, 1, 2], ("NCHW", "NHWC"): [0, 2, 3, 1]}
_TYPES = {"float32": 1, "uint8": 2, "float16": 10}


def _image_size(contract: InputContract, image_size: tuple[int, int] | None
                ) -> tuple[int, int] | None:
    """(H, W) of the graph's images, or ``None`` for dynamic H and W."""
    if image_size is None:
        return contract.size
    if contract.resize == "none" and contract.size is not None and image_size != contract.size:
        h, w = contract.size
        raise ConfigError(f"the encoder takes images of exactly {h}x{w} (its input contract has "
                          f"resize 'none'); drop --image-size or give --image-size {h}x{w}")
    return image_size


def preprocess_graph(contract: InputContract, image_size: tuple[int, int] | None
                     ) -> onnx.ModelProto:
    """``images`` uint8 (N, H, W, 3) -> :data:`PREPARED`, as :func:`prepare_images` computes.

    Parameters
    ----------
    contract : InputContract
        The encoder's resolved contract.
    image_size : (int, int) or None
        (H, W) of the images; ``None``: dynamic (only when no resize is needed).
    """
    from onnx import TensorProto, helper

    g = GraphBuilder("prep/")
    x, layout, is_float = _IMAGES, "NHWC", False
    if contract.size is not None and image_size is not None and image_size != contract.size:
        f32 = np.float32
        x = g.op("Transpose", g.op("Cast", x, to=TensorProto.FLOAT), perm=[0, 3, 1, 2])
        x = g.op("MatMul", g.const(resize_matrix(image_size[0], contract.size[0]), "wh", f32),
                 x)  # (sh, H) @ (N, 3, H, W)
        x = g.op("MatMul", x, g.const(resize_matrix(image_size[1], contract.size[1]).T, "ww",
                                      f32))
        layout, is_float = "NCHW", True
    if contract.dtype == "uint8":
        if is_float:
            x = g.op("Clip", g.op("Round", x), g.const(0.0, "lo", np.float32),
                     g.const(255.0, "hi", np.float32))
            x = g.op("Cast", x, to=TensorProto.UINT8)
    else:
        if not is_float:
            x = g.op("Cast", x, to=TensorProto.FLOAT)
        shape = (1, 3, 1, 1) if layout == "NCHW" else (1, 1, 1, 3)
        x = g.op("Mul", x, g.const(contract.scale, "scale", np.float32))
        x = g.op("Sub", x, g.const(np.reshape(contract.mean, shape), "mean", np.float32))
        x = g.op("Div", x, g.const(np.reshape(contract.std, shape), "std", np.float32))
        if contract.dtype == "float16":
            x = g.op("Cast", x, to=TensorProto.FLOAT16)
    if layout != contract.layout:
        x = g.op("Transpose", x, perm=_PERM[(layout, contract.layout)])
    g.nodes.append(helper.make_node("Identity", [x], [PREPARED]))
    h, w = image_size if image_size is not None else ("H", "W")
    graph = helper.make_graph(
        g.nodes, "ghofl_preprocessing",
        [helper.make_tensor_value_info(_IMAGES, TensorProto.UINT8, ["N", h, w, 3])],
        [helper.make_tensor_value_info(PREPARED, _TYPES[contract.dtype], None)],
        g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def _load_onnx(encoder: ImageFileEncoder) -> tuple[onnx.ModelProto, str, str]:
    """The user's ONNX file at opset :data:`OPSET`, with its input and (batch, d) output."""
    import onnx
    from onnx import version_converter

    try:
        model = onnx.load(str(encoder.path))
    except Exception as exc:
        raise ConfigError(f"onnx cannot read '{encoder.path}' ({_first_line(exc)}); give a "
                          f"valid .onnx file, {_HINT}") from exc
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                   OPSET)
    if version != OPSET:
        try:
            model = version_converter.convert_version(model, OPSET)
        except Exception as exc:
            raise ConfigError(
                f"the ONNX model '{encoder.path}' uses opset {version}, which ghofl could not "
                f"convert to opset {OPSET} for the head ({_first_line(exc)}); export it again "
                f"with opset {OPSET}, {_HINT}") from exc
    return model, str(getattr(encoder, "_input", "")), str(getattr(encoder, "_output", ""))


def _script_to_onnx(encoder: ImageFileEncoder, image_size: tuple[int, int] | None
                    ) -> tuple[onnx.ModelProto, str, str]:
    """The TorchScript module converted by the legacy (TorchScript-based) ONNX exporter."""
    require_extra("torch", "torch")
    import onnx
    import torch

    c = encoder.contract
    res = int(encoder.info.resolution or 224)
    h, w = c.size or image_size or (res, res)
    example = np.zeros(c.input_shape(2, h, w), dtype=np.dtype(c.dtype))
    axes = {0: "N"} if c.size is not None or image_size is not None else (
        {0: "N", 2: "H", 3: "W"} if c.layout == "NCHW" else {0: "N", 1: "H", 2: "W"})
    with tempfile.TemporaryDirectory(prefix="ghofl-export-") as tmp:
        path = Path(tmp) / "encoder.onnx"
        try:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")
                torch.onnx.export(encoder.model, (torch.from_numpy(example),), str(path),
                                  opset_version=OPSET, dynamo=False, input_names=["x"],
                                  output_names=["features"],
                                  dynamic_axes={"x": axes, "features": {0: "N"}})
        except Exception as exc:
            raise ConfigError(
                f"torch.onnx.export cannot convert the TorchScript model '{encoder.path}' "
                f"({_first_line(exc)}); export the model to ONNX yourself and fit with "
                f"onnx:PATH, {_HINT}") from exc
        return onnx.load(str(path)), "x", "features"


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0][:300] if lines else type(exc).__name__


def _float_output(model: onnx.ModelProto, output: str) -> str:
    """Name of ``output`` as float32 (a Cast appended when the model returns another type)."""
    from onnx import TensorProto, helper

    out = next(o for o in model.graph.output if o.name == output)
    if out.type.tensor_type.elem_type == TensorProto.FLOAT:
        return output
    cast = f"{output}/float32"
    model.graph.node.append(helper.make_node("Cast", [output], [cast], to=TensorProto.FLOAT))
    info = helper.make_tensor_value_info(cast, TensorProto.FLOAT, ["N", "d"])
    info.type.tensor_type.shape.CopyFrom(out.type.tensor_type.shape)
    model.graph.output.append(info)
    return cast


def _encoder_model(encoder: ImageFileEncoder, image_size: tuple[int, int] | None
                   ) -> tuple[onnx.ModelProto, str, str]:
    """(the model as ONNX, prefixed ``encoder/``, its input, its float32 output)."""
    from onnx import compose

    if encoder.kind == "onnx":
        model, inp, out = _load_onnx(encoder)
    else:
        model, inp, out = _script_to_onnx(encoder, image_size)
    out = _float_output(model, out)
    model = compose.add_prefix(model, "encoder/")
    return model, f"encoder/{inp}", f"encoder/{out}"


def model_file_full_graph(
    head: Head, name: str, image_size: tuple[int, int] | None = None,
    encoder_file: str | os.PathLike[str] | None = None, model_dir: Path | None = None,
    ood: MahalanobisOOD | None = None,
) -> onnx.ModelProto:
    """Preprocessing + the user's model + the head as one ONNX model (module docstring).

    Parameters
    ----------
    head : Head
        A fitted head whose statistics came from an ``onnx:`` or ``torchscript:`` encoder.
    name : str
        Its name in the model directory.
    image_size : (int, int), optional
        (height, width) of the images fed (default: the contract's size).
    encoder_file : path, optional
        The model file (default: looked up by the recorded name).
    model_dir : Path, optional
        The model directory (for messages and the file lookup).
    ood : MahalanobisOOD, optional
        The model's OOD score: outputs ``ood_score`` (and ``ood`` when calibrated).

    Raises
    ------
    DataError, InputError
        The model file is not found or differs from the recorded one.
    ConfigError
        The model cannot be turned into ONNX at opset 17.
    """
    require_extra("onnx", "torch")
    import onnx
    from onnx import compose, helper

    from ghofl.client.encoders.recorded import rebuild_model_file_encoder
    from ghofl.model.onnx_graph import head_graph

    assert head.meta_.encoder is not None
    encoder = rebuild_model_file_encoder(head.meta_.encoder, f"'{model_dir or 'the model'}'",
                                         encoder_file, model_dir)
    size = _image_size(encoder.contract, image_size)
    enc, enc_in, enc_out = _encoder_model(encoder, size)
    ir = max(8, int(enc.ir_version))
    parts = [preprocess_graph(encoder.contract, size), enc, head_graph(head, name, ood)]
    for part in parts:
        part.ir_version = ir
    try:
        merged = compose.merge_models(parts[0], parts[1], io_map=[(PREPARED, enc_in)],
                                      outputs=[enc_out])
        merged = compose.merge_models(
            merged, parts[2], io_map=[(enc_out, INPUT_NAME)], outputs=head_outputs(ood),
            producer_name="ghofl", producer_version=parts[2].producer_version)
    except Exception as exc:
        raise ConfigError(f"the model '{encoder.path}' cannot be joined to the head graph "
                          f"({_first_line(exc)}); {_HINT.removeprefix('or ')}") from exc
    del merged.metadata_props[:]
    helper.set_model_props(merged, _metadata(parts[2], encoder, size))
    onnx.checker.check_model(merged)
    return merged


def _metadata(head_model: onnx.ModelProto, encoder: ImageFileEncoder,
              size: tuple[int, int] | None) -> dict[str, str]:
    """The head's ``metadata_props`` with the image input, the contract and the file's hash."""
    from dataclasses import asdict

    props = {p.key: p.value for p in head_model.metadata_props}
    contract = json.loads(props["ghofl.input_contract"])
    h, w = size if size is not None else ("H", "W")
    contract.update(input=_IMAGES, dtype="uint8", shape=["N", h, w, 3],
                    layout="NHWC RGB, decoded as ghofl's image loader feeds the encoder",
                    encoder_preprocessing=encoder.info.preprocessing,
                    model_input_contract=asdict(encoder.contract))
    props["ghofl.input_contract"] = json.dumps(contract, sort_keys=True)
    props["ghofl.image_size"] = f"{h}x{w}" if size is not None else "dynamic"
    props["ghofl.encoder_file_sha256"] = encoder.info.weights_hash
    return props
