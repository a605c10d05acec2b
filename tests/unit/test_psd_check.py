"""The positive semi-definiteness check of second moments, its tiled helpers and its messages.

The check factorises each centred, scaled matrix in place (LAPACK ``potrf``); it must take the
decision of the check it replaced (scipy ``cholesky`` of a fresh centred copy plus the same
ridge) and of the eigenvalue criterion both implement, λ_min(M / σ²) > −ridge, on matrices on
either side of the tolerance.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy.linalg import LinAlgError, cholesky

from ghofl.errors import StatsValidationError
from ghofl.stats import ClientStats, StatsMeta, _laws, compute_stats
from ghofl.stats.client_stats.laws import _check_symmetric
from ghofl.stats.schema import pack_upper, unpack_upper
from tests.helpers import assert_overflow_refused

F64 = NDArray[np.float64]


def _ridge(d: int) -> float:
    return _laws._PSD_RTOL * d  # statistics built directly carry no residue


def _old_accepts(m: F64, sums: F64, counts: F64, ridge: float) -> bool:
    """The criterion as the check implemented it before: a fresh centred copy, scipy."""
    sigma2 = max(float(np.max(np.diagonal(m), initial=0.0)), float(np.finfo(float).tiny))
    sigma = float(np.sqrt(sigma2))
    out = m / sigma / sigma
    for a, n in zip(sums, counts, strict=True):
        if n > 0:
            v = a / sigma
            out = out - np.outer(v, v) / n
    out[np.diag_indices(m.shape[0])] += ridge
    try:
        return bool(np.all(np.isfinite(cholesky(out, lower=True, check_finite=False))))
    except LinAlgError:
        return False


def _eig_accepts(m: F64, sums: F64, counts: F64, ridge: float) -> bool:
    sigma2 = float(np.max(np.diagonal(m)))
    centred = m - sum(np.outer(a, a) / n for a, n in zip(sums, counts, strict=True) if n > 0)
    return bool(np.linalg.eigvalsh(centred / sigma2)[0] > -ridge)


def _with_smallest(rng: np.random.Generator, d: int, rank: int, k: float | None,
                   mean_part: F64 | None = None) -> F64:
    """A symmetric (d, d) matrix M of max diagonal ≈ 1: ``rank`` eigenvalues in (0.2, 1), the
    others 0, and (k given) one of them −k·ridge relative to the scale the check uses, the
    largest diagonal entry of M + ``mean_part`` (the second moment before centring)."""
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    lam = np.zeros(d)
    lam[:rank] = rng.uniform(0.2, 1.0, rank)
    m = (q * lam) @ q.T
    if k is not None:
        sigma2 = float(np.max(np.diagonal(m + (0.0 if mean_part is None else mean_part))))
        lam[-1] = -k * _ridge(d) * sigma2
        m = (q * lam) @ q.T
    out: F64 = (m + m.T) / 2
    return out


def _full(m: F64, mean: F64, n: int) -> ClientStats:
    """Mode ``full`` statistics of one class whose centred second moment is ``m``."""
    d = m.shape[0]
    meta = StatsMeta("full", d, ("c0",))
    s = m + n * np.outer(mean, mean)
    return ClientStats(meta, counts=np.array([n]), sums=(n * mean)[None, :],
                       class_scatter=((s + s.T) / 2)[None])


def _new_accepts(stats_fn: Callable[[], object]) -> bool:
    try:
        stats_fn()
    except StatsValidationError as exc:
        assert "not positive semi-definite" in str(exc)
        return False
    return True


# ---------------------------------------------------------------------- decision equivalence
@pytest.mark.parametrize("one_thread", [False, True])
@pytest.mark.parametrize("d", [5, 64, 129])
@pytest.mark.parametrize(("rank_of", "k", "accepted"), [
    ("full", None, True),        # positive definite
    ("low", None, True),         # exactly PSD, low rank: eigenvalues 0 up to rounding
    ("low", 0.5, True),          # slightly negative, within the tolerance
    ("full", 0.8, True),
    ("low", 1.5, False),         # beyond the tolerance
    ("full", 3.0, False),
    ("low", 100.0, False),
])
def test_new_check_takes_the_old_decision(monkeypatch: pytest.MonkeyPatch, one_thread: bool,
                                          d: int, rank_of: str, k: float | None,
                                          accepted: bool) -> None:
    if one_thread:  # the BLAS-thread limit of large checks, here at any size
        monkeypatch.setattr(_laws, "_ONE_THREAD_FLOPS", 0.0)
    rng = np.random.default_rng(d * 7 + int(10 * (k or 0)))
    rank = d if rank_of == "full" else max(1, d // 3)
    mean, n = rng.standard_normal(d) * 0.3, 17
    m = _with_smallest(rng, d, rank, k, n * np.outer(mean, mean))
    s = m + n * np.outer(mean, mean)
    sums, counts = (n * mean)[None, :], np.array([float(n)])
    ridge = _ridge(d)
    assert _old_accepts(s, sums, counts, ridge) is accepted
    assert _eig_accepts(s, sums, counts, ridge) is accepted
    assert _new_accepts(lambda: _full(m, mean, n)) is accepted


@pytest.mark.parametrize(("k", "accepted"), [(None, True), (0.5, True), (2.0, False)])
def test_pooled_check_takes_the_old_decision(k: float | None, accepted: bool) -> None:
    """Mode ``pooled``: B − Σ_c A_c A_cᵀ/N_c, three classes (one empty), one rank-3 update."""
    rng = np.random.default_rng(5)
    d, c = 40, 4
    means, counts = rng.standard_normal((c, d)), np.array([5, 0, 9, 3])
    means[1] = 0.0
    sums = means * counts[:, None]
    mean_part = sum(n * np.outer(mu, mu) for mu, n in zip(means, counts, strict=True))
    within = _with_smallest(rng, d, d // 2, k, mean_part)
    b = within + mean_part
    b = (b + b.T) / 2
    # D_c: the class diagonals must add up to diag B (the diagonal of `within` is split)
    sq = counts[:, None] * means**2 + np.diagonal(within)[None, :] * counts[:, None] / 17
    meta = StatsMeta("pooled", d, tuple(f"c{i}" for i in range(c)))
    ridge = _ridge(d)
    assert _old_accepts(b, sums, counts.astype(float), ridge) is accepted
    assert _new_accepts(lambda: ClientStats(meta, counts=counts, sums=sums, sq_sums=sq,
                                            scatter=b)) is accepted


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 12), d=st.integers(1, 24),
       shift=st.floats(1e-3, 1e3))
def test_statistics_of_samples_are_always_accepted(seed: int, n: int, d: int,
                                                   shift: float) -> None:
    """Sums of x xᵀ of any few samples (rank ≤ n − 1 once centred, an offset mean) pass."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) + shift
    s = compute_stats(x, np.zeros(n, dtype=np.int64), 1, mode="full")
    assert _old_accepts(np.asarray(s.class_scatter)[0], s.sums, s.counts.astype(float),
                        _ridge(d))


