r"""Text datasets: label-and-text line files, CSV/TSV files and the named ones.

The line files hold ``<label> <text>``, CSV/TSV files a label column; the named datasets are the
TREC, SST-2 and AG News files.

Every reader returns a :class:`TextDataset` (``texts``, int64 ``labels``, ``classes``), whose
``load_batch(indices) -> list[str]`` mirrors the image sources so the same embedding loop
serves both.

Reading a file (:func:`read_text_dataset`) takes three steps:

1. **Decode** the bytes to text (:func:`decode_text`): a byte-order mark decides (UTF-8,
   UTF-16 LE/BE, UTF-32 LE/BE); else strict UTF-8; else Windows-1252 when the bytes
   0x80-0x9F occur and all are defined in it (there cp1252 holds printable characters such as
   smart quotes and the ellipsis, where Latin-1 holds invisible C1 controls), else Latin-1
   (which decodes every byte; it equals cp1252 when no byte lies in 0x80-0x9F).
2. **Split lines** only at ``\n``, ``\r\n`` and ``\r`` (:func:`split_lines`), never at the
   other characters :meth:`str.splitlines` treats as line breaks (U+0085, U+2028, form feeds,
   ...), so line numbers in messages are those an editor shows (1-based).
3. **Parse** every non-blank line (blank lines are skipped and counted in
   :attr:`TextDataset.blank_lines`):

   * ``lines`` format: the label, whitespace (spaces or a tab), the text. A fastText
     ``__label__`` prefix is removed from the label.
   * ``csv`` / ``tsv``: one record per row (CSV quoting is honoured, so a quoted field may
     span lines; TSV fields are taken literally). The first row is a header when it names
     the label column (``label_column`` given as a name) or when one of its cells is a usual
     label-column name (:data:`LABEL_COLUMN_NAMES`); otherwise there is no header and the
     label is column 0 (or ``label_column`` as a 0-based index). The text is the text
     columns (default: every other column) joined by ``". "``, as AG News joins title and
     description.

Labels map to class indices (:func:`infer_classes`): with a given class list, a label is a
class name, else an integer index into the list; without one the classes are the distinct
labels, in numeric order when every label is an integer, else in string order.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, DataError

__all__ = [
    "AGNEWS_CLASSES",
    "AGNEWS_SPLIT_NOTE",
    "LABEL_COLUMN_NAMES",
    "SST2_CLASSES",
    "TEXT_FORMATS",
    "TREC_CLASSES",
    "LabelledTexts",
    "TextDataset",
    "decode_text",
    "holdout_split",
    "infer_classes",
    "parse_labelled_texts",
    "read_agnews_csv",
    "read_label_text_file",
    "read_labelled_texts",
    "read_sst2",
    "read_text_dataset",
    "read_trec",
    "split_agnews",
    "split_lines",
    "text_fingerprint",
    "text_format_of",
    "to_text_dataset",
]

#: TREC-6 coarse question types, in the order of the numeric labels of the harvardnlp files
#: (0 = DESC ... 5 = NUM); ``DESC:manner``-style labels map to the same indices.
TREC_CLASSES: tuple[str, ...] = ("DESC", "ENTY", "ABBR", "HUM", "LOC", "NUM")
SST2_CLASSES: tuple[str, ...] = ("negative", "positive")
#: AG News classes; CSV labels 1..4 map to indices 0..3.
AGNEWS_CLASSES: tuple[str, ...] = ("World", "Sports", "Business", "Sci/Tech")
AGNEWS_HEADER = ("label", "title", "description")
AGNEWS_SPLIT_NOTE = (
    "AG News: only the official test CSV (7,600 rows) is available offline, so ghofl splits it "
    "into train/test: stratified by class, {train_pct}% train / {test_pct}% test of every class "
    "(1,520 / 380 per class at 80/20), with a seeded permutation (seed {seed}); these are not "
    "the official AG News splits."
)
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
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_INTEGER = re.compile(r"[+-]?[0-9]+")
#: Bytes that Windows-1252 leaves undefined (a file holding them is not cp1252).
_CP1252_UNDEFINED = frozenset({0x81, 0x8D, 0x8F, 0x90, 0x9D})
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE, whose BOM is its prefix
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


@dataclass(frozen=True, eq=False)
class TextDataset:
    """A labelled text dataset held in memory.

    Parameters
    ----------
    texts : list of str, length n
        The documents.
    labels : ndarray of int64, shape (n,)
        Labels in ``[0, len(classes))``.
    classes : tuple of str
        Class names; label ``c`` refers to ``classes[c]``.
    name : str
        Dataset name (used in messages and cache keys).
    split : str
        Split name.
    note : str
        Provenance remarks (e.g. how a split was derived).
    blank_lines : int, default 0
        Blank lines (or rows) the reader skipped.
    encoding : str, default ""
        Encoding the file was decoded with (``""`` when not read from a file).
    """

    texts: list[str]
    labels: NDArray[np.int64]
    classes: tuple[str, ...]
    name: str = "text"
    split: str = ""
    note: str = field(default="")
    blank_lines: int = 0
    encoding: str = ""

    def __post_init__(self) -> None:
        labels = np.asarray(self.labels).astype(np.int64)
        if labels.shape != (len(self.texts),):
            raise DataError(
                f"TextDataset '{self.name}' has {len(self.texts)} texts but labels of shape "
                f"{labels.shape}; give one label per text"
            )
        if labels.size and (labels.min() < 0 or labels.max() >= len(self.classes)):
            raise DataError(
                f"TextDataset '{self.name}' labels must lie in [0, {len(self.classes)}); got "
                f"values from {labels.min()} to {labels.max()}"
            )
        labels.setflags(write=False)
        object.__setattr__(self, "labels", labels)

    def __len__(self) -> int:
        return len(self.texts)

    def load_batch(self, indices: Sequence[int] | NDArray[np.integer[Any]]) -> list[str]:
        """Return the texts at ``indices`` (a list of length b)."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= len(self))):
            raise ConfigError(
                f"indices given to TextDataset.load_batch must be a 1-D sequence of integers in "
                f"[0, {len(self)}); got shape {idx.shape}"
            )
        return [self.texts[i] for i in idx.tolist()]

    def subset(self, indices: Sequence[int] | NDArray[np.integer[Any]], split: str,
               note: str = "") -> TextDataset:
        """The items at ``indices`` (in that order) as a dataset of the same classes."""
        idx = np.asarray(indices, dtype=np.int64)
        return TextDataset(self.load_batch(idx), self.labels[idx], self.classes, self.name,
                           split, note or self.note, self.blank_lines, self.encoding)


