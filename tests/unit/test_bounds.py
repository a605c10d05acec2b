"""Bounded totals (ghofl.secure.bounds): each check refuses what clipping at R cannot produce,
honest payloads and totals always pass (also with their DP noise), clients refuse to encode
out-of-bounds statistics, and a poisoning client written around the honest halves gets the
total refused, by name, in process and through the plan's server."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.client.job import ClientJob
from ghofl.errors import (
    AggregationAbortedError,
    ClientRefusalError,
    InputError,
    StatsValidationError,
    TotalOutOfBoundsError,
)
from ghofl.privacy import (
    DPConfig,
    NoisePlan,
    NoiseShareEncoder,
    NoisyDecoder,
    block_sensitivities,
    block_sigmas,
    noise_share_encoder,
    release_central,
)
from ghofl.privacy.mechanism import COUNT_FRACTION_BITS
from ghofl.secure import (
    FixedPointCodec,
    InMemoryTransport,
    PlainClient,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    SessionParams,
    run_aggregation,
)
from ghofl.secure.bounds import (
    CHECKS,
    BoundedDecoder,
    TotalLimits,
    check_bounds,
    check_stats_bounds,
)
from ghofl.server import AggregationSpec, FederationPlan, FederationServer
from ghofl.server.job import ServerJob
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats, sum_stats
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.projection import ProjectionSpec
from ghofl.stats.schema import schema_for
from tests.helpers import gaussian_mixture

MODES = ("full", "pooled", "gram", "diag")
R = 6.0
D = 6
CLASSES = ("a", "b", "c")
POISONED_COUNT = 16_777_277  # the poisoned count, against a true 56
Encoder = Callable[[ClientStats, SessionParams], np.ndarray]


def _payloads(n: int, mode: str = "full", *, seed: int = 0, rows: int = 60) -> list[ClientStats]:
    return [compute_stats(*gaussian_mixture(seed * 100 + i, 3, D, n=rows), CLASSES, mode,  # type: ignore[arg-type]
                          clip_norm=R) for i in range(n)]


def _ids(n: int) -> list[str]:
    return [f"site-{i}" for i in range(n)]


def _failed(failures: tuple[Any, ...]) -> set[str]:
    return {f.check for f in failures}


def _big_sample(mode: str) -> ClientStats:
    """Statistics of one sample of norm 1000·R in class 0, unclipped, labelled as clipped at R
    (as a client that skipped clipping would send them)."""
    z = np.full((1, D), 1000.0 * R / math.sqrt(D))
    raw = compute_stats(z, np.zeros(1, np.int64), CLASSES, mode)  # type: ignore[arg-type]
    meta = dataclasses.replace(raw.meta, clip_norm=R)
    return unflatten_stats(meta, *schema_for(mode).flatten(raw))


def _poisoned(stats: ClientStats) -> ClientStats:
    """``stats`` plus one sample of norm 1000·R: valid statistics, beyond the bounds."""
    big = _big_sample(stats.mode)
    return unflatten_stats(stats.meta, *(
        a + b for a, b in zip(schema_for(stats.mode).flatten(stats),
                              schema_for(stats.mode).flatten(big), strict=True)))


# ---------------------------------------------------------------------- the pure checks
def _edit(mode: str, check: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """One honest client's vectors, edited so that exactly ``check`` (and what follows from
    it) fails."""
    s = _payloads(1, mode)[0]
    ints, floats = (v.astype(np.float64) for v in schema_for(mode).flatten(s))
    lay = {g.name: g for g in schema_for(mode).float_layout(3, D)}
    second_name = {"full": "class_scatter", "gram": "scatter"}.get(mode, "sq_sums")
    sums, second = lay["sums"], lay[second_name]  # gram: B, whose (0, 0) entry comes first
    n0 = ints[0]
    if check == "finite":
        floats[sums.offset] = np.nan
    elif check == "counts":
        ints[0] = -1.0
    elif check == "total count":
        ints[3] = ints[:3].sum() + 1  # n_clipped above the samples
    elif check == "first moment":
        floats[sums.offset : sums.offset + D] = R * n0 * 1.01 / math.sqrt(D)
    elif check == "second moment":
        n_b = ints[:3].sum() if mode == "gram" else n0  # B is bounded by R²·N
        floats[second.offset] = R * R * n_b * 1.01  # S_a[0, 0], D_a[0] or B[0, 0]
    elif check == "psd":
        floats[second.offset] = -1.0
    elif check == "cauchy-schwarz":
        floats[sums.offset : sums.offset + D] = R * n0 * 0.99 / math.sqrt(D)
        floats[second.offset : second.stop] *= 0.0
        if mode in ("full", "gram"):  # S_0 (or B) = small multiple of the identity
            diag = np.cumsum([0, *range(D, 1, -1)])
            floats[second.offset + diag] = 1e-3
        else:
            floats[second.offset : second.offset + D] = 1e-3
    return s.meta, ints, floats


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("check", CHECKS)
def test_each_check_refuses_what_clipping_cannot_produce(mode: str, check: str) -> None:
    meta, ints, floats = _edit(mode, check)
    failures = check_bounds(meta, ints, floats, TotalLimits(R, 1, 1000))
    assert check in _failed(failures)
    assert failures[0].check == check or check in {"cauchy-schwarz", "psd", "second moment"}
    where = {"finite": "floats", "total count": "n_clipped"}.get(check, "class 'a'")
    if mode == "gram" and check in {"second moment", "psd", "cauchy-schwarz"}:
        where = "pooled B"  # gram holds no per-class second moment: B is checked
    assert any(f.where == where for f in failures if f.check == check)


def test_counts_must_be_integral_and_within_n_times_m() -> None:
    s = _payloads(1, "diag")[0]
    ints, floats = (v.astype(np.float64) for v in schema_for("diag").flatten(s))
    limits = TotalLimits(R, 2, 40)
    assert check_bounds(s.meta, ints, floats, limits) == ()
    over, half = ints.copy(), ints.copy()
    over[1], half[1] = 81.0, ints[1] + 0.5
    f_over = check_bounds(s.meta, over, floats, limits)
    assert [str(f) for f in f_over if f.check == "counts"] == [
        "counts (class 'b'): N_c = 81 lies outside [0, n·M] = [0, 80]"]
    assert "total count" in _failed(f_over)
    assert [f.detail for f in check_bounds(s.meta, half, floats, limits)
            if f.check == "counts"] == [f"N_c = {half[1]:g} is not an integer"]


@settings(max_examples=100, deadline=None)
@given(mode=st.sampled_from(MODES), seed=st.integers(0, 2**32 - 1),
       clients=st.integers(1, 6), scale=st.sampled_from([0.1, 1.0, 50.0]),
       axis=st.booleans(), projected=st.booleans())
def test_honest_clipped_totals_always_pass(mode: str, seed: int, clients: int, scale: float,
                                           axis: bool, projected: bool) -> None:
    """Random data, clipped or not by R (``scale``), also every sample on one axis (the
    worst case: ‖A_c‖ = R·N_c and tr S_c = R²·N_c are attained), projected or not; each
    payload passes on its own and the fixed-point total of them all passes."""
    rng = np.random.default_rng(seed)
    proj = ProjectionSpec(seed % 1000, 8, D) if projected else None
    dim_in = 8 if projected else D
    payloads = []
    for _ in range(clients):
        n = int(rng.integers(0, 40))
        x = rng.normal(size=(n, dim_in)) * scale * R
        if axis:
            x = np.abs(x) * np.eye(dim_in)[0]
        payloads.append(compute_stats(x, rng.integers(0, 3, n), CLASSES, mode,  # type: ignore[arg-type]
                                      projection=proj, clip_norm=R))
    for p in payloads:
        assert check_stats_bounds(p, TotalLimits(R, 1, 40)) == ()
    codec = FixedPointCodec(clients, 40, R, limbs=int(rng.integers(1, 3)))
    words = np.zeros(codec.length(payloads[0].meta), np.uint64)
    for p in payloads:
        words += codec.encode(p)
    ints, floats = codec.decode_vectors(payloads[0].meta, words)
    assert check_bounds(payloads[0].meta, ints, floats, TotalLimits.for_codec(codec)) == ()


def test_honest_totals_with_a_held_out_section_pass_and_a_poisoned_one_fails() -> None:
    x, y = gaussian_mixture(3, 3, D, n=200)
    s = compute_stats(x * 5, y, CLASSES, "pooled", clip_norm=R, holdout_fraction=0.3)
    assert check_stats_bounds(s, TotalLimits(R, 1, 1000)) == ()
    ints, floats = schema_for("pooled").flatten(s)
    lay = {g.name: g for g in schema_for("pooled").float_layout(3, D, True)}
    floats = floats.copy()
    floats[lay["holdout.sums"].offset] = 1000 * R
    assert "holdout.class 'a'" in {f.where for f in check_bounds(
        s.meta, ints, floats, TotalLimits(R, 1, 1000)) if f.check == "first moment"}


# ---------------------------------------------------------------------- the client side
@pytest.mark.parametrize("mode", MODES)
def test_a_client_refuses_to_encode_a_sample_beyond_r(mode: str) -> None:
    bad = _poisoned(_payloads(1, mode)[0])
    with pytest.raises(ClientRefusalError, match=(
            r"^these statistics are not what clipping at R=6 with at most M=1000000 samples "
            r"per client over one client can produce: first moment \(class 'a'\)[;:] .*"
            r"recompute them from the embeddings with clipping at R=6 \(--clip 6\)")) as info:
        FixedPointCodec(3, 1_000_000, R).encode(bad)
    assert "‖A‖" not in str(info.value)  # the message leaves the client: no statistic in it
    assert "first moment (class 'a'): ‖A‖ = " in info.value.local_detail


def test_the_dp_encoder_refuses_out_of_bounds_statistics_too() -> None:
    plan = _noise_plan("diag", 1.0)
    params = SecAggConfig(clip_norm=R, threshold=2).for_clients(3)
    with pytest.raises(InputError, match=r"second moment \(class 'a'\); recompute"):
        noise_share_encoder(plan, np.random.default_rng(0))(_poisoned(_payloads(1, "diag")[0]),
                                                            params)


def test_clipping_scales_a_sample_of_norm_1000r_into_the_bounds() -> None:
    x, y = gaussian_mixture(1, 3, D, n=50)
    x[0] = 1000 * R / math.sqrt(D)
    s = compute_stats(x, y, CLASSES, "full", clip_norm=R)
    assert s.n_clipped >= 1 and check_stats_bounds(s, TotalLimits(R, 1, 50)) == ()
    one = compute_stats(x[:1], np.zeros(1, np.int64), CLASSES, "full", clip_norm=R)
    assert np.linalg.norm(one.sums[0]) <= R and np.trace(one.class_scatter[0]) <= R * R


def test_an_honest_client_with_poisoned_statistics_drops_out_with_the_check_named() -> None:
    payloads = _payloads(5, "pooled")
    ids = _ids(5)
    clients = [SecAggClient(c, p, allow_unauthenticated=True)
               for c, p in zip(ids, [*payloads[:4], _poisoned(payloads[4])], strict=True)]
    server = SecAggServer(SecAggConfig(clip_norm=R), payloads[0].meta, ids,
                          decode=BoundedDecoder())
    report = run_aggregation(server, InMemoryTransport(clients))
    assert report.dropped == {"site-4": "mask"}
    assert report.refused["site-4"].startswith(
        "client 'site-4' cannot take part: these statistics are not what clipping at R=6")
    assert np.array_equal(report.total.counts, sum_stats(payloads[:4]).counts)


# ---------------------------------------------------------------------- poisoning clients
def _add_sample(stats: ClientStats, params: SessionParams) -> np.ndarray:
    """Encodes the client's honest statistics plus one sample of norm 1000·R, with the honest
    codec's per-entry checks (which it passes: no entry exceeds M·R^k)."""
    ints, floats = (a + b for a, b in zip(schema_for(stats.mode).flatten(stats),
                                          schema_for(stats.mode).flatten(_big_sample(stats.mode)),
                                          strict=True))
    return params.codec.encode_vectors(stats.meta, ints, floats)


