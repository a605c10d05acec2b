"""The secure sum end to end over the in-memory transport: exactness, dropouts, thresholds,
what the server sees, and clients that misbehave."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import AggregationAbortedError, ConfigError, ProtocolError
from ghofl.secure import (
    InMemoryTransport,
    PlainClient,
    PlainServer,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    parse_drops,
    run_aggregation,
)
from ghofl.secure import primitives as cr
from ghofl.secure._common import share_aad
from ghofl.secure.graph_params import required_parameters
from ghofl.secure.messages import (
    PROTOCOL_VERSION,
    AdvertiseRequest,
    ClientMessage,
    ConsistencyRequest,
    MaskedInput,
    PlainInput,
    ServerMessage,
    ShareKeys,
    Stage,
    UnmaskRequest,
)
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats, sum_stats
from ghofl.stats.projection import ProjectionSpec
from tests.helpers import gaussian_mixture, secure_federation

CLIP = 6.0
ROUND = b"test-round-00001"


@pytest.fixture
def fixed_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Order the graph by a fixed seed (not by the fresh nonces), so sparse-graph tests
    that depend on who neighbours whom are reproducible."""
    import hashlib

    monkeypatch.setattr("ghofl.secure._common.graph_seed",
                        lambda session: hashlib.sha256(b"fixed graph order").digest())


def _payloads(n: int, mode: str = "full", *, seed: int = 0, dim: int = 6, classes: int = 3,
              projection: ProjectionSpec | None = None) -> list[ClientStats]:
    out = []
    for i in range(n):
        x, y = gaussian_mixture(seed * 1000 + i, classes, dim, n=60)
        out.append(compute_stats(x, y, classes, mode, projection=projection,  # type: ignore[arg-type]
                                 clip_norm=CLIP))
    return out


def _ids(n: int) -> list[str]:
    return [f"site-{i:02d}" for i in range(n)]


def _run(payloads: list[ClientStats], *, drops: Mapping[str, int] | None = None,
         config: SecAggConfig | None = None, wrap: Callable[[Any], Any] | None = None,
         record: bool = False, seed: int = 0) -> tuple[Any, SecAggServer]:
    ids = _ids(len(payloads))
    clients, server, _, _ = secure_federation(ids, list(payloads),
                                              config or SecAggConfig(clip_norm=CLIP),
                                              record_view=record, round_id=ROUND)
    transport: Any = InMemoryTransport(clients, drops, seed=seed)
    if wrap is not None:
        transport = wrap(transport)
    return run_aggregation(server, transport), server


def _expected(payloads: list[ClientStats], survivors: list[str]) -> ClientStats:
    index = {c: i for i, c in enumerate(_ids(len(payloads)))}
    return sum_stats(payloads[index[c]] for c in survivors)


def _assert_exact(total: ClientStats, expected: ClientStats) -> None:
    assert np.array_equal(total.counts, expected.counts)
    assert total.n_clipped == expected.n_clipped
    assert total.allclose(expected, rtol=1e-12)


# ---------------------------------------------------------------------- exactness
@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
@pytest.mark.parametrize("projected", [False, True])
@pytest.mark.parametrize("n", [2, 5, 16])
def test_secure_sum_equals_plain_sum(mode: str, projected: bool, n: int) -> None:
    proj = ProjectionSpec(7, 6, 4) if projected else None
    payloads = _payloads(n, mode, seed=n, projection=proj)
    report, server = _run(payloads)
    assert report.survivors == _ids(n)
    _assert_exact(report.total, sum_stats(payloads))
    assert server.state == "done"


@pytest.mark.usefixtures("fixed_graph")
def test_secure_sum_on_a_sparse_graph_with_dropouts() -> None:
    payloads = _payloads(30, "pooled", seed=3)
    report, server = _run(payloads, config=SecAggConfig(clip_norm=CLIP),
                          drops={"share": 2, "mask": 3, "unmask": 2}, seed=5)
    k, t_s = required_parameters(30)  # sized for exposure <= 2^-40, abort <= 2^-20
    assert server.params.neighbours == k < 29 and not server.params.complete_graph
    assert server.params.share_threshold == t_s
    assert len(report.survivors) == 25
    _assert_exact(report.total, _expected(payloads, report.survivors))


