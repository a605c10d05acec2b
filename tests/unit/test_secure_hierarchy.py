"""Hierarchical secure aggregation (issue 23): regions run the secure protocol, their
aggregators run one more round; the total is the flat secure total bit for bit."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import AggregationAbortedError, ConfigError
from ghofl.secure import InMemoryTransport, SecAggClient, SecAggConfig, SecAggServer
from ghofl.secure.bounds import BoundedDecoder
from ghofl.secure.config import SessionParams
from ghofl.secure.hierarchy import (
    HierarchicalReport,
    Region,
    TopRound,
    partition_regions,
    region_codec,
    region_encoder,
    run_hierarchical,
)
from ghofl.secure.identity import IdentityKey, Roster
from ghofl.secure.protocol import run_aggregation
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats, sum_stats
from ghofl.stats.meta import StatsMeta
from tests.helpers import gaussian_mixture, policy_for

CLIP = 6.0
NO_DROPS: Mapping[str, Mapping[str, int]] = {}


def _payloads(n: int, seed: int = 0) -> dict[str, ClientStats]:
    out = {}
    for i in range(n):
        x, y = gaussian_mixture(seed * 1000 + i, 3, 4, n=30)
        out[f"site-{i:03d}"] = compute_stats(x, y, 3, "pooled", clip_norm=CLIP)
    return out


def _hierarchical(payloads: dict[str, ClientStats], regions: int,
                  drops: Mapping[str, Mapping[str, int]] = NO_DROPS,
                  top: TopRound | None = None,
                  config: SecAggConfig | None = None) -> HierarchicalReport:
    cfg = config or SecAggConfig(clip_norm=CLIP)
    parts = partition_regions(list(payloads), regions)
    encode = region_encoder(region_codec(cfg, len(payloads)))
    keys = {c: IdentityKey.generate() for c in payloads}
    rosters = {r.name: Roster.from_identities({c: keys[c] for c in r.clients}) for r in parts}
    policy = policy_for(cfg)

    def transport(region: Region) -> InMemoryTransport:
        clients = [SecAggClient(c, payloads[c], encode=encode, identity=keys[c],
                                roster=rosters[region.name], policy=policy)
                   for c in region.clients]
        return InMemoryTransport(clients, drops.get(region.name), seed=7)

    meta = next(iter(payloads.values())).meta
    return run_hierarchical(cfg, meta, parts, transport, rosters=rosters, top=top,
                            server_half=SecAggServer)


def _flat_words(payloads: Mapping[str, ClientStats]) -> tuple[np.ndarray, ClientStats]:
    """The words a flat secure round over ``payloads`` unmasks, and its decoded total."""
    cfg = SecAggConfig(clip_norm=CLIP)
    words: list[np.ndarray] = []

    def decode(params: SessionParams, meta: StatsMeta, w: np.ndarray) -> ClientStats:
        words.append(w.copy())
        return BoundedDecoder()(params, meta, w)

    ids = sorted(payloads)
    keys = {c: IdentityKey.generate() for c in ids}
    roster = Roster.from_identities(keys)
    # the same clients and data as the hierarchical run compared with: no round ledger, which
    # would (rightly) refuse a second round over the same statistics
    clients = [SecAggClient(c, payloads[c], identity=keys[c], roster=roster,
                            policy=policy_for(cfg), ledger=None) for c in ids]
    meta = payloads[ids[0]].meta
    report = run_aggregation(SecAggServer(cfg, meta, ids, decode=decode, roster=roster),
                             InMemoryTransport(clients))
    return words[0], report.total


def _encoded_sum(included: Sequence[ClientStats], n: int) -> np.ndarray:
    """Σ of the included clients' words in the federation's codec (K = n), mod 2^64."""
    codec = region_codec(SecAggConfig(clip_norm=CLIP), n)
    total = np.zeros(codec.length(included[0].meta), np.uint64)
    for p in included:
        total += codec.encode(p)
    return total


def _close_to_float64_sum(total: ClientStats, included: Sequence[ClientStats]) -> None:
    reference = sum_stats(list(included))
    assert np.array_equal(total.counts, reference.counts)
    for got, want in ((total.sums, reference.sums), (total.scatter, reference.scatter)):
        err = float(np.max(np.abs(got - want))) / float(np.max(np.abs(want)))
        assert err <= 1e-15


def _same(a: ClientStats, b: ClientStats) -> None:
    assert np.array_equal(a.counts, b.counts)
    assert np.array_equal(a.sums, b.sums)
    assert np.array_equal(a.scatter, b.scatter)
    assert a.n_clipped == b.n_clipped


@pytest.mark.parametrize(("n", "regions"), [(8, 2), (12, 3), (21, 4)])
def test_hierarchical_total_is_the_flat_secure_total_bit_for_bit(n: int, regions: int) -> None:
    payloads = _payloads(n, seed=n)
    report = _hierarchical(payloads, regions)
    words, flat = _flat_words(payloads)
    assert report.words.dtype == np.uint64 and np.array_equal(report.words, words)
    _same(report.total, flat)
    assert report.included_regions == [r.name for r in partition_regions(list(payloads),
                                                                          regions)]
    assert sorted(report.included_clients) == sorted(payloads)
    assert np.array_equal(report.words, _encoded_sum(list(payloads.values()), n))
    _close_to_float64_sum(report.total, list(payloads.values()))


def test_partition_is_public_contiguous_and_balanced() -> None:
    ids = [f"c{i}" for i in (5, 3, 9, 1, 7, 2, 8)]
    parts = partition_regions(ids, 3)
    assert [r.name for r in parts] == ["region-0", "region-1", "region-2"]
    assert [len(r.clients) for r in parts] == [3, 2, 2]
    assert [c for r in parts for c in r.clients] == sorted(ids)
    assert partition_regions(list(reversed(ids)), 3) == parts


def test_a_region_below_its_threshold_aborts_only_that_region() -> None:
    payloads = _payloads(12, seed=3)
    parts = partition_regions(list(payloads), 3)
    # 4 clients per region, threshold 3 by default: 2 vanishing at the mask stage abort it
    report = _hierarchical(payloads, 3, drops={"region-1": {"mask": 2}})
    assert report.regions["region-1"].status == "aborted"
    assert "below the threshold" in report.regions["region-1"].reason
    assert report.included_regions == ["region-0", "region-2"]
    kept = [c for r in parts if r.name != "region-1" for c in r.clients]
    assert sorted(report.included_clients) == sorted(kept)
    included = [payloads[c] for c in kept]
    # the flat fixed-point sum of the included clients, in the federation's codec
    assert np.array_equal(report.words, _encoded_sum(included, len(payloads)))
    _close_to_float64_sum(report.total, included)
    summary = report.summary()
    assert sorted(summary.survivors) == sorted(kept)
    assert any(n.startswith("region-1 (4 clients) is not in the total") for n in summary.notes)


def test_a_region_with_a_dropout_above_its_threshold_keeps_its_survivors() -> None:
    payloads = _payloads(12, seed=4)
    report = _hierarchical(payloads, 3, drops={"region-2": {"mask": 1}})
    region = report.regions["region-2"]
    assert region.status == "included" and len(region.survivors) == 3
    assert len(region.dropped) == 1
    included = [payloads[c] for c in report.included_clients]
    # the flat fixed-point sum of the included clients, in the federation's codec
    assert np.array_equal(report.words, _encoded_sum(included, len(payloads)))
    _close_to_float64_sum(report.total, included)


def test_an_aggregator_dropping_out_of_the_top_round_loses_its_region() -> None:
    payloads = _payloads(16, seed=5)
    # R = 4 aggregators, top threshold 3 by default: one may drop before its masked input
    report = _hierarchical(payloads, 4, top=TopRound(drops={"mask": 1}, seed=1))
    lost = [r for r, o in report.regions.items() if o.status == "lost"]
    assert len(lost) == 1 and "top round (mask)" in report.regions[lost[0]].reason
    assert len(report.included_regions) == 3 and lost[0] not in report.included_regions
    included = [payloads[c] for c in report.included_clients]
    # the flat fixed-point sum of the included clients, in the federation's codec
    assert np.array_equal(report.words, _encoded_sum(included, len(payloads)))
    _close_to_float64_sum(report.total, included)


def test_too_many_aggregators_dropping_aborts_the_run() -> None:
    payloads = _payloads(8, seed=6)
    with pytest.raises(AggregationAbortedError, match="below the threshold"):
        _hierarchical(payloads, 2, top=TopRound(drops={"mask": 1}))


@pytest.mark.parametrize(("n", "regions", "match"), [
    (10, 11, r"leave a region with fewer than 2 clients.*at most 5 regions"),
    (10, 6, r"at most 5 regions"),
    (10, 1, r"at least 2 regions .*leave regions unset"),
])
def test_bad_partitions_are_refused(n: int, regions: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        partition_regions([f"c{i}" for i in range(n)], regions)


def test_a_threshold_larger_than_a_region_is_refused_before_any_round() -> None:
    payloads = _payloads(9, seed=7)
    with pytest.raises(ConfigError, match=r"region 'region-0' \(3 clients\) cannot run .*"
                                          r"--threshold between 2 and 3"):
        _hierarchical(payloads, 3, config=SecAggConfig(clip_norm=CLIP, threshold=4))


def test_overlapping_regions_are_refused() -> None:
    payloads = _payloads(4)
    ids = sorted(payloads)
    regions: Sequence[Region] = (Region("a", tuple(ids[:3])), Region("b", tuple(ids[2:])))
    meta = payloads[ids[0]].meta
    with pytest.raises(ConfigError, match="regions must partition the roster"):
        run_hierarchical(SecAggConfig(clip_norm=CLIP), meta, regions,
                         lambda r: InMemoryTransport([]), server_half=SecAggServer)


# ---------------------------------------------------------------------- plan, simulator, CLI
def test_the_plan_refuses_regions_without_the_secure_protocol_or_with_distributed_dp() -> None:
    from ghofl.errors import FieldError
    from ghofl.privacy import DPConfig
    from ghofl.server.fields import CLI
    from ghofl.server.plan import AggregationSpec

    with pytest.raises(FieldError) as exc:
        AggregationSpec(regions=3)
    assert exc.value.render(CLI) == ("--regions only applies to the secure protocol; add "
                                     "--secure")
    with pytest.raises(FieldError, match="must be at least 2"):
        AggregationSpec("secure", regions=1)
    with pytest.raises(FieldError, match="does not support"):
        AggregationSpec("secure", regions=2, dp=DPConfig(1.0, 1e-5, "distributed"))
    assert AggregationSpec("secure", regions=2).regions == 2


def _npz(tmp_path: Path) -> tuple[Path, Path]:
    from tests.helpers_cli import write_npz

    x, y = gaussian_mixture(11, num_classes=3, dim=4, n=260, sep=2.0)
    return (write_npz(tmp_path / "train.npz", x[:200], y[:200]),
            write_npz(tmp_path / "test.npz", x[200:], y[200:]))


def test_simulate_with_regions_through_the_cli(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from ghofl.cli.main import main

    train, test = _npz(tmp_path)
    common = ["simulate", "--train", str(train), "--test", str(test), "--clients", "12",
              "--alpha", "1.0", "--min-per-client", "4", "--secure", "--clip", "50",
              "--heads", "nb,lda", "--mode", "pooled"]
    assert main([*common, "--regions", "3", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "regions: 3 of 3 in the total (12 clients): region-0, region-1, region-2" in out
    assert main([*common, "--json", str(tmp_path / "flat.json")]) == 0
    regional = json.loads((tmp_path / "r.json").read_text())
    flat = json.loads((tmp_path / "flat.json").read_text())
    agg = regional["aggregation"]
    assert agg["survivors"] == 12 and agg["params"]["regions"] == 3
    assert agg["params"]["region"]["num_clients"] == 4
    assert agg["hierarchy"]["included_regions"] == ["region-0", "region-1", "region-2"]
    assert "top/unmask" in agg["stages"]
    for head in ("nb", "lda"):  # same total (up to the codec's K): same accuracy
        assert regional["heads"][head]["accuracy"] == flat["heads"][head]["accuracy"]


def test_simulate_names_the_regions_left_out(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from ghofl.cli.main import main

    train, test = _npz(tmp_path)
    args = ["simulate", "--train", str(train), "--test", str(test), "--clients", "13",
            "--alpha", "1.0", "--min-per-client", "4", "--secure", "--clip", "50", "--heads",
            "nb", "--mode", "pooled", "--regions", "3", "--drop", "mask=1"]
    # regions of 5, 4 and 4 clients; one client of each vanishes at the mask stage
    assert main([*args, "--threshold", "3", "--json", str(tmp_path / "r.json")]) == 0
    agg = json.loads((tmp_path / "r.json").read_text())["aggregation"]
    assert agg["hierarchy"]["included_regions"] == ["region-0", "region-1", "region-2"]
    assert agg["survivors"] == 10
    capsys.readouterr()
    # with threshold 4 the regions of 4 fall below it: only region-0 is in the total
    assert main([*args, "--threshold", "4", "--json", str(tmp_path / "r2.json")]) == 0
    out = capsys.readouterr().out
    assert "regions: 1 of 3 in the total (4 clients): region-0" in out
    assert "region-1 (4 clients) not in the total: secure aggregation aborted" in out
    agg = json.loads((tmp_path / "r2.json").read_text())["aggregation"]
    assert agg["survivors"] == 4
    assert agg["hierarchy"]["regions"]["region-2"]["status"] == "aborted"


def test_simulate_refuses_more_regions_than_pairs_of_clients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ghofl.cli.main import main

    train, test = _npz(tmp_path)
    code = main(["simulate", "--train", str(train), "--test", str(test), "--clients", "6",
                 "--alpha", "1.0", "--secure", "--clip", "50", "--heads", "nb",
                 "--regions", "4"])
    assert code != 0
    assert "give at most 3 regions (--regions)" in capsys.readouterr().err


def test_run_configs_carry_regions_and_the_flat_entry_point_refuses_them() -> None:
    from ghofl.client.job import ClientJob
    from ghofl.server.config import plan_from_config, plan_to_config
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import AggregationSpec, FederationPlan
    from ghofl.server.run import FederationServer

    got = plan_from_config({"classes": json.dumps(["a", "b"]), "heads": "nb", "clip_norm": 2.0,
                            "protocol": "secure", "regions": 2})
    assert got.aggregation.regions == 2
    assert plan_from_config(plan_to_config(got)) == got
    with pytest.raises(ConfigError, match="must be at least 2"):
        plan_from_config({"classes": json.dumps(["a", "b"]), "heads": "nb", "clip_norm": 2.0,
                          "protocol": "secure", "regions": 1})
    plan = FederationPlan(ClientJob(("a", "b", "c"), "pooled", clip_norm=CLIP),
                          AggregationSpec("secure", regions=2), ServerJob(("lda",)))
    payloads = _payloads(4)
    server = FederationServer(plan, list(payloads), next(iter(payloads.values())).meta)
    assert [len(r.clients) for r in server.regions] == [2, 2]
    with pytest.raises(ConfigError, match="call aggregate_regions"):
        server.aggregate(InMemoryTransport([]))


def test_every_region_aborting_aborts_the_run() -> None:
    payloads = _payloads(8, seed=8)
    with pytest.raises(AggregationAbortedError, match="every one of the 2 regions aborted"):
        _hierarchical(payloads, 2, drops={"region-0": {"mask": 2}, "region-1": {"share": 3}})
