"""The held-out section of client statistics (issue 10): split rule, algebra, validation,
moments of the validation split, and every path a payload takes (file, secure aggregation,
Flower records, store, job, CLI, simulation, experiment config)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ghofl.bench.config import config_from_dict
from ghofl.client.job import ClientJob, client_statistics
from ghofl.errors import (
    ConfigError,
    IncompatibleStatsError,
    InputError,
    StatsFormatError,
    StatsValidationError,
)
from ghofl.moments.core import GhoflWarning, compute_moments
from ghofl.secure import (
    InMemoryTransport,
    PlainClient,
    PlainServer,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    run_aggregation,
)
from ghofl.stats import (
    ClientStats,
    StatsAccumulator,
    StatsMeta,
    compute_stats,
    holdout_mask,
    load_stats,
    save_stats,
    sum_stats,
)
from ghofl.stats.codec import payload_nbytes, read_safetensors
from ghofl.stats.schema import SCHEMAS, schema_for
from ghofl.store import AggregationStore
from tests.helpers import gaussian_mixture, numbered

MODES = tuple(SCHEMAS)
CLIP = 6.0
F = 0.25


def _data(seed: int = 0, n: int = 400, dim: int = 5, classes: int = 3) -> tuple[Any, Any]:
    return gaussian_mixture(seed, classes, dim, n=n)


def _held(mode: str = "full", seed: int = 0, n: int = 400, clip: float | None = None,
          ids: Any = None, **kw: Any) -> ClientStats:
    x, y = _data(seed, n)
    return compute_stats(x, y, 3, mode, clip_norm=clip, holdout_fraction=F,  # type: ignore[arg-type]
                         sample_ids=ids, **kw)


def _identical(a: ClientStats, b: ClientStats) -> bool:
    if a.meta.differences(b.meta) or a.n_clipped != b.n_clipped:
        return False
    same = all((u is None and v is None) or (u is not None and v is not None
                                             and np.array_equal(u, v))
               for u, v in zip(a.arrays().values(), b.arrays().values(), strict=True))
    if a.holdout is None or b.holdout is None:
        return same and a.holdout is None and b.holdout is None
    return same and _identical(a.holdout, b.holdout)


# ---------------------------------------------------------------------- the split rule
def test_mask_is_per_sample_seeded_and_holds_out_about_f() -> None:
    ids = np.arange(200_000)
    m = holdout_mask(ids, 0.2, seed=3)
    assert abs(m.mean() - 0.2) < 0.005
    assert np.array_equal(holdout_mask(ids[::-1], 0.2, seed=3), m[::-1])  # per sample
    assert np.array_equal(holdout_mask(ids[5000:6000], 0.2, 3), m[5000:6000])
    other = holdout_mask(ids, 0.2, seed=4)
    assert 0.25 < np.mean(m != other) < 0.4  # another seed, another (independent) split
    assert not holdout_mask(ids[:100], 0.0).any()
    assert np.all(holdout_mask(ids, 0.1, 3) <= m)  # nested in f for a fixed seed


@pytest.mark.parametrize(
    ("ids", "fraction", "seed", "error", "match"),
    [
        (np.array([-1, 2]), 0.2, 0, InputError, "sample ids must be non-negative; got -1"),
        (np.array([0.5]), 0.2, 0, InputError, "sample ids must be a 1-D array of integers"),
        (np.zeros((2, 2), int), 0.2, 0, InputError, r"got shape \(2, 2\)"),
        (np.arange(3), 0.2, -1, InputError, r"holdout seed must be an integer in \[0, 2\^64\)"),
        (np.arange(3), 0.7, 0, StatsValidationError, r"must be 0 .* in \(0, 0.5\]; got 0.7"),
        (np.arange(3), -0.1, 0, StatsValidationError, r"in \(0, 0.5\]; got -0.1"),
    ],
)
def test_mask_errors(ids: Any, fraction: float, seed: int, error: type[Exception],
                     match: str) -> None:
    with pytest.raises(error, match=match):
        holdout_mask(ids, fraction, seed)


@pytest.mark.parametrize("mode", MODES)
def test_sections_are_the_totals_and_the_held_out_rows(mode: str) -> None:
    x, y = _data(1)
    s = compute_stats(x, y, 3, mode, holdout_fraction=F, holdout_seed=7)  # type: ignore[arg-type]
    plain = compute_stats(x, y, 3, mode)  # type: ignore[arg-type]
    mask = holdout_mask(np.arange(y.size), F, 7)
    held = compute_stats(x[mask], y[mask], 3, mode)  # type: ignore[arg-type]
    assert _identical(s.without_holdout(), plain)  # the main arrays: all samples, untouched
    assert s.holdout is not None and _identical(s.holdout, held)
    assert s.meta.holdout_fraction == F and s.holdout.meta.holdout_fraction == 0.0
    fit = s.fitting_part()
    assert np.array_equal(fit.counts, plain.counts - held.counts)
    assert fit.allclose(compute_stats(x[~mask], y[~mask], 3, mode), rtol=1e-9)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch", [1, 7, 64, 1000])
def test_streaming_split_does_not_depend_on_batching(batch: int) -> None:
    x, y = _data(2)
    acc = StatsAccumulator(3, 5, "full", holdout_fraction=F, holdout_seed=1)
    for start in range(0, y.size, batch):
        acc.update(x[start:start + batch], y[start:start + batch])
    whole = compute_stats(x, y, 3, "full", holdout_fraction=F, holdout_seed=1)
    got = acc.result()
    assert got.holdout is not None and whole.holdout is not None
    assert np.array_equal(got.holdout.counts, whole.holdout.counts)
    assert got.allclose(whole, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("k", [1, 3, 17])
def test_held_out_totals_are_partition_invariant_with_global_ids(mode: str, k: int) -> None:
    x, y = _data(3, n=500)
    owner = np.random.default_rng(k).integers(0, k, y.size)
    parts = [np.flatnonzero(owner == u) for u in range(k)]
    clients = [compute_stats(x[p], y[p], 3, mode, holdout_fraction=F,  # type: ignore[arg-type]
                             sample_ids=p) for p in parts]
    total = sum_stats(clients)
    central = compute_stats(x, y, 3, mode, holdout_fraction=F)  # type: ignore[arg-type]
    assert total.holdout is not None and central.holdout is not None
    assert np.array_equal(total.counts, central.counts)
    assert np.array_equal(total.holdout.counts, central.holdout.counts)  # the same samples
    assert total.allclose(central, rtol=1e-10)


def test_sample_ids_must_match_the_rows() -> None:
    x, y = _data()
    with pytest.raises(InputError, match=r"sample_ids must have shape \(400,\)"):
        compute_stats(x, y, 3, holdout_fraction=F, sample_ids=np.arange(3))
    acc = StatsAccumulator(3, 5, holdout_fraction=F)
    with pytest.raises(InputError, match=r"sample_ids must have shape \(2,\)"):
        acc.update(x[:2], y[:2], sample_ids=np.arange(3))


# ---------------------------------------------------------------------- metadata and algebra
def test_meta_field_serialisation_and_old_metadata() -> None:
    meta = StatsMeta("full", 4, ("a", "b"), holdout_fraction=0.2)
    d = meta.to_dict()
    assert d["holdout_fraction"] == 0.2 and d["schema_version"] == 3
    assert StatsMeta.from_dict(d) == meta
    plain = StatsMeta("full", 4, ("a", "b"))
    assert "holdout_fraction" not in plain.to_dict() and plain.to_dict()["schema_version"] == 2
    assert StatsMeta.from_dict(plain.to_dict()).holdout_fraction == 0.0
    assert meta.without_holdout() == plain and plain.with_holdout(0.2) == meta
    with pytest.raises(StatsValidationError, match=r"in \(0, 0.5\]; got 0.6"):
        StatsMeta("full", 4, ("a", "b"), holdout_fraction=0.6)
    with pytest.raises(StatsFormatError, match="has schema version 2 but a holdout_fraction"):
        StatsMeta.from_dict({**d, "schema_version": 2})
    with pytest.raises(StatsFormatError, match="holdout_fraction 'x'; expected a number"):
        StatsMeta.from_dict({**d, "holdout_fraction": "x"})
    with pytest.raises(StatsFormatError, match=r"metadata is malformed: .*got 0.9"):
        StatsMeta.from_dict({**d, "holdout_fraction": 0.9})


def test_different_fractions_do_not_combine_and_the_error_says_why() -> None:
    x, y = _data()
    a = compute_stats(x, y, 3, holdout_fraction=0.2)
    b = compute_stats(x, y, 3, holdout_fraction=0.3)
    c = compute_stats(x, y, 3)
    with pytest.raises(IncompatibleStatsError, match=r"held-out fraction \(f=0.2 vs f=0.3\)"):
        a + b
    with pytest.raises(IncompatibleStatsError, match=r"held-out fraction \(f=0.2 vs none\)"):
        a + c
    total = a.without_holdout() + c  # the way to combine them: drop the sections
    assert total.holdout is None and total.n_samples == 800


@pytest.mark.parametrize("mode", MODES)
def test_add_subtract_convert_act_on_both_sections(mode: str) -> None:
    a, b = _held(mode, 0), _held(mode, 1)
    total = a + b
    assert total.holdout is not None and a.holdout is not None and b.holdout is not None
    assert np.array_equal(total.holdout.counts, a.holdout.counts + b.holdout.counts)
    back = total - b
    assert back.allclose(a, rtol=1e-9)
    assert back.holdout is not None and np.array_equal(back.holdout.counts, a.holdout.counts)
    builtin = sum([a, b])
    assert isinstance(builtin, ClientStats) and builtin.allclose(total)
    if mode != "means":
        lower = {"diag": "means", "gram": "means", "pooled": "gram"}.get(mode, "diag")
        low = total.to_mode(lower)  # type: ignore[arg-type]
        assert low.holdout is not None and low.holdout.mode == lower
        assert low.holdout.allclose(total.holdout.to_mode(lower))  # type: ignore[arg-type]
    zero = ClientStats.zeros(a.meta)
    assert zero.holdout is not None and (zero + a).allclose(a)
    assert not a.allclose(a.without_holdout())


def test_subtracting_more_held_out_samples_than_held_is_refused() -> None:
    x, y = _data()
    a = compute_stats(x, y, 3, "diag", holdout_fraction=F)
    m = 300  # rows of a, every one of them held out in b: more held out than a holds out
    held_ids = np.flatnonzero(holdout_mask(np.arange(10_000), F))[:m]
    b = compute_stats(x[:m], y[:m], 3, "diag", holdout_fraction=F, sample_ids=held_ids)
    assert b.holdout is not None and b.holdout.n_samples == m
    with pytest.raises(StatsValidationError, match="in the held-out section: class"):
        a - b


def _rebuild(s: ClientStats, **changes: Any) -> ClientStats:
    fields: dict[str, Any] = {**s.arrays(), "n_clipped": s.n_clipped, "holdout": s.holdout}
    fields.update(changes)
    meta = fields.pop("meta", s.meta)
    return ClientStats(meta, **{k: v for k, v in fields.items()
                                if v is not None or k == "holdout"})


def test_validation_of_the_section() -> None:
    s = _held("full", 0)
    assert s.holdout is not None
    assert _rebuild(s).allclose(s)
    with pytest.raises(StatsValidationError, match=r"holdout_fraction is 0\.25 but the statistics "
                                                    r"have no held-out section"):
        _rebuild(s, holdout=None)
    with pytest.raises(StatsValidationError, match=r"have a held-out section but "
                                                    r"meta\.holdout_fraction is 0"):
        _rebuild(s, meta=s.meta.without_holdout())
    with pytest.raises(StatsValidationError, match="must be ClientStats; got str"):
        _rebuild(s, holdout="held")
    with pytest.raises(StatsValidationError, match="must not have a held-out section of its own"):
        _rebuild(s, holdout=s)
    other = compute_stats(*_data(0), 3, "full", clip_norm=50.0)
    with pytest.raises(StatsValidationError, match=r"it differs in clipping bound \(none vs "
                                                    r"R=50\)"):
        _rebuild(s, holdout=other)


def test_a_section_that_is_not_part_of_the_totals_is_refused() -> None:
    s = _held("full", 0)
    assert s.holdout is not None
    x, y = _data(9, n=2000)
    more = compute_stats(x, y, 3, "full")
    with pytest.raises(StatsValidationError, match=r"held-out section holds \d+ samples of class "
                                                    r"'\d' but the totals hold only"):
        _rebuild(s, holdout=more)
    # same counts, other data: total − held-out is not a sum of x xᵀ
    h = s.holdout
    assert h.class_scatter is not None
    fake = ClientStats(h.meta, h.counts.copy(), h.sums * 3.0, class_scatter=h.class_scatter * 9.0)
    with pytest.raises(StatsValidationError, match="the held-out section is not a part of the "
                                                    "totals"):
        _rebuild(s, holdout=fake)


# ---------------------------------------------------------------------- moments
@pytest.mark.parametrize("mode", MODES)
def test_validation_split_moments(mode: str) -> None:
    x, y = _data(4, n=600)
    s = compute_stats(x, y, 3, mode, holdout_fraction=F)  # type: ignore[arg-type]
    mask = holdout_mask(np.arange(y.size), F)
    split = compute_moments(s).validation_split()
    assert split is not None
    fit, held = split
    ref_fit = compute_moments(compute_stats(x[~mask], y[~mask], 3, mode))  # type: ignore[arg-type]
    ref_held = compute_moments(compute_stats(x[mask], y[mask], 3, mode))  # type: ignore[arg-type]
    assert np.array_equal(fit.counts, ref_fit.counts)
    assert np.array_equal(held.counts, ref_held.counts)
    np.testing.assert_allclose(fit.means, ref_fit.means, rtol=1e-9, atol=1e-12)
    if mode not in ("means", "gram"):  # per-class variances need D_c
        np.testing.assert_allclose(held.class_vars, ref_held.class_vars, rtol=1e-9, atol=1e-12)
    if mode not in ("diag", "means"):
        assert fit.within_scatter is not None and ref_fit.within_scatter is not None
        np.testing.assert_allclose(fit.within_scatter, ref_fit.within_scatter, rtol=1e-8,
                                   atol=1e-9)
    assert fit.meta.holdout_fraction == 0.0 and fit.stats.holdout is None
    assert compute_moments(compute_stats(x, y, 3, mode)).validation_split() is None  # type: ignore[arg-type]


def test_validation_split_with_a_class_empty_in_one_part() -> None:
    x, y = _data(5, n=300)
    ids = np.arange(y.size)
    mask = holdout_mask(ids, F)
    y = y.copy()
    y[y == 2] = 0
    y[np.flatnonzero(mask)[0]] = 2  # class 2: one sample, held out -> empty in the fit part
    s = compute_stats(x, y, 3, "full", holdout_fraction=F)
    split = compute_moments(s).validation_split()
    assert split is not None
    fit, held = split
    assert fit.counts[2] == 0 and held.counts[2] == 1
    assert fit.priors[2] == 0.0 and np.all(fit.means[2] == 0.0)


def test_validation_split_without_held_out_samples_warns_and_is_none() -> None:
    x, y = _data(6, n=12)
    ids = np.arange(y.size) + 10_000
    keep = ~holdout_mask(ids, 0.05, 0)
    s = compute_stats(x[keep], y[keep], 3, "diag", holdout_fraction=0.05, sample_ids=ids[keep])
    with pytest.warns(GhoflWarning, match="the held-out part of the statistics holds no sample"):
        assert compute_moments(s).validation_split() is None


# ---------------------------------------------------------------------- transport paths
@pytest.mark.parametrize("mode", MODES)
def test_file_round_trip_and_header(tmp_path: Path, mode: str) -> None:
    s = _held(mode, 0, clip=2.0)
    assert s.holdout is not None and s.holdout.n_clipped > 0
    path = tmp_path / "h.ghs"
    save_stats(s, path)
    assert _identical(load_stats(path), s)
    header, tensors = read_safetensors(path, "ghofl.stats", "statistics",
                                       keys=None)
    assert header["schema_version"] == "3"
    assert header["holdout_n_clipped"] == str(s.holdout.n_clipped)
    stored = {name for _, name, _ in schema_for(mode).stored_arrays(True)}
    assert set(tensors) == stored and "holdout.counts" in stored
    assert sum(t.nbytes for t in tensors.values()) == payload_nbytes(s)
    assert payload_nbytes(s) == 2 * payload_nbytes(s.without_holdout())
    plain = tmp_path / "p.ghs"
    save_stats(s.without_holdout(), plain)
    h2, _ = read_safetensors(plain, "ghofl.stats", "statistics")
    assert h2["schema_version"] == "2" and "holdout_n_clipped" not in h2


def test_file_without_its_held_out_arrays_is_refused(tmp_path: Path) -> None:
    from ghofl.stats.codec import FORMAT, stats_tensors, write_safetensors

    s = _held("diag", 0)
    tensors = {k: v for k, v in stats_tensors(s).items() if not k.startswith("holdout.")}
    header = {"format": FORMAT, "schema_version": "3",
              "meta": json.dumps(s.meta.to_dict(), sort_keys=True), "n_clipped": "0"}
    write_safetensors(tmp_path / "x.ghs", tensors, header)
    with pytest.raises(StatsFormatError, match=r"lacks the array 'holdout\.counts'"):
        load_stats(tmp_path / "x.ghs")
    tensors = stats_tensors(s.without_holdout())
    header = {"format": FORMAT, "schema_version": "2", "holdout_n_clipped": "0",
              "meta": json.dumps(s.meta.without_holdout().to_dict(), sort_keys=True)}
    write_safetensors(tmp_path / "y.ghs", tensors, header)
    with pytest.raises(StatsFormatError, match="holdout_n_clipped but no held-out section"):
        load_stats(tmp_path / "y.ghs")


@pytest.mark.parametrize("mode", MODES)
def test_secure_aggregation_total_equals_the_plain_total(mode: str) -> None:
    payloads = [_held(mode, i, n=80, clip=CLIP) for i in range(4)]
    ids = [f"site-{i}" for i in range(4)]
    clients = [SecAggClient(c, p, allow_unauthenticated=True)
               for c, p in zip(ids, payloads, strict=True)]
    server = SecAggServer(SecAggConfig(clip_norm=CLIP), payloads[0].meta, ids,
                          round_id=b"holdout-round-01")
    total = run_aggregation(server, InMemoryTransport(clients, None, seed=0)).total
    expected = sum_stats(payloads)
    assert total.holdout is not None and expected.holdout is not None
    assert np.array_equal(total.counts, expected.counts)
    assert np.array_equal(total.holdout.counts, expected.holdout.counts)
    assert total.holdout.n_clipped == expected.holdout.n_clipped
    assert total.allclose(expected, rtol=1e-12)


def test_plain_protocol_carries_the_section() -> None:
    payloads = [_held("pooled", i, n=80) for i in range(3)]
    ids = [f"c{i}" for i in range(3)]
    report = run_aggregation(PlainServer(ids, payloads[0].meta),
                             InMemoryTransport([PlainClient(c, p) for c, p in
                                                zip(ids, payloads, strict=True)], None, seed=0))
    assert report.total.allclose(sum_stats(payloads))


def test_flower_records_round_trip() -> None:
    pytest.importorskip("flwr", reason="flwr is not installed")
    from ghofl.integrations.flower.records import stats_from_record, stats_to_record

    for mode in MODES:
        s = _held(mode, 0, clip=2.0)
        rd = stats_to_record(s)
        assert "holdout.counts" in rd["ghofl-stats"]
        assert _identical(stats_from_record(rd), s)


def test_store_add_and_forget(tmp_path: Path) -> None:
    a, b = _held("full", 0, clip=CLIP), _held("full", 1, clip=CLIP)
    with AggregationStore(tmp_path / "s.db") as store:
        store.add("a", a)
        store.add("b", b)
        total = store.total()
        assert total.holdout is not None and total.allclose(a + b, rtol=1e-12)
        store.remove("b")
        left = store.total()
        assert left.holdout is not None and a.holdout is not None
        assert np.array_equal(left.holdout.counts, a.holdout.counts)
        assert left.allclose(a, rtol=1e-9)
        with pytest.raises(IncompatibleStatsError, match="held-out fraction"):
            store.add("c", compute_stats(*_data(2), 3, clip_norm=CLIP))
    with AggregationStore(tmp_path / "plain.db") as store:  # the unclipped (float) path
        store.add("a", _held("diag", 0))
        store.add("b", _held("diag", 1))
        assert store.total().allclose(_held("diag", 0) + _held("diag", 1))
        store.remove("a")
        assert store.total().allclose(_held("diag", 1), rtol=1e-9)


# ---------------------------------------------------------------------- job, CLI, config
def test_client_job_config_and_global_ids() -> None:
    job = ClientJob(("a", "b", "c"), "full", holdout_fraction=F, holdout_seed=5,
                    min_class_count=3)
    from ghofl.server.config import plan_from_config, plan_to_config
    from ghofl.server.plan import FederationPlan

    assert plan_from_config(plan_to_config(FederationPlan(job))).client == job
    assert plan_from_config({"classes": '["a"]'}).client.holdout_fraction == 0.0
    assert job.stats_meta(5).holdout_fraction == F
    x, y = _data(7, n=200)
    y = y.copy()
    y[:2] = 2
    y[y == 2] = 1
    y[:2] = 2  # class 2 has 2 samples: dropped by the minimum-count rule
    ids = np.arange(y.size) + 1000
    s = client_statistics((x, y), job, sample_ids=ids)
    keep = y != 2
    ref = compute_stats(x[keep], y[keep], job.classes, "full", holdout_fraction=F,
                        holdout_seed=5, sample_ids=ids[keep])
    assert _identical(s, ref)
    with pytest.raises(InputError, match=r"sample_ids must have shape \(200,\)"):
        client_statistics((x, y), job, sample_ids=ids[:3])
    with pytest.raises(ConfigError, match=r"ClientJob holdout_fraction: .*got 0.8"):
        ClientJob(("a",), holdout_fraction=0.8)


def test_dp_and_secure_options_are_checked() -> None:
    from ghofl.privacy import DPConfig, plan_noise, release_central
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import AggregationSpec, FederationPlan

    with pytest.raises(ConfigError, match="differential privacy does not support a held-out"):
        FederationPlan(ClientJob(numbered(3), clip_norm=CLIP, holdout_fraction=F),
                       AggregationSpec(dp=DPConfig(1.0, 1e-5, "central")), ServerJob(("nb",)))
    s = _held("full", 0, clip=CLIP)
    plan = plan_noise(DPConfig(1.0, 1e-5, "central"), "full", CLIP, 1)
    with pytest.raises(ConfigError, match="does not support statistics with a held-out section"):
        release_central(s, plan, np.random.default_rng(0))


def test_simulation_reports_the_section_and_its_bytes() -> None:
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import FederationPlan
    from ghofl.server.simulation import Population, simulate

    x, y = _data(8, n=300)
    server = ServerJob(("nb", "lda"), seed=0)
    res = simulate(FederationPlan(ClientJob(numbered(3), "pooled", holdout_fraction=F),
                                  server=server), (x, y), (x, y), Population(3, 1.0))
    plain = simulate(FederationPlan(ClientJob(numbered(3), "pooled"), server=server),
                     (x, y), (x, y), Population(3, 1.0))
    assert res.upload_bytes_per_client == 2 * plain.upload_bytes_per_client
    assert res.to_dict()["holdout_fraction"] == F
    # the main sums are those of all samples: heads that ignore the section do not change
    assert res.heads["nb"].accuracy == plain.heads["nb"].accuracy


def test_cli_client_stats_and_stats_show(tmp_path: Path) -> None:
    from ghofl.cli.main import build_command
    from tests.helpers_cli import write_npz

    x, y = _data(0, n=200)
    write_npz(tmp_path / "c.npz", x, y)
    cli = build_command()
    runner = CliRunner()
    r = runner.invoke(cli, ["client-stats", "--embeddings", str(tmp_path / "c.npz"), "--out",
                            str(tmp_path / "c.ghs"), "--num-classes", "3", "--holdout", "0.25",
                            "--holdout-seed", "2"])
    assert r.exit_code == 0, r.output
    assert "held out (fraction 0.25)" in r.output
    s = load_stats(tmp_path / "c.ghs")
    assert s.holdout is not None and s.holdout_fraction == 0.25
    r = runner.invoke(cli, ["stats", "show", str(tmp_path / "c.ghs"), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["holdout_fraction"] == 0.25
    assert info["holdout_counts"] == [int(v) for v in s.holdout.counts]
    assert info["transport_dtype"] == "float64"
    r = runner.invoke(cli, ["stats", "show", str(tmp_path / "c.ghs")])
    assert r.exit_code == 0 and "held out" in r.output and "fraction 0.25" in r.output
    r = runner.invoke(cli, ["client-stats", "--embeddings", str(tmp_path / "c.npz"), "--out",
                            str(tmp_path / "d.ghs"), "--num-classes", "3", "--holdout", "0.9"])
    assert isinstance(r.exception, ConfigError)
    assert "--holdout: the held-out fraction must be 0" in str(r.exception)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.2, (0.2,)), ([0.0, 0.2], (0.0, 0.2))],
)
def test_experiment_config_key(value: Any, expected: tuple[float, ...]) -> None:
    cfg = config_from_dict({"datasets": ["cifar10"], "holdout": value})
    assert cfg.holdout == expected
    assert cfg.n_cells() == len(expected)


def test_experiment_config_rejects_bad_fractions() -> None:
    with pytest.raises(ConfigError, match=r"holdout must hold fractions in \[0, 0.5\]"):
        config_from_dict({"datasets": ["cifar10"], "holdout": [0.2, 0.7]})


def test_runner_keys_default_variants_as_none() -> None:
    from ghofl.bench.runner import _upload_variants

    cfg = config_from_dict({"datasets": ["cifar10"], "seeds": [0, 1], "holdout": [0.0, 0.2],
                            "transport_dtype": ["float64", "float32"]})
    variants = _upload_variants(cfg)
    assert len(variants) == 8 == cfg.n_cells()
    assert (0, None, None) in variants and (1, 0.2, "float32") in variants


def test_no_warning_in_the_normal_path() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = _held("full", 0)
        split = compute_moments(s).validation_split()
        assert split is not None
