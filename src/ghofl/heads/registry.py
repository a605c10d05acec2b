"""Head registry by name, and save/load of fitted heads.

Heads are registered as ``"module:Class"`` strings so that listing or creating a closed-form
head never imports torch; trainable heads import it only when fitted.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
from typing import Any

from ghofl.errors import ConfigError, GhoflError, InputError, StatsFormatError
from ghofl.heads.base import Head
from ghofl.stats.codec import (
    TensorInfo,
    header_meta,
    parse_json,
    read_safetensors,
    write_safetensors,
)
from ghofl.stats.meta import HOLDOUT_SCHEMA_VERSION, StatsMeta

HEAD_FORMAT = "ghofl.head"
#: Schema version written in head files. The head format did not change when the statistics
#: schema moved to 3 (held-out sections, float32 transport), so heads stay at version 2 and
#: older ghofl reads them; only a head whose metadata records a held-out fraction (metadata
#: that statistics schema 3 introduced) is written as version 3 (:func:`head_schema_version`).
HEAD_SCHEMA_VERSION = 2
#: Newest head schema version read: some ghofl builds wrote 3 in every head file.
HEAD_MAX_SCHEMA_VERSION = 3
#: Header metadata keys of a head file (besides the content digest).
HEAD_KEYS = frozenset({"format", "schema_version", "head", "params", "scalars", "meta"})

_REGISTRY: dict[str, str] = {
    "nb": "ghofl.heads.nb:NBDiagHead",
    "lda": "ghofl.heads.lda:LDAHead",
    "qda": "ghofl.heads.qda:QDAHead",
    "fedcgs": "ghofl.heads.fedcgs:FedCGSHead",
    "fishermix": "ghofl.heads.fishermix:FisherMixHead",
    "protohyper": "ghofl.heads.protohyper:ProtoHyperHead",
    "ridge": "ghofl.heads.ridge:RidgeHead",
    "ncm": "ghofl.heads.ncm:NCMHead",
    "fed3r": "ghofl.heads.fed3r:Fed3RHead",
    "fedcof": "ghofl.heads.fedcof:FedCOFHead",
}


def register_head(name: str, target: str | type[Head]) -> None:
    """Register a head class (or a ``"module:Class"`` path) under ``name``."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"head names must be alphanumeric (with - or _); got {name!r}")
    _REGISTRY[name] = (
        target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
    )


def available_heads() -> list[str]:
    """Names of all registered heads, in registration order."""
    return list(_REGISTRY)


def head_class(name: str) -> type[Head]:
    """The class registered under ``name``; :class:`ConfigError` listing the names otherwise."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown head {name!r}; available heads: {', '.join(available_heads())}"
        ) from None
    module, _, qual = target.partition(":")
    cls = getattr(importlib.import_module(module), qual)
    if not (isinstance(cls, type) and issubclass(cls, Head)):
        raise ConfigError(f"registered head {name!r} ({target}) is not a Head subclass")
    return cls


def head_defaults(name: str) -> dict[str, Any]:
    """Default hyperparameters of the head registered as ``name`` (from its ``__init__``).

    Parameters without a default map to ``inspect.Parameter.empty``.
    """
    sig = inspect.signature(head_class(name).__init__)
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def make_head(name: str, **params: Any) -> Head:
    """Create the head registered as ``name`` with hyperparameters ``params``."""
    cls = head_class(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ConfigError(f"invalid parameters for head {name!r}: {exc}") from None


def parse_head_list(spec: str | list[str]) -> list[str]:
    """``"nb,lda"`` or ``["nb", "lda"]`` -> validated list of names (``"all"`` = every head)."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    if names == ["all"]:
        return available_heads()
    if not names:
        raise ConfigError("no heads given; pass a comma-separated list such as 'nb,lda,qda'")
    for n in names:
        if n not in _REGISTRY:
            _unknown(n)
    if len(set(names)) != len(names):
        raise ConfigError(f"head list has duplicates: {names}")
    return names


def _unknown(name: str) -> None:
    raise ConfigError(f"unknown head {name!r}; available heads: {', '.join(available_heads())}")


def save_head(head: Head, path: str | os.PathLike[str]) -> int:
    """Save a fitted head to a safetensors file atomically; return its size in bytes.

    The file holds a ``content_sha256`` digest of its arrays, see :mod:`ghofl.stats.codec`.

    The header's ``schema_version`` is :func:`head_schema_version` (2 unless the head's
    metadata records a held-out fraction), so heads stay readable by older ghofl.
    """
    arrays, scalars = head.get_state()
    name = head.name or type(head).__name__
    header = {
        "format": HEAD_FORMAT,
        "schema_version": str(head_schema_version(head.meta_)),
        "head": name,
        "params": json.dumps(head.get_params(), sort_keys=True, default=str),
        "scalars": json.dumps(scalars, sort_keys=True),
        "meta": json.dumps(head.meta_.to_dict(), sort_keys=True),
    }
    return write_safetensors(path, arrays, header)


