"""Laws of the held-out section under any partition (issue 10).

For any split of a dataset into clients (empty clients and clients missing classes included),
any held-out fraction and seed, with the samples' global ids:

* the aggregate's totals AND held-out section equal the centralised ones (same held-out
  samples, counts exact, sums to 1e-10 relative);
* the fitting part of the aggregate is the sum of the clients' fitting parts;
* removing a client restores the rest exactly in both sections;
* flattening (the secure-aggregation and store layout) round-trips exactly, and the
  fixed-point encoding of the sum decodes to the plain sum.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.secure.fixedpoint import FixedPointCodec
from ghofl.stats import ClientStats, compute_stats, holdout_mask, sum_stats
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.schema import SCHEMAS, schema_for

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def federations(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, list[np.ndarray],
                                          str, float, int]:
    seed = draw(st.integers(0, 2**32 - 1))
    c = draw(st.integers(1, 4))
    d = draw(st.integers(1, 5))
    n = draw(st.integers(0, 120))
    k = draw(st.integers(1, 12))
    mode = draw(st.sampled_from(tuple(SCHEMAS)))
    fraction = draw(st.sampled_from([0.05, 0.2, 0.5]))
    split_seed = draw(st.integers(0, 2**63 - 1))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n).astype(np.int64)
    x = rng.normal(size=(n, d)) * 10.0 ** rng.uniform(-2, 2) + rng.normal(size=d)
    owner = rng.integers(0, k, n)
    parts = [np.flatnonzero(owner == u) for u in range(k)]
    return x, y, c, parts, mode, fraction, split_seed


def _client(x: np.ndarray, y: np.ndarray, c: int, idx: np.ndarray, mode: str, f: float,
            seed: int, clip: float | None = None) -> ClientStats:
    return compute_stats(x[idx], y[idx], c, mode, holdout_fraction=f,  # type: ignore[arg-type]
                         holdout_seed=seed, sample_ids=idx, clip_norm=clip)


@SETTINGS
@given(federations())
def test_sections_are_partition_invariant(fed: tuple) -> None:  # type: ignore[type-arg]
    x, y, c, parts, mode, f, seed = fed
    clients = [_client(x, y, c, p, mode, f, seed) for p in parts]
    total = sum_stats(clients)
    central = compute_stats(x, y, c, mode, holdout_fraction=f,  # type: ignore[arg-type]
                            holdout_seed=seed)
    assert total.holdout is not None and central.holdout is not None
    assert np.array_equal(total.counts, central.counts)
    assert np.array_equal(total.holdout.counts, central.holdout.counts)
    mask = holdout_mask(np.arange(y.size), f, seed)
    assert np.array_equal(central.holdout.counts, np.bincount(y[mask], minlength=c))
    assert total.allclose(central, rtol=1e-10)
    fit = total.fitting_part()
    parts_fit = sum_stats(s.fitting_part() for s in clients)
    assert np.array_equal(fit.counts, parts_fit.counts)
    assert fit.allclose(parts_fit, rtol=1e-9, atol=1e-9 * (1 + float(np.abs(x).max(initial=0))))
    if len(clients) > 1:
        rest = total - clients[0]
        assert rest.holdout is not None
        assert np.array_equal(rest.holdout.counts, sum_stats(clients[1:]).holdout.counts)  # type: ignore[union-attr]


@SETTINGS
@given(federations())
def test_flat_layout_and_fixed_point_sum(fed: tuple) -> None:  # type: ignore[type-arg]
    x, y, c, parts, mode, f, seed = fed
    clip = 1.0 + float(np.linalg.norm(x, axis=1).max(initial=0.0))
    clients = [_client(x, y, c, p, mode, f, seed, clip) for p in parts]
    sch = schema_for(mode)
    for s in clients[:3]:
        ints, floats = sch.flatten(s)
        meta = s.meta
        assert ints.size == sum(g.size for g in sch.int_layout(c, meta.dim, True))
        assert floats.size == sum(g.size for g in sch.float_layout(c, meta.dim, True))
        back = unflatten_stats(meta, ints, floats)
        assert back.allclose(s, rtol=0.0)
    codec = FixedPointCodec(num_clients=len(clients), max_samples=max(y.size, 1), clip_norm=clip)
    with np.errstate(over="ignore"):
        words = sum((codec.encode(s) for s in clients[1:]), codec.encode(clients[0]))
    total = codec.decode(clients[0].meta, words)
    plain = sum_stats(clients)
    assert total.holdout is not None and plain.holdout is not None
    assert np.array_equal(total.counts, plain.counts)
    assert np.array_equal(total.holdout.counts, plain.holdout.counts)
    assert total.holdout.n_clipped == plain.holdout.n_clipped
    assert total.allclose(plain, rtol=1e-12, atol=1e-12)
