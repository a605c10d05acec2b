"""The bytes model of the secure protocol (ghofl.secure.cost) against real rounds in process.

Every id in these rounds has the same length, so the model is exact: each term must equal,
to the byte, what the in-memory transport records (message_nbytes of every request and reply).
"""

from __future__ import annotations

import pytest

from ghofl.errors import ConfigError
from ghofl.secure import InMemoryTransport, SecAggClient, SecAggConfig, SecAggServer
from ghofl.secure.config import SessionParams
from ghofl.secure.cost import (
    hierarchical_bytes,
    metadata_bytes,
    round_bytes,
    session_bytes,
)
from ghofl.secure.hierarchy import (
    HierarchicalReport,
    Region,
    partition_regions,
    region_codec,
    region_encoder,
    run_hierarchical,
)
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.messages import SECURE_STAGES
from ghofl.secure.protocol import run_aggregation
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from tests.helpers import gaussian_mixture, policy_for

CLIP = 6.0
#: Weaker targets, under which small rounds may run on sparse graphs.
LAX = {"corrupt_fraction": 0.1, "dropout_fraction": 0.1, "sigma": 8.0, "eta": 8.0}


def _config(neighbours: int | None) -> SecAggConfig:
    """The default config, or a sparse graph of ``neighbours`` under the weaker targets."""
    if neighbours is None:
        return SecAggConfig(clip_norm=CLIP)
    return SecAggConfig(clip_norm=CLIP, neighbours=neighbours, **LAX)  # type: ignore[arg-type]


def _stats(i: int) -> ClientStats:
    x, y = gaussian_mixture(i, 3, 4, n=20)
    return compute_stats(x, y, 3, "pooled", clip_norm=CLIP)


@pytest.mark.parametrize(("n", "neighbours", "authenticated", "drops"), [
    (8, None, True, 0),
    (30, None, True, 0),
    (30, 10, True, 3),
    (12, 4, False, 2),
])
def test_flat_round_every_stage_to_the_byte(n: int, neighbours: int | None,
                                            authenticated: bool, drops: int) -> None:
    cfg = _config(neighbours)
    ids = [f"c{i:04d}" for i in range(n)]
    keys = {c: IdentityKey.generate() for c in ids}
    roster = Roster.from_identities(keys) if authenticated else None
    policy = policy_for(cfg, allow_unauthenticated=not authenticated)
    clients = [SecAggClient(c, _stats(i), identity=keys[c] if roster else None, roster=roster,
                            policy=policy, ledger=None)  # type: ignore[arg-type]
               for i, c in enumerate(ids)]
    server = SecAggServer(cfg, clients[0].meta, ids, roster=roster)
    transport = InMemoryTransport(clients, {"mask": drops}, seed=3)
    report = run_aggregation(server, transport)
    model = session_bytes(server.params, clients[0].meta, id_bytes=5, dropped=drops,
                          authenticated=authenticated)
    gone = set(transport.vanished)
    assert len(gone) == drops and model.degree == len(server._topology.neighbours(ids[0]))  # type: ignore[union-attr]
    for stage in SECURE_STAGES:
        traffic = transport.traffic[stage]
        stayed = set(ids) - gone
        assert {traffic.from_client[c] for c in stayed} == {model.client_sent[stage]}
        assert {traffic.to_client[c] for c in stayed} == {model.client_received[stage]}
    for c in gone:
        assert sum(transport.traffic[s].from_client.get(c, 0) for s in SECURE_STAGES) == (
            model.dropped_sent)
        assert sum(transport.traffic[s].to_client.get(c, 0) for s in SECURE_STAGES) == (
            model.dropped_received)
    assert sum(s.server_sent_bytes for s in report.stages.values()) == model.server_sent
    assert sum(s.server_received_bytes for s in report.stages.values()) == model.server_received


def test_the_threshold_changes_no_size_and_the_degree_is_the_graphs() -> None:
    base = round_bytes(40, 12, 100, threshold=21)
    assert round_bytes(40, 12, 100, threshold=35) == base
    assert round_bytes(40, 11, 100).degree == 12  # rounded up to even, as the graph is
    assert round_bytes(41, 39, 100).degree == 40  # rounded up to n - 1: the complete graph
    assert base.client_sent["mask"] - round_bytes(40, 12, 1).client_sent["mask"] == 8 * 99


