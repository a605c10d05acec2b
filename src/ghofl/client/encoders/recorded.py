"""A user's own encoder rebuilt from what a model records, on another machine.

A model fitted on statistics of ``onnx:PATH`` or ``torchscript:PATH`` records the encoder's
:class:`~ghofl.stats.meta.EncoderInfo`: its name (``onnx:<stem>``, or the contract's ``name``),
the SHA-256 of the model file (``weights_hash``) and the resolved input contract
(``preprocessing``, see :meth:`InputContract.describe
<ghofl.client.encoders.contract.InputContract.describe>`). The file's path is not part of the
identity (clients keep it where they like), so :func:`rebuild_model_file_encoder` finds the
file in this order:

1. the path given (``--encoder-file PATH``);
2. else the recorded name read as a path (``onnx:net`` -> ``net``, then ``net.onnx``), relative
   to the current directory, then to the model directory (ship the file inside it).

The file must have the recorded SHA-256, and the encoder is rebuilt with the *recorded*
contract (so the JSON beside the model is not needed) and must then have the recorded
fingerprint; otherwise the error names both and the fix.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

from ghofl.client.encoders.model_file import ImageFileEncoder
from ghofl.client.transforms import recorded_feature_transform, transformed_info
from ghofl.errors import DataError, InputError
from ghofl.stats.meta import EncoderInfo

__all__ = [
    "ENCODER_FILE_HINT",
    "LIBRARY_PREFIXES",
    "find_model_file",
    "is_library_encoder",
    "model_file_kind",
    "rebuild_library_encoder",
    "rebuild_model_file_encoder",
    "recorded_contract",
]

_PREFIX = "input contract "
_ONNX_IO = re.compile(r"^; onnx ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") -> "
                      r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
#: File name endings tried after the recorded name (``onnx:net`` -> ``net.onnx``).
SUFFIXES = {"onnx": (".onnx",), "torchscript": (".pt", ".pth")}
ENCODER_FILE_HINT = "give the model file the clients used with --encoder-file PATH"


def _split(info: EncoderInfo) -> tuple[dict[str, Any], str] | None:
    """(contract JSON, the text after it) of a model-file encoder's preprocessing, else None."""
    pre = info.preprocessing
    if not pre.startswith(_PREFIX):
        return None
    try:
        obj, end = json.JSONDecoder().raw_decode(pre, len(_PREFIX))
    except json.JSONDecodeError:
        return None
    return (obj, pre[end:]) if isinstance(obj, dict) else None


def model_file_kind(info: EncoderInfo | None) -> str | None:
    """``"onnx"`` or ``"torchscript"`` for a recorded model-file encoder, else ``None``."""
    if info is None or info.resolution is None:
        return None
    parts = _split(info)
    if parts is None:
        return None
    return "onnx" if _ONNX_IO.match(parts[1]) else "torchscript"


def recorded_contract(info: EncoderInfo) -> dict[str, Any]:
    """The contract keys that rebuild the recorded encoder (its name included).

    Raises
    ------
    InputError
        ``info`` is not a model-file encoder.
    """
    parts = _split(info)
    if parts is None:
        raise InputError(f"the encoder {info.name!r} is not an onnx: or torchscript: model "
                         "file, so --encoder-file does not apply; drop it")
    obj, rest = parts
    values: dict[str, Any] = {"name": info.name, "layout": obj["layout"],
                              "dtype": obj["dtype"], "resize": obj["resize"]}
    if obj.get("size") is not None:
        values["size"] = list(obj["size"])
    if obj["dtype"] != "uint8":
        values.update(scale=obj["scale"], mean=list(obj["mean"]), std=list(obj["std"]))
    m = _ONNX_IO.match(rest)
    if m is not None:
        values.update(input=ast.literal_eval(m.group(1)), output=ast.literal_eval(m.group(2)))
    return values


def _candidates(info: EncoderInfo, kind: str, model_dir: Path | None) -> list[Path]:
    """Where to look for the file when no path is given (module docstring)."""
    stem = info.name.partition(":")[2].strip() if info.name.lower().startswith(
        kind + ":") else ""
    if not stem:
        return []
    names = [stem] + [stem + s for s in SUFFIXES[kind] if not stem.lower().endswith(s)]
    roots = [Path.cwd()] + ([model_dir] if model_dir is not None else [])
    return [root / Path(n).expanduser() for root in roots for n in names]


def find_model_file(info: EncoderInfo, kind: str, encoder_file: str | os.PathLike[str] | None,
                    where: str, model_dir: Path | None = None) -> Path:
    """The model file of the recorded encoder ``info`` (module docstring), its SHA-256 checked.

    Raises
    ------
    DataError
        ``encoder_file`` does not exist, or it is not given and no candidate exists.
    InputError
        The file found has another SHA-256 than the recorded one.
    """
    from ghofl.client.encoders.efficientnet_lite import sha256_file

    if encoder_file is not None:
        path = Path(encoder_file).expanduser()
        if not path.is_file():
            raise DataError(f"--encoder-file '{path}' does not exist or is not a file; "
                            f"{ENCODER_FILE_HINT}")
        found = [path]
    else:
        found = [p for p in _candidates(info, kind, model_dir) if p.is_file()]
        if not found:
            raise DataError(
                f"the model in {where} was fitted with the {kind} encoder {info.name!r}, whose "
                f"model file is not here (the model records its SHA-256, not its path); "
                f"{ENCODER_FILE_HINT}")
    for path in found:
        if sha256_file(path) == info.weights_hash:
            return path
    shown = ", ".join(f"'{p}' has SHA-256 {sha256_file(p)[:16]} ({_found(info, kind, p)})"
                      for p in found)
    raise InputError(
        f"the model in {where} was fitted with encoder {info.name!r} (fingerprint "
        f"{info.fingerprint()}, model file SHA-256 {info.weights_hash[:16]}), but {shown}: "
        f"another or a corrupt file; {ENCODER_FILE_HINT}, or fit the model again from "
        "statistics computed with this file")


