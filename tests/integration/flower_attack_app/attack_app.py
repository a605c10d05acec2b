"""Test-only Flower app: a malicious ServerApp against ghofl's ClientApp, through Flower.

The ServerApp (``server``) binds the simulated nodes to the federation's roster (the signed
identity exchange of ``ghofl.secure.binding``), then runs four secure rounds over ghofl's
:class:`~ghofl.integrations.flower.transport.FlowerTransport`, so every request and reply
crosses Flower's own message path (records, the SuperLink, Ray workers):

``honest``
    The protocol as written: the exact sum is saved as ``honest.ghs``.
``key_substitution``
    A relay between the server and the transport swaps the victim's relayed keys, in every
    other node's share request, for keys it holds (keeping the victim's signature).
``split_view``
    The server tells two nodes that the victim dropped and the others that it survived, to
    collect shares of both of the victim's secrets, and keeps every consistency signature.
``lax_params``
    The server asks for threshold 2 (a sum over two clients).

Every reply the attacker relays is recorded; ``results.json`` in ``out-dir`` holds, per
round, its outcome, the nodes' refusals by stage and what the attacker holds (shares sealed
to the victim, masked inputs, unmask shares).

The ClientApp (``client``) is ghofl's own handler,
:func:`ghofl.integrations.flower.client_app.handle_query`, with each node's identity files
added to its node config from the run config key ``identities`` (the simulation engine gives
nodes no node config of their own): node ``i`` holds ``site-<i>.key`` and ``roster.json``.
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

from ghofl.client.job import ClientJob
from ghofl.errors import AggregationAbortedError
from ghofl.files import write_json_atomic
from ghofl.integrations.flower import QUERY_ACTION
from ghofl.integrations.flower._config import job_meta
from ghofl.integrations.flower.client_app import handle_query
from ghofl.integrations.flower.server_app import RESULTS, wait_for_nodes
from ghofl.integrations.flower.transport import FlowerTransport
from ghofl.secure import SecAggConfig, SecAggServer, run_aggregation
from ghofl.secure import primitives as cr
from ghofl.secure.binding import bind_addresses, hello_request
from ghofl.secure.identity import Roster
from ghofl.secure.messages import (
    ClientMessage,
    MaskedInput,
    ServerMessage,
    ShareKeys,
    ShareRequest,
    Stage,
    UnmaskShares,
)
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
                "roster": str(folder / "roster.json")}
    ctx = Context(context.run_id, context.node_id, node_cfg, context.state,
                  context.run_config)
    return Message(handle_query(msg.content, ctx), reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Bind the nodes, run the four rounds and write ``results.json`` (see the module)."""
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
        if not isinstance(req, ShareRequest) or client_id == victim:
            return req
        roster = tuple(dataclasses.replace(e, enc_public=evil_enc.public,
                                           mask_public=evil_mask.public)
                       if e.client == victim else e for e in req.roster)
        return dataclasses.replace(req, roster=roster)
    return swap


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
    job = ClientJob.from_config(cfg)
    assert job.clip_norm is not None
    meta = job_meta(job, int(cfg["dim"]))
    config = SecAggConfig(clip_norm=job.clip_norm)
    results: dict[str, Any] = {"bound": sorted(ids), "identity_problems": problems}

    def run(name: str, half: SecAggServer, rewrite: Any = None, victim: str = "") -> None:
        results[name] = _round(half, Relay(FlowerTransport(grid, ids, timeout), rewrite), victim)

    run("honest", _server(SecAggServer, config, meta, roster))
    total = results["honest"].pop("total", None)
    if total is not None:
        save_stats(total, out_dir / "honest.ghs")
    run("key_substitution", _server(SecAggServer, config, meta, roster),
        _swap_victim_keys(KEY_VICTIM), KEY_VICTIM)
    run("split_view", _server(SplitViewServer, config, meta, roster), victim=SPLIT_VICTIM)
    lax = SecAggConfig(clip_norm=job.clip_norm, threshold=2)
    run("lax_params", _server(SecAggServer, lax, meta, roster))
    for name in ("key_substitution", "split_view", "lax_params"):
        results[name].pop("total", None)
    return results


def _server(cls: type[SecAggServer], config: SecAggConfig, meta: StatsMeta,
            roster: Roster) -> SecAggServer:
    return cls(config, meta, roster=roster, record_view=True)
