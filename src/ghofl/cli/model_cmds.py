"""``ghofl fit``, ``ghofl evaluate`` and ``ghofl heads``: heads fitted from an aggregate."""

from __future__ import annotations

import inspect
import json
import re
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
    PRIVACY_REPORT_FLAG,
    check_output_dir,
    read_total_arg,
    release_privacy,
    table,
    write_json,
)
from ghofl.cli.predict import AllowUnsignedModelOption, check_embeddings_encoder
from ghofl.client.transforms import transformed_dim
from ghofl.data.by_path import DatasetSpec
from ghofl.data.embeddings import check_labelled_embeddings, load_embeddings
from ghofl.data.items import EmbeddingRows
from ghofl.errors import ConfigError, InputError
from ghofl.evaluation import evaluate_heads
from ghofl.evaluation.federated import load_evaluation, local_evaluation
from ghofl.heads.base import Head
from ghofl.heads.build import head_defaults, to_jsonable
from ghofl.heads.registry import available_heads, head_class
from ghofl.model.card_update import evaluation_entry, record_evaluation
from ghofl.model.directory import FittedModel, load_model, load_ood
from ghofl.server.default_head import DEFAULT_HEAD_RULE
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
    license_id: Annotated[str | None, typer.Option(
        "--license", help="SPDX licence identifier of the model (e.g. apache-2.0, mit, "
        "cc-by-4.0), recorded in the manifest and the card's front matter [default: unset, "
        "stated as 'other'].")] = None,
    privacy_report: Annotated[Path | None, typer.Option(
        PRIVACY_REPORT_FLAG, help="Privacy report of a differentially private release (ghofl "
        "aggregate --dp-epsilon), when it is not beside the statistics file as "
        "STEM.privacy.json; its spent budget is recorded in the manifest and the card.")]
        = None,
) -> None:
    """Fit heads from aggregated statistics; write one HEAD.ghh per head and manifest.json.

    The directory is written atomically: an existing model directory is replaced only after
    every head was fitted and saved. The default head (used by predict and export without
    --head) is chosen by this rule, recorded in the manifest and the card: {rule}. A
    differentially private release (ghofl aggregate --dp-epsilon) is fitted with its privacy
    report, checked against the file's SHA-256: its budget goes into the manifest and the card.
    """
    job = server.job()  # the preset is merged by the job (ServerJob.resolved_params)
    check_output_dir(out)
    lic = _check_license(license_id)
    stats, source = read_total_arg(total)  # a store: checked; its head goes in the manifest
    privacy, missing = release_privacy(total, stats, privacy_report)
    if missing is not None:
        typer.echo(f"ghofl: warning: '{total}' is a differentially private release but its "
                   f"privacy report '{missing}' was not found: the model records the noise "
                   f"levels, not the budget; give the report with {PRIVACY_REPORT_FLAG} PATH",
                   err=True)
    fed = FederationServer.from_total(job, stats.meta)
    extra: dict[str, Any] = {"stats": source, **({"license": lic} if lic else {}),
                             **({"privacy": privacy} if privacy is not None else {})}
    result = fed.fit(stats, out_dir=out, extra=extra,
                     log=_stderr if job.progress else None, option="--out",
                     command=_fit_command(total, out, job, server, privacy_report))
    typer.echo(table(["head", "fit_seconds", "file"],
                     [[n, s, str(out / f"{n}.ghh")] for n, s in result.fit_seconds.items()]))
    _announce_default(out)


fit.__doc__ = (fit.__doc__ or "").replace("{rule}", DEFAULT_HEAD_RULE)
_SPDX = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")


def _check_license(value: str | None) -> str | None:
    """``--license``: an SPDX identifier or expression (``MIT OR Apache-2.0``), or None."""
    if value is None:
        return None
    words = value.split()
    ok = bool(words) and all(_SPDX.fullmatch(w) for w in words[::2]) and all(
        w in ("AND", "OR", "WITH") for w in words[1::2]) and len(words) % 2 == 1
    if not ok:
        raise ConfigError(f"--license {value!r} is not an SPDX licence identifier; give one "
                          "such as apache-2.0, mit or cc-by-4.0 (https://spdx.org/licenses/)")
    return value


