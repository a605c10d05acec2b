"""Test-only Flower app: a malicious ServerApp against ghofl's ClientApp, through Flower.

The ServerApp (``server``) binds the simulated nodes to the federation's roster (the signed
identity exchange of ``ghofl.secure.binding``), then runs six secure rounds (protocol
version 3) over ghofl's :class:`~ghofl.integrations.flower.transport.FlowerTransport`, so
every request and reply crosses Flower's own message path (records, the SuperLink, Ray
workers):

``honest``
    The protocol as written: the exact sum is saved as ``honest.ghs``.
``key_substitution``
    A relay between the server and the transport swaps the victim's relayed keys, in every
    other node's reveal request (the relayed roster), for keys it holds (keeping the victim's
    signature).
``split_view``
    The server tells two nodes that the victim dropped and the others that it survived, to
    collect shares of both of the victim's secrets, and keeps every consistency signature.
``forced_complaints``
    The relay withholds one share box from each node's mask request (in protocol version 2
    this made every client complain and hand over its private key). The attacker then tries
    every 32-byte value any node sent in the round, as a pair key and as an X25519 private
    key, on every share box it relayed (``boxes_opened``).
``lax_params``
    The server asks for threshold 2 (a sum over two clients).
``replay``
    The server reruns a round under the honest round's id (to difference the totals).

``session_binding`` (a pure check, no round): the consistency signatures the honest round
collected, verified against that round's consistency transcript and against the split-view
round's (same roster, same survivor set, another session).

Every reply the attacker relays is recorded; ``results.json`` in ``out-dir`` holds, per
round, its outcome, the nodes' refusals by stage and what the attacker holds (shares sealed
to the victim, masked inputs, unmask shares).

The ClientApp (``client``) is ghofl's own handler,
:func:`ghofl.integrations.flower.client_app.handle_query`, with each node's identity files
added to its node config from the run config key ``identities`` (a test shortcut: a real
node never takes its identity from the server's run config): node ``i`` holds
``site-<i>.key`` and ``roster.json``, and allows repeated rounds over its data (its ledger
lies beside its data, under the test's temporary folder).
"""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from ghofl.errors import AggregationAbortedError
from ghofl.files import write_json_atomic
from ghofl.integrations.flower import QUERY_ACTION
from ghofl.integrations.flower._config import job_meta
from ghofl.integrations.flower.client_app import handle_query
from ghofl.integrations.flower.server_app import RESULTS, wait_for_nodes
from ghofl.integrations.flower.transport import FlowerTransport
from ghofl.secure import SecAggConfig, SecAggServer, run_aggregation
from ghofl.secure import primitives as cr
from ghofl.secure._common import consistency_transcript, pair_key, share_aad
from ghofl.secure.binding import bind_addresses, hello_request
from ghofl.secure.identity import Roster, verify_signature
from ghofl.secure.messages import (
    AdvertiseKeys,
    ClientMessage,
    ConsistencySignature,
    MaskedInput,
    MaskRequest,
    RevealRequest,
    SealedShare,
    ServerMessage,
    ShareKeys,
    Stage,
    UnmaskShares,
)
from ghofl.server.config import plan_from_config
from ghofl.stats.codec import save_stats
from ghofl.stats.meta import StatsMeta

#: The victim of each attack, and the nodes the split view fools.
KEY_VICTIM = "site-1"
SPLIT_VICTIM = "site-0"
FOOLED = ("site-1", "site-2")

client = ClientApp()
server = ServerApp()


