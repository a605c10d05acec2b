"""Adversaries written around the honest halves of the secure sum (issue: secure aggregation
against the adversaries a real federation meets).

Each test plays one attack of the review: a relay that substitutes keys, a server that shows
different clients different survivor sets, a server that asks for parameters outside the
clients' policy or a roster of invented clients, a false accuser, an invalid relayed key, and
dropouts that would reveal a partial sum. In every case the adversary learns nothing beyond
the sum, or the honest clients refuse with a reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest

from ghofl.errors import AggregationAbortedError, ConfigError, ProtocolError
from ghofl.secure import InMemoryTransport, SecAggClient, SecAggConfig, SecAggServer
from ghofl.secure import primitives as cr
from ghofl.secure._common import (
    Topology,
    key_commitment,
    pair_key,
    session_id,
    share_aad,
    share_transcript,
)
from ghofl.secure.config import SessionParams, consistency_threshold
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.messages import (
    PROTOCOL_VERSION,
    ClientMessage,
    ConsistencyRequest,
    MaskedInput,
    MaskRequest,
    RevealRequest,
    RosterEntry,
    SealedShare,
    ServerMessage,
    ShareKeys,
    ShareRequest,
    Stage,
    UnmaskRequest,
    UnmaskShares,
)
from ghofl.secure.policy import ClientPolicy
from ghofl.secure.protocol import run_aggregation
from ghofl.stats.client_stats import ClientStats, sum_stats
from tests.helpers import pooled_payloads, secure_federation

CLIP = 6.0


def _payloads(n: int, seed: int = 0) -> list[ClientStats]:
    return pooled_payloads(n, seed=seed, clip=CLIP)  # type: ignore[return-value]


def _ids(n: int) -> list[str]:
    return [f"site-{i:02d}" for i in range(n)]


def _federation(n: int, config: SecAggConfig | None = None, **kw: Any) -> tuple[
        list[SecAggClient], SecAggServer, dict[str, IdentityKey], Roster, list[ClientStats]]:
    payloads = _payloads(n)
    clients, server, ids, roster = secure_federation(
        _ids(n), list(payloads), config or SecAggConfig(clip_norm=CLIP), **kw)
    return clients, server, ids, roster, payloads  # type: ignore[return-value]


def _stage(server: SecAggServer, transport: Any, stage: str) -> None:
    server.receive(transport.exchange(stage, server.requests()))


def _stage_with(server: SecAggServer, transport: Any, requests: dict[str, Any]) -> None:
    server.receive(transport.exchange(server.state, requests))


def _assert_exact(total: ClientStats, expected: ClientStats) -> None:
    assert np.array_equal(total.counts, expected.counts)
    assert total.allclose(expected, rtol=1e-12)


class Relay:
    """A transport in the middle (a Flower SuperLink is one) that may rewrite requests."""

    def __init__(self, inner: InMemoryTransport, rewrite: Any) -> None:
        self.inner, self.rewrite = inner, rewrite
        self.traffic = inner.traffic

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        return self.inner.exchange(stage, {c: self.rewrite(c, r) for c, r in requests.items()})


# ---------------------------------------------------------------------- 3. key substitution
@pytest.mark.parametrize("what", ["keys", "nonce commitment"])
def test_a_relay_that_substitutes_a_victims_keys_is_refused_by_every_client(what: str) -> None:
    """The relay swaps the victim's relayed keys (or its nonce commitment, to choose the graph)
    for its own, keeping the victim's signature or signing with its own identity: every client
    refuses the relayed roster before it reveals its nonce or encrypts a share, so the relay
    reads nothing, and the round ends without a result."""
    clients, server, _, _, _ = _federation(5)
    victim, evil_enc, evil_mask = "site-01", cr.KeyPair.generate(), cr.KeyPair.generate()
    evil_id = IdentityKey.generate()
    swapped: dict[str, Any] = (
        {"enc_public": evil_enc.public, "mask_public": evil_mask.public} if what == "keys"
        else {"nonce_commitment": hashlib.sha256(b"the relay's nonce").digest()})

    def swap(client: str, req: ServerMessage) -> ServerMessage:
        if not isinstance(req, RevealRequest) or client == victim:
            return req
        roster = tuple(
            dataclasses.replace(e, **swapped, signature=evil_id.sign(b"anything")
                                if client == "site-02" else e.signature)
            if e.client == victim else e for e in req.roster)
        return dataclasses.replace(req, roster=roster)

    transport = Relay(InMemoryTransport(clients), swap)
    with pytest.raises(AggregationAbortedError, match=r"aborted at the reveal stage: 4 of the 5 "
                       r"relayed clients revealed no valid graph nonce"):
        run_aggregation(server, transport)
    assert "share" not in transport.traffic  # no share box was ever sealed
    refused = transport.traffic["reveal"].refused
    assert set(refused) == {c for c in _ids(5) if c != victim}
    for why in refused.values():
        assert "the keys relayed for 'site-01': their signature does not verify against the " \
               "federation's roster (substituted or altered keys)" in why


def test_a_relay_that_substitutes_keys_on_the_way_to_the_server_gets_its_sender_excluded(
) -> None:
    clients, server, _, _, payloads = _federation(5)
    evil = cr.KeyPair.generate()

    class Swap:
        def __init__(self, inner: InMemoryTransport) -> None:
            self.inner, self.traffic = inner, inner.traffic

        def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                     ) -> Iterator[tuple[str, ClientMessage]]:
            for client, msg in self.inner.exchange(stage, requests):
                if stage == "advertise" and client == "site-03":
                    msg = dataclasses.replace(msg, enc_public=evil.public)
                yield client, msg

    report = run_aggregation(server, Swap(InMemoryTransport(clients)))
    assert report.excluded == {"site-03": "advertise: advertised keys whose signature does "
                                          "not verify against the roster"}
    _assert_exact(report.total, sum_stats(p for c, p in zip(_ids(5), payloads, strict=True)
                                          if c != "site-03"))


# ---------------------------------------------------------------------- 4. inconsistent views
class SplitViewServer(SecAggServer):
    """An active server: tells the first clients the victim dropped (to collect shares of its
    mask key) and the others that it survived (to collect shares of its self-mask seed)."""

    victim = "site-00"
    fooled = ("site-01", "site-02")

    def requests(self) -> dict[str, ServerMessage]:
        out = super().requests()
        if self.state in ("consistency", "unmask"):
            for c in self.fooled:
                req = out[c] if c in out else next(iter(out.values()))
                surv = tuple(s for s in self._survivors if s != self.victim)
                out[c] = dataclasses.replace(req, survivors=surv,  # type: ignore[call-arg]
                                             dropped=(*self._gone, self.victim))
        return out

    def _check_consistency(self, client: str, msg: Any) -> str | None:
        return None  # keep every signature, whatever set it is on

    def _after_consistency(self, accepted: dict[str, Any]) -> None:
        self._signers = {c: m.signature for c, m in accepted.items()}
        self.state = "unmask"


def test_different_survivor_sets_to_different_clients_reveal_nothing() -> None:
    """n = 5, t = 4, no colluders: neither set collects t signatures, so no honest client
    reveals a share, and the server holds neither of the victim's secrets."""
    clients, _, _, roster, payloads = _federation(5)
    server = SplitViewServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, _ids(5),
                             roster=roster, record_view=True)
    transport = InMemoryTransport(clients)
    for stage in ("advertise", "reveal", "share", "mask", "consistency", "unmask"):
        if stage == "unmask":
            with pytest.raises(AggregationAbortedError, match="answered the unmask stage"):
                _stage(server, transport, stage)
        else:
            _stage(server, transport, stage)
    assert not [m for s, _, m in server.view if isinstance(m, UnmaskShares)]
    refused = transport.traffic["unmask"].refused
    assert len(refused) == 5
    assert all("survivors signed the survivor set it was shown, below the threshold 4" in why
               for why in refused.values())


