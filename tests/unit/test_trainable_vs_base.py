"""Trainable heads never below their closed-form base (issue 10 §2): model selection on
held-out synthetic samples, early stopping, the Proto-Hyper base choice, automatic sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ghofl.bench.synthetic import gaussian_classes
from ghofl.heads._training import (
    CheckpointSelector,
    TrainConfig,
    auto_samples_per_class,
    auto_val_per_class,
    run_training,
)
from ghofl.heads.fisher import fisher_subspace
from ghofl.heads.fishermix import FisherMixHead
from ghofl.heads.lda import LDAHead
from ghofl.heads.protohyper import ProtoHyperHead, base_logits, choose_base, fisher_scorers
from ghofl.heads.synthesis import fisher_gaussians
from ghofl.moments import compute_moments
from ghofl.stats import compute_stats

pytest.importorskip("torch")

FAST: dict[str, Any] = {"n_per_class": 300, "epochs": 6}


@pytest.fixture(scope="module")
def synth() -> Any:
    """A small version of the issue-10 Gaussian set (class scales 1, 1.3, 1.6)."""
    return gaussian_classes(seed=3, dim=12, num_classes=5, n_train=3000, n_test=4000)


# ---------------------------------------------------------------------- the selector
def _masks(seed: int, m: int = 400, epochs: int = 12) -> tuple[Any, list[Any]]:
    rng = np.random.default_rng(seed)
    base = rng.random(m) < 0.7
    return base, [rng.random(m) < rng.uniform(0.5, 0.9) for _ in range(epochs)]


@pytest.mark.parametrize("z", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(6))
def test_selector_never_keeps_anything_below_the_base(seed: int, z: float) -> None:
    base, epochs = _masks(seed)
    sel = CheckpointSelector(base, [np.zeros(2)], patience=None, z=z)
    for e, mask in enumerate(epochs, start=1):
        sel.offer(e, mask, lambda e=e: [np.full(2, float(e))])
    assert sel.best_score >= sel.base_score == pytest.approx(float(np.mean(base)))
    assert sel.best_score == max([sel.base_score] + [
        float(np.mean(m)) for m in epochs if sel.significant(m)])
    np.testing.assert_array_equal(sel.state[0], np.full(2, float(sel.best_epoch)))
    assert len(sel.history) == len(epochs) + 1


def test_selector_keeps_the_base_on_ties_and_on_noise() -> None:
    base = np.zeros(1000, dtype=bool)
    base[:800] = True
    sel = CheckpointSelector(base, [np.array([0.0])], patience=None, z=2.0)
    sel.offer(1, base.copy(), lambda: [np.array([1.0])])  # a tie
    noisy = base.copy()
    noisy[800:803] = True  # 3 more rows right: a − b = 3 < 2·√3
    sel.offer(2, noisy, lambda: [np.array([2.0])])
    assert sel.best_epoch == 0 and sel.state[0][0] == 0.0
    clear = base.copy()
    clear[800:840] = True  # 40 more rows right: significant
    sel.offer(3, clear, lambda: [np.array([3.0])])
    assert sel.best_epoch == 3 and sel.best_score == pytest.approx(0.84)
    lenient = CheckpointSelector(base, [np.array([0.0])], patience=None, z=0.0)
    lenient.offer(1, noisy, lambda: [np.array([1.0])])
    assert lenient.best_epoch == 1  # z = 0 takes any strict gain


def test_selector_patience_counts_epochs_without_a_new_best() -> None:
    base = np.array([True, False, False, False])
    sel = CheckpointSelector(base, [], patience=2, z=0.0)
    better = np.array([True, True, False, False])
    assert not sel.offer(1, better, list)
    assert not sel.offer(2, base, list)
    assert sel.offer(3, base, list)  # epochs 2 and 3 brought nothing new
    assert CheckpointSelector(base, [], patience=None).offer(50, base, list) is False


def test_run_training_stops_when_asked() -> None:
    import torch

    w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)

    def batches() -> Any:
        yield target[None, :], torch.zeros(1, dtype=torch.int64), None

    seen: list[int] = []

    def after(epoch: int) -> bool:
        seen.append(epoch)
        return epoch == 3

    cfg = TrainConfig(lr=0.1, weight_decay=0.0, epochs=10, progress=False, desc="t")
    loss, run = run_training([w], lambda z, y, e: ((w - z[0]) ** 2).sum(), batches, cfg, after)
    assert run == 3 and seen == [1, 2, 3] and np.isfinite(loss)
    assert run_training([w], lambda z, y, e: ((w - z[0]) ** 2).sum(), batches, cfg)[1] == 10


def test_automatic_sample_counts() -> None:
    assert [auto_samples_per_class(c) for c in (2, 10, 50, 100, 200, 1000)] == [
        4000, 4000, 4000, 2000, 1000, 1000]
    assert [auto_val_per_class(c) for c in (2, 10, 50, 200, 1000)] == [
        1000, 1000, 1000, 250, 100]


# ---------------------------------------------------------------------- the base choice
def test_choose_base_needs_a_significant_gain(synth: Any) -> None:
    m = compute_moments(compute_stats(synth.x_train, synth.y_train, 5, mode="full"))
    fs = fisher_subspace(m, "auto", energy=1.0)
    sc = fisher_scorers(m, fs.V, fs.within, "auto")
    z, y = synth.x_test @ fs.V, synth.y_test
    base, scores = choose_base(sc, "auto", (z, y))
    lda_ok = base_logits(sc, z, "lda").argmax(1) == y
    qda_ok = base_logits(sc, z, "qda").argmax(1) == y
    assert scores == {"lda": float(np.mean(lda_ok)), "qda": float(np.mean(qda_ok))}
    gain = int(np.sum(qda_ok & ~lda_ok)) - int(np.sum(lda_ok & ~qda_ok))
    flips = int(np.sum(qda_ok != lda_ok))
    assert (base == "qda") == (gain > 2.0 * np.sqrt(flips))
    # the same rows with z = ∞ (no gain is significant) keep LDA_f
    assert choose_base(sc, "auto", (z, y), z=np.inf)[0] == "lda"
    assert choose_base(sc, "auto", None) == ("lda", {})
    assert choose_base(sc, "qda", None) == ("qda", {})
    pooled = fisher_scorers(m, fs.V, fs.within, None)
    assert choose_base(pooled, "auto", (z, y)) == ("lda", {"lda": scores["lda"]})


# ---------------------------------------------------------------------- heads vs their base
@pytest.mark.parametrize("cls", [FisherMixHead, ProtoHyperHead])
def test_trained_head_not_below_lda(cls: type, synth: Any) -> None:
    """Held-out synthetic accuracy never below the base (deterministic); real held-out
    accuracy within a small-sample tolerance of the default LDA head."""
    stats = compute_stats(synth.x_train, synth.y_train, 5, mode="full")
    head = cls(**FAST).fit_from_stats(stats)
    lda = LDAHead().fit_from_stats(stats).score(synth.x_test, synth.y_test)
    assert head.val_accuracy_ >= head.base_val_accuracy_
    assert 0 <= head.selected_epoch_ <= head.epochs_run_ <= FAST["epochs"]
    assert head.val_per_class_ == 1000 and head.n_per_class_ == 300
    assert head.score(synth.x_test, synth.y_test) >= lda - 0.01


def test_fishermix_kept_base_is_the_default_lda(synth: Any) -> None:
    """With selection keeping epoch 0 (no significant gain possible), FisherMix is LDA_f on
    all C − 1 Fisher directions with LDA's data-driven S_W: LDA's predictions."""
    stats = compute_stats(synth.x_train, synth.y_train, 5, mode="full")
    head = FisherMixHead(selection_z=1e9, **FAST).fit_from_stats(stats)
    assert head.selected_epoch_ == 0 and head.val_accuracy_ == head.base_val_accuracy_
    lda = LDAHead().fit_from_stats(stats)
    assert np.mean(head.predict(synth.x_test) == lda.predict(synth.x_test)) > 0.999


def test_protohyper_kept_base_has_a_zero_residual(synth: Any) -> None:
    stats = compute_stats(synth.x_train, synth.y_train, 5, mode="full")
    head = ProtoHyperHead(selection_z=1e9, **FAST).fit_from_stats(stats)
    assert head.selected_epoch_ == 0
    np.testing.assert_array_equal(head.W2_, 0.0)
    np.testing.assert_array_equal(head.b_, 0.0)
    m = compute_moments(stats)
    sc = fisher_scorers(m, head.V_, fisher_subspace(m, "auto", energy=1.0).within, "auto")
    z = synth.x_test @ head.V_
    np.testing.assert_array_equal(head.predict(synth.x_test),
                                  base_logits(sc, z, head.base_used_).argmax(1))


def test_selection_off_trains_every_epoch(synth: Any) -> None:
    stats = compute_stats(synth.x_train, synth.y_train, 5, mode="full")
    head = ProtoHyperHead(val_per_class=0, **FAST).fit_from_stats(stats)
    assert head.epochs_run_ == FAST["epochs"] and head.selected_epoch_ is None
    assert head.val_accuracy_ is None and head.base_val_accuracies_ == {}
    assert head.base_used_ == "lda"  # nothing to choose on: the LDA_f base


def test_prior_correction_makes_the_start_the_default_lda_on_imbalanced_classes() -> None:
    """Balanced synthetic training with the log-priors added back: the kept start equals the
    default LDA head's predictions; the paper's uniform priors do not."""
    sp = gaussian_classes(seed=4, dim=10, num_classes=4, n_train=4000, n_test=4000)
    keep = (sp.y_train != 0) | (np.arange(sp.y_train.size) % 8 == 0)  # class 0 is rare
    stats = compute_stats(sp.x_train[keep], sp.y_train[keep], 4, mode="full")
    lda = LDAHead().fit_from_stats(stats).predict(sp.x_test)
    head = FisherMixHead(selection_z=1e9, **FAST).fit_from_stats(stats)
    np.testing.assert_allclose(head.log_priors_, np.log(stats.counts / stats.counts.sum()))
    assert np.mean(head.predict(sp.x_test) == lda) > 0.999
    uniform = FisherMixHead(selection_z=1e9, prior_correction=False, **FAST)
    uniform.fit_from_stats(stats)
    np.testing.assert_array_equal(uniform.log_priors_, 0.0)
    assert np.mean(uniform.predict(sp.x_test) == lda) < 0.999
    # the held-out synthetic set follows the priors: the rare class gets fewer rows
    m = compute_moments(stats)
    val = head._validation_set(fisher_gaussians(m, head.V_, 0.9, 0.05), m.priors)
    assert val is not None and head.val_per_class_ == 1000
    np.testing.assert_array_equal(np.bincount(val[1], minlength=4),
                                  np.maximum(np.rint(4 * 1000 * m.priors), 1))
