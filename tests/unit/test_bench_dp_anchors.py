"""The outside DP anchors (ghofl.bench.dp_anchors) on a tiny synthetic problem."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import numpy as np
import pytest

from ghofl.bench import dp_anchors as da
from ghofl.errors import ConfigError


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} (extra dp-anchors) is not installed")


def _problem(seed: int = 0) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    means = 2.0 * np.eye(3, 6)
    y = rng.integers(0, 3, size=1500).astype(np.int64)
    x = da.clipped_rows(means[y] + 0.5 * rng.normal(size=(1500, 6)), 3.0) / 3.0
    return (x[:1000], y[:1000]), (x[1000:], y[1000:])


def test_clip_rows_bounds_norms_and_keeps_short_rows() -> None:
    x = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out = da.clipped_rows(x, 1.0)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), [1.0, 0.5, 0.0])
    np.testing.assert_allclose(out[0], [0.6, 0.8])


def test_exponential_select_is_seeded_and_prefers_the_best() -> None:
    picks = [da.exponential_select([10, 500, 20], 1.0, np.random.default_rng(s))
             for s in range(20)]
    assert picks == [1] * 20
    a = [da.exponential_select([5, 6, 7], 0.1, np.random.default_rng(3)) for _ in range(2)]
    assert a[0] == a[1]


def test_dpsgd_without_noise_learns_and_matches_the_clipped_gradient() -> None:
    _needs("opacus")
    (x, y), (xt, yt) = _problem()
    w = da.train_dpsgd(x, y, 3, da.SGDConfig(1.0, 4.0, 5, 200), 0.0,
                       np.random.default_rng(0))
    assert np.mean(np.argmax(xt @ w[:-1] + w[-1], axis=1) == yt) > 0.9
    # one full-batch step (rate 1) from zero: lr/n * sum of per-sample clipped gradients
    clip = 0.1
    w1 = da.train_dpsgd(x, y, 3, da.SGDConfig(clip, 1.0, 1, 10_000), 0.0,
                        np.random.default_rng(0))
    xb = np.hstack([x, np.ones((len(y), 1))])
    err = np.full((len(y), 3), 1 / 3) - np.eye(3)[y]
    norms = np.linalg.norm(err, axis=1) * np.linalg.norm(xb, axis=1)
    g = err * np.minimum(1, clip / norms)[:, None]
    np.testing.assert_allclose(w1, -(xb.T @ g) / len(y), rtol=1e-4, atol=1e-6)


def test_dpsgd_probe_runs_is_seeded_and_states_the_search_cost() -> None:
    _needs("opacus")
    train, test = _problem()
    grid = [da.SGDConfig(1.0, 2.0, 2, 200), da.SGDConfig(1.0, 8.0, 2, 200)]
    a = da.dpsgd_probe(train, test, 3, 2.0, 1e-5, grid, seed=4)
    b = da.dpsgd_probe(train, test, 3, 2.0, 1e-5, grid, seed=4)
    assert a == b
    assert 0.0 <= a["accuracy"] <= 1.0 and len(a["val_accuracy"]) == 2
    # two runs at eps 2 each compose to more than 2 and less than 4 (RDP beats naive sum)
    assert 2.0 < a["eps_runs_composed"] < 4.0
    assert a["eps_search"] == max(a["eps_runs_composed"], a["eps_select"])
    one = da.composed_epsilon([(a["sigma"][0], 200 / 900, 2 * round(900 / 200))], 1e-5)
    assert one == pytest.approx(2.0, abs=0.05)


def test_diffprivlib_anchors_run_and_are_seeded() -> None:
    _needs("diffprivlib")
    train, test = _problem()
    nb = [da.diffprivlib_nb(train, test, 8.0, (-1.0, 1.0), seed=1) for _ in range(2)]
    lr = [da.diffprivlib_lr(train, test, 8.0, 1.0, seed=1) for _ in range(2)]
    assert nb[0] == nb[1] and lr[0] == lr[1]
    assert nb[0] > 0.6 and lr[0] > 0.6  # well separated classes at a loose ε


@pytest.mark.parametrize("module", ["opacus", "diffprivlib"])
def test_missing_extra_is_named(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *a: Any, **k: Any) -> Any:
        if name.split(".")[0] == module:
            raise ImportError(f"No module named {module!r}")
        return real(name, *a, **k)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ConfigError, match=r"dp-anchors.*pip install 'ghofl\[dp-anchors\]'"):
        da.require(module)
