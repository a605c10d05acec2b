"""``ghofl predict``: a model directory applied to new images, text lines or embeddings."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import numpy as np
import typer

from ghofl.cli._encoder_file import EncoderFileOption
from ghofl.cli._options import check_feature_transform_option
from ghofl.cli.app import app
from ghofl.client.transforms import transformed_dim
from ghofl.data.items import EmbeddingRows, ImageItems, Item, TextLineItems, is_image_path
from ghofl.errors import ConfigError, InputError
from ghofl.evaluation.predict import (
    Predictor,
    RowWriter,
    check_encoder_fingerprint,
    embed_items,
    iter_batches,
    output_columns,
    output_format,
    prediction_rows,
    recorded_encoder,
)
from ghofl.files import atomic_write
from ghofl.heads.base import Head
from ghofl.heads.ood import CALIBRATE_HINT, MahalanobisOOD
from ghofl.model.directory import FittedModel, load_model, load_ood
from ghofl.model.export import check_new_output
from ghofl.model.personalize import apply_prior_option
from ghofl.server.default_head import DEFAULT_HEAD_RULE
from ghofl.stats.meta import EncoderInfo

__all__ = ["HEAD_HELP", "AllowUnsignedModelOption", "check_embeddings_encoder", "pick_head",
           "predict"]

#: ``allow_unsigned_model: AllowUnsignedModelOption = False`` in the signature of a command
#: that reads a model directory (predict, evaluate, export).
AllowUnsignedModelOption = Annotated[bool, typer.Option(
    "--allow-unsigned-model", help="Read a legacy model whose manifest.json lacks its digest "
    "or a file's sha256 (refused otherwise), with a warning naming what is unchecked.")]
PriorPseudocountOption = Annotated[float | None, typer.Option(
    "--prior-pseudocount", help="λ of the local priors (n_c + λ)/Σ(n_k + λ) (default 1: "
    "Laplace; 0: a class this client never held is never predicted, the better choice under "
    "strong label skew when its data keeps the classes it holds).")]

DATA_HELP = ("Items to classify: an embeddings .npz (x (n, d); y optional), an image file, a "
             "folder of images (searched recursively, class folders too) or a .zip of images, "
             "or a UTF-8 text file with one item per line (text encoders).")
FT_HELP = ("Embeddings input only: the transform to apply to x first, as for ghofl evaluate "
           "(raw images and texts always get the transform the model records).")


def data_kind(data: Path) -> str:
    """``embeddings`` (.npz), ``images`` (folder, .zip, image file) or ``text`` (any other file)."""
    if not data.exists():
        raise InputError(f"--data '{data}' does not exist; check the path")
    if data.is_dir() or data.suffix.lower() == ".zip" or is_image_path(data.name):
        return "images"
    return "embeddings" if data.suffix.lower() == ".npz" else "text"


HEAD_HELP = ("Head of the model to use (default: the model's default head, chosen at fit "
             f"time as {DEFAULT_HEAD_RULE}; recorded in manifest.json as default_head; a model "
             "written before it: the first head of its manifest).")


def pick_head(model: FittedModel, name: str | None,
              model_dir: Path) -> tuple[str, Head, str | None]:
    """``(name, head, why)``: ``--head`` when given (``why`` None), else the default head.

    ``why``: the line to print on stderr, once the command succeeded, saying which head was
    used and why.

    Raises
    ------
    ConfigError
        The model holds no head ``name``.
    InputError
        The head's file is missing from the model directory.
    """
    if name is not None and name not in model.manifest["heads"]:
        raise ConfigError(f"--head {name!r} is not in the model '{model_dir}'; it holds "
                          f"{', '.join(map(str, model.manifest['heads']))}")
    if name is not None:
        return name, model.head(name), None
    name = model.default_head
    rule = model.manifest.get("default_head_rule") or (
        "the first head of a manifest written before ghofl recorded a default head")
    return name, model.head(name), (f"used head {name!r}, the model's default head ({rule}); "
                                    "choose another with --head")


def _check_top_k(top_k: int | None, num_classes: int) -> int | None:
    if top_k is not None and not 1 <= top_k <= num_classes:
        raise ConfigError(
            f"--top-k must lie in 1..{num_classes} (the model's number of classes); got {top_k}"
        )
    return top_k


def _raw_batches(
    data: Path, kind: str, head: Head, model_dir: Path, backend: str,
    encoder_file: Path | None = None,
) -> tuple[Any, Any]:
    """(items, encoder) of raw images or texts, the encoder checked."""
    recorded = head.meta_.encoder
    if recorded is not None and (recorded.resolution is None) != (kind == "text"):
        wants_text = recorded.resolution is None
        raise InputError(
            f"--data '{data}' holds {'texts' if kind == 'text' else 'images'}, but the model's "
            f"encoder {recorded.name!r} is {'a text' if wants_text else 'an image'} encoder; "
            f"give it {'a text file, one item per line' if wants_text else 'images'} (or "
            "embeddings)"
        )
    encoder = recorded_encoder(recorded, f"'{model_dir}'", backend, encoder_file, model_dir)
    assert recorded is not None
    items = TextLineItems(data) if kind == "text" else ImageItems(data)
    return items, encoder


def check_embeddings_encoder(record: dict[str, Any] | None, data: Path, model: FittedModel,
                             head: Head, model_dir: Path, feature_transform: str) -> None:
    """Refuse embeddings that ``ghofl embed`` wrote with another encoder than the model's.

    Parameters
    ----------
    record : dict or None
        The archive's ``encoder`` record (:attr:`~ghofl.data.items.EmbeddingRows.encoder`);
        ``None`` (embeddings from elsewhere) or a model without a recorded encoder: no check.
    data : Path
        The archive, for messages.
    model, head, model_dir
        The model, the head used and its directory.
    feature_transform : str
        ``--feature-transform``: raw ``ghofl embed`` output needs the clients' transform.

    Raises
    ------
    InputError
        The archive's encoder fingerprint differs from the model's (after its feature
        transform), or ``feature_transform`` is not the one the clients applied.
    """
    recorded = head.meta_.encoder
    if record is None or recorded is None:
        return
    info = EncoderInfo.from_dict(record)
    check_encoder_fingerprint(info, recorded, f"'{model_dir}'")
    done = model.transform
    if feature_transform != done:
        raise InputError(
            f"'{data}' holds raw {info.name} embeddings (written by ghofl embed) and the "
            f"clients applied --feature-transform {done}; pass --feature-transform {done}"
        )


def _embedding_rows(
    data: Path, model: FittedModel, head: Head, model_dir: Path, feature_transform: str,
) -> EmbeddingRows:
    rows = EmbeddingRows(data)
    check_embeddings_encoder(rows.encoder, data, model, head, model_dir, feature_transform)
    done = model.transform
    dim = transformed_dim(rows.dim, feature_transform) if rows.dim else 0
    if dim != head.n_features_in_:
        hint = ("embed the items with the clients' encoder" if done == feature_transform
                else f"the clients applied --feature-transform {done}; pass the same")
        raise InputError(
            f"'{data}' has {rows.dim}-dimensional embeddings"
            + (f" ({dim} after --feature-transform {feature_transform})"
               if feature_transform != "none" else "")
            + f" but the model in '{model_dir}' expects d={head.n_features_in_}; {hint}"
        )
    return rows


def _progress(total: int, show: bool | None) -> Any:
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with the torch extra; without it, no bar
        return None
    return tqdm(total=total, desc="predicting", unit="item", mininterval=1.0, file=sys.stderr)


def _skip(item: Item) -> None:
    typer.echo(f"ghofl: warning: skipped unreadable item {item.id!r}: {item.error}", err=True)


def _feature_batches(
    data: Path, kind: str, model: FittedModel, head: Head, model_dir: Path, *,
    feature_transform: str, backend: str, batch_size: int, skip_unreadable: bool,
    skipped: list[str], encoder_file: Path | None = None,
) -> tuple[int, str | None, Iterator[tuple[list[str], np.ndarray]]]:
    """(number of items, transform, iterator of (ids, raw features (b, d))).

    The transform is ``None`` for raw items (the model applies the one it records), else
    ``feature_transform``.
    """
    if kind == "embeddings":
        if encoder_file is not None:
            raise ConfigError("--encoder-file encodes raw images; embeddings input needs no "
                              "encoder, so drop it")
        rows = _embedding_rows(data, model, head, model_dir, feature_transform)

        def from_rows() -> Iterator[tuple[list[str], np.ndarray]]:
            start = 0
            for block in rows.blocks(batch_size):
                yield [str(i) for i in range(start, start + block.shape[0])], block
                start += block.shape[0]

        return len(rows), feature_transform, from_rows()
    if feature_transform != "none":
        raise ConfigError(
            "--feature-transform applies to embeddings input only; raw images and texts get "
            "the transform the model records"
        )
    items, encoder = _raw_batches(data, kind, head, model_dir, backend, encoder_file)

    def on_skip(item: Item) -> None:
        skipped.append(item.id)
        _skip(item)

    def from_items() -> Iterator[tuple[list[str], np.ndarray]]:
        for batch in iter_batches(items, batch_size, skip_unreadable=skip_unreadable,
                                  on_skip=on_skip):
            yield [item.id for item in batch], embed_items(encoder, batch)

    return len(items), None, from_items()


def _one_blas_thread(kind: str) -> Any:
    """One BLAS thread for the head while an encoder runs on raw items, else no limit.

    The encoder's ONNX Runtime threads and the BLAS threads of the head and OOD score
    (small products per batch) would otherwise spin against each other on the same cores
    between batches; with one BLAS thread ``predict`` keeps pace with the encoder alone.
    """
    if kind == "embeddings":
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def _with_threshold(ood: MahalanobisOOD | None, threshold: float | None,
                    model_dir: Path) -> MahalanobisOOD | None:
    """The model's OOD score, its threshold replaced by ``--ood-threshold`` when given."""
    if threshold is None:
        return ood
    if not math.isfinite(threshold) or threshold < 0:
        raise ConfigError(f"--ood-threshold must be a finite score >= 0; got {threshold!r}")
    if ood is None:
        raise InputError(f"the model in '{model_dir}' holds no out-of-distribution score "
                         "(fitted before ghofl wrote one, or from too few samples); drop "
                         "--ood-threshold")
    ood.threshold_ = float(threshold)
    return ood


