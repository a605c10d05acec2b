"""The checks of large payloads spread over threads take the decisions of a loop in order.

:func:`ghofl.stats._threads.first_failing` (the smallest failing task, whatever the threads),
the per-class PSD check and the finiteness check with their thread thresholds at 0 (every
payload threaded), the threaded unpacking of triangles, and the digest computed while the
payload is validated (a changed file is refused as corrupt before any validation error).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.errors import StatsFormatError, StatsValidationError
from ghofl.stats import ClientStats, _laws, compute_stats, schema
from ghofl.stats._threads import first_failing
from ghofl.stats.client_stats import laws
from ghofl.stats.codec import load_stats, pack_upper, save_stats, unpack_upper


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=0, max_size=40), st.integers(1, 4))
def test_first_failing_is_the_first_failure_of_a_loop(ok: list[bool], threads: int) -> None:
    expected = next((i for i, good in enumerate(ok) if not good), None)
    assert first_failing(len(ok), lambda i, _: ok[i], lambda: None, threads) == expected


def test_first_failing_gives_each_thread_its_scratch_and_raises_task_errors() -> None:
    seen: list[list[int]] = []

    def check(i: int, buf: list[int]) -> bool:
        buf.append(i)
        if i == 7:
            raise ValueError("task 7 broke")
        return True

    def scratch() -> list[int]:
        buf: list[int] = []
        seen.append(buf)
        return buf

    with pytest.raises(ValueError, match="task 7 broke"):
        first_failing(20, check, scratch, threads=3)
    assert len(seen) == 3 and sorted(i for buf in seen for i in buf) == list(range(20))


def _classes_with_one_negative(rng: np.random.Generator, c: int, d: int, bad: list[int],
                               k: float) -> ClientStats:
    """Exactly PSD, rank-deficient class scatters (n_c < d samples), except the classes
    ``bad``: one eigenvalue −k·scale added (scale = the largest diagonal entry)."""
    x = rng.standard_normal((c * (d // 2), d)) / np.sqrt(np.arange(1, d + 1))
    y = np.repeat(np.arange(c), d // 2)
    s = compute_stats(x, y, c, mode="full")
    scatter = np.array(s.class_scatter)
    for j in bad:
        centred = scatter[j] - np.outer(s.sums[j], s.sums[j]) / s.counts[j]
        _, q = np.linalg.eigh(centred)
        null = q[:, 0]  # an eigenvalue 0 of the rank-deficient scatter
        scatter[j] -= k * float(np.max(np.diagonal(scatter[j]))) * np.outer(null, null)
    return ClientStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=scatter)


@pytest.fixture
def threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check threaded, whatever the size."""
    monkeypatch.setattr(_laws, "_ONE_THREAD_FLOPS", 0.0)
    monkeypatch.setattr(laws, "_THREADED_ENTRIES", 0)
    monkeypatch.setattr(schema, "_THREADED_ENTRIES", 0)


@pytest.mark.usefixtures("threaded")
def test_threaded_psd_check_accepts_exact_psd_and_names_the_first_refused_class() -> None:
    rng = np.random.default_rng(3)
    c, d = 9, 48
    good = _classes_with_one_negative(rng, c, d, [], 0.0)  # rank d/2 − 1 < d: accepted
    assert good.num_classes == c
    with pytest.raises(StatsValidationError, match=(
            r"the second moment S_c of class '4' minus its mean part .* is not positive "
            r"semi-definite .* its smallest eigenvalue is -0.001 times the scale")):
        _classes_with_one_negative(rng, c, d, [4, 2 + 5, 8], 1e-3)


@pytest.mark.usefixtures("threaded")
def test_threaded_finiteness_check_refuses_a_nan_in_any_class() -> None:
    rng = np.random.default_rng(4)
    s = _classes_with_one_negative(rng, 6, 16, [], 0.0)
    scatter = np.array(s.class_scatter)
    scatter[5, 3, 3] = np.nan
    with pytest.raises(StatsValidationError, match="class_scatter contains NaN or infinite"):
        ClientStats(s.meta, counts=s.counts, sums=s.sums, class_scatter=scatter)


@pytest.mark.usefixtures("threaded")
@pytest.mark.parametrize("c", [1, 3, 11])
def test_threaded_unpack_inverts_pack(c: int) -> None:
    rng = np.random.default_rng(c)
    a = rng.standard_normal((c, 70, 70))
    m = a + a.transpose(0, 2, 1)
    assert np.array_equal(unpack_upper(pack_upper(m), 70), m)


@pytest.mark.usefixtures("threaded")
def test_threaded_load_round_trips(tmp_path: Path) -> None:
    s = _classes_with_one_negative(np.random.default_rng(5), 5, 24, [], 0.0)
    save_stats(s, tmp_path / "a.ghs")
    back = load_stats(tmp_path / "a.ghs")
    assert back.class_scatter is not None and s.class_scatter is not None
    assert np.array_equal(back.class_scatter, s.class_scatter)


def test_a_changed_file_is_refused_as_corrupt_before_its_content_is(tmp_path: Path) -> None:
    """A NaN written into a saved payload: the digest refusal, not the finiteness one."""
    s = compute_stats(np.random.default_rng(6).standard_normal((40, 8)),
                      np.arange(40) % 2, 2, mode="full")
    p = tmp_path / "a.ghs"
    save_stats(s, p)
    raw = bytearray(p.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    t = json.loads(raw[8 : 8 + n])["class_scatter_triu"]
    at = 8 + n + t["data_offsets"][0]
    raw[at : at + 8] = np.array([np.nan]).tobytes()
    p.write_bytes(bytes(raw))
    with pytest.raises(StatsFormatError, match=r"is corrupt: the SHA-256 of its content"):
        load_stats(p)
