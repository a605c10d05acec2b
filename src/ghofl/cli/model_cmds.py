"""``ghofl fit``, ``ghofl evaluate`` and ``ghofl heads``: heads fitted from an aggregate."""

from __future__ import annotations

import inspect
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from ghofl.cli._encoder_file import EncoderFileOption
from ghofl.cli._options import (
    FeatureTransformOption,
    ServerOptions,
    check_feature_transform_option,
    server_options,
)
from ghofl.cli.app import app
from ghofl.cli.embed import (
    DataBackendOption,
    DataBatchSizeOption,
    DataFormatOption,
    DataLabelColumnOption,
    DataSplitOption,
    DataTextColumnsOption,
    data_spec,
)
from ghofl.cli.io import (
    check_output_dir,
    read_total_arg,
    table,
    write_json,
)
from ghofl.cli.predict import AllowUnsignedModelOption, check_embeddings_encoder
from ghofl.client.transforms import transformed_dim
from ghofl.data.by_path import DatasetSpec
from ghofl.data.embeddings import check_labelled_embeddings, load_embeddings
from ghofl.data.items import EmbeddingRows
from ghofl.errors import ConfigError, InputError
from ghofl.heads.build import head_defaults, to_jsonable
from ghofl.heads.registry import available_heads, head_class
from ghofl.model.directory import FittedModel, load_model
from ghofl.server.fields import FIELDS
from ghofl.server.job import ServerJob
from ghofl.server.run import FederationServer


@app.command("fit")
@server_options()
def fit(
    total: Annotated[Path, typer.Argument(
        help="Aggregate statistics file (.ghs) or aggregation store (ghofl aggregate --store).")],
    out: Annotated[Path, typer.Option("--out", help="Model directory to write.")],
    *,
    server: ServerOptions,
) -> None:
    """Fit heads from aggregated statistics; write one HEAD.ghh per head and manifest.json.

    The directory is written atomically: an existing model directory is replaced only after
    every head was fitted and saved.
    """
    job = server.job()  # the preset is merged by the job (ServerJob.resolved_params)
    check_output_dir(out)
    stats, source = read_total_arg(total)  # a store: checked; its head goes in the manifest
    fed = FederationServer.from_total(job, stats.meta)
    result = fed.fit(stats, out_dir=out, extra={"stats": source},
                     log=_stderr if job.progress else None, option="--out",
                     command=_fit_command(total, out, job, server))
    typer.echo(table(["head", "fit_seconds", "file"],
                     [[n, s, str(out / f"{n}.ghh")] for n, s in result.fit_seconds.items()]))


def _fit_command(total: Path, out: Path, job: ServerJob, server: ServerOptions) -> str:
    """The ``ghofl fit`` command line that reproduces this model (for its model card).

    The heads always; every other server option only where it differs from its default.
    """
    args = ["ghofl", "fit", str(total), FIELDS["server.heads"].flag, ",".join(job.heads)]
    for p in server["head_params"] or []:
        args += [FIELDS["server.head_params"].flag, p]
    preset = server["preset"]
    if preset is not None and preset != FIELDS["server.preset"].default:
        args += [FIELDS["server.preset"].flag, preset]
    seed = server["seed"]
    if seed is not None and seed != FIELDS["server.seed"].default:
        args += [FIELDS["server.seed"].flag, str(seed)]
    return shlex.join([*args, "--out", str(out)])


def _stderr(message: str) -> None:
    typer.echo(message, err=True)


