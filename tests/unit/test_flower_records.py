"""Records codec of the Flower integration: every protocol message and ClientStats in every
mode round-trip bit-exactly through a Flower RecordDict; malformed records are refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from ghofl.errors import ProtocolError
from ghofl.integrations.flower.records import (
    message_from_record,
    message_to_record,
    stats_from_record,
    stats_to_record,
)
from ghofl.secure import (
    InMemoryTransport,
    PlainClient,
    PlainServer,
    SecAggConfig,
    run_aggregation,
)
from ghofl.secure.messages import (
    ClientMessage,
    MaskedInput,
    PlainRequest,
    ServerMessage,
    Stage,
)
from ghofl.stats import ClientStats
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.projection import ProjectionSpec
from tests.helpers import gaussian_mixture, secure_federation


def _same(a: Any, b: Any) -> bool:
    """Deep, bit-exact equality of messages (arrays by dtype, shape and bytes)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, ClientStats):
        return a.meta == b.meta and a.n_clipped == b.n_clipped and all(
            _same(x, y) if x is not None else y is None
            for x, y in zip(a.arrays().values(), b.arrays().values(), strict=True)
        ) and list(a.arrays()) == list(b.arrays())
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name))
                   for f in dataclasses.fields(a))
    return bool(a == b)


class _Recording:
    """Wraps a transport: keeps every request and reply that crossed it."""

    def __init__(self, inner: InMemoryTransport) -> None:
        self.inner = inner
        self.traffic = inner.traffic
        self.seen: list[ServerMessage | ClientMessage] = []

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        self.seen.extend(requests.values())
        for cid, reply in self.inner.exchange(stage, requests):
            self.seen.append(reply)
            yield cid, reply


def _payloads(mode: str = "full", clip: float | None = 6.0, n: int = 4) -> list[ClientStats]:
    x, y = gaussian_mixture(0, num_classes=3, dim=5, n=120)
    return [compute_stats(x[i::n], y[i::n], 3, mode, clip_norm=clip) for i in range(n)]


def _secure_messages() -> list[ServerMessage | ClientMessage]:
    payloads = _payloads()
    clients, server, _, _ = secure_federation([f"site-{i}" for i in range(len(payloads))],
                                              list(payloads), SecAggConfig(clip_norm=6.0))
    rec = _Recording(InMemoryTransport(clients, {"mask": 1}, seed=1))
    run_aggregation(server, rec)
    return rec.seen


def test_every_secure_message_round_trips_bit_exact() -> None:
    seen = _secure_messages()
    kinds = {type(m).__name__ for m in seen}
    assert kinds == {"AdvertiseRequest", "AdvertiseKeys", "RevealRequest", "NonceReveal",
                     "ShareRequest", "ShareKeys", "MaskRequest", "MaskedInput",
                     "ConsistencyRequest", "ConsistencySignature", "UnmaskRequest",
                     "UnmaskShares"}
    for msg in seen:
        back = message_from_record(message_to_record(msg))
        assert _same(msg, back), type(msg).__name__
    vec = next(m for m in seen if isinstance(m, MaskedInput)).vector
    assert vec.dtype == np.uint64


def test_plain_messages_round_trip() -> None:
    payloads = _payloads("pooled", None)
    rec = _Recording(InMemoryTransport([PlainClient(f"c{i}", s) for i, s in enumerate(payloads)]))
    run_aggregation(PlainServer([f"c{i}" for i in range(4)]), rec)
    assert {type(m).__name__ for m in rec.seen} == {"PlainRequest", "PlainInput"}
    for msg in rec.seen:
        assert _same(msg, message_from_record(message_to_record(msg)))


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
@pytest.mark.parametrize("clip", [None, 2.5])
def test_client_stats_round_trip_every_mode(mode: str, clip: float | None) -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=6, n=90)
    proj = ProjectionSpec(7, 6, 4) if mode == "pooled" else None
    stats = compute_stats(x, y, ("a", "b", "c"), mode, projection=proj, clip_norm=clip)
    back = stats_from_record(stats_to_record(stats))
    assert _same(stats, back)
    # also after an aggregate (sum of two payloads)
    total = stats + compute_stats(x[:10], y[:10], ("a", "b", "c"), mode, projection=proj,
                                  clip_norm=clip)
    assert _same(total, stats_from_record(stats_to_record(total)))