# ---------------------------------------------------------------------- decoding
def decode_text(raw: bytes, where: str = "text file") -> tuple[str, str]:
    """Decode the bytes of a text file, detecting the encoding.

    Parameters
    ----------
    raw : bytes
        The whole file.
    where : str
        What the bytes are (e.g. ``"'data/train.txt'"``), for messages.

    Returns
    -------
    text : str
        The decoded text, byte-order mark removed.
    encoding : str
        ``"utf-8-sig"``, ``"utf-16-le"``, ``"utf-16-be"``, ``"utf-32-le"``, ``"utf-32-be"``
        (from a BOM), ``"utf-8"``, ``"cp1252"`` or ``"latin-1"``.

    Raises
    ------
    DataError
        Bytes that a BOM announces but that do not decode, or NUL bytes without a BOM (a
        binary file, or UTF-16 without a byte-order mark).
    """
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            try:
                text = raw[len(bom):].decode(encoding)
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{where} starts with a {encoding.upper()} byte-order mark but byte "
                    f"{exc.start + len(bom)} does not decode as {encoding.upper()}; re-save the "
                    "file as UTF-8"
                ) from None
            return text, "utf-8-sig" if encoding == "utf-8" else encoding
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise DataError(
            f"{where} holds a NUL byte at offset {nul}: it is a binary file, or UTF-16/32 text "
            "without a byte-order mark; give a text file, saved as UTF-8"
        )
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    c1 = {b for b in raw if 0x80 <= b <= 0x9F}
    if c1 and not c1 & _CP1252_UNDEFINED:
        return raw.decode("cp1252"), "cp1252"
    return raw.decode("latin-1"), "latin-1"