def _announce_default(out: Path) -> None:
    """One stderr line: the default head recorded in the model just written, and why."""
    manifest = load_model(out).manifest
    typer.echo(f"default head: {manifest.get('default_head')} "
               f"({manifest.get('default_head_rule')})", err=True)


def _fit_command(total: Path, out: Path, job: ServerJob, server: ServerOptions,
                 privacy_report: Path | None = None) -> str:
    """The ``ghofl fit`` command line that reproduces this model (for its model card).

    The heads always; every other server option only where it differs from its default;
    ``--privacy-report`` when given.
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
    if privacy_report is not None:
        args += [PRIVACY_REPORT_FLAG, str(privacy_report)]
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
        "instead; no data (a model only with --update-card).")] = None,
    update_card: Annotated[bool, typer.Option(
        "--update-card", help="Record the evaluation (data set, items, accuracy, balanced "
        "accuracy, macro-F1, log-loss, ECE per head) in the model's manifest and "
        "MODEL_CARD.md, re-signed; with --report: the federated evaluation, labelled so.")]
        = False,
    head_name: Annotated[str | None, typer.Option(
        "--head", help="Score this head only (default: every head whose file is present).")]
        = None,
    calibrate_ood: Annotated[bool, typer.Option(
        "--calibrate-ood", help="Also set the model's OOD threshold from these in-distribution "
        "rows (conformal rule: a new row like them is flagged with probability <= --ood-fpr) "
        "and record it in the manifest. Use held-out data, not the rows you then measure.")
    ] = False,
    ood_fpr: Annotated[float | None, typer.Option(
        "--ood-fpr", help="False-positive rate of --calibrate-ood, or of the threshold "
        "--report --update-card sets from the clients' histogram [default: 0.05].")] = None,
) -> None:
    """Score every head of a model directory on labelled test data.

    The data are embeddings (with --feature-transform: the raw encoder output, transformed as the
    clients did), or raw images or texts (--data), encoded by the model's recorded encoder (refused
    when the local encoder's fingerprint differs) and transformed as the model records.
    """
    if json_out is not None and json_out.is_dir():
        raise InputError(f"--json '{json_out}' is a directory; give a file path")
    if report is not None:  # federated evaluation: the server's report of the clients' sums
        others = embeddings is not None or data is not None or local or head_name is not None
        return _report(report, model_dir, update_card, json_out, allow_unsigned_model, others,
                       (ood_fpr, calibrate_ood))
    check_feature_transform_option(feature_transform)
    if (embeddings is None) == (data is None):
        raise ConfigError("give exactly one of --embeddings (an .npz of labelled embeddings) "
                          "and --data (labelled raw images or texts)")
    if model_dir is None:
        raise ConfigError("give the model directory to evaluate (or --report TOTAL.ghe)")
    if out is not None and not local:
        raise ConfigError("--out writes a client's evaluation sums with --local; add --local")
    if update_card and local:
        raise ConfigError("--update-card records this evaluation in the model; a client's "
                          "--local sums are recorded by the server (evaluate --report "
                          "TOTAL.ghe --update-card MODEL_DIR): drop one of them")
    model = _loadable_heads(model_dir, allow_unsigned_model, head_name)
    spec = None if data is None else data_spec(data, fmt, label_column, text_columns)
    x, y, source, transform = _test_rows(model, model_dir, embeddings, spec, feature_transform,
                                         split, batch_size, backend, encoder_file)
    if y.size == 0:
        raise InputError(f"'{source}' holds no samples; accuracy needs at least one")
    _calibrate_ood(model_dir, model, (x, transform), ood_fpr, calibrate_ood,
                   allow_unsigned_model)
    if local:
        from ghofl.cli.federated_cmds import write_local_evaluation

        ood = load_ood(model_dir, model.manifest, allow_unsigned=allow_unsigned_model)
        return write_local_evaluation(model, x, y, transform=transform, out=out,
                                      source=f"'{source}'", ood=ood)
    heads = {head_name: model.head(head_name)} if head_name is not None else model.heads
    z = model.features(x, transform)
    _score(heads, z, y, source, "data" if data is not None else "embeddings", model_dir,
           json_out, update_card, allow_unsigned_model)


def _score(heads: dict[str, Head], z: Any, y: Any, source: Path, key: str, model_dir: Path,
           json_out: Path | None, update_card: bool, allow_unsigned: bool) -> None:
    """Print (and write to --json) the heads' accuracies on z (n, d), y (n,); --update-card."""
    scores = evaluate_heads(heads, z, y, what=f"'{source}'")
    results = {name: score.to_dict() for name, score in scores.items()}
    if json_out is not None:
        write_json(json_out, {"heads": results, "model_dir": str(model_dir), key: str(source)})
    typer.echo(table(["head", "accuracy", "n"],
                     [[n, r["accuracy"], r["n"]] for n, r in results.items()]))
    if update_card:
        sums = local_evaluation(heads, z, y, what=f"'{source}'")
        card = record_evaluation(model_dir, evaluation_entry(str(source), "test", sums),
                                 allow_unsigned=allow_unsigned)
        typer.echo(f"recorded the evaluation on '{source}' in '{card}' and the manifest",
                   err=True)


