"""FisherMix and Proto-Hyper (trained on synthetic Fisher-space samples only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, MissingExtraError, UnsupportedModeError
from ghofl.heads import load_head, make_head, save_head
from ghofl.heads.fisher import fisher_subspace
from ghofl.heads.fishermix import FisherMixHead
from ghofl.heads.lda import LDAHead
from ghofl.heads.protohyper import (
    ProtoHyperHead,
    effective_rank,
    fisher_scorers,
    lda_f_logits,
    mean_kl,
    nb_f_logits,
    qda_f_logits,
    standardise,
    teacher_logits,
)
from ghofl.heads.qda import QDAHead
from ghofl.moments import compute_moments
from ghofl.stats import ClientStats, compute_stats, sum_stats
from tests.helpers import gaussian_mixture

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
FAST: dict[str, Any] = {"n_per_class": 300, "epochs": 3}


def bayes_problem(seed: int, c: int = 4, d: int = 6, sep: float = 1.0) -> tuple[Any, Any]:
    """Class means and one well-conditioned shared covariance (eigenvalues 0.5..2)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=sep, size=(c, d))
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return means, (q * np.linspace(0.5, 2.0, d)) @ q.T


def draw(rng: np.random.Generator, means: Any, cov: Any, n: int) -> tuple[Any, Any]:
    y = rng.integers(0, means.shape[0], n)
    return means[y] + rng.normal(size=(n, means.shape[1])) @ np.linalg.cholesky(cov).T, y


def mixture_data(seed: int, c: int = 6, d: int = 12, n: int = 20000, comps: int = 3,
                 sep: float = 2.5) -> tuple[Any, Any]:
    """Non-Gaussian classes: each a mixture of ``comps`` Gaussians of different scales."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=sep, size=(c, comps, d))
    scales = rng.uniform(0.3, 1.5, size=(c, comps))
    a = rng.normal(size=(c, d, d)) / np.sqrt(d) + 0.3 * np.eye(d)
    y = rng.integers(0, c, n)
    k = rng.integers(0, comps, n)
    eps = np.einsum("nd,nde->ne", rng.normal(size=(n, d)), a[y])
    return centres[y, k] + scales[y, k][:, None] * eps, y


@pytest.fixture(scope="module")
def small() -> tuple[ClientStats, Any, Any]:
    x, y = gaussian_mixture(0, num_classes=5, dim=8, n=1500)
    return compute_stats(x, y, 5, mode="full"), x, y


# ---------------------------------------------------------------------- accuracy
@pytest.mark.parametrize("seed", [0, 3])
def test_reach_bayes_accuracy_on_shared_covariance_gaussians(seed: int) -> None:
    """Bayes rule = true LDA. Shrinkage 0 and energy 1 make the heads consistent estimators;
    everything else is at the defaults (FisherMix starts from LDA_f, ``init="lda"``)."""
    means, cov = bayes_problem(seed)
    rng = np.random.default_rng(100 + seed)
    x_tr, y_tr = draw(rng, means, cov, 8000)
    x_te, y_te = draw(rng, means, cov, 100000)
    p = np.linalg.inv(cov)
    bayes = x_te @ p @ means.T - 0.5 * np.einsum("cd,de,ce->c", means, p, means)
    bayes_acc = float(np.mean(bayes.argmax(1) == y_te))
    stats = compute_stats(x_tr, y_tr, 4, mode="full")
    consistent = {"fisher_energy": 1.0, "fisher_shrinkage": 0.0, "syn_shrink": 0.0}
    fm = FisherMixHead(**consistent).fit_from_stats(stats)
    ph = ProtoHyperHead(qda_shrinkage=0.0, **consistent).fit_from_stats(stats)
    assert fm.score(x_te, y_te) > bayes_acc - 0.01
    assert ph.score(x_te, y_te) > bayes_acc - 0.01


def test_protohyper_beats_lda_f_on_non_gaussian_classes() -> None:
    """QDA_f is chosen as the base in mode full and beats the paper's NB_f (≡ LDA_f) base."""
    x, y = mixture_data(1)
    h = y.size // 2
    head = ProtoHyperHead(base="auto").fit_from_stats(compute_stats(x[:h], y[:h], 6, mode="full"))
    z = x[h:] @ head.V_
    base = nb_f_logits(z, head.means_f_, head.sigma2_, head.log_priors_)
    base_acc = float(np.mean(base.argmax(1) == y[h:]))
    assert head.teacher_used_ == "qda_lda" and head.base_used_ == "qda"
    assert head.score(x[h:], y[h:]) > base_acc + 0.005


