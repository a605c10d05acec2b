"""Predictions of a model directory on new items, streamed in batches (``ghofl predict``).

The pipeline is the one the clients ran, then the one ``ghofl evaluate`` runs: raw items
(images, text lines) go through the encoder recorded in the model, rebuilt locally and
refused when its fingerprint differs from the recorded one; then the model
(:class:`~ghofl.model.directory.FittedModel`), which applies its recorded feature transform
and the head (and the head its projection). Embedding rows skip the encoder and take the
transform the caller names (as ``evaluate --feature-transform``).

Every batch gives one row per item: ``id``, ``label`` (class name), ``p_<class>`` per class
(or, with ``top_k``, ``top<i>`` and ``p_top<i>`` for the K most probable classes), then
``ood_score`` (:mod:`ghofl.heads.ood`) when the model holds the score, and ``ood`` (score above
the model's threshold) only when that threshold was calibrated on data. Only one batch of
embeddings is in memory at a time.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.encoders.base import Encoder
from ghofl.client.transforms import recorded_feature_transform, transformed_info
from ghofl.data.items import Item
from ghofl.errors import ConfigError, DataError, InputError
from ghofl.heads.base import Head
from ghofl.heads.ood import MahalanobisOOD
from ghofl.stats.meta import EncoderInfo

if TYPE_CHECKING:
    from ghofl.model.directory import FittedModel

__all__ = [
    "OUTPUT_FORMATS",
    "Predictor",
    "RowWriter",
    "check_encoder_fingerprint",
    "iter_batches",
    "prediction_rows",
    "recorded_encoder",
]

F64 = NDArray[np.float64]
#: --out extensions and the format each selects.
OUTPUT_FORMATS = {".csv": "csv", ".jsonl": "jsonl"}


def check_encoder_fingerprint(local: EncoderInfo, recorded: EncoderInfo, where: str) -> None:
    """Refuse a local encoder whose output is not the recorded encoder's.

    Outputs are compared after the recorded feature transform.

    Raises
    ------
    InputError
        Naming both fingerprints, the fields that differ and the fix.
    """
    expected = transformed_info(local, recorded_feature_transform(recorded))
    if expected.fingerprint() == recorded.fingerprint():
        return
    diffs = [f.name for f in fields(EncoderInfo)
             if getattr(expected, f.name) != getattr(recorded, f.name)]
    raise InputError(
        f"the local encoder {local.name!r} has fingerprint {expected.fingerprint()}, but the "
        f"model in {where} was fitted on embeddings of encoder fingerprint "
        f"{recorded.fingerprint()} ({recorded.name!r}; they differ in {', '.join(diffs)}); "
        "install the encoder the clients used (same weights package or file, resolution and "
        "preprocessing), or fit the model again from statistics computed with this encoder"
    )


def recorded_encoder(recorded: EncoderInfo | None, where: str, backend: str = "onnx",
                     encoder_file: str | os.PathLike[str] | None = None,
                     model_dir: Path | None = None) -> Encoder:
    """The encoder a model records, rebuilt locally and its fingerprint checked.

    Parameters
    ----------
    recorded : EncoderInfo or None
        ``head.meta_.encoder`` of the model (with the recorded feature transform).
    where : str
        The model, as messages name it (e.g. ``"'model/'"``).
    backend : {"onnx", "torch"}, default "onnx"
    encoder_file : path, optional
        The model file of an ``onnx:`` / ``torchscript:`` encoder, the model folder of an
        ``hf:`` encoder or the weights file of a ``timm:`` / ``open_clip:`` one
        (``--encoder-file``); default: looked up as :mod:`ghofl.client.encoders.recorded` says
        (model files) or by the recorded name (library encoders).
    model_dir : Path, optional
        The model directory (searched for the model file after the current directory).

    Raises
    ------
    InputError
        The model records no encoder (fitted on raw features), the local encoder's
        fingerprint differs (:func:`check_encoder_fingerprint`), or ``encoder_file`` is given
        for a built-in encoder.
    DataError
        The model file of an ``onnx:`` / ``torchscript:`` encoder is not found.
    """
    if recorded is None:
        raise InputError(
            f"the model in {where} records no encoder (it was fitted on raw features), so it "
            "cannot encode images or texts; give it embeddings (an .npz) instead"
        )
    from ghofl.client.encoders.recorded import (
        is_library_encoder,
        model_file_kind,
        rebuild_library_encoder,
        rebuild_model_file_encoder,
    )

    if model_file_kind(recorded) is not None:
        return rebuild_model_file_encoder(recorded, where, encoder_file, model_dir)
    if is_library_encoder(recorded):
        library: Encoder = rebuild_library_encoder(recorded, where, backend, encoder_file,
                                                   model_dir)
        check_encoder_fingerprint(library.info, recorded, where)
        return library
    if encoder_file is not None:
        raise InputError(
            f"--encoder-file applies to onnx:, torchscript:, hf:, timm: and open_clip: "
            f"encoders; the model in {where} records the built-in encoder {recorded.name!r}; "
            "drop --encoder-file"
        )
    from ghofl.client.encoders import get_encoder

    encoder = get_encoder(recorded.name, resolution=recorded.resolution or 224, backend=backend)
    check_encoder_fingerprint(encoder.info, recorded, where)
    return encoder


@dataclass(frozen=True)
class Predictor:
    """One head of a fitted model, with the model's OOD score, on raw rows.

    Attributes
    ----------
    model : FittedModel
        The model (:func:`~ghofl.model.directory.load_model`); it applies its own recorded
        feature transform.
    head_name : str
    ood : MahalanobisOOD or None
    transform : str or None
        ``None``: the rows are the encoder's raw output and get the transform the model
        records; else the transform to apply instead (embedding rows, as the caller names
        it; ``"none"``: rows already in the heads' input space).
    """

    model: FittedModel
    head_name: str
    ood: MahalanobisOOD | None = None
    transform: str | None = None

    @property
    def head(self) -> Head:
        """The head that predicts."""
        return self.model.head(self.head_name)

    @property
    def classes(self) -> tuple[str, ...]:
        """The head's class names."""
        return tuple(self.head.meta_.classes)

    def features(self, x: NDArray[Any]) -> F64:
        """Rows (b, d) -> the heads' input (b, n_features_in_) (:meth:`FittedModel.features`)."""
        return self.model.features(x, self.transform)

    def predict(self, x: NDArray[Any]) -> tuple[F64, F64 | None]:
        """Probabilities (b, C) and OOD scores (b,) (``None`` without a score) of raw rows."""
        z = self.features(x)
        proba = self.head.predict_proba(z)
        if self.ood is None:
            return proba, None
        proj = self.head.meta_.projection
        return proba, self.ood.score(proj.apply(z) if proj is not None else z)


def iter_batches(items: Iterable[Item], batch_size: int, *, skip_unreadable: bool,
                 on_skip: Callable[[Item], None]) -> Iterator[list[Item]]:
    """Readable items in lists of at most ``batch_size``, reading ahead in a thread.

    The next list is read in a background thread while the caller works on the current one.

    Raises
    ------
    DataError
        At the first unreadable item unless ``skip_unreadable`` (then ``on_skip(item)``).
    """
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1; got {batch_size}")
    it = iter(items)

    def take() -> list[Item]:
        out: list[Item] = []
        for item in it:
            if item.error:
                if not skip_unreadable:
                    raise DataError(
                        f"item {item.id!r} is unreadable: {item.error}; nothing was written "
                        "(pass --skip-unreadable to leave unreadable items out)"
                    )
                on_skip(item)
                continue
            out.append(item)
            if len(out) == batch_size:
                break
        return out

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(take)
        while True:
            batch = pending.result()
            if not batch:
                return
            pending = pool.submit(take)
            yield batch


def embed_items(encoder: Encoder, batch: list[Item]) -> NDArray[np.float32]:
    """Encode a batch: shape (b, encoder.dim).

    Images of different sizes are encoded in groups of equal size (each group exactly as a batch of
    that size), texts all at once.
    """
    values = [item.value for item in batch]
    if not values or isinstance(values[0], str):
        return encoder.embed(values)
    out = np.empty((len(values), encoder.dim), dtype=np.float32)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault(tuple(v.shape), []).append(i)
    for idx in groups.values():
        out[idx] = encoder.embed(np.stack([values[i] for i in idx]))
    return out


def prediction_rows(
    ids: list[str], proba: F64, classes: tuple[str, ...], *, top_k: int | None = None,
    ood_score: F64 | None = None, threshold: float | None = None,
) -> list[dict[str, Any]]:
    """One output row per item (keys in column order; see the module docstring).

    Parameters
    ----------
    ids : list of str, length b
    proba : ndarray, shape (b, C)
    classes : tuple of str, length C
    top_k : int, optional
        Report the K most probable classes (``top1``, ``p_top1``, ...) instead of every class.
    ood_score : ndarray, shape (b,), optional
    threshold : float, optional
        The model's calibrated OOD threshold (``ood`` = score > threshold); without it the rows
        carry ``ood_score`` alone.
    """
    best = np.argmax(proba, axis=1)
    order = np.argsort(-proba, axis=1, kind="stable")[:, :top_k] if top_k else None
    rows: list[dict[str, Any]] = []
    for i, item_id in enumerate(ids):
        row: dict[str, Any] = {"id": item_id, "label": classes[int(best[i])]}
        if order is None:
            row.update({f"p_{c}": float(proba[i, j]) for j, c in enumerate(classes)})
        else:
            for r, j in enumerate(order[i], start=1):
                row[f"top{r}"] = classes[int(j)]
                row[f"p_top{r}"] = float(proba[i, j])
        if ood_score is not None:
            row["ood_score"] = float(ood_score[i])
            if threshold is not None:
                row["ood"] = bool(ood_score[i] > threshold)
        rows.append(row)
    return rows


def output_columns(classes: tuple[str, ...], top_k: int | None, with_ood: bool,
                   with_flag: bool | None = None) -> list[str]:
    """The CSV header: the keys of :func:`prediction_rows`, in order.

    ``with_ood``: the ``ood_score`` column; ``with_flag`` (default ``with_ood``): ``ood`` too.
    """
    cols = ["id", "label"]
    if top_k:
        for r in range(1, top_k + 1):
            cols += [f"top{r}", f"p_top{r}"]
    else:
        cols += [f"p_{c}" for c in classes]
    flag = with_ood if with_flag is None else with_flag
    return cols + (["ood_score"] if with_ood else []) + (["ood"] if with_ood and flag else [])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


class RowWriter:
    """Writes rows as CSV (header first) or JSON Lines (one object a line, same keys).

    CSV cells are the JSON text of the value (floats as ``repr``, booleans ``true``/``false``,
    strings as they are), so both formats carry the same content.
    """

    def __init__(self, f: IO[str], fmt: str, columns: list[str]) -> None:
        if fmt not in OUTPUT_FORMATS.values():
            raise ConfigError(f"output format must be csv or jsonl; got {fmt!r}")
        self.fmt = fmt
        self._f = f
        self._csv = csv.writer(f, lineterminator="\n") if fmt == "csv" else None
        if self._csv is not None:
            self._csv.writerow(columns)
        self.rows = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Write ``rows`` (each with the columns' keys, in order) and count them."""
        for row in rows:
            if self._csv is not None:
                self._csv.writerow([_text(v) for v in row.values()])
            else:
                self._f.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        self.rows += len(rows)


def output_format(out: Path) -> str:
    """The format selected by ``--out``'s extension.

    Raises
    ------
    ConfigError
        Any extension but ``.csv`` and ``.jsonl``.
    """
    fmt = OUTPUT_FORMATS.get(out.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"--out '{out}' must end in .csv or .jsonl (the extension chooses CSV or JSON "
            f"Lines); got {out.suffix or 'no extension'!r}"
        )
    return fmt
