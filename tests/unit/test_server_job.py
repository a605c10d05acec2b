"""ServerJob (flat config round trip, validation) and run_server_job (fit, save, score)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, InputError, UnsupportedModeError
from ghofl.heads import make_head
from ghofl.model.directory import MANIFEST, load_model
from ghofl.server.job import ServerJob, run_server_job
from ghofl.stats import ClientStats, compute_stats
from tests.helpers import gaussian_mixture


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    x, y = gaussian_mixture(8, num_classes=3, dim=4, n=300)
    return {"total": compute_stats(x[:200], y[:200], ("a", "b", "c")),
            "xte": x[200:], "yte": y[200:]}


# ---------------------------------------------------------------------- config
def test_config_round_trip() -> None:
    job = ServerJob(("nb", "lda"), {"lda": {"shrinkage": "auto"}}, seed=3, progress=True)
    config = job.to_config()
    assert config == {"heads": "nb,lda", "head_params": '{"lda": {"shrinkage": "auto"}}',
                      "seed": 3, "progress": True, "preset": "default"}
    assert ServerJob.from_config(config) == job
    assert ServerJob.from_config(ServerJob(("nb",)).to_config()) == ServerJob(("nb",))
    loose = ServerJob.from_config({"heads": ["nb"], "head_params": "", "seed": "2",
                                   "progress": "false", "classes": "ignored"})
    assert loose == ServerJob(("nb",), seed=2)
    assert ServerJob("nb,lda").heads == ("nb", "lda")  # type: ignore[arg-type]
    paper = ServerJob(("lda",), {"lda": {"shrinkage": 0.2}}, preset="paper")
    assert paper.to_config()["preset"] == "paper"
    assert ServerJob.from_config(paper.to_config()) == paper
    assert ServerJob.from_config({"heads": "lda", "preset": " paper "}).preset == "paper"


def test_preset_values_are_overridden_by_head_params() -> None:
    job = ServerJob(("nb", "lda", "qda"), {"qda": {"shrinkage": 0.3}}, preset="paper")
    params = job.resolved_params()
    assert params["lda"] == {"shrinkage": 0.05, "covariance_divisor": "n-c"}
    assert params["qda"]["shrinkage"] == 0.3  # head_params win, key by key
    assert params["qda"]["shrinkage_target"] == "scaled_identity"
    assert params["nb"] == {"var_smoothing": 0.0, "var_floor": 1e-6}
    assert job.head_params == {"qda": {"shrinkage": 0.3}}  # kept as given
    assert ServerJob(("lda",)).resolved_params() == {}


@pytest.mark.parametrize(
    ("config", "pattern"),
    [
        ({}, r"server job config has no key 'heads'"),
        ({"heads": "nb,svm"}, r"unknown head 'svm'; available heads: nb, lda"),
        ({"heads": "nb", "seed": "x"}, r"server job config key 'seed' must be an integer"),
        ({"heads": "nb", "seed": -1}, r"seed must be a non-negative integer; got -1"),
        ({"heads": "nb", "progress": "maybe"},
         r"server job config key 'progress' must be true or false"),
        ({"heads": "nb", "head_params": "{bad"},
         r"server job config key 'head_params' is not valid JSON"),
        ({"heads": "nb", "head_params": "[1]"},
         r"server job config key 'head_params' must be a JSON object"),
        ({"heads": "lda", "head_params": '{"lda": {"foo": 1}}'},
         r"head 'lda' has no parameter 'foo'; valid parameters: covariance_divisor, shrinkage"),
        ({"heads": "lda", "head_params": '{"lda": {"shrinkage": 3.0}}'},
         r"shrinkage must be a number in \[0, 1\] or 'auto'"),
        ({"heads": "lda", "head_params": '{"lda": 2}'},
         r"ServerJob head_params must map head names to dicts"),
        ({"heads": "lda", "preset": "fast"},
         r"unknown preset 'fast'; available presets: default, paper"),
        ({"heads": "lda", "preset": 1},
         r"server job config key 'preset' must be a preset name \(a string\); got 1"),
    ],
)
def test_config_errors_name_the_key(config: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        ServerJob.from_config(config)


def test_strict_config_rejects_unknown_keys() -> None:
    with pytest.raises(ConfigError, match=r"server job config has the unknown key 'head'"):
        ServerJob.from_config({"heads": "nb", "head": "x"}, strict=True)


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
