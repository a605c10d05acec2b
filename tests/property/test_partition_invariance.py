"""Partition invariance and merge laws of ClientStats (method.md §1, design habit 10).

For any split of a dataset into 1..100 clients — empty clients and clients missing classes
included — the aggregate equals the centralised statistics (to 1e-10 relative) in every upload
mode, with and without a projection, and every closed-form head predicts the same labels.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.data.partition import dirichlet_partition
from ghofl.heads.registry import head_class, make_head
from ghofl.moments.core import GhoflWarning
from ghofl.secure import InMemoryTransport, PlainClient, PlainServer, run_aggregation
from ghofl.stats import ClientStats, ProjectionSpec, compute_stats, sum_stats
from ghofl.stats.meta import Mode
from ghofl.stats.schema import SCHEMAS, mode_supports

CLOSED_FORM_HEADS = ("nb", "lda", "qda", "fedcgs")
MODES: tuple[Mode, ...] = tuple(SCHEMAS)
SETTINGS = settings(max_examples=60, deadline=None)
HEAD_SETTINGS = settings(max_examples=30, deadline=None)  # each example fits 8 heads twice


@dataclass
class Federation:
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    parts: list[np.ndarray]
    projection: ProjectionSpec | None


def _split(rng: np.random.Generator, n: int, k: int, how: str, y: np.ndarray) -> list[np.ndarray]:
    if how == "dirichlet":
        return dirichlet_partition(y, k, float(rng.choice([0.01, 0.1, 1.0])), rng)
    owner = rng.integers(0, k, n)  # uniform owners: empty clients whenever k > n
    return [np.flatnonzero(owner == u) for u in range(k)]


@st.composite
def federations(draw: st.DrawFn, min_per_class: int = 0) -> Federation:
    seed = draw(st.integers(0, 2**32 - 1))
    c = draw(st.integers(1, 4))
    d = draw(st.integers(1, 5))
    k = draw(st.integers(1, 100))
    extra = draw(st.integers(0, 60))
    how = draw(st.sampled_from(["uniform", "dirichlet"]))
    project = draw(st.booleans())
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.repeat(np.arange(c), min_per_class), rng.integers(0, c, extra)])
    y = rng.permutation(y).astype(np.int64)
    scale = 10.0 ** rng.uniform(-2, 2)
    means = rng.normal(scale=3.0, size=(c, d))
    x = (means[y] + rng.normal(size=(y.size, d))) * scale + rng.normal(scale=scale, size=d)
    proj = ProjectionSpec(int(rng.integers(0, 1000)), d, int(rng.integers(1, 5))) if project \
        else None
    return Federation(x, y, c, _split(rng, y.size, k, how, y), proj)


def _client_stats(f: Federation, mode: Mode) -> list[ClientStats]:
    return [compute_stats(f.x[idx], f.y[idx], f.num_classes, mode, projection=f.projection)
            for idx in f.parts]


@pytest.mark.parametrize("mode", MODES)
@SETTINGS
@given(f=federations())
def test_aggregate_equals_centralised(mode: Mode, f: Federation) -> None:
    central = compute_stats(f.x, f.y, f.num_classes, mode, projection=f.projection)
    clients = _client_stats(f, mode)
    assert sum_stats(clients).allclose(central, rtol=1e-10)
    ids = [f"c{i}" for i in range(len(clients))]
    report = run_aggregation(PlainServer(ids), InMemoryTransport(
        [PlainClient(c, s) for c, s in zip(ids, clients, strict=True)]))
    assert report.total.allclose(central, rtol=1e-10)
    assert len(report.survivors) == len(f.parts)


def _assert_same_predictions(a: np.ndarray, b: np.ndarray, scores: np.ndarray) -> None:
    """Labels must agree wherever the best two scores are not a floating-point tie."""
    top2 = np.sort(scores, axis=1)[:, -2:] if scores.shape[1] > 1 else None
    if top2 is None:
        np.testing.assert_array_equal(a, b)
        return
    tie = (top2[:, 1] - top2[:, 0]) <= 1e-9 * (1.0 + np.abs(top2[:, 1]))
    np.testing.assert_array_equal(a[~tie], b[~tie])


@HEAD_SETTINGS
@given(f=federations(min_per_class=8))
def test_closed_form_heads_predict_identically(f: Federation) -> None:
    central = compute_stats(f.x, f.y, f.num_classes, "full", projection=f.projection)
    total = sum_stats(_client_stats(f, "full"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GhoflWarning)
        for name in CLOSED_FORM_HEADS:
            for mode in MODES:
                if not mode_supports(mode, head_class(name).min_mode):
                    continue
                ref = make_head(name).fit_from_stats(central.to_mode(mode))
                fed = make_head(name).fit_from_stats(total.to_mode(mode))
                scores = ref.class_scores(f.x)
                _assert_same_predictions(ref.predict(f.x), fed.predict(f.x), scores)


# ---------------------------------------------------------------------- merge laws
@st.composite
def stats_triples(draw: st.DrawFn) -> tuple[ClientStats, ClientStats, ClientStats]:
    seed = draw(st.integers(0, 2**32 - 1))
    mode: Mode = draw(st.sampled_from(MODES))
    c = draw(st.integers(1, 4))
    d = draw(st.integers(1, 5))
    rng = np.random.default_rng(seed)
    scale = 10.0 ** rng.uniform(-2, 2)

    def one() -> ClientStats:
        n = int(rng.integers(0, 30))
        return compute_stats(rng.normal(scale=scale, size=(n, d)), rng.integers(0, c, n), c, mode)

    return one(), one(), one()


@SETTINGS
@given(t=stats_triples())
def test_addition_is_associative(t: tuple[ClientStats, ClientStats, ClientStats]) -> None:
    a, b, c = t
    assert ((a + b) + c).allclose(a + (b + c), rtol=1e-12)


@SETTINGS
@given(t=stats_triples())
def test_addition_is_commutative(t: tuple[ClientStats, ClientStats, ClientStats]) -> None:
    a, b, _ = t
    assert (a + b).allclose(b + a, rtol=0.0)


@SETTINGS
@given(t=stats_triples())
def test_zeros_is_the_identity(t: tuple[ClientStats, ClientStats, ClientStats]) -> None:
    a, _, _ = t
    zero = ClientStats.zeros(a.meta)
    assert (a + zero).allclose(a, rtol=0.0)
    assert (zero + a).allclose(a, rtol=0.0)
    builtin_sum = sum([a])
    assert isinstance(builtin_sum, ClientStats) and builtin_sum.allclose(a, rtol=0.0)


@SETTINGS
@given(t=stats_triples())
def test_subtraction_undoes_addition(t: tuple[ClientStats, ClientStats, ClientStats]) -> None:
    a, b, _ = t
    assert ((a + b) - b).allclose(a, rtol=1e-10, atol=1e-12 * _scale(b))


def _scale(s: ClientStats) -> float:
    return max(float(np.max(np.abs(v), initial=0.0)) for k, v in s.arrays().items()
               if v is not None and k != "counts")
