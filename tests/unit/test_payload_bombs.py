"""Payload bombs are refused from the header alone, and the header parses in bounded memory.

Issue 44: a payload declaring a 3 GiB sparse extra tensor was hashed completely before it was
refused, and a large header cost about three times its size to parse. The declared tensors
(names, dtypes, shapes, byte ranges) are now checked against the schema of the declared mode,
C, d and held-out section before any array byte is read or hashed, on every path that reads a
payload: ``load_stats``, ``read_stats_header``, ``ghofl stats show`` and the Flower records.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.cli.main import main
from ghofl.errors import ProtocolError, StatsFormatError
from ghofl.stats import compute_stats, load_stats, save_stats
from ghofl.stats.codec import read_stats_header
from ghofl.stats.header import StatsHeader
from tests.helpers import gaussian_mixture

GIB3 = 3 << 30
#: Upper bound on a refusal from the header (the point: no pass over 3 GiB; the margin is
#: for a loaded machine).
SECONDS = 5.0


def _stats(holdout: float = 0.0) -> Any:
    x, y = gaussian_mixture(3, num_classes=2, dim=4, n=60)
    return compute_stats(x, y, ("a", "b"), holdout_fraction=holdout, holdout_seed=1)


def _parts(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8:8 + n])
    return doc.pop("__metadata__"), doc


def _bomb(path: Path, edit: Callable[[dict[str, Any]], None], extra: int = 0) -> Path:
    """A valid file's header with its tensor table edited, then relaid out contiguously in
    name order; the data section is a sparse file of the declared size (plus ``extra``)."""
    save_stats(_stats(), path)
    meta, table = _parts(path)
    edit(table)
    offset = 0
    for name in sorted(table):
        t = table[name]
        if "data_offsets" not in t:
            size = 8 * int(np.prod(t["shape"], dtype=np.int64))
            t["data_offsets"] = [offset, offset + size]
        offset = t["data_offsets"][1]
    head = json.dumps({"__metadata__": meta, **table}, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        f.truncate(8 + len(head) + offset + extra)
    return path


def _extra_tensor(table: dict[str, Any]) -> None:
    table["zz_extra"] = {"dtype": "F64", "shape": [GIB3 // 8]}


def _huge_sums(table: dict[str, Any]) -> None:
    table["sums"] = {"dtype": "F64", "shape": [2, GIB3 // 16]}


def _relaid(table: dict[str, Any]) -> None:
    for t in table.values():
        t.pop("data_offsets")


def _wide_span(table: dict[str, Any]) -> None:
    _relaid(table)
    table["sums"]["data_offsets"] = [0, GIB3]  # shape (2, 4): 64 bytes
    table["class_scatter_triu"]["data_offsets"] = [GIB3, GIB3 + 160]
    table["counts"]["data_offsets"] = [GIB3 + 160, GIB3 + 176]


BOMBS = [
    (lambda t: (_relaid(t), _extra_tensor(t)), 0,
     r"holds malformed statistics: statistics payload of mode 'full' holds unexpected "
     r"array\(s\) 'zz_extra'; it holds exactly counts, sums, class_scatter_triu"),
    (lambda t: (_relaid(t), _huge_sums(t)), 0,
     r"holds malformed statistics: array 'sums' must have shape \(2, 4\) for C=2 classes and "
     r"d=4; got \(2, 201326592\)"),
    (_wide_span, 0, r"tensor 'sums' of shape \(2, 4\) needs 64 bytes but spans 3221225472"),
    (_relaid, GIB3, r"the tensors declare 240 bytes of data but the file holds 3221225712"),
]
BOMB_IDS = ["extra-tensor", "wrong-shape", "byte-range", "trailing-bytes"]


@pytest.mark.parametrize(("edit", "extra", "match"), BOMBS, ids=BOMB_IDS)
def test_a_sparse_bomb_is_refused_from_its_header(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], extra: int, match: str
) -> None:
    path = _bomb(tmp_path / "bomb.ghs", edit, extra)
    assert path.stat().st_size > GIB3
    for read in (load_stats, read_stats_header):
        start = time.perf_counter()
        with pytest.raises(StatsFormatError, match=match):
            read(path)
        assert time.perf_counter() - start < SECONDS, read.__name__


def _cli(args: list[Any]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main([str(a) for a in args])
    return rc, err.getvalue()


def test_stats_show_refuses_the_bomb_in_one_line(tmp_path: Path) -> None:
    path = _bomb(tmp_path / "bomb.ghs", lambda t: (_relaid(t), _extra_tensor(t)))
    start = time.perf_counter()
    rc, err = _cli(["stats", "show", path])
    assert time.perf_counter() - start < SECONDS
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ghofl: error: ")
    assert "holds unexpected array(s) 'zz_extra'" in err


def test_aggregate_refuses_the_bomb_before_hashing_it(tmp_path: Path) -> None:
    good = tmp_path / "good.ghs"
    save_stats(_stats(), good)
    path = _bomb(tmp_path / "bomb.ghs", lambda t: (_relaid(t), _extra_tensor(t)))
    start = time.perf_counter()
    rc, err = _cli(["aggregate", good, path, "--out", tmp_path / "total.ghs"])
    assert time.perf_counter() - start < SECONDS
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ghofl: error: ")
    assert "holds unexpected array(s) 'zz_extra'" in err
    assert not (tmp_path / "total.ghs").exists()


def test_read_stats_header_reads_no_data(tmp_path: Path) -> None:
    stats = _stats(holdout=0.25)
    path = tmp_path / "s.ghs"
    save_stats(stats, path, transport_dtype="float32")
    assert read_stats_header(path) == StatsHeader.of(stats, "float32")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # a data byte: the digest no longer matches
    path.write_bytes(bytes(raw))
    assert read_stats_header(path) == StatsHeader.of(stats, "float32")  # never hashed
    with pytest.raises(StatsFormatError, match=r"is corrupt: the SHA-256 of its content"):
        load_stats(path)


def test_a_holdout_section_the_metadata_does_not_declare_is_refused(tmp_path: Path) -> None:
    held = tmp_path / "held.ghs"
    save_stats(_stats(holdout=0.25), held)
    _, table = _parts(held)

    def add_holdout(t: dict[str, Any]) -> None:
        _relaid(t)
        t["holdout.sums"] = {"dtype": "F64", "shape": table["holdout.sums"]["shape"]}

    path = _bomb(tmp_path / "bomb.ghs", add_holdout)
    with pytest.raises(StatsFormatError, match=r"holds unexpected array\(s\) 'holdout\.sums'"):
        read_stats_header(path)


# ---------------------------------------------------------------------- Flower records
@pytest.fixture
def record() -> Any:
    pytest.importorskip("flwr", reason="flwr is not installed")
    from ghofl.integrations.flower.records import stats_to_record

    return stats_to_record(_stats())


def _record_cases() -> list[tuple[str, Callable[[Any, Any], None], str]]:
    def extra(arrays: Any, array: Any) -> None:
        arrays["zz_extra"] = array(dtype="float64", shape=(GIB3 // 8,),
                                   stype="numpy.ndarray", data=b"")

    def shape(arrays: Any, array: Any) -> None:
        arrays["sums"] = array(dtype="float64", shape=(2, GIB3 // 16), stype="numpy.ndarray",
                               data=b"")

    def dtype(arrays: Any, array: Any) -> None:
        arrays["counts"] = array(dtype="float64", shape=(2,), stype="numpy.ndarray", data=b"")

    def size(arrays: Any, array: Any) -> None:
        good = arrays["sums"]
        arrays["sums"] = array(dtype=good.dtype, shape=tuple(good.shape), stype=good.stype,
                               data=good.data + bytes(1 << 20))

    return [
        ("extra", extra, r"statistics payload of mode 'full' holds unexpected array\(s\) "
                         r"'zz_extra'"),
        ("shape", shape, r"array 'sums' must have shape \(2, 4\) for C=2 classes and d=4; "
                         r"got \(2, 201326592\)"),
        ("dtype", dtype, r"array 'counts' has dtype float64 but must be int64"),
        ("size", size, r"array 'sums' carries 1048768 bytes, more than the 4160 its shape "
                       r"\(2, 4\) needs"),
    ]


@pytest.mark.parametrize(("case", "edit", "match"), _record_cases(),
                         ids=[c[0] for c in _record_cases()])
def test_flower_records_are_checked_before_any_array_is_decoded(
    record: Any, case: str, edit: Callable[[Any, Any], None], match: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr.app import Array

    from ghofl.integrations.flower.records import stats_from_record

    edit(record["ghofl-stats"], Array)

    def no_decode(self: Any) -> Any:
        raise AssertionError("an array was decoded before the declared layout was checked")

    monkeypatch.setattr(Array, "numpy", no_decode)
    with pytest.raises(ProtocolError, match=rf"^the ghofl statistics record is invalid: {match}"):
        stats_from_record(record)


# ---------------------------------------------------------------------- header memory
SIZE = 20_000_000  # bytes of header


def _padded(path: Path, how: str) -> int:
    """A statistics file whose header is about SIZE bytes: a long metadata string (refused
    as an unknown key) or trailing padding spaces (a valid file)."""
    save_stats(_stats(), path)
    meta, table = _parts(path)
    data = path.read_bytes()[-240:]  # counts (2,), sums (2, 4), class_scatter_triu (2, 10)
    if how == "string":
        meta["zpad"] = "x" * SIZE
    head = json.dumps({"__metadata__": meta, **table}, separators=(",", ":")).encode()
    if how == "spaces":
        head += b" " * SIZE
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)
    return len(head)


@pytest.mark.parametrize("how", ["string", "spaces"])
def test_a_large_header_parses_within_twice_its_size(tmp_path: Path, how: str) -> None:
    path = tmp_path / "big.ghs"
    size = _padded(path, how)
    assert size >= SIZE
    tracemalloc.start()
    try:
        if how == "string":
            with pytest.raises(StatsFormatError, match=r"has the unknown header key 'zpad'"):
                load_stats(path)
        else:
            assert load_stats(path).n_samples == 60
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * size + (1 << 20), f"peak {peak / size:.2f}x the header's {size} bytes"
