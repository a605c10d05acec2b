"""The ways to one client's statistics that a review of protocol version 2 found, each played
around the honest halves, in process (issue: secure aggregation, closed for good).

1. Forced complaints: a server or a relay withholds share boxes so that every client complains;
   a complaint used to carry the client's share-encryption private key, which opened every box.
2. A reused round id: differencing two rounds, and consistency signatures replayed from
   rehearsal runs under the same id.
3. A shrunk relayed roster and a graph the server could re-draw by choosing whom to relay.
4. Unauthenticated by default.

In every case the adversary learns nothing beyond an agreed sum, or the honest clients refuse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from ghofl.errors import AggregationAbortedError, ProtocolError
from ghofl.secure import InMemoryTransport, SecAggClient, SecAggConfig, SecAggServer
from ghofl.secure import primitives as cr
from ghofl.secure._common import pair_key, share_aad
from ghofl.secure.ledger import RoundLedger
from ghofl.secure.messages import (
    ClientMessage,
    MaskedInput,
    MaskRequest,
    RevealRequest,
    ServerMessage,
    ShareKeys,
    ShareRequest,
    Stage,
    UnmaskRequest,
)
from ghofl.secure.policy import ClientPolicy
from ghofl.secure.protocol import run_aggregation
from ghofl.stats.client_stats import ClientStats, sum_stats
from tests.helpers import pooled_payloads, secure_federation

CLIP = 6.0


def _payloads(n: int, seed: int = 0) -> list[ClientStats]:
    return pooled_payloads(n, seed=seed, dim=4, rows=20, clip=CLIP)  # type: ignore[return-value]


def _ids(n: int) -> list[str]:
    return [f"site-{i:03d}" for i in range(n)]


class Tap:
    """A relay between the server and the clients: sees everything, may rewrite requests."""

    def __init__(self, inner: InMemoryTransport, rewrite: Any = None) -> None:
        self.inner, self.rewrite = inner, rewrite
        self.traffic = inner.traffic
        self.requests: list[tuple[str, str, ServerMessage]] = []
        self.replies: list[tuple[str, str, ClientMessage]] = []

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        sent = {c: (self.rewrite(c, r) if self.rewrite else r) for c, r in requests.items()}
        self.requests += [(stage, c, r) for c, r in sent.items()]
        for client, reply in self.inner.exchange(stage, sent):
            self.replies.append((stage, client, reply))
            yield client, reply


def _byte_strings(value: Any) -> Iterator[bytes]:
    """Every bytes value inside a message, however deeply nested."""
    if isinstance(value, bytes):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _byte_strings(v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _byte_strings(getattr(value, f.name))


def _boxes_opened(tap: Tap, server: SecAggServer) -> set[tuple[str, str]]:
    """The share boxes an adversary holding the whole traffic can open with any 32 bytes a
    client sent after the boxes (the stages where a complaint travels): as a pair key, or as
    a share-encryption private key (version 2's complaint)."""
    boxes = [b for _, _, m in tap.replies if isinstance(m, ShareKeys) for b in m.shares]
    enc = {c: e.enc_public for c, e in server._roster.items()}
    late = ("mask", "consistency", "unmask")
    candidates = {b for stage, _, m in tap.replies if stage in late
                  for b in _byte_strings(m) if len(b) == 32}
    opened = set()
    for box in boxes:
        aad = share_aad(server.session, box.sender, box.recipient)
        for secret in candidates:
            keys = [secret]
            with contextlib.suppress(ValueError):
                keys.append(pair_key(cr.agree(secret, enc[box.sender]), server.session,
                                     box.sender, box.recipient))
            if any(cr.aead_decrypt(k, box.sealed, aad) is not None for k in keys):
                opened.add((box.sender, box.recipient))
    return opened


def _withhold_one_box(client: str, req: ServerMessage) -> ServerMessage:
    if isinstance(req, MaskRequest) and req.shares:
        return dataclasses.replace(req, shares=req.shares[1:])
    return req


# ---------------------------------------------------------------------- 1. forced complaints
@pytest.mark.parametrize("n", [6, 40])
def test_withheld_boxes_force_no_complaint_and_no_masked_input(n: int) -> None:
    """The relay withholds one share box per client. Honest clients reveal no key at all and
    refuse to send their masked inputs; the round ends with nothing opened."""
    payloads = _payloads(n)
    clients, server, _, _ = secure_federation(_ids(n), list(payloads), SecAggConfig(clip_norm=CLIP))
    tap = Tap(InMemoryTransport(clients), _withhold_one_box)
    with pytest.raises(AggregationAbortedError, match=r"only 0 of \d+ clients sent valid masked"):
        run_aggregation(server, tap)
    refused = tap.traffic["mask"].refused
    assert len(refused) == n
    assert all("1 share boxes of its neighbours are missing or unverifiable" in why
               and "more than the 0 its policy tolerates" in why for why in refused.values())
    assert not [m for _, _, m in tap.replies if isinstance(m, MaskedInput)]
    assert _boxes_opened(tap, server) == set()


def test_a_tolerated_missing_box_sends_the_masked_input_with_no_secret() -> None:
    """A client that tolerates a missing box sends its masked input and complains about
    nothing: no key travels, no box opens, and the honest server gets the exact sum."""
    n = 6
    payloads = _payloads(n)
    policy = ClientPolicy(max_missing_shares=1)
    clients, server, _, _ = secure_federation(_ids(n), list(payloads),
                                              SecAggConfig(clip_norm=CLIP), policy=policy)

    def only_first(client: str, req: ServerMessage) -> ServerMessage:
        return _withhold_one_box(client, req) if client == _ids(n)[0] else req

    tap = Tap(InMemoryTransport(clients), only_first)
    report = run_aggregation(server, tap)
    masked = [m for _, _, m in tap.replies if isinstance(m, MaskedInput)]
    assert len(masked) == n and all(not m.complaints and not m.complaint_keys for m in masked)
    assert _boxes_opened(tap, server) == set()
    expected = sum_stats(payloads)
    assert np.array_equal(report.total.counts, expected.counts)
    assert report.total.allclose(expected, rtol=1e-12)


def test_a_true_complaint_opens_only_the_garbage_box_it_accuses() -> None:
    """A corrupt client signs a garbage box for one neighbour. The neighbour proves it with
    the pair key: the server excludes the sender, and that key opens no other box."""
    n = 8
    payloads = _payloads(n)
    clients, server, identities, _ = secure_federation(_ids(n), list(payloads),
                                                       SecAggConfig(clip_norm=CLIP))
    bad = _ids(n)[2]

    class Corrupt(InMemoryTransport):
        def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                     ) -> Iterator[tuple[str, ClientMessage]]:
            for client, msg in super().exchange(stage, requests):
                if stage == "share" and client == bad:
                    assert isinstance(msg, ShareKeys)
                    box = msg.shares[0]
                    key = pair_key(cr.agree(clients[2]._enc.private,  # type: ignore[union-attr]
                                            server._roster[box.recipient].enc_public),
                                   server.session, bad, box.recipient)
                    junk = cr.aead_encrypt(cr.random_seed(), b"\0" * 132,
                                           share_aad(server.session, bad, box.recipient))
                    from ghofl.secure._common import key_commitment, share_transcript

                    commit = key_commitment(server.session, bad, box.recipient, key)
                    forged = dataclasses.replace(box, sealed=junk, key_commitment=commit,
                                                 signature=identities[bad].sign(share_transcript(
                                                     server.session, bad, box.recipient, junk,
                                                     commit)))
                    msg = dataclasses.replace(msg, shares=(forged, *msg.shares[1:]))
                yield client, msg

    tap = Tap(Corrupt(clients))
    report = run_aggregation(server, tap)
    assert bad in report.excluded and "verified" in report.excluded[bad]
    masked = [m for _, _, m in tap.replies if isinstance(m, MaskedInput) and m.complaints]
    assert len(masked) == 1 and [c for c, _ in masked[0].complaint_keys] == [bad]
    assert _boxes_opened(tap, server) == set()  # the accused box is garbage; no other opens
    expected = sum_stats(p for c, p in zip(_ids(n), payloads, strict=True) if c != bad)
    assert report.total.allclose(expected, rtol=1e-12)