@pytest.mark.usefixtures("fixed_graph")
def test_a_neighbourhood_that_loses_too_many_share_holders_aborts() -> None:
    """On a sparse graph each client needs t_s of its k + 1 share holders, not t of all."""
    payloads = _payloads(30, "pooled", seed=3)
    with pytest.raises(AggregationAbortedError,
                       match=r"the self-mask seed of client 'site-\d\d' cannot be recovered "
                             r"\(2 valid shares from its 5 share holders, 3 needed\); no result"):
        # a small degree is allowed only under weaker targets: t_s = 3 of 5 holders
        _run(payloads, config=SecAggConfig(clip_norm=CLIP, neighbours=4, corrupt_fraction=0.1,
                                           dropout_fraction=0.0, sigma=8),
             drops={"unmask": 6}, seed=0)  # after the consistency check: holders vanish


def test_plain_and_secure_runs_share_one_interface() -> None:
    payloads = _payloads(6, "pooled", seed=2)
    ids = _ids(6)
    plain = run_aggregation(PlainServer(ids), InMemoryTransport(
        [PlainClient(c, p) for c, p in zip(ids, payloads, strict=True)]))
    secure, _ = _run(payloads)
    assert plain.protocol == "plain" and secure.protocol == "secure"
    assert list(plain.stages) == ["input"]
    assert list(secure.stages) == ["advertise", "reveal", "share", "mask", "consistency",
                                   "unmask"]
    _assert_exact(secure.total, plain.total)


def test_lazily_computed_statistics_are_masked_once() -> None:
    payloads = _payloads(3, "diag")
    calls: list[int] = []

    def lazy(i: int) -> Callable[[], ClientStats]:
        def make() -> ClientStats:
            calls.append(i)
            return payloads[i]
        return make

    ids = _ids(3)
    clients = [SecAggClient(c, lazy(i), meta=payloads[0].meta, allow_unauthenticated=True)
               for i, c in enumerate(ids)]
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, ids)
    report = run_aggregation(server, InMemoryTransport(clients))
    assert sorted(calls) == [0, 1, 2]
    _assert_exact(report.total, sum_stats(payloads))


# ---------------------------------------------------------------------- dropouts
@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "unmask"])
def test_dropouts_at_the_threshold_are_survived(stage: str) -> None:
    payloads = _payloads(7, "full", seed=9)
    config = SecAggConfig(clip_norm=CLIP, threshold=4)
    report, _ = _run(payloads, drops={stage: 3}, config=config, seed=1)
    dropped = [c for c, s in report.dropped.items() if s == stage]
    assert len(dropped) == 3
    if stage == "unmask":  # they sent their masked input: their data stays in the sum
        assert len(report.survivors) == 7
    else:
        assert len(report.survivors) == 4 and not set(dropped) & set(report.survivors)
    _assert_exact(report.total, _expected(payloads, report.survivors))


@pytest.mark.parametrize("stage", ["advertise", "share", "mask", "unmask"])
def test_dropouts_below_the_threshold_abort_without_a_result(stage: str) -> None:
    payloads = _payloads(7, "pooled", seed=4)
    clients, server, _, _ = secure_federation(_ids(7), list(payloads),
                                              SecAggConfig(clip_norm=CLIP, threshold=4))
    with pytest.raises(AggregationAbortedError,
                       match=r"secure aggregation aborted: only 3 of 7 clients .* below the "
                             r"threshold t=4; no result was produced"):
        run_aggregation(server, InMemoryTransport(clients, {stage: 4}))
    assert server.state == "aborted"
    with pytest.raises(AggregationAbortedError, match="the round has no result"):
        server.result()


def test_default_threshold_resists_a_third_of_colluders() -> None:
    """⌊(n + ⌊n/3⌋)/2⌋ + 1: no two survivor sets can both collect t signatures."""
    payloads = _payloads(10, "diag")
    report, server = _run(payloads, drops={"mask": 3})
    assert server.params.threshold == 7
    assert len(report.survivors) == 7
    with pytest.raises(AggregationAbortedError, match="only 6 of 10 clients"):
        _run(payloads, drops={"mask": 4})


