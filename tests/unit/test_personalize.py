"""Personalisation: the client's priors and class Gaussians in a copy of the global model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ghofl.data.partition import dirichlet_partition
from ghofl.errors import ConfigError, InputError
from ghofl.heads.fedcgs import FedCGSHead
from ghofl.heads.lda import LDAHead
from ghofl.heads.nb import NBDiagHead
from ghofl.heads.ncm import NCMHead
from ghofl.heads.qda import QDAHead
from ghofl.model.directory import load_model, save_model
from ghofl.model.personalize import local_priors, personalize_heads, save_personalized
from ghofl.moments.core import compute_moments
from ghofl.stats.accumulate import compute_stats

C, D = 5, 6
CLASSES = tuple(f"c{i}" for i in range(C))


def _gaussians(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=1.0, size=(C, D))


def _draw(means: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return means[y] + rng.normal(size=(y.size, D))


def _heads() -> dict[str, object]:
    return {"nb": NBDiagHead(var_smoothing=0.0), "lda": LDAHead(shrinkage=0.1),
            "qda": QDAHead(shrinkage=0.2, shrinkage_target="scaled_identity"),
            "fedcgs": FedCGSHead(), "ncm": NCMHead()}


def test_personalised_priors_equal_a_refit_with_the_clients_priors() -> None:
    rng = np.random.default_rng(0)
    means = _gaussians(0)
    y = rng.integers(0, C, size=600)
    x = _draw(means, y, rng)
    total = compute_stats(x, y, CLASSES, mode="full")
    moments = compute_moments(total)
    heads = {n: h.fit_from_moments(moments) for n, h in _heads().items()}  # type: ignore[attr-defined]
    mine = np.flatnonzero(np.isin(y, [0, 1, 1, 3]) & (rng.random(y.size) < 0.5))
    local = compute_stats(x[mine], y[mine], CLASSES, mode="full")
    out, record = personalize_heads(heads, total.counts, local)  # type: ignore[arg-type]
    pri = local_priors(local.counts, total.counts)
    assert pri[2] > 0 and pri.sum() == pytest.approx(1.0)
    refit = {n: h.fit_from_moments(replace(moments, priors=pri))  # type: ignore[attr-defined]
             for n, h in _heads().items()}
    xt = _draw(means, rng.integers(0, C, size=200), rng)
    for name in ("nb", "lda", "qda", "fedcgs"):
        assert record.heads[name] == ["priors"]
        np.testing.assert_allclose(out[name].predict_proba(xt), refit[name].predict_proba(xt),
                                   rtol=1e-9, atol=1e-12)
        assert not np.allclose(out[name].predict_proba(xt), heads[name].predict_proba(xt))
    assert record.heads["ncm"] == [] and "without class priors" in record.skipped["ncm/priors"]
    np.testing.assert_array_equal(out["ncm"].predict(xt), heads["ncm"].predict(xt))


def _skewed_gain(seed: int, moments: bool) -> float:
    """Mean gain of accuracy over 10 clients (α = 0.1) on each client's own class mix."""
    rng = np.random.default_rng(seed)
    means = _gaussians(seed) * 0.6  # overlapping classes: the priors matter
    y = rng.integers(0, C, size=3000)
    x = _draw(means, y, rng)
    parts = dirichlet_partition(y, 10, 0.1, seed, min_per_client=20)
    total = compute_stats(x, y, CLASSES, mode="full")
    head = {"lda": LDAHead(shrinkage=0.1).fit_from_stats(total)}
    gains = []
    for idx in parts:
        local = compute_stats(x[idx], y[idx], CLASSES, mode="full")
        mix = local.counts / local.counts.sum()
        yt = rng.choice(C, size=400, p=mix)
        xt = _draw(means, yt, rng)
        mine, _ = personalize_heads(head, total.counts, local, moments=moments)
        gains.append(np.mean(mine["lda"].predict(xt) == yt)
                     - np.mean(head["lda"].predict(xt) == yt))
    return float(np.mean(gains))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_local_priors_raise_accuracy_under_label_skew(seed: int) -> None:
    assert _skewed_gain(seed, moments=False) > 0.05