def head_schema_version(meta: StatsMeta) -> int:
    """Schema version of a head file for a head fitted on statistics with metadata ``meta``.

    :data:`HEAD_SCHEMA_VERSION`, or :data:`~ghofl.stats.meta.HOLDOUT_SCHEMA_VERSION` when the
    metadata records a held-out fraction (older ghofl could not read it).
    """
    return max(HEAD_SCHEMA_VERSION, meta.written_version())


def _check_head_version(header: dict[str, str], meta: StatsMeta,
                        path: str | os.PathLike[str]) -> None:
    """Refuse head schema versions this ghofl cannot read.

    Versions newer than :data:`HEAD_MAX_SCHEMA_VERSION` (the shared header check bounds them by
    the statistics schema, which may move on without the head format), and a version-2 head
    whose metadata records a held-out fraction (version 3 introduced it). Versions below 1 are
    refused by the shared header check.
    """
    version = int(header["schema_version"])  # an integer: the shared header check ran first
    if version > HEAD_MAX_SCHEMA_VERSION:
        raise StatsFormatError(
            f"{str(path)!r} uses head schema version {version}, newer than this ghofl "
            f"supports ({HEAD_MAX_SCHEMA_VERSION}); upgrade ghofl"
        )
    if meta.has_holdout and version < HOLDOUT_SCHEMA_VERSION:
        raise StatsFormatError(
            f"{str(path)!r} has head schema version {version} but its metadata records a "
            f"held-out fraction, which version {HOLDOUT_SCHEMA_VERSION} introduced; the file "
            "is corrupt, re-create it with ghofl fit"
        )


def load_head(path: str | os.PathLike[str]) -> Head:
    """Load a head written by :func:`save_head`, validating everything it holds.

    Head files of schema versions 1 to :data:`HEAD_MAX_SCHEMA_VERSION` are read.

    Raises
    ------
    StatsFormatError
        The file is missing, not a regular file, corrupt (digest mismatch, malformed header,
        arrays of the wrong dtype, shape or with NaN/inf), names an unknown head, or has a
        schema version this ghofl does not read (newer than :data:`HEAD_MAX_SCHEMA_VERSION`,
        or below 1).
    """
    state: dict[str, Any] = {}

    def check(header: dict[str, str], table: dict[str, TensorInfo]) -> None:
        meta = header_meta(header, path)
        _check_head_version(header, meta, path)
        state["meta"] = meta
        # Before reading any data: a head holds at most about (C + 4)·(d + 4)² float64
        # values (QDA: C·d² precision factors; the trained heads: d·k_f + C·k_f + ...).
        limit = 8 * (meta.num_classes + 4) * (meta.dim + 4) ** 2
        declared = sum(t.end - t.begin for t in table.values())
        if declared > limit:
            raise StatsFormatError(
                f"{str(path)!r} declares {declared} bytes of head arrays, more than the "
                f"{limit} a head for C={meta.num_classes} classes and d={meta.dim} can hold; "
                "the file is corrupt"
            )

    header, arrays = read_safetensors(path, HEAD_FORMAT, "head", check, HEAD_KEYS)
    where = f"{str(path)!r} holds a corrupt head"
    name = header.get("head")
    if name not in _REGISTRY:
        raise StatsFormatError(
            f"{where}: its head name {str(name)[:60]!r} is not a registered head "
            f"({', '.join(available_heads())}); re-create it with ghofl fit"
        )
    params = _header_object(header, "params", path)
    scalars = _header_object(header, "scalars", path)
    try:
        head = make_head(name, **params)
        head._validate_params()
        return head.set_state(state["meta"], arrays, scalars)
    except (ConfigError, InputError) as exc:
        raise StatsFormatError(f"{where}: {exc}") from exc
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        if isinstance(exc, GhoflError):
            raise
        raise StatsFormatError(
            f"{where}: its parameters or fitted values are malformed ({exc!r:.200}); "
            "re-create it with ghofl fit"
        ) from exc


def _header_object(header: dict[str, str], key: str, path: str | os.PathLike[str]) -> Any:
    raw = header.get(key)
    if raw is None:
        raise StatsFormatError(
            f"{str(path)!r} has a missing or corrupt head header (no {key!r} entry); "
            "re-create it with ghofl fit"
        )
    value = parse_json(raw, f"the {key} header of {str(path)!r}", "re-create it with ghofl fit")
    if not isinstance(value, dict):
        raise StatsFormatError(
            f"{str(path)!r} has a corrupt head header: {key} is a JSON "
            f"{type(value).__name__}, expected an object; re-create it with ghofl fit"
        )
    return value
