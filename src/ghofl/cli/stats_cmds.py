"""``ghofl client-stats`` (on a client) and ``ghofl aggregate`` (on the server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from ghofl.cli.app import app
from ghofl.cli.io import (
    check_mode,
    check_output_file,
    load_embeddings,
    read_stats,
    resolve_classes,
)
from ghofl.client.job import ClientJob, client_statistics
from ghofl.errors import ConfigError, IncompatibleStatsError
from ghofl.stats.client_stats import ClientStats, sum_stats
from ghofl.stats.codec import payload_nbytes, save_stats


@app.command("client-stats")
def client_stats(
    embeddings: Annotated[Path, typer.Option(
        "--embeddings", help="NPZ with x (n, d) floats, y (n,) ints, optionally classes (C,).")],
    out: Annotated[Path, typer.Option("--out", help="Statistics file to write (.ghs).")],
    mode: Annotated[str, typer.Option(
        "--mode", help="Upload mode: full (every head), pooled (no QDA) or diag (NB only).")]
        = "full",
    projection_dim: Annotated[int | None, typer.Option(
        "--projection-dim", help="Project embeddings to this dimension with a public "
        "random projection (every client must use the same dim and seed).")] = None,
    projection_seed: Annotated[int | None, typer.Option(
        "--projection-seed", help="Public seed of the projection (default 0).")] = None,
    classes: Annotated[str | None, typer.Option(
        "--classes", help="Comma-separated class names, shared by every client.")] = None,
    num_classes: Annotated[int | None, typer.Option(
        "--num-classes", help="Number of classes C, shared by every client.")] = None,
    encoder_name: Annotated[str | None, typer.Option(
        "--encoder-name", help="Encoder name stored in the payload; clients must agree.")]
        = None,
    clip: Annotated[float | None, typer.Option(
        "--clip", help="Per-sample L2 clipping bound R (embeddings scaled to norm <= R); "
        "every client must use the same R.")] = None,
) -> None:
    """Compute one client's statistics from its labelled embeddings.

    The class list comes from --classes, else the archive's `classes`, else --num-classes,
    else max(y)+1. Every client must use the same class list, so pass --classes or
    --num-classes: a client may lack the highest classes, and max(y)+1 would then disagree.
    """
    m = check_mode(mode)
    if projection_seed is not None and projection_dim is None:
        raise ConfigError("--projection-seed needs --projection-dim; give both or neither")
    check_output_file(out, "--out")
    emb = load_embeddings(embeddings, "--embeddings")
    names = resolve_classes(classes, num_classes, [emb])
    job = ClientJob(names, m, projection_dim=projection_dim,
                    projection_seed=projection_seed or 0, clip_norm=clip,
                    encoder_name=encoder_name or None)
    stats = client_statistics(
        emb, job,
        range_hint="pass --num-classes or --classes with every class of the federation",
    )
    size = save_stats(stats, out)
    clipped = "" if clip is None else f", {stats.n_clipped} samples clipped to norm {clip:g}"
    typer.echo(
        f"wrote {out}: n={stats.n_samples} samples, {stats.num_classes} classes, mode {m}, "
        f"dim {stats.dim}, {payload_nbytes(stats)} bytes of statistics ({size} on disk)"
        f"{clipped}"
    )


@app.command("aggregate")
def aggregate(
    files: Annotated[list[Path], typer.Argument(help="Client statistics files (.ghs).")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Aggregate statistics file to write (required without --store).")] = None,
    store: Annotated[Path | None, typer.Option(
        "--store", help="Aggregation store (SQLite file, created if absent) recording each "
        "payload and an exact running total; re-submitting a payload is idempotent.")] = None,
    client_id: Annotated[str | None, typer.Option(
        "--client-id", help="Client id of the payload in the store (default: the file name "
        "without extension); only with --store and one payload.")] = None,
) -> None:
    """Sum client statistics files into one total, reading one file at a time.

    Memory use does not depend on the number of files. All files must share the encoder,
    projection, class list and mode. With --store the payloads are recorded in a durable store
    (one transaction each) and --out, if given, receives the store's total.
    """
    from ghofl.cli._aggregate import check_aggregate_inputs, record_in_store

    for target, option in ((out, "--out"), (store, "--store")):
        if target is not None:
            check_output_file(target, option)
    digests = check_aggregate_inputs(files, out, store, client_id)
    if store is not None:
        stored_total = record_in_store(store, files, digests, client_id)
        if out is not None:
            size = save_stats(stored_total, out)
            typer.echo(f"wrote the store's total to {out} ({size} bytes)")
        return
    assert out is not None  # check_aggregate_inputs requires --out without --store
    current: list[Path] = []

    def payloads() -> Iterator[ClientStats]:
        for path in files:
            current[:] = [path]
            yield read_stats(path)

    try:
        total = sum_stats(payloads())
    except IncompatibleStatsError as exc:
        reason = exc.__cause__ if exc.__cause__ is not None else exc
        raise IncompatibleStatsError(
            f"cannot add '{current[0]}' to the total of the files before it: {reason}"
        ) from exc
    size = save_stats(total, out)
    typer.echo(
        f"aggregated {len(files)} files into {out}: n={total.n_samples} samples, "
        f"{total.num_classes} classes, mode {total.mode}, dim {total.dim} ({size} bytes)"
    )