def _build(info: EncoderInfo, kind: str, path: Path) -> ImageFileEncoder:
    """The encoder of ``path`` with the recorded contract of ``info``."""
    from ghofl.client.encoders.factory import get_encoder

    encoder = get_encoder(f"{kind}:{path}", resolution=int(info.resolution or 224),
                          contract=recorded_contract(info))
    assert isinstance(encoder, ImageFileEncoder)
    return encoder


def _found(info: EncoderInfo, kind: str, path: Path) -> str:
    """The fingerprint the file at ``path`` gives, or why it gives none (for messages)."""
    from ghofl.errors import GhoflError

    try:
        local = _build(info, kind, path).info
    except GhoflError:
        return f"no fingerprint: ghofl cannot load it as {kind}:PATH with the recorded contract"
    return f"fingerprint {transformed_info(local, recorded_feature_transform(info)).fingerprint()}"


def rebuild_model_file_encoder(
    recorded: EncoderInfo, where: str, encoder_file: str | os.PathLike[str] | None = None,
    model_dir: Path | None = None,
) -> ImageFileEncoder:
    """The recorded ``onnx:`` / ``torchscript:`` encoder, rebuilt and checked.

    Parameters
    ----------
    recorded : EncoderInfo
        ``head.meta_.encoder`` (with the recorded feature transform, if any).
    where : str
        The model, as messages name it (``"'model/'"``).
    encoder_file : path, optional
        The model file (``--encoder-file``); default: looked up (module docstring).
    model_dir : Path, optional
        The model directory, searched after the current directory.

    Raises
    ------
    DataError, InputError
        See :func:`find_model_file`; also a rebuilt encoder whose fingerprint differs.
    """
    kind = model_file_kind(recorded)
    if kind is None:
        raise InputError(f"the model in {where} was fitted with encoder {recorded.name!r}, not "
                         "an onnx: or torchscript: model file; drop --encoder-file")
    path = find_model_file(recorded, kind, encoder_file, where, model_dir)
    encoder = _build(recorded, kind, path)
    local = transformed_info(encoder.info, recorded_feature_transform(recorded))
    if local.fingerprint() != recorded.fingerprint():
        raise InputError(
            f"the encoder file '{path}' rebuilt with the recorded contract has fingerprint "
            f"{local.fingerprint()}, but the model in {where} records {recorded.fingerprint()} "
            f"(preprocessing {local.preprocessing!r} here, {recorded.preprocessing!r} "
            "recorded); use the ghofl version that fitted the model, or fit it again")
    return encoder


#: Encoders of a library, recorded as ``<prefix><folder name, hub id or model name>``.
LIBRARY_PREFIXES = ("hf:", "timm:", "open_clip:")


def is_library_encoder(info: EncoderInfo | None) -> bool:
    """Whether ``info`` records an ``hf:``, ``timm:`` or ``open_clip:`` encoder."""
    return info is not None and info.name.lower().startswith(LIBRARY_PREFIXES)


def _library_candidates(recorded: EncoderInfo, encoder_file: str | os.PathLike[str] | None,
                        model_dir: Path | None) -> list[str]:
    """Encoder names to try for a recorded ``hf:`` / ``timm:`` / ``open_clip:`` encoder.

    ``--encoder-file`` is the model folder (``hf:``) or the weights file (``timm:``,
    ``open_clip:``); without it, the recorded name (a folder name relative to the current
    directory, or a hub id), then for ``hf:`` that folder inside the model directory.
    """
    kind, _, spec = recorded.name.partition(":")
    kind = kind.lower()
    if encoder_file is not None:
        if kind == "hf":
            return [f"hf:{Path(encoder_file).expanduser()}"]
        return [f"{kind}:{spec.split('@')[0]}@{Path(encoder_file).expanduser()}"]
    names = [recorded.name]
    if kind == "hf" and model_dir is not None and (model_dir / spec).is_dir():
        names.append(f"hf:{model_dir / spec}")
    return names


def rebuild_library_encoder(recorded: EncoderInfo, where: str, backend: str = "onnx",
                            encoder_file: str | os.PathLike[str] | None = None,
                            model_dir: Path | None = None) -> Any:
    """The recorded library encoder, rebuilt from the first candidate that loads.

    The caller checks its fingerprint against ``recorded``.

    Raises
    ------
    DataError
        No candidate loads here; the message asks for ``--encoder-file``.
    """
    from ghofl.client.encoders.factory import get_encoder

    failures: list[str] = []
    for name in _library_candidates(recorded, encoder_file, model_dir):
        try:
            return get_encoder(name, resolution=recorded.resolution or 224, backend=backend)
        except DataError as exc:
            failures.append(str(exc))
    what = ("its model folder" if recorded.name.lower().startswith("hf:")
            else "its weights file")
    raise DataError(
        f"the model in {where} was fitted with the encoder {recorded.name!r}, which cannot be "
        f"loaded here ({failures[-1]}); give {what} with --encoder-file PATH"
    )