def _set_count(stats: ClientStats, params: SessionParams) -> np.ndarray:
    """Claims the poisoned count for class 'a' (the honest encoding of the rest)."""
    ints, floats = schema_for(stats.mode).flatten(stats)
    ints = ints.copy()
    ints[0] = POISONED_COUNT
    return params.codec.encode_vectors(stats.meta, ints, floats)


def _wrap(index: Callable[[ClientStats], int]) -> Encoder:
    def encode(stats: ClientStats, params: SessionParams) -> np.ndarray:
        """The honest words with 2^63 added to one of them (the sum wraps mod 2^64)."""
        words = params.codec.encode(stats).copy()
        words[index(stats)] += np.uint64(2**63)
        return words
    return encode


def _first_hi_word(stats: ClientStats) -> int:
    sch = schema_for(stats.mode)
    return sum(g.size for g in sch.int_layout(stats.num_classes, stats.dim))


ATTACKS: list[tuple[str, Encoder, str]] = [
    ("sample of norm 1000R", _add_sample, "first moment (class 'a')"),
    ("count 16777277", _set_count, "counts (class 'a'): N_c = 16777"),
    ("2^63 wrap of a count", _wrap(lambda s: 0), "counts (class 'a'): N_c = -9.22"),
    ("2^63 wrap of a sum", _wrap(_first_hi_word), "first moment (class 'a')"),
]