# ---------------------------------------------------------------------- messages
@pytest.mark.parametrize("k", [3.0, 1e4])
def test_refusal_names_the_class_and_its_smallest_eigenvalue(k: float) -> None:
    rng = np.random.default_rng(11)
    d = 30
    meta = StatsMeta("full", d, ("cat", "dog"))
    good = _with_smallest(rng, d, d, None)
    bad = _with_smallest(rng, d, 10, k)
    sigma2 = float(np.max(np.diagonal(bad)))
    with pytest.raises(StatsValidationError, match=(
            r"the second moment S_c of class 'dog' minus its mean part \(A Aᵀ/N\) is not "
            r"positive semi-definite \(checked to a relative tolerance of 3e-08, scale "
            r".*\): its smallest eigenvalue is (\S+) times the scale, below −3e-08")) as info:
        ClientStats(meta, counts=np.array([20, 20]), sums=np.zeros((2, d)),
                    class_scatter=np.stack([good, bad]))
    low = float(re.search(r"smallest eigenvalue is (\S+) times", str(info.value))[1])  # type: ignore[index]
    assert low == pytest.approx(-k * _ridge(d), rel=1e-2)
    assert f"scale {sigma2:.3g}" in str(info.value)


def test_refusal_of_entries_beyond_the_float_range_of_the_scale() -> None:
    """Off-diagonal entries so far beyond a tiny diagonal that M / σ² overflows: refused (no
    eigenvalue exists in range: it reads −inf)."""
    assert_overflow_refused(3)


def test_pooled_refusal_names_b() -> None:
    rng = np.random.default_rng(2)
    d = 12
    b = _with_smallest(rng, d, 4, 50.0)
    meta = StatsMeta("pooled", d, ("a", "b"))
    with pytest.raises(StatsValidationError, match=r"the second moment B minus its mean part "
                       r"\(A Aᵀ/N\) is not positive semi-definite .* its smallest eigenvalue"):
        ClientStats(meta, counts=np.array([3, 4]), sums=np.zeros((2, d)),
                    sq_sums=np.stack([np.diagonal(b) / 2, np.diagonal(b) / 2]), scatter=b)


# ---------------------------------------------------------------------- tiled helpers
@pytest.mark.parametrize("d", [0, 1, 2, 63, 64, 65, 130])
@pytest.mark.parametrize("lead", [(), (3,), (2, 2), (0,)])
def test_unpack_upper_inverts_pack_upper(d: int, lead: tuple[int, ...]) -> None:
    rng = np.random.default_rng(d)
    a = rng.standard_normal((*lead, d, d))
    a = a + np.swapaxes(a, -1, -2)
    packed = pack_upper(a)
    out = unpack_upper(packed, d)
    assert out.shape == a.shape and out.dtype == a.dtype and out.flags.c_contiguous
    np.testing.assert_array_equal(out, a)
    wide = unpack_upper(packed.astype(np.float32), d, np.float64)
    assert wide.dtype == np.float64
    np.testing.assert_array_equal(wide, a.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize(("i", "j"), [(0, 1), (63, 64), (64, 63), (0, 129), (129, 128)])
def test_symmetry_check_finds_an_asymmetry_anywhere(i: int, j: int) -> None:
    rng = np.random.default_rng(3)
    d = 130
    m = rng.standard_normal((2, d, d))
    m = m + np.swapaxes(m, -1, -2)
    _check_symmetric("class_scatter", m)
    m[1, i, j] += 0.25
    with pytest.raises(StatsValidationError, match=r"class_scatter must be symmetric; its "
                       r"largest asymmetry is 0\.25; the payload is corrupt"):
        _check_symmetric("class_scatter", m)