def split_lines(text: str) -> list[str]:
    r"""Split ``text`` at ``\r\n``, ``\r`` and ``\n`` only.

    A final line break ends the last line and starts no new one. Line ``i`` of the
    file is ``result[i - 1]``.

    Unlike :meth:`str.splitlines`, U+0085 (NEL, the cp1252 ellipsis read as Latin-1), U+2028,
    U+2029, form feeds and the other Unicode line separators stay inside their line.
    """
    lines = _LINE_BREAK.split(text)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _read_file(path: Path) -> tuple[str, str]:
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise DataError(
            f"text dataset file '{path}' {what}; give the path of a text file (named datasets "
            "are looked up in the directory set by GHOFL_DATA_DIR, under text/<file>)"
        )
    return decode_text(path.read_bytes(), f"text file '{path}'")


def _read_text(path: Path) -> str:
    return _read_file(path)[0]


# ---------------------------------------------------------------------- parsing
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
    text, encoding = _read_file(path)
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
    rows = _csv_rows(reader, path, fmt)
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


def _csv_rows(reader: Any, path: Path, fmt: str) -> list[tuple[int, list[str]]]:
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


# ---------------------------------------------------------------------- labels
def infer_classes(parts: Iterable[LabelledTexts], *, max_classes: int = 1000) -> tuple[str, ...]:
    """The class list of one or more parsed files: their distinct labels, sorted.

    In numeric order when every label is an integer (``"2" < "10"``), else in string order.

    Raises
    ------
    DataError
        More than ``max_classes`` distinct labels, or (at 20 items or more) more distinct
        labels than half the items: the first word of each line is not a label.
    """
    parts = list(parts)
    seen: dict[str, None] = {}
    n = 0
    for p in parts:
        seen.update(dict.fromkeys(p.labels))
        n += len(p.labels)
    labels = list(seen)
    if len(labels) > max_classes or (n >= 20 and 2 * len(labels) > n):
        where = ", ".join(f"'{p.path}'" for p in parts)
        raise DataError(
            f"{where} hold {len(labels)} distinct labels in {n} lines (e.g. "
            f"{', '.join(repr(x) for x in labels[:3])}): the first field of each line does not "
            "look like a class label; give files of '<label> <text>' lines, or CSV/TSV files "
            "with a label column (name it with label_column / --label-column), or give the "
            "class list (--classes) when the data truly has under two lines per class"
        )
    if all(_INTEGER.fullmatch(x) for x in labels):
        return tuple(sorted(labels, key=lambda x: (int(x), x)))
    return tuple(sorted(labels))


def to_text_dataset(
    part: LabelledTexts,
    classes: Sequence[str],
    *,
    name: str | None = None,
    split: str = "",
    indices_ok: bool = True,
) -> TextDataset:
    """Map the raw labels of ``part`` onto ``classes``.

    A label is looked up by name; when it is no class name and ``indices_ok``, an integer
    label ``i`` with ``0 <= i < len(classes)`` means ``classes[i]``.

    Raises
    ------
    DataError
        A label that is neither; the message names the file, the line, the label and the
        classes.
    """
    classes = tuple(classes)
    lookup = {c: i for i, c in enumerate(classes)}
    out = np.empty(len(part.labels), dtype=np.int64)
    for k, (label, lineno) in enumerate(zip(part.labels, part.lines, strict=True)):
        idx = lookup.get(label)
        if idx is None and indices_ok and _INTEGER.fullmatch(label):
            i = int(label)
            idx = i if 0 <= i < len(classes) else None
        if idx is None:
            shown = ", ".join(classes[:10]) + (", ..." if len(classes) > 10 else "")
            raise DataError(
                f"line {lineno} of '{part.path}' has the label {label!r}, which is not a class "
                f"of this dataset ({shown})"
                + (f" nor an index 0..{len(classes) - 1}" if indices_ok else "")
                + "; fix the label or give the full class list"
            )
        out[k] = idx
    note = f"{part.blank_lines} blank line(s) skipped" if part.blank_lines else ""
    return TextDataset(list(part.texts), out, classes, name or part.path.stem, split, note,
                       part.blank_lines, part.encoding)


