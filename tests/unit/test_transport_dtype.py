"""Float32 transport of the float sums (issue 10, §4): files, records, merging, byte counts,
and the options that select it (job, CLI, simulation, experiment config)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from ghofl.bench.config import config_from_dict
from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, StatsFormatError, StatsValidationError
from ghofl.stats import (
    ClientStats,
    compute_stats,
    load_stats,
    save_stats,
    sum_stats,
    through_transport,
)
from ghofl.stats.codec import (
    FORMAT,
    expected_payload_nbytes,
    payload_nbytes,
    read_safetensors,
    read_stats_file,
    stats_from_tensors,
    stats_tensors,
    write_safetensors,
)
from ghofl.stats.schema import SCHEMAS
from tests.helpers import gaussian_mixture, numbered

MODES = tuple(SCHEMAS)


def _stats(mode: str, seed: int = 0, holdout: float = 0.0, n: int = 120, dim: int = 24,
           classes: int = 4) -> ClientStats:
    """Embedding-like data: positive features, fewer samples per class than dimensions, a
    constant feature (rank-deficient second moments, the hard case for rounding)."""
    x, y = gaussian_mixture(seed, classes, dim, n=n)
    x = np.abs(x) + 3.0
    x[:, 0] = 1.0
    return compute_stats(x, y, classes, mode, holdout_fraction=holdout)  # type: ignore[arg-type]


def _rounded(a: Any) -> Any:
    return None if a is None or a.dtype.kind != "f" else a.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("holdout", [0.0, 0.25])
def test_file_round_trip_rounds_each_sum_once(tmp_path: Path, mode: str, holdout: float) -> None:
    s = _stats(mode, holdout=holdout)
    p64, p32 = tmp_path / "a64.ghs", tmp_path / "a32.ghs"
    save_stats(s, p64)
    size = save_stats(s, p32, "float32")
    back, tdtype = read_stats_file(p32)
    assert tdtype == "float32"
    assert back.meta == s.meta and np.array_equal(back.counts, s.counts)
    for name, arr in s.arrays().items():
        got = back.arrays()[name]
        if arr is not None and arr.dtype.kind == "f":
            assert got.dtype == np.float64
            assert np.array_equal(got, _rounded(arr))  # exactly the float32 rounding
    if holdout:
        assert back.holdout is not None and s.holdout is not None
        assert np.array_equal(back.holdout.sums, _rounded(s.holdout.sums))
        back.fitting_part()  # total − held-out of rounded sums stays valid statistics
    assert size < p64.stat().st_size
    assert payload_nbytes(s, "float32") < 0.56 * payload_nbytes(s)
    header, tensors = read_safetensors(p32, FORMAT, "statistics",
                                       dtypes={"F64": np.dtype("<f8"), "I64": np.dtype("<i8"),
                                               "F32": np.dtype("<f4")})
    assert header["transport_dtype"] == "float32" and header["schema_version"] == "3"
    assert tensors["counts"].dtype == np.int64 and tensors["sums"].dtype == np.float32
    assert sum(t.nbytes for t in tensors.values()) == payload_nbytes(s, "float32")


def test_rounded_second_moments_need_the_transport_tolerance() -> None:
    s = _stats("full", n=60, dim=48)  # 15 samples per class in d=48: singular S_c
    arrays = {k: (_rounded(v) if v.dtype.kind == "f" else v)
              for k, v in s.arrays().items() if v is not None}
    with pytest.raises(StatsValidationError, match="not positive semi-definite"):
        ClientStats(s.meta, **arrays)
    ok = ClientStats.from_transport(s.meta, arrays, rounding=2.0**-24)
    assert ok.allclose(s, rtol=1e-6)


def test_corruption_is_still_refused_after_float32_transport() -> None:
    s = _stats("pooled")
    t = stats_tensors(s, "float32")
    t["sq_sums"] = t["sq_sums"] * np.float32(0.5)  # variances negative: not rounding
    with pytest.raises(StatsValidationError):
        stats_from_tensors(s.meta, t, transport_dtype="float32")
    t = stats_tensors(s, "float32")
    with pytest.raises(StatsFormatError, match=r"array 'sums' has dtype float32 but must be "
                                               r"float64 \(transport dtype float64\)"):
        stats_from_tensors(s.meta, t, transport_dtype="float64")


def test_values_beyond_float32_are_refused() -> None:
    x = np.full((3, 2), 1e30)
    s = compute_stats(x, np.zeros(3, int), 1, "diag")
    with pytest.raises(StatsValidationError, match=r"sq_sums holds a value of magnitude 3e\+60, "
                                                   r"beyond the float32 range"):
        stats_tensors(s, "float32")
    assert stats_tensors(s)["sq_sums"].dtype == np.float64


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"transport_dtype": "float16"}, "header transport_dtype 'float16'; expected 'float32'"),
        ({"schema_version": "2"}, "schema version 2 but a transport_dtype"),
    ],
)
def test_bad_transport_headers(tmp_path: Path, edit: dict[str, str], match: str) -> None:
    s = _stats("diag")
    header = {"format": FORMAT, "schema_version": "3", "transport_dtype": "float32",
              "meta": json.dumps(s.meta.to_dict(), sort_keys=True), "n_clipped": "0"}
    write_safetensors(tmp_path / "x.ghs", stats_tensors(s, "float32"), {**header, **edit})
    with pytest.raises(StatsFormatError, match=match):
        load_stats(tmp_path / "x.ghs")


def test_float64_tensors_under_a_float32_header_are_refused(tmp_path: Path) -> None:
    s = _stats("diag")
    header = {"format": FORMAT, "schema_version": "3", "transport_dtype": "float32",
              "meta": json.dumps(s.meta.to_dict(), sort_keys=True), "n_clipped": "0"}
    write_safetensors(tmp_path / "x.ghs", stats_tensors(s), header)
    with pytest.raises(StatsFormatError, match=r"array 'sums' has dtype F64 but must be F32 "
                                               r"\(header transport_dtype float32\)"):
        load_stats(tmp_path / "x.ghs")


def test_merging_float32_payloads_adds_in_float64(tmp_path: Path) -> None:
    parts = [_stats("full", seed=i, holdout=0.25) for i in range(3)]
    paths = []
    for i, s in enumerate(parts):
        paths.append(tmp_path / f"c{i}.ghs")
        save_stats(s, paths[-1], "float32" if i else "float64")  # mixed dtypes combine
    total = sum_stats(load_stats(p) for p in paths)
    assert total.sums.dtype == np.float64
    expected = parts[0].sums + sum(_rounded(s.sums) for s in parts[1:])
    assert np.array_equal(total.sums, expected)
    assert total.allclose(sum_stats(parts), rtol=1e-6)
    assert total.holdout is not None
    save_stats(total, tmp_path / "total.ghs")  # the aggregate is written in float64 ...
    back, tdtype = read_stats_file(tmp_path / "total.ghs")
    assert tdtype == "float64" and back.allclose(total, rtol=0.0)
    header, _ = read_safetensors(tmp_path / "total.ghs", FORMAT, "statistics")
    assert header["rounded_to"] == "float32"  # ... and remembers the rounding it went through
    assert back.rounding == 2.0**-24 and parts[0].rounding == 0.0


@pytest.mark.parametrize("clip", [None, 60.0])
def test_store_of_float32_payloads(tmp_path: Path, clip: float | None) -> None:
    from ghofl.store import AggregationStore

    parts = []
    for i in range(3):
        x, y = gaussian_mixture(i, 4, 24, n=60)
        s = compute_stats(np.abs(x) + 3.0, y, 4, "full", clip_norm=clip, holdout_fraction=0.25)
        parts.append(through_transport(s, "float32"))
    with AggregationStore(tmp_path / "s.db") as store:
        for i, p in enumerate(parts):
            store.add(f"c{i}", p)
        assert store.total().allclose(sum_stats(parts), rtol=1e-9)
        store.remove("c1")
    with AggregationStore(tmp_path / "s.db", create=False) as store:  # reopened: still valid
        left = store.total()
        assert left.allclose(parts[0] + parts[2], rtol=1e-9)
        assert left.rounding == 2.0**-24
        assert store.get("c0").allclose(parts[0], rtol=0.0)


@pytest.mark.parametrize("mode", MODES)
def test_byte_counts(mode: str) -> None:
    c, d = 10, 1280
    b64 = expected_payload_nbytes(mode, c, d)
    b32 = expected_payload_nbytes(mode, c, d, transport_dtype="float32")
    assert b32 == 8 * c + (b64 - 8 * c) // 2  # counts stay int64
    assert expected_payload_nbytes(mode, c, d, holdout=True, transport_dtype="float32") == 2 * b32
    with pytest.raises(StatsValidationError, match="transport dtype of statistics must be one "
                                                   "of float64, float32; got 'int8'"):
        expected_payload_nbytes(mode, c, d, transport_dtype="int8")


def test_through_transport_is_what_the_receiver_reads() -> None:
    s = _stats("pooled", holdout=0.25)
    assert through_transport(s) is s
    t = through_transport(s, "float32")
    assert np.array_equal(t.sums, _rounded(s.sums))
    assert t.holdout is not None and s.holdout is not None
    assert np.array_equal(t.holdout.sq_sums, _rounded(s.holdout.sq_sums))  # type: ignore[arg-type]


def test_flower_records_carry_float32() -> None:
    pytest.importorskip("flwr", reason="flwr is not installed")
    from flwr.app import ArrayRecord

    from ghofl.integrations.flower.records import (
        message_from_record,
        message_to_record,
        stats_from_record,
        stats_to_record,
    )
    from ghofl.secure.messages import ClientMessage, PlainInput

    s = _stats("full", holdout=0.25)
    rd = stats_to_record(s, transport_dtype="float32")
    arrays = rd["ghofl-stats"]
    assert isinstance(arrays, ArrayRecord) and arrays["sums"].numpy().dtype == np.float32
    assert rd["ghofl-stats-meta"]["transport-dtype"] == "float32"
    back = stats_from_record(rd)
    assert np.array_equal(back.sums, _rounded(s.sums))
    msg = PlainInput(1, b"r" * 16, "input", "c0", s)
    got = message_from_record(message_to_record(msg, transport_dtype="float32"), ClientMessage)
    assert isinstance(got, PlainInput) and np.array_equal(got.stats.sums, _rounded(s.sums))
    plain = stats_to_record(s)  # float64 records are unchanged: no transport key
    assert "transport-dtype" not in plain["ghofl-stats-meta"]


def test_job_simulation_and_config_options() -> None:
    from ghofl.server.config import plan_from_config, plan_to_config
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import AggregationSpec, FederationPlan
    from ghofl.server.simulation import Population, SimulationResult, simulate

    job = ClientJob(("a", "b"), transport_dtype="float32")
    assert plan_from_config(plan_to_config(FederationPlan(job))).client == job
    with pytest.raises(ConfigError, match="transport_dtype must be one of float64, float32"):
        ClientJob(("a",), transport_dtype="half")
    x, y = gaussian_mixture(1, 3, 6, n=300)
    server = ServerJob(("nb", "lda", "qda"), seed=0)

    def run(job: ClientJob) -> SimulationResult:
        return simulate(FederationPlan(job, server=server), (x, y), (x, y), Population(3, 1.0))

    r64 = run(ClientJob(numbered(3), "full"))
    r32 = run(ClientJob(numbered(3), "full", transport_dtype="float32"))
    assert r32.upload_bytes_per_client < 0.51 * r64.upload_bytes_per_client + 8 * 3
    assert r32.to_dict()["transport_dtype"] == "float32"
    for head in ("nb", "lda", "qda"):
        assert abs(r32.heads[head].accuracy - r64.heads[head].accuracy) <= 0.01
    with pytest.raises(ConfigError, match="secure aggregation sends its own fixed-point"):
        FederationPlan(ClientJob(numbered(3), "full", clip_norm=20.0, transport_dtype="float32"),
                       AggregationSpec("secure"), server)
    cfg = config_from_dict({"datasets": ["cifar10"], "transport_dtype": "float32"})
    assert cfg.transport_dtype == ("float32",)
    with pytest.raises(ConfigError, match="transport_dtype must be among float64, float32"):
        config_from_dict({"datasets": ["cifar10"], "transport_dtype": ["bf16"]})
    with pytest.raises(ConfigError, match="experiment config: transport_dtype 'float32' applies to plain uploads; secure aggregation"):
        config_from_dict({"datasets": ["cifar10"], "transport_dtype": "float32",
                          "secure": True})


def test_cli_client_stats_writes_float32(tmp_path: Path) -> None:
    from ghofl.cli.main import build_command
    from tests.helpers_cli import write_npz

    x, y = gaussian_mixture(0, 3, 6, n=200)
    write_npz(tmp_path / "c.npz", x, y)
    runner = CliRunner()
    cli = build_command()
    r = runner.invoke(cli, ["client-stats", "--embeddings", str(tmp_path / "c.npz"), "--out",
                            str(tmp_path / "c.ghs"), "--num-classes", "3",
                            "--transport-dtype", "float32"])
    assert r.exit_code == 0, r.output
    assert read_stats_file(tmp_path / "c.ghs")[1] == "float32"
    r = runner.invoke(cli, ["stats", "show", str(tmp_path / "c.ghs"), "--json"])
    info = json.loads(r.output)
    assert info["transport_dtype"] == "float32"
    assert info["payload_bytes"] == expected_payload_nbytes("full", 3, 6,
                                                            transport_dtype="float32")
    r = runner.invoke(cli, ["client-stats", "--embeddings", str(tmp_path / "c.npz"), "--out",
                            str(tmp_path / "d.ghs"), "--num-classes", "3",
                            "--transport-dtype", "float16"])
    assert isinstance(r.exception, ConfigError)
    assert "--transport-dtype must be one of float64, float32" in str(r.exception)