@app.command("evaluate")
def evaluate(
    model_dir: Annotated[Path | None, typer.Argument(
        help="Model directory written by `ghofl fit` (not with --report).")] = None,
    embeddings: Annotated[Path | None, typer.Option(
        "--embeddings", help="Test NPZ with x (n, d) and y (n,).")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", help="Instead of --embeddings: labelled raw test data (as client-stats "
        "--data reads it), embedded with the encoder the model records.")] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write the accuracies as JSON here.")] = None,
    feature_transform: FeatureTransformOption = "none",
    split: DataSplitOption = None,
    fmt: DataFormatOption = "auto",
    label_column: DataLabelColumnOption = None,
    text_columns: DataTextColumnsOption = None,
    batch_size: DataBatchSizeOption = 64,
    backend: DataBackendOption = "onnx",
    encoder_file: EncoderFileOption = None,
    allow_unsigned_model: AllowUnsignedModelOption = False,
    local: Annotated[bool, typer.Option(
        "--local", help="Federated evaluation on a client: write only the sums of this "
        "client's scores (confusion counts, log-loss, reliability bins) to --out.")] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", help="With --local: the evaluation file (.ghe) to write.")] = None,
    report: Annotated[Path | None, typer.Option(
        "--report", help="Print the metrics of a total evaluation file (ghofl aggregate-eval) "
        "instead; no model or data.")] = None,
) -> None:
    """Score every head of a model directory on labelled test data.

    The data are embeddings (with --feature-transform: the raw encoder output, transformed as the
    clients did), or raw images or texts (--data), encoded by the model's recorded encoder (refused
    when the local encoder's fingerprint differs) and transformed as the model records.
    """
    if json_out is not None and json_out.is_dir():
        raise InputError(f"--json '{json_out}' is a directory; give a file path")
    if report is not None:  # federated evaluation: the server's report of the clients' sums
        from ghofl.cli.federated_cmds import print_report

        if model_dir is not None or embeddings is not None or data is not None or local:
            raise ConfigError("--report prints a total evaluation file alone; drop the model, "
                              "--embeddings, --data and --local")
        return print_report(report, json_out)
    check_feature_transform_option(feature_transform)
    if (embeddings is None) == (data is None):
        raise ConfigError("give exactly one of --embeddings (an .npz of labelled embeddings) "
                          "and --data (labelled raw images or texts)")
    if model_dir is None:
        raise ConfigError("give the model directory to evaluate (or --report TOTAL.ghe)")
    if out is not None and not local:
        raise ConfigError("--out writes a client's evaluation sums with --local; add --local")
    model = load_model(model_dir, allow_unsigned=allow_unsigned_model)
    transform: str | None = None  # raw data: the model applies the transform it records
    if data is not None:
        if feature_transform != "none":
            raise ConfigError("--feature-transform applies to --embeddings only; raw data gets "
                              "the transform the model records")
        spec = data_spec(data, fmt, label_column, text_columns)
        x, y = _raw_labelled(spec, model, model_dir, split=split, batch_size=batch_size,
                             backend=backend, encoder_file=encoder_file)
        source = data
    else:
        assert embeddings is not None
        if encoder_file is not None:
            raise ConfigError("--encoder-file encodes raw --data; --embeddings need no "
                              "encoder, so drop it")
        x, y = _labelled_embeddings(embeddings, model, model_dir, feature_transform)
        source, transform = embeddings, feature_transform
    if y.size == 0:
        raise InputError(f"'{source}' holds no samples; accuracy needs at least one")
    if local:
        from ghofl.cli.federated_cmds import write_local_evaluation

        return write_local_evaluation(model, x, y, transform=transform, out=out,
                                      source=f"'{source}'")
    scores = model.evaluate(x, y, what=f"'{source}'", transform=transform)
    results = {name: score.to_dict() for name, score in scores.items()}
    if json_out is not None:
        write_json(json_out, {"heads": results, "model_dir": str(model_dir),
                              ("data" if data is not None else "embeddings"): str(source)})
    typer.echo(table(["head", "accuracy", "n"],
                     [[n, r["accuracy"], r["n"]] for n, r in results.items()]))


