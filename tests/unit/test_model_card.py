"""MODEL_CARD.md: a pure function of the manifest, written by save_model, ignored by loading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl import __version__
from ghofl.heads import make_head
from ghofl.model.card import CARD_FILE, MAX_CLASS_ROWS, model_card
from ghofl.model.directory import MANIFEST, load_model, save_model
from ghofl.server.job import ServerJob, run_server_job
from ghofl.stats import compute_stats
from ghofl.stats.meta import EncoderInfo
from tests.helpers import gaussian_mixture


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], Any]:
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=120)
    enc = EncoderInfo("toy-encoder", 4, "feedbeef", "none", 32)
    stats = compute_stats(x, y, ("cat", "dog", "eel"), encoder=enc)
    heads = {"lda": make_head("lda").fit_from_stats(stats),
             "qda": make_head("qda", shrinkage=0.3).fit_from_stats(stats)}
    out = save_model(tmp_path_factory.mktemp("card") / "m", heads, stats_meta=stats.meta,
                     extra={"stats": {"n_samples": stats.n_samples,
                                      "counts": stats.counts.tolist()}},
                     command="ghofl fit total.ghs --heads lda,qda --out m")
    manifest = json.loads((out / MANIFEST).read_text())
    return out, manifest, heads


def test_save_model_writes_a_card_naming_what_the_model_is(
        model: tuple[Path, dict[str, Any], Any]) -> None:
    out, manifest, heads = model
    card = (out / CARD_FILE).read_text()
    assert card.startswith("---\nlibrary_name: ghofl\n")
    assert "\n---\n\n# Model card\n" in card
    assert f"fingerprint `{heads['lda'].meta_.encoder.fingerprint()}`" in card
    assert "`toy-encoder`, d = 4" in card and "Input resolution: 32 px" in card
    counts = manifest["stats"]["counts"]
    for name, count in zip(("cat", "dog", "eel"), counts, strict=True):
        assert f"| {name} | {count} |" in card
    assert f"- Samples: {sum(counts)}\n" in card
    assert "Clients: not recorded" in card and "Aggregation protocol: not recorded" in card
    assert "Differential privacy: none recorded" in card
    # the given parameters and what the auto rule chose
    assert "| lda | lda | shrinkage=auto, covariance_divisor=n-c |" in card
    assert f"shrinkage={heads['lda'].shrinkage_:.4g}" in card
    assert "shrinkage=0.3 (all 3)" in card  # QDA's per-class coefficients, summarised
    assert "No test data was given" in card
    assert "ghofl fit total.ghs --heads lda,qda --out m" in card
    assert f"ghofl version: {__version__}" in card
    assert "## Intended use" in card and "## Known limits" in card


def test_card_is_not_part_of_the_manifest_and_loading_ignores_it(
        model: tuple[Path, dict[str, Any], Any]) -> None:
    out, manifest, _ = model
    assert CARD_FILE not in json.dumps(manifest)
    (out / CARD_FILE).write_text("edited by hand |||\n")
    heads, again = load_model(out)
    assert list(heads) == ["lda", "qda"] and again == manifest
    (out / CARD_FILE).unlink()
    assert list(load_model(out)[0]) == ["lda", "qda"]


def test_card_reports_protocol_privacy_and_scores(
        model: tuple[Path, dict[str, Any], Any]) -> None:
    _, manifest, _ = model
    assert manifest["command"] == "ghofl fit total.ghs --heads lda,qda --out m"
    rich = {**{k: v for k, v in manifest.items() if k != "command"},
            "aggregation": {"protocol": "secure", "clients": 7, "threshold": 5},
            "privacy": {"epsilon": 4.0, "delta": 1e-6, "epsilon_spent": 3.97,
                        "delta_spent": 1e-6, "dp_mode": "central", "min_class_count": 5,
                        "neighbouring": "add/remove one sample"}}
    card = model_card(rich, scores={"lda": {"accuracy": 0.8125, "n": 64}})
    assert "- Clients: 7" in card
    assert "Aggregation protocol: secure" in card and "threshold: 5 clients" in card
    assert "(epsilon, delta) = (3.97, 1e-06), central mode" in card
    assert "noised and post-processed counts" in card and "true per-class counts are " \
        "withheld" in card
    assert "fewer than 5 samples on a client were withheld" in card
    rich["privacy"]["min_class_count_rule"] = "server, on the noised counts (post-processing)"
    assert "noised total count was below 5 were dropped by the server" in model_card(rich)
    assert "| lda | 0.8125 | 64 |" in card and "| qda |" not in card.split("## Evaluation")[1]
    assert "command that made this model was not recorded" in card


def test_many_classes_are_truncated_and_raw_features_are_said() -> None:
    c = MAX_CLASS_ROWS + 7
    manifest = {"stats": {"classes": [f"c{i}" for i in range(c)], "counts": [2] * c,
                          "mode": "diag", "encoder": None},
                "heads": {"nb": {"head": "nb", "params": {"var_smoothing": 1e-9}}}}
    card = model_card(manifest, chosen={"nb": {}})
    assert f"| c{MAX_CLASS_ROWS - 1} | 2 |" in card and f"| c{MAX_CLASS_ROWS} |" not in card
    assert "| ... 7 more | |" in card
    assert "Encoder: none recorded" in card and "ghofl version: unrecorded" in card
    assert "var_smoothing=1e-09" in card


def test_run_server_job_puts_the_test_accuracy_in_the_card(tmp_path: Path) -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=4, n=200)
    stats = compute_stats(x[:150], y[:150], 3)
    result = run_server_job(stats, ServerJob(("nb", "lda")), out_dir=tmp_path / "m",
                            test=(x[150:], y[150:]), command="ghofl fit t.ghs")
    assert result.scores is not None
    card = (tmp_path / "m" / CARD_FILE).read_text()
    for name, score in result.scores.items():
        assert f"| {name} | {score.accuracy:.4f} | {score.n} |" in card
    assert np.isclose(result.scores["lda"].accuracy,
                      result.heads["lda"].score(x[150:], y[150:]))


# ---------------------------------------------------------------------- issue 45
def _front_matter(card: str) -> dict[str, Any]:
    """The card's metadata: huggingface_hub's parser when importable, else PyYAML's."""
    try:
        from huggingface_hub import ModelCard
    except ImportError:
        yaml = pytest.importorskip("yaml", reason="needs huggingface_hub or PyYAML")
        return dict(yaml.safe_load(card.split("---\n")[1]))
    return dict(ModelCard(card).data.to_dict())


