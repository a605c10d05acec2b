"""Payloads read packed (``load_packed_stats``) and totals that add them packed (issue 40).

A server that only adds payloads keeps their symmetric matrices as the file holds them (row-major
upper triangles): every check of ``load_stats`` runs on the triangles, with the same decision and
the same message, and ``StatsTotal`` adds them packed and unpacks once, to the same total, bit
for bit, as the unpacked payloads give, in any mix of the two kinds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from ghofl.errors import IncompatibleStatsError, StatsFormatError, StatsValidationError
from ghofl.stats import ClientStats, StatsMeta, StatsTotal, compute_stats, save_stats, sum_stats
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.codec import load_packed_stats, load_stats
from ghofl.stats.schema import pack_upper, packed_diagonal, sym_diagonal, unpack_upper

F64 = NDArray[np.float64]
CLASSES = ("a", "b", "c")
MODES = ("full", "pooled", "gram", "diag", "means")


def _stats(seed: int, mode: str = "full", d: int = 12, n: int = 40, holdout: float = 0.0,
           skew: bool = False) -> ClientStats:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * rng.uniform(0.5, 3.0) + rng.standard_normal(d)
    y = rng.integers(0, 2 if skew else 3, n)  # skew: class 'c' left empty
    return compute_stats(x, y, CLASSES, mode=mode, holdout_fraction=holdout,  # type: ignore[arg-type]
                         holdout_seed=seed)


def _files(tmp_path: Path, stats: list[ClientStats], dtype: str = "float64") -> list[Path]:
    out = []
    for k, s in enumerate(stats):
        p = tmp_path / f"c{k}.ghs"
        save_stats(s, p, transport_dtype=dtype)
        out.append(p)
    return out


def _same(a: ClientStats, b: ClientStats) -> None:
    assert a.meta == b.meta and a.n_clipped == b.n_clipped
    for name, arr in a.arrays().items():
        other = getattr(b, name)
        assert (arr is None) == (other is None), name
        if arr is not None:
            assert arr.dtype == other.dtype and np.array_equal(arr, other), name
    assert a._magnitude == b._magnitude
    assert (a.holdout is None) == (b.holdout is None)
    if a.holdout is not None and b.holdout is not None:
        _same(a.holdout, b.holdout)


# ---------------------------------------------------------------------- the triangles
@pytest.mark.parametrize("d", [1, 2, 5, 17])
def test_packed_diagonal_and_sym_diagonal_read_the_diagonal(d: int) -> None:
    rng = np.random.default_rng(d)
    m = rng.standard_normal((3, d, d))
    m = m + m.transpose(0, 2, 1)
    packed = pack_upper(m)
    assert np.array_equal(packed[:, packed_diagonal(d)], np.diagonal(m, axis1=1, axis2=2))
    assert np.array_equal(sym_diagonal(packed, d, packed=True), sym_diagonal(m, d, packed=False))
    assert np.array_equal(sym_diagonal(packed[0], d, packed=True), np.diagonal(m[0]))
    assert not packed_diagonal(d).flags.writeable


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("holdout", [0.0, 0.3])
def test_of_then_unpack_gives_the_statistics_back(mode: str, holdout: float) -> None:
    s = _stats(1, mode, holdout=holdout)
    p = PackedStats.of(s)
    if s.class_scatter is not None:
        assert p.class_scatter is not None and p.class_scatter.shape == (3, 12 * 13 // 2)
    _same(p.unpack(), s)
    assert p.n_samples == s.n_samples and p.dim == 12 and p.num_classes == 3
    assert repr(p).startswith(f"PackedStats(mode={mode!r}, dim=12, classes=3, n=40")


# ---------------------------------------------------------------------- reading
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("holdout", [0.0, 0.25])
def test_a_packed_read_is_the_read_packed(tmp_path: Path, mode: str, dtype: str,
                                          holdout: float) -> None:
    (p,) = _files(tmp_path, [_stats(2, mode, holdout=holdout, skew=True)], dtype)
    packed = load_packed_stats(p)
    assert isinstance(packed, PackedStats)
    _same(packed.unpack(), load_stats(p))
    for name in ("counts", "sums", "sq_sums", "class_scatter", "scatter"):
        arr = getattr(packed, name)
        assert arr is None or (arr.dtype.kind in "fi" and not arr.flags.writeable)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sums_of_packed_reads_equal_sums_of_reads_bit_for_bit(tmp_path: Path, mode: str,
                                                              dtype: str) -> None:
    files = _files(tmp_path, [_stats(k, mode, n=10 + 7 * k, skew=k % 2 == 0) for k in range(5)],
                   dtype)
    want = sum_stats(load_stats(p) for p in files)
    _same(sum_stats(load_packed_stats(p) for p in files), want)
    for kinds in ([0, 1, 0, 1, 0], [1, 0, 0, 1, 1], [1, 1, 1, 1, 0]):  # 1: packed
        got = sum_stats(load_packed_stats(p) if k else load_stats(p)
                        for p, k in zip(files, kinds, strict=True))
        _same(got, want)


def test_holdout_sections_are_summed_packed_too(tmp_path: Path) -> None:
    files = _files(tmp_path, [_stats(k, "full", n=30, holdout=0.3) for k in range(3)])
    want = sum_stats(load_stats(p) for p in files)
    got = sum_stats([load_packed_stats(files[0]), load_stats(files[1]),
                     load_packed_stats(files[2])])
    _same(got, want)
    assert got.holdout is not None


@settings(max_examples=25, deadline=None)
@given(seeds=st.lists(st.integers(0, 10_000), min_size=1, max_size=5),
       kinds=st.lists(st.booleans(), min_size=5, max_size=5),
       results=st.lists(st.booleans(), min_size=5, max_size=5))
def test_any_mix_and_any_result_taken_on_the_way_never_changes_a_result(
        seeds: list[int], kinds: list[bool], results: list[bool]) -> None:
    payloads = [_stats(s, "full", d=6, n=5 + s % 9, skew=s % 3 == 0) for s in seeds]
    total, taken = StatsTotal(), []
    for i, s in enumerate(payloads):
        total.add(PackedStats.of(s) if kinds[i] else s)
        if results[i]:
            r = total.result()
            taken.append((r, {n: np.array(a) for n, a in r.arrays().items() if a is not None},
                           sum_stats(payloads[: i + 1])))
    _same(total.result(), sum_stats(payloads))
    for r, copies, want in taken:
        _same(r, want)
        for name, arr in copies.items():
            assert np.array_equal(getattr(r, name), arr)


def test_a_packed_payload_of_other_metadata_is_refused_with_its_index() -> None:
    total = StatsTotal()
    total.add(PackedStats.of(_stats(0)))
    other = _stats(1, "pooled")
    with pytest.raises(IncompatibleStatsError, match=r"payload #1 \(0-based\): cannot combine "
                       r"these statistics because they differ in"):
        total.add(PackedStats.of(other))
    with pytest.raises(IncompatibleStatsError, match=r"payload #1 \(0-based\): can only "
                       r"combine ClientStats with ClientStats; got ndarray"):
        total.add(np.zeros(3))  # type: ignore[arg-type]
    assert len(total) == 1


def test_a_dp_release_is_not_read_packed(tmp_path: Path) -> None:
    from ghofl.stats.release import NoisyStats

    s = _stats(3, "full")
    p = tmp_path / "release.ghs"
    save_stats(NoisyStats.of(s, {"sums": 0.5, "class_scatter": 0.5}), p)
    with pytest.raises(StatsFormatError, match=r"holds a differentially private release \(noise "
                       r"levels in its header\), not a payload to add; read it with load_stats"):
        load_packed_stats(p)


# ---------------------------------------------------------------------- refusals
def _meta(what: str) -> StatsMeta:
    """d = 32 for the low-rank case: the certificate runs for n ≤ d / 8 samples."""
    return StatsMeta("full", 32 if what == "not PSD, low rank" else 8, ("a", "b"))


def _arrays(seed: int, n: int, d: int) -> dict[str, Any]:
    x = np.random.default_rng(seed).standard_normal((n, d)) + 0.5
    s = compute_stats(x, np.zeros(n, dtype=np.int64), ("a", "b"), mode="full")
    return {"counts": np.array(s.counts), "sums": np.array(s.sums),
            "class_scatter": np.array(s.class_scatter)}


def _corrupt(what: str) -> dict[str, Any]:
    d = _meta(what).dim
    a = _arrays(0, 3 if what == "not PSD, low rank" else 20, d)
    cs, sums = a["class_scatter"], a["sums"]
    if what.startswith("not PSD"):  # the centred S_a gets one eigenvalue of −1% of its scale
        mean_part = np.outer(sums[0], sums[0]) / a["counts"][0]
        lam, q = np.linalg.eigh(cs[0] - mean_part)
        lam[0] = -0.01 * float(np.max(np.diagonal(cs[0] - mean_part)))
        cs[0] = (q * lam) @ q.T + mean_part
        cs[0] = (cs[0] + cs[0].T) / 2
    elif what == "Cauchy-Schwarz":
        sums[0, 2] = 1e3
    elif what == "negative squares":
        cs[0, 3, 3] = -1.0
    elif what == "empty class with sums":
        sums[1, 0] = 1.0
    elif what == "empty class off-diagonal":
        cs[1, 0, 1] = cs[1, 1, 0] = 1.0
    elif what == "NaN":
        cs[0, 1, 2] = cs[0, 2, 1] = np.nan
    elif what == "negative count":
        a["counts"][1] = -1
    return a


@pytest.mark.parametrize(("what", "match"), [
    ("not PSD", r"the second moment S_c of class 'a' minus its mean part \(A Aᵀ/N\) is not "
                r"positive semi-definite"),
    ("not PSD, low rank", r"the second moment S_c of class 'a' minus its mean part"),
    ("Cauchy-Schwarz", r"per-class sums of squares are smaller than the squared sums allow"),
    ("negative squares", r"sums of squares \(D_c or diag S_c\) must be non-negative"),
    ("empty class with sums", r"class 'b' has zero samples but non-zero sums"),
    ("empty class off-diagonal", r"the second moment S_c of class 'b' minus its mean part"),
    ("NaN", r"class_scatter contains NaN or infinite values"),
    ("negative count", r"class counts must be non-negative; got -1 for class 'b'"),
])
def test_a_corrupt_payload_is_refused_packed_with_the_same_message(
        tmp_path: Path, what: str, match: str) -> None:
    p = tmp_path / "bad.ghs"
    save_stats(ClientStats._trusted(_meta(what), **_corrupt(what)), p)
    with pytest.raises(StatsValidationError, match=match) as plain:
        load_stats(p)
    with pytest.raises(StatsValidationError, match=match) as packed:
        load_packed_stats(p)
    assert str(packed.value) == str(plain.value)


@pytest.mark.parametrize("mode", ["pooled", "gram"])
def test_a_pooled_scatter_that_is_not_psd_is_refused_packed(tmp_path: Path, mode: str) -> None:
    s = _stats(4, mode, d=8)
    arrays: dict[str, Any] = {n: np.array(a) for n, a in s.arrays().items() if a is not None}
    b = arrays["scatter"]  # W = B − Σ_c A_c A_cᵀ/N_c gets one eigenvalue of −1% of its scale
    mean_part = sum(np.outer(a, a) / n for a, n in zip(s.sums, s.counts, strict=True) if n)
    lam, q = np.linalg.eigh(b - mean_part)
    lam[0] = -0.01 * float(np.max(np.diagonal(b - mean_part)))
    arrays["scatter"] = (q * lam) @ q.T + mean_part
    arrays["scatter"] = (arrays["scatter"] + arrays["scatter"].T) / 2
    if mode == "pooled":  # keep diag(B) = Σ D_c, so the PSD check is what refuses
        arrays["sq_sums"] = arrays["sq_sums"] + (np.diagonal(arrays["scatter"])
                                                 - np.diagonal(b)) / 3.0
    p = tmp_path / "bad.ghs"
    save_stats(ClientStats._trusted(s.meta, **arrays), p)
    match = r"the second moment B minus its mean part \(A Aᵀ/N\) is not positive semi-definite"
    with pytest.raises(StatsValidationError, match=match) as plain:
        load_stats(p)
    with pytest.raises(StatsValidationError, match=match) as packed:
        load_packed_stats(p)
    assert str(packed.value) == str(plain.value)


def test_a_wrong_shape_is_refused_as_the_unpacking_read_refuses_it() -> None:
    from ghofl.stats.transport import packed_stats_from_tensors, stats_from_tensors

    s = _stats(6, "full", d=5)
    assert s.class_scatter is not None
    t = {"counts": s.counts, "sums": s.sums, "class_scatter_triu": pack_upper(s.class_scatter)[:, 1:]}
    match = (r"array 'class_scatter_triu' must have shape \(3, 15\) \(row-major upper triangles\) "
             r"for C=3 classes and d=5; got \(3, 14\)")
    with pytest.raises(StatsFormatError, match=match):
        stats_from_tensors(s.meta, t)
    with pytest.raises(StatsFormatError, match=match):
        packed_stats_from_tensors(s.meta, t)


def test_unpack_of_a_packed_total_matches_the_lapack_layout() -> None:
    """The packed triangle is LAPACK's lower column-major packing: unpack_upper inverts it."""
    m = _stats(7, "full", d=9).class_scatter
    assert m is not None
    assert np.array_equal(unpack_upper(pack_upper(m), 9), m)