# ---------------------------------------------------------------------- what the server sees
def test_server_view_never_holds_an_unmasked_payload() -> None:
    payloads = _payloads(5, "pooled", seed=8, dim=10)
    _report, server = _run(payloads, record=True, drops={"mask": 1})
    codec = server.params.codec
    plain_vectors = [codec.encode(p) for p in payloads]
    secrets_arrays = [a for p in payloads for a in p.arrays().values() if a is not None]
    masked = []
    for _stage, _client, msg in server.view:
        assert not isinstance(msg, PlainInput)
        for field in dataclasses.fields(msg):
            value = getattr(msg, field.name)
            assert not isinstance(value, ClientStats)
            if isinstance(value, np.ndarray):
                assert value.dtype == np.uint64
                assert not any(np.array_equal(value, v) for v in plain_vectors)
                assert not any(value.size == a.size and np.array_equal(
                    value.view(np.float64).reshape(a.shape), a) for a in secrets_arrays
                    if a.dtype == np.float64)
                masked.append(value)
    assert len(masked) == 4
    for vector in masked:  # masked words are indistinguishable from uniform ones
        bits = np.unpackbits(vector.view(np.uint8))
        assert abs(bits.mean() - 0.5) < 5 * 0.5 / np.sqrt(bits.size)  # 5 sigma
        top = np.bincount((vector >> np.uint64(56)).astype(np.int64), minlength=256)
        expected = vector.size / 256
        assert float(((top - expected) ** 2 / expected).sum()) < 400
    # the unmasked encodings, by contrast, are far from uniform
    raw_bits = np.unpackbits(plain_vectors[0].view(np.uint8))
    assert abs(raw_bits.mean() - 0.5) > 0.05


def test_server_learns_one_secret_per_client() -> None:
    payloads = _payloads(6, "diag")
    _, server = _run(payloads, record=True, drops={"mask": 1})
    unmask = [m for s, _, m in server.view if s == "unmask"]
    for msg in unmask:
        seeds = {o for o, _ in msg.seed_shares}
        keys = {o for o, _ in msg.key_shares}
        assert not seeds & keys
        assert keys <= set(server.dropped)


# ---------------------------------------------------------------------- misbehaving clients
class Tamper:
    """Wraps a transport and rewrites (or duplicates) one client's reply at one stage."""

    def __init__(self, inner: InMemoryTransport, stage: str, client: str,
                 edit: Callable[[ClientMessage], list[ClientMessage]]) -> None:
        self.inner, self.stage, self.client, self.edit = inner, stage, client, edit
        self.traffic = inner.traffic
        self.history: dict[str, ClientMessage] = {}

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        for client, msg in self.inner.exchange(stage, requests):
            if client == self.client:
                self.history[stage] = msg
            if stage == self.stage and client == self.client:
                for out in self.edit(msg):
                    yield client, out
            else:
                yield client, msg


TARGET = "site-02"


def _tamper(stage: str, edit: Callable[[ClientMessage], list[ClientMessage]]
            ) -> Callable[[Any], Any]:
    return lambda inner: Tamper(inner, stage, TARGET, edit)


def _flip_share(msg: ClientMessage) -> list[ClientMessage]:
    assert isinstance(msg, ShareKeys)
    box = msg.shares[0]
    bad = bytearray(box.sealed)
    bad[-5] ^= 0x40
    shares = (dataclasses.replace(box, sealed=bytes(bad)), *msg.shares[1:])
    return [dataclasses.replace(msg, shares=shares)]


def _wrong_key_share(msg: ClientMessage) -> list[ClientMessage]:
    assert isinstance(msg, ShareKeys)
    box = msg.shares[0]
    sealed = cr.aead_encrypt(cr.random_seed(), bytes(132),
                             share_aad(msg.round_id, box.sender, box.recipient))
    return [dataclasses.replace(msg, shares=(dataclasses.replace(box, sealed=sealed), *msg.shares[1:]))]


def _short_vector(msg: ClientMessage) -> list[ClientMessage]:
    assert isinstance(msg, MaskedInput)
    return [dataclasses.replace(msg, vector=msg.vector[:-1])]


def _float_vector(msg: ClientMessage) -> list[ClientMessage]:
    assert isinstance(msg, MaskedInput)
    return [dataclasses.replace(msg, vector=msg.vector.view(np.float64))]


def _other_round(msg: ClientMessage) -> list[ClientMessage]:
    return [dataclasses.replace(msg, round_id=b"an old round id!")]


def _wrong_stage(msg: ClientMessage) -> list[ClientMessage]:
    return [dataclasses.replace(msg, stage="unmask")]


def _spoofed(msg: ClientMessage) -> list[ClientMessage]:
    return [dataclasses.replace(msg, sender="site-00")]