def _header(rd: RecordDict) -> ConfigRecord:
    rec = rd["ghofl"]
    assert isinstance(rec, ConfigRecord)
    return rec


def _request() -> RecordDict:
    return message_to_record(PlainRequest(1, b"r" * 16, "input"))


def test_refuses_a_record_without_ghofl_header() -> None:
    with pytest.raises(ProtocolError, match=r"^the Flower message holds no ConfigRecord 'ghofl'; it was not sent by this version of ghofl$"):
        message_from_record(RecordDict())


def test_refuses_another_records_version() -> None:
    rd = _request()
    _header(rd)["records-version"] = 2  # a peer still on protocol version 2
    with pytest.raises(ProtocolError, match=r"^the ghofl record 'ghofl' has records-version 2; this ghofl reads version 3; run the same ghofl version on the server and the clients$"):
        message_from_record(rd)


def test_refuses_a_missing_key() -> None:
    rd = _request()
    del _header(rd)["round_id"]
    with pytest.raises(ProtocolError, match=r"^the ghofl PlainRequest record lacks the key 'round_id'; it is malformed$"):
        message_from_record(rd)


def test_refuses_a_wrong_type() -> None:
    rd = _request()
    _header(rd)["round_id"] = "not bytes"
    with pytest.raises(ProtocolError, match=r"^the ghofl PlainRequest record's key 'round_id' must be bytes; got str$"):
        message_from_record(rd)


def test_refuses_unknown_and_unexpected_types() -> None:
    rd = _request()
    _header(rd)["type"] = "Evil"
    with pytest.raises(ProtocolError, match=r"^the ghofl record holds an unknown message type 'Evil'"):
        message_from_record(rd)
    with pytest.raises(ProtocolError, match=r"^the ghofl record holds a PlainRequest where a ClientMessage was expected$"):
        message_from_record(_request(), ClientMessage)


def test_refuses_columns_of_different_lengths_and_bad_lists() -> None:
    seen = _secure_messages()
    reveal_req = next(m for m in seen if type(m).__name__ == "RevealRequest")
    rd = message_to_record(reveal_req)
    _header(rd)["roster.enc_public"] = [b"x"]
    with pytest.raises(ProtocolError, match=r"^the ghofl RevealRequest record's columns of 'roster' have different lengths \(4, 1, 4, 4, 4\); it is malformed$"):
        message_from_record(rd)
    rd = message_to_record(reveal_req)
    _header(rd)["roster.client"] = [b"a", b"b", b"c", b"d"]
    with pytest.raises(ProtocolError, match=r"^the ghofl RevealRequest record's key 'roster.client' must be a list of a string; it holds a bytes$"):
        message_from_record(rd)
    rd = message_to_record(reveal_req)
    _header(rd)["roster.nonce_commitment"] = ["x"] * 4
    with pytest.raises(ProtocolError, match=r"^the ghofl RevealRequest record's key 'roster.nonce_commitment' must be a list of bytes; it holds a str$"):
        message_from_record(rd)
    share_req = next(m for m in seen if type(m).__name__ == "ShareRequest")
    rd = message_to_record(share_req)
    _header(rd)["nonces.1"] = [b"n"] * 3
    with pytest.raises(ProtocolError, match=r"^the ghofl ShareRequest record's columns of 'nonces' have different lengths \(4, 3\); it is malformed$"):
        message_from_record(rd)
    mask_req = next(m for m in seen if type(m).__name__ == "MaskRequest" and m.shares)
    rd = message_to_record(mask_req)
    _header(rd)["shares.key_commitment"] = _header(rd)["shares.key_commitment"][1:]
    with pytest.raises(ProtocolError, match=r"^the ghofl MaskRequest record's columns of 'shares' have different lengths"):
        message_from_record(rd)


def test_complaints_with_their_pair_keys_round_trip_and_are_validated() -> None:
    seen = _secure_messages()
    masked = next(m for m in seen if isinstance(m, MaskedInput))
    accusing = dataclasses.replace(masked, complaints=(("site-1", "does not open"),),
                                   complaint_keys=(("site-1", bytes(range(32))),))
    assert _same(accusing, message_from_record(message_to_record(accusing)))
    rd = message_to_record(accusing)
    _header(rd)["complaint_keys.1"] = ["not bytes"]
    with pytest.raises(ProtocolError, match=r"key 'complaint_keys.1' must be a list of bytes"):
        message_from_record(rd)