# ---------------------------------------------------------------------- built by hand
def test_packed_stats_built_by_hand_are_validated() -> None:
    s = _stats(8, "full", d=6)
    p = PackedStats.of(s)
    again = PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=p.class_scatter)
    _same(again.unpack(), s)
    bad = np.array(p.class_scatter)
    bad[0, packed_diagonal(6)[2]] = -5.0
    with pytest.raises(StatsValidationError, match=r"sums of squares \(D_c or diag S_c\) must be "
                       r"non-negative; the payload is corrupt"):
        PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=bad)
    with pytest.raises(StatsValidationError, match=r"class_scatter must have shape \(3, 21\); "
                       r"got \(3, 6, 6\)"):
        PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=s.class_scatter)
    with pytest.raises(StatsValidationError, match=r"mode 'full' statistics must hold "
                       r"class_scatter; it is missing"):
        PackedStats(s.meta, counts=s.counts, sums=s.sums)
    nan = np.array(p.class_scatter)
    nan[1, 3] = np.nan
    with pytest.raises(StatsValidationError, match=r"class_scatter contains NaN or infinite"):
        PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=nan)


def test_a_held_out_section_built_by_hand_is_checked_against_the_totals() -> None:
    s = _stats(9, "full", d=5, holdout=0.3)
    assert s.holdout is not None
    p = PackedStats.of(s)
    assert p.holdout is not None
    ok = PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=p.class_scatter,
                     holdout=p.holdout)
    _same(ok.unpack(), s)
    with pytest.raises(StatsValidationError, match=r"meta.holdout_fraction is 0.3 but the "
                       r"statistics have no held-out section"):
        PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=p.class_scatter)
    with pytest.raises(StatsValidationError, match=r"the held-out section of PackedStats must be "
                       r"PackedStats; got ClientStats"):
        PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=p.class_scatter,
                    holdout=s.holdout)  # type: ignore[arg-type]
    more = PackedStats.of(_stats(10, "full", d=5, n=400).without_holdout())
    with pytest.raises(StatsValidationError, match=r"the held-out section holds \d+ samples of "
                       r"class '.' but the totals hold only \d+"):
        PackedStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=p.class_scatter,
                    holdout=more)


