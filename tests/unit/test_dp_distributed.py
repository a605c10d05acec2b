"""Distributed DP with removable dropout levels (ghofl.privacy.distributed, ghofl.secure.levels):
the noise kept equals the central noise for any number of survivors, removal is bit-exact,
clients reveal no level for more survivors than they signed, and the messages round-trip."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.stats import chi2

from ghofl.errors import ConfigError, ProtocolError
from ghofl.privacy import (
    DPConfig,
    NoisePlan,
    NoiseShareEncoder,
    NoisyDecoder,
    block_sensitivities,
    block_sigmas,
    entry_scales,
    kept_variance,
    noise_share_encoder,
)
from ghofl.privacy.distributed import _log, level_words, standard_normals
from ghofl.secure import (
    InMemoryTransport,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    SessionParams,
    run_aggregation,
)
from ghofl.secure.levels import check_ladder, dropout_ladder, released_levels
from ghofl.secure.messages import ConsistencyRequest, UnmaskRequest, UnmaskShares
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for

R = 3.0
N = 10
T = 7


def _plan(mode: str = "full", z: float = 1.0, eps: float = 1.0) -> NoisePlan:
    sens = block_sensitivities(mode, R)
    frac = {b: 1.0 / len(sens) for b in sens}
    return NoisePlan(DPConfig(eps, 1e-5, "distributed"), mode, R, 1, z, sens, frac,
                     block_sigmas(sens, frac, z))


def _payloads(n: int = N, seed: int = 0) -> list[ClientStats]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(12, 6))
        x *= np.minimum(1.0, R / np.linalg.norm(x, axis=1))[:, None]
        out.append(compute_stats(x, rng.integers(0, 3, 12), 3, "full", clip_norm=R))
    return out


class _Raw(NoisyDecoder):
    """A NoisyDecoder that also keeps the unmasked words it was given."""

    words: NDArray[np.uint64] | None = None

    def __call__(self, params: SessionParams, meta: StatsMeta,
                 words: NDArray[np.uint64]) -> ClientStats:
        self.words = words.copy()
        return super().__call__(params, meta, words)


def _round(plan: NoisePlan, drops: dict[str, int] | None, seed: int,
           payloads: list[ClientStats] | None = None
           ) -> tuple[SecAggServer, _Raw, list[SecAggClient], list[ClientStats]]:
    payloads = payloads if payloads is not None else _payloads()
    seeds = np.random.SeedSequence(seed).spawn(N)
    # simulated, unauthenticated clients; no round ledger, as rounds are rerun over the same data
    clients = [SecAggClient(f"c{i}", p, encode=noise_share_encoder(
        plan, np.random.default_rng(seeds[i])), allow_unauthenticated=True, ledger=None)
        for i, p in enumerate(payloads)]
    server: SecAggServer
    decoder = _Raw(plan, lambda: len(server.survivors), lambda: server.levels_removed)
    server = SecAggServer(SecAggConfig(clip_norm=R, threshold=T, noise_levels=16),
                          payloads[0].meta, [c.client_id for c in clients], decode=decoder)
    run_aggregation(server, InMemoryTransport(clients, drops, seed=seed))
    return server, decoder, clients, payloads


# ---------------------------------------------------------------------- the ladder
def test_ladders_are_integer_steps_then_geometric() -> None:
    assert dropout_ladder(7, 10) == (8, 9, 10)
    assert dropout_ladder(10, 10) == ()
    big = dropout_ladder(67, 100)
    assert len(big) == 16 and big[-1] == 100 and check_ladder(big, 67, 100) is None
    a = (67, *big)
    assert max(a[j + 1] / a[j] for j in range(16)) < 1.04  # the stated granularity bound
    assert check_ladder((8, 8, 10), 7, 10) is not None
    assert check_ladder((7, 10), 7, 10) is not None
    assert released_levels((8, 9, 10), 9) == (0, 1)
    with pytest.raises(ConfigError, match="a dropout ladder needs"):
        dropout_ladder(11, 10)
    with pytest.raises(ProtocolError, match="do not rise strictly"):
        SessionParams(10, 7, 9, 1000, R, 2, None, (9, 8, 10))


def test_params_carry_the_ladder_through_their_items() -> None:
    params = SecAggConfig(clip_norm=R, threshold=T, noise_levels=16).for_clients(N)
    assert params.release_points == (8, 9, 10)
    assert SessionParams.from_items(params.items()) == params
    assert SecAggConfig(clip_norm=R).for_clients(N).release_points == ()
    with pytest.raises(ConfigError, match="noise_levels must be an integer >= 0"):
        SecAggConfig(clip_norm=R, noise_levels=-1)


@pytest.mark.parametrize("s", [7, 8, 9, 10])
def test_every_survivor_count_keeps_exactly_the_central_variance(s: int) -> None:
    params = SecAggConfig(clip_norm=R, threshold=T, noise_levels=16).for_clients(N)
    assert kept_variance(params, s) == pytest.approx(1.0, rel=1e-12)
    # nothing removed: every survivor keeps σ²/t (as without levels), so s/t
    assert kept_variance(params, s, {}) == pytest.approx(s / T, rel=1e-12)
    geo = SecAggConfig(clip_norm=R, threshold=67, noise_levels=16).for_clients(100)
    a = (67, *geo.release_points)
    j = max(i for i, u in enumerate(a) if u <= 60 + s * 4)
    assert kept_variance(geo, 60 + s * 4) == pytest.approx((60 + s * 4) / a[j], rel=1e-12)


# ---------------------------------------------------------------------- the generator
def test_the_portable_normals_are_standard_and_deterministic() -> None:
    x = np.random.default_rng(0).uniform(1e-300, 1.0, 10_000)
    assert np.max(np.abs(_log(x) - np.log(x)) / np.abs(np.log(x))) < 1e-15  # ~4 ulp
    z = standard_normals(b"\x01" * 32, 50_001)
    assert z.shape == (50_001,) and np.array_equal(z, standard_normals(b"\x01" * 32, 50_001))
    assert np.array_equal(z[:1000], standard_normals(b"\x01" * 32, 1000))
    assert not np.array_equal(z[:1000], standard_normals(b"\x02" * 32, 1000))
    assert abs(z.mean()) < 4.5 / math.sqrt(z.size)
    lo, hi = (math.sqrt(chi2.ppf(q, z.size) / z.size) for q in (0.0005, 0.9995))
    assert lo <= z.std() <= hi


# ---------------------------------------------------------------------- protocol rounds
def _noise(decoder: _Raw, server: SecAggServer, payloads: list[ClientStats],
           plan: NoisePlan) -> dict[str, NDArray[np.float64]]:
    """Decoded total minus the exact total of the survivors, per block, over σ_b."""
    assert decoder.words is not None
    params = server.params
    meta = payloads[0].meta
    ints, floats = params.codec.decode_vectors(meta, decoder.words)
    alive = [int(c[1:]) for c in server.survivors]
    exact_i, exact_f = schema_for("full").flatten(sum(
        (payloads[i] for i in alive[1:]), payloads[alive[0]]))
    c = meta.num_classes
    out = {"counts": (np.ldexp(ints[:c].astype(float), -16) - exact_i[:c]) / plan.sigma["counts"]}
    for seg in schema_for("full").float_layout(c, meta.dim):
        out[seg.name] = (floats[seg.offset:seg.stop] - exact_f[seg.offset:seg.stop]) \
            / plan.sigma[seg.name]
        scales = entry_scales("full", seg.name, c, meta.dim)
        if scales is not None:  # sigma_b / sqrt(2) off the diagonal (N2s)
            out[seg.name] /= scales
    return out


@pytest.mark.parametrize("dropped", [0, 2])
def test_the_noise_kept_has_the_central_std(dropped: int) -> None:
    plan = _plan()
    samples: list[float] = []
    for seed in range(6):
        server, decoder, _, payloads = _round(plan, {"mask": dropped} if dropped else None, seed)
        assert len(server.survivors) == N - dropped
        assert decoder.release is not None
        assert decoder.release.noise["kept_variance"] == pytest.approx(1.0, rel=1e-12)
        assert decoder.release.epsilon_spent == plan.config.epsilon
        for values in _noise(decoder, server, payloads, plan).values():
            samples.extend(values.tolist())
    n = len(samples)
    lo, hi = (math.sqrt(chi2.ppf(q, n) / n) for q in (0.0005, 0.9995))
    assert lo <= float(np.sqrt(np.mean(np.square(samples)))) <= hi, n


def test_removal_is_bit_exact() -> None:
    plan = _plan()
    server, decoder, clients, payloads = _round(plan, {"mask": 1}, seed=3)
    params, meta = server.params, payloads[0].meta
    seeds = np.random.SeedSequence(3).spawn(N)
    expected = np.zeros(params.codec.length(meta), np.uint64)
    released = released_levels(params.release_points, len(server.survivors))
    assert released == (0, 1) and all(v == (0, 1) for v in server.levels_removed.values())
    for cid in server.survivors:
        i = int(cid[1:])
        expected += noise_share_encoder(plan, np.random.default_rng(seeds[i]))(payloads[i],
                                                                              params)
        for j, e in enumerate(clients[i]._levels):
            if j not in released:  # the level kept in the sum
                expected += level_words(plan, params, meta, j, e)
    assert decoder.words is not None and np.array_equal(decoder.words, expected)


class _Tamper:
    """A client whose unmask reply carries a corrupt share of c0's level-2 seed."""

    def __init__(self, inner: SecAggClient) -> None:
        self.inner, self.client_id = inner, inner.client_id

    def handle(self, request: Any) -> Any:
        reply = self.inner.handle(request)
        if isinstance(reply, UnmaskShares):
            bad = tuple((u, j, bytes(66) if (u, j) == ("c0", 2) else sh)
                        for u, j, sh in reply.level_shares)
            reply = dataclasses.replace(reply, level_shares=bad)
        return reply


