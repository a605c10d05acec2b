"""The default head (issue 45): chosen at fit time by a stated rule, never the first written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import ConfigError
from ghofl.heads import make_head
from ghofl.model.directory import load_model, save_model
from ghofl.server.default_head import (
    DEFAULT_HEAD_RULE,
    PREFERENCE,
    choose_default_head,
    heldout_accuracy,
)
from ghofl.server.job import ServerJob, run_server_job
from ghofl.stats import compute_stats
from ghofl.stats.client_stats import ClientStats

CLASSES = ("a", "b", "c")


def _correlated(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Classes separated along a direction of small variance in strongly correlated features:
    LDA (whitening) separates them, naive Bayes (diagonal) far less."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(3), n)
    base = rng.standard_normal((y.size, 1)) * 3.0
    x = np.hstack([base + 0.3 * rng.standard_normal((y.size, 1)),
                   base + 0.3 * rng.standard_normal((y.size, 1)),
                   rng.standard_normal((y.size, 2))])
    shift = np.array([[0.0, 0, 0, 0], [0.6, -0.6, 0, 0], [-0.6, 0.6, 0, 0]])
    return x + shift[y], y


def _stats(holdout: float, mode: str = "full", n: int = 200) -> ClientStats:
    x, y = _correlated(n, 0)
    return compute_stats(x, y, CLASSES, mode=mode, holdout_fraction=holdout)  # type: ignore[arg-type]


def _fit(stats: ClientStats, names: tuple[str, ...]) -> dict[str, object]:
    return {n: make_head(n).fit_from_stats(stats) for n in names}


def test_with_a_holdout_the_best_head_on_held_out_statistics_wins() -> None:
    stats = _stats(0.3)
    heads = _fit(stats, ("nb", "lda"))  # nb written first
    name, rule = choose_default_head(stats, heads, {}, seed=0)  # type: ignore[arg-type]
    assert name == "lda"
    assert rule.startswith("best estimated accuracy on the clients' held-out statistics (lda ")
    accs = dict(part.rsplit(" ", 1) for part in rule.split("(")[1].rstrip(")").split(", "))
    assert float(accs["lda"]) > float(accs["nb"]) + 0.1


def test_the_held_out_estimate_tracks_real_held_out_accuracy() -> None:
    stats = _stats(0.3, n=3000)
    fit, held = stats.fitting_part(), stats.holdout
    assert held is not None
    heads = _fit(fit, ("nb", "lda"))
    from ghofl.moments.core import compute_moments

    moments = compute_moments(held, allow_empty_classes=True)
    cov = moments.within_scatter / (moments.n_samples - 3)  # type: ignore[operator]
    est = heldout_accuracy(heads, moments, cov, seed=1)  # type: ignore[arg-type]
    x, y = _correlated(2000, 7)
    for name, head in heads.items():
        real = float(np.mean(head.predict(x) == y))  # type: ignore[attr-defined]
        assert est[name] == pytest.approx(real, abs=0.05), name


def test_without_a_holdout_lda_then_the_preference_order() -> None:
    stats = _stats(0.0)
    name, rule = choose_default_head(stats, _fit(stats, ("nb", "lda", "qda")), {}, seed=0)  # type: ignore[arg-type]
    assert (name, rule) == ("lda", "lda is fitted (the upload has no held-out section)")
    name, rule = choose_default_head(stats, _fit(stats, ("nb", "ncm", "qda")), {}, seed=0)  # type: ignore[arg-type]
    assert name == "qda"
    assert rule.startswith("first fitted head in the preference order lda, qda, ")
    name, _ = choose_default_head(stats, _fit(stats, ("nb", "ncm")), {}, seed=0)  # type: ignore[arg-type]
    assert name == "ncm" and PREFERENCE.index("ncm") < PREFERENCE.index("nb")


def test_means_mode_holdout_falls_back_and_says_why() -> None:
    stats = _stats(0.3, mode="means")
    name, rule = choose_default_head(stats, _fit(stats, ("ncm",)), {}, seed=0)  # type: ignore[arg-type]
    assert name == "ncm"
    assert "the held-out section holds no second moments to score on" in rule


def test_run_server_job_records_the_default_head(tmp_path: Path) -> None:
    stats = _stats(0.3)
    run_server_job(stats, ServerJob(heads=("nb", "lda")), out_dir=tmp_path / "m")
    model = load_model(tmp_path / "m")
    assert model.manifest["default_head"] == model.default_head == "lda"
    assert model.head() is model.heads["lda"]
    assert "held-out statistics" in model.manifest["default_head_rule"]
    assert "otherwise lda when fitted" in DEFAULT_HEAD_RULE


def test_save_model_refuses_a_default_head_it_does_not_save(tmp_path: Path) -> None:
    stats = _stats(0.0)
    with pytest.raises(ConfigError, match=r"save_model extra\['default_head'\] 'qda' is not "
                       r"one of the heads saved \(nb\); name a saved head"):
        save_model(tmp_path / "m", _fit(stats, ("nb",)), stats_meta=stats.meta,  # type: ignore[arg-type]
                   extra={"default_head": "qda"})


def test_load_model_missing_ok_loads_the_heads_present(tmp_path: Path) -> None:
    from ghofl.errors import InputError, StatsFormatError

    stats = _stats(0.0)
    save_model(tmp_path / "m", _fit(stats, ("nb", "lda")), stats_meta=stats.meta)  # type: ignore[arg-type]
    (tmp_path / "m" / "lda.ghh").unlink()
    with pytest.raises(StatsFormatError):
        load_model(tmp_path / "m")
    model = load_model(tmp_path / "m", missing_ok=True)
    assert list(model.heads) == ["nb"] and model.missing == ["lda"]
    with pytest.raises(InputError, match=r"^head 'lda' is listed in the manifest, but its file "
                       r"'lda\.ghh' is missing from the model directory; copy the whole model "
                       r"directory again, or use one of the heads present \(nb\)$"):
        model.head("lda")
    (tmp_path / "m" / "nb.ghh").unlink()
    with pytest.raises(StatsFormatError, match=r"holds none of the head files its manifest "
                       r"lists \(nb\.ghh, lda\.ghh\); copy the whole model directory again"):
        load_model(tmp_path / "m", missing_ok=True)