@pytest.mark.parametrize("cls", [FisherMixHead, ProtoHyperHead])
def test_float32_training_is_seeded_and_as_accurate(cls: type,
                                                    small: tuple[Any, Any, Any]) -> None:
    """train_dtype="float32" (the automatic choice at large C): float64 parameters, float32
    rows and products; the same seed gives the same weights, the accuracy stays that of
    float64 training, and "auto" is float64 on a small problem."""
    stats, x, y = small
    kw = {"val_per_class": 0, **FAST}
    a = cls(train_dtype="float32", **kw).fit_from_stats(stats)
    b = cls(train_dtype="float32", **kw).fit_from_stats(stats)
    ref = cls(train_dtype="float64", **kw).fit_from_stats(stats)
    auto = cls(**kw).fit_from_stats(stats)
    for k, v in a.get_state()[0].items():
        assert v.dtype == ref.get_state()[0][k].dtype, k
        np.testing.assert_array_equal(v, b.get_state()[0][k])
        np.testing.assert_array_equal(auto.get_state()[0][k], ref.get_state()[0][k])
    # float32 really changed the trained weights (slightly)
    assert not np.array_equal(a.class_scores(x), ref.class_scores(x))
    assert abs(a.score(x, y) - ref.score(x, y)) <= 0.01


# ---------------------------------------------------------------------- determinism
@pytest.mark.parametrize("cls", [FisherMixHead, ProtoHyperHead])
@pytest.mark.parametrize("fresh", [False, True])
def test_same_seed_gives_bit_identical_weights(cls: type, fresh: bool,
                                               small: tuple[Any, Any, Any]) -> None:
    stats = small[0]
    kw = {"fresh_samples": fresh, "val_per_class": 0, **FAST}  # keep the trained weights
    a = cls(seed=5, **kw).fit_from_stats(stats)
    b = cls(seed=5, **kw).fit_from_stats(stats)
    c = cls(seed=6, **kw).fit_from_stats(stats)
    arrays_a, arrays_b, arrays_c = a.get_state()[0], b.get_state()[0], c.get_state()[0]
    for k in arrays_a:
        np.testing.assert_array_equal(arrays_a[k], arrays_b[k])
    trained = "coef_" if cls is FisherMixHead else "b_"
    assert not np.array_equal(arrays_a[trained], arrays_c[trained])


@pytest.mark.parametrize("cls", [FisherMixHead, ProtoHyperHead])
def test_partition_invariance(cls: type, small: tuple[Any, Any, Any]) -> None:
    """Stats summed over random client splits: float sums differ by ~1e-15 only, so the weights
    agree to 1e-9 and the predictions are identical (bit-exactness is not promised)."""
    stats, x, y = small
    parts = np.random.default_rng(2).integers(0, 6, size=y.size)
    split = sum_stats(compute_stats(x[parts == p], y[parts == p], 5, mode="full")
                      for p in range(6))
    a = cls(**FAST).fit_from_stats(stats)
    b = cls(**FAST).fit_from_stats(split)
    for k, v in a.get_state()[0].items():
        np.testing.assert_allclose(v, b.get_state()[0][k], rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))


def test_torch_global_state_is_restored(small: tuple[Any, Any, Any]) -> None:
    import torch

    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    FisherMixHead(num_threads=1, **FAST).fit_from_stats(small[0])
    assert torch.get_num_threads() == threads
    assert torch.are_deterministic_algorithms_enabled() == det