def _twice(msg: ClientMessage) -> list[ClientMessage]:
    return [msg, msg]


def _garbage(msg: ClientMessage) -> list[ClientMessage]:
    return [{"vector": [1, 2, 3]}]  # type: ignore[list-item]


def _skip_a_neighbour(msg: ClientMessage) -> list[ClientMessage]:
    assert isinstance(msg, ShareKeys)
    return [dataclasses.replace(msg, shares=msg.shares[1:])]


def _foreign_meta(msg: ClientMessage) -> list[ClientMessage]:
    import json
    meta = json.loads(msg.meta)  # type: ignore[attr-defined]
    meta["classes"] = ["a", "b", "c"]
    return [dataclasses.replace(msg, meta=json.dumps(meta, sort_keys=True))]


def _same_keys(msg: ClientMessage) -> list[ClientMessage]:
    return [dataclasses.replace(msg, mask_public=msg.enc_public)]  # type: ignore[attr-defined]


def _bad_key(msg: ClientMessage) -> list[ClientMessage]:
    return [dataclasses.replace(msg, enc_public=b"\x00" * 31)]


@pytest.mark.parametrize(
    ("stage", "edit", "reason"),
    [
        ("share", _flip_share, r"share: sent a share whose signature does not verify against "
                               r"the roster"),
        ("share", _wrong_key_share, r"share: sent a share whose signature does not verify"),
        ("share", _skip_a_neighbour, r"share: sent shares to a set of clients other than its "
                                     r"neighbours on the graph \(inconsistent with the roster\)"),
        ("mask", _short_vector, r"mask: sent a masked vector of dtype uint64 and shape "
                                r"\(\d+,\); expected uint64 of length \d+"),
        ("mask", _float_vector, r"sent a masked vector of dtype float64"),
        ("mask", _other_round, r"mask: sent a message from another round \(replayed\)"),
        ("share", _other_round, r"share: sent a message from another round \(replayed\)"),
        ("mask", _wrong_stage, r"mask: sent a MaskedInput for stage 'unmask' during stage "
                               r"'mask' \(replayed or reordered\)"),
        ("advertise", _spoofed, r"advertise: sent a message claiming to come from 'site-00'"),
        ("mask", _twice, r"mask: sent two replies in stage 'mask'"),
        ("mask", _garbage, r"mask: sent a dict, not a protocol message \(malformed\)"),
        ("advertise", _foreign_meta, r"advertise: holds statistics that differ from the "
                                     r"federation's in class names"),
        ("advertise", _same_keys, "advertised the same key for encryption and masking"),
        ("advertise", _bad_key, r"advertised a malformed enc_public \(not 32 bytes\)"),
    ],
)
def test_a_misbehaving_client_is_excluded_with_its_reason(stage: str, edit: Any,
                                                          reason: str) -> None:
    payloads = _payloads(6, "pooled", seed=6)
    report, _ = _run(payloads, wrap=_tamper(stage, edit))
    assert TARGET in report.excluded
    assert __import__("re").search(reason, report.excluded[TARGET]), report.excluded[TARGET]
    assert TARGET not in report.survivors
    _assert_exact(report.total, _expected(payloads, report.survivors))


def test_a_replayed_earlier_message_excludes_its_sender() -> None:
    payloads = _payloads(5, "diag")

    def wrap(inner: InMemoryTransport) -> Tamper:
        tamper = Tamper(inner, "mask", TARGET, lambda m: [tamper.history["share"]])
        return tamper

    report, _ = _run(payloads, wrap=wrap)
    assert report.excluded[TARGET] == (
        "mask: sent a ShareKeys for stage 'share' during stage 'mask' (replayed or reordered)")
    _assert_exact(report.total, _expected(payloads, report.survivors))


def test_exclusions_that_leave_too_few_clients_abort() -> None:
    payloads = _payloads(3, "diag")
    with pytest.raises(AggregationAbortedError, match=r"only 2 of 3 clients sent valid masked "
                       r"inputs, below the threshold t=3.*excluded: site-02"):
        # t = n tolerates no dropout: allowed only when the config expects none
        _run(payloads, config=SecAggConfig(clip_norm=CLIP, threshold=3, dropout_fraction=0.0),
             wrap=_tamper("mask", _short_vector))