def test_a_client_refuses_to_unmask_other_sets_than_it_signed() -> None:
    clients, server, _, _, _ = _federation(4)
    transport = InMemoryTransport(clients)
    for stage in ("advertise", "reveal", "share", "mask", "consistency"):
        _stage(server, transport, stage)
    req = server.requests()["site-00"]
    assert isinstance(req, UnmaskRequest)
    other = dataclasses.replace(req, survivors=req.survivors[1:], dropped=(req.survivors[0],))
    with pytest.raises(ProtocolError, match=r"refused an unmask request for other survivor or "
                       r"dropped sets than it signed"):
        clients[0].handle(other)


# ---------------------------------------------------------------------- 5. parameters on trust
def _advertise_with(**changes: Any) -> Any:
    clients, server, _, _, _ = _federation(6)
    req = server.requests()["site-00"]
    params = dataclasses.replace(SessionParams.from_items(req.params), **changes)
    return clients[0], dataclasses.replace(req, params=params.items())


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"threshold": 1}, r"threshold t=1 for 6 clients; this client accepts t between 5 and 6"),
        ({"threshold": 0}, r"threshold t=0 for 6 clients"),
        ({"threshold": 3}, r"threshold t=3 for 6 clients; this client accepts t between 5"),
        ({"num_clients": 7}, r"a round over 7 clients; the federation's roster has 6"),
        ({"num_clients": 6, "neighbours": 1}, r"a graph of 1 neighbours per client; this client "
                                              r"accepts at least 5 for 6 clients"),
    ],
)
def test_a_client_refuses_parameters_outside_its_policy(changes: dict[str, Any],
                                                        match: str) -> None:
    client, req = _advertise_with(**changes)
    with pytest.raises(ProtocolError, match=match + r".*\(outside this client's policy\)"):
        client.handle(req)
    assert client.state == "failed"


