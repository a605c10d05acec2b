"""The statistics commands: ``ghofl client-stats``, ``ghofl aggregate`` and ``ghofl stats show``.

``client-stats`` runs on a client, ``aggregate`` on the server, and ``stats show`` describes a
statistics file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ghofl.cli._options import (
    AggregationOptions,
    FeatureTransformOption,
    ServerOptions,
    UploadOptions,
    aggregation_options,
    check_feature_transform_option,
    field_option,
    server_options,
    upload_options,
)
from ghofl.cli.app import app
from ghofl.cli.embed import (
    DATA_HELP,
    ENCODER_HELP,
    DataBackendOption,
    DataBatchSizeOption,
    DataFormatOption,
    DataLabelColumnOption,
    DataSplitOption,
    DataTextColumnsOption,
    TextReading,
    local_embeddings,
    parse_class_option,
    summary,
)
from ghofl.cli.io import (
    check_mode,
    check_output_file,
    load_embeddings,
    resolve_classes,
)
from ghofl.client.job import client_statistics
from ghofl.data.embeddings import Embeddings
from ghofl.errors import ConfigError, StatsValidationError
from ghofl.server.fields import FIELDS
from ghofl.stats.codec import payload_nbytes, save_stats
from ghofl.stats.meta import EncoderInfo

stats_app = typer.Typer(
    name="stats",
    help="Inspect statistics files (.ghs, written by 'ghofl client-stats' or 'ghofl aggregate').",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(stats_app, name="stats")


@app.command("client-stats")
@upload_options(exclude=("client.min_class_count",))
def client_stats(
    out: Annotated[Path, typer.Option("--out", help="Statistics file to write (.ghs).")],
    embeddings: Annotated[Path | None, typer.Option(
        "--embeddings", help="NPZ with x (n, d) floats, y (n,) ints, optionally classes (C,) "
        "(e.g. from ghofl embed).")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", help="Instead of --embeddings: raw data, embedded with --encoder. "
        + DATA_HELP)] = None,
    encoder: Annotated[str | None, field_option("client.encoder", help="With --data: "
                                                 + ENCODER_HELP)] = None,
    split: DataSplitOption = None,
    resolution: Annotated[int, field_option(
        "client.resolution", help="With --data: input resolution of image encoders.")]
        = FIELDS["client.resolution"].default,
    backend: DataBackendOption = FIELDS["client.backend"].default,
    batch_size: DataBatchSizeOption = 64,
    progress: Annotated[bool, typer.Option(
        "--progress", help="With --data: show a progress bar.")] = False,
    fmt: DataFormatOption = "auto",
    label_column: DataLabelColumnOption = None,
    text_columns: DataTextColumnsOption = None,
    classes: Annotated[str | None, field_option(
        "client.classes", help="Comma-separated class names, shared by every client.")] = None,
    num_classes: Annotated[int | None, typer.Option(
        "--num-classes", help="Number of classes C, shared by every client.")] = None,
    encoder_name: Annotated[str | None, field_option(
        "client.encoder_name", help="Encoder name stored in the payload; clients must agree.")]
        = None,
    *,
    upload: UploadOptions,
) -> None:
    """Compute one client's statistics from its labelled embeddings or its raw data.

    With --data and --encoder the raw data is embedded as `ghofl embed` does (same payload).

    The class list comes from --classes, else the archive's (or the data's) `classes`, else
    --num-classes, else max(y)+1. Every client must use the same class list, so pass --classes
    or --num-classes: a client may lack the highest classes, and max(y)+1 would then disagree.
    The payload records the encoder's fingerprint stored by `ghofl embed` (or --encoder's),
    unless --encoder-name names one.
    """
    m = check_mode(upload["mode"])
    upload.check(skip=("projection_basis",))
    dim, seed = upload["projection_dim"], upload["projection_seed"]
    if seed is not None and dim is None:
        raise ConfigError("--projection-seed needs --projection-dim; give both or neither")
    check_output_file(out, "--out")
    emb, info = _client_embeddings(
        embeddings, data, encoder, encoder_name, classes, split=split, resolution=resolution,
        backend=backend, batch_size=batch_size, progress=progress,
        reading=TextReading(fmt, label_column, text_columns))
    names = resolve_classes(classes, num_classes, [emb])
    basis = projection_basis_option(upload["projection_basis"], dim, seed, info,
                                    upload["feature_transform"])
    job = upload.job(names, mode=m, projection_basis=basis, encoder_name=encoder_name or None)
    stats = client_statistics(
        emb, job, encoder_info=info,
        range_hint="pass --num-classes or --classes with every class of the federation",
    )
    size = save_stats(stats, out, job.transport_dtype)
    clip = job.clip_norm
    clipped = "" if clip is None else f", {stats.n_clipped} samples clipped to norm {clip:g}"
    held = "" if stats.holdout is None else (
        f", {stats.holdout.n_samples} held out (fraction {job.holdout_fraction:g})")
    typer.echo(
        f"wrote {out}: n={stats.n_samples} samples, {stats.num_classes} classes, mode {m}, "
        f"dim {stats.dim}, {payload_nbytes(stats, job.transport_dtype)} bytes of statistics "
        f"({size} on disk){clipped}{held}"
    )


def projection_basis_option(
    basis: str | None, dim: int | None, seed: int | None, info: EncoderInfo | None,
    feature_transform: str = "none",
) -> str:
    """The basis fingerprint of ``--projection-basis`` ("" for a random projection).

    The default basis is the one recorded for the encoder followed by ``feature_transform``.
    """
    if basis is None:
        return ""
    if dim is None:
        raise ConfigError("--projection-basis needs --projection-dim (the number K of "
                          "principal directions kept); give both")
    if seed is not None:
        raise ConfigError("--projection-seed applies to the random projection only; drop it "
                          "when --projection-basis is given")
    if basis != "default":
        return basis
    from ghofl.stats.projection import default_basis

    if info is None:
        raise ConfigError("--projection-basis default needs the encoder's fingerprint, and "
                          "these embeddings carry none; pass the basis fingerprint instead")
    from ghofl.client.transforms import transformed_info

    return default_basis(transformed_info(info, feature_transform).fingerprint())


@stats_app.command("show")
def show(
    path: Annotated[Path, typer.Argument(help="Statistics file (.ghs).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Describe a statistics file.

    Shows mode, dimension, classes and counts, clipping, held-out section (fraction and
    counts) and transport dtype.
    """
    from ghofl.cli.io import table
    from ghofl.stats.codec import read_stats_file, rounding_name

    try:
        stats, transport = read_stats_file(path)
    except StatsValidationError as exc:
        raise StatsValidationError(f"'{path}' holds invalid statistics: {exc}") from exc
    held = stats.holdout
    info: dict[str, Any] = {
        "path": str(path),
        "mode": stats.mode,
        "dim": stats.dim,
        "classes": list(stats.meta.classes),
        "counts": [int(v) for v in stats.counts],
        "n_samples": stats.n_samples,
        "n_clipped": stats.n_clipped,
        "clip_norm": stats.meta.clip_norm,
        "encoder": None if stats.meta.encoder is None else stats.meta.encoder.name,
        "projection_dim": None if stats.meta.projection is None else stats.meta.projection.dim,
        "holdout_fraction": stats.holdout_fraction,
        "holdout_counts": None if held is None else [int(v) for v in held.counts],
        "holdout_n_samples": None if held is None else held.n_samples,
        "transport_dtype": transport,
        "rounded_to": rounding_name(stats.rounding),
        "payload_bytes": payload_nbytes(stats, transport),
    }
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    counts = held.counts if held is not None else None
    rows = [(name, int(n)) + (() if counts is None else (int(counts[i]),))
            for i, (name, n) in enumerate(zip(stats.meta.classes, stats.counts, strict=True))]
    header = ("class", "n") + (() if counts is None else ("held out",))
    typer.echo(table(header, rows))
    clip = "none" if stats.meta.clip_norm is None else f"R={stats.meta.clip_norm:g}"
    held_text = "none" if held is None else (
        f"fraction {stats.holdout_fraction:g}, {held.n_samples} samples")
    if info["rounded_to"] != transport:
        transport = f"{transport} (sums rounded to {info['rounded_to']} before)"
    typer.echo(
        f"{path}: mode {stats.mode}, dim {stats.dim}, {stats.num_classes} classes, "
        f"n={stats.n_samples} samples; clipping {clip} ({stats.n_clipped} clipped); held-out "
        f"section {held_text}; transport {transport}, {info['payload_bytes']} bytes of "
        "statistics"
    )