def test_a_bad_unmask_share_is_skipped_and_the_sum_stays_exact() -> None:
    payloads = _payloads(6, "diag")

    def corrupt(msg: ClientMessage) -> list[ClientMessage]:
        seeds = tuple((o, bytes(66)) for o, _ in msg.seed_shares)  # type: ignore[attr-defined]
        return [dataclasses.replace(msg, seed_shares=seeds)]

    report, _ = _run(payloads, wrap=_tamper("unmask", corrupt))
    assert len(report.survivors) == 6
    _assert_exact(report.total, sum_stats(payloads))


# ---------------------------------------------------------------------- client refusals
def _client() -> tuple[SecAggClient, SecAggServer]:
    payloads = _payloads(3, "diag")
    clients, server, _, _ = secure_federation(_ids(3), list(payloads), SecAggConfig(clip_norm=CLIP))
    return clients[0], server  # type: ignore[return-value]


def test_client_refuses_requests_out_of_order() -> None:
    client, server = _client()
    unmask = UnmaskRequest(PROTOCOL_VERSION, server.round_id, "unmask", survivors=(), dropped=(), signatures=())
    with pytest.raises(ProtocolError, match=r"client 'site-00' refused a UnmaskRequest in state "
                       r"'ready' \(out of order or replayed\)"):
        client.handle(unmask)
    assert client.state == "failed"


def test_client_refuses_to_unmask_a_sum_below_the_threshold_or_reveal_both_secrets() -> None:
    payloads = _payloads(3, "diag")
    ids = _ids(3)
    clients, server, _, _ = secure_federation(ids, list(payloads),
                                              SecAggConfig(clip_norm=CLIP, threshold=2))
    transport = InMemoryTransport(clients)  # type: ignore[arg-type]
    for stage in ("advertise", "reveal", "share", "mask"):
        server.receive(transport.exchange(stage, server.requests()))  # type: ignore[arg-type,attr-defined]
    rid = server.round_id  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match=r"refused to sign a sum over 1 clients, below the "
                       r"threshold 2"):
        clients[0].handle(ConsistencyRequest(PROTOCOL_VERSION, rid, "consistency", survivors=(ids[0],),  # type: ignore[attr-defined]
                                             dropped=tuple(ids[1:])))
    with pytest.raises(ProtocolError, match=r"survivor and dropped sets that do not split the "
                       r"sharers exactly \(revealing both secrets"):
        clients[1].handle(ConsistencyRequest(PROTOCOL_VERSION, rid, "consistency", survivors=tuple(ids),  # type: ignore[attr-defined]
                                             dropped=(ids[2],)))


def test_client_refuses_a_request_from_another_protocol_version() -> None:
    client, server = _client()
    bad = AdvertiseRequest(1, server.round_id, "advertise", params=(), meta="",
                           roster_fingerprint=b"")
    with pytest.raises(ProtocolError, match="refused a request of an unknown type or protocol"):
        client.handle(bad)