def test_a_round_over_another_roster_is_refused() -> None:
    """A server that runs the round over its own roster (invented clients added) is refused:
    the fingerprint differs from the client's roster."""
    clients, _, identities, _, payloads = _federation(4)
    invented = {**identities, "ghost-1": IdentityKey.generate(), "ghost-2": IdentityKey.generate()}
    fake = Roster.from_identities(invented)
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, roster=fake)
    with pytest.raises(ProtocolError, match=r"a round over another roster \(its fingerprint "
                       r"differs from this client's roster"):
        clients[0].handle(server.requests()["site-00"])


def test_a_roster_entry_for_an_invented_client_is_refused() -> None:
    clients, server, _, _, _ = _federation(4)
    transport = InMemoryTransport(clients)
    _stage(server, transport, "advertise")
    req = server.requests()["site-00"]
    assert isinstance(req, RevealRequest)
    ghost = RosterEntry("ghost", cr.KeyPair.generate().public, cr.KeyPair.generate().public,
                        bytes(32), bytes(64))
    with pytest.raises(ProtocolError, match=r"a roster naming 'ghost', who is not in the "
                       r"federation"):
        clients[0].handle(dataclasses.replace(req, roster=(*req.roster, ghost)))


def test_the_relayed_order_does_not_choose_the_graph() -> None:
    """The graph is fixed by the session hash of the signed advertisements and the revealed
    nonces, not by the order the server relays them in: any permutation gives the same
    neighbourhoods, while any other advertisement or nonce moves the graph."""
    params = SessionParams(20, 14, 4, 1_000_000, CLIP, 2, 3)
    rid = b"round-id-0000001"
    entries = tuple(RosterEntry(f"c{i:02d}", bytes([i]) * 32, bytes([i + 50]) * 32,
                                bytes([i + 100]) * 32, bytes([i]) * 64) for i in range(20))
    nonces = {e.client: bytes([i + 150]) * 32 for i, e in enumerate(entries)}
    rng = np.random.default_rng(0)
    base = Topology.build(entries, params, session_id(rid, entries, nonces))
    for _ in range(5):
        perm = tuple(entries[i] for i in rng.permutation(20))
        shuffled = dict(sorted(nonces.items(), key=lambda _: rng.random()))
        other = Topology.build(perm, params, session_id(rid, perm, shuffled))
        assert all(other.neighbours(c) == base.neighbours(c) for c in base.clients)
    changed = (dataclasses.replace(entries[0], signature=b"\x07" * 64), *entries[1:])
    another_nonce = {**nonces, "c05": b"\x09" * 32}
    for session in (session_id(rid, changed, nonces), session_id(rid, entries, another_nonce),
                    session_id(b"round-id-0000002", entries, nonces)):
        moved = Topology.build(entries, params, session)
        assert any(moved.neighbours(c) != base.neighbours(c) for c in base.clients)


def test_a_server_over_a_roster_invites_exactly_its_clients() -> None:
    _, _, _, roster, payloads = _federation(3)
    with pytest.raises(ConfigError, match=r"a round over a roster invites exactly its 3 "
                       r"clients .* not on the roster: \['x'\]; not invited: none"):
        SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, [*_ids(3), "x"],
                     roster=roster)


def test_policy_thresholds() -> None:
    assert [consistency_threshold(n) for n in (2, 3, 5, 6, 10, 100)] == [2, 3, 4, 5, 7, 67]
    assert ClientPolicy(trust_server=True).least_threshold(10) == 2
    assert ClientPolicy(corrupt_fraction=0.0).least_threshold(10) == 6
    with pytest.raises(ConfigError, match=r"corrupt_fraction must be in \[0, 1\); got 1.5"):
        ClientPolicy(corrupt_fraction=1.5)


