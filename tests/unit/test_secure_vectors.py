"""Secure sums of public-shape vectors (ghofl.secure.vectors): description, codec, checks, round."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ghofl.errors import (
    AggregationAbortedError,
    ClientRefusalError,
    ConfigError,
    InputError,
    ProtocolError,
    StatsFormatError,
    TotalOutOfBoundsError,
)
from ghofl.secure import (
    ClientPolicy,
    FixedPointCodec,
    IdentityKey,
    InMemoryTransport,
    Roster,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    VectorMeta,
    VectorPayload,
)
from ghofl.secure.vector_round import run_vector_sum
from ghofl.secure.vectors import (
    decode_vector_total,
    refuse_client_vector,
    refuse_vector_total,
    vector_meta_difference,
)

K = 6
META = VectorMeta("demo", (100,) * 5 + (1,), (3604.0, 100.0, 100.0, 1.0, 1.0))


def _payloads(seed: int, k: int = K, meta: VectorMeta = META) -> list[VectorPayload]:
    rng = np.random.default_rng(seed)
    ib, fb = meta.bound_arrays()
    return [VectorPayload(meta, rng.integers(0, ib + 1), rng.uniform(0, fb))
            for _ in range(k)]


def _round(payloads: list[VectorPayload], drops: dict[str, int] | None = None,
           neighbours: int | None = None) -> tuple[SecAggServer, InMemoryTransport]:
    """A round over ``payloads``; with ``neighbours`` a SecAgg+ graph under weaker targets."""
    keys = {f"site-{i:02d}": IdentityKey.generate() for i in range(len(payloads))}
    roster = Roster.from_identities(keys)
    weak = {} if neighbours is None else {"corrupt_fraction": 0.1, "dropout_fraction": 0.1,
                                          "sigma": 8.0}
    policy = ClientPolicy(**weak, min_neighbours=neighbours)  # type: ignore[arg-type]
    clients = [SecAggClient(c, p, identity=keys[c], roster=roster, ledger=None, policy=policy)
               for c, p in zip(keys, payloads, strict=True)]
    cfg = SecAggConfig(clip_norm=1.0, max_samples=100, neighbours=neighbours,
                       **weak)  # type: ignore[arg-type]
    return SecAggServer(cfg, payloads[0].meta, roster=roster), InMemoryTransport(clients, drops)


def test_meta_round_trips_canonically_and_names_its_differences() -> None:
    d = META.to_dict()
    assert d["int_bounds"] == [[100, 5], [1, 1]]  # run-length encoded
    assert VectorMeta.from_dict(json.loads(json.dumps(d))) == META
    other = VectorMeta("demo", (100,) * 5 + (2,), META.float_bounds)
    assert META.differences(other) == ["int_bounds (entry 5: 1 vs 2)"]
    assert "n_float" in META.differences(VectorMeta("demo", META.int_bounds, (1.0,)))[0]
    assert "entry 5: 1 vs 2" in vector_meta_difference(json.dumps(other.to_dict()), META)
    assert "malformed" in vector_meta_difference("{]", META)


def test_bad_descriptions_and_payloads_are_refused() -> None:
    with pytest.raises(ConfigError, match="needs a non-empty name"):
        VectorMeta("", (1,), ())
    with pytest.raises(ConfigError, match="integer bounds of a vector payload must be >= 0"):
        VectorMeta("x", (-1,), ())
    with pytest.raises(ConfigError, match="float bounds of a vector payload must be finite"):
        VectorMeta("x", (), (0.0,))
    with pytest.raises(ConfigError, match="has no entries"):
        VectorMeta("x", (), ())
    with pytest.raises(StatsFormatError, match="not a vector payload description"):
        VectorMeta.from_dict({"format": "other"})
    with pytest.raises(InputError, match=r"integer vector of 'demo' must be int64 of shape \(6,\)"):
        VectorPayload(META, np.zeros(5, np.int64), np.zeros(5))
    with pytest.raises(InputError, match=r"float vector of 'demo' must be float64 of shape"):
        VectorPayload(META, np.zeros(6, np.int64), np.zeros(4))


@pytest.mark.parametrize("limbs", [1, 2])
def test_codec_sums_exactly_within_its_error_bound(limbs: int) -> None:
    codec = FixedPointCodec(K, 100, 1.0, limbs)
    pays = _payloads(1)
    words = sum(codec.encode(p) for p in pays)
    assert words.shape == (codec.length(META),) and codec.length(META) == 6 + limbs * 5
    total = codec.decode_payload(META, words)
    np.testing.assert_array_equal(total.ints, sum(p.ints for p in pays))
    exact = np.sum([p.floats for p in pays], axis=0)
    err = np.abs(total.floats - exact)
    assert np.all(err <= codec.vector_error_bounds(META) + 1e-12 * np.abs(exact))
    if limbs == 2:
        assert np.all(err <= 1e-12 * np.maximum(np.abs(exact), 1.0))


def test_a_client_vector_beyond_its_bounds_is_refused() -> None:
    ints = np.array([0, 0, 0, 101, 0, 0])
    with pytest.raises(ClientRefusalError, match=r"integer entry 3 is not finite or lies outside "
                       r"\[0, 100\]") as info:
        refuse_client_vector(VectorPayload(META, ints, np.zeros(5)))
    assert "101" not in str(info.value) and "value is 101" in info.value.local_detail
    floats = np.array([0.0, 0.0, -1.0, 0.0, 0.0])
    with pytest.raises(InputError, match="float entry 2 is not finite or lies outside"):
        FixedPointCodec(K, 100, 1.0).encode(VectorPayload(META, np.zeros(6, np.int64), floats))
    signed = VectorMeta("s", (5,), (1.0,), nonnegative=False)
    refuse_client_vector(VectorPayload(signed, np.array([-5]), np.array([-1.0])))
    with pytest.raises(ConfigError, match="does not fit in 62 bits"):
        FixedPointCodec(4, 100, 1.0).vector_exponents(VectorMeta("big", (2**61,), ()))


def test_the_total_is_checked_for_its_number_of_contributors() -> None:
    ints = np.array([200, 0, 0, 0, 0, 2])
    refuse_vector_total(META, ints, np.zeros(5), 2, np.zeros(5))
    with pytest.raises(TotalOutOfBoundsError, match=r"'demo' total of 1 clients exceeds"):
        refuse_vector_total(META, ints, np.zeros(5), 1, np.zeros(5))
    codec = FixedPointCodec(K, 100, 1.0)
    # a lying client's words (its own bounds times 100) pass no honest encoder: only the check
    liar = VectorPayload(META, np.zeros(6, np.int64), np.array([3604.0, 0, 0, 0, 0]))
    words = codec.encode(liar) * np.uint64(3)
    cfg = SecAggConfig(clip_norm=1.0, max_samples=100).for_clients(K)
    with pytest.raises(TotalOutOfBoundsError, match="float entry 0"):
        decode_vector_total(cfg, META, words, 2)
    assert decode_vector_total(cfg, META, words, 3).floats[0] == pytest.approx(3 * 3604.0)


@pytest.mark.parametrize("neighbours", [None, 5])
def test_secure_round_sums_vectors_with_a_dropout(neighbours: int | None) -> None:
    pays = _payloads(2, 12)
    server, transport = _round(pays, {"mask": 1}, neighbours)
    out = run_vector_sum(server, transport)
    assert out.summary["params"]["neighbours"] == (neighbours or 11)
    kept = [int(c.split("-")[1]) for c in out.summary["survivor_ids"]]
    assert len(kept) == 11 and out.summary["dropped"] and out.summary["protocol"] == "secure"
    np.testing.assert_array_equal(out.total.ints, sum(pays[i].ints for i in kept))
    np.testing.assert_allclose(out.total.floats, sum(pays[i].floats for i in kept),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(AggregationAbortedError, match="read its total with vector_result"):
        server.result()


def test_a_client_over_its_bounds_refuses_before_masking() -> None:
    pays = _payloads(3)
    bad = VectorPayload(META, pays[0].ints, pays[0].floats.copy())
    bad.floats[1] = 1e6
    server, transport = _round([bad, *pays[1:]])
    out = run_vector_sum(server, transport)
    assert "site-00" not in out.summary["survivor_ids"]
    assert "float entry 1 is not finite or lies outside" in out.summary["refused"]["site-00"]
    assert "1e+06" not in out.summary["refused"]["site-00"]  # the server never sees the value
    assert out.summary["dropped"]["site-00"] == "mask"


def test_a_client_with_other_vectors_is_excluded() -> None:
    pays = _payloads(4)
    other = VectorMeta("demo", (100,) * 5 + (2,), META.float_bounds)
    odd = VectorPayload(other, pays[-1].ints, pays[-1].floats)
    server, transport = _round([*pays[:-1], odd])
    run_vector_sum(server, transport)
    assert "int_bounds (entry 5: 1 vs 2)" in server.excluded[f"site-{K - 1:02d}"]


def test_vector_rounds_refuse_statistics_options() -> None:
    cfg = SecAggConfig(clip_norm=1.0)
    with pytest.raises(ConfigError, match="decode= applies to statistics rounds"):
        SecAggServer(cfg, META, ["a", "b"], decode=lambda *a: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ProtocolError, match="encode= applies to statistics"):
        SecAggClient("a", _payloads(0, 1)[0], encode=lambda s, p: np.zeros(1, np.uint64),
                     allow_unauthenticated=True)
    server = SecAggServer(cfg, META, ["a", "b"])
    with pytest.raises(AggregationAbortedError, match="no vector total"):
        server.vector_result()
