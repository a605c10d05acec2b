"""The server half of the secure sum, as explicit state transitions.

Bonawitz et al. 2017 on the SecAgg+ graph of Bell et al. 2020.

For each stage the driver asks :meth:`SecAggServer.requests` what to send, hands the replies to
:meth:`SecAggServer.receive`, and moves on; :meth:`SecAggServer.result` gives the total. The
server never holds a client's statistics: it sees public keys, encrypted shares it cannot open,
masked vectors indistinguishable from uniform words, and, in the last stage, exactly one kind
of secret per client: the self-mask seed of a survivor or the mask key of a dropped client.

With the federation's :class:`~ghofl.secure.identity.Roster` the server checks every
signature too (an honest server excludes a client whose advertisement, share or consistency
signature does not verify), and a complaint about a bad share is verified against the signed
share the server relayed: the accused or the false accuser is excluded, never the round.

Clients that do not answer a stage are dropouts; their secrets' shares let the survivors'
pairwise masks be removed. A reply that is malformed, from another round or stage, claims
another sender, or contradicts an earlier stage excludes its sender, with the reason in
:attr:`SecAggServer.excluded`. Whenever fewer than t clients remain the round aborts with
:class:`~ghofl.errors.AggregationAbortedError` and no partial result.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import AggregationAbortedError, ConfigError, StatsFormatError
from ghofl.secure import primitives as cr
from ghofl.secure._common import (
    Topology,
    advert_transcript,
    consistency_transcript,
    key_commitment,
    nonce_commitment,
    seed_commitment,
    session_id,
    share_plaintext_bytes,
    share_transcript,
)
from ghofl.secure._server_checks import first_valid, header_problem, level_seed, opens
from ghofl.secure.bounds import BoundedDecoder
from ghofl.secure.config import SecAggConfig, SessionParams
from ghofl.secure.identity import Roster, verify_signature
from ghofl.secure.levels import LevelNoise, level_commitment, released_levels
from ghofl.secure.messages import (
    PROTOCOL_VERSION,
    SECURE_STAGES,
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
    Stage,
    UnmaskRequest,
    UnmaskShares,
)
from ghofl.secure.vectors import (
    VectorMeta,
    VectorPayload,
    decode_vector_total,
    vector_meta_difference,
)
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta

__all__ = ["PayloadDecoder", "SecAggServer", "ServerState"]

ServerState = Literal["advertise", "reveal", "share", "mask", "consistency", "unmask", "done",
                      "aborted"]
#: Turns the unmasked sum of words into the total (default: ``params.codec.decode(meta, words)``;
#: :mod:`ghofl.privacy` decodes noisy sums and post-processes them into valid statistics).
PayloadDecoder = Callable[[SessionParams, StatsMeta, NDArray[np.uint64]], ClientStats]


class SecAggServer:
    """The server of one secure aggregation round.

    Parameters
    ----------
    config : SecAggConfig
        Threshold, neighbours and fixed-point bounds.
    meta : StatsMeta or VectorMeta
        The statistics every client must hold (mode, dim, classes, encoder, projection,
        clipping bound), or the public vectors of a vector round
        (:mod:`ghofl.secure.vectors`: the total is then :meth:`vector_result`; bounds the
        codec cannot carry raise ``ConfigError`` here, :meth:`FixedPointCodec.vector_exponents`);
        a client advertising other metadata is excluded.
    clients : sequence of str, optional
        The clients invited to the round (default: the roster's; with a roster, exactly its
        clients: clients check the round's size against their roster).
    round_id : bytes, optional
        Public identifier of the round (default: 16 fresh random bytes).
    record_view : bool, default False
        Keep every message received in :attr:`view` (for audits and tests).
    decode : callable (SessionParams, StatsMeta, ndarray of uint64) -> ClientStats, optional
        How the unmasked sum becomes the total (default:
        :class:`~ghofl.secure.bounds.BoundedDecoder`, the round's fixed-point codec after
        checking the total against what clipping allows); a ``ValueError`` it raises aborts
        the round. Statistics rounds only (a vector round checks its total against
        :class:`~ghofl.secure.vectors.VectorMeta`'s bounds).
    roster : Roster, optional
        The federation's roster: signatures are checked and the round is bound to its
        fingerprint. Without it the round is unauthenticated (clients take part only when
        their policy allows that).

    Attributes
    ----------
    params : SessionParams
    state : str
        The stage awaited next, ``"done"`` or ``"aborted"``.
    dropped : dict of str to str
        Clients that did not answer, with the stage they missed.
    excluded : dict of str to str
        Clients excluded for a bad message, with the reason.
    ignored : list of str
        Problems with replies that did not exclude anyone (e.g. a bad unmask share).
    view : list of (str, str, ClientMessage)
        (stage, client, message) of every reply received, when ``record_view``.
    levels_removed : dict of str to tuple of int
        With a dropout ladder (``params.release_points``, :mod:`ghofl.secure.levels`): for each
        survivor, the levels whose noise was regenerated and subtracted from the sum (a level
        whose seed could not be reconstructed stays in the sum).
    """

    stages: tuple[Stage, ...] = SECURE_STAGES

    def __init__(self, config: SecAggConfig, meta: StatsMeta | VectorMeta,
                 clients: Sequence[str] | None = None, *, round_id: bytes | None = None,
                 record_view: bool = False, decode: PayloadDecoder | None = None,
                 roster: Roster | None = None) -> None:
        if clients is None:
            if roster is None:
                raise ConfigError("give the clients of the round, or the federation's roster")
            clients = roster.clients
        ids = [str(c) for c in clients]
        if len(set(ids)) != len(ids):
            raise ConfigError("client ids must be unique; the list of clients repeats one")
        if roster is not None and set(ids) != set(roster.clients):
            extra = sorted(set(ids) - set(roster.clients))[:3]
            missing = sorted(set(roster.clients) - set(ids))[:3]
            raise ConfigError(
                f"a round over a roster invites exactly its {len(roster)} clients (clients "
                f"count an unreachable one as a dropout); not on the roster: {extra or 'none'}; "
                f"not invited: {missing or 'none'}"
            )
        self.roster = roster
        self._roster_fp = roster.fingerprint() if roster is not None else b""
        if isinstance(meta, VectorMeta):
            if decode is not None:
                raise ConfigError(f"decode= applies to statistics rounds; the {meta.name!r} "
                                  "vector round decodes with its public bounds (leave it out)")
        elif meta.clip_norm is None or float(meta.clip_norm) != float(config.clip_norm):
            raise ConfigError(
                f"the statistics metadata must carry the round's clipping bound "
                f"R={config.clip_norm:g}; it has {meta.clip_norm!r}"
            )
        self.params: SessionParams = config.for_clients(len(ids))
        if isinstance(meta, VectorMeta):  # bounds the words cannot carry: refused up front
            self.params.codec.vector_exponents(meta)
        if self.params.release_points and not isinstance(decode, LevelNoise):
            raise ConfigError(
                "a round with dropout levels (SecAggConfig(noise_levels=...)) needs a decoder "
                "that regenerates their noise (ghofl.privacy.NoisyDecoder); give decode= or "
                "set noise_levels=0"
            )
        self.meta = meta
        self.clients = tuple(ids)
        self.round_id = round_id if round_id is not None else secrets.token_bytes(16)
        self.state: ServerState = "advertise"
        self.dropped: dict[str, str] = {}
        self.excluded: dict[str, str] = {}
        self.ignored: list[str] = []
        self.view: list[tuple[str, str, ClientMessage]] = []
        self._record = record_view
        self._meta_json = json.dumps(meta.to_dict(), sort_keys=True)
        self._active: list[str] = list(ids)
        self._roster: dict[str, RosterEntry] = {}
        self._topology: Topology | None = None
        self._nonces: dict[str, bytes] = {}
        self.session = b""
        self._shares: dict[str, ShareKeys] = {}
        self._vectors: dict[str, NDArray[np.uint64]] = {}
        self._survivors: tuple[str, ...] = ()
        self._gone: tuple[str, ...] = ()
        self._signers: dict[str, bytes] = {}
        self.levels_removed: dict[str, tuple[int, ...]] = {}
        self._result: ClientStats | VectorPayload | None = None
        self._decode = decode

    # ------------------------------------------------------------------ requests
    def requests(self) -> dict[str, ServerMessage]:
        """The request for each client still in the round, for the current stage."""
        head = {"version": PROTOCOL_VERSION, "round_id": self.round_id, "stage": self.state}
        if self.state == "advertise":
            req = AdvertiseRequest(**head, params=self.params.items(),  # type: ignore[arg-type]
                                   meta=self._meta_json, roster_fingerprint=self._roster_fp)
            return {c: req for c in self._active}
        if self.state == "reveal":
            reveal = RevealRequest(**head,  # type: ignore[arg-type]
                                   roster=tuple(self._roster[c] for c in self._active))
            return {c: reveal for c in self._active}
        if self.state == "share":
            share = ShareRequest(**head,  # type: ignore[arg-type]
                                 nonces=tuple((c, self._nonces[c]) for c in self._active))
            return {c: share for c in self._active}
        if self.state == "mask":
            inbox: dict[str, list[SealedShare]] = {c: [] for c in self._active}
            for msg in self._shares.values():
                for box in msg.shares:
                    if box.recipient in inbox:
                        inbox[box.recipient].append(box)
            sharers = tuple(self._active)
            return {c: MaskRequest(**head, sharers=sharers,  # type: ignore[arg-type]
                                   shares=tuple(inbox[c])) for c in self._active}
        if self.state == "consistency":
            cq = ConsistencyRequest(**head, survivors=self._survivors,  # type: ignore[arg-type]
                                    dropped=self._gone)
            return {c: cq for c in self._survivors}
        if self.state == "unmask":
            un = UnmaskRequest(**head, survivors=self._survivors,  # type: ignore[arg-type]
                               dropped=self._gone, signatures=tuple(sorted(self._signers.items())))
            return {c: un for c in self._signers}
        raise AggregationAbortedError(f"the round is {self.state}; there is nothing to send")

    # ------------------------------------------------------------------ replies
    def receive(self, replies: Iterable[tuple[str, ClientMessage]]) -> None:
        """Consume the replies of the current stage and move to the next one.

        Raises
        ------
        AggregationAbortedError
            Fewer than t clients remain, or a secret cannot be recovered.
        """
        stage = self.state
        expected_type = {"advertise": AdvertiseKeys, "reveal": NonceReveal, "share": ShareKeys,
                         "mask": MaskedInput,
                         "consistency": ConsistencySignature, "unmask": UnmaskShares}[stage]
        asked = set(self._signers if stage == "unmask" else
                    self._survivors if stage == "consistency" else self._active)
        accepted: dict[str, Any] = {}
        for client, msg in replies:
            if self._record:
                self.view.append((stage, client, msg))
            if client not in asked:
                self.ignored.append(f"{stage}: unsolicited reply from {client!r}")
                continue
            reason = header_problem(msg, expected_type, stage, client, self.round_id)
            if reason is None and client in accepted:
                reason = f"sent two replies in stage {stage!r}"
            if reason is None:
                reason = self._check(stage, client, msg)
            if reason is not None and stage in ("consistency", "unmask"):
                # The input is in the sum already; only this client's signature or shares go
                # unused.
                self.ignored.append(f"{stage}: {client!r} {reason}; not used")
                continue
            if reason is not None:
                accepted.pop(client, None)
                self._exclude(client, reason, stage)
                asked.discard(client)
                continue
            accepted[client] = msg
        for client in sorted(asked - set(accepted) - set(self.excluded)):
            self.dropped.setdefault(client, stage)
        getattr(self, f"_after_{stage}")(accepted)

    def _exclude(self, client: str, reason: str, stage: str) -> None:
        self.excluded.setdefault(client, f"{stage}: {reason}")

    def _check(self, stage: str, client: str, msg: Any) -> str | None:
        return getattr(self, f"_check_{stage}")(client, msg)  # type: ignore[no-any-return]

    def _require(self, remaining: int, what: str) -> None:
        if remaining < self.params.threshold:
            self.state = "aborted"
            raise AggregationAbortedError(
                f"secure aggregation aborted: only {remaining} of {len(self.clients)} clients "
                f"{what}, below the threshold t={self.params.threshold}; no result was "
                f"produced (dropped: {_names(self.dropped)}; excluded: {_names(self.excluded)})"
            )

    # ------------------------------------------------------------------ stage 1
    def _check_advertise(self, client: str, msg: AdvertiseKeys) -> str | None:
        for name in ("enc_public", "mask_public"):
            key = getattr(msg, name)
            if not isinstance(key, bytes) or len(key) != cr.KEY_BYTES:
                return f"advertised a malformed {name} (not {cr.KEY_BYTES} bytes)"
            try:
                cr.agree(cr.KeyPair.generate().private, key)
            except ValueError:
                return f"advertised an invalid X25519 {name}"
        if msg.enc_public == msg.mask_public:
            return "advertised the same key for encryption and masking"
        if not isinstance(msg.nonce_commitment, bytes) or len(msg.nonce_commitment) != 32:
            return "advertised a malformed nonce commitment (not 32 bytes)"
        if msg.meta != self._meta_json:
            return (vector_meta_difference(msg.meta, self.meta) if isinstance(
                self.meta, VectorMeta) else _meta_difference(msg.meta, self.meta))
        if not isinstance(msg.signature, bytes):
            return "sent a malformed signature"
        if self.roster is not None and not verify_signature(
                self.roster.public(client), msg.signature, advert_transcript(
                    self.round_id, self._roster_fp, self.params.items(), self._meta_json, client,
                    msg.enc_public, msg.mask_public, msg.nonce_commitment)):
            return "advertised keys whose signature does not verify against the roster"
        return None

    def _after_advertise(self, accepted: dict[str, AdvertiseKeys]) -> None:
        seen: dict[bytes, str] = {}
        for client in sorted(accepted):
            for key in (accepted[client].enc_public, accepted[client].mask_public):
                if key in seen:
                    self._exclude(client, f"reuses a public key of {seen[key]!r}", "advertise")
                seen.setdefault(key, client)
        self._active = [c for c in self.clients if c in accepted and c not in self.excluded]
        self._require(len(self._active), "advertised valid keys")
        self._roster = {c: RosterEntry(c, accepted[c].enc_public, accepted[c].mask_public,
                                       accepted[c].nonce_commitment, accepted[c].signature)
                         for c in self._active}
        self.state = "reveal"

    # ------------------------------------------------------------------ stage 2
    def _check_reveal(self, client: str, msg: NonceReveal) -> str | None:
        if not isinstance(msg.nonce, bytes) or nonce_commitment(
                self.round_id, client, msg.nonce) != self._roster[client].nonce_commitment:
            return "revealed a nonce other than the one it committed to"
        return None

    def _after_reveal(self, accepted: dict[str, NonceReveal]) -> None:
        missing = [c for c in self._active if c not in accepted]
        if missing:
            # The graph's seed needs the nonce of every relayed client: continuing without one
            # would let the server choose among seeds. The round restarts under a new id.
            self.state = "aborted"
            raise AggregationAbortedError(
                f"secure aggregation aborted at the reveal stage: {len(missing)} of the "
                f"{len(self._active)} relayed clients revealed no valid graph nonce "
                f"({_names({c: self.excluded.get(c, 'no reply') for c in missing})}); "
                "the graph cannot be seeded without every relayed nonce. Nothing was revealed: "
                "run the round again (a new round id)"
            )
        self._nonces = {c: accepted[c].nonce for c in self._active}
        entries = tuple(self._roster[c] for c in self._active)
        self.session = session_id(self.round_id, entries, self._nonces)
        self._topology = Topology.build(entries, self.params, self.session)
        self.state = "share"

    # ------------------------------------------------------------------ stage 3
    def _check_share(self, client: str, msg: ShareKeys) -> str | None:
        assert self._topology is not None
        if not isinstance(msg.seed_commitment, bytes) or len(msg.seed_commitment) != 32:
            return "sent a malformed seed commitment"
        levels = msg.level_commitments
        if not isinstance(levels, tuple) or len(levels) != len(self.params.release_points) or any(
                not isinstance(c, bytes) or len(c) != 32 for c in levels):
            return (f"sent level commitments other than {len(self.params.release_points)} of "
                    "32 bytes (one per level of the round's dropout ladder)")
        sealed_bytes = cr.NONCE_BYTES + self._plaintext_bytes + 16
        want = self._topology.neighbours(client)
        got = [b.recipient for b in msg.shares if isinstance(b, SealedShare)]
        if len(got) != len(msg.shares) or sorted(got) != sorted(want):
            return ("sent shares to a set of clients other than its neighbours on the graph "
                    "(inconsistent with the roster)")
        if any(b.sender != client or not isinstance(b.sealed, bytes)
               or len(b.sealed) != sealed_bytes or not isinstance(b.signature, bytes)
               or not isinstance(b.key_commitment, bytes) or len(b.key_commitment) != 32
               for b in msg.shares):
            return "sent a malformed encrypted share"
        if self.roster is not None:
            key = self.roster.public(client)
            if not all(verify_signature(key, b.signature, share_transcript(
                    self.session, client, b.recipient, b.sealed, b.key_commitment))
                       for b in msg.shares):
                return "sent a share whose signature does not verify against the roster"
        return None

    def _after_share(self, accepted: dict[str, ShareKeys]) -> None:
        self._shares = accepted
        self._active = [c for c in self._active if c in accepted]
        self._require(len(self._active), "sent their secret shares")
        self.state = "mask"

    # ------------------------------------------------------------------ stage 4
    def _check_mask(self, client: str, msg: MaskedInput) -> str | None:
        length = self.params.codec.length(self.meta)
        v = msg.vector
        if not isinstance(v, np.ndarray) or v.dtype != np.uint64 or v.shape != (length,):
            shape = getattr(v, "shape", None)
            return (f"sent a masked vector of dtype {getattr(v, 'dtype', type(v).__name__)} "
                    f"and shape {shape}; expected uint64 of length {length}")
        pairs = (msg.complaints, msg.complaint_keys)
        if not all(isinstance(p, tuple) and all(isinstance(x, tuple) and len(x) == 2 for x in p)
                   for p in pairs):
            return "sent malformed complaints"
        return None

    def _after_mask(self, accepted: dict[str, MaskedInput]) -> None:
        for client in sorted(accepted):
            if accepted[client].complaints:
                self._judge(client, accepted[client])
        survivors = [c for c in self._active if c in accepted and c not in self.excluded]
        self._require(len(survivors), "sent valid masked inputs")
        self._vectors = {c: accepted[c].vector for c in survivors}
        self._survivors = tuple(survivors)
        self._gone = tuple(c for c in self._active if c not in self._vectors)
        parts = self._topology.components(frozenset(survivors)) if self._topology else []
        if len(parts) > 1:
            self.state = "aborted"
            raise AggregationAbortedError(
                f"secure aggregation aborted: the {len(survivors)} survivors fall into "
                f"{len(parts)} unconnected groups on the graph, so unmasking would reveal the "
                "sum of each group; clients refuse it (too many dropouts along the graph)"
            )
        self.state = "consistency"

    def _judge(self, accuser: str, msg: MaskedInput) -> None:
        """Verify each complaint against the signed share box the server relayed.

        The complaint carries the box's pair key, which opens that box only. The accused
        signed the box with a commitment to the key: a key matching the commitment under
        which the box does not open convicts the accused; one under which it opens convicts
        the accuser (a false accusation); a key that does not match the commitment means one
        of the two lies, and both are excluded. One liar never aborts the round, and an
        honest client's complaint exposes nothing (the box it opens is the liar's garbage).
        """
        assert self._topology is not None
        keys = {str(c): k for c, k in msg.complaint_keys}
        for accused, why in msg.complaints:
            accused = str(accused)
            if accused not in self._topology.neighbours(accuser) or accused not in self._shares:
                self.ignored.append(f"mask: {accuser!r} complained about a non-neighbour")
                continue
            box = next((b for b in self._shares[accused].shares if b.recipient == accuser), None)
            key = keys.get(accused)
            if box is None or not isinstance(key, bytes) or len(key) != cr.KEY_BYTES:
                self._exclude(accuser, f"complained about {accused!r} without the pair key "
                              "that lets the complaint be verified", "mask")
                continue
            if key_commitment(self.session, accused, accuser, key) != box.key_commitment:
                for c, other in ((accused, accuser), (accuser, accused)):
                    self._exclude(c, f"disagrees with {other!r} on their pair key (one of the "
                                  "two lies; neither is trusted)", "mask")
            elif opens(key, box, self.session, self._plaintext_bytes):
                self._exclude(accuser, f"falsely reported {accused!r} (the share the server "
                              "relayed opens correctly)", "mask")
            else:
                self._exclude(accused, f"reported by {accuser!r} and verified: {why}", "mask")

    # ------------------------------------------------------------------ stage 5
    def _check_consistency(self, client: str, msg: ConsistencySignature) -> str | None:
        if not isinstance(msg.signature, bytes):
            return "sent a malformed consistency signature"
        if self.roster is not None and not verify_signature(
                self.roster.public(client), msg.signature, consistency_transcript(
                    self.session, self._roster_fp, self._survivors, self._gone)):
            return "signed a survivor set other than the one the server sent"
        return None

    def _after_consistency(self, accepted: dict[str, ConsistencySignature]) -> None:
        self._signers = {c: accepted[c].signature for c in self._survivors if c in accepted}
        self._require(len(self._signers), "signed the survivor set")
        self.state = "unmask"

    # ------------------------------------------------------------------ stage 6
    def _check_unmask(self, client: str, msg: UnmaskShares) -> str | None:
        for pairs in (msg.seed_shares, msg.key_shares):
            if not isinstance(pairs, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 for p in pairs
            ):
                return "sent malformed shares"
        if not isinstance(msg.level_shares, tuple) or not all(
                isinstance(p, tuple) and len(p) == 3 for p in msg.level_shares):
            return "sent malformed level shares"
        return None  # bad individual shares are skipped (and logged) in _after_unmask

    def _after_unmask(self, accepted: dict[str, UnmaskShares]) -> None:
        assert self._topology is not None
        self._require(len(accepted), "answered the unmask stage")
        topo, survivors, gone = self._topology, set(self._survivors), set(self._gone)
        seed_pts: dict[str, list[tuple[int, bytes]]] = {}
        key_pts: dict[str, list[tuple[int, bytes]]] = {}
        for holder, msg in sorted(accepted.items()):
            mine = topo.neighbours(holder) | {holder}
            for kind, pairs, pool, owners in (("seed", msg.seed_shares, seed_pts, survivors),
                                               ("key", msg.key_shares, key_pts, gone)):
                for owner, share in pairs:
                    if owner in owners and owner in mine and isinstance(share, bytes):
                        pool.setdefault(owner, []).append((topo.point(holder), share))
                    else:
                        self.ignored.append(
                            f"unmask: {holder!r} sent an unexpected {kind} share for {owner!r}"
                        )
        total = np.zeros(self.params.codec.length(self.meta), np.uint64)
        for client in self._survivors:
            total += self._vectors.pop(client)
        for client in self._survivors:
            seed = self._recover(client, seed_pts.get(client, []), "self-mask seed",
                                 lambda s, c=client: seed_commitment(
                                     self.session, c, s) == self._shares[c].seed_commitment)
            total -= cr.mask_words(seed, total.size)
        for client in self._gone:
            key = self._recover(client, key_pts.get(client, []), "mask key",
                                lambda s, c=client: cr.public_from_private(s)
                                == self._roster[c].mask_public)
            for other in sorted(topo.neighbours(client) & survivors):
                shared = cr.agree(key, self._roster[other].mask_public)
                words = cr.mask_words(cr.derive_key(shared, b"mask", self.session), total.size)
                if topo.sign(other, client) > 0:
                    total -= words
                else:
                    total += words
        self._remove_levels(total, accepted)
        try:
            if isinstance(self.meta, VectorMeta):
                self._result = decode_vector_total(self.params, self.meta, total,
                                                   len(self._survivors))
            else:
                decode = self._decode or BoundedDecoder(lambda: len(self._survivors))
                self._result = decode(self.params, self.meta, total)
        except AggregationAbortedError:  # a total beyond what clipping allows, named
            self.state = "aborted"
            raise
        except (StatsFormatError, ValueError) as exc:
            self.state = "aborted"
            raise AggregationAbortedError(
                f"secure aggregation aborted: the unmasked sum is not valid statistics ({exc}); "
                "a client sent an inconsistent masked input"
            ) from exc
        self.state = "done"

    def _recover(self, client: str, points: list[tuple[int, bytes]], what: str,
                 valid: Any) -> bytes:
        assert self._topology is not None
        t_s = self._topology.share_threshold
        secret = first_valid(points, t_s, valid)
        if secret is not None:
            return secret
        self.state = "aborted"
        holders = len(self._topology.holders(client)) if self._topology else 0
        raise AggregationAbortedError(
            f"secure aggregation aborted: the {what} of client {client!r} cannot be recovered "
            f"({len(points)} valid shares from its {holders} share holders, {t_s} needed); no "
            "result was produced"
        )

    @property
    def _plaintext_bytes(self) -> int:
        return share_plaintext_bytes(len(self.params.release_points))

    def _remove_levels(self, total: NDArray[np.uint64], accepted: dict[str, UnmaskShares]
                       ) -> None:
        """Regenerate and subtract the released levels of every survivor (secure.levels).

        Only levels whose release point is at most the survivor count are asked for (the
        clients reveal no others); a level seed that cannot be reconstructed stays in the sum
        (more noise, never less) and is named in :attr:`ignored`.
        """
        released = released_levels(self.params.release_points, len(self._survivors))
        if not released:
            return
        assert self._topology is not None and isinstance(self._decode, LevelNoise)
        assert isinstance(self.meta, StatsMeta)
        topo, t_s = self._topology, self._topology.share_threshold
        points: dict[str, dict[int, dict[int, bytes]]] = {}  # owner -> level -> x -> share
        alive = frozenset(self._survivors)
        for holder, msg in sorted(accepted.items()):
            mine = topo.neighbours(holder) | {holder}
            for owner, level, share in msg.level_shares:
                if (owner in alive and owner in mine and level in released
                        and isinstance(share, bytes)):
                    points.setdefault(owner, {}).setdefault(level, {})[topo.point(holder)] = share
                else:
                    self.ignored.append(f"unmask: {holder!r} sent an unexpected level share "
                                        f"for {owner!r}")
        weights: dict[tuple[int, ...], list[int]] = {}  # one Lagrange basis per holder set
        for owner in self._survivors:
            removed = []
            for level in released:
                pts = points.get(owner, {}).get(level, {})
                commit = self._shares[owner].level_commitments[level]
                seed = level_seed(pts, t_s, weights, lambda e, c=owner, j=level, h=commit:
                                   level_commitment(self.round_id, c, j, e) == h)
                if seed is None:
                    self.ignored.append(f"unmask: level {level} of {owner!r} cannot be "
                                        f"reconstructed ({len(pts)} shares); its noise stays")
                    continue
                total -= self._decode.expand(self.params, self.meta, level, seed)
                removed.append(level)
            self.levels_removed[owner] = tuple(removed)

    # ------------------------------------------------------------------ result
    def result(self) -> ClientStats:
        """The total over the surviving clients (after the unmask stage)."""
        if isinstance(self.meta, VectorMeta):
            raise AggregationAbortedError(
                f"the round sums {self.meta.name!r} vectors, not statistics; read its total "
                "with vector_result()")
        if not isinstance(self._result, ClientStats):
            raise AggregationAbortedError(
                f"the round has no result (state {self.state!r}); run every stage first"
            )
        return self._result

    def vector_result(self) -> VectorPayload:
        """The total of a vector round over the surviving clients (after the unmask stage)."""
        if not isinstance(self._result, VectorPayload):
            raise AggregationAbortedError(
                f"the round has no vector total (state {self.state!r}); run every stage of a "
                "round over a VectorMeta first")
        return self._result

    @property
    def survivors(self) -> tuple[str, ...]:
        """Clients whose statistics are in the sum."""
        return self._survivors


def _meta_difference(text: str, meta: StatsMeta) -> str:
    try:
        theirs = StatsMeta.from_dict(json.loads(text))
    except (ValueError, TypeError, StatsFormatError) as exc:
        return f"advertised malformed statistics metadata ({exc})"
    diffs = meta.differences(theirs) or ["their canonical form"]
    return "holds statistics that differ from the federation's in " + "; ".join(diffs)


def _names(d: dict[str, str]) -> str:
    if not d:
        return "none"
    shown = ", ".join(sorted(d)[:5])
    return shown + (f" and {len(d) - 5} more" if len(d) > 5 else "")
