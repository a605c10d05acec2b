"""The client half of the secure sum: one reply per stage, as explicit state transitions.

A :class:`SecAggClient` holds one client's statistics and its secrets for one round. The
transport hands it each server request; :meth:`SecAggClient.handle` checks that the request
fits the current state and the earlier stages, moves to the next state and returns the reply.
A request that does not fit raises :class:`~ghofl.errors.ProtocolError` and the client sends
nothing (an honest client refuses rather than reveal more than the protocol allows).

States: ``ready`` → (advertise) → ``advertised`` → (share) → ``shared`` → (mask) → ``masked``
→ (unmask) → ``done``; any refusal → ``failed``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import GhoflError, ProtocolError
from ghofl.secure import primitives as cr
from ghofl.secure import shamir
from ghofl.secure._common import (
    SHARE_PLAINTEXT_BYTES,
    Topology,
    seed_commitment,
    share_aad,
)
from ghofl.secure.config import SessionParams
from ghofl.secure.messages import (
    PROTOCOL_VERSION,
    AdvertiseKeys,
    AdvertiseRequest,
    ClientMessage,
    MaskedInput,
    MaskRequest,
    RosterEntry,
    SealedShare,
    ServerMessage,
    ShareKeys,
    ShareRequest,
    UnmaskRequest,
    UnmaskShares,
)
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta

__all__ = ["ClientState", "PayloadEncoder", "SecAggClient", "StateValue", "StatsSource"]

ClientState = Literal["ready", "advertised", "shared", "masked", "done", "failed"]
StatsSource = ClientStats | Callable[[], ClientStats]
StateValue = bytes | str | int | list[str] | list[bytes]
#: Turns the client's statistics into the words it masks, given the round's public parameters
#: (default: ``params.codec.encode(stats)``; :mod:`ghofl.privacy` adds noise shares first).
PayloadEncoder = Callable[[ClientStats, SessionParams], "NDArray[np.uint64]"]


class SecAggClient:
    """One client of a secure aggregation round.

    Parameters
    ----------
    client_id : str
        The identity the transport knows this client by.
    stats : ClientStats or callable returning ClientStats
        The client's statistics, or a function computing them when the masked input is due
        (so a simulation need not hold every client's statistics at once).
    meta : StatsMeta, optional
        Metadata of the statistics; required when ``stats`` is a callable.
    encode : callable (ClientStats, SessionParams) -> ndarray of uint64, optional
        How the statistics become the masked words (default: the round's fixed-point codec);
        its output must have the codec's length. Not saved by :meth:`to_state`.

    Attributes
    ----------
    state : str
        Current state (see the module docstring).
    complaints_ : tuple of (str, str)
        Shares that failed checks at the mask stage: (sender, reason).
    """

    def __init__(self, client_id: str, stats: StatsSource, meta: StatsMeta | None = None,
                 encode: PayloadEncoder | None = None) -> None:
        if meta is None:
            if not isinstance(stats, ClientStats):
                raise ProtocolError(
                    f"client {client_id!r}: give meta= when stats is computed lazily"
                )
            meta = stats.meta
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
        self._topology: Topology | None = None
        self._roster: dict[str, RosterEntry] = {}
        self._sharers: frozenset[str] = frozenset()
        self._held: dict[str, tuple[bytes, bytes]] = {}  # owner -> (seed share, key share)

    # ------------------------------------------------------------------ persistence
    def to_state(self) -> dict[str, StateValue]:
        """Everything this client must remember between stages, as a flat dictionary of bytes,
        text, integers and lists of them (e.g. for Flower's ``context.state``, where each
        message may reach a fresh process). It holds the client's secrets: keep it on the
        client. The statistics are not included; give them again to :meth:`from_state`."""
        return _save_state(self)

    @classmethod
    def from_state(cls, state: dict[str, Any], stats: StatsSource,
                   encode: PayloadEncoder | None = None) -> SecAggClient:
        """Rebuild a client saved by :meth:`to_state`.

        Raises
        ------
        ProtocolError
            The state is malformed or from another protocol version.
        """
        client = _load_state(state, stats)
        client._encode = encode
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
        expected = {"ready": AdvertiseRequest, "advertised": ShareRequest,
                    "shared": MaskRequest, "masked": UnmaskRequest}.get(self.state)
        if expected is None or not isinstance(request, expected):
            raise self._refuse(
                f"a {type(request).__name__} in state {self.state!r} (out of order or replayed)"
            )
        if self.state != "ready" and request.round_id != self._round:
            raise self._refuse("a request from another round (replayed)")
        if isinstance(request, AdvertiseRequest):
            return self._advertise(request)
        if isinstance(request, ShareRequest):
            return self._share(request)
        if isinstance(request, MaskRequest):
            return self._masked_input(request)
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
        if self.meta.clip_norm != self._params.clip_norm:
            got = "no clipping" if self.meta.clip_norm is None else f"R={self.meta.clip_norm:g}"
            raise self._refuse(
                f"a round with clipping bound R={self._params.clip_norm:g}: its statistics were "
                f"computed with {got}"
            )
        self._round = req.round_id
        self._enc, self._mask = cr.KeyPair.generate(), cr.KeyPair.generate()
        self.state = "advertised"
        return AdvertiseKeys(**self._header("advertise"),  # type: ignore[arg-type]
                             enc_public=self._enc.public, mask_public=self._mask.public,
                             meta=json.dumps(self.meta.to_dict(), sort_keys=True))

    # ------------------------------------------------------------------ stage 2
    def _share(self, req: ShareRequest) -> ShareKeys:
        assert self._params is not None and self._enc is not None and self._mask is not None
        ids = [e.client for e in req.roster]
        mine = [e for e in req.roster if e.client == self.client_id]
        if len(set(ids)) != len(ids) or len(mine) != 1:
            raise self._refuse("a roster with duplicate clients or without this client")
        if (mine[0].enc_public, mine[0].mask_public) != (self._enc.public, self._mask.public):
            raise self._refuse("a roster that relays other keys for this client")
        if len(ids) < self._params.threshold:
            raise self._refuse(
                f"a roster of {len(ids)} clients, below the threshold {self._params.threshold}"
            )
        topo = Topology.build(req.roster, self._params, self._round)
        self._topology = topo
        self._roster = {e.client: e for e in req.roster}
        self._seed = cr.random_seed()
        holders = topo.holders(self.client_id)
        xs = [topo.point(h) for h in holders]
        t_s = self._params.share_threshold
        seed_sh = shamir.share_secret(self._seed, xs, t_s)
        key_sh = shamir.share_secret(self._mask.private, xs, t_s)
        sealed = []
        for holder, s_b, s_k in zip(holders, seed_sh, key_sh, strict=True):
            if holder == self.client_id:
                self._held[holder] = (s_b, s_k)
                continue
            key = cr.derive_key(
                cr.agree(self._enc.private, self._roster[holder].enc_public), b"share", self._round
            )
            box = cr.aead_encrypt(key, s_b + s_k, share_aad(self._round, self.client_id, holder))
            sealed.append(SealedShare(self.client_id, holder, box))
        self.state = "shared"
        return ShareKeys(**self._header("share"),  # type: ignore[arg-type]
                         shares=tuple(sealed),
                         seed_commitment=seed_commitment(self._round, self.client_id, self._seed))

    # ------------------------------------------------------------------ stage 3
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
        complaints = self._open_shares(req.shares, sharers)
        self.complaints_ = tuple(sorted(complaints.items()))
        stats = self._stats() if callable(self._stats) else self._stats
        if stats.meta.differences(self.meta):
            raise self._refuse(
                "to mask statistics whose metadata differs from what it advertised"
            )
        if self._encode is None:
            vector = self._params.codec.encode(stats)
        else:
            vector = np.asarray(self._encode(stats, self._params))
            length = self._params.codec.length(self.meta)
            if vector.dtype != np.uint64 or vector.shape != (length,):
                raise self._refuse(f"an encoder output other than {length} uint64 words")
        del stats
        vector += cr.mask_words(self._seed, vector.size)
        for other in sorted(topo.neighbours(self.client_id) & sharers):
            shared = cr.agree(self._mask.private, self._roster[other].mask_public)
            words = cr.mask_words(cr.derive_key(shared, b"mask", self._round), vector.size)
            if topo.sign(self.client_id, other) > 0:
                vector += words
            else:
                vector -= words
        self._stats = _spent
        self.state = "masked"
        return MaskedInput(**self._header("mask"),  # type: ignore[arg-type]
                           vector=vector, complaints=self.complaints_)

    def _open_shares(self, boxes: tuple[SealedShare, ...],
                     sharers: frozenset[str]) -> dict[str, str]:
        assert self._topology is not None and self._enc is not None
        expected = self._topology.neighbours(self.client_id) & sharers
        complaints: dict[str, str] = {}
        seen: set[str] = set()
        for box in boxes:
            if box.recipient != self.client_id or box.sender not in expected or box.sender in seen:
                if box.sender in expected:
                    complaints[box.sender] = "sent a share that is misaddressed or repeated"
                continue
            seen.add(box.sender)
            key = cr.derive_key(
                cr.agree(self._enc.private, self._roster[box.sender].enc_public), b"share",
                self._round,
            )
            plain = cr.aead_decrypt(key, box.sealed,
                                    share_aad(self._round, box.sender, self.client_id))
            if plain is None or len(plain) != SHARE_PLAINTEXT_BYTES:
                complaints[box.sender] = (
                    f"its encrypted share for {self.client_id!r} failed authentication "
                    "(tampered, or encrypted under a wrong key)"
                )
                continue
            half = SHARE_PLAINTEXT_BYTES // 2
            self._held[box.sender] = (plain[:half], plain[half:])
        for missing in sorted(expected - seen - set(complaints)):
            complaints[missing] = f"sent no share to its neighbour {self.client_id!r}"
        return complaints

    # ------------------------------------------------------------------ stage 4
    def _unmask(self, req: UnmaskRequest) -> UnmaskShares:
        assert self._params is not None and self._topology is not None
        survivors, dropped = frozenset(req.survivors), frozenset(req.dropped)
        if survivors & dropped or not (survivors | dropped) <= self._sharers:
            raise self._refuse(
                "an unmask request whose survivors and dropped clients overlap or were not "
                "sharers (revealing both secrets of a client would unmask its input)"
            )
        if self.client_id not in survivors or len(survivors) < self._params.threshold:
            raise self._refuse(
                f"to unmask a sum over {len(survivors)} clients, below the threshold "
                f"{self._params.threshold}"
            )
        mine = self._topology.neighbours(self.client_id) | {self.client_id}
        seeds = tuple((u, self._held[u][0]) for u in sorted(survivors & mine) if u in self._held)
        keys = tuple((u, self._held[u][1]) for u in sorted(dropped & mine) if u in self._held)
        self.state = "done"
        return UnmaskShares(**self._header("unmask"),  # type: ignore[arg-type]
                            seed_shares=seeds, key_shares=keys)


def _save_state(client: SecAggClient) -> dict[str, StateValue]:
    out: dict[str, StateValue] = {
        "version": PROTOCOL_VERSION, "client_id": client.client_id, "state": client.state,
        "meta": json.dumps(client.meta.to_dict(), sort_keys=True), "round": client._round,
        "seed": client._seed, "sharers": sorted(client._sharers),
        "complaints": [f"{c}\n{why}" for c, why in client.complaints_],
        "params": json.dumps(client._params.to_dict()) if client._params else "",
    }
    for name in ("enc", "mask"):
        pair = getattr(client, f"_{name}")
        out[f"{name}_private"] = pair.private if pair else b""
        out[f"{name}_public"] = pair.public if pair else b""
    entries = list(client._roster.values())
    out["roster_clients"] = [e.client for e in entries]
    out["roster_enc"] = [e.enc_public for e in entries]
    out["roster_mask"] = [e.mask_public for e in entries]
    out["held_owners"] = list(client._held)
    out["held_seed"] = [v[0] for v in client._held.values()]
    out["held_key"] = [v[1] for v in client._held.values()]
    return out


def _load_state(state: dict[str, Any], stats: StatsSource) -> SecAggClient:
    from ghofl.stats.meta import StatsMeta as _Meta

    try:
        if state["version"] != PROTOCOL_VERSION:
            raise ValueError(f"protocol version {state['version']!r}")
        meta = _Meta.from_dict(json.loads(state["meta"]))
        client = SecAggClient(str(state["client_id"]), stats, meta=meta)
        client.state = state["state"]
        client._round = bytes(state["round"])
        client._seed = bytes(state["seed"])
        client._sharers = frozenset(str(c) for c in state["sharers"])
        client.complaints_ = tuple(tuple(c.split("\n", 1)) for c in state["complaints"])  # type: ignore[misc]
        if state["params"]:
            params = json.loads(state["params"])
            client._params = SessionParams(**params)
        for name in ("enc", "mask"):
            if state[f"{name}_private"]:
                setattr(client, f"_{name}", cr.KeyPair(bytes(state[f"{name}_private"]),
                                                        bytes(state[f"{name}_public"])))
        client._roster = {
            c: RosterEntry(c, bytes(e), bytes(m))
            for c, e, m in zip(state["roster_clients"], state["roster_enc"],
                               state["roster_mask"], strict=True)
        }
        if client._roster and client._params is not None:
            client._topology = Topology.build(tuple(client._roster.values()), client._params,
                                              client._round)
        client._held = {
            str(o): (bytes(b), bytes(k))
            for o, b, k in zip(state["held_owners"], state["held_seed"], state["held_key"],
                               strict=True)
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(
            f"the saved client state is malformed or from another version ({exc!r}); the "
            "client cannot resume this round"
        ) from exc
    if client.state not in ("ready", "advertised", "shared", "masked", "done", "failed"):
        raise ProtocolError(f"the saved client state names an unknown state {client.state!r}")
    return client


def _spent() -> ClientStats:
    raise ProtocolError("this client's statistics were already masked and sent once")

