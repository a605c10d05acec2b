r"""Text files as text: encoding detection and line splitting.

:func:`decode_text` picks the encoding (byte-order mark, UTF-8, Windows-1252, Latin-1) and
:func:`split_lines` splits only at ``\n``, ``\r\n`` and ``\r``; see :mod:`ghofl.data.text`.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from ghofl.errors import DataError

__all__ = ["decode_text", "read_text_file", "split_lines"]


_LINE_BREAK = re.compile(r"\r\n|\r|\n")
#: Bytes that Windows-1252 leaves undefined (a file holding them is not cp1252).
_CP1252_UNDEFINED = frozenset({0x81, 0x8D, 0x8F, 0x90, 0x9D})
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE, whose BOM is its prefix
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


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


def read_text_file(path: Path) -> tuple[str, str]:
    """Read and decode a text dataset file (:func:`decode_text`).

    Returns
    -------
    text, encoding : str, str
        The file's text and the name of the encoding it was decoded with.

    Raises
    ------
    DataError
        ``path`` is a directory or does not exist, or its bytes are no text.
    """
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise DataError(
            f"text dataset file '{path}' {what}; give the path of a text file (named datasets "
            "are looked up in the directory set by GHOFL_DATA_DIR, under text/<file>)"
        )
    return decode_text(path.read_bytes(), f"text file '{path}'")
