"""Security of the federated evaluation through secure aggregation.

What a client's refusal may say, the node's ledger of evaluation rounds, the per-row held-out
split, descriptions that would exhaust the server's memory, the codec's stated error and
bounds, inconsistent totals and the fit's noise multiplier in the privacy accounting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator, Mapping
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.errors import AggregationAbortedError, ClientRefusalError, ConfigError, ProtocolError
from ghofl.evaluation.federated import EvaluationSums
from ghofl.evaluation.split import held_out_mask, rows_digest, split_rows
from ghofl.secure import (
    FixedPointCodec,
    InMemoryTransport,
    RoundLedger,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    VectorMeta,
    VectorPayload,
)
from ghofl.secure.messages import AdvertiseKeys, ClientMessage, ServerMessage
from ghofl.secure.vector_round import run_vector_sum
from ghofl.secure.vectors import refuse_client_vector, vector_meta_difference
from ghofl.server.eval_privacy import charge_evaluation, composed_epsilon, release_evaluation
from ghofl.server.federated_eval import total_sums
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.schema import schema_for
from tests.helpers import gaussian_mixture

META = VectorMeta("demo", (100, 100), (1.0, 50.0))


# ---------------------------------------------------------------------- 1. refusals
@settings(max_examples=60, deadline=None)
@given(value=st.floats(min_value=1.0001, max_value=1e12, allow_nan=False),
       entry=st.integers(0, 1), as_int=st.booleans())
def test_a_refusal_never_carries_the_clients_value(value: float, entry: int,
                                                   as_int: bool) -> None:
    ints, floats = np.array([3, 4]), np.array([0.5, 10.0])
    if as_int:
        ints[entry] = 100 + int(value)
        shown = {str(int(ints[entry]))}
    else:
        floats[entry] = value * META.float_bounds[entry]
        v = float(floats[entry])
        shown = {repr(v), f"{v:.6g}", f"{v:g}"}
    with pytest.raises(ClientRefusalError, match="is not finite or lies outside") as info:
        refuse_client_vector(VectorPayload(META, ints, floats))
    assert not any(s in str(info.value) for s in shown), str(info.value)
    assert any(s in info.value.local_detail for s in shown)  # kept for the client's log only


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(min_value=2.0, max_value=1e6, allow_nan=False))
def test_a_statistics_refusal_never_carries_the_clients_statistics(scale: float) -> None:
    x, y = gaussian_mixture(0, num_classes=2, dim=3, n=30)
    stats = compute_stats(x, y, ("a", "b"), "pooled", clip_norm=1.0)
    raw = compute_stats(np.full((1, 3), scale), np.zeros(1, np.int64), ("a", "b"), "pooled")
    sch = schema_for("pooled")
    big = unflatten_stats(stats.meta, *(a + b for a, b in zip(
        sch.flatten(stats), sch.flatten(raw), strict=True)))  # a sample beyond R, unclipped
    with pytest.raises(ClientRefusalError, match=r"second moment \(class 'a'\)") as info:
        FixedPointCodec(3, 1000, 1.0).encode(big)
    text = str(info.value)
    assert "=" not in text.split("can produce:")[1].split("; recompute")[0]
    assert "tr S = " in info.value.local_detail
    with pytest.raises(ClientRefusalError, match="more samples than the public maximum M=10 "
                       "per client") as info:
        FixedPointCodec(3, 10, 1.0).encode(stats)
    assert "30" not in str(info.value) and "30 samples" in info.value.local_detail


# ---------------------------------------------------------------------- 2. the node's ledger
def _rows_round(source: str, ledgers: list[RoundLedger], seed: int,
                cost: tuple[float, float] = (0.0, 0.0)) -> dict[str, str]:
    """One vector round of 3 clients whose payloads (fresh each round) come from ``source``."""
    rng = np.random.default_rng(seed)
    clients = [SecAggClient(f"c{i}", VectorPayload(META, np.array([1, 2]),
                                                   rng.uniform(0, 1, 2), source=source),
                            ledger=led, allow_unauthenticated=True, privacy_cost=cost)
               for i, led in enumerate(ledgers)]
    server = SecAggServer(SecAggConfig(clip_norm=1.0, threshold=2), META, ["c0", "c1", "c2"])
    transport = InMemoryTransport(clients)
    with contextlib.suppress(AggregationAbortedError):
        run_vector_sum(server, transport)
    return {c: why for t in transport.traffic.values() for c, why in t.refused.items()}


def test_a_second_evaluation_round_over_the_same_rows_is_refused(tmp_path: Path) -> None:
    digest = rows_digest(np.ones((4, 2)), np.zeros(4, dtype=np.int64))
    ledgers = [RoundLedger(tmp_path / f"l{i}.json") for i in range(3)]
    assert _rows_round(digest, ledgers, 0, (0.5, 1e-6)) == {}
    assert [e.epsilon for e in ledgers[0].entries() if e.stage == "masked"] == [0.5]
    assert ledgers[0].spent(f"data:{digest}") == (0.5, 1e-6)
    # a fresh noise share (other vectors) over the same held-out rows: refused by every client
    refused = _rows_round(digest, ledgers, 1)
    assert set(refused) == {"c0", "c1", "c2"}
    repeated = "a second round over the same held-out evaluation rows"
    assert all(repeated in why for why in refused.values())
    with pytest.raises(ProtocolError, match=repeated):
        ledgers[0].check(f"data:{digest}", b"\x01" * 16)
    # other rows, or a node that allows repeats explicitly, take part
    other = rows_digest(np.ones((5, 2)), np.zeros(5, dtype=np.int64))
    assert _rows_round(other, ledgers, 2) == {}
    repeat = [RoundLedger(tmp_path / f"l{i}.json", allow_repeat=True) for i in range(3)]
    assert _rows_round(digest, repeat, 3) == {}


# ---------------------------------------------------------------------- 3. the split
def test_the_split_is_decided_row_by_row() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4000, 3)), rng.integers(0, 3, 4000)
    mask = held_out_mask(x, y, 0.2, 7)
    assert abs(mask.mean() - 0.2) < 0.025  # ≈ f (4000 rows: sd 0.0063)
    more = held_out_mask(np.vstack([rng.normal(size=(1, 3)), x]), np.r_[1, y], 0.2, 7)
    np.testing.assert_array_equal(more[1:], mask)  # adding a row moves no other row
    np.testing.assert_array_equal(held_out_mask(x[::-1], y[::-1], 0.2, 7), mask[::-1])
    assert not np.array_equal(held_out_mask(x, y, 0.2, 8), mask)  # keyed by the seed
    train, held = split_rows(x[:5], y[:5], 0.2, 7)
    assert sorted([*train, *held]) == list(range(5))
    assert not held_out_mask(x, y, 0.0, 7).any()
    with pytest.raises(ConfigError, match=r"evaluation fraction must be in \[0, 1\)"):
        held_out_mask(x, y, 1.0, 7)


# ---------------------------------------------------------------------- 5. descriptions
def test_a_huge_advertised_description_is_refused_without_expanding_it() -> None:
    forged = {**META.to_dict(), "int_bounds": [[100, 10**11]]}
    why = vector_meta_difference(json.dumps(forged), META)
    assert "more than the 2 entries expected" in why

    class Forging(InMemoryTransport):
        def exchange(self, stage: str, requests: Mapping[str, ServerMessage]  # type: ignore[override]
                     ) -> Iterator[tuple[str, ClientMessage]]:
            for c, msg in super().exchange(stage, requests):  # type: ignore[arg-type]
                if c == "c0" and isinstance(msg, AdvertiseKeys):
                    msg = dataclasses.replace(msg, meta=json.dumps(forged))
                yield c, msg

    pays = [VectorPayload(META, np.array([1, 1]), np.array([0.5, 1.0])) for _ in range(3)]
    clients = [SecAggClient(f"c{i}", p, ledger=None, allow_unauthenticated=True)
               for i, p in enumerate(pays)]
    server = SecAggServer(SecAggConfig(clip_norm=1.0, threshold=2), META, ["c0", "c1", "c2"])
    out = run_vector_sum(server, Forging(clients))
    assert "more than the 2 entries expected" in server.excluded["c0"]
    np.testing.assert_array_equal(out.total.ints, [2, 2])


# ---------------------------------------------------------------------- 6. the error bound
@pytest.mark.parametrize("limbs", [1, 2])
def test_the_decoded_float_error_is_within_the_stated_bound(limbs: int) -> None:
    k = 1000
    meta = VectorMeta("f", (1,), (1.0, 1e-3, 7.0))
    codec = FixedPointCodec(k, 100, 1.0, limbs)
    rng = np.random.default_rng(1)
    floats = rng.uniform(0, 1, (k, 3)) * np.array(meta.float_bounds)
    words = np.zeros(codec.length(meta), dtype=np.uint64)
    for f in floats:
        words += codec.encode(VectorPayload(meta, np.array([1]), f))
    total = codec.decode_payload(meta, words)
    exact = [sum(Fraction(float(v)) for v in floats[:, j]) for j in range(3)]
    err = np.array([abs(Fraction(float(t)) - e) for t, e in zip(total.floats, exact,
                                                                strict=True)], dtype=float)
    bound = codec.vector_error_bounds(meta)
    assert np.all(err <= bound), (err, bound)
    assert np.all(bound <= 2.0**-40 * k * np.array(meta.float_bounds))  # and still tight


# ---------------------------------------------------------------------- 7. bad bounds
def test_bounds_the_words_cannot_carry_are_refused_before_the_round() -> None:
    cfg = SecAggConfig(clip_norm=1.0)
    with pytest.raises(ConfigError, match=r"float bound of entry 0 of 'huge' = 3 × 1e\+308 "
                       r"= inf is not within \[2\^-898, 2\^1022\]"):
        SecAggServer(cfg, VectorMeta("huge", (), (1e308,)), ["a", "b", "c"])
    with pytest.raises(ConfigError, match=r"entry 1 of 'tiny' .* is not within"):
        FixedPointCodec(3, 10, 1.0).vector_exponents(VectorMeta("tiny", (), (1.0, 1e-300)))
    with pytest.raises(ConfigError, match=r"largest integer bound of 'wide' .* does not fit in "
                       r"62 bits"):
        SecAggServer(cfg, VectorMeta("wide", (2**61,), ()), ["a", "b", "c"])


# ---------------------------------------------------------------------- 8. inconsistent totals
def test_an_inconsistent_total_within_the_bounds_aborts_naming_a_client() -> None:
    layout = EvaluationSums.from_vectors(("a", "b"), ("nb",), 2, np.zeros(9, dtype=np.int64),
                                         np.zeros(5))
    ints = np.zeros(9, dtype=np.int64)
    ints[0], ints[4], ints[8] = 3, 2, 1  # 3 rows in the confusion, 2 in the bins
    bad = VectorPayload(VectorMeta("evaluation", (10,) * 9, (1.0,) * 5), ints, np.zeros(5))
    with pytest.raises(AggregationAbortedError, match="a client sent inconsistent sums"):
        total_sums(layout, bad)


# ---------------------------------------------------------------------- 11. accounting
def test_the_fits_own_noise_multiplier_is_composed() -> None:
    layout = EvaluationSums.from_vectors(("a", "b"), ("nb",), 2, np.zeros(9, dtype=np.int64),
                                         np.zeros(5))
    release = release_evaluation(layout, 3.0, np.random.default_rng(0))
    fit = {"epsilon_spent": 1.0, "delta_spent": 1e-5, "delta": 1e-5, "noise_multiplier": 2.0,
           "noise_multiplier_released": 2.5}
    charged = charge_evaluation(fit, release)
    assert charged["epsilon_total"] == pytest.approx(composed_epsilon((2.5, 3.0), 1e-5))
    with pytest.raises(ConfigError, match="names no noise multiplier"):
        charge_evaluation({"epsilon_spent": 1.0, "delta_spent": 1e-5, "delta": 1e-5}, release)
