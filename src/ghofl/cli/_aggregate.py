"""Helpers of ``ghofl aggregate``: input checks and recording payloads in a store."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import typer

from ghofl.cli.io import read_stats
from ghofl.errors import (
    ConfigError,
    IncompatibleStatsError,
    InputError,
    StatsFormatError,
    StoreConflictError,
)
from ghofl.stats.client_stats import ClientStats
from ghofl.store import AggregationStore

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """SHA-256 of the bytes of ``path`` (hex), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def check_aggregate_inputs(
    files: Sequence[Path], out: Path | None, store: Path | None, client_id: str | None
) -> list[str]:
    """Refuse inputs that would lose or double-count data; return every payload's SHA-256.

    Option combinations are checked as well as the payloads.

    Raises
    ------
    ConfigError
        ``--out`` missing without ``--store``, ``--client-id`` without ``--store`` or with
        several payloads.
    StatsFormatError
        A payload is missing or a directory.
    InputError
        A payload is passed twice (same file or same bytes), or ``--out`` would
        overwrite a payload or the store.
    """
    if store is None and out is None:
        raise ConfigError("aggregate needs --out FILE (the total to write) or --store DB")
    if client_id is not None and store is None:
        raise ConfigError("--client-id names a payload in a store; use it with --store DB")
    if client_id is not None and len(files) != 1:
        raise ConfigError(
            f"--client-id names one payload but {len(files)} were given; pass one payload per "
            "'ghofl aggregate --client-id' call, or omit --client-id to use the file names"
        )
    for path in files:  # the messages of ghofl.stats.load_stats, before anything is written
        if path.is_dir():
            raise StatsFormatError(f"statistics path '{path}' is a directory; give a file")
        if not path.exists():
            raise StatsFormatError(f"statistics file '{path}' does not exist; check the path")
        if not stat.S_ISREG(path.stat().st_mode):  # a FIFO would block the digest forever
            raise StatsFormatError(
                f"statistics path '{path}' is not a regular file (a FIFO, device or socket); "
                "give a file written by ghofl"
            )
    for target, option in ((out, "--out"), (store, "--store")):
        if target is None or not target.exists():
            continue
        hit = next((p for p in files if _same_file(p, target)), None)
        if hit is not None:
            raise InputError(
                f"{option} '{target}' is the payload '{hit}': writing it would overwrite an "
                f"input; choose another {option} path"
            )
    if out is not None and store is not None and out.exists() and _same_file(out, store):
        raise InputError(f"--out '{out}' is the store '{store}'; choose another --out path")
    digests: list[str] = []
    for i, path in enumerate(files):
        twin = next((files[j] for j in range(i) if _same_file(files[j], path)), None)
        if twin is not None:
            raise InputError(
                f"payload '{path}' is given twice (also as '{twin}'); it would be counted "
                "twice; pass each payload once"
            )
        sha = file_sha256(path)
        if sha in digests:
            twin = files[digests.index(sha)]
            raise InputError(
                f"payloads '{twin}' and '{path}' hold the same bytes (SHA-256 {sha[:12]}…); the "
                "same statistics would be counted twice; pass each payload once"
            )
        digests.append(sha)
    return digests


def record_in_store(
    db: Path, files: Sequence[Path], digests: Sequence[str], client_id: str | None
) -> ClientStats:
    """Record each payload in the store ``db``; return the store's total.

    One transaction per payload; prints one line per payload and a summary.

    Raises
    ------
    StoreConflictError, IncompatibleStatsError
        A payload clashes with the store; the message names the file and how many payloads
        before it were recorded.
    """
    with AggregationStore(db) as store:
        for i, (path, sha) in enumerate(zip(files, digests, strict=True)):
            cid = client_id if client_id is not None else path.stem
            stats = read_stats(path)
            try:
                result = store.add(cid, stats, payload_sha256=sha)
            except (StoreConflictError, IncompatibleStatsError) as exc:
                before = f"; the {i} payload(s) before it were recorded" if i else ""
                raise type(exc)(
                    f"cannot record '{path}' as client {cid!r} in store '{db}': {exc}{before}"
                ) from exc
            if result.added:
                typer.echo(f"added {cid!r} from {path}: n={stats.n_samples} samples, "
                           f"SHA-256 {sha[:12]}…")
            else:
                typer.echo(f"{cid!r} already present with the same payload ({path}, SHA-256 "
                           f"{sha[:12]}…); not counted again")
        total = store.total()
        typer.echo(
            f"store {db}: {len(store)} contributions, n={total.n_samples} samples, "
            f"{total.num_classes} classes, mode {total.mode}, dim {total.dim} "
            f"(exact total: {store.exact_path})"
        )
    return total
