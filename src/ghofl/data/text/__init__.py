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

from ghofl.data.text.dataset import (
    TextDataset,
    holdout_split,
    infer_classes,
    read_text_dataset,
    text_fingerprint,
    to_text_dataset,
)
from ghofl.data.text.decode import decode_text, split_lines
from ghofl.data.text.named import (
    AGNEWS_CLASSES,
    AGNEWS_SPLIT_NOTE,
    SST2_CLASSES,
    TREC_CLASSES,
    read_agnews_csv,
    read_label_text_file,
    read_sst2,
    read_trec,
    split_agnews,
)
from ghofl.data.text.parse import (
    LABEL_COLUMN_NAMES,
    TEXT_FORMATS,
    LabelledTexts,
    parse_labelled_texts,
    read_labelled_texts,
    text_format_of,
)

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