def test_an_unauthenticated_client_is_refused_unless_its_policy_allows_it() -> None:
    """A client without a roster is refused at construction (the default policy, or none);
    it takes part only when told so explicitly, by its policy or by allow_unauthenticated."""
    payloads = _payloads(3)
    for policy in (ClientPolicy(), None):
        with pytest.raises(ProtocolError, match=r"client 'site-00' has no roster: without the "
                           r"federation's roster every relayed key is taken on trust .*pass "
                           r"allow_unauthenticated=True to accept that risk explicitly"):
            SecAggClient("site-00", payloads[0], policy=policy)
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, _ids(3))
    for lax in (SecAggClient("site-00", payloads[0], allow_unauthenticated=True),
                SecAggClient("site-00", payloads[0], ledger=None,
                             policy=ClientPolicy(allow_unauthenticated=True))):
        assert lax.policy.allow_unauthenticated
        reply = lax.handle(server.requests()["site-00"])
        assert lax.state == "advertised" and reply.signature == b""  # type: ignore[attr-defined]
    saved = lax.to_state()
    with pytest.raises(ProtocolError, match=r"client 'site-00' has no roster"):
        SecAggClient.from_state(saved, payloads[0])  # nor by restoring a saved state
    assert SecAggClient.from_state(saved, payloads[0], allow_unauthenticated=True,
                                   ledger=None).state == "advertised"


# ---------------------------------------------------------------------- 8. complaints
def _pair_key_of(client: SecAggClient, sender: str) -> bytes:
    """The pair key of the box ``sender`` → ``client`` (what ``client`` can compute)."""
    assert client._enc is not None
    shared = client._enc.agree(client._roster[sender].enc_public)
    return pair_key(shared, client._session, sender, client.client_id)


def _boxes_opened(key: bytes, server: SecAggServer) -> list[tuple[str, str]]:
    """(sender, recipient) of every share box the server relayed that ``key`` opens."""
    opened = []
    for msg in server._shares.values():
        for box in msg.shares:
            plain = cr.aead_decrypt(key, box.sealed,
                                    share_aad(server.session, box.sender, box.recipient))
            if plain is not None:
                opened.append((box.sender, box.recipient))
    return opened


def _false_accuser(accuser: str, accused: str, key: str = "pair") -> Any:
    """The accuser complains about a good box; ``key``: the true pair key, none, or a key
    that is not the one the accused committed to."""
    class Accuse:
        def __init__(self, inner: InMemoryTransport) -> None:
            self.inner, self.traffic = inner, inner.traffic

        def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                     ) -> Iterator[tuple[str, ClientMessage]]:
            for client, msg in self.inner.exchange(stage, requests):
                if stage == "mask" and client == accuser:
                    assert isinstance(msg, MaskedInput) and not msg.complaints
                    me = self.inner.clients[accuser]
                    assert isinstance(me, SecAggClient)
                    keys = {"pair": ((accused, _pair_key_of(me, accused)),), "none": (),
                            "other": ((accused, cr.random_seed()),)}[key]
                    msg = dataclasses.replace(msg, complaints=((accused, "made up"),),
                                              complaint_keys=keys)
                yield client, msg
    return Accuse


@pytest.mark.parametrize("n", [5, 12])
def test_a_false_accuser_is_excluded_and_the_round_completes(n: int) -> None:
    """The accuser reveals the true pair key: the box opens under it, so the accuser lied;
    the key opens that one box only, so the complaint exposed nothing else."""
    clients, server, _, _, payloads = _federation(n)
    report = run_aggregation(server, _false_accuser("site-03", "site-01")(
        InMemoryTransport(clients)))
    assert report.excluded == {"site-03": "mask: falsely reported 'site-01' (the share the "
                                          "server relayed opens correctly)"}
    assert "site-01" in report.survivors
    _assert_exact(report.total, sum_stats(p for c, p in zip(_ids(n), payloads, strict=True)
                                          if c != "site-03"))
    key = _pair_key_of(clients[3], "site-01")
    assert _boxes_opened(key, server) == [("site-01", "site-03")]  # that box, no other
    assert key not in (clients[3]._enc.private, clients[1]._enc.private)  # type: ignore[union-attr]