# ---------------------------------------------------------------------- teachers
def test_informative_teacher_differs_from_base_and_paper_teacher_does_not(
        small: tuple[Any, Any, Any]) -> None:
    stats = small[0]
    informative = ProtoHyperHead(**FAST).fit_from_stats(stats)
    paper = ProtoHyperHead(teacher="paper", **FAST).fit_from_stats(stats)
    assert informative.teacher_used_ == "qda_lda" and paper.teacher_used_ == "paper"
    assert (informative.teacher_blend_, paper.teacher_blend_) == (0.5, 0.7)
    assert informative.teacher_base_kl_ > 1e-3
    assert abs(paper.teacher_base_kl_) < 1e-6


def test_teacher_kl_from_the_pure_functions(small: tuple[Any, Any, Any]) -> None:
    stats, x, _ = small
    m = compute_moments(stats)
    fs = fisher_subspace(m)
    sc = fisher_scorers(m, fs.V, fs.within, 0.1)
    z = x @ fs.V
    base = nb_f_logits(z, sc.means, sc.sigma2, sc.log_priors)
    assert mean_kl(teacher_logits(sc, z, "informative", 0.5), base, 4.0) > 1e-3
    assert mean_kl(teacher_logits(sc, z, "paper", 0.7), base, 4.0) < 1e-6
    assert mean_kl(teacher_logits(sc, z, "paper", 0.2), base, 4.0) < 1e-6
    unit = teacher_logits(sc, z, "informative", 0.0, scale="unit")
    np.testing.assert_allclose(unit, standardise(z @ sc.lda_coef.T + sc.lda_intercept))


def test_fisher_scorers_in_the_full_space_match_x_space_heads(
        small: tuple[Any, Any, Any]) -> None:
    """With k_f = d, V is invertible: QDA_f and LDA_f are x-space QDA and LDA (affine
    invariance), and NB_f ranks like LDA_f because Vᵀ S_W V = I."""
    stats, x, _ = small
    m = compute_moments(stats)
    fs = fisher_subspace(m, energy=1.0, max_dim=8, min_dim=8)
    assert fs.k_f == 8
    sc = fisher_scorers(m, fs.V, fs.within, 0.1)
    z = x @ fs.V
    qda = QDAHead(shrinkage=0.1, shrinkage_target="scaled_identity")  # QDA_f's family
    np.testing.assert_array_equal(qda_f_logits(sc, z).argmax(1),
                                  qda.fit_from_stats(stats).predict(x))
    np.testing.assert_array_equal(lda_f_logits(sc, z).argmax(1),
                                  LDAHead(shrinkage=0.05).fit_from_stats(stats).predict(x))
    nb = nb_f_logits(z, sc.means, sc.sigma2, sc.log_priors)
    assert sc.sigma2 == pytest.approx(1.0, abs=1e-10)
    np.testing.assert_array_equal(nb.argmax(1), lda_f_logits(sc, z).argmax(1))


def test_pooled_mode_falls_back_to_lda_teacher(small: tuple[Any, Any, Any]) -> None:
    _, x, y = small
    head = ProtoHyperHead(**FAST).fit_from_stats(compute_stats(x, y, 5, mode="pooled"))
    assert head.teacher_used_ == "lda" and head.syn_covariance_ == "pooled"
    assert head.base_used_ == "lda" and head.qda_prec_.shape == (0, head.k_f_, head.k_f_)
    assert abs(head.teacher_base_kl_) < 1e-6


def test_rank_is_truly_low(small: tuple[Any, Any, Any]) -> None:
    head = ProtoHyperHead(**FAST).fit_from_stats(small[0])
    assert head.rank_ == head.k_f_ - 1
    assert head.U_.shape == (head.k_f_ - 1, head.k_f_) and head.W2_.shape == (5, head.k_f_ - 1)
    assert ProtoHyperHead(rank=2, **FAST).fit_from_stats(small[0]).rank_ == 2
    assert effective_rank(128, 9) == 8
    assert effective_rank(None, 1) == 1


