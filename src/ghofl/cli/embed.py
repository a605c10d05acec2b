"""``ghofl embed``: a client's raw files (text or images, by path) -> an embeddings ``.npz``.

The archive (``x``, ``y``, ``classes``, ``encoder``; :mod:`ghofl.client.local_data`) is what
``ghofl client-stats --embeddings`` reads, so ``ghofl embed --data D --encoder E --out X.npz``
followed by ``ghofl client-stats --embeddings X.npz`` gives the same payload as ``ghofl
client-stats --data D --encoder E``. The text options and :func:`local_embeddings` are shared
with ``client-stats --data``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ghofl.cli.app import app
from ghofl.client.local_data import LocalEmbeddings
from ghofl.data.by_path import DatasetSpec
from ghofl.errors import ConfigError, InputError

__all__ = [
    "DataBackendOption",
    "DataBatchSizeOption",
    "DataFormatOption",
    "DataLabelColumnOption",
    "DataSplitOption",
    "DataTextColumnsOption",
    "TextReading",
    "data_spec", "embed", "local_embeddings", "parse_class_option", "summary"]

DATA_HELP = ("Raw data: a text file of '<label> <text>' lines or .csv/.tsv rows with a label "
             "column, a folder holding train/test text files, or an image layout (folder or "
             ".zip with [<split>/]<class>/<image>).")
ENCODER_HELP = ("Encoder: a built-in name (efficientnet-lite0, minilm, ...; see "
                "ghofl.client.encoders), your own image model file, onnx:PATH or "
                "torchscript:PATH (input contract in PATH.json beside it), or a library's "
                "model: hf:NAME_OR_DIR (Hugging Face text model folder or hub id), "
                "timm:NAME[@WEIGHTS] or open_clip:MODEL@TAG (docs/encoders.md).")
SPLIT_HELP = ("Split: an image layout's split folder, or train/test of a text dataset "
              "(default: a whole text file; else train; else the class folders at the root).")
FORMAT_HELP = "Text format: auto (by extension), lines, csv or tsv."
LABEL_COLUMN_HELP = "CSV/TSV label column: header name or 0-based index."
TEXT_COLUMNS_HELP = ("CSV/TSV text columns (names or 0-based indices, comma-separated), "
                     "joined by '. '; default every other column.")


# The raw-data options of commands that also take --embeddings (client-stats, evaluate).
DataSplitOption = Annotated[str | None, typer.Option("--split", help="With --data: " + SPLIT_HELP)]
DataFormatOption = Annotated[str, typer.Option("--format", help="With --data: " + FORMAT_HELP)]
DataLabelColumnOption = Annotated[str | None, typer.Option(
    "--label-column", help="With --data: " + LABEL_COLUMN_HELP)]
DataTextColumnsOption = Annotated[str | None, typer.Option(
    "--text-columns", help="With --data: " + TEXT_COLUMNS_HELP)]
DataBatchSizeOption = Annotated[int, typer.Option(
    "--batch-size", help="With --data: items per encoder call.")]
DataBackendOption = Annotated[str, typer.Option("--backend", help="With --data: onnx or torch.")]


def parse_column(raw: str) -> str | int:
    """A column option: an integer index when ``raw`` is digits, else a header name."""
    text = raw.strip()
    if not text:
        raise ConfigError("a column option must name a header or give a 0-based index; got ''")
    return int(text) if text.isdigit() else text


def data_spec(
    data: Path, fmt: str = "auto", label_column: str | None = None,
    text_columns: str | None = None, test_fraction: float = 0.2, split_seed: int = 0,
) -> DatasetSpec:
    """The :class:`DatasetSpec` of the ``--data`` options (checked before any work)."""
    if not data.exists():
        raise InputError(f"--data '{data}' does not exist; check the path")
    if fmt not in ("auto", "lines", "csv", "tsv"):
        raise ConfigError(f"--format must be auto, lines, csv or tsv; got {fmt!r}")
    cols = tuple(parse_column(c) for c in text_columns.split(",")) if text_columns else ()
    return DatasetSpec(str(data), format=fmt,
                       label_column=parse_column(label_column) if label_column else None,
                       text_columns=cols, test_fraction=test_fraction, split_seed=split_seed)


@dataclass(frozen=True)
class TextReading:
    """How the text files of ``--data`` are read.

    ``--format``, ``--label-column`` and ``--text-columns`` as given on the command line
    (checked by :meth:`spec`).
    """

    fmt: str = "auto"
    label_column: str | None = None
    text_columns: str | None = None

    def spec(self, data: Path) -> DatasetSpec:
        """The :class:`DatasetSpec` of ``data`` read this way (:func:`data_spec`)."""
        return data_spec(data, self.fmt, self.label_column, self.text_columns)


def parse_class_option(raw: str | None) -> tuple[str, ...] | None:
    """``--classes a,b,c`` -> ``("a", "b", "c")`` (``None`` when absent)."""
    if raw is None:
        return None
    names = tuple(s.strip() for s in raw.split(","))
    if not all(names) or len(set(names)) != len(names):
        raise ConfigError(
            f"--classes must be a comma-separated list of distinct, non-empty names; got {raw!r}"
        )
    return names


def local_embeddings(
    spec: DatasetSpec, encoder: str, *, split: str | None, classes: tuple[str, ...] | None,
    resolution: int, backend: str, batch_size: int, progress: bool,
) -> LocalEmbeddings:
    """Build the encoder and embed the data (through the embedding cache)."""
    from ghofl.client.encoders import get_encoder
    from ghofl.client.local_data import embed_local_data

    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1; got {batch_size}")
    if resolution < 16:
        raise ConfigError(f"--resolution must be >= 16 pixels; got {resolution}")
    enc = get_encoder(encoder, resolution=resolution, backend=backend)
    return embed_local_data(spec, enc, split=split, classes=classes, batch_size=batch_size,
                            progress=progress)


def summary(emb: LocalEmbeddings) -> str:
    """What was embedded: counts, classes, split, skipped blank lines, encoding."""
    per_class = np.bincount(emb.y, minlength=len(emb.classes))
    counts = ", ".join(f"{c}={int(n)}" for c, n in zip(emb.classes, per_class, strict=True))
    extra = f", {emb.n_blank} blank lines skipped" if emb.n_blank else ""
    if emb.encoding:
        extra += f", read as {emb.encoding}"
    return (f"n={emb.y.size} items, {len(emb.classes)} classes ({counts}), split "
            f"{emb.split}, d={emb.x.shape[1]} ({emb.info.name}){extra}")


@app.command("embed")
def embed(
    data: Annotated[Path, typer.Option("--data", help=DATA_HELP)],
    encoder: Annotated[str, typer.Option("--encoder", help=ENCODER_HELP)],
    out: Annotated[Path, typer.Option("--out", help="Embeddings archive to write (.npz).")],
    split: Annotated[str | None, typer.Option("--split", help=SPLIT_HELP)] = None,
    classes: Annotated[str | None, typer.Option(
        "--classes", help="Comma-separated class names (text labels are names in it or "
        "0-based indices into it); default the labels found in the data.")] = None,
    resolution: Annotated[int, typer.Option(
        "--resolution", help="Input resolution of image encoders.")] = 224,
    backend: Annotated[str, typer.Option("--backend", help="onnx or torch.")] = "onnx",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Items per encoder call.")]
        = 64,
    progress: Annotated[bool, typer.Option("--progress", help="Show a progress bar.")] = False,
    fmt: Annotated[str, typer.Option("--format", help=FORMAT_HELP)] = "auto",
    label_column: Annotated[str | None, typer.Option(
        "--label-column", help=LABEL_COLUMN_HELP)] = None,
    text_columns: Annotated[str | None, typer.Option(
        "--text-columns", help=TEXT_COLUMNS_HELP)] = None,
    test_fraction: Annotated[float, typer.Option(
        "--test-fraction", help="With --split train/test on a single text file: the held-out "
        "test fraction of every class.")] = 0.2,
    split_seed: Annotated[int, typer.Option(
        "--split-seed", help="Seed of that held-out split.")] = 0,
) -> None:
    """Embed a client's raw files with a frozen encoder into an .npz for `ghofl client-stats`.

    The archive holds x (n, d) float32, y (n,) int64, the class names and the encoder's
    fingerprint. Embeddings are cached (keyed by a fingerprint of the files), so embedding the
    same data again is instant.
    """
    if out.suffix.lower() != ".npz":
        raise ConfigError(f"--out must be an .npz file (e.g. client0.npz); got '{out}'")
    if out.is_dir():
        raise InputError(f"--out '{out}' is a directory; give a file path")
    spec = data_spec(data, fmt, label_column, text_columns, test_fraction, split_seed)
    emb = local_embeddings(spec, encoder, split=split, classes=parse_class_option(classes),
                           resolution=resolution, backend=backend, batch_size=batch_size,
                           progress=progress)
    from ghofl.client.local_data import save_embeddings_npz

    size = save_embeddings_npz(out, emb)
    typer.echo(f"wrote {out}: {summary(emb)}; {size} bytes")
