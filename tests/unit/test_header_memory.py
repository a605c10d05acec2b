"""Header checks in bounded memory: the JSON depth/size scan streams (issue 25)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.errors import StatsFormatError
from ghofl.stats import _json as codec
from ghofl.stats.codec import MAX_JSON_VALUES, load_stats, parse_json

HEADER = 68_900_000  # bytes, under the 100 MB cap


def _reference(text: str) -> tuple[int, int]:
    """Depth and value count, one character at a time (an escape works everywhere)."""
    depth = deepest = 0
    values, in_string, escaped = 1, False, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_string = not in_string
        elif not in_string and ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif not in_string and ch in "]}":
            depth -= 1
        elif not in_string and ch in ",:":
            values += 1
    return deepest, values


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}"\\,:a é', max_size=80), st.sampled_from([1, 2, 7, 1 << 18]))
def test_streaming_scan_equals_a_character_walk(text: str, chunk: int) -> None:
    expected = _reference(text)
    if expected[0] > codec.MAX_JSON_DEPTH:
        return  # the scan stops early past the limit
    old = codec._DEPTH_CHUNK
    codec._DEPTH_CHUNK = chunk
    try:
        assert codec._json_shape(text) == expected
        assert codec._json_shape(text.encode()) == expected
    finally:
        codec._DEPTH_CHUNK = old


def test_too_many_values_are_refused() -> None:
    text = "[" + "0," * MAX_JSON_VALUES + "0]"
    with pytest.raises(StatsFormatError, match=r"holds about \d+ JSON values, more than"):
        parse_json(text, "the header")


def _peak_refusal(path: Path, body: bytes, match: str) -> float:
    path.write_bytes(len(body).to_bytes(8, "little") + body)
    del body
    tracemalloc.start()
    try:
        with pytest.raises(StatsFormatError, match=match):
            load_stats(path)
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
        path.unlink()


@pytest.mark.slow
@pytest.mark.parametrize(("body", "match"), [
    (b" " * (HEADER - 40) + b"[" * 40, "nests JSON more than 32 levels deep"),
    (b"[" + b"1," * ((HEADER - 2) // 2) + b"1]", "JSON values, more than"),
    (b'{"a":"' + b'\\"' * ((HEADER - 8) // 2) + b'"}', "tensor 'a' is not described"),
], ids=["deep-at-the-end", "many-values", "escaped-string"])
def test_a_huge_header_is_refused_in_bounded_memory(tmp_path: Path, body: bytes,
                                                    match: str) -> None:
    assert len(body) >= HEADER - 2
    peak = _peak_refusal(tmp_path / "big.ghs", body, match)
    assert peak < 300, f"peak {peak:.0f} MB"