def test_a_complaint_without_its_key_excludes_the_accuser() -> None:
    clients, server, _, _, _ = _federation(5)
    report = run_aggregation(server, _false_accuser("site-03", "site-01", key="none")(
        InMemoryTransport(clients)))
    assert report.excluded == {"site-03": "mask: complained about 'site-01' without the pair "
                                          "key that lets the complaint be verified"}


def test_a_complaint_with_a_key_other_than_the_committed_one_excludes_both() -> None:
    """A key that is not the one the sender committed to: one of the two lies, the server
    cannot tell which, so it trusts neither; the round completes over the others."""
    clients, server, _, _, payloads = _federation(8)
    report = run_aggregation(server, _false_accuser("site-03", "site-01", key="other")(
        InMemoryTransport(clients)))
    assert report.excluded == {
        "site-01": "mask: disagrees with 'site-03' on their pair key (one of the two lies; "
                   "neither is trusted)",
        "site-03": "mask: disagrees with 'site-01' on their pair key (one of the two lies; "
                   "neither is trusted)"}
    _assert_exact(report.total, sum_stats(p for c, p in zip(_ids(8), payloads, strict=True)
                                          if c not in ("site-01", "site-03")))


class BadBox:
    """The sender ``bad`` replaces its first share box by garbage it signs itself (so every
    signature check passes), committing to the true pair key (``honest_commitment``) or to
    another key."""

    def __init__(self, inner: InMemoryTransport, bad: str, identity: IdentityKey,
                 honest_commitment: bool = True) -> None:
        self.inner, self.traffic = inner, inner.traffic
        self.bad, self.identity, self.honest = bad, identity, honest_commitment
        self.victim = ""

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        for client, msg in self.inner.exchange(stage, requests):
            if stage == "share" and client == self.bad:
                assert isinstance(msg, ShareKeys)
                me = self.inner.clients[self.bad]
                assert isinstance(me, SecAggClient) and me._enc is not None
                box = msg.shares[0]
                self.victim, session = box.recipient, me._session
                key = pair_key(me._enc.agree(me._roster[box.recipient].enc_public), session,
                               self.bad, box.recipient)
                junk = cr.aead_encrypt(cr.random_seed(), bytes(132), b"junk")
                commit = key_commitment(session, self.bad, box.recipient,
                                        key if self.honest else cr.random_seed())
                forged = SealedShare(self.bad, box.recipient, junk, commit, self.identity.sign(
                    share_transcript(session, self.bad, box.recipient, junk, commit)))
                msg = dataclasses.replace(msg, shares=(forged, *msg.shares[1:]))
            yield client, msg


def test_a_true_complaint_about_a_signed_bad_share_excludes_the_sender() -> None:
    """A malicious client signs a garbage share with its own identity key (so the signature
    checks pass) and a commitment to the true pair key; its neighbour complains with that pair
    key only, the server verifies the complaint and excludes the sender, and the round
    completes with the others' exact sum."""
    clients, server, identities, _, payloads = _federation(8, record_view=True)
    bad = "site-02"
    transport = BadBox(InMemoryTransport(clients), bad, identities[bad])
    report = run_aggregation(server, transport)
    victim = transport.victim
    assert list(report.excluded) == [bad]
    assert report.excluded[bad] == (
        f"mask: reported by {victim!r} and verified: its signed share for {victim!r} does not "
        "open under the pair key it committed to")
    _assert_exact(report.total, sum_stats(p for c, p in zip(_ids(8), payloads, strict=True)
                                          if c != bad))
    # what the complaint revealed: one pair key, of the bad box only
    complaint = next(m for s, c, m in server.view if s == "mask" and c == victim)
    assert isinstance(complaint, MaskedInput)
    assert [c for c, _ in complaint.complaints] == [bad]
    assert [c for c, _ in complaint.complaint_keys] == [bad]
    key = complaint.complaint_keys[0][1]
    by_name = {c.client_id: c for c in clients}
    assert key == _pair_key_of(by_name[victim], bad)
    assert key not in (by_name[victim]._enc.private, by_name[bad]._enc.private)  # type: ignore[union-attr]
    assert _boxes_opened(key, server) == []  # not even the garbage box, and no honest one


