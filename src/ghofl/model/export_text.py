"""``ghofl export`` of a text model: token ids → encoder → head, one ONNX file.

The model's text encoder (:func:`~ghofl.client.encoders.get_encoder` of the recorded name,
its fingerprint checked after the recorded feature transform) is exported with its pooling
and L2 normalisation (:mod:`ghofl.client.encoders.text_onnx`) and composed with the head graph
(:func:`~ghofl.model.onnx_graph.head_graph`) by ``onnx.compose``::

    input_ids       int64 (N, L)   token ids, padded to the longest text of the batch
    attention_mask  int64 (N, L)   1 for tokens, 0 for padding
    probabilities   float32 (N, C)
    label           int64 (N,)
    ood_score       float64 (N,)   with the model's OOD score (:mod:`ghofl.heads.ood`)
    ood             bool (N,)      with it, once its threshold is calibrated on data

The tokenizer goes beside the ONNX file as ``FILE.tokenizer.json`` (:func:`tokenizer_path`),
a ``tokenizers`` file with the encoder's truncation length and padding set, so that::

    tok = tokenizers.Tokenizer.from_file("FILE.tokenizer.json")
    enc = tok.encode_batch(texts)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)

feeds the graph. ``ghofl.input_contract`` in the file's metadata states this contract; the
export is checked on probe sentences (tokenizer and embeddings) before anything is written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ghofl.client.encoders.base import Encoder
from ghofl.client.transforms import recorded_feature_transform, transformed_info
from ghofl.errors import ConfigError, InputError, MissingExtraError, require_extra
from ghofl.files import atomic_write
from ghofl.heads.base import Head
from ghofl.model.directory import load_model
from ghofl.model.onnx_graph import INPUT_NAME, head_graph, rename_input
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    import onnx

    from ghofl.client.encoders.text_onnx import TextGraphSpec
    from ghofl.heads.ood import MahalanobisOOD

__all__ = [
    "TOKENIZER_SUFFIX",
    "check_text_fingerprint",
    "export_text_model",
    "is_text_encoder",
    "is_text_model",
    "text_encoder_for",
    "text_full_graph",
    "tokenizer_path",
]

TOKENIZER_SUFFIX = ".tokenizer.json"
_HEAD_ONLY_HINT = "export the head alone with --head-only (input: the encoder's embeddings)"


def is_text_encoder(info: EncoderInfo | None) -> bool:
    """Whether a recorded encoder takes texts (no resolution), as ``ghofl predict`` decides."""
    return info is not None and info.resolution is None


def is_text_model(model_dir: Path, head_name: str) -> bool:
    """Whether head ``head_name`` of ``model_dir`` was fitted on a text encoder's output."""
    heads, _ = load_model(model_dir)
    head = heads.get(head_name)
    return head is not None and is_text_encoder(head.meta_.encoder)


def tokenizer_path(out: Path) -> Path:
    """The tokenizer file beside ``out``: ``m.onnx`` → ``m.tokenizer.json``."""
    out = Path(out)
    return out.with_name(out.stem + TOKENIZER_SUFFIX)


def text_encoder_for(info: EncoderInfo) -> Encoder:
    """The text encoder a model records, rebuilt locally and its fingerprint checked.

    Raises
    ------
    ConfigError
        The name is no encoder ghofl can build (a user's own encoder), or the local encoder's
        fingerprint differs from the recorded one (after the recorded feature transform).
    """
    from ghofl.client import encoders

    try:
        encoder = encoders.get_encoder(info.name)
    except MissingExtraError:
        raise
    except ConfigError as exc:
        if not str(exc).startswith("unknown encoder"):
            raise  # a known encoder that cannot be built here: its own message says why
        raise ConfigError(
            f"the model's encoder {info.name!r} has no ONNX path in ghofl (only the built-in "
            f"image encoders and the sentence-transformers text encoders have one); "
            f"{_HEAD_ONLY_HINT}"
        ) from None
    check_text_fingerprint(encoder, info)
    return encoder


def check_text_fingerprint(encoder: Encoder, info: EncoderInfo) -> None:
    """Refuse an encoder whose output (after the recorded transform) is not the recorded one.

    Raises
    ------
    ConfigError
        Naming both fingerprints and the fix.
    """
    local = transformed_info(encoder.info, recorded_feature_transform(info))
    if local.fingerprint() != info.fingerprint():
        raise ConfigError(
            f"the local encoder {info.name!r} has fingerprint {local.fingerprint()}, but the "
            f"model was fitted with {info.fingerprint()} (other weights or preprocessing); "
            f"install the model files the clients used, or {_HEAD_ONLY_HINT}"
        )


def _contract(spec: TextGraphSpec, encoder: Encoder, tokenizer_file: str,
              base: dict[str, Any]) -> dict[str, Any]:
    """``ghofl.input_contract`` of the full text graph."""
    from ghofl.client.encoders.text_onnx import TEXT_INPUTS, tokenize

    tok = spec.tokenizer
    pad = tok.padding or {}
    trunc = tok.truncation or {}
    probe = tokenize(tok, ["ABC Def", "abc def"])["input_ids"]
    contract = dict(base)
    contract.pop("input", None)
    contract.pop("shape", None)
    contract.update(
        inputs={k: {"dtype": "int64", "shape": ["N", "L"]} for k in TEXT_INPUTS},
        dtype="int64",
        tokenizer_file=tokenizer_file,
        tokenizer_library="tokenizers (Tokenizer.from_file, encode_batch: ids, attention_mask)",
        max_length=int(spec.max_length),
        truncation=trunc.get("direction", "right"),
        padding={"to": "longest in batch", "side": pad.get("direction", "right"),
                 "pad_id": pad.get("pad_id", 0), "pad_token": pad.get("pad_token")},
        lowercase=bool((probe[0] == probe[1]).all()),
        pooling=spec.pooling,
        normalize=bool(spec.normalize),
        encoder_preprocessing=encoder.info.preprocessing,
        text="one item per text, as ghofl predict reads one line of a text file",
    )
    return contract


