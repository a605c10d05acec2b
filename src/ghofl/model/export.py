"""``ghofl export``: one head of a model directory as an ONNX file, head-only or with its encoder.

* Head-only (:func:`~ghofl.model.onnx_graph.head_graph`): input ``embeddings`` float32 (N, d),
  the encoder's output.
* Full graph (:func:`full_graph`), for the built-in image encoders that run on ONNX Runtime
  (EfficientNet-Lite, their int8 versions, the torchvision backbones): the encoder's own ONNX
  export (:mod:`ghofl.client.encoders.onnx_backend`) composed with the head graph by
  ``onnx.compose``; for a user's ``onnx:`` / ``torchscript:`` model file, its input contract as
  ONNX nodes, the model and the head (:mod:`ghofl.model.export_file`). Input ``images``
  uint8 (N, H, W, 3), the decoded RGB images as ghofl's image loader feeds the encoder
  (resized inside the graph as in the encoder), the same outputs ``probabilities`` and
  ``label``. The encoder is rebuilt from what the model records (a model file: from
  ``--encoder-file`` or its recorded name) and must have the recorded fingerprint (same
  weights, same preprocessing).
* Full graph of a text model (no resolution recorded): :mod:`ghofl.model.export_text`, inputs
  ``input_ids``/``attention_mask`` int64 (N, L), the tokenizer written beside the file.

Both record the head's metadata (:func:`~ghofl.model.onnx_graph.head_metadata`) in the file's
``metadata_props``; the full graph adds ``ghofl.image_size``. When the model directory holds an
OOD score (``ood.npz``), every graph (head-only, and the full graph of every encoder kind: built-
in, ``timm:`` / ``open_clip:``, ``onnx:`` / ``torchscript:`` model files, text) also outputs
``ood_score`` float64 (N,), and ``ood`` bool (N,) only when the manifest records a threshold
calibrated on data (``ghofl evaluate --calibrate-ood``, or ``--report TOTAL.ghe --update-card``
from the clients' federated evaluation); a model without one has no ``ood`` output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ghofl.client.transforms import recorded_feature_transform, transformed_info
from ghofl.errors import ConfigError, InputError, require_extra
from ghofl.files import atomic_write
from ghofl.heads.base import Head
from ghofl.model.onnx_graph import INPUT_NAME, head_graph, rename_input
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import onnx

    from ghofl.heads.ood import MahalanobisOOD

__all__ = ["IMAGE_INPUT", "check_new_output", "export_model", "full_graph", "image_encoder_for",
           "parse_image_size"]

#: Input of the full graph: decoded uint8 RGB images (N, H, W, 3).
IMAGE_INPUT = "images"
_HEAD_ONLY_HINT = "export the head alone with --head-only (input: the encoder's embeddings)"


def parse_image_size(text: str) -> tuple[int, int]:
    """``"224"`` or ``"32x48"`` (height x width) → (height, width)."""
    parts = text.lower().split("x")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) not in (1, 2) or min(vals) < 1:
        raise ConfigError(f"invalid image size {text!r}; give H or HxW in pixels, e.g. 32x32")
    return (vals[0], vals[-1])


def check_new_output(out: Path, force: bool) -> None:
    """Refuse to replace an existing output file ``out`` unless ``force`` (``--force``).

    Raises
    ------
    InputError
        ``out`` exists and ``force`` is False.
    """
    if out.exists() and not force:
        raise InputError(f"--out '{out}' already exists; pass --force to replace it, or "
                         "choose another path")


def image_encoder_for(info: EncoderInfo | None, cache_dir: str | os.PathLike[str] | None = None
                      ) -> Any:
    """The built-in ONNX image encoder that the model records, its fingerprint checked.

    Parameters
    ----------
    info : EncoderInfo or None
        The model's encoder (with the recorded feature transform, if any).
    cache_dir : path, optional
        Cache of the encoder's ONNX exports (default ``GHOFL_CACHE_DIR``).

    Returns
    -------
    OnnxEncoder

    Raises
    ------
    ConfigError
        No encoder recorded, an encoder without an ONNX path (text encoders), or a
        local encoder whose fingerprint differs from the recorded one.
    """
    from ghofl.client.encoders.factory import available_encoders, get_encoder

    if info is None:
        raise ConfigError(f"the model records no encoder (raw features); {_HEAD_ONLY_HINT}")
    if info.name.lower() not in available_encoders() or info.resolution is None:
        raise ConfigError(
            f"the model's encoder {info.name!r} has no ONNX path in ghofl (only the built-in "
            "image encoders, onnx:/torchscript: model files and timm:/open_clip: models have "
            f"one); {_HEAD_ONLY_HINT}"
        )
    encoder = get_encoder(info.name, resolution=info.resolution, backend="onnx",
                          cache_dir=cache_dir)
    return checked_onnx_encoder(encoder, info)


def checked_onnx_encoder(encoder: Any, info: EncoderInfo) -> Any:
    """``encoder`` when it runs on ONNX Runtime with the fingerprint ``info`` records.

    Raises
    ------
    ConfigError
        It does not run on ONNX Runtime, or its fingerprint (after the recorded feature
        transform) differs from the recorded one.
    """
    from ghofl.client.encoders.onnx_backend import OnnxEncoder

    transform = recorded_feature_transform(info)
    if not isinstance(encoder, OnnxEncoder):
        raise ConfigError(f"the encoder {info.name!r} does not run on ONNX Runtime; "
                          f"{_HEAD_ONLY_HINT}")
    local = transformed_info(encoder.info, transform)
    if local.fingerprint() != info.fingerprint():
        raise ConfigError(
            f"the local encoder {info.name!r} has fingerprint {local.fingerprint()}, but the "
            f"model was fitted with {info.fingerprint()} (other weights or preprocessing); "
            f"install the clients' weights, or {_HEAD_ONLY_HINT}"
        )
    return encoder


def full_graph(head: Head, name: str, image_size: tuple[int, int] | None = None,
               cache_dir: str | os.PathLike[str] | None = None,
               encoder_file: str | os.PathLike[str] | None = None,
               model_dir: Path | None = None,
               ood: MahalanobisOOD | None = None) -> onnx.ModelProto:
    """Encoder + head as one ONNX model (module docstring).

    Parameters
    ----------
    head : Head
        A fitted head.
    name : str
        Its name in the model directory.
    image_size : (int, int), optional
        (height, width) of the images fed (default: the encoder's resolution); only the batch
        axis is dynamic.
    cache_dir : path, optional
        Cache of the encoder's ONNX exports.
    encoder_file : path, optional
        The model file of an ``onnx:`` / ``torchscript:`` encoder (default: looked up by the
        recorded name, :mod:`ghofl.client.encoders.recorded`).
    model_dir : Path, optional
        The model directory (messages, and where the model file is looked up).
    ood : MahalanobisOOD, optional
        The model's OOD score: outputs ``ood_score``, and ``ood`` when its threshold is
        calibrated (every encoder kind).
    """
    require_extra("onnx", "torch")
    import onnx
    from onnx import compose, helper

    from ghofl.client.encoders.recorded import (
        is_library_encoder,
        model_file_kind,
        rebuild_library_encoder,
    )

    if model_file_kind(head.meta_.encoder) is not None:
        from ghofl.model.export_file import model_file_full_graph

        return model_file_full_graph(head, name, image_size, encoder_file, model_dir, ood)
    info = head.meta_.encoder
    if is_library_encoder(info):  # timm: / open_clip: (their ONNX export), checked
        assert info is not None
        encoder = checked_onnx_encoder(rebuild_library_encoder(
            info, f"'{model_dir}'", "onnx", encoder_file, model_dir), info)
    elif encoder_file is not None:
        raise ConfigError("--encoder-file applies to onnx:, torchscript:, hf:, timm: and "
                          "open_clip: encoders; the model records a built-in encoder, so drop "
                          "it")
    else:
        encoder = image_encoder_for(info, cache_dir)
    res = int(encoder.info.resolution or 224)
    h, w = image_size or (res, res)
    encoder.session(h, w)  # builds the cached export for this size if it is missing
    enc = onnx.load(str(encoder.onnx_path(h, w)))
    enc_in = enc.graph.input[0].name
    (enc_out,) = [o.name for o in enc.graph.output]
    head_model = head_graph(head, name, ood)
    head_model.ir_version = enc.ir_version
    enc = compose.add_prefix(enc, "encoder/")
    merged = compose.merge_models(
        enc, head_model, io_map=[(f"encoder/{enc_out}", INPUT_NAME)],
        producer_name="ghofl", producer_version=head_model.producer_version,
    )
    rename_input(merged, f"encoder/{enc_in}", IMAGE_INPUT)
    props = {p.key: p.value for p in head_model.metadata_props}
    contract = json.loads(props["ghofl.input_contract"])
    contract.update(input=IMAGE_INPUT, dtype="uint8", shape=["N", h, w, 3],
                    layout="NHWC RGB, decoded as ghofl's image loader feeds the encoder",
                    encoder_preprocessing=encoder.info.preprocessing)
    props["ghofl.input_contract"] = json.dumps(contract, sort_keys=True)
    props["ghofl.image_size"] = f"{h}x{w}"
    del merged.metadata_props[:]
    helper.set_model_props(merged, props)
    onnx.checker.check_model(merged)
    return merged


def export_model(model_dir: Path, head_name: str, out: Path, *, head_only: bool = False,
                 force: bool = False, image_size: tuple[int, int] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 encoder_file: str | os.PathLike[str] | None = None,
                 allow_unsigned: bool = False) -> Path:
    """Write head ``head_name`` of ``model_dir`` to the ONNX file ``out``, atomically.

    ``allow_unsigned`` reads a legacy model directory whose manifest lacks its checks (see
    :func:`~ghofl.model.directory.load_model`).

    Raises
    ------
    InputError
        ``out`` does not end in ``.onnx``, is a directory, or exists without ``force``; the
        model directory has no head ``head_name`` (the message lists its heads), or is
        refused by :func:`~ghofl.model.directory.load_model`.
    ConfigError
        Full graph asked for an encoder without an ONNX path (see :func:`full_graph`).
    """
    from ghofl.model.directory import load_model, load_ood

    out = Path(out)
    if out.suffix.lower() != ".onnx":
        raise InputError(f"--out '{out}' must end in .onnx (an ONNX model file); e.g. "
                         f"{out.with_suffix('.onnx').name}")
    if out.is_dir():
        raise InputError(f"--out '{out}' is a directory; give a file path ending in .onnx")
    check_new_output(out, force)
    model = load_model(model_dir, allow_unsigned=allow_unsigned, missing_ok=True)
    heads, manifest = model
    if head_name not in heads and head_name not in model.missing:
        raise InputError(f"the model in '{model_dir}' has no head {head_name!r}; its heads: "
                         f"{', '.join(manifest['heads'])}")
    head = model.head(head_name)  # one line naming its file when it is missing
    from ghofl.model.export_text import export_text_model, is_text_encoder

    ood = load_ood(model_dir, manifest, allow_unsigned=allow_unsigned)
    if not head_only and is_text_encoder(head.meta_.encoder):  # token ids in, tokenizer beside
        encoder = _text_encoder(head.meta_.encoder, f"'{model_dir}'", encoder_file, model_dir)
        return export_text_model(head, head_name, out, force=force, image_size=image_size,
                                 encoder=encoder, ood=ood)[0]
    if head_only:
        model = head_graph(head, head_name, ood)
    else:
        model = full_graph(head, head_name, image_size, cache_dir, encoder_file, model_dir,
                           ood)
    blob = model.SerializeToString()
    atomic_write(out, lambda tmp: Path(tmp).write_bytes(blob))
    return out


def _text_encoder(info: EncoderInfo | None, where: str,
                  encoder_file: str | os.PathLike[str] | None, model_dir: Path) -> Any:
    """An ``hf:`` text encoder rebuilt from ``--encoder-file`` or its recorded name, else None.

    ``None`` lets :func:`~ghofl.model.export_text.export_text_model` rebuild a built-in text
    encoder by name; either way its fingerprint is checked there.

    Raises
    ------
    InputError
        ``encoder_file`` given for a built-in text encoder.
    """
    from ghofl.client.encoders.recorded import is_library_encoder, rebuild_library_encoder

    if info is not None and is_library_encoder(info):
        return rebuild_library_encoder(info, where, "onnx", encoder_file, model_dir)
    if encoder_file is not None:
        raise InputError(
            f"--encoder-file applies to onnx:, torchscript:, hf:, timm: and open_clip: "
            f"encoders; the model in {where} records the built-in encoder "
            f"{getattr(info, 'name', None)!r}; drop --encoder-file")
    return None