def test_an_unreconstructable_level_stays_and_is_accounted() -> None:
    pytest.importorskip("dp_accounting")
    from ghofl.privacy import calibrate_noise_multiplier, gaussian_epsilon

    z = calibrate_noise_multiplier(2.0, 1e-5)
    plan = _plan(z=z, eps=2.0)
    payloads = _payloads()
    seeds = np.random.SeedSequence(5).spawn(N)
    clients: list[Any] = [SecAggClient(f"c{i}", p, encode=noise_share_encoder(
        plan, np.random.default_rng(seeds[i])), allow_unauthenticated=True)
        for i, p in enumerate(payloads)]
    clients[1:5] = [_Tamper(c) for c in clients[1:5]]  # 4 of 10 holders: 6 < t_s = 7 good
    server: SecAggServer
    decoder = _Raw(plan, lambda: len(server.survivors), lambda: server.levels_removed)
    server = SecAggServer(SecAggConfig(clip_norm=R, threshold=T, noise_levels=16),
                          payloads[0].meta, [c.client_id for c in clients], decode=decoder)
    run_aggregation(server, InMemoryTransport(clients))
    assert server.levels_removed["c0"] == (0, 1)
    assert all(server.levels_removed[c] == (0, 1, 2) for c in server.survivors if c != "c0")
    assert any("level 2 of 'c0' cannot be reconstructed" in m for m in server.ignored)
    kappa = 1.0 + 1 / 9 - 1 / 10  # c0 keeps σ²(1/9 − 1/10) more
    assert kept_variance(server.params, N, server.levels_removed) == pytest.approx(kappa)
    release = decoder.release
    assert release is not None and release.noise["kept_variance"] == pytest.approx(kappa)
    assert release.noise["removed_per_level"] == [10, 10, 9]
    assert release.epsilon_spent == pytest.approx(gaussian_epsilon(z * math.sqrt(kappa), 1e-5))
    assert release.epsilon_spent < 2.0