# ---------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("kwargs", "n", "match"),
    [
        ({"clip_norm": 0.0}, 3, r"secure aggregation needs a clipping bound R > 0 \(--clip R\)"),
        ({"clip_norm": 1.0, "threshold": 1}, 3, r"the threshold must be at least 2"),
        ({"clip_norm": 1.0, "threshold": 5}, 3, r"threshold t=5 is larger than the number of "
                                                r"clients \(3\); give --threshold between 2 and 3"),
        ({"clip_norm": 1.0}, 1, r"secure aggregation needs at least 2 clients"),
        ({"clip_norm": 1.0, "neighbours": 0}, 3, r"neighbours must be at least 1; got 0"),
    ],
)
def test_config_errors(kwargs: dict[str, Any], n: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SecAggConfig(**kwargs).for_clients(n)


def test_server_needs_metadata_with_the_rounds_clipping_bound() -> None:
    payloads = _payloads(2, "diag")
    with pytest.raises(ConfigError, match=r"must carry the round's clipping bound R=3"):
        SecAggServer(SecAggConfig(clip_norm=3.0), payloads[0].meta, _ids(2))


@pytest.mark.parametrize(
    ("specs", "expected"),
    [(["mask=2"], {"mask": 2}), (["unmask=1", "advertise=3"], {"unmask": 1, "advertise": 3}),
     (["reveal=1", "share=2"], {"reveal": 1, "share": 2}), ([], {})],
)
def test_parse_drops(specs: list[str], expected: dict[str, int]) -> None:
    assert parse_drops(specs) == expected


@pytest.mark.parametrize(
    ("spec", "match"),
    [("mask", r"--drop must look like STAGE=COUNT with STAGE one of advertise, reveal, share, "
              r"mask, consistency, unmask; got 'mask'"),
     ("upload=2", r"--drop must look like STAGE=COUNT"),
     ("mask=-1", r"--drop mask= needs a non-negative integer count; got '-1'"),
     ("mask=two", r"--drop mask= needs a non-negative integer count; got 'two'")],
)
def test_parse_drops_errors(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_drops([spec])


def test_parse_drops_lists_the_reveal_stage_in_protocol_order() -> None:
    """The reveal stage sits between advertise and share, in the error's list too."""
    with pytest.raises(ConfigError) as info:
        parse_drops(["nonce=1"])
    listed = str(info.value).split("STAGE one of ", 1)[1].split(";", 1)[0].split(", ")
    assert listed == ["advertise", "reveal", "share", "mask", "consistency", "unmask"]
    assert parse_drops(["reveal=0"]) == {"reveal": 0}


# ---------------------------------------------------------------------- plain protocol
def test_plain_protocol_excludes_incompatible_clients_and_aborts_when_none_remain() -> None:
    good = _payloads(3, "pooled")
    other = _payloads(1, "diag")[0]
    ids = _ids(4)
    clients = [PlainClient(c, p) for c, p in zip(ids, [*good, other], strict=True)]
    report = run_aggregation(PlainServer(ids, good[0].meta), InMemoryTransport(clients))
    assert report.excluded == {"site-03": "input: holds statistics that differ from the "
                                          "federation's in mode ('pooled' vs 'diag')"}
    _assert_exact(report.total, sum_stats(good))
    with pytest.raises(AggregationAbortedError, match=r"aggregation aborted: 0 of 2 clients sent "
                       r"valid statistics, fewer than the 1 required"):
        run_aggregation(PlainServer(ids[:2]), InMemoryTransport(
            [PlainClient(c, good[0]) for c in ids[:2]], {"input": 2}))


def test_report_is_json_ready() -> None:
    import json
    report, _ = _run(_payloads(4, "diag"), drops={"unmask": 1})
    d = report.to_dict()
    json.dumps(d)
    assert d["survivors"] == 4 and d["params"]["threshold"] == 3
    for stage in ("advertise", "share", "mask", "unmask"):
        s = d["stages"][stage]
        assert s["client_sent_bytes_mean"] > 0 and s["server_sent_bytes"] > 0
    assert d["stages"]["mask"]["client_sent_bytes_max"] >= 8 * (3 + 1 + 2 * 2 * 3 * 6)


def test_a_client_beyond_the_public_bounds_drops_out_with_its_reason() -> None:
    payloads = _payloads(4, "diag")
    big = compute_stats(*gaussian_mixture(78, 3, 6, n=120), 3, "diag", clip_norm=CLIP)
    report, _ = _run([*payloads, big], config=SecAggConfig(clip_norm=CLIP, max_samples=100))
    assert report.dropped == {"site-04": "mask"}
    assert report.refused["site-04"].startswith(
        "client 'site-04' cannot take part: this client holds more samples than the public "
        "maximum M=100 per client")
    assert "120" not in report.refused["site-04"]  # the server never learns the count
    _assert_exact(report.total, sum_stats(payloads))


def test_a_client_clipped_with_another_bound_refuses_the_round() -> None:
    payloads = _payloads(4, "diag")
    other = compute_stats(*gaussian_mixture(77, 3, 6, n=60), 3, "diag", clip_norm=CLIP / 2)
    ids = _ids(5)
    clients = [SecAggClient(c, p, allow_unauthenticated=True)
               for c, p in zip(ids, [*payloads, other], strict=True)]
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, ids)
    report = run_aggregation(server, InMemoryTransport(clients))
    assert report.dropped == {"site-04": "advertise"}
    assert report.refused["site-04"] == (
        "client 'site-04' refused a round with clipping bound R=6: its statistics were computed "
        "with R=3")
    _assert_exact(report.total, sum_stats(payloads))


def test_the_secure_package_never_imports_flower() -> None:
    import ghofl.secure

    root = Path(ghofl.secure.__file__).parent
    sources = sorted(root.glob("*.py"))
    assert len(sources) >= 10
    for source in sources:
        text = source.read_text()
        assert "import flwr" not in text and "from flwr" not in text, source


class Restarting:
    """A transport whose clients restart from their saved state before every request (as a
    Flower deployment may start a fresh process per message)."""

    def __init__(self, clients: list[SecAggClient], stats: dict[str, ClientStats]) -> None:
        self.saved = {c.client_id: c.to_state() for c in clients}
        self.stats = stats
        self.traffic: dict[str, Any] = {}

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        for client_id, request in requests.items():
            client = SecAggClient.from_state(dict(self.saved[client_id]), self.stats[client_id],
                                             allow_unauthenticated=True)
            reply = client.handle(request)
            self.saved[client_id] = client.to_state()
            yield client_id, reply


def test_a_client_resumes_from_its_saved_state_between_stages() -> None:
    payloads = _payloads(6, "full", seed=12)
    ids = _ids(6)
    clients = [SecAggClient(c, p, allow_unauthenticated=True)
               for c, p in zip(ids, payloads, strict=True)]
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, ids)
    transport = Restarting(clients, dict(zip(ids, payloads, strict=True)))
    report = run_aggregation(server, transport)
    _assert_exact(report.total, sum_stats(payloads))
    assert {s["state"] for s in transport.saved.values()} == {"done"}