def _test_rows(model: FittedModel, model_dir: Path, embeddings: Path | None,
               spec: DatasetSpec | None, feature_transform: str, split: str | None,
               batch_size: int, backend: str,
               encoder_file: Path | None) -> tuple[Any, Any, Path, str | None]:
    """``(x (n, d), y (n,), source, transform)`` of evaluate's --embeddings or --data.

    ``transform`` is None for raw data (the model applies the transform it records).
    """
    if spec is not None:
        if feature_transform != "none":
            raise ConfigError("--feature-transform applies to --embeddings only; raw data gets "
                              "the transform the model records")
        x, y = _raw_labelled(spec, model, model_dir, split=split, batch_size=batch_size,
                             backend=backend, encoder_file=encoder_file)
        return x, y, Path(spec.path), None
    assert embeddings is not None
    if encoder_file is not None:
        raise ConfigError("--encoder-file encodes raw --data; --embeddings need no "
                          "encoder, so drop it")
    x, y = _labelled_embeddings(embeddings, model, model_dir, feature_transform)
    return x, y, embeddings, feature_transform


def _report(report: Path, model_dir: Path | None, update_card: bool, json_out: Path | None,
            allow_unsigned: bool, others: bool,
            ood: tuple[float | None, bool] = (None, False)) -> None:
    """``evaluate --report TOTAL.ghe [--update-card MODEL_DIR]``: print (and record) it.

    ``ood``: (--ood-fpr, --calibrate-ood); with --update-card the OOD threshold is set from the
    total's histogram at that rate.
    """
    fpr, calibrate = ood
    if calibrate:
        raise ConfigError("--calibrate-ood calibrates on --embeddings or --data rows; with "
                          "--report, --update-card sets the OOD threshold from the clients' "
                          "histogram: drop --calibrate-ood")
    from ghofl.cli.federated_cmds import print_report

    if others or (model_dir is not None and not update_card):
        raise ConfigError("--report prints a total evaluation file alone; drop the model, "
                          "--embeddings, --data, --local and --head (a model directory only "
                          "with --update-card, to record the federated evaluation in it)")
    if update_card and model_dir is None:
        raise ConfigError("--report --update-card records the federated evaluation in a "
                          "model: give its directory (evaluate --report TOTAL.ghe "
                          "--update-card MODEL_DIR)")
    if fpr is not None and not update_card:
        raise ConfigError("with --report, --ood-fpr is the rate of the OOD threshold that "
                          "--update-card sets; add --update-card MODEL_DIR")
    print_report(report, json_out)
    if model_dir is not None:
        _record_federated(report, model_dir, allow_unsigned, fpr)


