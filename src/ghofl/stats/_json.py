"""Defensive JSON for file headers: bounded size, depth and value count.

They are checked by a streaming scan before parsing (see :func:`parse_json`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ghofl.errors import StatsFormatError

__all__ = ["MAX_HEADER_BYTES", "MAX_INT_DIGITS", "MAX_JSON_DEPTH", "MAX_JSON_VALUES",
           "parse_json"]

#: Largest header accepted (the JSON between the length prefix and the data).
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: Deepest JSON nesting accepted in a header or in a JSON value inside it.
MAX_JSON_DEPTH = 32
#: Most JSON values (about: commas and colons plus one) accepted in a header: parsing costs
#: tens of bytes per value, so this bounds the memory a header can ask for.
MAX_JSON_VALUES = 1_000_000
#: Longest decimal integer accepted in header JSON.
MAX_INT_DIGITS = 40


# ---------------------------------------------------------------------- safe JSON
class _JSONRefused(ValueError):
    """Raised inside :func:`parse_json` hooks."""


def _refuse_constant(name: str) -> Any:
    raise _JSONRefused(f"the non-standard number {name}")


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _JSONRefused(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > 64:
        raise _JSONRefused(f"a number written with {len(text)} characters (at most 64)")
    value = float(text)
    if not math.isfinite(value):
        raise _JSONRefused(f"the number {text} that overflows a float64")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JSONRefused(f"the key {key!r} twice")
        out[key] = value
    return out


_DEPTH_CHUNK = 1 << 18
_QUOTE, _BACKSLASH, _OPEN1, _OPEN2, _CLOSE1, _CLOSE2, _COMMA, _COLON = (
    ord(c) for c in '"\\[{]},:')


def _json_shape(text: str | bytes) -> tuple[int, int]:
    """Deepest bracket nesting and number of values of JSON ``text``, outside strings.

    The number of values is approximate (commas and colons plus one); the scan stops once the depth
    exceeds :data:`MAX_JSON_DEPTH`.

    Streams over ``text`` in chunks of :data:`_DEPTH_CHUNK` characters with array operations:
    the extra memory is a few times one chunk, whatever the size of ``text``, and the time
    is linear (no copy of the whole text, no regular expression whose state grows with it).
    A character is escaped when an odd run of backslashes precedes it.
    """
    depth = deepest = 0
    values = 1
    in_string = False
    run = 0  # backslashes ending the previous chunk
    for start in range(0, len(text), _DEPTH_CHUNK):
        chunk = text[start:start + _DEPTH_CHUNK]
        data = chunk.encode("utf-8", "surrogatepass") if isinstance(chunk, str) else chunk
        b = np.frombuffer(data, dtype=np.uint8)
        slash = b == _BACKSLASH
        idx = np.arange(b.size, dtype=np.int64)
        last_plain = np.maximum.accumulate(np.where(slash, -1 - run, idx))
        before = np.empty(b.size, dtype=np.int64)  # backslashes just before each character
        before[0] = run
        before[1:] = idx[:-1] - last_plain[:-1]
        plain = before % 2 == 0  # not escaped
        quote = (b == _QUOTE) & plain
        parity = np.cumsum(quote, dtype=np.int32) % 2
        outside = (parity == int(in_string)) & ~quote & plain
        step = ((b == _OPEN1) | (b == _OPEN2)).astype(np.int32) \
            - ((b == _CLOSE1) | (b == _CLOSE2))
        levels = np.cumsum(np.where(outside, step, 0), dtype=np.int64) + depth
        values += int(np.count_nonzero(outside & ((b == _COMMA) | (b == _COLON))))
        deepest = max(deepest, int(levels.max()))
        depth = int(levels[-1])
        in_string ^= bool(parity[-1])
        run = int(b.size - 1 - last_plain[-1])
        if deepest > MAX_JSON_DEPTH:
            break
    return deepest, values


def _json_depth(text: str | bytes) -> int:
    """Deepest bracket nesting of JSON ``text`` outside strings (see :func:`_json_shape`)."""
    return _json_shape(text)[0]


def parse_json(text: str, what: str, fix: str = "re-create it with ghofl") -> Any:
    """Parse JSON from a file header defensively.

    Refuses text longer than :data:`MAX_HEADER_BYTES`, nesting deeper than
    :data:`MAX_JSON_DEPTH`, more than :data:`MAX_JSON_VALUES` values, NaN/Infinity, numbers
    that overflow a float64 or have more than :data:`MAX_INT_DIGITS` digits, and duplicate
    keys, with a :class:`StatsFormatError` naming ``what`` and ending with ``fix``.
    """
    if len(text) > MAX_HEADER_BYTES:
        raise StatsFormatError(
            f"{what} is {len(text)} characters long, more than the {MAX_HEADER_BYTES} "
            f"allowed; it is corrupt, {fix}"
        )
    depth, values = _json_shape(text)
    if depth > MAX_JSON_DEPTH:
        raise StatsFormatError(
            f"{what} nests JSON more than {MAX_JSON_DEPTH} levels deep; it is corrupt, {fix}"
        )
    if values > MAX_JSON_VALUES:
        raise StatsFormatError(
            f"{what} holds about {values} JSON values, more than the {MAX_JSON_VALUES} "
            f"allowed; it is corrupt, {fix}"
        )
    try:
        return json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_no_duplicates,
        )
    except _JSONRefused as exc:
        raise StatsFormatError(f"{what} holds {exc}; it is corrupt, {fix}") from None
    except (ValueError, RecursionError) as exc:
        raise StatsFormatError(
            f"{what} is not valid JSON ({exc}); it is corrupt, {fix}"
        ) from None
    except MemoryError:
        raise StatsFormatError(
            f"{what} ({len(text)} characters) needs more memory to parse than is available; "
            f"it is corrupt or hostile, {fix}"
        ) from None


