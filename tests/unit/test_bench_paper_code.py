"""The pure parts of the benchmark beside the paper's code (ghofl.bench.paper_code)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

from ghofl.bench.paper_code import (
    CLIENT_SCRIPT,
    CONFIG,
    SERVER_DEFAULTS,
    SERVER_SCRIPT,
    PaperCodeError,
    check_paper_repo,
    load_paper_code,
    server_settings,
    stage_verdicts,
    stubbed_imports,
)
from tests.helpers import load_script


def _fake_repo(root: Path, client: str = "X = 1\n", server: str = "Y = 2\n") -> Path:
    for rel, text in ((CLIENT_SCRIPT, client), (SERVER_SCRIPT, server), (CONFIG, "seed: 1\n")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_check_paper_repo_says_how_to_get_the_checkout(tmp_path: Path) -> None:
    with pytest.raises(PaperCodeError, match=r"No checkout of the paper's code was given: "
                       r"clone the paper's code \(git clone https://github.com/FabioTur-dev"):
        check_paper_repo(None)
    (tmp_path / "client").mkdir()
    (tmp_path / CLIENT_SCRIPT).write_text("")
    with pytest.raises(PaperCodeError, match=r"is not a checkout of the paper's code "
                       r"\(server/GH_OFL_server.py, configs/cifar10.yaml missing\).*--repo"):
        check_paper_repo(tmp_path, flag="--repo")
    _fake_repo(tmp_path)
    assert check_paper_repo(tmp_path) == tmp_path.resolve()


def test_stubbed_imports_replace_then_restore() -> None:
    before = {n: sys.modules.get(n) for n in ("torchvision", "models")}
    with stubbed_imports():
        transforms = importlib.import_module("torchvision").transforms
        models = importlib.import_module("models")
        assert transforms is sys.modules["torchvision.transforms"]
        with pytest.raises(PaperCodeError, match=r"the paper's backbone is stubbed"):
            models.build_backbone("resnet18", None)
    assert all(sys.modules.get(n) is m for n, m in before.items())


def test_load_paper_code_imports_the_files_unmodified(tmp_path: Path) -> None:
    client = ("from dataclasses import dataclass\nfrom torchvision import datasets\n"
              "from models import build_backbone\n@dataclass\nclass M:\n    a: int\n")
    models = sys.modules.get("models")
    code = load_paper_code(_fake_repo(tmp_path, client=client))
    assert code.client.M(3).a == 3 and code.server.Y == 2
    assert code.repo == tmp_path.resolve() and sys.modules.get("models") is models


def test_load_paper_code_names_a_missing_dependency(tmp_path: Path) -> None:
    _fake_repo(tmp_path, server="import ghofl_no_such_module\n")
    with pytest.raises(PaperCodeError, match=r"GH_OFL_server.py failed .*needs torch and PyYAML"):
        load_paper_code(tmp_path)


def test_server_settings_defaults_then_config() -> None:
    assert server_settings(None) == SERVER_DEFAULTS
    got = server_settings({"qda_shrink": "0.1", "fm_epochs": 40.0, "syn_tau_clip": [0.6, 1],
                           "syn_use_class_cov": 0, "unread": 1})
    assert got["qda_shrink"] == 0.1 and got["fm_epochs"] == 40
    assert isinstance(got["fm_epochs"], int)
    assert got["syn_tau_clip"] == (0.6, 1.0) and got["syn_use_class_cov"] is False
    assert "unread" not in got and got["lda_shrink"] == SERVER_DEFAULTS["lda_shrink"]


def test_stage_verdicts_targets() -> None:
    fit = stage_verdicts("fit_lda", {"paper": 0.1, "ghofl_paper": 0.05, "ghofl_default": 0.12})
    assert fit["ratio_paper"] == pytest.approx(0.5) and fit["verdict_paper"] == "met"
    # a default fit is judged against ghofl's own fixed-coefficient fit, at most 2x
    assert fit["ratio_default"] == pytest.approx(2.4) and fit["verdict_default"] == "NOT met"
    ev = stage_verdicts("eval_qda", {"paper": 1.0, "ghofl_paper": 1.5, "ghofl_default": 0.5})
    assert ev["verdict_paper"] == "NOT met" and ev["ratio_default"] == pytest.approx(0.5)
    assert ev["verdict_default"] == "met"
    nb = stage_verdicts("fit_nb", {"paper": None, "ghofl_paper": 0.01, "ghofl_default": 0.01})
    assert nb["ratio_paper"] is None and nb["verdict_paper"] == "n/a"
    assert nb["verdict_default"] == "met"
    agg = stage_verdicts("aggregation", {"paper": 2.0, "ghofl_paper": 1.0})
    assert agg["verdict_paper"] == "met" and agg["verdict_default"] == "n/a"


def test_stage_rows_align_the_paper_stages() -> None:
    bench: Any = load_script(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_paper.py",
                             "bench_paper")
    times = {"paper/aggregation": 1.0, "ghofl_paper/aggregation": 0.7,
             "ghofl_paper/moments": 0.2, "paper/fit_lda": 0.05,
             "ghofl_paper/fit_from_moments_lda": 0.04, "ghofl_default/fit_from_moments_lda": 0.1,
             "ghofl_paper/fit_from_moments_nb": 0.01}
    rows = {r["stage"]: r for r in bench.stage_rows({"parts": {"closed": {"times": times}}})}
    # aggregation + moments: ghofl's two medians added, against the paper's aggregation alone
    both = rows["aggregation_moments"]
    assert both["paper"] == 1.0 and both["ghofl_paper"] == pytest.approx(0.9)
    assert both["verdict_paper"] == "met" and both["ghofl_default"] is None
    # a fit from the moments is judged against the paper's fit, which starts there too
    lda = rows["fit_from_moments_lda"]
    assert lda["paper"] == 0.05 and lda["ratio_paper"] == pytest.approx(0.8)
    # the default's cost (at most 2x) is judged on the whole fit, moments included
    assert lda["ghofl_default"] == 0.1 and lda["verdict_default"] == "n/a"
    assert rows["fit_from_moments_nb"]["verdict_paper"] == "n/a"  # the paper has no NB fit
    assert "fit_qda" not in rows and "aggregation_loads" not in rows
    del times["ghofl_paper/moments"]
    assert "aggregation_moments" not in {
        r["stage"] for r in bench.stage_rows({"parts": {"closed": {"times": times}}})}


def test_render_names_the_trained_heads_test_set_only_when_it_differs() -> None:
    bench: Any = load_script(Path(__file__).resolve().parents[2] / "benchmarks" / "bench_paper.py",
                             "bench_paper")
    trained = {"n_test": 1000, "n_test_eval": 10000}
    assert "on 10,000 test samples (`--trained-test-per-class`)" in bench._eval_rows_clause(
        {"trained": trained})
    assert bench._eval_rows_clause({"trained": {**trained, "n_test_eval": 1000}}) == ""
    assert bench._eval_rows_clause({"trained": {"n_test": 1000}}) == ""  # saved before
    assert bench._eval_rows_clause({"closed": {"n_test": 1000}}) == ""
