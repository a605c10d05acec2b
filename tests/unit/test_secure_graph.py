"""The SecAgg+ graph's sizing: exact probabilities against Monte Carlo with the real graph code,
the sparse-coalition and partial-sum attacks (issue 19, attacks 1 and 2) at reduced size, and
the survivors' connectivity check."""

from __future__ import annotations

import itertools
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
    GraphRisk,
    graph_degree,
    graph_risk,
    log2_abort,
    log2_cut,
    log2_disconnected,
    log2_exposure,
    log2_hypergeom_sf,
    meets_targets,
    min_relayed,
    relayed_counts,
    required_parameters,
    share_threshold_for,
    worst_relayed,
)
from ghofl.secure.policy import ClientPolicy


def _seed(rng: np.random.Generator) -> bytes:
    return rng.bytes(16)


def _old_defaults(n: int) -> tuple[int, int]:
    """The degree and share threshold of the protocol before issue 19."""
    k = 2 * math.ceil(1.5 * math.log2(n))
    return k, max(2, math.ceil((k + 1) * (n // 2 + 1) / n))


def _corrupt_neighbour_counts(m: int, k: int, bad: int, trials: int,
                              rng: np.random.Generator) -> np.ndarray:
    """Per trial, the real graph over m relayed clients built from a fresh public seed; how many
    of client 0's neighbours lie in the coalition {1, …, bad}.

    The coalition and the honest client are fixed before the seed (as a server choosing the
    relayed set would fix them), so only the graph's random ring order varies: the counts
    follow Hypergeometric(m − 1, bad, degree) only if that order is uniform."""
    out = np.empty(trials, dtype=np.int64)
    marked = set(range(1, bad + 1))
    for r in range(trials):
        out[r] = len(HararyGraph(m, k, _seed(rng)).neighbours(0) & marked)
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
    # 25 of them relayed: the 10 corrupt among them, 5 of the 10 dropouts still to come
    assert relayed_counts(30, 25) == (10, 5)
    assert log2_exposure(30, 24, 10, relayed=25) == 0.0
    assert log2_exposure(30, 24, 11, relayed=25) == -math.inf
    assert log2_abort(30, 24, 21, relayed=25) == 0.0
    assert log2_abort(30, 24, 20, relayed=25) == -math.inf


# ---------------------------------------------------------------------- relayed sets
_GAMMA = _DELTA = 1 / 3


def _scipy_exposure(n: int, m: int, k: int, t_s: int, gamma: float = _GAMMA) -> float:
    """log2 P(an honest client is exposed) on the graph over m relayed clients, every corrupt
    client relayed: P(Hypergeom(m − 1, min(⌊γn⌋, m − 1), graph_degree(m, k)) ≥ t_s) (scipy)."""
    c = min(n // 3 if gamma == _GAMMA else math.floor(gamma * n), m - 1)
    return float(hypergeom.logsf(t_s - 1, m - 1, c, graph_degree(m, k))) / math.log(2)


def _scipy_abort(n: int, m: int, k: int, t_s: int) -> float:
    """log2 P(fewer than t_s of an honest client's neighbours survive) over m relayed clients
    with ⌊δn⌋ − (n − m) dropouts still to come (its own share counts on the complete graph)."""
    d, dropped = graph_degree(m, k), max(0, n // 3 - (n - m))
    own = 1 if d >= m - 1 else 0
    return float(hypergeom.logsf(d + own - t_s, m - 1, dropped, d)) / math.log(2)


def _same(got: float, want: float) -> bool:
    return (got == -math.inf and want < -1e3) or got == pytest.approx(want, abs=1e-6)


def _relayed_grid(n: int, between: int = 3) -> list[int]:
    """m_min, m_min + 1, ``between`` evenly spaced sizes, n − 1 and n."""
    lo = min_relayed(n, _DELTA)
    inner = [lo + (n - lo) * j // (between + 1) for j in range(1, between + 1)]
    return sorted({lo, lo + 1, *inner, n - 1, n})


@pytest.mark.parametrize(("n", "m", "k", "t_s"), [
    (60, 40, 10, 6), (60, 50, 10, 6), (60, 60, 10, 6), (100, 67, 66, 34), (100, 80, 66, 34),
    (100, 67, 32, 30), (1000, 667, 228, 122), (1000, 800, 228, 122), (1000, 1000, 228, 122),
    (1000, 667, 56, 52), (10_000, 6667, 288, 154), (100_000, 66_667, 72, 65),
])
def test_exposure_and_abort_over_the_relayed_set_match_scipy(n: int, m: int, k: int,
                                                             t_s: int) -> None:
    """Exposure: Hypergeom(m − 1, ⌊γn⌋, graph_degree(m, k)) ≥ t_s; abort: the ⌊δn⌋ − (n − m)
    dropouts still to come (none at m_min)."""
    assert relayed_counts(n, m) == (min(n // 3, m - 1), max(0, n // 3 - (n - m)))
    assert _same(log2_exposure(n, k, t_s, _GAMMA, relayed=m), _scipy_exposure(n, m, k, t_s))
    assert _same(log2_abort(n, k, t_s, _DELTA, relayed=m), _scipy_abort(n, m, k, t_s))
    risk = GraphRisk(n, k, t_s, _GAMMA, _DELTA, relayed=m)
    c, dropped = relayed_counts(n, m)
    assert risk.relayed_ == m and risk.log2_exposure_ == log2_exposure(n, k, t_s, relayed=m)
    assert risk.log2_cut_honest_ == log2_cut(m, k, c + dropped)
    assert risk.log2_cut_survivors_ == log2_cut(m, k, dropped)
    if m == n:
        assert log2_exposure(n, k, t_s) == log2_exposure(n, k, t_s, relayed=n)


def test_relayed_counts_refuse_sizes_outside_the_roster() -> None:
    assert relayed_counts(50, 30, 0.6, 0.5) == (29, 5)  # at most m − 1 corrupt besides the client
    with pytest.raises(ConfigError, match=r"between 2 and n = 10 clients; got 11"):
        relayed_counts(10, 11)
    with pytest.raises(ConfigError, match=r"between 2 and n = 10 clients; got 1"):
        log2_exposure(10, 4, 3, relayed=1)


@pytest.mark.parametrize("n", [200, 1000, 10_000, 100_000])
def test_n_sized_parameters_are_exposed_as_fewer_clients_are_relayed(n: int) -> None:
    """The advertised (k, t_s) are sized for all n relayed; kept for a smaller relayed set
    their exposure grows as m shrinks (the corrupt clients are a larger
    share of it), to about 2^-3 at m_min: why the parameters are derived per relayed size."""
    k, t_s = required_parameters(n, _GAMMA, _DELTA)
    lo = min_relayed(n, _DELTA)
    ms = list(range(lo, n + 1)) if n <= 1000 else _relayed_grid(n, between=10)
    exp = [log2_exposure(n, k, t_s, _GAMMA, relayed=m) for m in ms]
    assert all(a >= b for a, b in itertools.pairwise(exp))  # non-increasing in m
    assert exp[-1] <= -40 and exp[0] > -6  # safe with all n relayed, not at m_min
    for m in (ms[0], ms[len(ms) // 2], ms[-1]):
        assert _same(log2_exposure(n, k, t_s, relayed=m), _scipy_exposure(n, m, k, t_s))
    if n == 1000:
        assert (k, t_s) == (228, 122) and exp[0] == pytest.approx(-3.18, abs=0.05)
    # the parameters derived for m_min meet the target there
    k_m, t_m = required_parameters(n, _GAMMA, _DELTA, relayed=lo)
    assert _scipy_exposure(n, lo, k_m, t_m) <= -40


@pytest.mark.parametrize(("n", "advertised"), [(100, (66, 34)), (1000, (228, 122)),
                                               (10_000, (288, 154)), (100_000, (298, 159))])
def test_required_parameters_meet_the_targets_on_every_relayed_size(
        n: int, advertised: tuple[int, int]) -> None:
    """γ = δ = 1/3: for every relayed size in a grid from m_min to n, the parameters derived
    for it have exposure ≤ 2^-40 and abort ≤ 2^-20 (scipy, independently of the module's own
    sums) and the smallest such degree; the session derives the same, and the default client
    policy accepts each."""
    assert required_parameters(n, _GAMMA, _DELTA) == advertised
    params = SecAggConfig(clip_norm=1.0).for_clients(n)
    assert (params.neighbours, params.share_threshold) == advertised
    for m in _relayed_grid(n):
        k, t_s = required_parameters(n, _GAMMA, _DELTA, relayed=m)
        assert k % 2 == 0 and graph_degree(m, k) < m - 1, (m, k)  # sparse at these sizes
        assert _scipy_exposure(n, m, k, t_s) <= -40, (m, k, t_s)
        assert _scipy_abort(n, m, k, t_s) <= -20, (m, k, t_s)
        risk = GraphRisk(n, k, t_s, _GAMMA, _DELTA, relayed=m)
        assert risk.log2_cut_honest_ <= -40 and risk.log2_cut_survivors_ <= -20
        assert share_threshold_for(n, k, relayed=m) == t_s
        # the smallest: two fewer misses a target with the least threshold meeting exposure
        # (a larger threshold only makes aborts likelier)
        t2 = share_threshold_for(n, k - 2, relayed=m)
        assert not meets_targets(n, k - 2, t2, _GAMMA, _DELTA, 40, 20, relayed=m)
        assert (_scipy_exposure(n, m, k - 2, t2) > -40 or _scipy_abort(n, m, k - 2, t2) > -20
                or log2_cut(m, k - 2, sum(relayed_counts(n, m))) > -40
                or log2_cut(m, k - 2, relayed_counts(n, m)[1]) > -20)
        assert params.relayed(m) == (advertised if m == n else (k, t_s))
        assert ClientPolicy().relayed_problem(params, m) is None


def test_min_relayed_and_the_client_policy() -> None:
    assert [min_relayed(n, 1 / 3) for n in (2, 3, 30, 100, 1000)] == [2, 2, 20, 67, 667]
    assert min_relayed(100, 0.0) == 100 and min_relayed(3, 0.67) == 2
    assert worst_relayed(1000) == (667, 333) and worst_relayed(50, 0.6, 0.5) == (31, 30)
    assert ClientPolicy().least_relayed(1000) == 667
    assert ClientPolicy(dropout_fraction=0.1).least_relayed(1000) == 900


def test_a_client_refuses_a_relayed_graph_beyond_its_own_corrupt_fraction() -> None:
    """The parameters derived for the relayed set are sized for the session's γ and σ; a client
    that assumes more corrupt clients (or a smaller exposure) refuses at the reveal stage."""
    params = SecAggConfig(clip_norm=1.0).for_clients(1000)
    k, t_s = params.relayed(667)
    for policy in (ClientPolicy(corrupt_fraction=0.45), ClientPolicy(sigma=80.0)):
        why = policy.relayed_problem(params, 667)
        assert why is not None and f"degree {k} and share threshold {t_s} over the 667" in why
        assert log2_exposure(1000, k, t_s, policy.corrupt_fraction,
                             relayed=667) > -policy.sigma
    assert ClientPolicy(corrupt_fraction=0.45, trust_server=True).relayed_problem(params,
                                                                                  667) is None
    assert ClientPolicy(corrupt_fraction=0.3).relayed_problem(params, 667) is None


@pytest.mark.parametrize("n", [30, 100, 300, 1000, 5000])
def test_default_parameters_satisfy_the_default_client_policy(n: int) -> None:
    params = SecAggConfig(clip_norm=1.0).for_clients(n)
    policy = ClientPolicy()
    assert params.neighbours >= policy.least_neighbours(n)
    assert params.share_threshold >= policy.least_share_threshold(params)
    if not params.complete_graph:
        assert (params.neighbours, params.share_threshold) == required_parameters(n)


@pytest.mark.parametrize(("n", "m", "k", "t"), [(60, 40, 10, 7), (60, 50, 10, 6), (60, 60, 10, 5),
                                                (120, 80, 16, 11), (120, 100, 16, 9)])
def test_exposure_probability_matches_monte_carlo_on_the_real_graph(n: int, m: int, k: int,
                                                                   t: int) -> None:
    """The real graph over m relayed clients, all ⌊n/3⌋ corrupt clients among them."""
    rng = np.random.default_rng(n * 1000 + m * 10 + t)
    counts = _corrupt_neighbour_counts(m, k, n // 3, 1500, rng)
    p = 2.0 ** log2_exposure(n, k, t, relayed=m)
    assert 1e-3 < p < 0.9  # a level Monte Carlo can see
    assert _within(int((counts >= t).sum()), counts.size, p)


@pytest.mark.parametrize(("n", "m", "k"), [(60, 40, 10), (120, 80, 16), (300, 200, 46)])
def test_corrupt_neighbour_counts_follow_the_exact_pmf_on_the_real_graph(n: int, m: int,
                                                                         k: int) -> None:
    """The whole distribution: the real graph's counts (only its seed varying) against
    Hypergeom(m − 1, ⌊n/3⌋, graph_degree(m, k)), bins of fewer than 5 expected merged."""
    from scipy.stats import chisquare

    trials, d, c = 2000, graph_degree(m, k), n // 3
    counts = _corrupt_neighbour_counts(m, k, c, trials, np.random.default_rng(m + k))
    pmf = hypergeom.pmf(np.arange(d + 1), m - 1, c, d)
    obs, exp = np.bincount(counts, minlength=d + 1).astype(float), pmf * trials
    starts, acc = [0], 0.0
    for j in range(d + 1):
        acc += exp[j]
        if acc >= 5.0 and j < d:
            starts.append(j + 1)
            acc = 0.0
    if exp[starts[-1]:].sum() < 5.0:  # a short tail joins the bin before it
        starts.pop()
    o, e = np.add.reduceat(obs, starts), np.add.reduceat(exp, starts)
    assert o.size >= 5
    assert chisquare(o, e * o.sum() / e.sum()).pvalue > 1e-3
    assert counts.mean() == pytest.approx(d * c / (m - 1), abs=4.5 * math.sqrt(
        float(hypergeom.var(m - 1, c, d)) / trials))


@pytest.mark.parametrize(("n", "m", "k", "t"), [(60, 60, 10, 6), (90, 90, 12, 8), (60, 50, 10, 6),
                                                (90, 75, 12, 8)])
def test_abort_probability_matches_monte_carlo_on_the_real_graph(n: int, m: int, k: int,
                                                                 t: int) -> None:
    """Over m relayed clients, ⌊n/3⌋ − (n − m) of them still to drop."""
    rng = np.random.default_rng(n + m + t)
    dropped = _corrupt_neighbour_counts(m, k, relayed_counts(n, m)[1], 1500, rng)
    p = 2.0 ** log2_abort(n, k, t, relayed=m)
    assert 1e-3 < p < 0.9
    assert _within(int((k - dropped < t).sum()), dropped.size, p)  # own share not counted


# ---------------------------------------------------------------------- attack 1
def test_sparse_coalition_attack_at_the_old_defaults_is_reproduced() -> None:
    """A third of n = 60 corrupt: the old graph (kept whatever the server relays) exposes about
    2 % of the clients per round with all 60 relayed and about 40 % when the server relays
    the 20 corrupt clients with only 20 honest ones, as measured on the real graph; the exact
    probabilities agree."""
    n = 60
    k, t_s = _old_defaults(n)
    rng = np.random.default_rng(19)
    for m, low, high in ((n, 0.01, 0.04), (min_relayed(n, _DELTA), 0.35, 0.5)):
        counts = _corrupt_neighbour_counts(m, k, n // 3, 2000, rng)
        p = 2.0 ** log2_exposure(n, k, t_s, relayed=m)
        assert low < p < high
        assert _within(int((counts >= t_s).sum()), counts.size, p)


@pytest.mark.parametrize("n", [60, 300])
def test_sparse_coalition_exposes_nobody_at_the_new_defaults(n: int) -> None:
    """All ⌊n/3⌋ corrupt clients relayed with as few honest ones as the clients accept: the
    parameters derived for that relayed size expose nobody; the advertised ones, kept, would
    (at n = 300, where they stay sparse over m_min)."""
    k, t_s = required_parameters(n)
    params = SecAggConfig(clip_norm=1.0).for_clients(n)
    assert (params.neighbours, params.share_threshold) == (k, t_s)
    assert log2_exposure(n, k, t_s) <= -40 and log2_abort(n, k, t_s) <= -20
    m = min_relayed(n, _DELTA)
    k_m, t_m = params.relayed(m)
    assert (k_m, t_m) == required_parameters(n, relayed=m)
    assert log2_exposure(n, k_m, t_m, relayed=m) <= -40
    assert log2_abort(n, k_m, t_m, relayed=m) <= -20
    rng = np.random.default_rng(n)
    third = _corrupt_neighbour_counts(m, k_m, n // 3, 300, rng)
    assert (third >= t_m).sum() == 0
    kept = _corrupt_neighbour_counts(m, k, n // 3, 300, rng)
    p_kept = 2.0 ** log2_exposure(n, k, t_s, relayed=m)
    if graph_degree(m, k) < m - 1:
        assert p_kept > 0.05 and _within(int((kept >= t_s).sum()), kept.size, p_kept)
    else:  # complete over m_min: the ⌊n/3⌋ corrupt clients are fewer than t_s
        assert p_kept == 0.0 and kept.max() == n // 3 < t_s
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
