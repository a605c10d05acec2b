"""The SecAgg+ graph's sizing: exact probabilities against Monte Carlo with the real graph code,
the sparse-coalition and partial-sum attacks (issue 19, attacks 1 and 2) at reduced size, and
the survivors' connectivity check."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from scipy.stats import hypergeom

from ghofl.errors import ConfigError
from ghofl.secure.config import SecAggConfig, SessionParams
from ghofl.secure.graph import (
    HararyGraph,
    harary_neighbours,
    reveals_partial_sum,
    survivor_components,
)
from ghofl.secure.graph_params import (
    graph_degree,
    graph_risk,
    log2_abort,
    log2_disconnected,
    log2_exposure,
    log2_hypergeom_sf,
    required_parameters,
    share_threshold_for,
)


def _seed(rng: np.random.Generator) -> bytes:
    return rng.bytes(16)


def _old_defaults(n: int) -> tuple[int, int]:
    """The degree and share threshold of the protocol before issue 19."""
    k = 2 * math.ceil(1.5 * math.log2(n))
    return k, max(2, math.ceil((k + 1) * (n // 2 + 1) / n))


def _corrupt_neighbour_counts(n: int, k: int, bad: int, trials: int,
                              rng: np.random.Generator) -> np.ndarray:
    """Per trial: a fresh public seed, a random set of ``bad`` clients and one random other
    client; how many of that client's neighbours on the real graph are bad."""
    out = np.empty(trials, dtype=np.int64)
    for r in range(trials):
        graph = HararyGraph(n, k, _seed(rng))
        perm = rng.permutation(n)
        victim, marked = int(perm[0]), set(perm[1:bad + 1].tolist())
        out[r] = len(graph.neighbours(victim) & marked)
    return out


def _within(hits: int, trials: int, p: float, z: float = 4.5) -> bool:
    se = math.sqrt(max(p * (1 - p), 1e-12) / trials)
    return abs(hits / trials - p) <= z * se + 1.0 / trials


# ---------------------------------------------------------------------- exact tails
@pytest.mark.parametrize(("x", "population", "marked", "draws"),
                         [(3, 59, 20, 10), (0, 10, 3, 4), (7, 99, 33, 20), (200, 99_999, 33_333, 294),
                          (12, 40, 5, 12)])
def test_hypergeometric_tail_matches_scipy(x: int, population: int, marked: int,
                                           draws: int) -> None:
    want = float(hypergeom.logsf(x - 1, population, marked, draws)) / math.log(2)
    got = log2_hypergeom_sf(x, population, marked, draws)
    assert (got == -math.inf and want < -1e3) or got == pytest.approx(want, abs=1e-6)


def test_exposure_and_abort_are_certain_on_the_complete_graph() -> None:
    # n = 30: 10 corrupt, 10 dropped, 20 of the 30 holders survive
    assert log2_exposure(30, 29, 10) == 0.0 and log2_exposure(30, 29, 11) == -math.inf
    assert log2_abort(30, 29, 21) == 0.0 and log2_abort(30, 29, 20) == -math.inf