EVALUATION = {"data": "test.npz", "kind": "test", "n": 30, "clients": None,
              "heads": {"lda": {"accuracy": 0.9, "balanced_accuracy": 0.85, "macro_f1": 0.8,
                                "log_loss": 0.31, "ece": 0.04, "n": 30}}}


def test_front_matter_has_library_licence_tags_and_metrics(
        model: tuple[Path, dict[str, Any], Any]) -> None:
    _, manifest, _ = model
    plain = _front_matter(model_card(manifest))
    assert plain["library_name"] == "ghofl" and plain["license"] == "other"
    assert "ghofl" in plain["tags"] and "image-classification" in plain["tags"]
    assert "model-index" not in plain
    card = model_card({**manifest, "license": "apache-2.0", "evaluations": [EVALUATION]})
    data = _front_matter(card)
    assert data["license"] == "apache-2.0"
    (result,) = data["model-index"][0]["results"]
    assert result["dataset"]["name"] == "test.npz"
    got = {m["name"]: m["value"] for m in result["metrics"]}
    assert got == {"accuracy (lda)": 0.9, "balanced accuracy (lda)": 0.85,
                   "macro-F1 (lda)": 0.8, "log-loss (lda)": 0.31, "ECE (lda)": 0.04}
    assert "| lda | 0.9000 | 0.8500 | 0.8000 | 0.3100 | 0.0400 |" in card
    assert "Test data `test.npz` (`ghofl evaluate`), 30 items:" in card
    assert "No test data was given" not in card
    assert "- License: `apache-2.0`" in card
    assert "not set (`other`); set it with `ghofl fit --license SPDX-ID`" in model_card(manifest)


def test_federated_evaluation_is_labelled_so() -> None:
    ev = {**EVALUATION, "kind": "federated", "clients": 3, "data": "total.ghe"}
    card = model_card({"heads": {"lda": {}}, "evaluations": [ev]})
    assert "Federated evaluation (sums of 3 clients' held-out rows, `ghofl evaluate " \
        "--report`): `total.ghe`, 30 items:" in card
    assert _front_matter(card)["model-index"][0]["results"][0]["dataset"]["name"] == \
        "federated total.ghe"


def test_synthetic_validation_accuracy_is_labelled_as_such() -> None:
    card = model_card({"heads": {"fishermix": {"head": "fishermix"}}},
                      chosen={"fishermix": {"val_accuracy_": 0.918, "epochs_run_": 3}})
    assert ("val_accuracy=0.918 (validation accuracy on synthetic samples, not on real data)"
            in card)
    assert "epochs_run=3" in card


def test_card_states_the_default_head_usage_and_the_ood_score() -> None:
    manifest = {"heads": {"nb": {}, "lda": {}}, "default_head": "lda",
                "default_head_rule": "lda is fitted (the upload has no held-out section)",
                "ood": {"threshold": 12.5, "calibration": "conformal", "fpr": 0.05,
                        "n_calibration": 200, "score": "squared Mahalanobis distance"}}
    card = model_card(manifest)
    assert ("- Default head: `lda` (used by `ghofl predict` and `ghofl export` without "
            "`--head`), chosen by: lda is fitted (the upload has no held-out section)") in card
    assert "ghofl predict MODEL_DIR --data images/ --out predictions.csv" in card
    assert "ghofl export MODEL_DIR --out model.onnx" in card
    assert ("flags `ood` above the threshold 12.5, calibrated on 200 held-out "
            "in-distribution items at a false-positive rate of 0.05") in card
    assert "near-OOD" in card
    legacy = model_card({"heads": {"nb": {}, "lda": {}}})
    assert "- Default head: `nb`" in legacy and "written before the rule existed" in legacy
    assert "holds no out-of-distribution score" in legacy
