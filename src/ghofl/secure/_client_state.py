"""Saving and restoring a :class:`~ghofl.secure.client.SecAggClient` between stages.

The client's round state as a flat dictionary of bytes, text, integers and lists of them (what
Flower's ``context.state`` holds, where each message may reach a fresh process). It holds the
client's secrets: it stays on the client.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ghofl.errors import ProtocolError
from ghofl.secure import primitives as cr
from ghofl.secure._common import Topology, split_levels
from ghofl.secure.config import SessionParams
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.messages import PROTOCOL_VERSION, RosterEntry
from ghofl.secure.policy import ClientPolicy
from ghofl.secure.vectors import VECTOR_FORMAT, VectorMeta, VectorPayload
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta

if TYPE_CHECKING:  # pragma: no cover
    from ghofl.secure.client import SecAggClient

__all__ = ["STATES", "StateValue", "StatsSource", "load_state", "save_state"]

#: The states of a client, in protocol order (see :mod:`ghofl.secure.client`).
STATES = ("ready", "advertised", "revealed", "shared", "masked", "signed", "done", "failed")
#: The statistics (or the vectors of a vector round) of a client, or a function computing
#: them when the masked input is due.
StatsSource = (ClientStats | VectorPayload | Callable[[], ClientStats]
               | Callable[[], VectorPayload])
#: A value of a saved client state.
StateValue = bytes | str | int | list[str] | list[bytes]


def save_state(client: SecAggClient) -> dict[str, StateValue]:
    """Everything ``client`` must remember between stages (see ``to_state``)."""
    out: dict[str, StateValue] = {
        "version": PROTOCOL_VERSION, "client_id": client.client_id, "state": client.state,
        "meta": json.dumps(client.meta.to_dict(), sort_keys=True), "round": client._round,
        "seed": client._seed, "nonce": client._nonce, "session": client._session,
        "sharers": sorted(client._sharers),
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
    out["roster_nonce"] = [e.nonce_commitment for e in entries]
    out["roster_sig"] = [e.signature for e in entries]
    out["roster_fp"] = client._roster_fp
    signed = client._signed
    out["signed"] = 1 if signed is not None else 0
    out["signed_survivors"] = list(signed[0]) if signed else []
    out["signed_dropped"] = list(signed[1]) if signed else []
    out["held_owners"] = list(client._held)
    out["held_seed"] = [v[0] for v in client._held.values()]
    out["held_key"] = [v[1] for v in client._held.values()]
    out["levels"] = list(client._levels)
    out["held_levels"] = [b"".join(client._held_levels.get(o, ())) for o in client._held]
    return out


def _load_meta(text: Any) -> StatsMeta | VectorMeta:
    """The saved description of the client's payload: vectors or statistics metadata."""
    data = json.loads(text)
    if isinstance(data, dict) and data.get("format") == VECTOR_FORMAT:
        return VectorMeta.from_dict(data)
    return StatsMeta.from_dict(data)


def load_state(cls: type[SecAggClient], state: dict[str, Any], stats: StatsSource,
               identity: IdentityKey | None, roster: Roster | None,
               policy: ClientPolicy | None, allow_unauthenticated: bool) -> SecAggClient:
    """The client of class ``cls`` that :func:`save_state` saved (see ``from_state``)."""
    try:
        if state["version"] != PROTOCOL_VERSION:
            raise ValueError(f"protocol version {state['version']!r}")
        meta = _load_meta(state["meta"])
        client = cls(str(state["client_id"]), stats, meta=meta, identity=identity,
                     roster=roster, policy=policy, ledger=None,
                     allow_unauthenticated=allow_unauthenticated)
        client.state = state["state"]
        client._round = bytes(state["round"])
        client._seed = bytes(state["seed"])
        client._nonce = bytes(state["nonce"])
        client._session = bytes(state["session"])
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
            c: RosterEntry(c, bytes(e), bytes(m), bytes(n), bytes(g))
            for c, e, m, n, g in zip(state["roster_clients"], state["roster_enc"],
                                     state["roster_mask"], state["roster_nonce"],
                                     state["roster_sig"], strict=True)
        }
        client._roster_fp = bytes(state["roster_fp"])
        if state["signed"]:
            client._signed = (tuple(str(c) for c in state["signed_survivors"]),
                              tuple(str(c) for c in state["signed_dropped"]))
        if client._session and client._params is not None:
            client._topology = Topology.build(tuple(client._roster.values()), client._params,
                                              client._session)
        client._held = {
            str(o): (bytes(b), bytes(k))
            for o, b, k in zip(state["held_owners"], state["held_seed"], state["held_key"],
                               strict=True)
        }
        client._levels = tuple(bytes(e) for e in state.get("levels", []))
        owners = state["held_owners"]
        client._held_levels = {
            str(o): split_levels(bytes(v))
            for o, v in zip(owners, state.get("held_levels", [b""] * len(owners)), strict=True)}
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(
            f"the saved client state is malformed or from another version ({exc!r}); the "
            "client cannot resume this round"
        ) from exc
    if client.state not in STATES:
        raise ProtocolError(f"the saved client state names an unknown state {client.state!r}")
    return client