def text_full_graph(head: Head, name: str, spec: TextGraphSpec, encoder: Encoder,
                    tokenizer_file: str, ood: MahalanobisOOD | None = None) -> onnx.ModelProto:
    """Text encoder + head as one ONNX model (module docstring), checked on probe texts.

    Parameters
    ----------
    head : Head
        A fitted head.
    name : str
        Its name in the model directory.
    spec : TextGraphSpec
        The encoder's export description (:func:`~ghofl.client.encoders.text_onnx.
        text_graph_spec`).
    encoder : Encoder
        The encoder itself, to check the export against.
    tokenizer_file : str
        File name of the tokenizer written beside the model (recorded in the metadata).
    ood : MahalanobisOOD, optional
        The model's OOD score: outputs ``ood_score`` (and ``ood`` when calibrated).
    """
    require_extra("onnx", "torch")
    import onnx
    from onnx import compose, helper

    from ghofl.client.encoders.text_onnx import (
        EMBEDDING_NAME,
        TEXT_INPUTS,
        check_text_export,
        text_encoder_onnx,
    )

    enc = text_encoder_onnx(spec)
    check_text_export(enc, spec, encoder)
    head_model = head_graph(head, name, ood)
    enc = compose.add_prefix(enc, "encoder/")
    head_model.ir_version = enc.ir_version
    merged = compose.merge_models(
        enc, head_model, io_map=[(f"encoder/{EMBEDDING_NAME}", INPUT_NAME)],
        producer_name="ghofl", producer_version=head_model.producer_version,
    )
    for key in TEXT_INPUTS:
        rename_input(merged, f"encoder/{key}", key)
    props = {p.key: p.value for p in head_model.metadata_props}
    base = json.loads(props["ghofl.input_contract"])
    contract = _contract(spec, encoder, tokenizer_file, base)
    props["ghofl.input_contract"] = json.dumps(contract, sort_keys=True)
    props["ghofl.tokenizer"] = tokenizer_file
    del merged.metadata_props[:]
    helper.set_model_props(merged, props)
    onnx.checker.check_model(merged)
    return merged


def export_text_model(head: Head, name: str, out: Path, *, force: bool = False,
                      image_size: tuple[int, int] | None = None,
                      encoder: Encoder | None = None,
                      ood: MahalanobisOOD | None = None) -> tuple[Path, Path]:
    """Write the full text graph to ``out`` and its tokenizer beside it, atomically each.

    Parameters
    ----------
    head, name :
        The fitted head and its name in the model directory.
    out : Path
        The ONNX file (``.onnx``; checked by the caller).
    force : bool
        Replace an existing tokenizer file.
    image_size : optional
        Refused (image encoders only).
    encoder : Encoder, optional
        The text encoder, already built (e.g. from ``--encoder-file``); default: rebuilt
        from the recorded name (:func:`text_encoder_for`). Its fingerprint is checked.
    ood : MahalanobisOOD, optional
        The model's OOD score (:func:`~ghofl.model.directory.load_ood`): outputs
        ``ood_score``, and ``ood`` when its threshold is calibrated.

    Returns
    -------
    (Path, Path)
        The ONNX file and the tokenizer file (:func:`tokenizer_path`).

    Raises
    ------
    InputError
        The tokenizer file exists and ``force`` is false; an ``image_size`` is given.
    ConfigError
        As :func:`text_encoder_for`, and an encoder without an ONNX export.
    """
    from onnx import helper

    from ghofl.client.encoders.text_onnx import text_graph_spec

    info = head.meta_.encoder
    if info is None:
        raise ConfigError(f"the model records no encoder (raw features); {_HEAD_ONLY_HINT}")
    if image_size is not None:
        raise InputError(f"--image-size applies to image encoders only; the model's encoder "
                         f"{info.name!r} takes texts (token ids); drop --image-size")
    out = Path(out)
    tok_path = tokenizer_path(out)
    if tok_path.exists() and not force:
        raise InputError(f"the tokenizer file '{tok_path}' (written beside --out) already "
                         "exists; pass --force to replace it, or choose another --out")
    if encoder is None:
        encoder = text_encoder_for(info)
    else:
        check_text_fingerprint(encoder, info)
    spec = text_graph_spec(encoder)
    model = text_full_graph(head, name, spec, encoder, tok_path.name, ood)
    tok_text = spec.tokenizer.to_str(pretty=True)
    props = {p.key: p.value for p in model.metadata_props}
    props["ghofl.tokenizer_sha256"] = hashlib.sha256(tok_text.encode("utf-8")).hexdigest()
    del model.metadata_props[:]
    helper.set_model_props(model, props)
    blob = model.SerializeToString()
    atomic_write(tok_path, lambda tmp: Path(tmp).write_text(tok_text, encoding="utf-8"))
    atomic_write(out, lambda tmp: Path(tmp).write_bytes(blob))
    return out, tok_path
