"""ServerJob (run-config round trip, validation) and run_server_job (fit, save, score)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError, InputError, UnsupportedModeError
from ghofl.heads import make_head
from ghofl.model.directory import MANIFEST, load_model
from ghofl.server.config import plan_from_config, plan_to_config
from ghofl.server.fields import FIELDS
from ghofl.server.job import ServerJob, run_server_job
from ghofl.server.plan import FederationPlan
from ghofl.stats import ClientStats, compute_stats
from tests.helpers import gaussian_mixture


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    x, y = gaussian_mixture(8, num_classes=3, dim=4, n=300)
    return {"total": compute_stats(x[:200], y[:200], ("a", "b", "c")),
            "xte": x[200:], "yte": y[200:]}


# ---------------------------------------------------------------------- config
def _server(config: dict[str, Any]) -> ServerJob:
    """The server job of a run config (with a class list, which every plan needs)."""
    return plan_from_config({"classes": "a,b", **config}).server


def test_config_round_trip() -> None:
    job = ServerJob(("nb", "lda"), {"lda": {"shrinkage": "auto"}}, seed=3, progress=True)
    config = plan_to_config(FederationPlan(ClientJob(("a", "b")), server=job))
    assert {k: config[k] for k in ("heads", "head_params", "seed", "progress", "preset")} == {
        "heads": "nb,lda", "head_params": '{"lda": {"shrinkage": "auto"}}', "seed": 3,
        "progress": True, "preset": "default"}
    assert _server(config) == job
    assert _server({"heads": ["nb"], "head_params": ""}) == ServerJob(("nb",))
    assert ServerJob("nb,lda").heads == ("nb", "lda")  # type: ignore[arg-type]
    paper = ServerJob(("lda",), {"lda": {"shrinkage": 0.2}}, preset="paper")
    assert _server(plan_to_config(FederationPlan(ClientJob(("a",)), server=paper))) == paper


def test_without_heads_the_config_and_the_job_fit_the_tables_heads() -> None:
    assert _server({}).heads == ServerJob().heads == FIELDS["server.heads"].default


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({"heads": "nb,svm"}, r"unknown head 'svm'; available heads: nb, lda"),
        ({"heads": "nb", "seed": "x"}, r"^run config key 'seed' must be an integer; got 'x'$"),
        ({"heads": "nb", "seed": -1}, r"seed must be a non-negative integer; got -1"),
        ({"heads": "nb", "progress": "maybe"},
         r"^run config key 'progress' must be true or false; got 'maybe'$"),
        ({"heads": 3}, r"^run config key 'heads' must be a comma-separated string of heads or a "
                       r"list; got 3$"),
        ({"heads": "nb", "head_params": "{bad"},
         r"^run config key 'head_params' is not valid JSON"),
        ({"heads": "nb", "head_params": "[1]"},
         r"^run config key 'head_params' must be a JSON object"),
        ({"heads": "lda", "head_params": '{"lda": {"foo": 1}}'},
         r"head 'lda' has no parameter 'foo'; valid parameters: covariance_divisor, shrinkage"),
        ({"heads": "lda", "head_params": '{"lda": {"shrinkage": 3.0}}'},
         r"shrinkage must be a number in \[0, 1\] or 'auto'"),
        ({"heads": "lda", "head_params": '{"lda": 2}'},
         r"ServerJob head_params must map head names to dicts"),
        ({"heads": "lda", "preset": "fast"},
         r"unknown preset 'fast'; available presets: default, paper"),
        ({"heads": "lda", "preset": 1}, r"^run config key 'preset' must be a string; got 1$"),
    ],
)
def test_config_errors_name_the_key(config: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        _server(config)


def test_preset_values_are_overridden_by_head_params() -> None:
    job = ServerJob(("nb", "lda", "qda"), {"qda": {"shrinkage": 0.3}}, preset="paper")
    params = job.resolved_params()
    assert params["lda"] == {"shrinkage": 0.05, "covariance_divisor": "n-c"}
    assert params["qda"]["shrinkage"] == 0.3  # head_params win, key by key
    assert params["qda"]["shrinkage_target"] == "scaled_identity"
    assert params["nb"] == {"var_smoothing": 0.0, "var_floor": 1e-6}
    assert job.head_params == {"qda": {"shrinkage": 0.3}}  # kept as given
    assert ServerJob(("lda",)).resolved_params() == {}


# ---------------------------------------------------------------------- running
def test_run_writes_a_model_dir_that_predicts_identically(
    data: dict[str, Any], tmp_path: Path
) -> None:
    total: ClientStats = data["total"]
    job = ServerJob(("nb", "lda", "qda"), {"qda": {"shrinkage": 0.2}})
    logged: list[str] = []
    result = run_server_job(total, job, out_dir=tmp_path / "model", test=(data["xte"],
                            data["yte"]), extra={"stats": {"source": "t.ghs"}},
                            log=logged.append)
    assert logged == ["fitting nb...", "fitting lda...", "fitting qda..."]
    assert result.model_dir == tmp_path / "model"
    heads, manifest = load_model(tmp_path / "model")
    assert list(heads) == ["nb", "lda", "qda"]
    assert manifest["stats"]["n_samples"] == 200 and manifest["stats"]["source"] == "t.ghs"
    assert manifest["stats"]["counts"] == total.counts.tolist()
    assert manifest["heads"]["qda"]["params"]["shrinkage"] == 0.2
    assert manifest["heads"]["nb"]["fit_seconds"] == result.fit_seconds["nb"]
    assert result.scores is not None
    for name, head in heads.items():
        pred = head.predict(data["xte"])
        np.testing.assert_array_equal(pred, result.heads[name].predict(data["xte"]))
        np.testing.assert_array_equal(pred, result.scores[name].predictions)
        central = make_head(name, **job.head_params.get(name, {})).fit_from_stats(total)
        assert result.scores[name].accuracy == central.score(data["xte"], data["yte"])
    out = json.loads(json.dumps(result.to_dict()))
    assert set(out["heads"]["lda"]) == {"fit_seconds", "params", "accuracy", "n",
                                        "predict_seconds"}
    assert out["model_dir"] == str(tmp_path / "model") and "ghofl_version" in out


def test_run_fits_with_the_preset(data: dict[str, Any], tmp_path: Path) -> None:
    job = ServerJob(("lda", "qda"), {"qda": {"shrinkage": 0.3}}, preset="paper")
    result = run_server_job(data["total"], job, out_dir=tmp_path / "model")
    assert result.heads["lda"].get_params()["shrinkage"] == 0.05
    assert result.heads["qda"].get_params()["shrinkage"] == 0.3
    _, manifest = load_model(tmp_path / "model")
    assert manifest["heads"]["lda"]["params"]["covariance_divisor"] == "n-c"
    default = run_server_job(data["total"], ServerJob(("lda",)))
    assert default.heads["lda"].get_params()["shrinkage"] == "auto"


def test_run_without_outputs_only_fits(data: dict[str, Any], tmp_path: Path) -> None:
    result = run_server_job(data["total"], ServerJob(("nb",)))
    assert result.scores is None and result.model_dir is None
    assert set(result.to_dict()["heads"]["nb"]) == {"fit_seconds", "params"}


def test_checks_happen_before_any_fitting(data: dict[str, Any], tmp_path: Path) -> None:
    pooled = compute_stats(data["xte"], data["yte"], 3, "pooled")
    with pytest.raises(UnsupportedModeError, match=r"head 'qda' needs upload mode 'full'"):
        run_server_job(pooled, ServerJob(("nb", "qda")), out_dir=tmp_path / "m")
    with pytest.raises(InputError, match=r"test embeddings have d=3 but the statistics were "
                       r"computed from d=4"):
        run_server_job(data["total"], ServerJob(("nb",)), out_dir=tmp_path / "m",
                       test=(data["xte"][:, :3], data["yte"]))
    with pytest.raises(InputError, match=r"the test set is empty"):
        run_server_job(data["total"], ServerJob(("nb",)), test=(data["xte"][:0],
                                                                data["yte"][:0]))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x.txt").write_text("x")
    with pytest.raises(InputError, match=r"refusing to replace out_dir"):
        run_server_job(data["total"], ServerJob(("nb",)), out_dir=tmp_path / "busy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_a_failed_save_leaves_no_model_dir(
    data: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ghofl.model.directory as model_dir

    def boom(*_a: object, **_k: object) -> int:
        raise OSError("disk full")

    monkeypatch.setattr(model_dir, "save_head", boom)
    with pytest.raises(OSError, match="disk full"):
        run_server_job(data["total"], ServerJob(("nb", "lda")), out_dir=tmp_path / "m")
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path / "m" / MANIFEST).exists()
