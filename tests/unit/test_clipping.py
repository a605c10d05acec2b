"""Per-sample L2 clipping: hard bounds, the n_clipped count, metadata and file compatibility."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import IncompatibleStatsError, StatsFormatError, StatsValidationError
from ghofl.moments.core import GhoflWarning
from ghofl.stats import (
    ClientStats,
    ProjectionSpec,
    StatsAccumulator,
    StatsMeta,
    compute_stats,
    load_stats,
    save_stats,
)
from ghofl.stats.meta import SCHEMA_VERSION
from ghofl.stats.schema import ARRAY_NAMES, SCHEMAS
from tests.helpers import gaussian_mixture

MODES = tuple(SCHEMAS)


def _clip_rows(z: np.ndarray, r: float) -> np.ndarray:
    """Reference clipping z·min(1, R/‖z‖), row by row."""
    norms = np.linalg.norm(z, axis=1)
    return z * np.minimum(1.0, r / np.maximum(norms, 1e-300))[:, None]


def _naive(z: np.ndarray, y: np.ndarray, c: int) -> dict[str, np.ndarray]:
    s = np.stack([z[y == k].T @ z[y == k] for k in range(c)])
    return {
        "counts": np.bincount(y, minlength=c),
        "sums": np.stack([z[y == k].sum(0) for k in range(c)]),
        "class_scatter": s,
        "sq_sums": np.diagonal(s, axis1=1, axis2=2),
        "scatter": z.T @ z,
    }


def _assert_matches_naive(s: ClientStats, z: np.ndarray, y: np.ndarray) -> None:
    ref = _naive(z, y, s.num_classes)
    for name in ARRAY_NAMES:
        arr = getattr(s, name)
        if arr is not None:
            np.testing.assert_allclose(arr, ref[name], rtol=1e-10, atol=1e-10, err_msg=name)


# ---------------------------------------------------------------------- the guarantee
@pytest.mark.parametrize("projected", [False, True])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("r", [0.5, 3.0])
def test_clipped_statistics_respect_the_per_sample_bounds(
    mode: str, projected: bool, r: float
) -> None:
    x, y = gaussian_mixture(11, num_classes=3, dim=8, n=300, sep=4.0)
    proj = ProjectionSpec(2, 8, 5) if projected else None
    s = compute_stats(x, y, 3, mode=mode, projection=proj, clip_norm=r, batch_size=70)  # type: ignore[arg-type]
    n_c = s.counts.astype(np.float64)
    tol = 1.0 + 1e-12  # rounding of the sums of N values
    assert s.n_clipped > 0
    assert np.all(np.abs(s.sums) <= n_c[:, None] * r * tol)
    if s.meta.mode not in ("means", "gram"):  # the modes without per-class D_c
        assert np.all(np.abs(s.diag_sums) <= n_c[:, None] * r * r * tol)
    if s.class_scatter is not None:
        assert np.all(np.abs(s.class_scatter) <= n_c[:, None, None] * r * r * tol)
    total = s.total_scatter
    if total is not None:
        assert np.all(np.abs(total) <= s.n_samples * r * r * tol)


@pytest.mark.parametrize("mode", MODES)
def test_one_clipped_sample_is_bounded_exactly(mode: str) -> None:
    rng = np.random.default_rng(5)
    r = 0.7
    rows = np.vstack([np.eye(6) * 3.1, -np.eye(6) * 1e3, rng.normal(scale=50, size=(40, 6))])
    for row in rows:  # one sample per payload: |A| <= R and |S|, |D|, |B| <= R² with no slack
        s = compute_stats(row[None, :], np.array([0]), 1, mode=mode, clip_norm=r)  # type: ignore[arg-type]
        assert s.n_clipped == 1
        assert np.all(np.abs(s.sums) <= r)
        assert mode in ("means", "gram") or np.all(np.abs(s.diag_sums) <= r * r)
        for m in (s.class_scatter, s.total_scatter):
            assert m is None or np.all(np.abs(m) <= r * r)


# ---------------------------------------------------------------------- the count
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_size", [1, 4, 1000])
def test_n_clipped_counts_the_rows_with_norm_above_r(mode: str, batch_size: int) -> None:
    # Axis-aligned rows have exact norms; R = 2: norm 2.0 is kept, 2.5 and 7 are clipped.
    norms = np.array([0.5, 2.0, 2.5, 1.0, 7.0, 2.0, 0.0, 9.0])
    axes = np.arange(norms.size) % 3
    x = np.zeros((norms.size, 3))
    x[np.arange(norms.size), axes] = norms * np.where(np.arange(norms.size) % 2, -1.0, 1.0)
    y = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    s = compute_stats(x, y, 2, mode=mode, clip_norm=2.0, batch_size=batch_size)  # type: ignore[arg-type]
    assert s.n_clipped == 3 and s.meta.clip_norm == 2.0
    _assert_matches_naive(s, _clip_rows(x, 2.0), y)


@pytest.mark.parametrize("mode", MODES)
def test_clipping_matches_the_reference_on_random_data(mode: str) -> None:
    x, y = gaussian_mixture(3, num_classes=4, dim=6, n=500, sep=3.0)
    r = float(np.median(np.linalg.norm(x, axis=1)))
    acc = StatsAccumulator(4, dim=6, mode=mode, clip_norm=r)  # type: ignore[arg-type]
    acc._chunk = 16  # many chunks per class and for B
    for start in range(0, 500, 123):
        acc.update(x[start : start + 123].astype(np.float32), y[start : start + 123])
    s = acc.result()
    z = x.astype(np.float32).astype(np.float64)
    assert s.n_clipped == int(np.sum(np.linalg.norm(z, axis=1) > r))
    _assert_matches_naive(s, _clip_rows(z, r), y)
    ClientStats(s.meta, n_clipped=s.n_clipped, **{k: v for k, v in s.arrays().items()})


@pytest.mark.parametrize("mode", MODES)
def test_clipping_happens_after_the_projection(mode: str) -> None:
    x, y = gaussian_mixture(4, num_classes=3, dim=12, n=240, sep=3.0)
    spec = ProjectionSpec(9, 12, 4)
    z = spec.apply(x)
    r = float(np.median(np.linalg.norm(z, axis=1)))
    s = compute_stats(x, y, 3, mode=mode, projection=spec, clip_norm=r)  # type: ignore[arg-type]
    assert s.n_clipped == int(np.sum(np.linalg.norm(z, axis=1) > r))
    assert s.n_clipped != int(np.sum(np.linalg.norm(x, axis=1) > r))  # not the input norms
    _assert_matches_naive(s, _clip_rows(z, r), y)


@pytest.mark.parametrize("mode", MODES)
def test_a_bound_above_every_norm_changes_nothing(mode: str) -> None:
    x, y = gaussian_mixture(6, num_classes=3, dim=5, n=120)
    r = float(np.linalg.norm(x, axis=1).max()) * 1.01
    plain = compute_stats(x, y, 3, mode=mode)  # type: ignore[arg-type]
    clipped = compute_stats(x, y, 3, mode=mode, clip_norm=r)  # type: ignore[arg-type]
    assert clipped.n_clipped == 0 and clipped.meta.clip_norm == r
    for name in ARRAY_NAMES:
        a, b = getattr(plain, name), getattr(clipped, name)
        assert (a is None) == (b is None)
        if a is None:
            continue
        if name == "scatter":  # accumulated in another order when clipping is on
            np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-13)
        else:
            np.testing.assert_array_equal(b, a)


def test_n_clipped_survives_result_and_further_updates() -> None:
    x = np.vstack([np.full((3, 2), 10.0), np.full((2, 2), 0.1)])
    y = np.array([0, 1, 0, 1, 1])
    acc = StatsAccumulator(2, dim=2, clip_norm=1.0)
    acc.update(x[:2], y[:2])
    assert acc.result().n_clipped == 2
    acc.update(x[2:], y[2:])
    assert acc.result().n_clipped == 3


# ---------------------------------------------------------------------- algebra
def _clipped(seed: int, r: float | None = 2.0, mode: str = "full") -> ClientStats:
    x, y = gaussian_mixture(seed, num_classes=2, dim=3, n=40, sep=3.0)
    return compute_stats(x, y, ("a", "b"), mode=mode, clip_norm=r)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
def test_n_clipped_is_additive(mode: str) -> None:
    a, b = _clipped(0, mode=mode), _clipped(1, mode=mode)
    assert a.n_clipped > 0 and b.n_clipped > 0
    total = a + b
    assert total.n_clipped == a.n_clipped + b.n_clipped
    back = total - b
    assert back.n_clipped == a.n_clipped and back.allclose(a, rtol=1e-12)
    assert ClientStats.zeros(a.meta).n_clipped == 0
    assert (a + ClientStats.zeros(a.meta)).n_clipped == a.n_clipped
    assert a.to_mode("means").n_clipped == a.n_clipped


def test_allclose_compares_n_clipped() -> None:
    a = _clipped(0)
    other = ClientStats(a.meta, n_clipped=a.n_clipped - 1, **a.arrays())
    assert a.allclose(a) and not a.allclose(other)


def test_subtracting_more_clipped_samples_is_refused() -> None:
    a = _clipped(0)
    unclipped_more = ClientStats(a.meta, n_clipped=0, **a.arrays())
    with pytest.raises(
        StatsValidationError,
        match=r"cannot subtract statistics holding more clipped samples than the left operand: "
        rf"n_clipped is 0 on the left and {a.n_clipped} on the right",
    ):
        _ = unclipped_more - a


def test_nearly_equal_bounds_are_shown_in_full() -> None:
    a = StatsMeta("full", 3, ("a",), clip_norm=10.0)
    b = StatsMeta("full", 3, ("a",), clip_norm=10.000000001)
    assert a.differences(b) == ["clipping bound (R=10.0 vs R=10.000000001)"]
    assert a.differences(a.with_mode("full")) == []


@pytest.mark.parametrize(
    ("r_left", "r_right", "match"),
    [
        (10.0, 12.0, r"differ in clipping bound \(R=10 vs R=12\)"),
        (10.0, None, r"differ in clipping bound \(R=10 vs none\)"),
        (None, 0.5, r"differ in clipping bound \(none vs R=0.5\)"),
    ],
)
def test_different_bounds_cannot_be_added(
    r_left: float | None, r_right: float | None, match: str
) -> None:
    with pytest.raises(IncompatibleStatsError, match=match):
        _ = _clipped(0, r_left) + _clipped(1, r_right)


# ---------------------------------------------------------------------- validation
def _arrays(stats: ClientStats) -> dict[str, object]:
    return dict(stats.arrays())


@pytest.mark.parametrize(
    ("n_clipped", "clip", "match"),
    [
        (-1, 2.0, r"n_clipped \(the number of samples scaled down to the clipping bound\) must "
         r"be a non-negative integer; got -1; pass 0 when nothing was clipped"),
        (1.5, 2.0, r"must be a non-negative integer; got 1.5"),
        (True, 2.0, r"must be a non-negative integer; got True"),
        (41, 2.0, r"n_clipped is 41 but the statistics hold only 40 samples; at most every "
         r"sample can be clipped, so the payload is corrupt"),
        (3, None, r"n_clipped is 3 but meta.clip_norm is None: clipped statistics must record "
         r"their clipping bound; set StatsMeta\(clip_norm=R\) or pass n_clipped=0"),
    ],
)
def test_n_clipped_validation(n_clipped: object, clip: float | None, match: str) -> None:
    s = _clipped(0, clip)
    with pytest.raises(StatsValidationError, match=match):
        ClientStats(s.meta, n_clipped=n_clipped, **_arrays(s))  # type: ignore[arg-type]


def test_numpy_integer_n_clipped_becomes_int() -> None:
    s = _clipped(0)
    again = ClientStats(s.meta, n_clipped=np.int64(s.n_clipped), **_arrays(s))  # type: ignore[arg-type]
    assert type(again.n_clipped) is int and again.n_clipped == s.n_clipped


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "1", True])
def test_clip_norm_must_be_a_positive_finite_number(bad: object) -> None:
    with pytest.raises(
        StatsValidationError,
        match=r"clip_norm \(the per-sample L2 clipping bound R\) must be a finite number > 0; "
        r"got .*; pass a positive bound, or None for no clipping",
    ):
        StatsMeta("full", 3, ("a",), clip_norm=bad)  # type: ignore[arg-type]
    with pytest.raises(StatsValidationError, match="must be a finite number > 0"):
        compute_stats(np.ones((2, 3)), np.array([0, 0]), 1, clip_norm=bad)  # type: ignore[arg-type]


def test_clip_norm_metadata_round_trips() -> None:
    meta = StatsMeta("full", 3, ("a", "b"), clip_norm=np.float32(2.5))  # type: ignore[arg-type]
    assert type(meta.clip_norm) is float and meta.clip_norm == 2.5
    assert meta.with_mode("diag").clip_norm == 2.5
    assert StatsMeta.from_dict(meta.to_dict()) == meta
    legacy = meta.to_dict()
    del legacy["clip_norm"]
    assert StatsMeta.from_dict(legacy).clip_norm is None


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"clip_norm": "big"}, r"statistics metadata has clip_norm 'big'; expected a number or "
         r"null; the file was not written by ghofl or is corrupt"),
        ({"clip_norm": -2.0}, r"clip_norm \(the per-sample L2 clipping bound R\) must be a finite"),
        ({"schema_version": SCHEMA_VERSION + 1}, rf"statistics metadata has schema version "
         rf"{SCHEMA_VERSION + 1}; this ghofl reads versions 1 to {SCHEMA_VERSION}"),
        ({"schema_version": 0}, r"statistics metadata has schema version 0; this ghofl reads"),
        ({"schema_version": "v2"}, r"statistics metadata is malformed"),
    ],
)
def test_bad_clip_metadata(changes: dict[str, object], match: str) -> None:
    data = {**StatsMeta("full", 3, ("a",), clip_norm=1.0).to_dict(), **changes}
    with pytest.raises((StatsFormatError, StatsValidationError), match=match):
        StatsMeta.from_dict(data)


# ---------------------------------------------------------------------- files
@pytest.mark.parametrize("mode", MODES)
def test_file_round_trip_keeps_the_bound_and_the_count(tmp_path: Path, mode: str) -> None:
    s = _clipped(2, 1.5, mode)
    save_stats(s, tmp_path / "c.ghs")
    back = load_stats(tmp_path / "c.ghs")
    assert back.meta == s.meta and back.meta.clip_norm == 1.5
    assert back.n_clipped == s.n_clipped > 0
    for name in ARRAY_NAMES:
        a, b = getattr(s, name), getattr(back, name)
        assert (a is None and b is None) or np.array_equal(a, b)


def _make_version_1(path: Path) -> None:
    """Rewrite a file as ghofl wrote it before clipping existed (schema version 1)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(path), framework="np") as f:
        header = dict(f.metadata())
    meta = json.loads(header["meta"])
    del meta["clip_norm"]
    meta["schema_version"] = 1
    header = {"format": header["format"], "schema_version": "1", "meta": json.dumps(meta)}
    save_file(load_file(str(path)), str(path), metadata=header)


