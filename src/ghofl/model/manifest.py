"""The manifest of a model directory: its digest, the files' SHA-256 and a defensive reader.

:func:`manifest_digest` is the SHA-256 of a manifest's canonical JSON without its ``digest``;
:func:`check_signed` refuses a manifest lacking its digest or a file's ``sha256`` unless the
caller allows an unsigned (legacy) model; :func:`read_manifest` parses ``manifest.json`` with
bounded size. :mod:`ghofl.model.directory` reads and writes model directories with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ghofl.errors import GhoflWarning, InputError, StatsFormatError
from ghofl.stats.codec import parse_json

__all__ = [
    "MANIFEST",
    "MAX_MANIFEST_BYTES",
    "MODEL_FIX",
    "UNSIGNED_FIX",
    "UnsignedModelWarning",
    "check_digest",
    "check_signed",
    "file_sha256",
    "manifest_digest",
    "read_manifest",
]

MANIFEST = "manifest.json"
MODEL_FIX = "write it with `ghofl fit` (or ghofl.model.directory.save_model)"
UNSIGNED_FIX = ("re-create the model with `ghofl fit`, or, for a legacy model you trust, "
                 "pass --allow-unsigned-model (Python: load_model(..., allow_unsigned=True))")


class UnsignedModelWarning(GhoflWarning):
    """A model directory was loaded without the checks its manifest lacks (legacy model)."""


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """SHA-256 of a manifest's canonical JSON (sorted keys, compact) without ``digest``."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _unsigned_parts(manifest: Mapping[str, Any]) -> list[str]:
    """What a manifest lacks of its checks: ``"digest"`` and the files without a ``sha256``.

    The files are named as the manifest lists them (head files in manifest order, then the
    ``ood`` file); an empty list for a manifest that carries every check.
    """
    missing = ["digest"] if manifest.get("digest") is None else []
    entries = [*dict(manifest.get("heads") or {}).values(), manifest.get("ood")]
    for entry in entries:
        if isinstance(entry, dict) and entry.get("sha256") is None:
            missing.append(str(entry.get("file"))[:80])
    return missing


def check_signed(manifest: Mapping[str, Any], path: Path, allow_unsigned: bool = False) -> None:
    """Refuse a manifest without its digest or a file's SHA-256, unless ``allow_unsigned``.

    With ``allow_unsigned`` such a manifest gives an :class:`UnsignedModelWarning` naming
    what is unchecked.

    Raises
    ------
    InputError
        The manifest lacks its ``digest`` or the ``sha256`` of a file it lists, and
        ``allow_unsigned`` is false.
    """
    missing = _unsigned_parts(manifest)
    if not missing:
        return
    files = missing[1:] if missing[0] == "digest" else missing
    if len(files) > 4:
        files = [*files[:3], f"{len(files) - 3} more files"]
    parts = ["its digest"] if missing[0] == "digest" else []
    if files:
        parts.append(f"the SHA-256 of {', '.join(files)}")
    if not allow_unsigned:
        raise InputError(
            f"'{path}' lacks {' and '.join(parts)}, so the model cannot be checked against "
            f"what was fitted (a legacy or stripped manifest); {UNSIGNED_FIX}"
        )
    unchecked = ["the manifest itself (no digest)"] if missing[0] == "digest" else []
    if files:
        unchecked.append(f"the bytes of {', '.join(files)} (no sha256)")
    warnings.warn(
        f"loading the unsigned model in '{path.parent}' (--allow-unsigned-model): "
        f"{' and '.join(unchecked)} are unchecked; re-create it with `ghofl fit` to restore "
        "the checks",
        UnsignedModelWarning,
        stacklevel=3,
    )


def check_digest(manifest: dict[str, Any], path: Path) -> None:
    """Refuse a manifest whose ``digest`` is not :func:`manifest_digest` of its content.

    A manifest without a digest passes (a legacy one, allowed by :func:`check_signed`).

    Raises
    ------
    InputError
        The manifest was edited or is corrupt.
    """
    digest = manifest.get("digest")
    if digest is None:
        return  # a legacy manifest, loaded with allow_unsigned (check_signed)
    try:
        expected = manifest_digest(manifest)
    except (TypeError, ValueError):  # not JSON-encodable back (cannot happen for parsed JSON)
        expected = ""
    if digest != expected:
        raise InputError(
            f"'{path}' does not match its digest: the manifest was edited or is corrupt; "
            f"copy the whole model directory again, or {MODEL_FIX}"
        )


#: Largest manifest read.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


def read_manifest(model_dir: Path, path: Path) -> Any:
    """Parse ``manifest.json`` defensively (regular file, bounded size and nesting)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"'{model_dir}' has no {MANIFEST}, so it is not a ghofl model "
                         f"directory; {MODEL_FIX}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"'{path}' is not a regular file (a directory, FIFO or device); "
                         f"{MODEL_FIX}")
    if st.st_size > MAX_MANIFEST_BYTES:
        raise InputError(f"'{path}' is {st.st_size} bytes, more than the {MAX_MANIFEST_BYTES} "
                         f"a manifest may hold; {MODEL_FIX}")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise InputError(f"'{path}' is not a regular file; {MODEL_FIX}")
        raw = f.read(MAX_MANIFEST_BYTES + 1)
    try:
        return parse_json(raw.decode("utf-8"), f"'{path}'", MODEL_FIX)
    except (StatsFormatError, UnicodeDecodeError) as exc:
        raise InputError(f"'{path}' is not valid JSON ({exc}); {MODEL_FIX}") from exc