def _client_embeddings(
    embeddings: Path | None, data: Path | None, encoder: str | None, encoder_name: str | None,
    classes: str | None, *, split: str | None, resolution: int, backend: str,
    batch_size: int, progress: bool, reading: TextReading,
) -> tuple[Embeddings, EncoderInfo | None]:
    """The client's labelled embeddings and the encoder fingerprint to record.

    The embeddings are read, or embedded from --data; the fingerprint is ``None`` with
    --encoder-name, or when there is none.
    """
    from ghofl.client.local_data import read_npz_encoder_info

    if (embeddings is None) == (data is None):
        raise ConfigError(
            "give exactly one of --embeddings (an .npz of embeddings) and --data (raw files, "
            "embedded with --encoder NAME)"
        )
    if data is None:
        assert embeddings is not None
        if encoder is not None:
            raise ConfigError("--encoder embeds raw data given with --data; with --embeddings "
                              "use --encoder-name to name the encoder that produced them")
        emb = load_embeddings(embeddings, "--embeddings")
        return emb, None if encoder_name else read_npz_encoder_info(embeddings)
    if encoder is None:
        raise ConfigError("--data needs --encoder NAME (e.g. efficientnet-lite0 or minilm) to "
                          "embed the raw data")
    if encoder_name is not None:
        raise ConfigError("--encoder-name names the encoder of --embeddings; with --data the "
                          "payload records the fingerprint of --encoder, so drop --encoder-name")
    spec = reading.spec(data)
    local = local_embeddings(spec, encoder, split=split, classes=parse_class_option(classes),
                             resolution=resolution, backend=backend, batch_size=batch_size,
                             progress=progress)
    typer.echo(f"embedded {data}: {summary(local)}", err=True)
    return Embeddings(data, local.x, local.y, local.classes), local.info