def test_a_box_committed_to_another_key_is_missing_and_its_recipient_reveals_nothing() -> None:
    """A bad box whose commitment is not to the pair key proves nothing against its sender
    (the recipient could not show the box is bad without a key that opens it): the recipient
    counts it missing, complains about nothing, and with no missing box tolerated keeps its
    masked input."""
    clients, server, identities, _, payloads = _federation(8)
    bad = "site-02"
    transport = BadBox(InMemoryTransport(clients), bad, identities[bad],
                       honest_commitment=False)
    report = run_aggregation(server, transport)
    victim = transport.victim
    assert report.dropped == {victim: "mask"} and report.excluded == {}
    assert report.refused[victim] == (
        f"client {victim!r} refused to send its masked input: 1 share boxes of its neighbours "
        f"are missing or unverifiable ({bad!r}), more than the 0 its policy tolerates (a "
        "server or relay withholding or altering shares; nothing was revealed)")
    _assert_exact(report.total, sum_stats(p for c, p in zip(_ids(8), payloads, strict=True)
                                          if c != victim))


@pytest.mark.parametrize("tolerated", [0, 1])
def test_a_relay_that_alters_a_box_gets_no_complaint_key(tolerated: int) -> None:
    """A relay flips a bit of a box on its way to the recipient: the sender's signature no
    longer verifies, so the box counts as missing and the recipient reveals no key about it.
    Tolerating no missing box it keeps its masked input; tolerating one it sends it with no
    complaint, and the sum stays exact."""
    config = SecAggConfig(clip_norm=CLIP)
    payloads = _payloads(6)
    policy = ClientPolicy(max_missing_shares=tolerated)
    clients, server, _, _ = secure_federation(_ids(6), list(payloads), config, policy=policy,
                                              record_view=True)
    victim = "site-04"

    def alter(client: str, req: ServerMessage) -> ServerMessage:
        if not isinstance(req, MaskRequest) or client != victim:
            return req
        box = req.shares[0]
        flipped = bytes([box.sealed[0] ^ 1]) + box.sealed[1:]
        return dataclasses.replace(req, shares=(dataclasses.replace(box, sealed=flipped),
                                                *req.shares[1:]))

    transport = Relay(InMemoryTransport(clients), alter)
    report = run_aggregation(server, transport)  # type: ignore[arg-type]
    assert report.excluded == {}
    if tolerated:
        mine = next(m for s, c, m in server.view if s == "mask" and c == victim)  # type: ignore[attr-defined]
        assert mine.complaints == () and mine.complaint_keys == ()
        assert victim in report.survivors
    else:
        assert report.dropped == {victim: "mask"}
        assert "missing or unverifiable" in report.refused[victim]
    _assert_exact(report.total, sum_stats(p for c, p in zip(_ids(6), payloads, strict=True)
                                          if c in report.survivors))


# ---------------------------------------------------------------------- 9. invalid relayed key
def test_an_invalid_relayed_key_is_refused_not_raised() -> None:
    """Unauthenticated round (no signatures to stop it): a low-order X25519 point relayed for
    a neighbour makes the client refuse with a reason, never a ValueError."""
    payloads = _payloads(3)
    clients = [SecAggClient(c, p, allow_unauthenticated=True)
               for c, p in zip(_ids(3), payloads, strict=True)]
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, _ids(3))
    transport = InMemoryTransport(clients)
    _stage(server, transport, "advertise")
    reveal = server.requests()
    assert isinstance(reveal["site-00"], RevealRequest)
    roster = tuple(dataclasses.replace(e, enc_public=bytes(32)) if e.client == "site-01" else e
                   for e in reveal["site-00"].roster)
    reveal["site-00"] = dataclasses.replace(reveal["site-00"], roster=roster)
    _stage_with(server, transport, reveal)
    req = server.requests()["site-00"]
    assert isinstance(req, ShareRequest)
    with pytest.raises(ProtocolError, match=r"refused the enc_public relayed for 'site-01': it "
                       r"is not a valid X25519 key"):
        clients[0].handle(req)


# ---------------------------------------------------------------------- 2. partial sums
@pytest.fixture
def ring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ghofl.secure._common.graph_seed",
                        lambda session: hashlib.sha256(b"fixed graph order").digest())