def test_moments_mix_the_class_gaussians_by_the_stated_rule() -> None:
    rng = np.random.default_rng(4)
    means = _gaussians(4)
    y = rng.integers(0, C, size=800)
    x = _draw(means, y, rng)
    total = compute_stats(x, y, CLASSES, mode="full")
    heads = {"nb": NBDiagHead().fit_from_stats(total),
             "qda": QDAHead(shrinkage=0.1).fit_from_stats(total)}
    idx = np.flatnonzero(y < 2)[:60]
    shifted = x[idx] + 0.5  # the client's own feature shift
    local = compute_stats(shifted, y[idx], CLASSES, mode="full")
    out, record = personalize_heads(heads, total.counts, local, priors=False, moments=True,
                                    kappa=30.0)
    assert record.heads == {"nb": ["moments"], "qda": ["moments"]}
    n0 = int(local.counts[0])
    w = n0 / (n0 + 30.0)
    mu0 = shifted[y[idx] == 0].mean(axis=0)
    for name in ("nb", "qda"):
        np.testing.assert_allclose(out[name].means_[0],  # type: ignore[attr-defined]
                                   w * mu0 + (1 - w) * heads[name].means_[0])  # type: ignore[attr-defined]
        np.testing.assert_array_equal(out[name].means_[4], heads[name].means_[4])  # type: ignore[attr-defined]
    # QDA's covariance of an untouched class is unchanged, of class 0 the moment-matched mixture
    np.testing.assert_array_equal(out["qda"].precision_chol_[4],  # type: ignore[attr-defined]
                                  heads["qda"].precision_chol_[4])  # type: ignore[attr-defined]
    p = heads["qda"].precision_chol_[0]  # type: ignore[attr-defined]
    cov_g = np.linalg.inv(p @ p.T)
    d0 = shifted[y[idx] == 0]
    cov_l = np.cov(d0, rowvar=False, bias=True)
    delta = mu0 - heads["qda"].means_[0]  # type: ignore[attr-defined]
    want = w * cov_l + (1 - w) * cov_g + w * (1 - w) * np.outer(delta, delta)
    q = out["qda"].precision_chol_[0]  # type: ignore[attr-defined]
    np.testing.assert_allclose(np.linalg.inv(q @ q.T), want, rtol=1e-8, atol=1e-10)
    diag = compute_stats(shifted, y[idx], CLASSES, mode="gram")
    _, rec = personalize_heads(heads, total.counts, diag, priors=False, moments=True)
    assert "--mode full" in rec.skipped["qda/moments"]


def test_the_written_directory_loads_and_predicts(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    means = _gaussians(5)
    y = rng.integers(0, C, size=500)
    x = _draw(means, y, rng)
    total = compute_stats(x, y, CLASSES, mode="full")
    heads = {"nb": NBDiagHead().fit_from_stats(total), "lda": LDAHead().fit_from_stats(total)}
    save_model(tmp_path / "global", heads, stats_meta=total.meta,
               extra={"stats": {"n_samples": total.n_samples, "counts": total.counts.tolist()},
                      "default_head": "lda", "default_head_rule": "test rule",
                      "license": "MIT"})
    model = load_model(tmp_path / "global")
    local = compute_stats(x[y < 2], y[y < 2], CLASSES, mode="full")
    save_personalized(tmp_path / "mine", model, tmp_path / "global", local, "client.ghs",
                      moments=True)
    mine = load_model(tmp_path / "mine")
    rec = mine.manifest["personalised"]
    assert rec["from_stats"] == "client.ghs" and rec["priors"] == "local"
    assert rec["heads"] == {"nb": ["priors", "moments"], "lda": ["priors"]}
    assert rec["local_counts"] == local.counts.tolist()
    assert (mine.default_head, mine.manifest["license"]) == ("lda", "MIT")
    card = (tmp_path / "mine" / "MODEL_CARD.md").read_text()
    assert "## Personalisation" in card and "- From statistics: client.ghs" in card
    assert "- Heads personalised: `nb` (priors, moments), `lda` (priors)" in card
    assert "local, shrunk to the global (w_c = n_c / (n_c + kappa), kappa = 50" in card
    pred = mine.predict(x[:50], head="lda")
    assert set(np.unique(pred)) <= {0, 1, 2, 3, 4}
    assert np.mean(mine.predict(x[y < 2], head="lda") == y[y < 2]) >= np.mean(
        model.predict(x[y < 2], head="lda") == y[y < 2])
    with pytest.raises(InputError, match="already personalised"):
        save_personalized(tmp_path / "again", mine, tmp_path / "mine", local, "client.ghs")


def test_bad_requests_are_refused() -> None:
    rng = np.random.default_rng(6)
    y = rng.integers(0, C, size=100)
    x = _draw(_gaussians(6), y, rng)
    total = compute_stats(x, y, CLASSES, mode="full")
    heads = {"nb": NBDiagHead().fit_from_stats(total)}
    with pytest.raises(ConfigError, match="nothing to personalise"):
        personalize_heads(heads, total.counts, total, priors=False)
    with pytest.raises(ConfigError, match="kappa must be a finite number > 0"):
        personalize_heads(heads, total.counts, total, moments=True, kappa=0.0)
    other = compute_stats(x, y, tuple(f"k{i}" for i in range(C)), mode="full")
    with pytest.raises(InputError, match="not the model's"):
        personalize_heads(heads, total.counts, other)
    with pytest.raises(ConfigError, match="pseudo-count must be a finite number >= 0"):
        local_priors(total.counts, total.counts, -1.0)
    with pytest.raises(InputError, match="model's class counts must be"):
        personalize_heads(heads, np.zeros(C), total)