@app.command("aggregate")
@aggregation_options(only=("aggregation.dp_epsilon", "aggregation.dp_delta",
                           "aggregation.dp_split", "aggregation.dp_expected_samples",
                           "aggregation.dp_subspace", "aggregation.dp_prior",
                           "aggregation.estimate"))
@server_options()
def aggregate(
    files: Annotated[list[Path], typer.Argument(help="Client statistics files (.ghs).")],
    out: Annotated[Path | None, typer.Option(
        "--out", help="Aggregate statistics file to write (required without --store).")] = None,
    store: Annotated[Path | None, field_option(
        "aggregation.store", help="Aggregation store (SQLite file, created if absent) "
        "recording each payload and an exact running total; re-submitting a payload is "
        "idempotent.")] = None,
    client_id: Annotated[str | None, typer.Option(
        "--client-id", help="Client id of the payload in the store (default: the file name "
        "without extension); only with --store and one payload.")] = None,
    model: Annotated[Path | None, typer.Option(
        "--model", help="Model directory to write: the heads (--heads, --param, ...) fitted "
        "from FedCOF's estimate (with --estimate fedcof, which needs it).")] = None,
    min_class_count: Annotated[int | None, field_option(
        "client.min_class_count", help="Differential privacy: the server releases a class whose "
        "noised count is below K as a placeholder (free of privacy cost). Default: 5 with "
        "DP.")] = None,
    *,
    aggregation: AggregationOptions,
    server: ServerOptions,
) -> None:
    """Sum client statistics files into one total, reading one file at a time.

    Memory use does not depend on the number of files. All files must share the encoder,
    projection, class list and mode. With --store the payloads are recorded in a durable store
    (one transaction each) and --out, if given, receives the store's total. With --estimate
    fedcof the server also keeps each file's class counts and sums, builds FedCOF's estimate of
    the class covariances from them and fits the heads from it into --model. With
    --dp-epsilon the server releases the total under central differential privacy (Gaussian
    noise calibrated to the files' common clipping bound, from OS entropy unless --seed is
    given): --out receives the noised total, never the exact one, and <stem>.privacy.json
    beside it the privacy report (spent epsilon and delta, sigma per block).
    """
    from ghofl.cli._aggregate import FedCOFFit, aggregate_files, check_aggregate_inputs
    from ghofl.cli._aggregate_dp import CentralRelease

    for target, option in ((out, "--out"), (store, FIELDS["aggregation.store"].flag)):
        if target is not None:
            check_output_file(target, option)
    fedcof = FedCOFFit.of(aggregation, server, model, store)
    dp = CentralRelease.of(aggregation, server, min_class_count, store)
    digests = check_aggregate_inputs(files, out, store, client_id, model=model)
    if dp is not None and out is not None:
        dp.check_files(files, out)
    aggregate_files(files, digests, out=out, store=store, client_id=client_id, fedcof=fedcof,
                    dp=dp)