@pytest.mark.parametrize("mode", MODES)
def test_version_1_files_load_as_unclipped_and_combine(tmp_path: Path, mode: str) -> None:
    s = _clipped(3, None, mode)
    save_stats(s, tmp_path / "old.ghs")
    _make_version_1(tmp_path / "old.ghs")  # written by safetensors: no data digest either
    with pytest.warns(GhoflWarning, match=r"has no content_sha256 integrity digest \(it was "
                      r"written by an older ghofl\), so its bytes could not be verified"):
        old = load_stats(tmp_path / "old.ghs")
    assert old.n_clipped == 0 and old.meta.clip_norm is None
    assert old.meta.schema_version == SCHEMA_VERSION
    assert old.allclose(s, rtol=0.0)
    assert (old + _clipped(4, None, mode)).n_samples == s.n_samples + 40


def test_corrupt_n_clipped_header(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    p = tmp_path / "c.ghs"
    save_stats(_clipped(5), p)
    with safe_open(str(p), framework="np") as f:
        header = dict(f.metadata())
    header["n_clipped"] = "-3"
    save_file(load_file(str(p)), str(p), metadata=header)
    with pytest.raises(
        StatsFormatError,
        match=r"'.*c.ghs' has header n_clipped '-3'; expected a non-negative decimal integer; "
        "the file is corrupt",
    ):
        load_stats(p)
