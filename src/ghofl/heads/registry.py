"""Head registry by name, and save/load of fitted heads.

Heads are registered as ``"module:Class"`` strings so that listing or creating a closed-form
head never imports torch; trainable heads import it only when fitted.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from ghofl.errors import ConfigError, StatsFormatError
from ghofl.files import atomic_write
from ghofl.heads.base import Head
from ghofl.stats.codec import read_safetensors
from ghofl.stats.meta import SCHEMA_VERSION, StatsMeta

HEAD_FORMAT = "ghofl.head"

_REGISTRY: dict[str, str] = {
    "nb": "ghofl.heads.nb:NBDiagHead",
    "lda": "ghofl.heads.lda:LDAHead",
    "qda": "ghofl.heads.qda:QDAHead",
    "fedcgs": "ghofl.heads.fedcgs:FedCGSHead",
    "fishermix": "ghofl.heads.fishermix:FisherMixHead",
    "protohyper": "ghofl.heads.protohyper:ProtoHyperHead",
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
    """Save a fitted head to a safetensors file atomically; return its size in bytes."""
    from safetensors.numpy import save_file

    arrays, scalars = head.get_state()
    name = head.name or type(head).__name__
    header = {
        "format": HEAD_FORMAT,
        "schema_version": str(SCHEMA_VERSION),
        "head": name,
        "params": json.dumps(head.get_params(), sort_keys=True, default=str),
        "scalars": json.dumps(scalars, sort_keys=True),
        "meta": json.dumps(head.meta_.to_dict(), sort_keys=True),
    }
    atomic_write(path, lambda tmp: save_file(arrays, tmp, metadata=header))
    return Path(path).stat().st_size


def load_head(path: str | os.PathLike[str]) -> Head:
    """Load a head written by :func:`save_head`."""
    header, arrays = read_safetensors(path, HEAD_FORMAT, "head")
    try:
        name = header["head"]
        params = json.loads(header["params"])
        scalars = json.loads(header["scalars"])
        meta = StatsMeta.from_dict(json.loads(header["meta"]))
    except (KeyError, json.JSONDecodeError) as exc:
        raise StatsFormatError(
            f"{str(path)!r} has a missing or corrupt head header ({exc})"
        ) from exc
    head = make_head(name, **params)
    return head.set_state(meta, arrays, scalars)
