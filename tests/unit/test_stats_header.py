"""The statistics header: one declaration, two spellings (file metadata and Flower records)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import StatsFormatError, StatsValidationError
from ghofl.stats import ClientStats, compute_stats, load_stats, save_stats
from ghofl.stats.codec import STATS_KEYS, through_transport
from ghofl.stats.header import FORMAT, HEADER_FIELDS, StatsHeader, check_envelope
from ghofl.stats.meta import StatsMeta

X = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [3.0, 0.0], [0.5, 0.5], [2.0, 2.0],
              [0.0, 1.0], [1.0, 3.0]])
Y = np.array([0, 1, 0, 1, 0, 1, 0, 1])
DIAG_META = ('{"classes": ["a", "b"], "clip_norm": 2.5, "dim": 2, "encoder": null, '
             '"mode": "diag", "projection": null, "schema_version": 2}')
HELD_META = ('{"classes": ["a", "b"], "clip_norm": 2.5, "dim": 2, "encoder": null, '
             '"holdout_fraction": 0.5, "mode": "full", "projection": null, '
             '"schema_version": 3}')
RECORD = "the ghofl statistics record"


def _plain() -> ClientStats:
    return compute_stats(X, Y, ("a", "b"), "diag", clip_norm=2.5)


def _held() -> ClientStats:
    return compute_stats(X, Y, ("a", "b"), "full", clip_norm=2.5, holdout_fraction=0.5,
                         holdout_seed=1)


def _cases() -> dict[str, tuple[ClientStats, str]]:
    return {"plain": (_plain(), "float64"), "held32": (_held(), "float32"),
            "rounded": (through_transport(_plain(), "float32"), "float64")}


#: The file headers (without the digest) and whole-file SHA-256s ghofl wrote for these
#: statistics before the header was declared once (main at e4ba2b2): they must not change.
OLD_FILE_HEADERS: dict[str, tuple[dict[str, str], str]] = {
    "plain": ({"format": "ghofl.stats", "schema_version": "2", "meta": DIAG_META,
               "n_clipped": "3"},
              "f17bf6f12dd4ca6d4a834aaff8e04b5c0a0b179a643d0e5b2b58f21073e5ecd6"),
    "held32": ({"format": "ghofl.stats", "schema_version": "3", "meta": HELD_META,
                "n_clipped": "3", "holdout_n_clipped": "1", "transport_dtype": "float32"},
               "22c5bced882d541e5baf7c9207fbe7180dde19eea21aa8cbdbabb57962f71c68"),
    "rounded": ({"format": "ghofl.stats", "schema_version": "3", "meta": DIAG_META,
                 "n_clipped": "3", "rounded_to": "float32"},
                "c578f2d03e12a9ff6fa3ce6da407907da2c66632897de9ce76e448a9d482853e"),
}
#: The records entries ghofl sent for them (without ``records-version``); ``rounded-to`` is new.
RECORD_ENTRIES: dict[str, dict[str, Any]] = {
    "plain": {"meta": DIAG_META, "n_clipped": 3},
    "held32": {"meta": HELD_META, "n_clipped": 3, "holdout-n_clipped": 1,
               "transport-dtype": "float32"},
    "rounded": {"meta": DIAG_META, "n_clipped": 3, "rounded-to": "float32"},
}


def _file_metadata(path: Path) -> dict[str, str]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    meta: dict[str, str] = json.loads(raw[8:8 + n])["__metadata__"]
    return meta


# ---------------------------------------------------------------------- rendering
def test_the_declaration_matches_the_dataclass() -> None:
    assert [f.name for f in dataclasses.fields(StatsHeader)] == [s.name for s in HEADER_FIELDS]
    assert StatsHeader.keys("file") == STATS_KEYS == {
        "format", "schema_version", "meta", "n_clipped", "holdout_n_clipped",
        "transport_dtype", "rounded_to", "noise_sigma", "noise_shrinkage"}
    assert StatsHeader.keys("records") == {
        "meta", "n_clipped", "holdout-n_clipped", "transport-dtype", "rounded-to",
        "noise-sigma", "noise-shrinkage"}


@pytest.mark.parametrize("name", list(OLD_FILE_HEADERS))
def test_files_are_byte_identical_to_before(tmp_path: Path, name: str) -> None:
    stats, dtype = _cases()[name]
    header, sha = OLD_FILE_HEADERS[name]
    entries = StatsHeader.of(stats, dtype).to_entries("file")
    assert list(entries.items()) == list(header.items())  # same keys, values and order
    p = tmp_path / "s.ghs"
    save_stats(stats, p, dtype)
    written = _file_metadata(p)
    assert list(written)[:-1] == list(header) and list(written)[-1] == "content_sha256"
    assert hashlib.sha256(p.read_bytes()).hexdigest() == sha


@pytest.mark.parametrize("name", list(RECORD_ENTRIES))
def test_record_entries(name: str) -> None:
    stats, dtype = _cases()[name]
    assert StatsHeader.of(stats, dtype).to_entries("records") == RECORD_ENTRIES[name]


@pytest.mark.parametrize("style", ["file", "records"])
@pytest.mark.parametrize("name", list(OLD_FILE_HEADERS))
def test_round_trip_in_both_styles(style: Any, name: str) -> None:
    stats, dtype = _cases()[name]
    header = StatsHeader.of(stats, dtype)
    entries = header.to_entries(style)
    assert StatsHeader.from_entries(entries, style, "x") == header
    assert all(isinstance(v, str) for v in entries.values()) or style == "records"


def test_float32_transport_needs_no_rounded_to_entry() -> None:
    rounded = through_transport(_plain(), "float32")
    header = StatsHeader.of(rounded, "float32")
    assert header.rounded_to == "float64" and "rounded_to" not in header.to_entries("file")
    assert StatsHeader.of(rounded).rounded_to == "float32"


def test_schema_version_and_stats_from() -> None:
    stats, _ = _cases()["held32"]
    header = StatsHeader.of(stats, "float32")
    assert header.schema_version == 3 and StatsHeader.of(_plain()).schema_version == 2
    from ghofl.stats.codec import stats_tensors

    back = header.stats_from(stats_tensors(stats, "float32"))
    assert back.holdout is not None and back.holdout.n_clipped == 1 and back.n_clipped == 3


def test_direct_construction_is_checked() -> None:
    meta = _plain().meta
    with pytest.raises(StatsValidationError, match=r"n_clipped is -1; expected a non-negative "
                       "integer"):
        StatsHeader(meta, n_clipped=-1)
    with pytest.raises(StatsValidationError, match=r"transport_dtype is 'float16'; expected "
                       r"'float32' \(or no entry for float64\)"):
        StatsHeader(meta, transport_dtype="float16")
    with pytest.raises(StatsValidationError, match="holdout_n_clipped but its metadata has no "
                       "held-out section"):
        StatsHeader(meta, holdout_n_clipped=0)
    with pytest.raises(ValueError, match="the header style must be one of file, records"):
        StatsHeader(meta).to_entries("json")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- back-compat
def test_headers_as_older_ghofl_wrote_them_load() -> None:
    v1_meta = json.dumps({"classes": ["a", "b"], "dim": 2, "encoder": None, "mode": "diag",
                          "projection": None, "schema_version": 1})
    v1 = StatsHeader.from_entries({"format": FORMAT, "schema_version": "1", "meta": v1_meta},
                                  "file", "'old.ghs'")
    assert v1 == StatsHeader(StatsMeta("diag", 2, ("a", "b")))  # no n_clipped: 0
    v2 = StatsHeader.from_entries(OLD_FILE_HEADERS["plain"][0], "file", "'v2.ghs'")
    assert v2.n_clipped == 3 and v2.transport_dtype == v2.rounded_to == "float64"
    # a held-out file without its holdout_n_clipped entry reads with no count (0)
    held = {k: v for k, v in OLD_FILE_HEADERS["held32"][0].items() if k != "holdout_n_clipped"}
    assert StatsHeader.from_entries(held, "file", "'h.ghs'").holdout_n_clipped is None
    # records as ghofl sent them before rounded-to existed
    old_record = {"records-version": 2, "meta": HELD_META, "n_clipped": 3,
                  "holdout-n_clipped": 1, "transport-dtype": "float32"}
    got = StatsHeader.from_entries(old_record, "records", RECORD)
    assert got == StatsHeader.of(_held(), "float32")


def test_an_old_file_loads(tmp_path: Path) -> None:
    from ghofl.stats.codec import stats_tensors, write_safetensors

    stats = _plain()
    write_safetensors(tmp_path / "o.ghs", stats_tensors(stats), OLD_FILE_HEADERS["plain"][0])
    assert load_stats(tmp_path / "o.ghs").allclose(stats, rtol=0)


def test_records_carry_rounded_to() -> None:
    pytest.importorskip("flwr", reason="flwr is not installed")
    from ghofl.integrations.flower.records import (
        RECORDS_VERSION,
        stats_from_record,
        stats_to_record,
    )

    rounded = through_transport(_plain(), "float32")
    rd = stats_to_record(rounded)
    assert RECORDS_VERSION == 3  # protocol version 3 (the reveal stage) bumped the records
    assert dict(rd["ghofl-stats-meta"]) == {"records-version": RECORDS_VERSION,
                                            **RECORD_ENTRIES["rounded"]}
    assert stats_from_record(rd).rounding == rounded.rounding > 0
    del rd["ghofl-stats-meta"]["rounded-to"]  # as older ghofl sent it: still read
    assert stats_from_record(rd).rounding == 0.0


# ---------------------------------------------------------------------- errors
def _file(**changes: str | None) -> dict[str, str]:
    out = dict(OLD_FILE_HEADERS["plain"][0])
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


FIX = "the file is corrupt, re-create it with ghofl"
FILE_ERRORS = [
    (_file(meta=None), r"^'f' has a missing or corrupt metadata header \(no 'meta' entry\); "
                       r"re-create it with ghofl$"),
    (_file(meta="{x"), r"^'f' has a missing or corrupt metadata header: the metadata header "
                       r"is not valid JSON"),
    (_file(meta="[1]"), r"^statistics metadata must be a JSON object; got an array"),
    (_file(n_clipped="-3"), rf"^'f' has header n_clipped '-3'; expected a non-negative decimal "
                            rf"integer; {FIX}$"),
    (_file(n_clipped="1" * 20), r"^'f' has header n_clipped '1{20}'; expected a non-negative"),
    (_file(n_clipped="٣"), r"^'f' has header n_clipped '٣'; expected a non-negative decimal"),
    (_file(schema_version="3", holdout_n_clipped="0"),
     rf"^'f' has the header entry holdout_n_clipped but no held-out section \(its metadata has "
     rf"no holdout_fraction\); {FIX}$"),
    (_file(schema_version="3", transport_dtype="float16"),
     rf"^'f' has header transport_dtype 'float16'; expected 'float32' \(or no entry for "
     rf"float64\); {FIX}$"),
    (_file(schema_version="3", rounded_to="float64"),
     r"^'f' has header rounded_to 'float64'; expected 'float32' \(or no entry for float64\)"),
    (_file(transport_dtype="float32"),
     rf"^'f' has schema version 2 but a transport_dtype, which version 3 introduced; {FIX}$"),
    (_file(rounded_to="float32"), r"^'f' has schema version 2 but a rounded_to, which version 3"),
    (_file(format="other"), r"^'f' is not a ghofl statistics file \(format tag 'other', "
                            r"expected 'ghofl.stats'\)$"),
    (_file(schema_version="4"), r"^'f' uses statistics schema version 4, newer than this ghofl "
                                r"supports \(3\); upgrade ghofl$"),
    (_file(schema_version="x"), r"^'f' uses statistics schema version -1, older than this"),
]


@pytest.mark.parametrize(("entries", "match"), FILE_ERRORS)
def test_file_errors(entries: dict[str, str], match: str) -> None:
    with pytest.raises(StatsFormatError, match=match):
        StatsHeader.from_entries(entries, "file", "'f'")


def test_a_non_string_file_value_is_refused() -> None:
    with pytest.raises(StatsFormatError, match=r"^'f' has header n_clipped of type int; expected "
                       "a string; the file is corrupt"):
        StatsHeader.from_entries({**_file(), "n_clipped": 3}, "file", "'f'")


def _rec(**changes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"records-version": 2, **RECORD_ENTRIES["plain"]}
    for k, v in changes.items():
        key = k.replace("__", "-")
        if v is None:
            out.pop(key, None)
        else:
            out[key] = v
    return out


R = "the ghofl statistics record"
RECORD_ERRORS = [
    (_rec(meta=None), rf"^{R} lacks the key 'meta'; it is malformed$"),
    (_rec(n_clipped=None), rf"^{R} lacks the key 'n_clipped'; it is malformed$"),
    (_rec(meta=b"{}"), rf"^{R}'s key 'meta' must be a string; got bytes$"),
    (_rec(meta="{x"), rf"^{R}'s key 'meta' is not valid JSON .*; it is corrupt, re-send it with "
                      r"ghofl$"),
    (_rec(meta='{"x": NaN}'), rf"^{R}'s key 'meta' holds the non-standard number NaN"),
    (_rec(meta="[1]"), rf"^{R} is invalid: statistics metadata must be a JSON object"),
    (_rec(n_clipped="3"), rf"^{R}'s key 'n_clipped' must be an integer; got str$"),
    (_rec(n_clipped=True), rf"^{R}'s key 'n_clipped' must be an integer; got bool$"),
    (_rec(n_clipped=-1), rf"^{R}'s key 'n_clipped' is -1; expected a non-negative integer; it is "
                         r"malformed$"),
    (_rec(n_clipped=10**19), rf"^{R}'s key 'n_clipped' is 10000000000000000000; expected a "
                             r"non-negative integer"),
    (_rec(holdout__n_clipped=0),
     rf"^{R} has the key 'holdout-n_clipped' but no held-out section \(its metadata has no "
     r"holdout_fraction\); it is malformed$"),
    (_rec(transport__dtype="float16"),
     rf"^{R}'s key 'transport-dtype' is 'float16'; expected 'float32' \(or no entry for "
     r"float64\); it is malformed$"),
    (_rec(transport__dtype=32), rf"^{R}'s key 'transport-dtype' must be a string; got int$"),
    (_rec(rounded__to="float64"), rf"^{R}'s key 'rounded-to' is 'float64'; expected 'float32'"),
]


@pytest.mark.parametrize(("entries", "match"), RECORD_ERRORS)
def test_record_errors(entries: dict[str, Any], match: str) -> None:
    with pytest.raises(StatsFormatError, match=match):
        StatsHeader.from_entries(entries, "records", R)


def test_record_errors_reach_the_flower_codec_as_protocol_errors() -> None:
    pytest.importorskip("flwr", reason="flwr is not installed")
    from ghofl.errors import ProtocolError
    from ghofl.integrations.flower.records import stats_from_record, stats_to_record

    rd = stats_to_record(_plain())
    rd["ghofl-stats-meta"]["holdout-n_clipped"] = 0
    with pytest.raises(ProtocolError, match=rf"^{R} has the key 'holdout-n_clipped' but no "
                       "held-out section"):
        stats_from_record(rd)


def test_check_envelope_bounds_are_the_callers() -> None:
    header = {"format": "ghofl.head", "schema_version": "3"}
    assert check_envelope(header, "'h'", "ghofl.head", "head") == 3
    with pytest.raises(StatsFormatError, match=r"uses head schema version 3, newer than this "
                       r"ghofl supports \(2\)"):
        check_envelope(header, "'h'", "ghofl.head", "head", newest=2)