@pytest.mark.parametrize(("attack", "encode", "named"), ATTACKS, ids=[a[0] for a in ATTACKS])
@pytest.mark.parametrize("mode", MODES)
def test_a_poisoning_client_gets_the_secure_total_refused(attack: str, encode: Encoder,
                                                          named: str, mode: str) -> None:
    payloads = _payloads(5, mode)
    ids = _ids(5)
    clients = [SecAggClient(c, p, encode=encode if i == 2 else None, allow_unauthenticated=True)
               for i, (c, p) in enumerate(zip(ids, payloads, strict=True))]
    server = SecAggServer(SecAggConfig(clip_norm=R), payloads[0].meta, ids,
                          decode=BoundedDecoder(lambda: len(server.survivors)))
    with pytest.raises(TotalOutOfBoundsError, match=(
            r"^secure aggregation aborted: the total fails the bounds of clipping at R=6 with "
            r"at most M=1000000 samples per client over n=5 clients: .*nothing is fitted or "
            r"released$")) as info:
        run_aggregation(server, InMemoryTransport(clients))
    assert named in str(info.value)
    assert isinstance(info.value, AggregationAbortedError)


def _one_more(stats: ClientStats, params: SessionParams) -> np.ndarray:
    """The honest words with one sample more in class 'a' (a zero vector: only the count)."""
    words = params.codec.encode(stats).copy()
    words[0] += np.uint64(1)
    return words