# ---------------------------------------------------------------------- variants and modes
def test_fit_uses_full_statistics_and_records_covariance_source(
        small: tuple[Any, Any, Any]) -> None:
    _, x, y = small
    assert FisherMixHead(**FAST).fit(x, y).syn_covariance_ == "class"
    pooled = compute_stats(x, y, 5, mode="pooled")
    assert FisherMixHead(**FAST).fit_from_stats(pooled).syn_covariance_ == "pooled"
    off = FisherMixHead(syn_class_cov=False, **FAST).fit(x, y)
    assert off.syn_covariance_ == "pooled"


def test_diag_statistics_are_rejected(small: tuple[Any, Any, Any]) -> None:
    _, x, y = small
    with pytest.raises(UnsupportedModeError, match="needs upload mode 'gram' or richer"):
        FisherMixHead().fit_from_stats(compute_stats(x, y, 5, mode="diag"))


def test_cosine_variant_and_centring(small: tuple[Any, Any, Any]) -> None:
    stats, x, y = small
    cos = FisherMixHead(variant="cosine", margin=0.1, epochs=10, n_per_class=500)
    cos.fit_from_stats(stats)
    np.testing.assert_array_equal(cos.intercept_, np.zeros(5))
    scores = cos.class_scores(x) - cos.log_priors_  # prior_correction adds log π_c
    assert np.all(np.abs(scores) <= 20.0 + 1e-9)  # s·cos θ with s = 20
    assert cos.score(x, y) > 0.8
    centred = FisherMixHead(center=True, **FAST).fit_from_stats(stats)
    means = stats.sums / stats.counts[:, None]
    np.testing.assert_allclose(centred.offset_, (means @ centred.V_).mean(axis=0))
    assert np.all(FisherMixHead(**FAST).fit_from_stats(stats).offset_ == 0.0)


def test_random_init_is_the_paper_head_and_seeded(small: tuple[Any, Any, Any]) -> None:
    stats = small[0]
    a = FisherMixHead(init="random", **FAST).fit_from_stats(stats)
    b = FisherMixHead(init="random", **FAST).fit_from_stats(stats)
    lda = FisherMixHead(**FAST).fit_from_stats(stats)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    assert not np.allclose(a.coef_, lda.coef_, atol=1e-2)


def test_lda_init_starts_at_lda_f(small: tuple[Any, Any, Any]) -> None:
    """With a vanishing learning rate the LDA start is kept: LDA_f's predictions."""
    stats, x, _ = small
    head = FisherMixHead(lr=1e-12, center=True, epochs=1, n_per_class=50, fisher_energy=0.995,
                         fisher_shrinkage=0.05)
    head.fit_from_stats(stats)
    lda = LDAHead(shrinkage=0.05).fit_from_stats(stats)
    agree = np.mean(head.predict(x) == lda.predict(x))
    assert agree > 0.97  # k_f < C − 1 (energy 0.995) and uniform priors: near, not equal