@client.query(QUERY_ACTION)
def query(msg: Message, context: Context) -> Message:
    """Answer with ghofl's handler, the node holding ``site-<partition id>``'s identity."""
    folder = Path(str(context.run_config["identities"]))
    part = context.node_config["partition-id"]
    node_cfg = {**context.node_config, "identity-key": str(folder / f"site-{part}.key"),
                "roster": str(folder / "roster.json"),
                "allow-repeat-rounds": True}  # several rounds over the same data, on purpose
    ctx = Context(context.run_id, context.node_id, node_cfg, context.state,
                  context.run_config)
    return Message(handle_query(msg.content, ctx), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Bind the nodes, run the six rounds and write ``results.json`` (see the module)."""
    cfg = dict(context.run_config)
    out_dir = Path(str(cfg["out-dir"]))
    try:
        results: dict[str, Any] = {"status": "ok", **_rounds(grid, cfg, out_dir)}
    except BaseException as exc:  # the test reads the failure from results.json
        results = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=8)}
    write_json_atomic(out_dir / RESULTS, results, default=str)


class Relay:
    """The attacker in the middle: rewrites requests, records every reply it relays.

    Parameters
    ----------
    inner : FlowerTransport
    rewrite : callable, optional
        ``(client, request) -> request`` applied to every request (default: none).
    """

    def __init__(self, inner: FlowerTransport,
                 rewrite: Callable[[str, ServerMessage], ServerMessage] | None = None) -> None:
        self.inner, self.rewrite = inner, rewrite
        self.traffic = inner.traffic
        self.seen: list[tuple[str, str, ClientMessage]] = []

    def exchange(self, stage: Stage, requests: Mapping[str, ServerMessage]
                 ) -> Iterator[tuple[str, ClientMessage]]:
        """Relay one stage (see :class:`~ghofl.secure.transport.Transport`)."""
        sent = {c: self.rewrite(c, r) if self.rewrite else r for c, r in requests.items()}
        for client_id, msg in self.inner.exchange(stage, sent):
            self.seen.append((stage, client_id, msg))
            yield client_id, msg

    def holdings(self, victim: str) -> dict[str, Any]:
        """The stages run, and what the attacker received that concerns ``victim``."""
        return {
            "stages": list(self.traffic),
            "shares_sealed_to_victim": sum(
                1 for _, c, m in self.seen if isinstance(m, ShareKeys) and c != victim
                for share in m.shares if share.recipient == victim),
            "masked_inputs": sorted(c for _, c, m in self.seen if isinstance(m, MaskedInput)),
            "unmask_shares": sorted(c for _, c, m in self.seen if isinstance(m, UnmaskShares)),
            "victim_shares_released": sum(
                1 for _, _, m in self.seen if isinstance(m, UnmaskShares)
                for owner, _ in (*m.seed_shares, *m.key_shares) if owner == victim),
        }


class SplitViewServer(SecAggServer):
    """An active server: the :data:`FOOLED` nodes are told :data:`SPLIT_VICTIM` dropped (to
    collect shares of its mask key), the others that it survived (shares of its self-mask
    seed); every consistency signature is kept, whatever set it is on."""

    def requests(self) -> dict[str, ServerMessage]:
        """The honest requests, with the fooled nodes' survivor sets split."""
        out = super().requests()
        if self.state in ("consistency", "unmask"):
            for c in FOOLED:
                req = out[c] if c in out else next(iter(out.values()))
                surv = tuple(s for s in self._survivors if s != SPLIT_VICTIM)
                out[c] = dataclasses.replace(req, survivors=surv,  # type: ignore[call-arg]
                                             dropped=(*self._gone, SPLIT_VICTIM))
        return out

    def _check_consistency(self, client: str, msg: Any) -> str | None:
        return None

    def _after_consistency(self, accepted: dict[str, Any]) -> None:
        self._signers = {c: m.signature for c, m in accepted.items()}
        self.state = "unmask"


def _swap_victim_keys(victim: str) -> Callable[[str, ServerMessage], ServerMessage]:
    evil_enc, evil_mask = cr.KeyPair.generate(), cr.KeyPair.generate()

    def swap(client_id: str, req: ServerMessage) -> ServerMessage:
        if not isinstance(req, RevealRequest) or client_id == victim:
            return req
        roster = tuple(dataclasses.replace(e, enc_public=evil_enc.public,
                                           mask_public=evil_mask.public)
                       if e.client == victim else e for e in req.roster)
        return dataclasses.replace(req, roster=roster)
    return swap


class Withhold:
    """Rewrite: drop the first share box of each node's mask request (``withheld``: for each
    node, the sender of the box it never received)."""

    def __init__(self) -> None:
        self.withheld: dict[str, str] = {}

    def __call__(self, client_id: str, req: ServerMessage) -> ServerMessage:
        if not isinstance(req, MaskRequest) or not req.shares:
            return req
        self.withheld[client_id] = req.shares[0].sender
        return dataclasses.replace(req, shares=req.shares[1:])


def _values(msg: Any) -> Iterator[bytes]:
    """Every bytes value in a message, through its fields and tuples."""
    if isinstance(msg, bytes):
        yield msg
    elif isinstance(msg, tuple):
        for item in msg:
            yield from _values(item)
    elif dataclasses.is_dataclass(msg) and not isinstance(msg, type):
        for f in dataclasses.fields(msg):
            yield from _values(getattr(msg, f.name))


def _open_boxes(boxes: list[SealedShare], candidates: set[bytes],
                enc_public: Mapping[str, bytes], session: bytes) -> int:
    """How many of ``boxes`` the attacker opens with ``candidates``.

    Each candidate is tried as the box's pair key, and as an X25519 private key agreeing with
    the relayed encryption key of the box's sender (the recipient's secret) or of its
    recipient (the sender's), through :func:`~ghofl.secure._common.pair_key`.
    """
    opened = 0
    for box in boxes:
        aad = share_aad(session, box.sender, box.recipient)
        keys = set(candidates)
        for c in candidates:
            for peer in (box.sender, box.recipient):
                if peer in enc_public:
                    try:
                        shared = cr.agree(c, enc_public[peer])
                    except ValueError:
                        continue
                    keys.add(pair_key(shared, session, box.sender, box.recipient))
        opened += any(cr.aead_decrypt(k, box.sealed, aad) is not None for k in keys)
    return opened


def _opener_self_check() -> list[int]:
    """Boxes :func:`_open_boxes` opens of one box sealed as a client seals it: given the
    recipient's private key, given the pair key, given neither (expected ``[1, 1, 0]``)."""
    a, b, session = cr.KeyPair.generate(), cr.KeyPair.generate(), cr.random_seed()
    key = pair_key(a.agree(b.public), session, "s", "r")
    box = SealedShare("s", "r", cr.aead_encrypt(key, b"shares", share_aad(session, "s", "r")),
                      b"", b"")
    publics = {"s": a.public, "r": b.public}
    return [_open_boxes([box], cands, publics, session)
            for cands in ({b.private}, {key}, {a.public, b.public})]


def _forced_complaints_holdings(relay: Relay, half: SecAggServer,
                                withhold: Withhold) -> dict[str, Any]:
    """What the attacker opens after withholding a box from every node (see the module)."""
    boxes = [b for _, _, m in relay.seen if isinstance(m, ShareKeys) for b in m.shares]
    enc_public = {c: m.enc_public for _, c, m in relay.seen if isinstance(m, AdvertiseKeys)}
    late = {v for stage, _, m in relay.seen if stage in ("mask", "consistency", "unmask")
            for v in _values(m) if len(v) == cr.KEY_BYTES}
    every = {v for _, _, m in relay.seen for v in _values(m) if len(v) == cr.KEY_BYTES}
    return {"withheld": dict(withhold.withheld), "boxes_relayed": len(boxes),
            "values_sent_at_mask_or_later": len(late), "values_sent_in_round": len(every),
            "boxes_opened": _open_boxes(boxes, late | every, enc_public, half.session),
            "opener_self_check": _opener_self_check()}


def _session_binding(roster: Roster, honest: SecAggServer, honest_relay: Relay,
                     other: SecAggServer) -> dict[str, Any]:
    """The honest round's consistency signatures, checked in their run and in another."""
    sigs = {c: m.signature for _, c, m in honest_relay.seen
            if isinstance(m, ConsistencySignature)}
    fp = roster.fingerprint()
    survivors = tuple(honest.survivors)
    dropped = tuple(c for c in honest.clients if c not in survivors)

    def valid(session: bytes) -> int:
        statement = consistency_transcript(session, fp, survivors, dropped)
        return sum(verify_signature(roster.public(c), sig, statement) for c, sig in sigs.items())

    return {"signatures": len(sigs), "valid_in_own_run": valid(honest.session),
            "valid_in_other_run": valid(other.session),
            "sessions_differ": bool(other.session) and honest.session != other.session}


def _round(server_half: SecAggServer, relay: Relay, victim: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        report = run_aggregation(server_half, relay)
    except AggregationAbortedError as exc:
        out.update(status="aborted", error=str(exc))
    else:
        out.update(status="ok", survivors=list(report.survivors), params=report.params,
                   total=report.total)
    out["refused"] = {s: dict(t.refused) for s, t in relay.traffic.items() if t.refused}
    out.update(relay.holdings(victim))
    return out


def _rounds(grid: Grid, cfg: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    roster = Roster.load(Path(str(cfg["identities"])) / "roster.json")
    timeout = float(cfg["stage-timeout-s"])
    nodes = wait_for_nodes(grid, len(roster), float(cfg["wait-timeout-s"]))
    addresses = {f"node-{n}": n for n in nodes}
    request = hello_request(roster)
    bound, problems = bind_addresses(request, FlowerTransport(grid, addresses, timeout).exchange(
        "hello", dict.fromkeys(addresses, request)), roster)
    ids = {name: addresses[address] for name, address in bound.items()}
    job = plan_from_config(cfg).client
    assert job.clip_norm is not None
    meta = job_meta(job, int(cfg["dim"]))
    config = SecAggConfig(clip_norm=job.clip_norm)
    results: dict[str, Any] = {"bound": sorted(ids), "identity_problems": problems}

    def run(name: str, half: SecAggServer, rewrite: Any = None, victim: str = "") -> Relay:
        relay = Relay(FlowerTransport(grid, ids, timeout), rewrite)
        results[name] = _round(half, relay, victim)
        results[name]["round_id"] = half.round_id.hex()
        return relay

    honest = _server(SecAggServer, config, meta, roster)
    honest_relay = run("honest", honest)
    total = results["honest"].pop("total", None)
    if total is not None:
        save_stats(total, out_dir / "honest.ghs")
    run("key_substitution", _server(SecAggServer, config, meta, roster),
        _swap_victim_keys(KEY_VICTIM), KEY_VICTIM)
    split = _server(SplitViewServer, config, meta, roster)
    run("split_view", split, victim=SPLIT_VICTIM)
    forced, withhold = _server(SecAggServer, config, meta, roster), Withhold()
    relay = run("forced_complaints", forced, withhold)
    results["forced_complaints"].update(_forced_complaints_holdings(relay, forced, withhold))
    lax = SecAggConfig(clip_norm=job.clip_norm, threshold=2)
    run("lax_params", _server(SecAggServer, lax, meta, roster))
    run("replay", _server(SecAggServer, config, meta, roster, round_id=honest.round_id))
    results["session_binding"] = _session_binding(roster, honest, honest_relay, split)
    for name in ("key_substitution", "split_view", "forced_complaints", "lax_params", "replay"):
        results[name].pop("total", None)
    return results


def _server(cls: type[SecAggServer], config: SecAggConfig, meta: StatsMeta,
            roster: Roster, round_id: bytes | None = None) -> SecAggServer:
    return cls(config, meta, roster=roster, record_view=True, round_id=round_id)
