"""bench_experiments.py: one federation per config whose heads are partition invariant, and
the invariance measured (and stated in every section) on the config that asks for it."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from ghofl.bench.config import config_from_dict, load_config
from ghofl.bench.features import Features
from ghofl.bench.provenance import code_sentence
from ghofl.errors import ConfigError
from ghofl.stats.meta import EncoderInfo
from tests.helpers import gaussian_mixture, load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(ROOT / "benchmarks" / "bench_experiments.py",  # type: ignore[return-value]
                       "_bench_experiments_invariance")


def _features() -> Features:
    x, y = gaussian_mixture(4, num_classes=3, dim=5, n=660)
    x = x.astype(np.float32)
    return Features("toy", "enc", x[:500], y[:500], x[500:], y[500:], ("a", "b", "c"),
                    EncoderInfo(name="enc", dim=5))


def _cfg(**kw: Any) -> Any:
    return config_from_dict({"datasets": ["toy"], "encoders": ["enc"], "alphas": [0.05, 0.5],
                             "clients": [3, 8], "seeds": [0, 1], "heads": ["nb", "lda", "qda"],
                             "references": [], **kw})


def test_the_repository_grid_runs_one_federation_and_checks_on_cifar10_main(
        bench: ModuleType) -> None:
    assert bench.check_config() == "cifar10_main"
    for path in sorted((ROOT / "benchmarks" / "configs").glob("*.toml")):
        cfg = load_config(path)
        assert bench.partition_invariant(cfg), path.name
        assert bench.one_federation(cfg).n_cells() == len(cfg.datasets) * len(cfg.encoders) \
            * len(cfg.modes) * len(cfg.projection_dims), path.name
    main = load_config(ROOT / "benchmarks" / "configs" / "cifar10_main.toml")
    assert bench.invariance_partitions(main) == [(0.05, 10), (0.5, 10), (0.05, 100)]


def test_secure_or_float32_grids_keep_every_federation(bench: ModuleType) -> None:
    assert not bench.partition_invariant(_cfg(secure=True))
    assert not bench.partition_invariant(_cfg(transport_dtype=["float64", "float32"]))
    with pytest.raises(ConfigError, match=r"^x: invariance_check needs at least two \(alpha, "
                                          r"clients\) settings to compare; give more alphas"):
        bench.invariance_partitions(_cfg(name="x", alphas=[0.1], clients=[5]))
    with pytest.raises(ConfigError, match=r"invariance_check must be true or false"):
        _cfg(invariance_check="yes")


def test_the_check_measures_a_zero_spread_and_every_section_states_it(
        bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = _cfg(invariance_check=True)
    memo = {("toy", "enc"): _features()}
    first = bench.run_experiment(bench.one_federation(full), tmp_path / "toy", features=memo,
                                 plots=False)
    args = argparse.Namespace(resume=False, progress=False)
    check = bench.run_invariance(full, "toy_cfg", tmp_path / "toy", first, memo, args)
    assert check["partitions"] == [[0.05, 3, 0], [0.5, 3, 0], [0.05, 8, 0]]
    assert {r["head"] for r in check["rows"]} == {"nb", "lda", "qda"}
    assert all(len(r["accuracies"]) == 3 for r in check["rows"])
    assert check["spread"] == 0.0  # the heads are fitted from the same total
    monkeypatch.setattr(bench, "check_config", lambda: "toy")
    assert bench.read_invariance(tmp_path) == check
    data = {**bench._results(tmp_path / "toy" / "results.json"), "machine": "m",
            "date": "2025-01-01"}
    text = bench.render_experiment("toy", data)
    assert ("One federation (α = 0.05, 3 clients, seed 0); heads are partition invariant, "
            "checked on `toy_cfg`: spread 0.0000 points (largest accuracy difference of any "
            "head over 3 partitions: α = 0.05, 3 clients; α = 0.5, 3 clients; α = 0.05, 8 "
            "clients; seed 0).") in text
    own = bench.render_experiment("toy_cfg", data)
    assert "### Partition invariance" in own and "| toy | enc | full | - | lda |" in own
    data["invariance"] = None
    assert ("heads are partition invariant, to be checked on `toy` (its invariance part has "
            "not run yet: benchmarks/bench_experiments.py toy).") in bench.render_experiment(
                "toy", data)
    data["invariance_config"] = None
    assert "heads are partition invariant, not yet checked (set invariance_check = true" \
        in bench.render_experiment("toy", data)
    two = [*first, *({**r, "seed": 1} for r in first if r["mode"] != "reference")]
    assert bench.invariance_note(two, check) == ""  # a full grid shows its own spread


def test_a_check_on_a_grid_that_is_not_invariant_is_refused(
        bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secure = _cfg(secure=True, clip=5.0)
    assert bench.federation_grid(secure, "s") is secure  # every federation of the grid
    assert bench.federation_grid(_cfg(), "p").n_cells() == 1
    with pytest.raises(ConfigError, match=(
            r"^s: invariance_check is for a config whose heads are partition invariant \(plain "
            r"float64 uploads\); drop it or the secure/float32 setting$")):
        bench.federation_grid(replace(secure, invariance_check=True), "s")
    for name in ("a", "b"):
        (tmp_path / f"{name}.toml").write_text('datasets = ["toy"]\ninvariance_check = true\n')
    monkeypatch.setattr(bench, "CONFIGS", tmp_path)
    with pytest.raises(ConfigError, match=r"^invariance_check is set in a, b; set it in one "
                                          r"config only$"):
        bench.check_config()


def test_the_summary_names_the_code_of_every_experiment(bench: ModuleType,
                                                        tmp_path: Path) -> None:
    assert code_sentence(bench._folder(tmp_path)) == ""
    for name, extra in (("a_cfg", {"code": {"commit": "abc123abc123", "changed_files": 0}}),
                        ("b_cfg", {"code": {"commit": "def456def456", "changed_files": 2}}),
                        ("c_cfg", {})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps({"records": [], **extra}))
    data = bench._folder(tmp_path)
    assert code_sentence(data) == (
        "Code measured: commit `abc123abc123` (1 part); commit `def456def456` with 2 changed "
        "source files, committed with these results (1 part); 1 part names no commit.")
    assert bench._render_summary(data) == bench.summary(tmp_path)


def test_a_resumed_run_keeps_the_code_record_of_the_results_it_keeps(
        bench: ModuleType, tmp_path: Path) -> None:
    folder = tmp_path / "cfg"
    assert bench._earlier_code(folder) is None  # nothing kept: the run records its own code
    folder.mkdir()
    rec = {"commit": "abc123abc123", "changed_files": 0, "sources": {}}
    (folder / "results.json").write_text(json.dumps({"records": [], "code": rec}))
    assert bench._earlier_code(folder) is None
    (folder / "results.json").write_text(json.dumps({"records": [{"head": "lda"}], "code": rec}))
    assert bench._earlier_code(folder) == (rec,)
    (folder / "results.json").write_text(json.dumps({"records": [{"head": "lda"}]}))
    assert bench._earlier_code(folder) == (None,)  # kept records of unknown code: none