@pytest.mark.parametrize("poison", [False, True])
def test_the_count_bound_is_tight_over_the_clients_in_the_sum(poison: bool) -> None:
    """Five clients of exactly M = 60 samples, one dropped before its masked input: the four
    in the sum reach 4·M exactly and pass; one sample more is refused against 4·M, not 5·M."""
    payloads = _payloads(5, "diag")
    ids = _ids(5)
    clients = [SecAggClient(c, p, encode=_one_more if poison and i == 0 else None,
                            allow_unauthenticated=True)
               for i, (c, p) in enumerate(zip(ids, payloads, strict=True))]
    server = SecAggServer(SecAggConfig(clip_norm=R, threshold=3, max_samples=60),
                          payloads[0].meta, ids,
                          decode=BoundedDecoder(lambda: len(server.survivors)))
    transport = InMemoryTransport(clients, {"mask": 1}, seed=3)  # drops a client other than 0
    if not poison:
        report = run_aggregation(server, transport)
        assert len(report.survivors) == 4 and report.total.n_samples == 240
        assert "site-0" in report.survivors
        return
    with pytest.raises(TotalOutOfBoundsError, match=(
            r"over n=4 clients: total count \(all classes\): Σ_c N_c = 241 > n·M = 240")):
        run_aggregation(server, transport)