@app.command("predict")
def predict(
    model_dir: Annotated[Path, typer.Argument(help="Model directory written by `ghofl fit`.")],
    data: Annotated[Path, typer.Option("--data", help=DATA_HELP)],
    out: Annotated[Path, typer.Option(
        "--out", help="Predictions file: .csv or .jsonl (JSON Lines, the same keys).")],
    head_name: Annotated[str | None, typer.Option("--head", help=HEAD_HELP)] = None,
    top_k: Annotated[int | None, typer.Option(
        "--top-k", help="Report the K most probable classes (top1, p_top1, ...) instead of "
        "one p_<class> column per class.")] = None,
    batch_size: Annotated[int, typer.Option(
        "--batch-size", help="Items per encoder and head call (the memory bound).")] = 64,
    skip_unreadable: Annotated[bool, typer.Option(
        "--skip-unreadable", help="Leave unreadable items (corrupt images, invalid UTF-8 "
        "lines) out and list them on stderr, instead of failing with nothing written.")]
        = False,
    feature_transform: Annotated[str, typer.Option("--feature-transform", help=FT_HELP)]
        = "none",
    backend: Annotated[str, typer.Option("--backend", help="Encoder backend: onnx or torch.")]
        = "onnx",
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a "
        "terminal; needs tqdm).")] = None,
    encoder_file: EncoderFileOption = None,
    ood_threshold: Annotated[float | None, typer.Option(
        "--ood-threshold", help="Flag ood above this ood_score instead of the model's "
        "calibrated threshold (e.g. a quantile of the scores of in-distribution data of your "
        "own); a model without a calibrated threshold flags nothing without it.")] = None,
    prior: Annotated[str, typer.Option(
        "--prior", help="'global': the model's class priors; 'local': this client's own, "
        "(n_c + λ)/Σ(n_k + λ) of the class counts in --stats (nothing else changes).")]
        = "global",
    pseudocount: PriorPseudocountOption = None,
    stats: Annotated[Path | None, typer.Option(
        "--stats", help="With --prior local: this client's own statistics (.ghs), as it "
        "uploaded them.")] = None,
    allow_unsigned_model: AllowUnsignedModelOption = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out.")] = False,
) -> None:
    """Classify new items with a fitted model: one row per item, streamed to --out.

    Columns: id (file path relative to --data, line number, or row index), label (class
    name), p_<class> per class (or top<i>, p_top<i> with --top-k), then ood_score (squared
    Mahalanobis distance to the nearest class mean under the model's pooled covariance) and,
    once the model's OOD threshold is calibrated on data (evaluate --calibrate-ood, or
    evaluate --report TOTAL.ghe --update-card), ood (true when ood_score exceeds it). Raw
    images and texts are encoded by the model's recorded encoder, rebuilt locally and refused
    when its fingerprint differs (an onnx:/torchscript: encoder's file: --encoder-file, else
    looked up by its name).
    The file is written atomically: on an error (e.g. a corrupt image without
    --skip-unreadable) nothing is written. An existing --out is replaced only with --force.
    """
    fmt = output_format(out)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1; got {batch_size}")
    if out.is_dir():
        raise InputError(f"--out '{out}' is a directory; give a file path")
    check_new_output(out, force)
    check_feature_transform_option(feature_transform)
    kind = data_kind(data)
    model = load_model(model_dir, allow_unsigned=allow_unsigned_model, missing_ok=True)
    name, head, why = pick_head(model, head_name, model_dir)
    model = apply_prior_option(model, name, prior, stats, model_dir, pseudocount)
    head = model.head(name)
    ood = load_ood(model_dir, model.manifest, allow_unsigned=allow_unsigned_model)
    predictor_ood = _with_threshold(ood, ood_threshold, model_dir)
    top_k = _check_top_k(top_k, len(head.meta_.classes))
    skipped: list[str] = []
    total, transform, batches = _feature_batches(
        data, kind, model, head, model_dir, feature_transform=feature_transform,
        backend=backend, batch_size=batch_size, skip_unreadable=skip_unreadable,
        skipped=skipped, encoder_file=encoder_file)
    predictor = Predictor(model, name, predictor_ood, transform)
    counts = {"rows": 0, "ood": 0}

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f, _one_blas_thread(kind):
            _stream(f, fmt, predictor, batches, top_k, total, progress, counts)

    atomic_write(out, write)
    flagged = (f", {counts['ood']} flagged out of distribution (ood_score > "
               f"{predictor_ood.threshold_:.4g})"
               if predictor_ood is not None and predictor_ood.threshold_ is not None else "")
    left = f", {len(skipped)} unreadable item(s) skipped" if skipped else ""
    local = " and this client's priors" if prior == "local" else ""
    typer.echo(f"wrote {out}: {counts['rows']} predictions with head {name!r}{local}{flagged}"
               f"{left}")
    if predictor_ood is not None and predictor_ood.threshold_ is None:
        typer.echo(f"the model in '{model_dir}' has no calibrated OOD threshold, so the rows "
                   f"have ood_score but no ood flag; {CALIBRATE_HINT} (or pass "
                   "--ood-threshold)", err=True)
    if why is not None:
        typer.echo(why, err=True)


def _stream(f: IO[str], fmt: str, predictor: Predictor,
            batches: Iterator[tuple[list[str], np.ndarray]], top_k: int | None, total: int,
            progress: bool | None, counts: dict[str, int]) -> None:
    ood = predictor.ood
    threshold = None if ood is None else ood.threshold_
    writer = RowWriter(f, fmt, output_columns(predictor.classes, top_k, ood is not None,
                                              threshold is not None))
    bar = _progress(total, progress)
    try:
        for ids, x in batches:
            finite = np.isfinite(x).all(axis=1)
            if not finite.all():
                raise InputError(
                    f"item {ids[int(np.flatnonzero(~finite)[0])]!r} has NaN or infinite "
                    "features (from the encoder or the embeddings file); nothing was written; "
                    "fix or drop those rows"
                )
            proba, scores = predictor.predict(x)
            writer.write(prediction_rows(ids, proba, predictor.classes, top_k=top_k,
                                         ood_score=scores, threshold=threshold))
            if scores is not None and ood is not None and threshold is not None:
                counts["ood"] += int(np.sum(ood.flag(scores)))
            if bar is not None:
                bar.update(len(ids))
    finally:
        if bar is not None:
            bar.close()
    counts["rows"] = writer.rows