@pytest.mark.usefixtures("ring")
def test_dropouts_that_split_the_graph_abort_and_clients_refuse_the_partial_sums() -> None:
    """On a ring (k = 2), two dropouts far apart cut the survivors in two: the honest server
    aborts, and a server that asks anyway is refused by every survivor."""
    n = 12
    # a ring is far below the sized degree: only with no corrupt or dropped clients assumed
    lax = {"corrupt_fraction": 0.0, "dropout_fraction": 0.0, "sigma": 1.0, "eta": 1.0}
    config = SecAggConfig(clip_norm=CLIP, neighbours=2, threshold=6, **lax)  # type: ignore[arg-type]
    policy = ClientPolicy(trust_server=True, min_neighbours=2, **lax)  # type: ignore[arg-type]
    clients, server, _, _, _ = _federation(n, config, policy=policy,
                                           round_id=b"ring-round-00001")
    transport = InMemoryTransport(clients)
    for stage in ("advertise", "reveal", "share"):
        _stage(server, transport, stage)
    assert server._topology is not None
    topo = server._topology
    order = [topo.clients[int(j)] for j in topo._graph._order]  # the ring, in order
    cut = {order[0], order[n // 2]}
    survivors = frozenset(topo.clients) - cut
    assert len(topo.components(survivors)) == 2
    requests = server.requests()
    gone = {c: r for c, r in requests.items() if c not in cut}
    with pytest.raises(AggregationAbortedError, match=r"the 10 survivors fall into 2 unconnected "
                       r"groups on the graph"):
        server.receive(transport.exchange("mask", gone))
    head = {"version": PROTOCOL_VERSION, "round_id": server.round_id, "stage": "consistency"}
    ask = ConsistencyRequest(**head, survivors=tuple(sorted(survivors)),  # type: ignore[arg-type]
                             dropped=tuple(sorted(cut)))
    survivor = next(c for c in clients if c.client_id in survivors)
    with pytest.raises(ProtocolError, match=r"refused to unmask survivors that fall into 2 "
                       r"unconnected groups on the graph \(the server would learn the sum of "
                       r"each group, a partial sum\)"):
        survivor.handle(ask)


# ---------------------------------------------------------------------- 6. repeated rounds
def _ledgered_round(tmp: Any, payloads: list[ClientStats], *, allow: bool = False,
                    drop: str | None = None) -> Any:
    from ghofl.secure.ledger import RoundLedger

    ids = [c for c in _ids(len(payloads)) if c != drop]
    identities = {c: IdentityKey.generate() for c in ids}
    roster = Roster.from_identities(identities)
    clients = [SecAggClient(c, p, identity=identities[c], roster=roster,
                            ledger=RoundLedger(tmp / f"{c}.ledger", allow_repeat=allow),
                            privacy_cost=(0.5, 1e-6))
               for c, p in zip(_ids(len(payloads)), payloads, strict=True) if c != drop]
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, roster=roster)
    transport = InMemoryTransport(clients)
    return server, transport


def test_a_second_round_over_the_same_data_is_refused(tmp_path: Any) -> None:
    """A server that runs the federation twice, the second time without the victim, would
    learn the victim's statistics as the difference of the totals: the clients' ledgers
    refuse the second round."""
    payloads = _payloads(5)
    server, transport = _ledgered_round(tmp_path, payloads)
    run_aggregation(server, transport)
    server, transport = _ledgered_round(tmp_path, payloads, drop="site-00")
    with pytest.raises(AggregationAbortedError, match="sent valid masked inputs"):
        run_aggregation(server, transport)
    refused = transport.traffic["mask"].refused
    assert len(refused) == 4
    assert all("refused a second round over the same statistics (they entered round" in why
               and "the server could difference the two totals" in why
               for why in refused.values())


def test_repeated_rounds_allowed_explicitly_compose_the_privacy_spent(tmp_path: Any) -> None:
    from ghofl.secure.ledger import RoundLedger, stats_digest

    payloads = _payloads(4)
    for _ in range(3):
        server, transport = _ledgered_round(tmp_path, payloads, allow=True)
        run_aggregation(server, transport)
    ledger = RoundLedger(tmp_path / "site-01.ledger")
    assert len(ledger.entries()) == 3
    eps, delta = ledger.spent(stats_digest(payloads[1]))
    assert eps == pytest.approx(1.5) and delta == pytest.approx(3e-6)
    assert ledger.spent(stats_digest(payloads[2])) == (0.0, 0.0)  # another client's data


def test_an_unreadable_ledger_is_never_replaced_silently(tmp_path: Any) -> None:
    from ghofl.secure.ledger import RoundLedger

    path = tmp_path / "bad.ledger"
    path.write_text("not json")
    with pytest.raises(ConfigError, match=r"the round ledger .*bad.ledger is unreadable .*never "
                       r"replaced silently"):
        RoundLedger(path).check("00", b"r")
    assert path.read_text() == "not json"


# ---------------------------------------------------------------------- binding addresses
def test_nodes_bind_to_their_roster_ids_and_nothing_else() -> None:
    from ghofl.secure.binding import answer_hello, bind_addresses, hello_request

    keys = {n: IdentityKey.generate() for n in ("a", "b", "c")}
    roster = Roster.from_identities(keys)
    req = hello_request(roster)
    good = {f"node-{i}": answer_hello(req, keys[n], roster, f"node-{i}")
            for i, n in enumerate(("a", "b"))}
    moved = ("node-9", answer_hello(req, keys["c"], roster, "node-2"))  # relay moves it
    twin = ("node-7", answer_hello(req, keys["a"], roster, "node-7"))   # a second "a"
    stale = ("node-5", answer_hello(hello_request(roster), keys["c"], roster, "node-5"))
    bound, problems = bind_addresses(req, [*good.items(), moved, twin, stale], roster)
    assert bound == {"b": "node-1"}
    assert problems == {
        "node-0": "claims the identity 'a', which 2 nodes claim",
        "node-7": "claims the identity 'a', which 2 nodes claim",
        "node-9": "sent an identity answer for another request or node (replayed or moved)",
        "node-5": "sent an identity answer for another request or node (replayed or moved)",
    }
    stranger = IdentityKey.generate()
    with pytest.raises(ProtocolError, match=r"this node's identity key is not on its roster"):
        answer_hello(req, stranger, roster, "node-3")
    other = Roster.from_identities({"x": stranger})
    with pytest.raises(ProtocolError, match=r"refused an identity request for another roster"):
        answer_hello(req, stranger, other, "node-3")
    forged = dataclasses.replace(answer_hello(req, keys["c"], roster, "node-4"), sender="b")
    bound, problems = bind_addresses(req, [("node-4", forged)], roster)
    assert bound == {} and problems == {
        "node-4": "claims the identity 'b' without its key's signature"}


def test_a_client_refuses_a_share_threshold_below_what_its_graph_needs() -> None:
    """On the sparse graph the server states t_s; one below what keeps exposure <= 2^-40 on
    that graph (e.g. t_s = 2: two colluders rebuild a neighbour's secrets) is refused."""
    n = 100
    keys = {f"c{i:03d}": IdentityKey.generate() for i in range(n)}
    roster = Roster.from_identities(keys)
    payload = _payloads(1)[0]
    client = SecAggClient("c000", payload, identity=keys["c000"], roster=roster)
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payload.meta, roster=roster)
    req = server.requests()["c000"]
    params = SessionParams.from_items(req.params)
    assert not params.complete_graph and params.share_threshold > 2
    low = dataclasses.replace(params, shares_needed=2)
    with pytest.raises(ProtocolError, match=rf"a share threshold of 2 for {params.neighbours} "
                       rf"neighbours; this client needs at least {params.share_threshold} "):
        client.handle(dataclasses.replace(req, params=low.items()))