def _loadable_heads(model_dir: Path, allow_unsigned: bool, head_name: str | None) -> FittedModel:
    """The model with the heads whose file is present; one stderr line per missing head.

    Raises
    ------
    InputError
        ``head_name`` is the head whose file is missing.
    ConfigError
        The model holds no head ``head_name``.
    """
    model = load_model(model_dir, allow_unsigned=allow_unsigned, missing_ok=True)
    if head_name is not None:
        model.head(head_name)  # names the missing file, or the heads held
        return model
    for name in model.missing:
        file = model.manifest["heads"][name]["file"]
        typer.echo(f"ghofl: warning: head {name!r} not evaluated: its file {file!r} is missing "
                   f"from '{model_dir}'; evaluating {', '.join(model.heads)}", err=True)
    return model


def _record_federated(report: Path, model_dir: Path, allow_unsigned: bool,
                      fpr: float | None = None) -> None:
    """``evaluate --report TOTAL.ghe --update-card MODEL_DIR``: record the federated sums.

    With the clients' OOD histogram in the total, also the calibrated OOD threshold.
    """
    from ghofl.model.card_update import federated_ood_threshold
    from ghofl.model.directory import update_ood

    sums = load_evaluation(report)
    model = load_model(model_dir, allow_unsigned=allow_unsigned, missing_ok=True)
    if sums.classes != model.classes:
        raise InputError(f"'{report}' holds sums over other classes than the model in "
                         f"'{model_dir}'; record the federated evaluation of this model")
    ood = federated_ood_threshold(model_dir, model.manifest, sums, fpr,
                                  allow_unsigned=allow_unsigned)  # refusals before any write
    card = record_evaluation(model_dir, evaluation_entry(str(report), "federated", sums),
                             allow_unsigned=allow_unsigned)
    if ood is not None:
        update_ood(model_dir, ood, allow_unsigned=allow_unsigned)
        typer.echo(f"OOD threshold {ood.threshold_:.6g} from {ood.n_calibration_} held-out "
                   f"rows of {sums.clients} clients at false-positive rate {ood.fpr_} "
                   f"(federated histogram), recorded in '{model_dir}'", err=True)
    typer.echo(f"recorded the federated evaluation '{report}' ({sums.clients} clients) in "
               f"'{card}' and the manifest", err=True)


def _calibrate_ood(model_dir: Path, model: FittedModel, rows: tuple[Any, str | None],
                   fpr: float | None, calibrate: bool, allow: bool) -> None:
    """``evaluate --calibrate-ood``: the conformal OOD threshold of ``rows`` (x, transform)."""
    from ghofl.heads.ood import DEFAULT_FPR
    from ghofl.model.directory import load_ood, update_ood

    if not calibrate and fpr is None:
        return
    if not calibrate:
        raise ConfigError("--ood-fpr is the rate of --calibrate-ood; add --calibrate-ood")
    ood = load_ood(model_dir, model.manifest, allow_unsigned=allow)
    if ood is None:
        raise InputError(f"the model in '{model_dir}' has no OOD score to calibrate; fit it "
                         "again with `ghofl fit`")
    z = model.features(*rows)
    proj = next(iter(model.heads.values())).meta_.projection
    ood.calibrate(proj.apply(z) if proj is not None else z, DEFAULT_FPR if fpr is None else fpr)
    update_ood(model_dir, ood, allow_unsigned=allow)
    typer.echo(f"OOD threshold {ood.threshold_:.6g} from {ood.n_calibration_} in-distribution "
               f"rows at false-positive rate {ood.fpr_} (conformal rule), recorded in "
               f"'{model_dir}'")


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
