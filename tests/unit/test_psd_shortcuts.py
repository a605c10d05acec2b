"""Exact shortcuts of the PSD check and the helpers they use (issue 40).

A class without samples whose S_c is exactly zero, and a matrix of few samples proven PSD by the
low-rank certificate (``_laws._low_rank_ok``), pass without a Cholesky factorisation; whatever
the shortcuts do not prove is factorised, so every payload is accepted or refused as without
them, with the same message. Also: the BLAS thread limit of large checks reaches SciPy's LAPACK
in a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numpy.typing import NDArray

from ghofl.errors import StatsFormatError, StatsValidationError
from ghofl.stats import ClientStats, StatsMeta, _laws, compute_stats, load_stats, save_stats
from ghofl.stats.lapack import norm_inf_sym, syrk
from tests.helpers import assert_overflow_refused

F64 = NDArray[np.float64]
D = 96  # the certificate runs for n <= D / _LOW_RANK_RATIO = 12 samples


def _no_shortcuts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_laws, "_LOW_RANK_STEPS", -1)
    monkeypatch.setattr(_laws, "_is_zero_class", lambda m, counts: False)


def _factorisations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = _laws._ridged_factor_ok

    def counting(a: F64, ridge: float) -> bool:
        calls.append(a.shape[0])
        return real(a, ridge)

    monkeypatch.setattr(_laws, "_ridged_factor_ok", counting)
    return calls


def _planted(seed: int, d: int, rank: int, negative: float) -> F64:
    """Symmetric (d, d), max diagonal about 1: ``rank`` eigenvalues in (0.2, 1), one ``negative``."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    lam = np.zeros(d)
    lam[:rank] = rng.uniform(0.2, 1.0, rank)
    lam[-1] = negative
    m = (q * lam) @ q.T
    out: F64 = (m + m.T) / 2
    return out


def _two_classes(m: F64, n: int, seed: int = 0) -> dict[str, object]:
    """Arrays of mode ``full`` statistics: class 'a' of n samples, centred second moment ``m``
    (any mean), class 'b' without samples."""
    d = m.shape[0]
    mean = np.random.default_rng(seed).standard_normal(d) * 0.3
    s = m + n * np.outer(mean, mean)
    return {"counts": np.array([n, 0]), "sums": np.stack([n * mean, np.zeros(d)]),
            "class_scatter": np.stack([(s + s.T) / 2, np.zeros((d, d))])}


META = StatsMeta("full", D, ("a", "b"))


def _outcome(arrays: dict[str, object]) -> str:
    try:
        ClientStats(META, **arrays)  # type: ignore[arg-type]
    except StatsValidationError as exc:
        return str(exc)
    return "accepted"


# ---------------------------------------------------------------------- no factorisation
@pytest.mark.parametrize("n", [1, 2, 5, 12])
def test_few_samples_and_empty_classes_pass_without_a_factorisation(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n: int) -> None:
    x = np.random.default_rng(n).standard_normal((n, D)) * 3.0 + 1.0
    s = compute_stats(x, np.zeros(n, dtype=np.int64), ("a", "b"), mode="full")
    save_stats(s, tmp_path / "s.ghs")
    calls = _factorisations(monkeypatch)
    back = load_stats(tmp_path / "s.ghs")  # validated (compute_stats trusts its own sums)
    ClientStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=s.class_scatter)
    assert back.allclose(s, rtol=0.0)
    assert calls == []