@pytest.mark.usefixtures("ring")
def test_a_client_whose_neighbours_are_declared_dropped_refuses_to_unmask() -> None:
    """A server that declares a victim's honest neighbours dropped would get the victim's seed
    from its own share and its corrupt neighbours' (t_s − 1 of them would do); the victim
    refuses unless t_s of its neighbours survive."""
    n = 30
    lax = {"corrupt_fraction": 0.1, "dropout_fraction": 0.0, "sigma": 8.0}
    config = SecAggConfig(clip_norm=CLIP, neighbours=6, **lax)  # type: ignore[arg-type]
    policy = ClientPolicy(min_neighbours=6, **lax)  # type: ignore[arg-type]
    clients, server, _, _, _ = _federation(n, config, policy=policy,
                                           round_id=b"victim-round-0001")
    transport = InMemoryTransport(clients)
    for stage in ("advertise", "reveal", "share", "mask"):
        _stage(server, transport, stage)
    assert server._topology is not None and not server.params.complete_graph
    t_s = server.params.share_threshold
    victim = clients[0]
    neighbours = sorted(server._topology.neighbours(victim.client_id))
    declared = frozenset(neighbours[: len(neighbours) - t_s + 1])  # t_s − 1 neighbours left
    survivors = tuple(sorted(set(server._survivors) - declared))
    head = {"version": PROTOCOL_VERSION, "round_id": server.round_id, "stage": "consistency"}
    ask = ConsistencyRequest(**head, survivors=survivors,  # type: ignore[arg-type]
                             dropped=tuple(sorted(declared)))
    with pytest.raises(ProtocolError, match=rf"refused to unmask with only {t_s - 1} of its "
                       rf"neighbours surviving, below the share threshold {t_s}"):
        victim.handle(ask)