# ---------------------------------------------------------------------- reading ahead
def test_iter_packed_stats_yields_each_file_as_load_packed_stats_reads_it(tmp_path: Path) -> None:
    from ghofl.stats import iter_packed_stats

    files = _files(tmp_path, [_stats(k, "full", n=12 + k, skew=k == 1) for k in range(4)])
    got = list(iter_packed_stats(files))
    assert len(got) == 4
    for p, s in zip(files, got, strict=True):
        _same(s.unpack(), load_stats(p))
    _same(sum_stats(iter_packed_stats(files)), sum_stats(load_stats(p) for p in files))
    assert list(iter_packed_stats([])) == []


@pytest.mark.parametrize("bad", [0, 2, 3])
def test_iter_packed_stats_refuses_a_bad_file_in_its_turn(tmp_path: Path, bad: int) -> None:
    from ghofl.stats import iter_packed_stats

    files = _files(tmp_path, [_stats(k, "full", n=15) for k in range(4)])
    raw = bytearray(files[bad].read_bytes())
    raw[-9] ^= 0x01  # a byte of the data section: the digest no longer matches
    files[bad].write_bytes(bytes(raw))
    seen: list[PackedStats] = []
    with pytest.raises(StatsFormatError, match=rf"'.*c{bad}\.ghs' is corrupt: the SHA-256 of its "
                       r"content is .* but its header records"):
        for s in iter_packed_stats(files):
            seen.append(s)
    assert len(seen) == bad  # the files before it were yielded, in order
    for p, s in zip(files, seen, strict=False):
        _same(s.unpack(), load_stats(p))