def test_a_client_reveals_no_level_above_the_survivors_it_signed() -> None:
    plan = _plan()
    payloads = _payloads()
    # drive one round by hand up to the unmask stage, then answer as a lying server would
    seeds = np.random.SeedSequence(1).spawn(N)
    clients = [SecAggClient(f"c{i}", p, encode=noise_share_encoder(
        plan, np.random.default_rng(seeds[i])), allow_unauthenticated=True)
        for i, p in enumerate(payloads)]
    srv = SecAggServer(SecAggConfig(clip_norm=R, threshold=T, noise_levels=16),
                       payloads[0].meta, [c.client_id for c in clients],
                       decode=NoisyDecoder(plan))
    by_id = {c.client_id: c for c in clients}
    for _stage in ("advertise", "reveal", "share", "mask"):
        reqs = srv.requests()
        srv.receive([(c, by_id[c].handle(r)) for c, r in reqs.items() if c not in ("c8", "c9")
                     or _stage != "mask"])
    assert len(srv.survivors) == 8
    reqs = srv.requests()
    assert all(isinstance(r, ConsistencyRequest) for r in reqs.values())
    srv.receive([(c, by_id[c].handle(r)) for c, r in reqs.items()])
    unmask = srv.requests()
    honest = by_id["c0"].handle(unmask["c0"])
    assert isinstance(honest, UnmaskShares)
    assert {j for _, j, _ in honest.level_shares} == {0}  # u_0 = 8 ≤ s = 8 < u_1 = 9
    assert {u for u, _, _ in honest.level_shares} <= set(srv.survivors)
    # a server claiming the two dropped clients survived (so that every level is released)
    req = unmask["c1"]
    assert isinstance(req, UnmaskRequest)
    lie = UnmaskRequest(req.version, req.round_id, req.stage,
                        tuple(sorted((*req.survivors, "c8", "c9"))), (), req.signatures)
    with pytest.raises(ProtocolError, match="other survivor or dropped sets than it signed"):
        by_id["c1"].handle(lie)