# ---------------------------------------------------------------------- 2. round ids
def test_a_reused_round_id_is_refused_whatever_the_data_and_the_ledger(tmp_path: Any) -> None:
    """Round 1 completes; the server reruns the same id without the victim to difference the
    totals: every client refuses at the first stage, even one that allows repeated rounds."""
    n = 5
    payloads = _payloads(n)
    rid = b"the same round!!"
    ledgers = {c: RoundLedger(tmp_path / f"{c}.json", allow_repeat=(i == 0))
               for i, c in enumerate(_ids(n))}

    def federation(ids: list[str]) -> tuple[list[Any], SecAggServer]:
        clients, server, _, _ = secure_federation(
            ids, [payloads[_ids(n).index(c)] for c in ids], SecAggConfig(clip_norm=CLIP),
            round_id=rid)
        for c in clients:
            c.ledger = ledgers[c.client_id]
        return clients, server

    clients, server = federation(_ids(n))
    run_aggregation(server, InMemoryTransport(clients))
    clients, server = federation(_ids(n)[1:])
    transport = InMemoryTransport(clients)
    with pytest.raises(AggregationAbortedError, match="only 0 of 4 clients advertised"):
        run_aggregation(server, transport)
    assert all("a round id already used" in why and "new id" in why
               for why in transport.traffic["advertise"].refused.values())


