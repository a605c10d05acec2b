"""Versioned on-disk format of :class:`ClientStats` (file extension ``.ghs``).

Format: a `safetensors <https://github.com/huggingface/safetensors>`_ file. We chose it over
``npz`` because its header is plain JSON followed by raw little-endian buffers (no pickle, no
zip), it is readable from Rust/JS/C++ without numpy, it loads lazily tensor by tensor, and its
length-prefixed header makes truncation detectable before any data is trusted.

* header metadata: ``format = "ghofl.stats"``, ``schema_version``, ``meta`` (JSON of
  :class:`StatsMeta`);
* tensors: ``counts`` int64 (C,), ``sums`` float64 (C, d), and by mode ``sq_sums`` (C, d),
  ``class_scatter_triu`` (C, d(d+1)/2) and ``scatter_triu`` (d(d+1)/2,): symmetric matrices
  travel as their upper triangles in row-major order (``numpy.triu_indices``), which halves them.

Writes are atomic: a temporary file in the target folder, then ``os.replace``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import GhoflError, StatsFormatError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import SCHEMA_VERSION, StatsMeta

FORMAT = "ghofl.stats"
MIN_SCHEMA_VERSION = 1


def pack_upper(m: NDArray[np.float64]) -> NDArray[np.float64]:
    """Upper triangle of symmetric matrices: (..., d, d) -> (..., d(d+1)/2), row-major."""
    d = m.shape[-1]
    iu = np.triu_indices(d)
    return np.ascontiguousarray(m[..., iu[0], iu[1]])


def unpack_upper(packed: NDArray[np.float64], d: int) -> NDArray[np.float64]:
    """Inverse of :func:`pack_upper`: (..., d(d+1)/2) -> symmetric (..., d, d)."""
    if packed.shape[-1] != d * (d + 1) // 2:
        raise StatsFormatError(
            f"packed symmetric matrix has {packed.shape[-1]} entries; expected d(d+1)/2 = "
            f"{d * (d + 1) // 2} for d={d}; the file is corrupt"
        )
    out = np.zeros((*packed.shape[:-1], d, d))
    iu = np.triu_indices(d)
    out[..., iu[0], iu[1]] = packed
    out[..., iu[1], iu[0]] = packed
    return out


def stats_tensors(stats: ClientStats) -> dict[str, NDArray[Any]]:
    """The arrays that travel for ``stats`` (symmetric ones packed)."""
    t: dict[str, NDArray[Any]] = {"counts": stats.counts, "sums": stats.sums}
    if stats.sq_sums is not None:
        t["sq_sums"] = stats.sq_sums
    if stats.class_scatter is not None:
        t["class_scatter_triu"] = pack_upper(stats.class_scatter)
    if stats.scatter is not None:
        t["scatter_triu"] = pack_upper(stats.scatter)
    return {k: np.ascontiguousarray(v) for k, v in t.items()}


def stats_from_tensors(meta: StatsMeta, t: dict[str, NDArray[Any]]) -> ClientStats:
    """Rebuild :class:`ClientStats` from :func:`stats_tensors` output (validates)."""
    d = meta.dim
    try:
        return ClientStats(
            meta,
            t["counts"],
            t["sums"],
            sq_sums=t.get("sq_sums"),
            class_scatter=None
            if "class_scatter_triu" not in t
            else unpack_upper(t["class_scatter_triu"], d),
            scatter=None if "scatter_triu" not in t else unpack_upper(t["scatter_triu"], d),
        )
    except KeyError as exc:
        raise StatsFormatError(f"statistics payload lacks the array {exc}; it is corrupt") from exc


def payload_nbytes(stats: ClientStats) -> int:
    """Bytes of array data one client uploads for ``stats`` (excluding the small header)."""
    return int(sum(a.nbytes for a in stats_tensors(stats).values()))


def expected_payload_nbytes(mode: str, num_classes: int, dim: int) -> int:
    """Bytes of array data of a payload of ``mode`` for C classes in dimension d (no allocation).

    full: N + A + C·d(d+1)/2; pooled: N + A + D + d(d+1)/2; diag: N + A + D (8 bytes each).
    """
    c, d, tri = num_classes, dim, dim * (dim + 1) // 2
    words = c + c * d + {"full": c * tri, "pooled": c * d + tri, "diag": c * d}[mode]
    return 8 * words


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` then rename onto ``path``; nothing is left behind on failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; follow the umask like open() does
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_stats(stats: ClientStats, path: str | os.PathLike[str]) -> int:
    """Write ``stats`` to ``path`` atomically; return the file size in bytes."""
    from safetensors.numpy import save_file

    meta = {
        "format": FORMAT,
        "schema_version": str(SCHEMA_VERSION),
        "meta": json.dumps(stats.meta.to_dict(), sort_keys=True),
    }
    tensors = stats_tensors(stats)
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return Path(path).stat().st_size


def read_safetensors(
    path: str | os.PathLike[str], expected_format: str, what: str
) -> tuple[dict[str, str], dict[str, NDArray[Any]]]:
    """Read a ghofl safetensors file, checking its format tag and schema version."""
    from safetensors import SafetensorError, safe_open

    p = Path(path)
    if not p.exists():
        raise StatsFormatError(f"{what} file {str(p)!r} does not exist; check the path")
    if p.is_dir():
        raise StatsFormatError(f"{what} path {str(p)!r} is a directory; give a file")
    try:
        with safe_open(str(p), framework="np") as f:
            header = f.metadata() or {}
            _check_header(header, p, expected_format, what)
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        if isinstance(exc, GhoflError):
            raise
        raise StatsFormatError(
            f"{str(p)!r} is not a readable ghofl {what} file (it is truncated, corrupt or of "
            f"another format: {exc}); re-create it with ghofl"
        ) from exc
    return header, tensors


def _check_header(header: dict[str, str], p: Path, expected: str, what: str) -> None:
    fmt = header.get("format")
    if fmt != expected:
        raise StatsFormatError(
            f"{str(p)!r} is not a ghofl {what} file (format tag {fmt!r}, expected {expected!r})"
        )
    try:
        version = int(header.get("schema_version", "-1"))
    except ValueError:
        version = -1
    if version > SCHEMA_VERSION:
        raise StatsFormatError(
            f"{str(p)!r} uses {what} schema version {version}, newer than this ghofl supports "
            f"({SCHEMA_VERSION}); upgrade ghofl"
        )
    if version < MIN_SCHEMA_VERSION:
        raise StatsFormatError(
            f"{str(p)!r} uses {what} schema version {version}, older than this ghofl supports "
            f"({MIN_SCHEMA_VERSION}); re-create it with the current ghofl"
        )


def load_stats(path: str | os.PathLike[str]) -> ClientStats:
    """Read and validate statistics written by :func:`save_stats`."""
    header, tensors = read_safetensors(path, FORMAT, "statistics")
    try:
        meta_dict = json.loads(header["meta"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise StatsFormatError(f"{str(path)!r} has a missing or corrupt metadata header") from exc
    return stats_from_tensors(StatsMeta.from_dict(meta_dict), tensors)