def _run_regions(n: int, size: int, config: SecAggConfig) -> HierarchicalReport:
    ids = [f"c{i:04d}" for i in range(n)]
    encode = region_encoder(region_codec(config, n))
    policy = policy_for(config)
    rosters: dict[str, Roster] = {}

    def transport(region: Region) -> InMemoryTransport:
        keys = {c: IdentityKey.generate() for c in region.clients}
        rosters[region.name] = Roster.from_identities(keys)
        return InMemoryTransport([
            SecAggClient(c, _stats(int(c[1:])), encode=encode, identity=keys[c],
                         roster=rosters[region.name], policy=policy,  # type: ignore[arg-type]
                         ledger=None)
            for c in region.clients])

    return run_hierarchical(config, _stats(0).meta, partition_regions(ids, n // size),
                            transport, rosters=rosters, server_half=SecAggServer)


@pytest.mark.parametrize(("n", "size", "neighbours"), [
    (30, 10, None),  # 3 regions of 10
    (30, 7, None),  # 4 regions: 8, 8, 7, 7
    (30, 7, 4),  # a sparser graph in every region
    (24, 12, 6),  # 2 regions
])
def test_hierarchical_run_every_party_to_the_byte(n: int, size: int,
                                                  neighbours: int | None) -> None:
    config = _config(neighbours)
    report = _run_regions(n, size, config)
    meta = _stats(0).meta
    model = hierarchical_bytes(n, size, region_codec(config, n).length(meta), config,
                               id_bytes=5, meta_bytes=metadata_bytes(meta))
    done = [o.report for o in report.regions.values() if o.report is not None]
    assert model.regions == len(done) == len(report.regions)
    sent = sum(s.server_received_bytes for r in done for s in r.stages.values())
    received = sum(s.server_sent_bytes for r in done for s in r.stages.values())
    assert sent / n == pytest.approx(model.client_sent, rel=1e-12)
    assert received / n == pytest.approx(model.client_received, rel=1e-12)
    assert received / model.regions == pytest.approx(model.region_server_sent, rel=1e-12)
    assert sent / model.regions == pytest.approx(model.region_server_received, rel=1e-12)
    top = report.top.stages.values()
    assert sum(s.client_sent_bytes_mean for s in top) == model.top.client_sent_total
    assert sum(s.client_received_bytes_mean for s in top) == model.top.client_received_total
    assert sum(s.server_sent_bytes for s in top) == model.top_server_sent
    assert sum(s.server_received_bytes for s in top) == model.top_server_received


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"clients": 1}, r"at least 2 clients; got clients=1"),
    ({"neighbours": 40}, r"neighbours k=40 is outside 1 to n - 1 = 39 for n=40"),
    ({"neighbours": 0}, r"neighbours k=0 is outside 1 to n - 1"),
    ({"words": 0}, r"at least 1 word; got words=0"),
    ({"threshold": 41}, r"threshold t=41 is outside 2 to n = 40"),
    ({"dropped": 20}, r"dropped=20 is outside 0 to n - t = 13: with fewer than t=27"),
    ({"id_bytes": 0}, r"bytes per id must be at least 1.*id_bytes=0"),
])
def test_round_bytes_refuses_bad_sizes(kwargs: dict[str, int], match: str) -> None:
    args = {"clients": 40, "neighbours": 12, "words": 100, **kwargs}
    with pytest.raises(ConfigError, match=match):
        round_bytes(args.pop("clients"), args.pop("neighbours"), args.pop("words"),
                    **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "size"), [(30, 1), (30, 16)])
def test_hierarchical_bytes_refuses_a_bad_region_size(n: int, size: int) -> None:
    with pytest.raises(ConfigError, match=rf"region_size S={size} is outside 2 to n // 2 = 15"):
        hierarchical_bytes(n, size, 10, SecAggConfig(clip_norm=CLIP))


def test_session_bytes_refuses_noise_levels() -> None:
    params = SessionParams(30, 21, 22, 1000, CLIP, 2, release_points=(25, 30))
    with pytest.raises(ConfigError, match=r"leaves out the dropout ladder.*this round has 2"):
        session_bytes(params, _stats(0).meta)