def test_an_aborted_round_id_is_never_retried() -> None:
    """An abort before anything was revealed may be retried, but only under a new id."""
    n = 4
    payloads = _payloads(n)
    clients, server, _, _ = secure_federation(_ids(n), list(payloads),
                                              SecAggConfig(clip_norm=CLIP), ledger="default",
                                              round_id=b"rehearsal round!")
    with pytest.raises(AggregationAbortedError):
        run_aggregation(server, InMemoryTransport(clients, {"reveal": 1}))
    for c in clients:
        c.state = "ready"
    again = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, _ids(n),
                         roster=clients[0].roster, round_id=b"rehearsal round!")
    transport = InMemoryTransport(clients)
    with pytest.raises(AggregationAbortedError, match="advertised valid keys"):
        run_aggregation(again, transport)
    assert len(transport.traffic["advertise"].refused) == n
    fresh = [SecAggClient(c.client_id, p, identity=c.identity, roster=c.roster,
                          policy=c.policy) for c, p in zip(clients, payloads, strict=True)]
    new = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, _ids(n),
                       roster=clients[0].roster)
    assert run_aggregation(new, InMemoryTransport(fresh)).survivors == _ids(n)


def _to_consistency(n: int, rid: bytes) -> tuple[list[Any], SecAggServer, InMemoryTransport]:
    payloads = _payloads(n)
    clients, server, _, _ = secure_federation(_ids(n), list(payloads),
                                              SecAggConfig(clip_norm=CLIP), round_id=rid)
    transport = InMemoryTransport(clients)
    for stage in ("advertise", "reveal", "share", "mask", "consistency"):
        server.receive(transport.exchange(stage, server.requests()))
    return clients, server, transport


def test_signatures_from_a_rehearsal_under_the_same_id_never_verify() -> None:
    """Two runs under one round id (clients without a ledger, the worst case): the server
    replays the consistency signatures of the first in the second. They are bound to the
    first run's transcript, so every client of the second refuses to reveal a share."""
    rid = b"replayed round!!"
    _, first, _ = _to_consistency(5, rid)
    clients, second, _ = _to_consistency(5, rid)
    assert first.session != second.session
    req = second.requests()[_ids(5)[0]]
    assert isinstance(req, UnmaskRequest)
    replayed = dataclasses.replace(req, signatures=tuple(sorted(first._signers.items())))
    for c in clients:
        with pytest.raises(ProtocolError, match=r"to unmask: only 0 survivors signed the "
                                                r"survivor set it was shown"):
            c.handle(replayed)


# ---------------------------------------------------------------------- 3. relayed roster, graph
def test_a_shrunk_relayed_roster_is_refused_by_every_client() -> None:
    """n = 30, δ = 0.1: the server relays only t advertisers (fewer than (1 − δ)·n), to make
    its colluders a larger share of the graph. Every honest client refuses to reveal its
    nonce. (At γ = δ = 1/3 the default threshold already exceeds (1 − δ)·n.)"""
    n = 30
    config = SecAggConfig(clip_norm=CLIP, dropout_fraction=0.1)
    clients, server, _, _ = secure_federation(_ids(n), _payloads(n), config)
    t = server.params.threshold
    least = clients[0].policy.least_relayed(n)
    assert t < least == 27

    def shrink(client: str, req: ServerMessage) -> ServerMessage:
        if isinstance(req, RevealRequest):
            return dataclasses.replace(req, roster=req.roster[:t])
        return req

    tap = Tap(InMemoryTransport(clients), shrink)
    with pytest.raises(AggregationAbortedError, match="at the reveal stage"):
        run_aggregation(server, tap)
    refused = tap.traffic["reveal"].refused
    assert len(refused) == n  # the listed refuse its size, the others their absence
    listed = _ids(n)[:t]
    assert all(f"a relayed roster of {t} of {n} clients; this client accepts at least {least}"
               in refused[c] for c in listed)