def test_progress_bar_only_when_asked(small: tuple[Any, Any, Any],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    FisherMixHead(epochs=1, n_per_class=50).fit_from_stats(small[0])
    assert capsys.readouterr().err == ""
    FisherMixHead(epochs=2, n_per_class=50, progress=True).fit_from_stats(small[0])
    assert "FisherMixHead" in capsys.readouterr().err


# ---------------------------------------------------------------------- persistence
@pytest.mark.parametrize(("name", "extra"), [
    ("fishermix", {}),
    ("fishermix", {"variant": "cosine", "center": True}),
    ("protohyper", {"fisher_max_dim": 3, "teacher": "paper"}),
    ("protohyper", {"base": "qda", "teacher": "base"}),
    ("protohyper", {"base": "lda", "residual_init": "random", "val_per_class": 0}),
])
def test_save_load_round_trip_and_torch_free_inference(name: str, extra: dict[str, Any],
                                                       tmp_path: Path,
                                                       small: tuple[Any, Any, Any]) -> None:
    stats, x, _ = small
    head = make_head(name, **FAST, **extra).fit_from_stats(stats)
    json.dumps(head.get_params())  # every hyperparameter is JSON-serialisable
    path = tmp_path / "head.safetensors"
    save_head(head, path)
    loaded = load_head(path)
    assert type(loaded) is type(head) and loaded.get_params() == head.get_params()
    proba = head.predict_proba(x)
    np.testing.assert_array_equal(loaded.predict_proba(x), proba)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "proba.npy", proba)
    # a meta-path hook makes any import of torch fail (sys.modules['torch'] = None would
    # also break scipy's array-API probe, which looks torch up in sys.modules)
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "try:\n"
        "    import torch\n"
        "    raise SystemExit('torch was not blocked')\n"
        "except ImportError:\n"
        "    pass\n"
        "import numpy as np\n"
        "from ghofl.heads import load_head\n"
        f"d = {str(tmp_path)!r}\n"
        "h = load_head(d + '/head.safetensors')\n"
        "p = h.predict_proba(np.load(d + '/x.npy'))\n"
        "assert np.array_equal(p, np.load(d + '/proba.npy'))\n"
        "assert 'torch' not in sys.modules\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("cls", [FisherMixHead, ProtoHyperHead])
