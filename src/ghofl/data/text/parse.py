"""Labelled text files parsed: ``<label> <text>`` lines and CSV/TSV rows.

:func:`read_labelled_texts` reads a file into :class:`LabelledTexts` (raw labels, texts and
their line numbers), before labels map to classes; the formats are described in
:mod:`ghofl.data.text`.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ghofl.data.text.decode import read_text_file, split_lines
from ghofl.errors import ConfigError, DataError

__all__ = [
    "LABEL_COLUMN_NAMES",
    "TEXT_FORMATS",
    "LabelledTexts",
    "csv_rows",
    "parse_labelled_texts",
    "read_labelled_texts",
    "text_format_of",
]


#: Formats of :func:`read_text_dataset`; ``auto`` picks by file extension.
TEXT_FORMATS: tuple[str, ...] = ("auto", "lines", "csv", "tsv")
#: Header cells (case-insensitive) recognised as the label column of a CSV/TSV file.
LABEL_COLUMN_NAMES: frozenset[str] = frozenset(
    {"label", "labels", "class", "class_index", "category", "target", "sentiment", "y"}
)
#: Extensions read as CSV / TSV by the ``auto`` format; everything else is ``lines``.
_CSV_EXTENSIONS = frozenset({".csv"})
_TSV_EXTENSIONS = frozenset({".tsv", ".tab"})
_JOIN = ". "
_FASTTEXT_PREFIX = "__label__"


@dataclass(frozen=True)
class LabelledTexts:
    """A parsed text file before its labels are mapped to class indices.

    Attributes
    ----------
    path : Path
    texts : tuple of str, length n
    labels : tuple of str, length n
        The raw labels as written.
    lines : tuple of int, length n
        1-based line number where each item starts.
    blank_lines : int
        Blank lines (rows) skipped.
    encoding : str
        As from :func:`decode_text`.
    format : str
        ``lines``, ``csv`` or ``tsv``.
    """

    path: Path
    texts: tuple[str, ...]
    labels: tuple[str, ...]
    lines: tuple[int, ...]
    blank_lines: int
    encoding: str
    format: str


def text_format_of(path: str | os.PathLike[str], fmt: str = "auto") -> str:
    """The format of ``path``: ``fmt`` unless ``"auto"``, else one from the suffix.

    ``csv`` for ``.csv``, ``tsv`` for ``.tsv``/``.tab``, ``lines`` for anything else.
    """
    if fmt not in TEXT_FORMATS:
        raise ConfigError(
            f"text format must be one of {', '.join(TEXT_FORMATS)}; got {fmt!r}"
        )
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in _CSV_EXTENSIONS:
        return "csv"
    if suffix in _TSV_EXTENSIONS:
        return "tsv"
    return "lines"


def read_labelled_texts(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    label_column: str | int | None = None,
    text_columns: Sequence[str | int] | None = None,
    coarse: bool = False,
) -> LabelledTexts:
    """Read and parse a labelled text file (see the module docstring for the formats).

    Parameters
    ----------
    path : str or os.PathLike
    format : {"auto", "lines", "csv", "tsv"}, default "auto"
    label_column : str or int, optional
        CSV/TSV: header name or 0-based index of the label column.
    text_columns : sequence of str or int, optional
        CSV/TSV: header names or 0-based indices of the text columns, joined by ``". "``;
        default every column but the label column.
    coarse : bool, default False
        Keep only the part of each label before ``':'`` (TREC ``DESC:manner`` -> ``DESC``).

    Returns
    -------
    LabelledTexts

    Raises
    ------
    DataError
        A missing or undecodable file, a line or row without a label or text, a row with the
        wrong number of fields, or a file holding no labelled line; the message names the
        file, the 1-based line and the fix.
    ConfigError
        Column options with the ``lines`` format, or columns the file does not have.
    """
    path = Path(path)
    fmt = text_format_of(path, format)
    text, encoding = read_text_file(path)
    return parse_labelled_texts(text, path, fmt, encoding=encoding, label_column=label_column,
                                text_columns=text_columns, coarse=coarse)


def parse_labelled_texts(
    text: str,
    path: str | os.PathLike[str],
    fmt: str,
    *,
    encoding: str = "",
    label_column: str | int | None = None,
    text_columns: Sequence[str | int] | None = None,
    coarse: bool = False,
) -> LabelledTexts:
    """Parse decoded ``text`` in format ``fmt`` (``lines``, ``csv`` or ``tsv``).

    ``path`` is used in messages. See :func:`read_labelled_texts`.
    """
    path = Path(path)
    if fmt == "lines":
        if label_column is not None or text_columns:
            raise ConfigError(
                f"'{path}' is read as '<label> <text>' lines, which have no columns; drop the "
                "label/text column options or read it as csv or tsv (format = csv / --format csv)"
            )
        items, blank = _parse_lines(text, path)
    elif fmt in ("csv", "tsv"):
        items, blank = _parse_delimited(text, path, fmt, label_column, text_columns)
    else:
        raise ConfigError(f"text format must be lines, csv or tsv; got {fmt!r}")
    if not items:
        what = "'<label> <text>' lines" if fmt == "lines" else f"{fmt.upper()} rows with a label"
        raise DataError(
            f"text dataset file '{path}' holds no {what} ({blank} blank line(s)); give a file "
            "with one labelled example per line"
        )
    labels = tuple(_coarse(lab) if coarse else lab for _, lab, _ in items)
    return LabelledTexts(path, tuple(t for t, _, _ in items), labels,
                         tuple(n for _, _, n in items), blank, encoding, fmt)


def _coarse(label: str) -> str:
    return label.partition(":")[0]


def _snippet(line: str) -> str:
    return repr(line[:60] + ("..." if len(line) > 60 else ""))


def _parse_lines(text: str, path: Path) -> tuple[list[tuple[str, str, int]], int]:
    items: list[tuple[str, str, int]] = []
    blank = 0
    for lineno, line in enumerate(split_lines(text), start=1):
        stripped = line.strip()
        if not stripped:
            blank += 1
            continue
        parts = stripped.split(maxsplit=1)
        label = parts[0]
        if label.startswith(_FASTTEXT_PREFIX) and len(label) > len(_FASTTEXT_PREFIX):
            label = label[len(_FASTTEXT_PREFIX):]
        if len(parts) < 2:
            raise DataError(
                f"line {lineno} of '{path}' is malformed: it holds the label {label!r} but no "
                f"text; every line must be '<label> <text>' (got {_snippet(line)}); add the "
                "text or delete the line"
            )
        items.append((parts[1].strip(), label, lineno))
    return items, blank


def _parse_delimited(
    text: str, path: Path, fmt: str, label_column: str | int | None,
    text_columns: Sequence[str | int] | None,
) -> tuple[list[tuple[str, str, int]], int]:
    if fmt == "tsv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t",
                            quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(io.StringIO(text, newline=""))
    rows = csv_rows(reader, path, fmt)
    blank = 0
    while rows and not any(c.strip() for c in rows[0][1]):
        rows.pop(0)
        blank += 1
    if not rows:
        return [], blank
    first_line, first = rows[0]
    header = _is_header(first, label_column, text_columns)
    width = len(first)
    names = [c.strip() for c in first] if header else None
    label_idx = _column(label_column if label_column is not None
                        else _default_label(names), names, width, path, "label")
    if text_columns:
        text_idx = [_column(c, names, width, path, "text") for c in text_columns]
    else:
        text_idx = [i for i in range(width) if i != label_idx]
    if label_idx in text_idx:
        raise ConfigError(
            f"the label column {_col_name(label_idx, names)} of '{path}' is also a text column; "
            "give different label and text columns"
        )
    if not text_idx:
        raise DataError(
            f"line {first_line} of '{path}' has a single column: a {fmt.upper()} file needs a "
            "label column and at least one text column (for '<label> <text>' lines use the "
            "lines format)"
        )
    items: list[tuple[str, str, int]] = []
    for lineno, row in rows[1:] if header else rows:
        if not any(c.strip() for c in row):
            blank += 1
            continue
        if len(row) != width:
            raise DataError(
                f"line {lineno} of '{path}' is malformed: expected {width} {fmt.upper()} fields "
                f"like line {first_line} but got {len(row)} (starting "
                f"{_snippet(_delim(fmt).join(row))}); quote fields that hold the delimiter"
                + (" (TSV fields are not quoted: a tab inside a text breaks the row)"
                   if fmt == "tsv" else "")
            )
        label = row[label_idx].strip()
        body = _JOIN.join(p for p in (row[i].strip() for i in text_idx) if p)
        if not label or not body:
            missing = "label" if not label else "text"
            raise DataError(
                f"line {lineno} of '{path}' is malformed: its {missing} column "
                f"({_col_name(label_idx if not label else text_idx[0], names)}) is empty; fill "
                "it in or delete the row"
            )
        items.append((body, label, lineno))
    return items, blank


def _delim(fmt: str) -> str:
    return "\t" if fmt == "tsv" else ","


def csv_rows(reader: Any, path: Path, fmt: str) -> list[tuple[int, list[str]]]:
    """Every row of a :func:`csv.reader` over ``path``, with the line it starts on.

    Parameters
    ----------
    reader : csv reader
        Reads the decoded text of ``path``.
    path : Path
        The file, named in the error.
    fmt : str
        ``"csv"`` or ``"tsv"``, named in the error.

    Returns
    -------
    list of (int, list of str)
        (1-based line the row starts on, its cells), one per row; a quoted cell may span lines.

    Raises
    ------
    DataError
        A row is not valid CSV/TSV, naming its line.
    """
    rows: list[tuple[int, list[str]]] = []
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as exc:
            raise DataError(
                f"line {reader.line_num} of '{path}' is not valid {fmt.upper()} ({exc}); fix the "
                "quoting of that row"
            ) from None
        rows.append((start, row))
        start = reader.line_num + 1


def _is_header(first: list[str], label_column: str | int | None,
               text_columns: Sequence[str | int] | None) -> bool:
    named = isinstance(label_column, str) or any(isinstance(c, str) for c in text_columns or ())
    cells = {c.strip().lower() for c in first}
    return named or bool(cells & LABEL_COLUMN_NAMES)


def _default_label(names: list[str] | None) -> int:
    if names is None:
        return 0
    for i, n in enumerate(names):
        if n.lower() in LABEL_COLUMN_NAMES:
            return i
    return 0  # pragma: no cover - a header is detected only through a label name


def _column(spec: str | int, names: list[str] | None, width: int, path: Path, what: str) -> int:
    if isinstance(spec, bool) or not isinstance(spec, str | int):
        raise ConfigError(f"the {what} column must be a header name or a 0-based index; "
                          f"got {spec!r}")
    if isinstance(spec, int):
        if not 0 <= spec < width:
            raise ConfigError(
                f"the {what} column index {spec} is out of range: '{path}' has {width} columns "
                f"(indices 0..{width - 1})"
            )
        return spec
    if names is None:  # pragma: no cover - a name forces header mode
        raise ConfigError(f"'{path}' has no header row, so give the {what} column as an index")
    lowered = [n.lower() for n in names]
    if spec.strip().lower() not in lowered:
        raise ConfigError(
            f"the {what} column {spec!r} is not in the header of '{path}' (line 1: "
            f"{', '.join(names)}); give one of those names or a 0-based index"
        )
    return lowered.index(spec.strip().lower())


def _col_name(i: int, names: list[str] | None) -> str:
    return f"{names[i]!r}" if names is not None else f"column {i}"