def test_rounds_with_levels_need_level_noise_on_both_sides() -> None:
    plan = _plan()
    payloads = _payloads(3)
    cfg = SecAggConfig(clip_norm=R, threshold=2, noise_levels=4)
    with pytest.raises(ConfigError, match="needs a decoder that regenerates their noise"):
        SecAggServer(cfg, payloads[0].meta, ["a", "b", "c"])
    server = SecAggServer(cfg, payloads[0].meta, ["a", "b", "c"], decode=NoisyDecoder(plan))
    plain = SecAggClient("a", payloads[0], allow_unauthenticated=True)
    with pytest.raises(ProtocolError, match="this client's encoder adds no removable noise"):
        plain.handle(server.requests()["a"])
    assert isinstance(noise_share_encoder(plan, np.random.default_rng(0)), NoiseShareEncoder)


def test_client_state_keeps_the_level_seeds() -> None:
    plan = _plan()
    payloads = _payloads(3)
    server = SecAggServer(SecAggConfig(clip_norm=R, threshold=2, noise_levels=4),
                          payloads[0].meta, ["a", "b", "c"], decode=NoisyDecoder(plan))
    clients = {c: SecAggClient(c, p, encode=noise_share_encoder(plan, np.random.default_rng(0)),
                               allow_unauthenticated=True)
               for c, p in zip(("a", "b", "c"), payloads, strict=True)}
    for _ in ("advertise", "reveal", "share"):
        reqs = server.requests()
        server.receive([(c, clients[c].handle(r)) for c, r in reqs.items()])
    state: dict[str, Any] = clients["a"].to_state()
    back = SecAggClient.from_state(state, payloads[0], encode=clients["a"]._encode,
                                   allow_unauthenticated=True)
    assert back._levels == clients["a"]._levels and len(back._levels) == 1
    assert back._held_levels == clients["a"]._held_levels
