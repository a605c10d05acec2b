"""Statistics file format: round trips, packing, atomicity and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import StatsFormatError, WriteError
from ghofl.stats import (
    EncoderInfo,
    ProjectionSpec,
    compute_stats,
    load_stats,
    payload_nbytes,
    save_stats,
)
from ghofl.stats.codec import pack_upper, unpack_upper, write_safetensors
from tests.helpers import gaussian_mixture


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
def test_round_trip_is_bit_exact(tmp_path: Path, mode: str) -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=6, n=90)
    enc = EncoderInfo("toy", 6, weights_hash="abc", preprocessing="none", resolution=32)
    s = compute_stats(x, y, ("a", "b", "c"), mode=mode, encoder=enc)  # type: ignore[arg-type]
    size = save_stats(s, tmp_path / "s.ghs")
    back = load_stats(tmp_path / "s.ghs")
    assert back.meta == s.meta
    for name, arr in s.arrays().items():
        other = back.arrays()[name]
        assert (arr is None and other is None) or np.array_equal(arr, other)
    assert size >= payload_nbytes(s)
    assert [p.name for p in tmp_path.iterdir()] == ["s.ghs"]  # no temporary left behind


def test_projection_metadata_round_trips(tmp_path: Path) -> None:
    x, y = gaussian_mixture(1, num_classes=2, dim=10, n=40)
    s = compute_stats(x, y, 2, projection=ProjectionSpec(5, 10, 4))
    save_stats(s, tmp_path / "p.ghs")
    assert load_stats(tmp_path / "p.ghs").meta.projection == ProjectionSpec(5, 10, 4)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("full", 3 * 8 + 3 * 4 * 8 + 3 * (4 * 5 // 2) * 8),  # N, A, triu(S_c); B and D derived
        ("pooled", 3 * 8 + 2 * (3 * 4 * 8) + (4 * 5 // 2) * 8),
        ("diag", 3 * 8 + 2 * (3 * 4 * 8)),
    ],
)
def test_payload_bytes_use_upper_triangles(mode: str, expected: int) -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=30)
    s = compute_stats(x, y, 3, mode=mode)  # type: ignore[arg-type]
    assert payload_nbytes(s) == expected


def test_pack_unpack_inverse() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 5, 5))
    a = a + np.swapaxes(a, 1, 2)
    np.testing.assert_array_equal(unpack_upper(pack_upper(a), 5), a)
    with pytest.raises(StatsFormatError, match=r"expected d\(d\+1\)/2 = 15 for d=5"):
        unpack_upper(np.zeros(14), 5)


def _saved(tmp_path: Path) -> Path:
    x, y = gaussian_mixture(3, num_classes=2, dim=4, n=30)
    p = tmp_path / "s.ghs"
    save_stats(compute_stats(x, y, 2), p)
    return p


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(
        StatsFormatError, match=r"statistics file '.*nope.ghs' does not exist; check the path"
    ):
        load_stats(tmp_path / "nope.ghs")


def test_truncated_file(tmp_path: Path) -> None:
    p = _saved(tmp_path)
    p.write_bytes(p.read_bytes()[:-40])
    with pytest.raises(
        StatsFormatError, match=r"is not a readable ghofl statistics file .*truncated, corrupt"
    ):
        load_stats(p)


def test_foreign_file(tmp_path: Path) -> None:
    p = tmp_path / "x.npz"
    np.savez(p, x=np.zeros(3))
    with pytest.raises(StatsFormatError, match="is not a readable ghofl statistics file"):
        load_stats(p)


def _rewrite_header(p: Path, **changes: str) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(p), framework="np") as f:
        meta = dict(f.metadata())
    meta.update(changes)
    write_safetensors(p, load_file(str(p)), meta)  # a valid digest: the header is what is bad


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"format": "other.thing"}, r"is not a ghofl statistics file \(format tag 'other.thing'"),
        (
            {"schema_version": "99"},
            r"schema version 99, newer than this ghofl supports \(3\); upgrade ghofl",
        ),
        ({"schema_version": "0"}, r"schema version 0, older than this ghofl supports"),
        ({"meta": "{not json"}, "has a missing or corrupt metadata header"),
        ({"meta": json.dumps({"mode": "full"})}, "statistics metadata is malformed"),
    ],
)
def test_bad_headers(tmp_path: Path, changes: dict[str, str], match: str) -> None:
    p = _saved(tmp_path)
    _rewrite_header(p, **changes)
    with pytest.raises(StatsFormatError, match=match):
        load_stats(p)


def test_corrupted_values_are_rejected(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    p = _saved(tmp_path)
    with safe_open(str(p), framework="np") as f:
        meta = dict(f.metadata())
    t = load_file(str(p))
    t["sums"] = t["sums"].copy()
    t["sums"][0, 0] = np.nan
    write_safetensors(p, t, meta)  # re-digested: validation, not the digest, must refuse it
    with pytest.raises(Exception, match="sums contains NaN or infinite values"):
        load_stats(p)


def test_failed_write_leaves_previous_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _saved(tmp_path)
    before = p.read_bytes()
    import errno

    import ghofl.stats.codec as codec

    def boom(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(codec.os, "fsync", boom)
    x, y = gaussian_mixture(9, num_classes=2, dim=4, n=30)
    with pytest.raises(
        WriteError,
        match=r"could not write '.*s\.ghs' \(No space left on device\); the previous file, if "
        r"any, is unchanged and no temporary file is left; free disk space",
    ):
        save_stats(compute_stats(x, y, 2), p)
    assert p.read_bytes() == before
    assert [q.name for q in tmp_path.iterdir()] == ["s.ghs"]


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
@pytest.mark.parametrize(("c", "d"), [(2, 3), (5, 9)])
def test_expected_payload_nbytes_matches_real_payload(mode: str, c: int, d: int) -> None:
    from ghofl.stats.codec import expected_payload_nbytes

    x, y = gaussian_mixture(c + d, num_classes=c, dim=d, n=10 * c)
    assert expected_payload_nbytes(mode, c, d) == payload_nbytes(compute_stats(x, y, c, mode=mode))  # type: ignore[arg-type]


def test_header_records_n_clipped(tmp_path: Path) -> None:
    from safetensors import safe_open

    x, y = gaussian_mixture(4, num_classes=2, dim=3, n=40, sep=4.0)
    s = compute_stats(x, y, 2, clip_norm=1.0)
    save_stats(s, tmp_path / "c.ghs")
    with safe_open(str(tmp_path / "c.ghs"), framework="np") as f:
        header = f.metadata()
    assert s.n_clipped > 0 and header["n_clipped"] == str(s.n_clipped)
    assert header["schema_version"] == "2"
    assert json.loads(header["meta"])["clip_norm"] == 1.0


def test_malformed_arrays_name_the_file(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file

    p = _saved(tmp_path)  # full mode, C=2, d=4
    with safe_open(str(p), framework="np") as f:
        meta = dict(f.metadata())
    t = load_file(str(p))
    t["class_scatter_triu"] = t["class_scatter_triu"][:, :-1].copy()
    write_safetensors(p, t, meta)
    with pytest.raises(
        StatsFormatError,
        match=r"'.*s.ghs' holds malformed statistics: array 'class_scatter_triu' must have "
        r"shape \(2, 10\) \(row-major upper triangles\) for C=2 classes and d=4; got \(2, 9\)",
    ):
        load_stats(p)
    del t["class_scatter_triu"]
    write_safetensors(p, t, meta)
    with pytest.raises(
        StatsFormatError,
        match=r"'.*s.ghs' holds malformed statistics: statistics payload lacks the array "
        r"'class_scatter_triu'; it is corrupt",
    ):
        load_stats(p)


# ---------------------------------------------------------------------- hardened reader
def _parts(p: Path) -> tuple[dict[str, object], bytes]:
    raw = p.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _put(p: Path, header: dict[str, object], data: bytes) -> None:
    head = json.dumps(header).encode()
    p.write_bytes(len(head).to_bytes(8, "little") + head + data)


def test_new_files_carry_a_content_digest_and_flips_are_refused(tmp_path: Path) -> None:
    p = _saved(tmp_path)
    header, _ = _parts(p)
    digest = header["__metadata__"]["content_sha256"]  # type: ignore[index]
    assert isinstance(digest, str) and len(digest) == 64
    raw = bytearray(p.read_bytes())
    raw[-3] ^= 0x01  # one bit of one float
    p.write_bytes(bytes(raw))
    with pytest.raises(StatsFormatError, match=r"is corrupt: the SHA-256 of its content is .* "
                       r"but its header records .*; its bytes changed after ghofl wrote it"):
        load_stats(p)


def test_header_values_are_covered_by_the_digest(tmp_path: Path) -> None:
    p = _saved(tmp_path)
    header, data = _parts(p)
    meta = json.loads(header["__metadata__"]["meta"])  # type: ignore[index]
    meta["classes"] = ["x", "y"]
    header["__metadata__"]["meta"] = json.dumps(meta)  # type: ignore[index]
    _put(p, header, data)
    with pytest.raises(StatsFormatError, match=r"is corrupt: the SHA-256 of its content"):
        load_stats(p)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.ghs"
    os.mkfifo(fifo)
    with pytest.raises(StatsFormatError, match=r"statistics path '.*pipe.ghs' is not a regular "
                       r"file \(a FIFO, device or socket\)"):
        load_stats(fifo)


def _edit_table(p: Path, name: str, **changes: object) -> None:
    header, data = _parts(p)
    header[name] = {**header[name], **changes}  # type: ignore[dict-item]
    _put(p, header, data)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"dtype": "BF16"}, r"tensor 'sums' has dtype 'BF16'; ghofl files hold only F64, I64"),
        ({"dtype": "I64"}, r"array 'sums' has dtype I64 but must be F64; the payload is corrupt "
                           r"\(integers are never read as floats or back\)"),
        ({"shape": [2, 5]}, r"tensor 'sums' of shape \(2, 5\) needs 80 bytes but spans 64"),
        ({"shape": [2**31, 2**31], "data_offsets": [0, 2**65]},  # a consistent 32 EiB claim
         r"tensor 'sums' starts at byte 0 and overlaps another"),
    ],
)
def test_lying_tensor_tables_are_refused_from_the_header(
    tmp_path: Path, edit: dict[str, object], match: str
) -> None:
    p = _saved(tmp_path)
    _edit_table(p, "sums", **edit)
    with pytest.raises(StatsFormatError, match=match):
        load_stats(p)


def test_unreferenced_trailing_data_is_refused_before_reading_it(tmp_path: Path) -> None:
    p = _saved(tmp_path)
    size = p.stat().st_size
    with p.open("r+b") as f:
        f.truncate(size + (3 << 30))  # sparse: 3 GiB of zeros that would be read
    with pytest.raises(StatsFormatError, match=r"the tensors declare \d+ bytes of data but the "
                       r"file holds \d+"):
        load_stats(p)


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ("[1, 2]", r"statistics metadata must be a JSON object; got an array"),
        ('{"dim": 1e400}', r"holds the number 1e400 that overflows a float64"),
        ('{"dim": ' + "9" * 5000 + "}", r"holds an integer of 5000 digits"),
        ("[" * 5000 + "]" * 5000, r"nests JSON more than 32 levels deep"),
        ('{"a": 1, "a": 2}', r"holds the key 'a' twice"),
        ('{"x": NaN}', r"holds the non-standard number NaN"),
    ],
)
def test_hostile_metadata_json_is_refused(tmp_path: Path, meta: str, match: str) -> None:
    p = _saved(tmp_path)
    _rewrite_header(p, meta=meta)
    with pytest.raises(StatsFormatError, match=match):
        load_stats(p)


def test_metadata_numbers_must_be_json_integers(tmp_path: Path) -> None:
    p = _saved(tmp_path)
    header, _ = _parts(p)
    meta = json.loads(header["__metadata__"]["meta"])  # type: ignore[index]
    meta["dim"] = "4"
    _rewrite_header(p, meta=json.dumps(meta))
    with pytest.raises(StatsFormatError, match=r"statistics metadata is malformed: dim is '4'; "
                       r"expected an integer from 1 to \d+"):
        load_stats(p)


def test_an_unknown_header_key_is_refused(tmp_path: Path) -> None:
    p = _saved(tmp_path)
    _rewrite_header(p, contemt_sha256="0" * 64)
    with pytest.raises(StatsFormatError, match=r"has the unknown header key 'contemt_sha256'"):
        load_stats(p)