def test_more_samples_are_factorised(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    n = D // _laws._LOW_RANK_RATIO + 1
    x = np.random.default_rng(1).standard_normal((n, D))
    save_stats(compute_stats(x, np.zeros(n, dtype=np.int64), ("a", "b"), mode="full"),
               tmp_path / "s.ghs")
    calls = _factorisations(monkeypatch)
    load_stats(tmp_path / "s.ghs")
    assert calls == [D]  # class 'a' only: 'b' is empty and zero


def test_a_full_rank_matrix_of_few_declared_samples_is_factorised_and_accepted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The certificate cannot prove a rank above the samples: the factorisation decides."""
    calls = _factorisations(monkeypatch)
    assert _outcome(_two_classes(_planted(3, D, D, 0.5), 4)) == "accepted"
    assert calls == [D]


# ---------------------------------------------------------------------- same decisions
@pytest.mark.parametrize(("k", "accepted"), [
    (None, True), (0.3, True), (0.8, True), (1.5, False), (100.0, False)])
def test_shortcuts_take_the_factorisations_decision_and_message(
        monkeypatch: pytest.MonkeyPatch, k: float | None, accepted: bool) -> None:
    """Rank 6 of 10 declared samples, one eigenvalue −k·ridge (relative to the scale)."""
    n = 10
    probe = _two_classes(_planted(7, D, 6, 0.0), n)
    sigma2 = float(np.max(np.diagonal(probe["class_scatter"][0])))  # type: ignore[index]
    negative = 0.0 if k is None else -k * _laws._PSD_RTOL * D * sigma2
    arrays = _two_classes(_planted(7, D, 6, negative), n)
    with_shortcuts = _outcome(arrays)
    _no_shortcuts(monkeypatch)
    assert with_shortcuts == _outcome(arrays)
    if accepted:
        assert with_shortcuts == "accepted"
    else:
        assert "the second moment S_c of class 'a' minus its mean part (A Aᵀ/N) is not " \
               "positive semi-definite" in with_shortcuts


def test_an_empty_class_with_off_diagonal_entries_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero sums and diagonal (the empty-class checks pass) but S_c ≠ 0: not PSD."""
    arrays = _two_classes(_planted(2, D, 3, 0.0), 5)
    arrays["class_scatter"][1, 0, 1] = arrays["class_scatter"][1, 1, 0] = 1.0  # type: ignore[index]
    with pytest.raises(StatsValidationError, match=r"the second moment S_c of class 'b' minus "
                       r"its mean part \(A Aᵀ/N\) is not positive semi-definite") as shortcut:
        ClientStats(META, **arrays)  # type: ignore[arg-type]
    _no_shortcuts(monkeypatch)
    with pytest.raises(StatsValidationError) as plain:
        ClientStats(META, **arrays)  # type: ignore[arg-type]
    assert str(shortcut.value) == str(plain.value)


def _bad_file(tmp_path: Path, what: str) -> Path:
    arrays = _two_classes(_planted(4, D, 5, 0.0), 8)
    scatter = arrays["class_scatter"]
    if what == "not PSD":  # class 'a' (8 samples: the certificate's) gets a negative direction
        v = np.random.default_rng(0).standard_normal(D)
        scatter[0] -= np.outer(v, v) * 1e-3  # type: ignore[index]
    elif what == "NaN":  # in the empty class, which the zero shortcut scans
        scatter[1, 3, 4] = scatter[1, 4, 3] = np.nan  # type: ignore[index]
    p = tmp_path / "bad.ghs"
    save_stats(ClientStats._trusted(META, **arrays), p)  # type: ignore[arg-type]
    if what == "tampered":
        raw = bytearray(p.read_bytes())
        raw[-9] ^= 0x01  # a byte of the data section
        p.write_bytes(bytes(raw))
    return p


@pytest.mark.parametrize(("what", "match"), [
    ("not PSD", r"the second moment S_c of class 'a' minus its mean part \(A Aᵀ/N\) is not "
                r"positive semi-definite"),  # the CLI's read_stats adds the file's name
    ("NaN", r"class_scatter contains NaN or infinite values"),
    ("tampered", r"'.*bad\.ghs' is corrupt: the SHA-256 of its content is .* but its header "
                 r"records"),
])
def test_bad_files_are_refused_with_the_same_message(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, what: str, match: str) -> None:
    p = _bad_file(tmp_path, what)
    with pytest.raises((StatsFormatError, StatsValidationError), match=match) as shortcut:
        load_stats(p)
    _no_shortcuts(monkeypatch)
    with pytest.raises((StatsFormatError, StatsValidationError)) as plain:
        load_stats(p)
    assert str(shortcut.value) == str(plain.value)


# ---------------------------------------------------------------------- the certificate
@pytest.mark.parametrize("seed", range(12))
def test_certificate_never_accepts_a_negative_direction_beyond_half_the_ridge(seed: int) -> None:
    rng = np.random.default_rng(seed)
    d, rank, ridge = 48, int(rng.integers(0, 6)), _laws._PSD_RTOL * 48
    t = float(rng.uniform(0.5, 50.0))
    a = np.asfortranarray(_planted(seed, d, rank, -t * ridge))
    assert not _laws._low_rank_ok(a, rank + 2, ridge)


@pytest.mark.parametrize("rank", [0, 1, 4])
def test_certificate_accepts_exact_low_rank(rank: int) -> None:
    d = 48
    a = np.asfortranarray(_planted(rank, d, rank, 0.0))
    assert _laws._low_rank_ok(a, rank + 1, _laws._PSD_RTOL * d)
    b = np.asfortranarray(_planted(rank, d, rank + 3, 0.0))  # more rank than steps
    assert not _laws._low_rank_ok(b, rank + 1, _laws._PSD_RTOL * d)


# ---------------------------------------------------------------------- BLAS helpers
def test_syrk_and_norm_inf_sym_match_numpy_on_one_triangle() -> None:
    rng = np.random.default_rng(0)
    d = 37
    m = rng.standard_normal((d, d))
    m = m + m.T
    w = np.asfortranarray(rng.standard_normal((d, 5)))
    for lower in (False, True):
        c = np.asfortranarray(m)
        junk = ~np.tri(d, dtype=bool) if lower else np.tri(d, k=-1, dtype=bool)
        c[junk] = 1e9  # the other triangle is neither read nor written
        syrk(c, w, -2.0, lower=lower)
        ref = m - 2.0 * w @ w.T
        keep = ~junk
        np.testing.assert_allclose(c[keep], ref[keep], rtol=1e-12, atol=1e-12)
        assert np.all(c[junk] == 1e9)
        assert norm_inf_sym(c, lower=lower) == pytest.approx(np.abs(ref).sum(axis=1).max())
    assert norm_inf_sym(np.zeros((0, 0), order="F")) == 0.0


def test_syrk_refuses_a_mismatched_update() -> None:
    c = np.zeros((4, 4), order="F")
    with pytest.raises(ValueError, match=r"the update must be a Fortran-ordered float64 array "
                       r"with 4 rows; got dtype float64, shape \(3, 2\)"):
        syrk(c, np.zeros((3, 2), order="F"))
    with pytest.raises(ValueError, match=r"the matrix to update must be a writeable, "
                       r"Fortran-ordered, square float64 array"):
        syrk(np.zeros((4, 4)), np.zeros((4, 2), order="F"))


# ---------------------------------------------------------------------- thread limit
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: every limit reads 1 thread")
def test_the_blas_thread_limit_reaches_scipy_lapack_in_a_fresh_process() -> None:
    """SciPy's LAPACK is loaded lazily; loaded inside ``threadpool_limits`` it would escape the
    limit, and the first factorisations would run with every BLAS thread in each pool thread."""
    code = (
        "import numpy as np, sys\n"
        "from threadpoolctl import threadpool_info\n"
        "import ghofl.stats._laws as laws, ghofl.stats.lapack as lapack\n"
        "from ghofl.stats import ClientStats, StatsMeta\n"
        "assert 'scipy.linalg' not in sys.modules\n"
        "laws._ONE_THREAD_FLOPS = 0.0\n"
        "seen = []\n"
        "real = lapack.potrf\n"
        "def spy(a, lower=True):\n"
        "    seen.extend(i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas')\n"
        "    return real(a, lower)\n"
        "lapack.potrf = spy\n"
        "x = np.random.default_rng(0).standard_normal((400, 40))\n"
        "s = x.T @ x\n"
        "ClientStats(StatsMeta('full', 40, ('a', 'b')), counts=np.array([400, 400]),\n"
        "            sums=np.stack([x.sum(0)] * 2), class_scatter=np.stack([s, s]))\n"
        "print(len(seen), max(seen))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split()
    assert int(out[0]) >= 2 and int(out[1]) == 1


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_entries_beyond_the_float_range_of_the_scale_are_refused_by_the_factorisation() -> None:
    """The certificate's arithmetic overflows (inf, NaN) without warnings; it proves nothing,
    and the factorisation refuses the class as before."""
    assert_overflow_refused(40)