def test_the_graph_is_seeded_by_every_nonce_and_no_one_can_choose_it() -> None:
    """The server grinds: it substitutes a nonce, or drops a client after seeing the nonces.
    Clients refuse both; and the same relayed set gives a fresh graph in every run."""
    n = 8
    clients, server, _, _ = secure_federation(_ids(n), _payloads(n), SecAggConfig(clip_norm=CLIP))
    transport = InMemoryTransport(clients)
    for stage in ("advertise", "reveal"):
        server.receive(transport.exchange(stage, server.requests()))
    req = server.requests()[_ids(n)[0]]
    assert isinstance(req, ShareRequest)
    ground = dataclasses.replace(req, nonces=((req.nonces[0][0], b"\1" * 32), *req.nonces[1:]))
    with pytest.raises(ProtocolError, match="does not match the commitment it advertised"):
        clients[1].handle(ground)
    fewer = dataclasses.replace(req, nonces=req.nonces[1:])
    with pytest.raises(ProtocolError, match="other than the relayed roster"):
        clients[2].handle(fewer)
    orders = set()
    for _ in range(3):
        weak = SecAggConfig(clip_norm=CLIP, neighbours=2, corrupt_fraction=0.0,
                            dropout_fraction=0.0, sigma=1, eta=1)
        cl, sv, _, _ = secure_federation(_ids(n), _payloads(n), weak)
        tr = InMemoryTransport(cl)
        for stage in ("advertise", "reveal"):
            sv.receive(tr.exchange(stage, sv.requests()))
        assert sv._topology is not None
        orders.add(tuple(sorted(sv._topology.neighbours(_ids(n)[0]))))
    assert len(orders) > 1


# ---------------------------------------------------------------------- 4. defaults
def test_a_client_without_a_roster_refuses_unless_told_otherwise() -> None:
    stats = _payloads(1)[0]
    with pytest.raises(ProtocolError, match=r"has no roster: .* pass allow_unauthenticated=True"):
        SecAggClient("site-000", stats)
    client = SecAggClient("site-000", stats, allow_unauthenticated=True, ledger=None)
    assert client.policy.allow_unauthenticated


def test_the_default_client_keeps_a_ledger_in_its_state_directory(tmp_path: Any,
                                                                  monkeypatch: Any) -> None:
    monkeypatch.setenv("GHOFL_STATE_DIR", str(tmp_path))
    n = 4
    payloads = _payloads(n)
    clients, server, _, _ = secure_federation(_ids(n), list(payloads),
                                              SecAggConfig(clip_norm=CLIP), ledger="default")
    run_aggregation(server, InMemoryTransport(clients))
    files = sorted((tmp_path / "ledgers").glob("*.json"))
    assert len(files) == n
    entries = RoundLedger(files[0]).entries()
    assert [e.stage for e in entries] == ["masked"]
    assert entries[0].round_id == server.round_id.hex()


def test_unauthenticated_defaults_no_longer_allow_key_substitution() -> None:
    """v2's default-configuration attack: a relay substitutes a victim's keys in a round of
    clients built with no roster. v3's default client refuses to exist without a roster (the
    same attack against clients that opt in explicitly still succeeds: documented)."""
    stats = _payloads(3)
    for i, s in enumerate(stats):
        with pytest.raises(ProtocolError, match="has no roster"):
            SecAggClient(f"site-{i:03d}", s)


def test_a_smaller_relayed_set_gets_parameters_sized_for_it() -> None:
    """n = 30, δ = 0.1: three clients do not advertise, the server relays 27 = m_min. Both
    halves derive (k, t_s) for 27 with every corrupt client relayed; the sum is exact."""
    n = 30
    payloads = _payloads(n)
    config = SecAggConfig(clip_norm=CLIP, dropout_fraction=0.1)
    clients, server, _, _ = secure_federation(_ids(n), list(payloads), config)
    report = run_aggregation(server, InMemoryTransport(clients, {"advertise": 3}, seed=2))
    assert server._topology is not None and len(server._topology.clients) == 27
    k, t_s = server.params.relayed(27)
    assert server._topology.share_threshold == t_s
    from ghofl.secure.graph_params import graph_degree, log2_exposure

    assert len(server._topology.neighbours(report.survivors[0])) == graph_degree(27, k)
    assert log2_exposure(n, k, t_s, config.corrupt_fraction, relayed=27) <= -config.sigma
    expected = sum_stats(p for c, p in zip(_ids(n), payloads, strict=True)
                         if c in report.survivors)
    assert len(report.survivors) == 27 and report.total.allclose(expected, rtol=1e-12)


def test_a_client_refuses_a_relayed_graph_sized_for_fewer_colluders_than_it_fears() -> None:
    """The server sized the round for γ = 0.05; a client that fears γ = 1/3 computes its own
    exposure on the relayed graph and refuses it."""
    params = SecAggConfig(clip_norm=CLIP, corrupt_fraction=0.05, dropout_fraction=0.1,
                          sigma=20, eta=10).for_clients(2000)
    assert not params.complete_graph
    problem = ClientPolicy(dropout_fraction=0.1).relayed_problem(params, 1900)
    assert problem is not None and re.search(
        r"a graph of degree \d+ and share threshold \d+ over the 1900 relayed clients: with "
        r"every corrupt client relayed its exposure is 2\^-?[\d.]+, above this client's 2\^-40",
        problem)
    assert ClientPolicy(corrupt_fraction=0.05, dropout_fraction=0.1, sigma=20).relayed_problem(
        params, 1900) is None