def test_a_malformed_saved_state_is_refused() -> None:
    payloads = _payloads(2, "diag")
    state = SecAggClient("a", payloads[0], allow_unauthenticated=True).to_state()
    with pytest.raises(ProtocolError, match=r"the saved client state is malformed or from "
                       r"another version .*cannot resume this round"):
        SecAggClient.from_state({k: v for k, v in state.items() if k != "seed"}, payloads[0],
                                allow_unauthenticated=True)
    with pytest.raises(ProtocolError, match="from another version"):
        SecAggClient.from_state({**state, "version": 99}, payloads[0],
                                allow_unauthenticated=True)


class Reloading:
    """A transport that saves each authenticated client's state before and after every
    request, checks that :meth:`SecAggClient.from_state` rebuilds exactly that state, and goes
    on with the rebuilt client (every state of the round is crossed through a save)."""

    def __init__(self, clients: list[SecAggClient], stats: dict[str, ClientStats],
                 identities: dict[str, Any], roster: Any) -> None:
        self.live = {c.client_id: c for c in clients}
        self.stats, self.identities, self.roster = stats, identities, roster
        self.states: dict[str, list[str]] = {c: [] for c in self.live}
        self.traffic: dict[str, Any] = {}

    def reload(self, client_id: str) -> SecAggClient:
        state = self.live[client_id].to_state()
        back = SecAggClient.from_state(dict(state), self.stats[client_id],
                                       identity=self.identities[client_id], roster=self.roster,
                                       ledger=None)
        assert back.to_state() == state, f"{client_id} at {state['state']!r}"
        self.states[client_id].append(str(state["state"]))
        self.live[client_id] = back
        return back

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        for client_id, request in requests.items():
            reply = self.reload(client_id).handle(request)
            self.reload(client_id)
            yield client_id, reply


def test_state_round_trips_at_every_state_across_the_reveal_stage() -> None:
    payloads = _payloads(6, "pooled", seed=14)
    ids = _ids(6)
    clients, server, identities, roster = secure_federation(
        ids, list(payloads), SecAggConfig(clip_norm=CLIP), round_id=ROUND)
    transport = Reloading(clients, dict(zip(ids, payloads, strict=True)), identities, roster)
    report = run_aggregation(server, transport)
    _assert_exact(report.total, sum_stats(payloads))
    path = ["ready", "advertised", "advertised", "revealed", "revealed", "shared", "shared",
            "masked", "masked", "signed", "signed", "done"]
    assert all(states == path for states in transport.states.values()), transport.states