@app.command("projection-basis")
def projection_basis_cmd(
    embeddings: Annotated[Path, typer.Option(
        "--embeddings", help="Embeddings of a PUBLIC dataset (.npz from ghofl embed, key x), "
        "never the federation's data.")],
    k: Annotated[int, typer.Option("--k", help="Number of principal directions kept.")] = 512,
    out_dir: Annotated[Path | None, typer.Option(
        "--out-dir", help="Folder of basis files (default: $GHOFL_PROJECTION_DIR, else "
        "~/.cache/ghofl/projections).")] = None,
    default: Annotated[bool, typer.Option(
        "--default/--no-default", help="Record the basis as the default of the encoder "
        "stored in the embeddings (used by --projection-basis default).")] = True,
    feature_transform: FeatureTransformOption = "none",
) -> None:
    """Build a public principal-direction projection basis from public embeddings.

    Writes <fingerprint>.npy (float32, d x K); every client of a federation must hold the same
    file (ship it with the encoder): its fingerprint is recorded in every payload, and
    payloads made with different bases are refused when added.
    """
    from ghofl.client.local_data import read_npz_encoder_info
    from ghofl.client.transforms import apply_feature_transform, transformed_info
    from ghofl.stats.projection import pca_basis, save_basis

    check_feature_transform_option(feature_transform)
    emb = load_embeddings(embeddings)
    info = read_npz_encoder_info(embeddings)
    if default and info is None:
        raise ConfigError(f"{str(embeddings)!r} records no encoder, so the basis cannot be "
                          "its default; embed with ghofl embed, or pass --no-default")
    if info is not None:
        info = transformed_info(info, feature_transform)
    basis = pca_basis(apply_feature_transform(emb.x, feature_transform), k)
    path, fp = save_basis(basis, out_dir, default_for=info.fingerprint() if default and info
                          else None, source=f"{embeddings.name}: {emb.x.shape[0]} samples")
    typer.echo(f"wrote {path}: {basis.shape[0]} x {basis.shape[1]} principal directions, "
               f"fingerprint {fp}" + (f", default for encoder {info.name}" if default and info
                                      else ""))


