"""The threaded accumulation (classes over threads with S_c, row ranges over threads without)
agrees with the one-thread path and with the sums it stands for, and its products are exactly
symmetric."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.stats import ClientStats, StatsAccumulator, _products, compute_stats
from ghofl.stats import accumulate as acc_mod

_ARRAYS = ("counts", "sums", "sq_sums", "class_scatter", "scatter")


def _oracle(z: np.ndarray, y: np.ndarray, c: int) -> dict[str, np.ndarray]:
    return {"counts": np.bincount(y, minlength=c),
            "sums": np.stack([z[y == k].sum(axis=0) for k in range(c)]),
            "sq_sums": np.stack([(z[y == k] ** 2).sum(axis=0) for k in range(c)]),
            "class_scatter": np.stack([z[y == k].T @ z[y == k] for k in range(c)]),
            "scatter": z.T @ z}


def _stats(x: np.ndarray, y: np.ndarray, c: int, mode: str, clip: float | None,
           threaded: bool, monkeypatch: pytest.MonkeyPatch, chunk: int | None = None,
           ) -> ClientStats:
    monkeypatch.setattr(acc_mod, "_THREADED_FLOPS", 0 if threaded else 1 << 62)
    acc = StatsAccumulator(c, x.shape[1], mode=mode, clip_norm=clip)  # type: ignore[arg-type]
    if chunk is not None:
        acc._chunk = chunk
    for start in range(0, x.shape[0], 250):  # several batches: fresh, then accumulated
        acc.update(x[start : start + 250], y[start : start + 250])
    return acc.result()


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag", "means"])
@pytest.mark.parametrize("c", [4, 40])
@pytest.mark.parametrize("kind", ["view", "float32", "clipped", "strided"])
@pytest.mark.parametrize("chunk", [None, 13])
def test_threaded_accumulation_matches_one_thread_and_the_sums(
    mode: str, c: int, kind: str, chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(c + len(kind))
    x = rng.standard_normal((700, 10))
    y = rng.integers(0, c, 700)
    clip = 2.5 if kind == "clipped" else None
    inputs: dict[str, np.ndarray] = {"view": x, "float32": x.astype(np.float32), "clipped": x,
                                     "strided": np.asfortranarray(x)}
    data = inputs[kind]
    threaded = _stats(data, y, c, mode, clip, True, monkeypatch, chunk)
    single = _stats(data, y, c, mode, clip, False, monkeypatch, chunk)
    z = data.astype(np.float64)
    if clip is not None:
        norms = np.linalg.norm(z, axis=1)
        z = z * np.minimum(1.0, clip * acc_mod._CLIP_SAFETY / norms)[:, None]
        assert threaded.n_clipped == single.n_clipped == int(np.sum(norms > clip)) > 0
    want = _oracle(z, y, c)
    for name in _ARRAYS:
        got, one = getattr(threaded, name), getattr(single, name)
        assert (got is None) == (one is None)
        if got is None:
            continue
        np.testing.assert_allclose(got, want[name], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, one, rtol=1e-12, atol=1e-12)
        if name in ("class_scatter", "scatter"):
            np.testing.assert_array_equal(got, np.swapaxes(got, -1, -2))


@pytest.mark.parametrize("mode", ["full", "pooled"])
def test_threaded_results_handed_over_between_batches_stay_fixed(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acc_mod, "_THREADED_FLOPS", 0)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((400, 6)), rng.integers(0, 3, 400)
    acc = StatsAccumulator(3, 6, mode=mode)  # type: ignore[arg-type]
    acc.update(x[:200], y[:200])
    first = acc.result()
    kept = {name: np.array(getattr(first, name)) for name in ("sums", "class_scatter", "scatter")
            if getattr(first, name) is not None}
    acc.update(x[200:], y[200:])
    second = acc.result()
    for name, value in kept.items():
        np.testing.assert_array_equal(getattr(first, name), value)
    np.testing.assert_allclose(second.sums, _oracle(x, y, 3)["sums"], rtol=1e-12)
    big = "class_scatter" if mode == "full" else "scatter"
    np.testing.assert_allclose(getattr(second, big), _oracle(x, y, 3)[big], rtol=1e-12)


@pytest.mark.parametrize("mode", ["full", "pooled"])
@pytest.mark.parametrize("threaded", [False, True])
def test_sums_beyond_float64_are_inf_without_a_warning(
    mode: str, threaded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acc_mod, "_THREADED_FLOPS", 0 if threaded else 1 << 62)
    x, y = np.full((40, 3), 1e200), np.arange(40) % 2
    with np.errstate(all="raise"):
        stats = compute_stats(x, y, 2, mode=mode)  # type: ignore[arg-type]
    second = stats.class_scatter if mode == "full" else stats.scatter
    assert second is not None and np.isinf(second).all()
    assert np.isfinite(stats.sums).all()


def test_spread_runs_every_task_under_the_callers_error_state() -> None:
    done: list[int] = []

    def task(i: int, scratch: _products.Scratch) -> None:
        done.append(i)
        if i == 3:
            np.float64(1e308) * np.float64(10.0)

    with np.errstate(over="raise"), pytest.raises(FloatingPointError, match="overflow"):
        _products.spread(6, task, [], threads=2)
    assert 3 in done