def _plan(mode: str, dp: DPConfig | None = None, protocol: str = "secure") -> FederationPlan:
    return FederationPlan(ClientJob(CLASSES, mode, clip_norm=R, min_class_count=1),  # type: ignore[arg-type]
                          AggregationSpec(protocol, dp=dp), ServerJob(("nb",)))  # type: ignore[arg-type]


def test_the_plans_server_refuses_a_poisoned_secure_total_and_fits_an_honest_one() -> None:
    payloads = _payloads(5, "full")
    ids = _ids(5)
    plan = _plan("full")
    # two rounds over the same data: the (simulated) clients keep no round ledger
    honest = FederationServer(plan, ids, payloads[0].meta).aggregate(InMemoryTransport(
        [SecAggClient(c, p, allow_unauthenticated=True, ledger=None)
         for c, p in zip(ids, payloads, strict=True)]))
    assert np.array_equal(honest.total.counts, sum_stats(payloads).counts)
    bad = [SecAggClient(c, p, encode=_add_sample if i == 0 else None,
                        allow_unauthenticated=True, ledger=None)
           for i, (c, p) in enumerate(zip(ids, payloads, strict=True))]
    with pytest.raises(TotalOutOfBoundsError, match=r"second moment \(class 'a'\): tr S = "):
        FederationServer(plan, ids, payloads[0].meta).aggregate(InMemoryTransport(bad))


@pytest.mark.parametrize("dp", [None, DPConfig(2.0)], ids=["no-dp", "central-dp"])
def test_the_plain_server_excludes_a_poisoned_payload_and_keeps_the_round(
        dp: DPConfig | None) -> None:
    payloads = _payloads(4, "diag")
    ids = _ids(4)
    plan = _plan("diag", dp, "plain")
    bad = [PlainClient(c, _poisoned(p) if i == 1 else p)
           for i, (c, p) in enumerate(zip(ids, payloads, strict=True))]
    server = FederationServer(plan, ids, payloads[0].meta)
    out = server.aggregate(InMemoryTransport(bad), noise_rng=np.random.default_rng(0))
    assert list(out.report.excluded) == ["site-1"]
    assert re.match(r"^input: sent statistics that clipping at R=6 with no public maximum of "
                    r"samples over one client cannot produce: first moment \(class 'a'\): ",
                    out.report.excluded["site-1"])
    assert out.report.survivors == ["site-0", "site-2", "site-3"]
    expected = sum_stats([payloads[0], *payloads[2:]])
    if dp is None:
        np.testing.assert_array_equal(out.total.sums, expected.sums)
    assert (out.privacy is None) == (dp is None)


# ---------------------------------------------------------------------- differential privacy
def _noise_plan(mode: str, z: float) -> NoisePlan:
    """The mechanism with a fixed noise multiplier z (no accountant)."""
    sens = block_sensitivities(mode, R)
    frac = {b: 1.0 / len(sens) for b in sens}
    return NoisePlan(DPConfig(1.0, 1e-5, "distributed"), mode, R, 1, z, sens, frac,
                     block_sigmas(sens, frac, z))