@app.command("covariance-prior")
def covariance_prior_cmd(
    embeddings: Annotated[Path, typer.Option(
        "--embeddings", help="Labelled embeddings of a PUBLIC dataset (.npz from ghofl embed, "
        "keys x and y), never the federation's data; its classes need not be the "
        "federation's.")],
    clip: Annotated[float, typer.Option(
        "--clip", help="Clip each row to this L2 norm first, as the federation's clients do; "
        "0: the encoder's bound for DP (its median public norm, dp_clip_norm; the prior is "
        "used only under DP) when it has one, else its default bound, else no clipping.")] = 0.0,
    out_dir: Annotated[Path | None, typer.Option(
        "--out-dir", help="Folder of public files (default: $GHOFL_PROJECTION_DIR, else "
        "~/.cache/ghofl/projections).")] = None,
    default: Annotated[bool, typer.Option(
        "--default/--no-default", help="Record the covariance as the default of the encoder "
        "stored in the embeddings (used by --dp-prior auto).")] = True,
) -> None:
    """Build a public within-class covariance, the prior of a DP release's pooled covariance.

    Writes <fingerprint>.cov.npy (float32, d x d). Only the server reads it: under
    differential privacy it mixes the denoised pooled covariance of a pooled or gram release
    with it (--dp-prior, post-processing: no budget).
    """
    import numpy as np

    from ghofl.client.encoders import recommended_clip_norm
    from ghofl.client.local_data import read_npz_encoder_info
    from ghofl.privacy.prior import save_prior, within_covariance

    if clip < 0.0:
        raise ConfigError(f"--clip must be positive, or 0 for the encoder's bound; got {clip}")
    emb = load_embeddings(embeddings)
    info = read_npz_encoder_info(embeddings)
    if default and info is None:
        raise ConfigError(f"{str(embeddings)!r} records no encoder, so the covariance cannot be "
                          "its default; embed with ghofl embed, or pass --no-default")
    found = None if clip > 0.0 or info is None else recommended_clip_norm(info, dp=True)
    bound = clip if clip > 0.0 else (found[0] if found is not None else None)
    cov = within_covariance(emb.x, emb.y, bound)
    classes = int(np.unique(emb.y).size)
    path, fp = save_prior(cov, out_dir, default_for=info.fingerprint() if default and info
                          else None, source=f"{embeddings.name}: {emb.x.shape[0]} samples of "
                          f"{classes} classes, clipped at {bound}")
    typer.echo(f"wrote {path}: {cov.shape[0]} x {cov.shape[1]} within-class covariance of "
               f"{emb.x.shape[0]} samples ({classes} classes"
               + (f", rows clipped at {bound:g}" if bound else ", no clipping")
               + f"), fingerprint {fp}"
               + (f", default for encoder {info.name}" if default and info else ""))


@app.command("feature-map")
def feature_map_cmd(
    embeddings: Annotated[Path, typer.Option(
        "--embeddings", help="Embeddings of a PUBLIC dataset (.npz from ghofl embed, key x), "
        "never the federation's data.")],
    anchors: Annotated[int, typer.Option(
        "--anchors", help="Number K of public anchors (the kernel block's dimension).")] = 2048,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the anchor draw.")] = 0,
    out_dir: Annotated[Path | None, typer.Option(
        "--out-dir", help="Folder of map files (default: $GHOFL_PROJECTION_DIR, else "
        "~/.cache/ghofl/projections).")] = None,
) -> None:
    """Build a public Gaussian-kernel feature map from public embeddings.

    Writes <fingerprint>.rbf.npz (K anchors, bandwidth by the median heuristic, block scale);
    every client of a federation must hold the same file (ship it with the encoder) and pass
    --feature-transform x+sqrt+rbf:<fingerprint>; the fingerprint is part of every payload's
    encoder identity, so payloads made with different maps are refused when added.
    """
    from ghofl.client.kernel_map import build_kernel_map, save_kernel_map

    emb = load_embeddings(embeddings)
    if emb.x.ndim != 2:
        raise ConfigError(f"{str(embeddings)!r} holds embeddings of shape {emb.x.shape}; a "
                          "feature map needs a 2-D array (n, d)")
    m = build_kernel_map(emb.x, anchors, seed,
                         source=f"{embeddings.name}: {emb.x.shape[0]} samples, seed {seed}")
    path, fp = save_kernel_map(m, out_dir)
    typer.echo(f"wrote {path}: {m.n_anchors} anchors in {m.input_dim} dimensions, gamma "
               f"{m.gamma:.4g}, scale {m.scale:.4g}, fingerprint {fp}; clients use "
               f"--feature-transform x+sqrt+rbf:{fp}")
