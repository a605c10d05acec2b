"""Where ghofl keeps cached files, and the file-name-safe key of a data subset.

Shared by the dataset readers (:mod:`ghofl.data`) and the embedding cache
(:mod:`ghofl.client.cache`, which re-exports these names).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["CACHE_DIR_ENV", "default_cache_dir", "safe_name", "subset_key"]

CACHE_DIR_ENV = "GHOFL_CACHE_DIR"


def default_cache_dir() -> Path:
    """``GHOFL_CACHE_DIR`` when set, else ``~/.cache/ghofl``."""
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ghofl"


def subset_key(indices: NDArray[np.integer[Any]] | Sequence[int] | str | None) -> str:
    """Subset part of the cache key.

    ``"all"`` for ``None``, a string as is (made file-name safe), else ``sub-`` + 16 hex of the
    SHA-256 of the indices as int64.
    """
    if indices is None:
        return "all"
    if isinstance(indices, str):
        return safe_name(indices)
    idx = np.ascontiguousarray(np.asarray(indices, dtype=np.int64))
    return "sub-" + hashlib.sha256(idx.tobytes()).hexdigest()[:16]


def safe_name(part: str) -> str:
    """``part`` made file-name safe.

    Unsafe runs become ``_``, plus 8 hex of its SHA-256 when changed.
    """
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", part).strip(".") or "_"
    if clean != part:
        clean += "-" + hashlib.sha256(part.encode()).hexdigest()[:8]
    return clean
