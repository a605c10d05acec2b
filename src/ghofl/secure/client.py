"""The client half of the secure sum: one reply per stage, as explicit state transitions.

A :class:`SecAggClient` holds one client's statistics and its secrets for one round. The
transport hands it each server request; :meth:`SecAggClient.handle` checks that the request
fits the current state and the earlier stages, moves to the next state and returns the reply.
A request that does not fit raises :class:`~ghofl.errors.ProtocolError` and the client sends
nothing (an honest client refuses rather than reveal more than the protocol allows).

Against an active server or relay the client trusts only its own configuration: the
federation's :class:`~ghofl.secure.identity.Roster` (every relayed key must carry its owner's
signature), its :class:`~ghofl.secure.policy.ClientPolicy` (threshold, graph degree, roster
size), and the consistency check (it reveals shares only for the survivor set it signed, and
only after at least t survivors signed that same set).

States: ``ready`` → (advertise) → ``advertised`` → (reveal) → ``revealed`` → (share) →
``shared`` → (mask) → ``masked`` → (consistency) → ``signed`` → (unmask) → ``done``; any
refusal → ``failed``.

What an honest client never does, whatever the server or a relay sends: reveal a secret that
opens any share box but the one it accuses (a complaint carries that box's pair key only),
send its masked input when more share boxes are missing than its policy tolerates, take part
twice under one round id (its ledger), sign anything not bound to this run's transcript, or
accept a relayed roster smaller than its policy's least relayed size.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import GhoflError, ProtocolError
from ghofl.secure import _client_payload as cp
from ghofl.secure import primitives as cr
from ghofl.secure import shamir
from ghofl.secure._client_state import StateValue, StatsSource, load_state, save_state
from ghofl.secure._common import (
    Topology,
    advert_transcript,
    consistency_transcript,
    key_commitment,
    nonce_commitment,
    pair_key,
    seed_commitment,
    session_id,
    share_aad,
    share_plaintext_bytes,
    share_transcript,
    split_plaintext,
)
from ghofl.secure.config import SessionParams
from ghofl.secure.identity import IdentityKey, Roster, verify_signature
from ghofl.secure.ledger import RoundLedger
from ghofl.secure.levels import LevelNoise, level_commitment, released_levels
from ghofl.secure.messages import (
    PROTOCOL_VERSION,
    AdvertiseKeys,
    AdvertiseRequest,
    ClientMessage,
    ConsistencyRequest,
    ConsistencySignature,
    MaskedInput,
    MaskRequest,
    NonceReveal,
    RevealRequest,
    RosterEntry,
    SealedShare,
    ServerMessage,
    ShareKeys,
    ShareRequest,
    UnmaskRequest,
    UnmaskShares,
)
from ghofl.secure.policy import ClientPolicy
from ghofl.secure.vectors import VectorMeta, VectorPayload
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta

__all__ = ["ClientState", "PayloadEncoder", "SecAggClient", "StateValue", "StatsSource"]

ClientState = Literal["ready", "advertised", "revealed", "shared", "masked", "signed", "done",
                      "failed"]
#: Turns the client's statistics into the words it masks, given the round's public parameters
#: (default: ``params.codec.encode(stats)``; :mod:`ghofl.privacy` adds noise shares first).
PayloadEncoder = Callable[[ClientStats, SessionParams], "NDArray[np.uint64]"]


class SecAggClient:
    """One client of a secure aggregation round.

    Parameters
    ----------
    client_id : str
        The identity the transport knows this client by.
    stats : ClientStats, VectorPayload or callable returning one
        The client's statistics, or a function computing them when the masked input is due
        (so a simulation need not hold every client's statistics at once); or the vectors of
        a vector round (:mod:`ghofl.secure.vectors`: refused before masking when an entry
        exceeds its public bound).
    meta : StatsMeta or VectorMeta, optional
        Metadata of the statistics (or description of the vectors); required when ``stats``
        is a callable.
    encode : callable (ClientStats, SessionParams) -> ndarray of uint64, optional
        How the statistics become the masked words (default: the round's fixed-point codec);
        its output must have the codec's length. Not saved by :meth:`to_state`. Statistics
        only.
    identity : IdentityKey, optional
        This client's long-term identity key (required with ``roster``).
    roster : Roster, optional
        The federation's roster, fixed out of band; every relayed key and signature is checked
        against it. Without a roster the client takes part only when its policy allows
        unauthenticated rounds.
    policy : ClientPolicy, optional
        What this client accepts (default :class:`~ghofl.secure.policy.ClientPolicy`; when
        ``allow_unauthenticated=True`` sets its flag).
    ledger : RoundLedger, "default" or None, default "default"
        The rounds this client's data entered: a round id seen before is refused, and so is a
        second round over the same statistics unless the ledger allows repeats (see
        :mod:`ghofl.secure.ledger`). ``"default"``: the file
        :func:`~ghofl.secure.ledger.default_ledger_path` of this client id; ``None``: no
        ledger (e.g. simulated clients, whose data the user holds whole).
    privacy_cost : (float, float), default (0, 0)
        The (ε, δ) one round spends on this client's data, recorded in the ledger.
    allow_unauthenticated : bool, default False
        Take part without a roster. Refused otherwise: without the roster every relayed key
        is taken on trust, so the round holds only against an honest server and an honest
        relay.

    Attributes
    ----------
    state : str
        Current state (see the module docstring).
    complaints_ : tuple of (str, str)
        Shares that failed checks at the mask stage: (sender, reason).
    """

    def __init__(self, client_id: str, stats: cp.PayloadSource,
                 meta: StatsMeta | VectorMeta | None = None,
                 encode: PayloadEncoder | None = None, *, identity: IdentityKey | None = None,
                 roster: Roster | None = None, policy: ClientPolicy | None = None,
                 ledger: RoundLedger | Literal["default"] | None = "default",
                 privacy_cost: tuple[float, float] = (0.0, 0.0),
                 allow_unauthenticated: bool = False) -> None:
        if roster is None and not allow_unauthenticated and (
                policy is None or not policy.allow_unauthenticated):
            raise ProtocolError(
                f"client {client_id!r} has no roster: without the federation's roster every "
                "relayed key is taken on trust (a relay or a lying server can substitute them "
                "and read this client's statistics); give roster= and identity=, or pass "
                "allow_unauthenticated=True to accept that risk explicitly"
            )
        if roster is not None:
            if identity is None:
                raise ProtocolError(f"client {client_id!r}: a roster needs identity= too")
            if roster.keys.get(str(client_id)) != identity.public:
                raise ProtocolError(
                    f"client {client_id!r} is not on the roster with this identity key (the "
                    "roster lists another key or no entry for it); rebuild the roster with "
                    "this client's public key"
                )
        if meta is None:
            if not isinstance(stats, ClientStats | VectorPayload):
                raise ProtocolError(
                    f"client {client_id!r}: give meta= when stats is computed lazily"
                )
            meta = stats.meta
        if isinstance(meta, VectorMeta) and encode is not None:
            raise ProtocolError(f"client {client_id!r}: encode= applies to statistics; a "
                                f"{meta.name!r} vector payload is encoded by the round's codec")
        self.client_id = str(client_id)
        self.meta = meta
        self.state: ClientState = "ready"
        self.complaints_: tuple[tuple[str, str], ...] = ()
        self._stats = stats
        self._encode = encode
        self._round = b""
        self._params: SessionParams | None = None
        self._enc: cr.KeyPair | None = None
        self._mask: cr.KeyPair | None = None
        self._seed = b""
        self._nonce = b""
        self._session = b""
        self._topology: Topology | None = None
        self._roster: dict[str, RosterEntry] = {}
        self._sharers: frozenset[str] = frozenset()
        self._held: dict[str, tuple[bytes, bytes]] = {}  # owner -> (seed share, key share)
        self._levels: tuple[bytes, ...] = ()  # this client's level seeds (secure.levels)
        self._held_levels: dict[str, tuple[bytes, ...]] = {}  # owner -> its level shares
        self.identity = identity
        self.roster = roster
        self.policy = policy if policy is not None else ClientPolicy()
        if allow_unauthenticated and not self.policy.allow_unauthenticated:
            self.policy = dataclasses.replace(self.policy, allow_unauthenticated=True)
        self._roster_fp = b""
        self._signed: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        self.ledger = cp.resolve_ledger(ledger, self.client_id)
        self.privacy_cost = privacy_cost

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict[str, StateValue]:
        """Everything this client must remember between stages, as a flat dictionary.

        Values are bytes, text, integers and lists of them (e.g. for Flower's ``context.state``,
        where each message may reach a fresh process). It holds the client's secrets: keep it on the
        client. The statistics are not included; give them again to :meth:`from_state`.
        """
        return save_state(self)

    @classmethod
    def from_state(cls, state: dict[str, Any], stats: StatsSource,
                   encode: PayloadEncoder | None = None, *,
                   identity: IdentityKey | None = None, roster: Roster | None = None,
                   policy: ClientPolicy | None = None,
                   ledger: RoundLedger | Literal["default"] | None = "default",
                   privacy_cost: tuple[float, float] = (0.0, 0.0),
                   allow_unauthenticated: bool = False) -> SecAggClient:
        """Rebuild a client saved by :meth:`to_state`.

        Give the identity, roster, policy and ledger again: they are the client's
        configuration, not round state.

        Raises
        ------
        ProtocolError
            The state is malformed or from another protocol version.
        """
        client = load_state(cls, state, stats, identity, roster, policy, allow_unauthenticated)
        client._encode = encode
        client.ledger = cp.resolve_ledger(ledger, client.client_id)
        client.privacy_cost = privacy_cost
        return client

    # ------------------------------------------------------------------ dispatch
    def handle(self, request: ServerMessage) -> ClientMessage:
        """Answer one server request (see the module docstring for the transitions).

        Raises
        ------
        ProtocolError
            The request is malformed, out of order, from another round, or inconsistent with
            an earlier stage; the client moves to ``failed`` and sends nothing.
        """
        try:
            return self._dispatch(request)
        except ProtocolError:
            self.state = "failed"
            raise
        except GhoflError as exc:  # e.g. statistics beyond the public bounds
            self.state = "failed"
            raise ProtocolError(f"client {self.client_id!r} cannot take part: {exc}") from exc

    def _dispatch(self, request: ServerMessage) -> ClientMessage:
        if not isinstance(request, ServerMessage) or request.version != PROTOCOL_VERSION:
            raise self._refuse("a request of an unknown type or protocol version")
        expected = {"ready": AdvertiseRequest, "advertised": RevealRequest,
                    "revealed": ShareRequest, "shared": MaskRequest,
                    "masked": ConsistencyRequest, "signed": UnmaskRequest}.get(self.state)
        if expected is None or not isinstance(request, expected):
            raise self._refuse(
                f"a {type(request).__name__} in state {self.state!r} (out of order or replayed)"
            )
        if self.state != "ready" and request.round_id != self._round:
            raise self._refuse("a request from another round (replayed)")
        if isinstance(request, AdvertiseRequest):
            return self._advertise(request)
        if isinstance(request, RevealRequest):
            return self._reveal(request)
        if isinstance(request, ShareRequest):
            return self._share(request)
        if isinstance(request, MaskRequest):
            return self._masked_input(request)
        if isinstance(request, ConsistencyRequest):
            return self._sign_survivors(request)
        assert isinstance(request, UnmaskRequest)
        return self._unmask(request)

    def _refuse(self, what: str) -> ProtocolError:
        return ProtocolError(f"client {self.client_id!r} refused {what}")

    def _header(self, stage: str) -> dict[str, object]:
        return {"version": PROTOCOL_VERSION, "round_id": self._round, "stage": stage,
                "sender": self.client_id}

    # ------------------------------------------------------------------ stage 1
    def _advertise(self, req: AdvertiseRequest) -> AdvertiseKeys:
        self._params = SessionParams.from_items(req.params)
        if not isinstance(req.roster_fingerprint, bytes):
            raise self._refuse("an advertise request with a malformed roster fingerprint")
        problem = self.policy.problem(self._params, self.roster, req.roster_fingerprint)
        if problem is not None:
            raise self._refuse(f"{problem} (outside this client's policy)")
        if isinstance(self.meta, StatsMeta) and self.meta.clip_norm != self._params.clip_norm:
            got = "no clipping" if self.meta.clip_norm is None else f"R={self.meta.clip_norm:g}"
            raise self._refuse(
                f"a round with clipping bound R={self._params.clip_norm:g}: its statistics were "
                f"computed with {got}"
            )
        if self._params.release_points and not isinstance(self._encode, LevelNoise):
            raise self._refuse(
                "a round with dropout levels (distributed DP noise): this client's encoder "
                "adds no removable noise"
            )
        if not isinstance(req.round_id, bytes) or len(req.round_id) < 16:
            raise self._refuse("a round id shorter than 16 bytes (round ids must be unique)")
        if self.ledger is not None:  # a round id is used once, whatever happened to it
            try:
                self.ledger.begin(req.round_id)
            except ProtocolError as exc:
                raise self._refuse(str(exc)) from None
        self._round = req.round_id
        self._roster_fp = req.roster_fingerprint
        self._enc, self._mask = cr.KeyPair.generate(), cr.KeyPair.generate()
        self._nonce = cr.random_seed()
        commitment = nonce_commitment(self._round, self.client_id, self._nonce)
        meta = json.dumps(self.meta.to_dict(), sort_keys=True)
        signature = b""
        if self.identity is not None and self.roster is not None:
            signature = self.identity.sign(advert_transcript(
                self._round, self._roster_fp, req.params, meta, self.client_id,
                self._enc.public, self._mask.public, commitment))
        self.state = "advertised"
        return AdvertiseKeys(**self._header("advertise"),  # type: ignore[arg-type]
                             enc_public=self._enc.public, mask_public=self._mask.public,
                             nonce_commitment=commitment, meta=meta, signature=signature)

    # ------------------------------------------------------------------ stage 2
    def _check_roster(self, entries: tuple[RosterEntry, ...]) -> None:
        assert self._params is not None and self._enc is not None and self._mask is not None
        if not isinstance(entries, tuple) or not all(isinstance(e, RosterEntry)
                                                     for e in entries):
            raise self._refuse("a malformed relayed roster")
        ids = [e.client for e in entries]
        mine = [e for e in entries if e.client == self.client_id]
        if len(set(ids)) != len(ids) or len(mine) != 1:
            raise self._refuse("a roster with duplicate clients or without this client")
        own = (self._enc.public, self._mask.public,
               nonce_commitment(self._round, self.client_id, self._nonce))
        if (mine[0].enc_public, mine[0].mask_public, mine[0].nonce_commitment) != own:
            raise self._refuse("a roster that relays other keys for this client")
        if self.roster is not None:
            self._check_signed_entries(entries)
        n = self._params.num_clients
        # a client that trusts the server (honest but curious) takes any roster of t or more
        least = self._params.threshold if self.policy.trust_server else max(
            self._params.threshold, self.policy.least_relayed(n))
        if not least <= len(ids) <= n:
            raise self._refuse(
                f"a relayed roster of {len(ids)} of {n} clients; this client accepts at least "
                f"{least} (the graph is sized for a roster shrunk by at most the dropout "
                f"fraction {self.policy.dropout_fraction:.3g}) and at most {n}"
            )
        problem = self.policy.relayed_problem(self._params, len(ids))
        if problem is not None:
            raise self._refuse(f"{problem} (outside this client's policy)")

    def _check_signed_entries(self, entries: tuple[RosterEntry, ...]) -> None:
        assert self._params is not None and self.roster is not None
        params = self._params.items()
        for e in entries:
            if e.client not in self.roster:
                raise self._refuse(f"a roster naming {e.client!r}, who is not in the federation")
            statement = advert_transcript(self._round, self._roster_fp, params, self._meta_json,
                                          e.client, e.enc_public, e.mask_public,
                                          e.nonce_commitment)
            if not verify_signature(self.roster.public(e.client), e.signature, statement):
                raise self._refuse(
                    f"the keys relayed for {e.client!r}: their signature does not verify "
                    "against the federation's roster (substituted or altered keys)"
                )

    def _reveal(self, req: RevealRequest) -> NonceReveal:
        self._check_roster(req.roster)
        self._roster = {e.client: e for e in req.roster}
        self.state = "revealed"
        return NonceReveal(**self._header("reveal"), nonce=self._nonce)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ stage 3
    def _check_nonces(self, nonces: tuple[tuple[str, bytes], ...]) -> dict[str, bytes]:
        got = dict(nonces) if isinstance(nonces, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 for p in nonces) else None
        if got is None or len(got) != len(nonces) or set(got) != set(self._roster):
            raise self._refuse(
                "nonces for a set of clients other than the relayed roster (the graph's seed "
                "needs every relayed client's nonce)"
            )
        for c, nonce in got.items():
            if (not isinstance(nonce, bytes)
                    or nonce_commitment(self._round, c, nonce) != self._roster[c].nonce_commitment):
                raise self._refuse(
                    f"the nonce relayed for {c!r}: it does not match the commitment it "
                    "advertised (a nonce chosen after the roster was fixed)"
                )
        return got

    def _share(self, req: ShareRequest) -> ShareKeys:
        assert self._params is not None and self._enc is not None and self._mask is not None
        nonces = self._check_nonces(req.nonces)
        entries = tuple(self._roster.values())
        self._session = session_id(self._round, entries, nonces)
        topo = Topology.build(entries, self._params, self._session)
        self._topology = topo
        self._seed = cr.random_seed()
        holders = topo.holders(self.client_id)
        xs = [topo.point(h) for h in holders]
        t_s = topo.share_threshold
        seed_sh = shamir.share_secret(self._seed, xs, t_s)
        key_sh = shamir.share_secret(self._mask.private, xs, t_s)
        self._levels = tuple(cr.random_seed() for _ in self._params.release_points)
        level_sh = [shamir.share_secret(e, xs, t_s) for e in self._levels]
        sealed = []
        for i, (holder, s_b, s_k) in enumerate(zip(holders, seed_sh, key_sh, strict=True)):
            mine = tuple(sh[i] for sh in level_sh)
            if holder == self.client_id:
                self._held[holder], self._held_levels[holder] = (s_b, s_k), mine
                continue
            key = pair_key(self._agree(self._enc, holder, "enc_public"), self._session,
                           self.client_id, holder)
            box = cr.aead_encrypt(key, s_b + s_k + b"".join(mine),
                                  share_aad(self._session, self.client_id, holder))
            commit = key_commitment(self._session, self.client_id, holder, key)
            sealed.append(SealedShare(self.client_id, holder, box, commit, self._sign(
                share_transcript(self._session, self.client_id, holder, box, commit))))
        self.state = "shared"
        return ShareKeys(**self._header("share"),  # type: ignore[arg-type]
                         shares=tuple(sealed),
                         seed_commitment=seed_commitment(self._session, self.client_id,
                                                         self._seed),
                         level_commitments=tuple(
                             level_commitment(self._round, self.client_id, j, e)
                             for j, e in enumerate(self._levels)))

    def _agree(self, pair: cr.KeyPair, other: str, which: str) -> bytes:
        try:
            return pair.agree(getattr(self._roster[other], which))
        except ValueError:
            raise self._refuse(
                f"the {which} relayed for {other!r}: it is not a valid X25519 key"
            ) from None

    def _sign(self, statement: bytes) -> bytes:
        if self.identity is None or self.roster is None:
            return b""
        return self.identity.sign(statement)

    @property
    def _meta_json(self) -> str:
        return json.dumps(self.meta.to_dict(), sort_keys=True)

    # ------------------------------------------------------------------ stage 4
    def _masked_input(self, req: MaskRequest) -> MaskedInput:
        assert self._params is not None and self._topology is not None and self._mask is not None
        topo = self._topology
        sharers = frozenset(req.sharers)
        if self.client_id not in sharers or not sharers <= set(topo.clients):
            raise self._refuse("a list of sharers inconsistent with the roster")
        if len(sharers) < self._params.threshold:
            raise self._refuse(
                f"a list of {len(sharers)} sharers, below the threshold {self._params.threshold}"
            )
        self._sharers = sharers
        complaints, keys, missing = self._open_shares(req.shares, sharers)
        tolerated = self.policy.max_missing_shares
        if len(missing) > tolerated:
            raise self._refuse(
                f"to send its masked input: {len(missing)} share boxes of its neighbours are "
                f"missing or unverifiable ({cp.names(missing)}), more than the {tolerated} its "
                "policy tolerates (a server or relay withholding or altering shares; nothing "
                "was revealed)"
            )
        self.complaints_ = tuple(sorted(complaints.items()))
        stats = self._stats() if callable(self._stats) else self._stats
        if cp.payload_differs(stats, self.meta):
            raise self._refuse(
                "to mask statistics whose metadata differs from what it advertised"
            )
        digest = cp.payload_digest(stats) if self.ledger is not None else ""
        if self.ledger is not None:
            try:
                self.ledger.check(digest, self._round)
            except ProtocolError as exc:
                raise self._refuse(str(exc)) from None
        if self._encode is None or not isinstance(stats, ClientStats):
            vector = self._params.codec.encode(stats)
        else:
            vector = np.asarray(self._encode(stats, self._params))
            length = self._params.codec.length(self.meta)
            if vector.dtype != np.uint64 or vector.shape != (length,):
                raise self._refuse(f"an encoder output other than {length} uint64 words")
        if self._levels:  # the removable noise of the dropout levels (ghofl.secure.levels)
            assert isinstance(self._encode, LevelNoise) and isinstance(self.meta, StatsMeta)
            for j, e in enumerate(self._levels):
                vector += self._encode.expand(self._params, self.meta, j, e)
        del stats
        vector += cr.mask_words(self._seed, vector.size)
        for other in sorted(topo.neighbours(self.client_id) & sharers):
            shared = self._agree(self._mask, other, "mask_public")
            words = cr.mask_words(cr.derive_key(shared, b"mask", self._session), vector.size)
            if topo.sign(self.client_id, other) > 0:
                vector += words
            else:
                vector -= words
        if self.ledger is not None:  # before the masked input leaves the client
            self.ledger.record(digest, self._round, *self.privacy_cost)
        self._stats = cp.spent
        self.state = "masked"
        return MaskedInput(**self._header("mask"),  # type: ignore[arg-type]
                           vector=vector, complaints=self.complaints_,
                           complaint_keys=tuple(sorted(keys.items())))

    def _open_shares(self, boxes: tuple[SealedShare, ...], sharers: frozenset[str]
                     ) -> tuple[dict[str, str], dict[str, bytes], list[str]]:
        """Open the boxes addressed to this client.

        Returns (complaints, their pair keys, missing senders). A complaint (with the box's
        pair key, which opens that box only) is made only about a box its sender signed
        together with a commitment to that very key, and which does not open: that proves the
        sender at fault. A box that is absent, repeated, misaddressed, unsigned or whose
        commitment is not to this pair's key may be a relay's doing: it is counted missing and
        nothing is revealed about it.
        """
        assert self._topology is not None and self._enc is not None
        expected = self._topology.neighbours(self.client_id) & sharers
        complaints: dict[str, str] = {}
        keys: dict[str, bytes] = {}
        bad: set[str] = set()
        seen: set[str] = set()
        for box in boxes:
            if (not isinstance(box, SealedShare) or box.recipient != self.client_id
                    or box.sender not in expected or box.sender in seen):
                if isinstance(box, SealedShare) and box.sender in expected:
                    bad.add(box.sender)
                continue
            seen.add(box.sender)
            if not self._box_signed(box):
                bad.add(box.sender)
                continue
            key = pair_key(self._agree(self._enc, box.sender, "enc_public"), self._session,
                           box.sender, self.client_id)
            plain = cr.aead_decrypt(key, box.sealed,
                                    share_aad(self._session, box.sender, self.client_id))
            if plain is not None and len(plain) == share_plaintext_bytes(len(self._levels)):
                s_b, s_k, self._held_levels[box.sender] = split_plaintext(plain)
                self._held[box.sender] = (s_b, s_k)
            elif (self.roster is not None and box.key_commitment
                  == key_commitment(self._session, box.sender, self.client_id, key)):
                complaints[box.sender] = (
                    f"its signed share for {self.client_id!r} does not open under the pair key "
                    "it committed to")
                keys[box.sender] = key
            else:
                bad.add(box.sender)
        missing = sorted((expected - seen) | bad)
        for c in missing:
            self._held.pop(c, None)
            self._held_levels.pop(c, None)
        return complaints, keys, missing

    def _box_signed(self, box: SealedShare) -> bool:
        """Whether ``box`` carries its sender's signature for this session (yes, unsigned)."""
        if self.roster is None:
            return True
        return isinstance(box.sealed, bytes) and isinstance(box.key_commitment, bytes) and (
            verify_signature(self.roster.public(box.sender), box.signature, share_transcript(
                self._session, box.sender, self.client_id, box.sealed, box.key_commitment)))

    # ------------------------------------------------------------------ stage 5
    def _sign_survivors(self, req: ConsistencyRequest) -> ConsistencySignature:
        assert self._params is not None and self._topology is not None
        survivors, dropped = tuple(sorted(set(req.survivors))), tuple(sorted(set(req.dropped)))
        if (len(survivors) != len(req.survivors) or len(dropped) != len(req.dropped)
                or set(survivors) & set(dropped)
                or set(survivors) | set(dropped) != self._sharers):
            raise self._refuse(
                "survivor and dropped sets that do not split the sharers exactly (revealing "
                "both secrets of a client would unmask its input)"
            )
        if self.client_id not in survivors or len(survivors) < self._params.threshold:
            raise self._refuse(
                f"to sign a sum over {len(survivors)} clients, below the threshold "
                f"{self._params.threshold}"
            )
        if not self._params.complete_graph:
            alive = len(self._topology.neighbours(self.client_id) & set(survivors))
            if alive < self._topology.share_threshold:
                raise self._refuse(
                    f"to unmask with only {alive} of its neighbours surviving, below the share "
                    f"threshold {self._topology.share_threshold} (its seed would then be "
                    "recoverable by its surviving neighbours alone)"
                )
        parts = self._topology.components(frozenset(survivors))
        if len(parts) > 1:
            raise self._refuse(
                f"to unmask survivors that fall into {len(parts)} unconnected groups on the "
                "graph (the server would learn the sum of each group, a partial sum)"
            )
        self._signed = (survivors, dropped)
        self.state = "signed"
        statement = consistency_transcript(self._session, self._roster_fp, survivors, dropped)
        return ConsistencySignature(**self._header("consistency"),  # type: ignore[arg-type]
                                    signature=self._sign(statement))

    # ------------------------------------------------------------------ stage 6
    def _unmask(self, req: UnmaskRequest) -> UnmaskShares:
        assert self._params is not None and self._topology is not None
        assert self._signed is not None
        survivors, dropped = self._signed
        if (tuple(sorted(req.survivors)) != survivors or tuple(sorted(req.dropped)) != dropped
                or len(req.survivors) != len(survivors) or len(req.dropped) != len(dropped)):
            raise self._refuse(
                "an unmask request for other survivor or dropped sets than it signed"
            )
        self._check_consistency(req.signatures)
        mine = self._topology.neighbours(self.client_id) | {self.client_id}
        seeds = tuple((u, self._held[u][0]) for u in sorted(set(survivors) & mine)
                      if u in self._held)
        keys = tuple((u, self._held[u][1]) for u in sorted(set(dropped) & mine)
                     if u in self._held)
        # level seeds only for the levels released at the survivor count it signed: a server
        # claiming more survivors than it showed the others gets no signatures for that set
        released = released_levels(self._params.release_points, len(survivors))
        levels = tuple((u, j, self._held_levels[u][j]) for u, _ in seeds for j in released
                       if j < len(self._held_levels.get(u, ())))
        self.state = "done"
        return UnmaskShares(**self._header("unmask"),  # type: ignore[arg-type]
                            seed_shares=seeds, key_shares=keys, level_shares=levels)

    def _check_consistency(self, signatures: tuple[tuple[str, bytes], ...]) -> None:
        """Reveal nothing until at least t survivors signed the very sets this client signed."""
        assert self._params is not None and self._signed is not None
        if self.roster is None:
            return  # unauthenticated: the sets were checked against this client's own only
        survivors, dropped = self._signed
        statement = consistency_transcript(self._session, self._roster_fp, survivors, dropped)
        members = set(survivors)
        valid: set[str] = set()
        for c, sig in signatures:  # t valid signatures suffice: stop verifying there
            if len(valid) >= self._params.threshold:
                break
            if (c in members and c not in valid and isinstance(sig, bytes)
                    and verify_signature(self.roster.public(c), sig, statement)):
                valid.add(c)
        if len(valid) < self._params.threshold:
            raise self._refuse(
                f"to unmask: only {len(valid)} survivors signed the survivor set it was "
                f"shown, below the threshold {self._params.threshold} (the server may be "
                "showing different clients different sets)"
            )