def test_refuses_a_masked_vector_of_the_wrong_dtype() -> None:
    seen = _secure_messages()
    masked = next(m for m in seen if isinstance(m, MaskedInput))
    rd = message_to_record(masked)
    rd["ghofl-arrays"] = ArrayRecord({"vector": Array(masked.vector.astype(np.float64))})
    with pytest.raises(ProtocolError, match=r"^the ghofl MaskedInput record's array 'vector' must be a 1-D uint64 vector; got float64 of shape \(\d+,\)$"):
        message_from_record(rd)
    del rd["ghofl-arrays"]
    with pytest.raises(ProtocolError, match=r"^the Flower message holds no ArrayRecord 'ghofl-arrays'"):
        message_from_record(rd)


def test_refuses_corrupt_statistics() -> None:
    rd = stats_to_record(_payloads()[0])
    arrays = rd["ghofl-stats"]
    assert isinstance(arrays, ArrayRecord)
    arrays["counts"] = Array(np.array([-1, 2, 3], dtype=np.int64))
    with pytest.raises(ProtocolError, match=r"^the ghofl statistics record is invalid: "):
        stats_from_record(rd)
    rd = stats_to_record(_payloads()[0])
    meta = rd["ghofl-stats-meta"]
    assert isinstance(meta, ConfigRecord)
    meta["n_clipped"] = "3"
    with pytest.raises(ProtocolError, match=r"^the ghofl statistics record's key 'n_clipped' must be an integer; got str$"):
        stats_from_record(rd)


def test_identity_binding_messages_round_trip() -> None:
    from ghofl.secure.binding import answer_hello, hello_request
    from ghofl.secure.identity import IdentityKey, Roster

    key = IdentityKey.generate()
    roster = Roster.from_identities({"site-a": key})
    req = hello_request(roster)
    for msg in (req, answer_hello(req, key, roster, "node-3")):
        back = message_from_record(message_to_record(msg))
        assert _same(msg, back), type(msg).__name__


def test_distributed_dp_level_fields_round_trip_and_are_validated() -> None:
    from ghofl.privacy import DPConfig, NoisePlan, NoisyDecoder, noise_share_encoder
    from ghofl.privacy.mechanism import block_sigmas
    from ghofl.privacy.sensitivity import block_sensitivities
    from ghofl.secure import SecAggClient, SecAggServer
    from ghofl.secure.messages import ShareKeys, UnmaskShares

    sens = block_sensitivities("full", 6.0)
    frac = {b: 1 / 3 for b in sens}
    plan = NoisePlan(DPConfig(1.0, 1e-5, "distributed"), "full", 6.0, 1, 1.0, sens, frac,
                     block_sigmas(sens, frac, 1.0))
    payloads = _payloads()
    clients = [SecAggClient(f"site-{i}", p, encode=noise_share_encoder(
        plan, np.random.default_rng(i)), allow_unauthenticated=True)
        for i, p in enumerate(payloads)]
    server = SecAggServer(SecAggConfig(clip_norm=6.0, threshold=2, noise_levels=16),
                          payloads[0].meta, [c.client_id for c in clients],
                          decode=NoisyDecoder(plan))
    rec = _Recording(InMemoryTransport(clients, {"mask": 1}, seed=1))
    run_aggregation(server, rec)
    shares = [m for m in rec.seen if isinstance(m, ShareKeys)]
    unmask = [m for m in rec.seen if isinstance(m, UnmaskShares)]
    assert all(len(m.level_commitments) == 2 for m in shares)  # ladder (3, 4) for t=2, n=4
    assert any(m.level_shares for m in unmask)
    for msg in rec.seen:
        assert _same(msg, message_from_record(message_to_record(msg))), type(msg).__name__
    rd = message_to_record(unmask[0])
    _header(rd)["level_shares.1"] = [True] * len(unmask[0].level_shares)
    with pytest.raises(ProtocolError, match=r"key 'level_shares.1' must be a list of an integer"):
        message_from_record(rd)
    rd = message_to_record(shares[0])
    _header(rd)["level_commitments"] = ["x", "y"]
    with pytest.raises(ProtocolError, match=r"key 'level_commitments' must be a list of bytes"):
        message_from_record(rd)