def _worst_case(n: int, mode: str) -> list[ClientStats]:
    """Clients whose samples all sit at norm R on one axis of class 'a': the totals attain
    ‖A_c‖ = R·N_c and tr S_c = R²·N_c, so the noise alone decides the one-sided checks."""
    x = np.zeros((12, D))
    x[:, 0] = 2 * R
    y = np.zeros(12, np.int64)
    y[8:] = 1
    return [compute_stats(x, y, CLASSES, mode, clip_norm=R) for _ in range(n)]  # type: ignore[arg-type]


def _noisy_total(plan: NoisePlan, payloads: list[ClientStats], params: SessionParams,
                 seed: int, poison: int | None = None) -> np.ndarray:
    words = np.zeros(params.codec.length(payloads[0].meta), np.uint64)
    rngs = np.random.SeedSequence(seed).spawn(len(payloads))
    for p, r in zip(payloads, rngs, strict=True):
        words += noise_share_encoder(plan, np.random.default_rng(r))(p, params)
    if poison is not None:  # one client claims the poisoned count in its count word
        words[0] += np.uint64(poison << COUNT_FRACTION_BITS)
    return words


@pytest.mark.parametrize("mode", MODES)
def test_honest_noisy_totals_pass_over_many_seeds(mode: str) -> None:
    plan = _noise_plan(mode, 4.0)
    payloads = _worst_case(5, mode)
    params = SecAggConfig(clip_norm=R, threshold=3).for_clients(5)
    meta = payloads[0].meta
    for seed in range(60):
        decoder = NoisyDecoder(plan)
        decoder(params, meta, _noisy_total(plan, payloads, params, seed))
        assert decoder.release is not None


def test_a_poisoned_noisy_count_is_refused_and_nothing_is_released() -> None:
    plan = _noise_plan("pooled", 4.0)
    payloads = _worst_case(5, "pooled")
    params = SecAggConfig(clip_norm=R, threshold=3).for_clients(5)
    true = int(sum(p.counts[0] for p in payloads))
    decoder = NoisyDecoder(plan)
    words = _noisy_total(plan, payloads, params, 1, poison=POISONED_COUNT - true)
    with pytest.raises(TotalOutOfBoundsError, match=(
            r"^the distributed DP release aborted: the total fails the bounds of clipping at "
            r"R=6 with at most M=1000000 samples per client over n=5 clients, with the public "
            r"DP noise: counts \(class 'a'\): N_c = 167772\d\d\.\d+ lies outside \[0, n·M\]")):
        decoder(params, payloads[0].meta, words)
    assert decoder.release is None


def test_noise_margins_scale_with_the_public_sigma() -> None:
    """A bound exceeded by 40σ fails however the noise falls; the same excess passes when the
    noise is ten times larger (the margin is several σ, not a constant)."""
    s = _worst_case(1, "diag")[0]
    ints, floats = (v.astype(np.float64) for v in schema_for("diag").flatten(s))
    sigma = 1.0
    ints[0] = -40 * sigma
    ints[1] = ints[1]
    narrow = TotalLimits(R, 1, 1000, noise={b: sigma for b in ("counts", "sums", "sq_sums")})
    wide = dataclasses.replace(narrow, noise={b: 10 * sigma for b in ("counts", "sums",
                                                                      "sq_sums")})
    assert "counts" in _failed(check_bounds(s.meta, ints, floats, narrow))
    assert "counts" not in _failed(check_bounds(s.meta, ints, floats, wide))