def test_missing_torch_names_the_extra(cls: type, small: tuple[Any, Any, Any],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'ghofl\[torch\]'"):
        cls(**FAST).fit_from_stats(small[0])


# ---------------------------------------------------------------------- parameter checks
COMMON_BAD = [
    ("fisher_shrinkage", 1.5, r"fisher_shrinkage must be a number in \[0, 1\] or 'auto'"),
    ("fisher_energy", 0.0, r"'fisher_energy' must be a number in \(0.0, 1.0\]; got 0.0"),
    ("fisher_max_dim", 0, r"'fisher_max_dim' must be an integer >= 1 or None; got 0"),
    ("fisher_min_dim", "2", r"'fisher_min_dim' must be an integer >= 1; got '2'"),
    ("tau", 0.0, r"'tau' must be a number in \(0.0, inf\]; got 0.0"),
    ("n_per_class", 0, r"'n_per_class' must be an integer >= 1 or None; got 0"),
    ("val_per_class", -1, r"'val_per_class' must be an integer >= 0 or None; got -1"),
    ("patience", 0, r"'patience' must be an integer >= 1 or None; got 0"),
    ("selection_z", -1.0, r"'selection_z' must be a number in \[0.0, inf\]; got -1.0"),
    ("syn_shrink", -0.1, r"syn_shrink must be a number in \[0, 1\] or 'auto'; got -0.1"),
    ("syn_class_cov", "yes", r"'syn_class_cov' must be one of True, False, 'auto'; got 'yes'"),
    ("fresh_samples", 1, r"'fresh_samples' must be one of True, False; got 1"),
    ("center", None, r"'center' must be one of True, False; got None"),
    ("lr", -1.0, r"'lr' must be a number in \(0.0, inf\]; got -1.0"),
    ("weight_decay", -1e-3, r"'weight_decay' must be a number in \[0.0, inf\]; got -0.001"),
    ("batch_size", 0, r"'batch_size' must be an integer >= 1; got 0"),
    ("epochs", 2.0, r"'epochs' must be an integer >= 1; got 2.0"),
    ("seed", -1, r"'seed' must be an integer >= 0; got -1"),
    ("num_threads", 0, r"'num_threads' must be an integer >= 1 or None; got 0"),
    ("train_dtype", "float16",
     r"'train_dtype' must be one of 'auto', 'float64', 'float32'; got 'float16'"),
    ("progress", "no", r"'progress' must be one of True, False; got 'no'"),
]
FM_BAD = [
    ("variant", "arc", r"'variant' must be one of 'linear', 'cosine'; got 'arc'"),
    ("init", "zeros", r"'init' must be one of 'lda', 'random'; got 'zeros'"),
    ("scale", 0, r"'scale' must be a number in \(0.0, inf\]; got 0"),
    ("margin", -0.1, r"'margin' must be a number in \[0.0, inf\]; got -0.1"),
]
PH_BAD = [
    ("base", "nb", r"'base' must be one of 'auto', 'lda', 'qda'; got 'nb'"),
    ("residual_init", "ones", r"'residual_init' must be one of 'zero', 'random'; got 'ones'"),
    ("rank", 0, r"'rank' must be an integer >= 1 or None; got 0"),
    ("teacher", "qda", r"'teacher' must be one of 'informative', 'base', 'paper'; got 'qda'"),
    ("teacher_blend", 1.5, r"'teacher_blend' must be a number in \[0.0, 1.0\] or None; got 1.5"),
    ("teacher_scale", "row", r"'teacher_scale' must be one of 'base', 'unit'; got 'row'"),
    ("qda_shrinkage", "big", r"qda_shrinkage must be a number in \[0, 1\] or 'auto'"),
    ("kd_alpha", 2.0, r"'kd_alpha' must be a number in \[0.0, 1.0\]; got 2.0"),
    ("kd_temperature", 0.0, r"'kd_temperature' must be a number in \(0.0, inf\]; got 0.0"),
]


@pytest.mark.parametrize(("cls", "param", "value", "match"),
                         [(FisherMixHead, *b) for b in COMMON_BAD + FM_BAD]
                         + [(ProtoHyperHead, *b) for b in COMMON_BAD + PH_BAD])
def test_invalid_parameters(cls: type, param: str, value: object, match: str,
                            small: tuple[Any, Any, Any]) -> None:
    head = cls(**{param: value})
    with pytest.raises(ConfigError, match=f"{cls.__name__}: .*{match}"):
        head.fit_from_stats(small[0])


def test_defaults_are_data_driven_and_the_paper_preset_keeps_the_old_values() -> None:
    fm, ph = FisherMixHead().get_params(), ProtoHyperHead().get_params()
    for p in (fm, ph):
        assert {k: p[k] for k in ("fisher_shrinkage", "syn_shrink", "fisher_energy",
                                  "fisher_max_dim", "n_per_class", "val_per_class",
                                  "patience")} == {
            "fisher_shrinkage": "auto", "syn_shrink": "auto", "fisher_energy": 1.0,
            "fisher_max_dim": None, "n_per_class": None, "val_per_class": None, "patience": 5}
    assert (ph["base"], ph["residual_init"], ph["qda_shrinkage"]) == ("lda", "zero", "auto")
    # the paper's CIFAR-10 values are unchanged defaults or pinned by the "paper" preset
    assert {k: fm[k] for k in ("lr", "weight_decay", "batch_size", "epochs", "tau")} == {
        "lr": 8e-4, "weight_decay": 3e-4, "batch_size": 2048, "epochs": 40, "tau": 0.9}
    assert (fm["variant"], fm["scale"], fm["margin"]) == ("linear", 20.0, 0.0)
    assert {k: ph[k] for k in ("lr", "weight_decay", "batch_size", "epochs", "kd_alpha",
                               "kd_temperature", "teacher")} == {
        "lr": 1e-3, "weight_decay": 5e-4, "batch_size": 1024, "epochs": 40, "kd_alpha": 0.4,
        "kd_temperature": 4.0, "teacher": "informative"}
    presets = pytest.importorskip("ghofl.heads.presets")
    paper_fm = presets.preset_params("paper", "fishermix")
    paper_ph = presets.preset_params("paper", "protohyper")
    for paper in (paper_fm, paper_ph):
        assert {k: paper[k] for k in ("fisher_shrinkage", "syn_shrink", "fisher_energy",
                                      "n_per_class")} == {
            "fisher_shrinkage": 0.05, "syn_shrink": 0.05, "fisher_energy": 0.995,
            "n_per_class": 4000}
    assert paper_ph["qda_shrinkage"] == 0.1