def read_text_dataset(
    path: str | os.PathLike[str],
    *,
    classes: Sequence[str] | None = None,
    format: str = "auto",
    label_column: str | int | None = None,
    text_columns: Sequence[str | int] | None = None,
    name: str | None = None,
    split: str = "",
    coarse: bool = False,
) -> TextDataset:
    """Read a labelled text file of any supported format (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
    classes : sequence of str, optional
        The class list; labels are names in it or integer indices into it. ``None``: the
        file's distinct labels (:func:`infer_classes`).
    format, label_column, text_columns, coarse
        As in :func:`read_labelled_texts`.
    name, split : str
        Stored on the result (``name`` defaults to the file name without extension).

    Returns
    -------
    TextDataset
        With ``blank_lines`` and ``encoding`` set.
    """
    part = read_labelled_texts(path, format=format, label_column=label_column,
                               text_columns=text_columns, coarse=coarse)
    names = tuple(classes) if classes is not None else infer_classes([part])
    return to_text_dataset(part, names, name=name, split=split)


def holdout_split(
    full: TextDataset, split: str, *, test_fraction: float = 0.2, seed: int = 0
) -> TextDataset:
    """A deterministic stratified train/test split of one dataset.

    Per class (in index order, one ``numpy.random.default_rng(seed)``), the items are permuted
    and the first ``round((1 - test_fraction) * n_c)`` go to ``train``; each split keeps the
    file order. A class with a single item goes to ``train``.

    Parameters
    ----------
    full : TextDataset
    split : {"train", "test"}
    test_fraction : float in (0, 1), default 0.2
    seed : int, default 0
    """
    if split not in ("train", "test"):
        raise ConfigError(f"a held-out split must be 'train' or 'test'; got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"test_fraction must lie in (0, 1); got {test_fraction}")
    rng = np.random.default_rng(seed)
    train: list[NDArray[np.int64]] = [np.zeros(0, np.int64)]
    test: list[NDArray[np.int64]] = [np.zeros(0, np.int64)]
    for c in range(len(full.classes)):
        members = rng.permutation(np.flatnonzero(full.labels == c))
        k = round((1.0 - test_fraction) * members.size)
        train.append(members[:k])
        test.append(members[k:])
    idx = np.sort(np.concatenate(train if split == "train" else test))
    note = (
        f"split of one file by ghofl: stratified by class, {100 * (1 - test_fraction):g}% train "
        f"/ {100 * test_fraction:g}% test of every class, seeded permutation (seed {seed})"
    )
    if full.note:
        note += f"; {full.note}"
    return full.subset(idx, split, note)


def text_fingerprint(paths: Iterable[Path], options: Mapping[str, Any]) -> str:
    """16 hex of the SHA-256 of the files' bytes and the reading options (a cache key part)."""
    h = hashlib.sha256(repr(sorted(options.items())).encode())
    for p in paths:
        h.update(str(p.name).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------- named datasets
def read_label_text_file(
    path: str | os.PathLike[str],
    label_map: Mapping[str, int],
    classes: Sequence[str],
    *,
    name: str = "text",
    split: str = "",
    coarse: bool = False,
) -> TextDataset:
    """Read a file of ``label text`` lines with a fixed label mapping.

    Parameters
    ----------
    path : str or os.PathLike
        The file (encoding detected by :func:`decode_text`).
    label_map : mapping of str to int
        Raw label (after ``coarse`` truncation) to class index.
    classes : sequence of str
        Class names.
    name, split : str
        Stored on the result.
    coarse : bool, default False
        Keep only the part of the label before ``':'`` (TREC ``DESC:manner`` -> ``DESC``).

    Returns
    -------
    TextDataset

    Raises
    ------
    DataError
        On a line without text or with an unknown label, naming the 1-based line number.
    """
    part = read_labelled_texts(path, format="lines", coarse=coarse)
    labels = np.empty(len(part.labels), dtype=np.int64)
    for k, (label, lineno) in enumerate(zip(part.labels, part.lines, strict=True)):
        if label not in label_map:
            raise DataError(
                f"line {lineno} of '{part.path}' is malformed: expected '<label> <text>' with a "
                f"label in {sorted(label_map)}; got the label {label!r}; fix the label"
            )
        labels[k] = label_map[label]
    note = f"{part.blank_lines} blank line(s) skipped" if part.blank_lines else ""
    return TextDataset(list(part.texts), labels, tuple(classes), name, split, note,
                       part.blank_lines, part.encoding)


def read_trec(path: str | os.PathLike[str], split: str = "") -> TextDataset:
    """Read TREC-6 (``TREC.train.all`` / ``TREC.test.all``).

    Labels are either numeric (0..5, the harvardnlp files) or ``COARSE:fine`` strings; both map
    to :data:`TREC_CLASSES` (the fine label is dropped).
    """
    label_map = {str(i): i for i in range(len(TREC_CLASSES))}
    label_map.update({c: i for i, c in enumerate(TREC_CLASSES)})
    return read_label_text_file(
        path, label_map, TREC_CLASSES, name="trec", split=split, coarse=True
    )


def read_sst2(path: str | os.PathLike[str], split: str = "") -> TextDataset:
    """Read SST-2 (``stsa.binary.*``): labels 0 (negative) / 1 (positive)."""
    return read_label_text_file(path, {"0": 0, "1": 1}, SST2_CLASSES, name="sst2", split=split)


def read_agnews_csv(path: str | os.PathLike[str]) -> TextDataset:
    """Read an AG News CSV with header ``label,title,description`` and labels 1..4.

    The text of a row is ``title + ". " + description``; labels 1..4 map to 0..3
    (:data:`AGNEWS_CLASSES`: World, Sports, Business, Sci/Tech).

    Raises
    ------
    DataError
        On a wrong header, a row without three fields or a label outside 1..4, naming the line.
    """
    path = Path(path)
    text, encoding = _read_file(path)
    rows = _csv_rows(csv.reader(io.StringIO(text, newline="")), path, "csv")
    header = rows[0][1] if rows else None
    if header is None or tuple(h.strip().lower() for h in header) != AGNEWS_HEADER:
        raise DataError(
            f"line 1 of '{path}' must be the header 'label,title,description'; got "
            f"{','.join(header or [])!r}"
        )
    texts: list[str] = []
    labels: list[int] = []
    blank = 0
    for lineno, row in rows[1:]:
        if not any(c.strip() for c in row):
            blank += 1
            continue
        if len(row) != 3 or row[0].strip() not in {"1", "2", "3", "4"}:
            raise DataError(
                f"line {lineno} of '{path}' is malformed: expected 3 fields "
                f"'label,title,description' with a label in 1..4; got {len(row)} field(s) "
                f"starting {','.join(row)[:60]!r}"
            )
        texts.append(f"{row[1].strip()}. {row[2].strip()}")
        labels.append(int(row[0]) - 1)
    if not texts:
        raise DataError(f"AG News file '{path}' holds a header but no rows")
    return TextDataset(texts, np.asarray(labels, dtype=np.int64), AGNEWS_CLASSES, "agnews",
                       blank_lines=blank, encoding=encoding)


def split_agnews(
    full: TextDataset, split: str, *, train_fraction: float = 0.8, seed: int = 0
) -> TextDataset:
    """Split AG News deterministically: stratified, seeded, ``train_fraction`` to train.

    Per class, the items are permuted with ``numpy.random.default_rng(seed)`` (one generator,
    classes in index order) and the first ``round(train_fraction * n_c)`` go to ``train``; each
    split keeps the original file order. The result's ``note`` says so.

    Parameters
    ----------
    full : TextDataset
        The whole CSV, as from :func:`read_agnews_csv`.
    split : {"train", "test"}
        Which part to return.
    train_fraction : float, default 0.8
        Fraction of every class that goes to ``train``.
    seed : int, default 0
        Seed of the permutation.
    """
    if split not in ("train", "test"):
        raise ConfigError(f"AG News split must be 'train' or 'test'; got {split!r}")
    if not 0.0 < train_fraction < 1.0:
        raise ConfigError(f"train_fraction must lie in (0, 1); got {train_fraction}")
    rng = np.random.default_rng(seed)
    train: list[NDArray[np.int64]] = []
    test: list[NDArray[np.int64]] = []
    for c in range(len(full.classes)):
        members = rng.permutation(np.flatnonzero(full.labels == c))
        k = round(train_fraction * members.size)
        train.append(members[:k])
        test.append(members[k:])
    idx = np.sort(np.concatenate(train if split == "train" else test))
    pct = round(100 * train_fraction)
    note = AGNEWS_SPLIT_NOTE.format(train_pct=pct, test_pct=100 - pct, seed=seed)
    return TextDataset(full.load_batch(idx), full.labels[idx], full.classes, full.name, split, note)
