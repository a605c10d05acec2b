"""ClientStats: construction, validation, algebra and modes."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.errors import IncompatibleStatsError, InputError, StatsValidationError
from ghofl.stats import (
    ClientStats,
    EncoderInfo,
    ProjectionSpec,
    StatsAccumulator,
    StatsMeta,
    compute_stats,
    sum_stats,
)
from tests.helpers import gaussian_mixture


def _naive(x: np.ndarray, y: np.ndarray, c: int) -> tuple[np.ndarray, ...]:
    counts = np.bincount(y, minlength=c)
    a = np.stack([x[y == k].sum(0) for k in range(c)])
    s = np.stack([x[y == k].T @ x[y == k] for k in range(c)])
    return counts, a, s


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
def test_accumulator_matches_naive_sums(mode: str) -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=5, n=200)
    acc = StatsAccumulator(3, dim=5, mode=mode)  # type: ignore[arg-type]
    for start in range(0, 200, 37):  # uneven batches
        acc.update(x[start : start + 37], y[start : start + 37])
    s = acc.result()
    counts, a, full = _naive(x, y, 3)
    np.testing.assert_array_equal(s.counts, counts)
    np.testing.assert_allclose(s.sums, a, rtol=1e-12)
    if mode != "gram":  # gram holds no per-class D_c
        np.testing.assert_allclose(s.diag_sums, np.diagonal(full, axis1=1, axis2=2),
                                   rtol=1e-12)
    if mode == "full":
        np.testing.assert_allclose(s.class_scatter, full, rtol=1e-12)
    if mode != "diag":
        np.testing.assert_allclose(s.total_scatter, x.T @ x, rtol=1e-12)
    else:
        assert s.total_scatter is None


def test_float32_input_is_accumulated_in_float64() -> None:
    x, y = gaussian_mixture(1, num_classes=2, dim=4, n=50)
    s = compute_stats(x.astype(np.float32), y, 2)
    assert s.sums.dtype == np.float64 and s.class_scatter is not None
    np.testing.assert_allclose(s.sums[0], x.astype(np.float32)[y == 0].astype(np.float64).sum(0))


def test_arrays_are_read_only() -> None:
    x, y = gaussian_mixture(2, num_classes=2, dim=3, n=20)
    s = compute_stats(x, y, 2)
    with pytest.raises(ValueError, match="read-only"):
        s.sums[0, 0] = 1.0


def test_accumulator_empty_batch_and_class_names() -> None:
    acc = StatsAccumulator(["cat", "dog"], dim=3)
    acc.update(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))
    s = acc.result()
    assert s.meta.classes == ("cat", "dog") and s.n_samples == 0


@pytest.mark.parametrize(
    ("x", "y", "match"),
    [
        (
            np.ones((3, 4)),
            np.array([0, 1, 2]),
            r"label 2 is out of range: labels must lie in 0\.\.1",
        ),
        (np.ones((3, 4)), np.array([0, -1, 1]), r"label -1 is out of range"),
        (
            np.ones((3, 5)),
            np.array([0, 1, 1]),
            r"embeddings must have shape \(n, 4\); got \(3, 5\)",
        ),
        (np.ones((3, 4)), np.array([0, 1]), r"labels must have shape \(3,\)"),
        (
            np.array([[np.nan] * 4] * 3),
            np.array([0, 1, 1]),
            r"NaN or infinite values \(first bad row 0\)",
        ),
        (np.ones((3, 4)), np.array([0.5, 1, 1]), r"labels must be integers in 0\.\.1"),
    ],
)
def test_accumulator_rejects_bad_batches(x: np.ndarray, y: np.ndarray, match: str) -> None:
    acc = StatsAccumulator(2, dim=4)
    with pytest.raises(InputError, match=match):
        acc.update(x, y)


def _meta(mode: str = "full", dim: int = 3, classes: tuple[str, ...] = ("a", "b")) -> StatsMeta:
    return StatsMeta(mode, dim, classes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"counts": np.array([1, 2], np.int32)}, r"counts must have dtype int64; got int32"),
        (
            {"counts": np.array([-1, 2], np.int64)},
            r"class counts must be non-negative; got -1 for class 'a'",
        ),
        ({"sums": np.zeros((2, 4))}, r"sums must have shape \(2, 3\); got \(2, 4\)"),
        ({"sums": np.full((2, 3), np.nan)}, r"sums contains NaN or infinite values"),
        ({"class_scatter": None}, r"mode 'full' statistics must hold class_scatter; it is missing"),
        ({"scatter": np.eye(3)}, r"must not hold scatter \(it belongs to another mode\)"),
        (
            {"class_scatter": np.stack([np.eye(3), np.triu(np.ones((3, 3)))])},
            r"class_scatter must be symmetric",
        ),
        ({"counts": np.array([0, 2], np.int64)}, r"class 'a' has zero samples but non-zero sums"),
        ({"sums": np.full((2, 3), 10.0)}, r"N_c·D_c < A_c²"),
    ],
)
def test_validation_errors_name_the_problem(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {
        "counts": np.array([2, 2], np.int64),
        "sums": np.ones((2, 3)),
        "class_scatter": np.stack([np.eye(3) * 2, np.eye(3) * 2]),
    }
    base.update(kwargs)
    with pytest.raises(StatsValidationError, match=match):
        ClientStats(_meta(), **base)  # type: ignore[arg-type]


def test_pooled_scatter_must_agree_with_the_diagonals() -> None:
    s = _stats(0, mode="pooled")
    arrays = dict(s.arrays())
    arrays["scatter"] = s.scatter + np.eye(3)  # type: ignore[operator]
    with pytest.raises(
        StatsValidationError,
        match=r"diag\(B\) must equal Σ_c D_c in 'pooled' statistics; the payload is corrupt",
    ):
        ClientStats(s.meta, **arrays)


def test_meta_validation() -> None:
    with pytest.raises(
        StatsValidationError, match="mode must be one of full, pooled, gram, diag, means; got 'half'"
    ):
        StatsMeta("half", 3, ("a",))  # type: ignore[arg-type]
    with pytest.raises(StatsValidationError, match="class names must be unique"):
        StatsMeta("full", 3, ("a", "a"))
    with pytest.raises(
        StatsValidationError, match="encoder 'enc' produces d=5 but the statistics have dim 3"
    ):
        StatsMeta("full", 3, ("a",), encoder=EncoderInfo("enc", 5))


def _stats(seed: int, **meta_kw: object) -> ClientStats:
    x, y = gaussian_mixture(seed, num_classes=2, dim=3, n=40)
    return compute_stats(x, y, ("a", "b"), **meta_kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("other_kw", "match"),
    [
        ({"mode": "pooled"}, r"differ in mode \('full' vs 'pooled'\)"),
        (
            {"encoder": EncoderInfo("lite0", 3, resolution=224)},
            r"differ in encoder \(none vs lite0@224 d=3",
        ),
    ],
)
def test_adding_incompatible_stats_names_the_difference(
    other_kw: dict[str, object], match: str
) -> None:
    with pytest.raises(IncompatibleStatsError, match=match):
        _ = _stats(0) + _stats(1, **other_kw)


def test_incompatible_dims_and_classes_listed_together() -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=4, n=40)
    other = compute_stats(x, y, ("a", "b", "c"))
    with pytest.raises(
        IncompatibleStatsError, match=r"dim \(3 vs 4\); number of classes \(2 vs 3\)"
    ):
        _ = _stats(0) + other


def test_subtraction_inverts_addition_and_checks_counts() -> None:
    a, b = _stats(0), _stats(1)
    assert ((a + b) - b).allclose(a, rtol=1e-12)
    with pytest.raises(
        StatsValidationError, match="cannot subtract statistics holding more samples"
    ):
        _ = a - (a + b)


def _random_payload(
    rng: np.random.Generator, mode: str, c: int, d: int, classes: list[int], **kw: object
) -> ClientStats:
    """A valid payload of ``mode`` whose samples fall in ``classes`` only; per-client scale
    and offset vary over orders of magnitude, as real clients' data do."""
    n = int(rng.integers(1, 30))
    y = rng.choice(classes, n)
    scale = 10.0 ** rng.uniform(-2, 3)
    x = rng.normal(scale=scale, size=(n, d)) + rng.normal(scale=10 * scale, size=d)
    return compute_stats(x, y, c, mode, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
def test_removing_two_of_three_payloads_leaves_the_third(mode: str) -> None:
    """Regression: (a + b + c) − a − b raised StatsValidationError or IndexError on ordinary
    payloads (float residue in classes present only in a and b, and in diag(B))."""
    rng = np.random.default_rng(20261201)
    for trial in range(70):
        c, d = int(rng.integers(2, 5)), int(rng.integers(1, 6))
        kw: dict[str, object] = {}
        if trial % 3 == 1:
            kw["clip_norm"] = float(10 ** rng.uniform(0, 4))
        if trial % 3 == 2:
            kw["projection"] = ProjectionSpec(trial, d, int(rng.integers(1, 4)))
        a = _random_payload(rng, mode, c, d, [0, 1], **kw)  # class 0 only in a and b
        b = _random_payload(rng, mode, c, d, [0, 1], **kw)
        rest = _random_payload(rng, mode, c, d, list(range(1, c)), **kw)
        left = (a + b + rest) - a - b
        np.testing.assert_array_equal(left.counts, rest.counts)
        assert left.n_clipped == rest.n_clipped
        assert not np.any(left.sums[0])
        assert mode == "gram" or not np.any(left.diag_sums[0])
        peak = max(float(np.max(np.abs(v))) for k, v in (a + b + rest).arrays().items()
                   if v is not None and k != "counts")
        assert left.allclose(rest, rtol=1e-9, atol=1e-12 * peak)


def test_empty_class_with_a_tiny_negative_square_sum_is_refused_cleanly() -> None:
    """An empty class whose only non-zero entry is negative used to raise IndexError."""
    meta = StatsMeta("diag", 2, ("a", "b"))
    with pytest.raises(
        StatsValidationError, match="class 'a' has zero samples but non-zero sums"
    ):
        ClientStats(meta, np.array([0, 1]), np.array([[0.0, 0.0], [1.0, 1.0]]),
                    sq_sums=np.array([[-1e-20, 0.0], [1.0, 1.0]]))


def test_subtracting_a_payload_that_was_never_added_is_refused() -> None:
    a, b = _stats(0), _stats(1)
    impostor = compute_stats(*_shifted(1), ("a", "b"))  # same counts as b, other data
    assert np.array_equal(impostor.counts, b.counts)
    with pytest.raises(
        StatsValidationError,
        match="class 'a' has no sample left but its sums do not cancel, so the right operand "
        "was not part of the left one",
    ):
        _ = ((a + b) - a) - impostor


def _shifted(seed: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = gaussian_mixture(seed, num_classes=2, dim=3, n=40)
    return x + 5.0, y


def test_subtracting_everything_gives_exact_zeros() -> None:
    a = _stats(3)
    z = a - a
    assert z.n_samples == 0 and not np.any(z.sums) and z.allclose(ClientStats.zeros(a.meta))


def test_sum_stats_and_builtin_sum() -> None:
    parts = [_stats(i) for i in range(4)]
    assert sum_stats(parts).allclose(sum(parts), rtol=1e-12)  # type: ignore[arg-type]
    with pytest.raises(StatsValidationError, match="cannot sum an empty collection"):
        sum_stats([])
    with pytest.raises(IncompatibleStatsError, match=r"payload #2 \(0-based\)"):
        sum_stats([parts[0], parts[1], _stats(5, mode="diag")])


def test_to_mode_is_exact_and_one_way() -> None:
    full = _stats(0)
    pooled = full.to_mode("pooled")
    assert pooled.mode == "pooled"
    np.testing.assert_array_equal(pooled.scatter, full.total_scatter)
    x, y = gaussian_mixture(0, num_classes=2, dim=3, n=40)
    assert pooled.allclose(compute_stats(x, y, ("a", "b"), mode="pooled"), rtol=1e-12)
    assert full.to_mode("diag").sq_sums is not None
    with pytest.raises(
        StatsValidationError,
        match="cannot convert statistics from mode 'pooled' to mode 'full', which holds second "
        "moments that mode 'pooled' never collected; recompute them on the client with "
        "--mode full",
    ):
        pooled.to_mode("full")
    gram = pooled.to_mode("gram")  # pooled -> gram drops D_c, nothing else
    assert gram.mode == "gram" and gram.sq_sums is None
    np.testing.assert_array_equal(gram.scatter, pooled.scatter)
    np.testing.assert_array_equal(gram.sums, pooled.sums)
    assert gram.allclose(full.to_mode("gram"), rtol=0.0)
    assert gram.allclose(compute_stats(x, y, ("a", "b"), mode="gram"), rtol=1e-12)
    assert gram.to_mode("means").allclose(pooled.to_mode("means"), rtol=0.0)
    for richer in ("diag", "pooled", "full"):  # gram and diag are incomparable
        with pytest.raises(StatsValidationError, match=f"--mode {richer}"):
            gram.to_mode(richer)  # type: ignore[arg-type]
    with pytest.raises(StatsValidationError, match="--mode gram"):
        full.to_mode("diag").to_mode("gram")


def test_allclose_detects_differences() -> None:
    a, b = _stats(0), _stats(1)
    assert a.allclose(a) and not a.allclose(b)
    assert not a.allclose(a.to_mode("pooled"))


def test_result_is_stable_and_accumulation_can_continue() -> None:
    x, y = gaussian_mixture(7, num_classes=2, dim=4, n=80)
    acc = StatsAccumulator(2, dim=4)
    acc.update(x[:40], y[:40])
    first = acc.result()
    snapshot = first.class_scatter.copy()  # type: ignore[union-attr]
    again = acc.result()
    np.testing.assert_array_equal(again.class_scatter, snapshot)
    acc.update(x[40:], y[40:])
    np.testing.assert_array_equal(first.class_scatter, snapshot)  # earlier result unchanged
    assert acc.result().allclose(compute_stats(x, y, 2), rtol=1e-12)


# ---------------------------------------------------------------------- hardened validation
def test_indefinite_second_moments_are_refused() -> None:
    from ghofl.errors import StatsValidationError

    x, y = gaussian_mixture(0, num_classes=2, dim=3, n=40)
    s = compute_stats(x, y, 2, mode="full")
    bad = np.array(s.class_scatter)
    bad[0, 0, 1] = bad[0, 1, 0] = 5.0 * (bad[0, 0, 0] + bad[0, 1, 1])  # diagonals unchanged
    with pytest.raises(StatsValidationError, match=r"the second moment S_c of class '0' minus "
                       r"its mean part \(A Aᵀ/N\) is not positive semi-definite"):
        ClientStats(s.meta, counts=np.array(s.counts), sums=np.array(s.sums), class_scatter=bad)


def test_cauchy_schwarz_holds_for_values_near_the_float_range() -> None:
    from ghofl.errors import StatsValidationError

    x, y = gaussian_mixture(0, num_classes=2, dim=3, n=40)
    s = compute_stats(x, y, 2, mode="diag")
    with pytest.raises(StatsValidationError, match=r"N_c·D_c < A_c²"):
        ClientStats(s.meta, counts=np.array(s.counts), sums=np.array(s.sums) * 1e200,
                    sq_sums=np.array(s.sq_sums))


def test_sums_that_overflow_are_refused() -> None:
    from ghofl.errors import StatsOverflowError

    x, y = gaussian_mixture(0, num_classes=2, dim=3, n=40)
    s = compute_stats(x, y, 2, mode="diag")
    big = ClientStats(s.meta, counts=np.full(2, 2**61, dtype=np.int64), sums=np.zeros((2, 3)),
                      sq_sums=np.zeros((2, 3)))
    with pytest.raises(StatsOverflowError, match=r"overflows the int64 sample counts"):
        big + big
    f = 1.2e308 / float(np.max(s.sq_sums))
    huge = ClientStats(s.meta, counts=np.array(s.counts), sums=np.array(s.sums) * np.sqrt(f),
                       sq_sums=np.array(s.sq_sums) * f)
    with pytest.raises(StatsOverflowError, match=r"cannot add payload #1 \(0-based\) to the "
                       r"total of the payloads before it: adding these statistics overflows "
                       r"float64 in sq_sums"):
        sum_stats([huge, huge])