def test_a_client_restored_after_the_reveal_stage_still_checks_the_nonces() -> None:
    """What the reveal stage fixed (the relayed roster with its nonce commitments, the
    client's own nonce) survives a save: a restored client refuses a nonce the server swapped
    after the roster was fixed, and takes the true ones."""
    payloads = _payloads(3, "diag")
    ids = _ids(3)
    clients, server, identities, roster = secure_federation(
        ids, list(payloads), SecAggConfig(clip_norm=CLIP), round_id=ROUND)
    transport = InMemoryTransport(clients)  # type: ignore[arg-type]
    for stage in ("advertise", "reveal"):
        server.receive(transport.exchange(stage, server.requests()))  # type: ignore[arg-type,attr-defined]
    share = server.requests()[ids[0]]  # type: ignore[attr-defined]
    saved = clients[0].to_state()  # type: ignore[attr-defined]
    assert saved["state"] == "revealed" and saved["nonce"] and not saved["session"]

    def restored() -> SecAggClient:
        return SecAggClient.from_state(dict(saved), payloads[0], identity=identities[ids[0]],
                                       roster=roster, ledger=None)

    swapped = dataclasses.replace(share, nonces=tuple(  # type: ignore[arg-type]
        (c, cr.random_seed() if c == ids[1] else n) for c, n in share.nonces))  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match=rf"the nonce relayed for '{ids[1]}': it does not "
                       r"match the commitment it advertised"):
        restored().handle(swapped)
    client = restored()
    reply = client.handle(share)
    assert isinstance(reply, ShareKeys) and client.state == "shared"
    assert client.to_state()["session"] == server.session  # type: ignore[attr-defined]


@pytest.mark.parametrize("length", [0, 8, 15])
def test_a_client_refuses_a_round_id_shorter_than_16_bytes(length: int) -> None:
    payloads = _payloads(3, "diag")
    ids = _ids(3)
    clients, server, _, _ = secure_federation(ids, list(payloads), SecAggConfig(clip_norm=CLIP),
                                              round_id=ROUND[:length], ledger="default")
    transport = InMemoryTransport(clients)  # type: ignore[arg-type]
    with pytest.raises(AggregationAbortedError, match=r"only 0 of 3 clients advertised valid "
                       r"keys"):
        run_aggregation(server, transport)  # type: ignore[arg-type]
    refused = transport.traffic["advertise"].refused
    assert set(refused) == set(ids)
    for cid in ids:
        assert refused[cid] == (f"client {cid!r} refused a round id shorter than 16 bytes "
                                "(round ids must be unique)")
    # refused before anything was recorded: the ledgers hold no entry for the short id
    assert all(c.state == "failed" and c.ledger.entries() == [] for c in clients)  # type: ignore[attr-defined]


def test_a_round_id_of_16_bytes_is_accepted_and_entered_in_the_ledger() -> None:
    payloads = _payloads(3, "diag")
    assert len(ROUND) == 16
    clients, server, _, _ = secure_federation(_ids(3), list(payloads),
                                              SecAggConfig(clip_norm=CLIP), round_id=ROUND,
                                              ledger="default")
    report = run_aggregation(server, InMemoryTransport(clients))  # type: ignore[arg-type]
    _assert_exact(report.total, sum_stats(payloads))
    for c in clients:
        assert [e.round_id for e in c.ledger.entries()] == [ROUND.hex()]  # type: ignore[attr-defined]


def test_a_dropout_at_the_reveal_stage_aborts_the_round() -> None:
    """The graph's seed needs every relayed client's nonce: one missing nonce aborts (nothing
    was revealed yet, the round restarts under a new id), even far above the threshold."""
    payloads = _payloads(7, "diag")
    clients, server, _, _ = secure_federation(_ids(7), list(payloads),
                                              SecAggConfig(clip_norm=CLIP, threshold=4))
    with pytest.raises(AggregationAbortedError, match=r"aborted at the reveal stage: 1 of the 7 "
                       r"relayed clients revealed no valid graph nonce"):
        run_aggregation(server, InMemoryTransport(clients, {"reveal": 1}))  # type: ignore[arg-type]
    assert server.state == "aborted"  # type: ignore[attr-defined]


def test_a_client_revealing_another_nonce_is_excluded_and_the_round_aborts() -> None:
    """A nonce other than the committed one would let its sender choose the graph after
    seeing the others': the sender is excluded and, its nonce missing, the round aborts."""
    payloads = _payloads(6, "diag")

    def other_nonce(msg: ClientMessage) -> list[ClientMessage]:
        return [dataclasses.replace(msg, nonce=cr.random_seed())]

    with pytest.raises(AggregationAbortedError, match=r"aborted at the reveal stage: 1 of the 6 "
                       r"relayed clients revealed no valid graph nonce \(site-02\)"):
        _run(payloads, wrap=_tamper("reveal", other_nonce))