def test_iter_packed_stats_refuses_a_corrupt_payload_with_load_stats_message(
        tmp_path: Path) -> None:
    from ghofl.stats import iter_packed_stats

    good = _files(tmp_path, [_stats(1, "full", d=8)])[0]
    bad = tmp_path / "bad.ghs"
    save_stats(ClientStats._trusted(_meta("not PSD"), **_corrupt("not PSD")), bad)
    with pytest.raises(StatsValidationError) as plain:
        load_stats(bad)
    with pytest.raises(StatsValidationError) as ahead:
        list(iter_packed_stats([good, bad]))
    assert str(ahead.value) == str(plain.value)
    missing = tmp_path / "missing.ghs"
    with pytest.raises(StatsFormatError) as gone_plain:
        load_stats(missing)
    with pytest.raises(StatsFormatError) as gone_ahead:
        list(iter_packed_stats([good, missing]))
    assert str(gone_ahead.value) == str(gone_plain.value)


def test_a_file_without_a_digest_is_read_ahead_with_the_warning(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from ghofl.errors import GhoflWarning
    from ghofl.stats import iter_packed_stats
    from ghofl.stats.codec import DIGEST_KEY

    (p,) = _files(tmp_path, [_stats(3, "full", d=6)])
    with safe_open(str(p), framework="np") as f:
        header = {k: v for k, v in dict(f.metadata()).items() if k != DIGEST_KEY}
    save_file(load_file(str(p)), str(p), metadata=header)  # as an older ghofl wrote it
    match = r"has no content_sha256 integrity digest \(it was written by an older ghofl\)"
    with pytest.warns(GhoflWarning, match=match):
        want = load_stats(p)
    with pytest.warns(GhoflWarning, match=match):
        (got,) = list(iter_packed_stats([p]))
    _same(got.unpack(), want)


def test_iter_packed_stats_names_the_file_as_given_and_in_a_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ghofl.stats import iter_packed_stats

    monkeypatch.chdir(tmp_path)
    good = _files(tmp_path, [_stats(1, "full", d=6)])[0]
    from ghofl.stats.release import NoisyStats

    save_stats(NoisyStats.of(_stats(2, "full", d=6), {"sums": 0.5, "class_scatter": 0.5}),
               tmp_path / "dp.ghs")
    with pytest.raises(StatsFormatError, match=r"^'\./dp\.ghs' holds a differentially private "
                       r"release") as exc:
        list(iter_packed_stats([good, "./dp.ghs"]))
    assert exc.value.__notes__ == ["(payload file #1 of 2: './dp.ghs')"]
    with pytest.raises(StatsFormatError, match=r"^'\./dp\.ghs' holds a differentially private "):
        load_packed_stats("./dp.ghs")
    with pytest.raises(TypeError, match=r"iter_packed_stats takes an iterable of paths, not one "
                       r"path \('\./dp\.ghs'\); pass \[path\]"):
        list(iter_packed_stats("./dp.ghs"))
    with pytest.raises(TypeError, match=r"not one path"):
        list(iter_packed_stats(good))  # type: ignore[arg-type]


def test_stopping_early_does_not_wait_for_the_file_read_ahead(tmp_path: Path) -> None:
    import threading

    from ghofl.stats import iter_packed_stats

    files = _files(tmp_path, [_stats(k, "full", d=6) for k in range(3)])
    before = threading.active_count()
    it = iter_packed_stats(files)
    first = next(it)
    it.close()
    _same(first.unpack(), load_stats(files[0]))
    for t in threading.enumerate():  # the reader thread ends once its one read is done
        if t is not threading.current_thread() and t.name.startswith("ThreadPoolExecutor"):
            t.join(timeout=30)
    assert threading.active_count() <= before


def test_packed_stats_from_tensors_copies_the_callers_arrays_unless_told() -> None:
    from ghofl.stats.transport import packed_stats_from_tensors

    s = _stats(11, "full", d=4)
    assert s.class_scatter is not None
    t = {"counts": np.array(s.counts), "sums": np.array(s.sums),
         "class_scatter_triu": pack_upper(s.class_scatter)}
    kept = packed_stats_from_tensors(s.meta, t)
    assert t["sums"].flags.writeable and not np.shares_memory(kept.sums, t["sums"])
    t["sums"][0, 0] += 1.0  # the caller's array changes: the validated value does not
    assert kept.sums[0, 0] == s.sums[0, 0]
    adopted = packed_stats_from_tensors(s.meta, dict(t), copy=False)
    assert np.shares_memory(adopted.class_scatter, t["class_scatter_triu"])
    assert not t["class_scatter_triu"].flags.writeable


def test_iter_packed_stats_recycles_a_buffer_only_once_nothing_holds_it() -> None:
    from ghofl.stats.codec import _free_buffer, _keep_buffer

    buffers: list[np.ndarray] = []
    first = np.empty(64, np.uint8)
    _keep_buffer(buffers, first[:40])  # a payload read into a new buffer: the owner is kept
    assert len(buffers) == 1 and buffers[0] is first
    view = first[:40]
    del first
    assert _free_buffer(buffers) is None  # an array of the payload is alive
    del view
    assert _free_buffer(buffers) is buffers[0]
    owners = [np.empty(64, np.uint8) for _ in range(3)]
    for o in owners:
        _keep_buffer(buffers, o)
    # full (3): the free one made room for the first new buffer; then none was free
    assert len(buffers) == 3 and all(any(b is o for o in owners) for b in buffers)
    held = buffers[1][:8]
    del owners, o
    free = _free_buffer(buffers)
    assert free is not None and free is not held.base


def test_iter_packed_stats_never_overwrites_a_payload_the_caller_keeps(tmp_path: Path) -> None:
    from ghofl.stats import iter_packed_stats

    # sizes that grow and shrink: a smaller file reuses a larger buffer, a larger one does not
    dims = (12, 12, 20, 8, 8, 20, 12, 30, 12)
    files = _files(tmp_path, [_stats(k, "full", d=d, n=30) for k, d in enumerate(dims)])
    kept = list(iter_packed_stats(files))  # every payload alive at once
    for p, got in zip(files, kept, strict=True):
        _same(got.unpack(), load_stats(p))
    some = []
    for k, s in enumerate(iter_packed_stats(files)):  # every other one kept, its arrays only
        if k % 2 == 0:
            some.append((k, s.sums, s.class_scatter))
    for k, sums, scatter in some:
        again = load_packed_stats(files[k])
        np.testing.assert_array_equal(sums, again.sums)
        np.testing.assert_array_equal(scatter, again.class_scatter)
    for p, got in zip(files, iter_packed_stats(files), strict=True):  # nothing kept
        _same(got.unpack(), load_stats(p))


def test_a_recycled_buffer_is_the_smallest_free_one_at_most_twice_the_file() -> None:
    from ghofl.stats.codec import _free_buffer

    big, small = np.empty(1000, np.uint8), np.empty(300, np.uint8)
    buffers = [big, small]
    del big, small
    assert _free_buffer(buffers) is buffers[1]  # the smallest free one
    assert _free_buffer(buffers, 200) is buffers[1]
    assert _free_buffer(buffers, 100) is None  # 300 bytes would pin 3x a 100-byte payload
    held = buffers[1][:10]
    assert _free_buffer(buffers, 600) is buffers[0]
    assert _free_buffer(buffers, 400) is None and held.base is buffers[1]
