"""Subtraction laws of ClientStats on long streams (river-style unlearning).

Whatever subset of a stream of payloads is removed from its total, one payload at a time and
in any order, what is left equals the total of the remaining payloads: identical counts and
clipped counts, arrays within a tolerance relative to the magnitudes of the whole stream (the
rounding a difference inherits). Every upload mode, with and without a projection and a
clipping bound; clients may lack classes, so classes empty out along the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.stats import ClientStats, ProjectionSpec, compute_stats, sum_stats
from ghofl.stats.meta import Mode
from ghofl.stats.schema import SCHEMAS

MODES: tuple[Mode, ...] = tuple(SCHEMAS)
SETTINGS = settings(max_examples=40, deadline=None)
#: Error of a difference relative to the largest entry of the stream's total, per array.
RTOL = 1e-10


@dataclass
class Stream:
    payloads: list[ClientStats]
    removed: list[int]  # indices, in removal order
    events: list[tuple[str, int]]  # ("add" | "remove", index), a valid add/remove sequence


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    seed = draw(st.integers(0, 2**32 - 1))
    mode: Mode = draw(st.sampled_from(MODES))
    project, clip = draw(st.booleans()), draw(st.booleans())
    k = draw(st.integers(3, 40))
    rng = np.random.default_rng(seed)
    c, d = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    proj = ProjectionSpec(int(rng.integers(0, 1000)), d, int(rng.integers(1, 5))) if project \
        else None
    clip_norm = float(10 ** rng.uniform(-1, 3)) if clip else None

    def one() -> ClientStats:
        n = int(rng.integers(0, 25))
        own = rng.choice(c, size=int(rng.integers(1, c + 1)), replace=False)  # classes held
        scale = 10.0 ** rng.uniform(-2, 2)
        x = rng.normal(scale=scale, size=(n, d)) + rng.normal(scale=5 * scale, size=d)
        return compute_stats(x, rng.choice(own, n), c, mode, projection=proj,
                             clip_norm=clip_norm)

    payloads = [one() for _ in range(k)]
    removed = [int(i) for i in rng.permutation(k)[: int(rng.integers(1, k))]]
    events: list[tuple[str, int]] = []
    present: set[int] = set()
    for i in range(k):  # interleave: every add, and now and then a removal of a present one
        events.append(("add", i))
        present.add(i)
        if rng.random() < 0.4:
            j = int(rng.choice(sorted(present)))
            events.append(("remove", j))
            present.remove(j)
    return Stream(payloads, removed, events)


def _assert_equal_within(got: ClientStats, want: ClientStats, scale: ClientStats) -> None:
    np.testing.assert_array_equal(got.counts, want.counts)
    assert got.n_clipped == want.n_clipped
    for name, a in got.arrays().items():
        b, ref = want.arrays()[name], scale.arrays()[name]
        if a is None or name == "counts":
            assert b is None or name == "counts"
            continue
        peak = float(np.max(np.abs(ref), initial=0.0))
        err = float(np.max(np.abs(a - b), initial=0.0))
        assert err <= RTOL * peak, f"{name}: error {err:.3g} > {RTOL} × {peak:.3g}"


def _zero_where_empty(s: ClientStats) -> None:
    empty = s.counts == 0
    assert not np.any(s.sums[empty])
    assert s.meta.mode in ("means", "gram") or not np.any(s.diag_sums[empty])
    if s.n_samples == 0:
        assert all(not np.any(v) for v in s.arrays().values() if v is not None)


@SETTINGS
@given(stream=streams())
def test_total_minus_a_subset_is_the_total_of_the_rest(stream: Stream) -> None:
    total = sum_stats(stream.payloads)
    left = total
    for i in stream.removed:
        left = left - stream.payloads[i]
    gone = set(stream.removed)
    rest = [p for i, p in enumerate(stream.payloads) if i not in gone]
    want = sum_stats(rest) if rest else ClientStats.zeros(total.meta)
    _assert_equal_within(left, want, total)
    _zero_where_empty(left)


@SETTINGS
@given(stream=streams())
def test_interleaved_adds_and_removals_track_the_present_set(stream: Stream) -> None:
    meta = stream.payloads[0].meta
    running, present, biggest = ClientStats.zeros(meta), set(), ClientStats.zeros(meta)
    for what, i in stream.events:
        if what == "add":
            running = running + stream.payloads[i]
            present.add(i)
        else:
            running = running - stream.payloads[i]
            present.remove(i)
        biggest = biggest + stream.payloads[i] if what == "add" else biggest
        want = sum_stats([stream.payloads[j] for j in sorted(present)]) if present \
            else ClientStats.zeros(meta)
        _assert_equal_within(running, want, biggest)
        _zero_where_empty(running)


@SETTINGS
@given(stream=streams())
def test_removing_everything_gives_exact_zeros(stream: Stream) -> None:
    left = sum_stats(stream.payloads)
    for p in reversed(stream.payloads):
        left = left - p
    assert left.n_samples == 0 and left.n_clipped == 0
    assert left.allclose(ClientStats.zeros(left.meta), rtol=0.0)
