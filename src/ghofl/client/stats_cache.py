"""A client-side cache of computed statistics, keyed by the data's digest and the job.

A Flower deployment starts a fresh ClientApp process for every message, so a client that takes
part in a second round (or a second run: the plain protocol after the secure one, a rerun after
an abort) over the same data would compute its statistics again. :func:`cached_statistics`
computes them once per (data file, job) and reads them back afterwards:

* the key is SHA-256 over the data file's bytes, the job's fields (every field of
  :class:`~ghofl.client.job.ClientJob`, as sorted JSON) and ghofl's version, so a changed
  file, another job (classes, mode, clipping bound, held-out split, transform, projection, ...)
  or another ghofl computes afresh;
* the entry is a statistics file (:func:`ghofl.stats.codec.save_stats`, float64, written
  atomically with a data digest) that :func:`~ghofl.stats.codec.load_stats` validates on
  reading; an unreadable entry is recomputed and overwritten.

Only a file source is cached (an embeddings ``.npz`` or a raw-data archive/text file); a
folder of raw data is always computed (its embeddings have their own cache). The entries hold
the client's own statistics *before* any DP noise or masking, on the client's own disk: they
are as private as the data they come from and must be kept with it (never in a shared folder).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from ghofl._version import __version__
from ghofl.client.job import ClientJob, client_statistics
from ghofl.errors import GhoflError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import load_stats, save_stats

__all__ = ["cache_key", "cached_statistics"]

_CHUNK = 1 << 20


def cache_key(source: str | os.PathLike[str], job: ClientJob) -> str:
    """Hex SHA-256 of the data file's bytes, the job's fields and ghofl's version.

    Parameters
    ----------
    source : path
        A data file.
    job : ClientJob
    """
    h = hashlib.sha256()
    h.update(f"ghofl-stats-cache-v2 {__version__}\n".encode())
    h.update(json.dumps(dataclasses.asdict(job), sort_keys=True).encode())
    h.update(b"\n")
    with open(source, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def cached_statistics(source: str | os.PathLike[str], job: ClientJob,
                      cache_dir: str | os.PathLike[str] | None) -> tuple[ClientStats, bool]:
    """:func:`~ghofl.client.job.client_statistics` of ``source``, through the cache.

    Parameters
    ----------
    source : path
        The client's data (see :func:`~ghofl.client.job.client_statistics`).
    job : ClientJob
    cache_dir : path or None
        The cache folder (created when missing); None computes without a cache.

    Returns
    -------
    stats : ClientStats
    hit : bool
        Whether they were read from the cache.
    """
    path = Path(source)
    if cache_dir is None or not path.is_file():
        return client_statistics(path, job), False
    entry = Path(cache_dir) / f"{cache_key(path, job)}.stats"
    if entry.is_file():
        try:
            return load_stats(entry), True
        except (GhoflError, OSError, ValueError):
            pass  # a damaged entry: compute again and overwrite it
    stats = client_statistics(path, job)
    entry.parent.mkdir(parents=True, exist_ok=True)
    save_stats(stats, entry)
    return stats, False