def test_distributed_dp_through_the_plans_server() -> None:
    payloads = [compute_stats(*gaussian_mixture(i, 3, D, n=20), CLASSES, "full",  # type: ignore[arg-type]
                              clip_norm=R) for i in range(5)]
    true = int(sum(p.counts[0] for p in payloads))
    ids = _ids(5)
    plan = _plan("full", DPConfig(2.0, mode="distributed"))
    noise = plan.noise_plan()
    assert noise is not None

    def halves(poisoner: int | None) -> list[SecAggClient]:
        out = []
        for i, (c, p) in enumerate(zip(ids, payloads, strict=True)):
            honest = noise_share_encoder(noise, np.random.default_rng(i))
            # two rounds over the same data: the (simulated) clients keep no round ledger
            out.append(SecAggClient(c, p, encode=honest if i != poisoner else _inflate(honest),
                                    allow_unauthenticated=True, ledger=None))
        return out

    class _inflate:  # poisons the counts, keeps the removable levels
        def __init__(self, honest: NoiseShareEncoder) -> None:
            self.expand = honest.expand
            self._honest = honest

        def __call__(self, stats: ClientStats, params: SessionParams) -> np.ndarray:
            words = self._honest(stats, params).copy()
            words[0] += np.uint64((POISONED_COUNT - true) << COUNT_FRACTION_BITS)
            return words

    ok = FederationServer(plan, ids, payloads[0].meta).aggregate(InMemoryTransport(halves(None)))
    assert ok.privacy is not None and ok.privacy["dp_mode"] == "distributed"
    server = FederationServer(plan, ids, payloads[0].meta)
    with pytest.raises(TotalOutOfBoundsError, match=r"counts \(class 'a'\): N_c = 167772\d\d\."):
        server.aggregate(InMemoryTransport(halves(3)))
    assert server._decoder is not None and server._decoder.release is None


def test_central_release_checks_the_exact_total_first() -> None:
    plan = _noise_plan("full", 1.0)
    plan = dataclasses.replace(plan, config=DPConfig(1.0))
    good = sum_stats(_payloads(3, "full"))
    limits = TotalLimits(R, 3, 1000)
    assert release_central(good, plan, np.random.default_rng(0), limits).stats.mode == "full"
    with pytest.raises(TotalOutOfBoundsError, match=r"^the central DP release aborted: .*first "
                                                    r"moment \(class 'a'\)"):
        release_central(_poisoned(good), plan, np.random.default_rng(0), limits)


def test_vectors_of_another_layout_are_refused() -> None:
    s = _payloads(1, "diag")[0]
    ints, floats = schema_for("diag").flatten(s)
    with pytest.raises(StatsValidationError, match=(
            r"^the vectors checked against the bounds must have shapes \(4,\) and \(36,\) for "
            r"mode 'diag' statistics with C=3 and d=6; got \(4,\) and \(35,\)")):
        check_bounds(s.meta, ints, floats[:-1], TotalLimits(R))


@pytest.mark.parametrize("limbs", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_rounding_tolerances_are_tight(limbs: int, mode: str) -> None:
    """Totals at the bounds pass; the same totals 10⁻⁷ beyond them fail: the tolerances are
    rounding (γ of M + d + n + 2 additions, the codec's error bound), not a loose constant."""
    payloads = _worst_case(5, mode)
    codec = FixedPointCodec(5, 1000, R, limbs)
    words = np.zeros(codec.length(payloads[0].meta), np.uint64)
    for p in payloads:
        words += codec.encode(p)
    meta = payloads[0].meta
    ints, floats = codec.decode_vectors(meta, words)
    limits = TotalLimits.for_codec(codec)
    assert check_bounds(meta, ints, floats, limits) == ()
    lay = {g.name: g for g in schema_for(mode).float_layout(3, D)}
    second = lay[{"full": "class_scatter", "gram": "scatter"}.get(mode, "sq_sums")]
    for name, seg in (("first moment", lay["sums"]), ("second moment", second)):
        over = floats.copy()
        over[seg.offset] *= 1.0 + 1e-7  # class 'a', coordinate 0: the one at the bound
        assert name in _failed(check_bounds(meta, ints, over, limits))