@pytest.mark.parametrize(("n", "k", "t"), [(60, 10, 4), (60, 10, 5), (120, 16, 7)])
def test_exposure_probability_matches_monte_carlo_on_the_real_graph(n: int, k: int,
                                                                   t: int) -> None:
    rng = np.random.default_rng(n * 100 + t)
    counts = _corrupt_neighbour_counts(n, k, n // 3, 1500, rng)
    p = 2.0 ** log2_exposure(n, k, t)
    assert 1e-3 < p < 0.9  # a level Monte Carlo can see
    assert _within(int((counts >= t).sum()), counts.size, p)


@pytest.mark.parametrize(("n", "k", "t"), [(60, 10, 6), (90, 12, 8)])
def test_abort_probability_matches_monte_carlo_on_the_real_graph(n: int, k: int, t: int) -> None:
    rng = np.random.default_rng(n + t)
    dropped = _corrupt_neighbour_counts(n, k, n // 3, 1500, rng)
    p = 2.0 ** log2_abort(n, k, t)
    assert 1e-3 < p < 0.9
    assert _within(int((k - dropped < t).sum()), dropped.size, p)  # own share not counted


# ---------------------------------------------------------------------- attack 1
def test_sparse_coalition_attack_at_the_old_defaults_is_reproduced() -> None:
    """A third of n = 60 corrupt: the old graph exposes about 1-2 % of the clients per round,
    as measured on the real graph, and the exact probability agrees."""
    n = 60
    k, t_s = _old_defaults(n)
    counts = _corrupt_neighbour_counts(n, k, n // 3, 2000, np.random.default_rng(19))
    p = 2.0 ** log2_exposure(n, k, t_s)
    assert p > 1e-3
    assert _within(int((counts >= t_s).sum()), counts.size, p)


@pytest.mark.parametrize("n", [60, 300])
def test_sparse_coalition_exposes_nobody_at_the_new_defaults(n: int) -> None:
    k, t_s = required_parameters(n)
    params = SecAggConfig(clip_norm=1.0).for_clients(n)
    assert (params.neighbours, params.share_threshold) == (k, t_s)
    assert log2_exposure(n, k, t_s) <= -40 and log2_abort(n, k, t_s) <= -20
    rng = np.random.default_rng(n)
    third = _corrupt_neighbour_counts(n, k, n // 3, 300, rng)
    assert (third >= t_s).sum() == 0
    # a coalition of t_s - 1 (the size that exposed 42 % before) never holds t_s shares
    small = _corrupt_neighbour_counts(n, k, t_s - 1, 100, rng)
    assert small.max() <= t_s - 1


# ---------------------------------------------------------------------- attack 2
def _bfs_components(adj: list[frozenset[int]], alive: set[int]) -> int:
    seen: set[int] = set()
    parts = 0
    for s in alive:
        if s in seen:
            continue
        parts += 1
        seen.add(s)
        todo = deque([s])
        while todo:
            u = todo.popleft()
            for v in adj[u]:
                if v in alive and v not in seen:
                    seen.add(v)
                    todo.append(v)
    return parts


@pytest.mark.parametrize(("n", "k"), [(40, 6), (60, 10), (25, 4), (12, 11)])
def test_partial_sum_check_flags_exactly_the_disconnected_survivor_sets(n: int, k: int) -> None:
    rng = np.random.default_rng(n * k)
    flagged = 0
    for _ in range(150):
        seed = _seed(rng)
        graph = HararyGraph(n, k, seed)
        adj = harary_neighbours(n, k, seed)
        if rng.random() < 0.5:  # dropouts along the graph: arcs of the public ring order
            order = np.argsort(graph.positions(range(n)))
            dead = set()
            for _ in range(int(rng.integers(1, 4))):
                start, length = int(rng.integers(n)), int(rng.integers(1, 2 * graph.half))
                dead |= {int(order[(start + j) % n]) for j in range(length)}
        else:
            dead = set(rng.choice(n, size=int(rng.integers(0, n)), replace=False).tolist())
        alive = set(range(n)) - dead
        comps = survivor_components(graph, alive)
        assert sorted(c for comp in comps for c in comp) == sorted(alive)
        assert len(comps) == _bfs_components(adj, alive)
        assert reveals_partial_sum(graph, alive) == (len(comps) > 1)
        flagged += len(comps) > 1
    assert flagged > 0 or k >= n - 1


def test_the_partial_sum_attack_of_issue_19_is_flagged() -> None:
    """Drop clients along the ring so that the survivors split in two; the check refuses."""
    n, k = 60, 10
    graph = HararyGraph(n, k, b"issue-19")
    order = np.argsort(graph.positions(range(n)))
    dead = {int(order[j]) for j in [*range(0, 5), *range(15, 20)]}  # two gaps of h = 5
    alive = set(range(n)) - dead
    comps = survivor_components(graph, alive)
    assert sorted(map(len, comps)) == [10, 40]
    assert reveals_partial_sum(graph, alive)
    assert not reveals_partial_sum(graph, alive | {int(order[2])})


def test_survivors_disconnect_no_more_often_than_the_bound() -> None:
    n, k = 40, 6
    rng = np.random.default_rng(2)
    drops, trials = 16, 800
    hits = sum(reveals_partial_sum(HararyGraph(n, k, _seed(rng)),
                                   rng.permutation(n)[drops:].tolist()) for _ in range(trials))
    bound = 2.0 ** log2_disconnected(n, k, drops / n)
    assert hits / trials <= bound + 4 * math.sqrt(bound / trials)


def test_connectivity_check_is_fast_at_100000_clients() -> None:
    n = 100_000
    k, _ = required_parameters(n)
    graph = HararyGraph(n, k, b"big")
    alive = np.random.default_rng(0).permutation(n)[: 2 * n // 3].tolist()
    assert not reveals_partial_sum(graph, alive)


def test_survivor_indices_out_of_range_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"survivor indices must lie in 0 … 9"):
        survivor_components(HararyGraph(10, 4, b"s"), [3, 10])


# ---------------------------------------------------------------------- the public seed
def test_the_graph_is_a_function_of_its_public_seed() -> None:
    a, b = HararyGraph(500, 40, b"seed-a"), HararyGraph(500, 40, b"seed-a")
    assert all(a.neighbours(i) == b.neighbours(i) for i in range(500))
    c = HararyGraph(500, 40, b"seed-b")
    assert any(a.neighbours(i) != c.neighbours(i) for i in range(500))
    assert a.degree == graph_degree(500, 40) == 40
    assert all(len(a.neighbours(i)) == 40 for i in range(0, 500, 37))


# ---------------------------------------------------------------------- sizing and config
@pytest.mark.parametrize("n", [100, 1000, 10_000, 100_000])
def test_required_parameters_meet_the_targets(n: int) -> None:
    k, t_s = required_parameters(n)
    risk = graph_risk(n, k, t_s)
    assert k < n - 1 and k % 2 == 0
    assert risk.log2_exposure_ <= -40 and risk.log2_abort_ <= -20
    assert risk.log2_cut_honest_ <= -40 and risk.log2_cut_survivors_ <= -20
    assert share_threshold_for(n, k) == t_s


def test_too_few_clients_for_the_targets_fall_back_to_the_complete_graph() -> None:
    with pytest.raises(ConfigError, match=r"no graph over 3 clients meets .* needs a threshold t "
                                          r"with 2 <= t <= 1"):
        required_parameters(3, 0.34, 0.67)
    params = SecAggConfig(clip_norm=1.0, corrupt_fraction=0.34,
                          dropout_fraction=0.67).for_clients(3)
    assert params.complete_graph and params.share_threshold == params.threshold == 3


def test_a_given_degree_below_the_minimum_is_refused_naming_it() -> None:
    k_min = required_parameters(1000)[0]
    with pytest.raises(ConfigError, match=rf"neighbours k=30 cannot meet exposure <= 2\^-40 "
                                          rf"and abort <= 2\^-20 .* give --neighbours {k_min}"):
        SecAggConfig(clip_norm=1.0, neighbours=30).for_clients(1000)
    ok = SecAggConfig(clip_norm=1.0, neighbours=k_min + 10).for_clients(1000)
    assert ok.share_threshold == share_threshold_for(1000, k_min + 10)


def test_a_given_threshold_the_corrupt_clients_reach_is_refused() -> None:
    """t ≤ ⌊γ·n⌋ would let the colluders alone unmask (refused); a t above what dropouts at δ
    leave only makes aborts likelier, never a leak (allowed: t = n means all must stay)."""
    with pytest.raises(ConfigError, match=r"complete graph needs a threshold t with 4 <= t <= 7"):
        SecAggConfig(clip_norm=1.0, threshold=3).for_clients(10)
    assert SecAggConfig(clip_norm=1.0, threshold=8).for_clients(10).threshold == 8
    assert SecAggConfig(clip_norm=1.0, threshold=10).for_clients(10).threshold == 10


def test_fractions_outside_the_unit_interval_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"fraction must lie in \[0, 1\); got 1.5"):
        SecAggConfig(clip_norm=1.0, corrupt_fraction=1.5)


def test_session_params_carry_the_share_threshold() -> None:
    params = SecAggConfig(clip_norm=2.0).for_clients(1000)
    back = SessionParams.from_items(params.items())
    assert back == params and back.share_threshold == required_parameters(1000)[1]
    legacy = tuple((k, v) for k, v in params.items() if k != "shares_needed")
    assert SessionParams.from_items(legacy).share_threshold == params.share_threshold