def _labelled_embeddings(embeddings: Path, model: FittedModel, model_dir: Path,
                         feature_transform: str) -> tuple[Any, Any]:
    """(x (n, d), y (n,)) of an embeddings archive, checked against the model.

    ``x`` as stored: :meth:`FittedModel.evaluate` applies ``feature_transform`` to it.
    """
    classes, want = model.classes, model.head().n_features_in_
    emb = load_embeddings(embeddings, "--embeddings")
    check_embeddings_encoder(EmbeddingRows(embeddings).encoder, embeddings, model, model.head(),
                             model_dir, feature_transform)
    if emb.classes is not None and emb.classes != classes:
        raise InputError(
            f"'{embeddings}' stores the class names {_short(emb.classes)}, which differ from the "
            f"model's {_short(classes)}; evaluate on data labelled with the model's classes"
        )
    raw = emb.x
    dim = transformed_dim(raw.shape[1], feature_transform) if raw.ndim == 2 else want
    if dim != want:
        done = model.transform
        hint = ("embed the test set with the clients' encoder" if done == feature_transform
                else f"the clients applied --feature-transform {done}; pass the same")
        raise InputError(
            f"'{embeddings}' has {dim}-dimensional embeddings"
            + (f" after --feature-transform {feature_transform}" if feature_transform != "none"
               else "")
            + f" but the model in '{model_dir}' expects d={want}; {hint}"
        )
    return check_labelled_embeddings(raw, emb.y, len(classes), f"'{embeddings}'",
                                     range_hint="the model does not know that class")


def _raw_labelled(spec: DatasetSpec, model: FittedModel, model_dir: Path, *,
                  split: str | None, batch_size: int, backend: str,
                  encoder_file: Path | None = None) -> tuple[Any, Any]:
    """Raw labelled data embedded with the model's recorded encoder.

    Returns x (n, d), the encoder's output (the model applies its recorded transform), and
    y (n,), indices into the model's classes.
    """
    from ghofl.client.local_data import embed_local_data
    from ghofl.evaluation.predict import recorded_encoder

    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1; got {batch_size}")
    classes = model.classes
    recorded = model.head().meta_.encoder
    encoder = recorded_encoder(recorded, f"'{model_dir}'", backend, encoder_file, model_dir)
    assert recorded is not None
    is_text = recorded.resolution is None
    local = embed_local_data(spec, encoder, split=split, classes=classes if is_text else None,
                             batch_size=batch_size)
    y = local.y
    if tuple(local.classes) != classes:
        unknown = [c for c in local.classes if c not in classes]
        if unknown:
            raise InputError(
                f"'{spec.path}' holds the class(es) {_short(tuple(unknown))}, which the model "
                f"does not know (its classes: {_short(classes)}); evaluate on data labelled "
                "with the model's classes"
            )
        index = {c: i for i, c in enumerate(classes)}
        y = np.asarray([index[c] for c in local.classes], dtype=np.int64)[local.y]
    x = local.x
    typer.echo(f"embedded {spec.path}: n={y.size} items with {recorded.name}", err=True)
    return check_labelled_embeddings(x, y, len(classes), f"'{spec.path}'",
                                     range_hint="the model does not know that class")


def _short(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:5])
    return f"[{shown}, ... ({len(names)} in all)]" if len(names) > 5 else f"[{shown}]"


@app.command("heads")
def heads_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """List the registered heads with the upload mode they need and their parameters."""
    rows: list[list[Any]] = []
    info: dict[str, Any] = {}
    for name in available_heads():
        try:
            cls = head_class(name)
            defaults = head_defaults(name)
        except Exception as exc:  # list the other heads; say why this one fails
            reason = f"unavailable: {type(exc).__name__}: {' '.join(str(exc).split())}"
            info[name] = {"available": False, "reason": reason}
            rows.append([name, "-", reason])
            continue
        shown = {k: (None if v is inspect.Parameter.empty else to_jsonable(v))
                 for k, v in defaults.items()}
        info[name] = {"available": True, "min_mode": cls.min_mode, "params": shown}
        rows.append([name, cls.min_mode,
                     ", ".join(f"{k}={v!r}" for k, v in shown.items()) or "-"])
    if as_json:
        json.dump(info, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        typer.echo(table(["head", "min_mode", "parameters (defaults)"], rows))
