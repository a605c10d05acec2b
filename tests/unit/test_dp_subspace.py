"""A DP release fitted in a public subspace: post-processing, no budget (issue 41, P0s).

The server projects the noisy total onto public principal directions before the rest of the
post-processing (:mod:`ghofl.privacy.subspace`). What makes that a release in the subspace:
the mechanism's noise is rotation invariant (an isotropic vector on the sums; σ on the
diagonal and σ/√2 off it of a symmetric block), so its projection has the law of the noise of
a k-dimensional release with the same σ, and the projection of the exact total is the total
of the projected embeddings.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ghofl.errors import ConfigError
from ghofl.heads.lda import LDAHead
from ghofl.privacy import DPConfig, block_sensitivities, block_sigmas, draw_noise, plan_noise
from ghofl.privacy.mechanism import NoisePlan, release_central
from ghofl.privacy.postprocess import postprocess
from ghofl.privacy.subspace import (
    AUTO_FRACTION,
    AUTO_MIN_CAPTURE,
    AUTO_MIN_RATIO,
    between_capture,
    check_subspace_option,
    choose_subspace,
    noise_ratio,
)
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.meta import EncoderInfo, StatsMeta
from ghofl.stats.projection import (
    BASIS_DIR_ENV,
    PCA_GENERATOR,
    ProjectionSpec,
    pca_basis,
    save_basis,
)
from ghofl.stats.release import NoisyStats
from ghofl.stats.schema import schema_for

D, C, K = 12, 3, 5
CLASSES = ("a", "b", "c")


@pytest.fixture()
def basis_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(BASIS_DIR_ENV, str(tmp_path))
    return tmp_path


def _public(seed: int, d: int = D, n: int = 400) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)) @ np.diag(np.linspace(3.0, 0.3, d))


def _data(seed: int, n: int = 600, d: int = D) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    x = rng.standard_normal((n, d)) @ np.diag(np.linspace(2.0, 0.5, d))
    x[:, 0] += 2.0 * y
    return x, y


def _sigma(mode: str, clip: float, z: float) -> dict[str, float]:
    sens = block_sensitivities(mode, clip)
    return block_sigmas(sens, {b: 1.0 / len(sens) for b in sens}, z)


# ---------------------------------------------------------------------- the option
@pytest.mark.parametrize("text", ["auto", "none", "pca:4", "pca:4:0123456789abcdef",
                                  "auto:0123456789abcdef", " none "])
def test_option_forms_accepted(text: str) -> None:
    assert check_subspace_option(text) == text.strip()
    assert DPConfig(1.0, subspace=text).subspace == text.strip()


@pytest.mark.parametrize("text", ["", "pca", "pca:0", "pca:x", "pca:4:xyz", "auto:4",
                                  "random:4", "pca:4:0123456789ABCDEF", "none:1"])
def test_option_forms_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid DP subspace .*expected auto, "
                                          r"auto:<basis fingerprint>, none, pca:<k>"):
        DPConfig(1.0, subspace=text)


def test_default_is_auto_and_recorded_in_the_plan() -> None:
    cfg = DPConfig(1.0)
    assert cfg.subspace == "auto"
    plan = plan_noise(cfg, "pooled", 2.0, num_classes=C, dim=D)
    assert plan.to_dict()["subspace"] == "auto"


# ---------------------------------------------------------------------- the ratio
def test_noise_ratio_formula() -> None:
    sig = {"scatter": 40.0, "class_scatter": 10.0}
    assert noise_ratio(sig, "pooled", 4, 16, 2.0, 104.0) == pytest.approx(40.0 * 16 / (4 * 100))
    assert noise_ratio(sig, "gram", 4, 16, 2.0, 104.0) == pytest.approx(1.6)
    # full: the pooled within scatter sums C class scatters' noise
    assert noise_ratio(sig, "full", 4, 16, 2.0, 104.0) == pytest.approx(2.0 * 10 * 16 / 400)
    assert noise_ratio(sig, "diag", 4, 16, 2.0, 104.0) is None
    assert noise_ratio(sig, "means", 4, 16, 2.0, 104.0) is None


def test_noise_ratio_on_cifar_scale_crosses_the_threshold_between_eps_1_and_2() -> None:
    """The calibration the module documents: CIFAR-10's shape, R = 28, N = 50,000."""
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    ratios = {}
    for eps in (1.0, 2.0):
        plan = plan_noise(DPConfig(eps, expected_samples=50_000), "pooled", 28.0,
                          num_classes=10, dim=1280)
        ratios[eps] = noise_ratio(plan.sigma, "pooled", 10, 1280, 28.0, 50_000)
    assert ratios[1.0] > AUTO_MIN_RATIO > ratios[2.0]


# ---------------------------------------------------------------------- the choice
def _meta(mode: str = "pooled", **kw: object) -> StatsMeta:
    return StatsMeta(mode, D, CLASSES, clip_norm=2.0, **kw)  # type: ignore[arg-type]


def test_auto_projects_only_above_the_ratio(basis_dir: Path) -> None:
    _, fp = save_basis(pca_basis(_public(1), D))
    big, small = {"scatter": 1e4}, {"scatter": 1e-3}
    want_k = round(AUTO_FRACTION * D)
    chosen = choose_subspace(f"auto:{fp}", _meta(), big, 603.0)
    assert chosen.spec == ProjectionSpec(0, D, want_k, PCA_GENERATOR, fp)
    assert chosen.ratio is not None and chosen.ratio > AUTO_MIN_RATIO
    assert f"first {want_k} principal directions of the public basis {fp}" in chosen.reason
    kept = choose_subspace(f"auto:{fp}", _meta(), small, 603.0)
    assert kept.spec is None and "fitted in the whole space: noise ratio" in kept.reason
    assert choose_subspace("none", _meta(), big, 603.0).spec is None


def test_auto_uses_the_encoders_default_basis(basis_dir: Path) -> None:
    enc = EncoderInfo("enc", D)
    _, fp = save_basis(pca_basis(_public(2), D), default_for=enc.fingerprint())
    chosen = choose_subspace("auto", _meta(encoder=enc), {"scatter": 1e4}, 603.0)
    assert chosen.spec is not None and chosen.spec.basis == fp
    # no basis known for the encoder (or no encoder): the whole space, saying why
    other = choose_subspace("auto", _meta(encoder=EncoderInfo("other", D)), {"scatter": 1e4},
                            603.0)
    assert other.spec is None and "no public basis is known" in other.reason
    assert choose_subspace("auto", _meta(), {"scatter": 1e4}, 603.0).spec is None


def test_auto_caps_k_at_the_basis_and_keeps_whole_space_without_a_second_moment(
        basis_dir: Path) -> None:
    _, fp = save_basis(pca_basis(_public(3), 2))
    chosen = choose_subspace(f"auto:{fp}", _meta(), {"scatter": 1e4}, 603.0)
    assert chosen.spec is not None and chosen.spec.dim == 2
    assert "capped at the 2 directions of the basis" in chosen.reason
    diag = choose_subspace(f"auto:{fp}", _meta("diag"), {"sq_sums": 1e4}, 603.0)
    assert diag.spec is None and "has no second moment" in diag.reason


def test_explicit_subspace_errors(basis_dir: Path) -> None:
    _, fp = save_basis(pca_basis(_public(4), 4))
    sig = {"scatter": 1.0}
    with pytest.raises(ConfigError, match=r"more directions than the statistics' dimension"):
        choose_subspace(f"pca:{D + 1}:{fp}", _meta(), sig, 603.0)
    with pytest.raises(ConfigError, match=r"holds 4 directions; the DP subspace 'pca:5:"):
        choose_subspace(f"pca:5:{fp}", _meta(), sig, 603.0)
    with pytest.raises(ConfigError, match=r"the clients already projected the statistics"):
        choose_subspace(f"pca:2:{fp}", replace(_meta(), dim=3,
                                                projection=ProjectionSpec(0, D, 3)), sig, 603.0)
    with pytest.raises(ConfigError, match=r"mode 'means' has no second moment"):
        choose_subspace(f"pca:2:{fp}", _meta("means"), {"sums": 1.0}, 603.0)
    with pytest.raises(ConfigError, match=r"cannot be used: the statistics record no "
                                          r"clipping bound"):
        choose_subspace(f"pca:2:{fp}", replace(_meta(), clip_norm=None), sig, 603.0)
    with pytest.raises(ConfigError, match=r"statistics record no encoder; name the basis"):
        choose_subspace("pca:2", _meta(), sig, 603.0)
    with pytest.raises(ConfigError, match=r"no projection basis with fingerprint"):
        choose_subspace("pca:2:00000000deadbeef", _meta(), sig, 603.0)
    _, wrong = save_basis(pca_basis(_public(5, d=D + 2), 3))
    with pytest.raises(ConfigError, match=r"has shape \(14, 3\) but the statistics have d=12"):
        choose_subspace(f"pca:2:{wrong}", _meta(), sig, 603.0)


def test_between_capture_is_the_kept_share_of_the_class_separation() -> None:
    rng = np.random.default_rng(20)
    n = np.array([50.0, 80.0, 70.0])
    mu = np.zeros((3, 6))
    mu[:, 0] = [-1.0, 0.5, 1.5]  # the classes differ along axis 0 only
    eye = np.eye(6)
    sums = mu * n[:, None]
    assert between_capture(sums, n, 0.0, eye) == pytest.approx((1.0, 1.0))
    assert between_capture(sums, n, 0.0, eye[:, :1]) == pytest.approx((1.0, 1.0))
    assert between_capture(sums, n, 0.0, eye[:, 1:]) == pytest.approx((0.0, 0.0))
    tilted = np.array([[np.cos(0.5)], [np.sin(0.5)], [0], [0], [0], [0]])
    assert between_capture(sums, n, 0.0, tilted)[0] == pytest.approx(np.cos(0.5) ** 2)
    # noisy sums: the noise's expected energy removed, the estimate is unbiased, and the
    # bound lies below the true share in (at least) about 97.5% of the releases
    sigma = 6.0
    draws = np.array([between_capture(sums + sigma * rng.standard_normal(sums.shape), n,
                                      sigma, eye[:, :3]) for _ in range(4000)])
    assert np.mean(draws[:, 0]) == pytest.approx(1.0, abs=0.02)
    assert np.all(draws[:, 1] <= draws[:, 0])
    half = np.array([[np.sqrt(0.5)], [np.sqrt(0.5)], [0], [0], [0], [0]])
    mixed = mu.copy()
    mixed[:, 1] = mixed[:, 0]  # the separation split evenly between axes 0 and 1
    got = np.array([between_capture(mixed * n[:, None] + sigma * rng.standard_normal(
        sums.shape), n, sigma, eye[:, :1]) for _ in range(4000)])
    assert np.mean(got[:, 0]) == pytest.approx(0.5, abs=0.03)
    assert np.mean(got[:, 1] > 0.5) < 0.05
    assert between_capture(mixed * n[:, None], n, 0.0, half)[0] == pytest.approx(1.0)
    # placeholders (zero sums) and fewer than two classes: nothing to lose
    assert between_capture(np.zeros((3, 6)), n, 1.0, eye[:, :1]) == (1.0, 1.0)
    assert between_capture(sums * np.array([[1.0], [0.0], [0.0]]), n, 0.0, eye[:, 1:]) == \
        (1.0, 1.0)


def test_a_noisy_capture_estimate_does_not_project() -> None:
    """Few samples per class and a large noise: the estimate may pass, the bound does not."""
    rng = np.random.default_rng(21)
    n = np.array([30.0, 30.0, 30.0])
    mu = np.zeros((3, 40))
    mu[:, 0] = [-0.3, 0.0, 0.3]
    mu[:, 39] = [0.2, -0.2, 0.0]  # a third of the separation outside the first 10 axes
    eye = np.eye(40)
    got = np.array([between_capture(mu * n[:, None] + 8.0 * rng.standard_normal(mu.shape),
                                    n, 8.0, eye[:, :10]) for _ in range(500)])
    assert np.mean(got[:, 0] >= AUTO_MIN_CAPTURE) > 0.1  # the estimate alone often passes
    assert np.mean(got[:, 1] >= AUTO_MIN_CAPTURE) < 0.02  # the bound keeps the whole space


def test_auto_keeps_the_whole_space_when_the_basis_misses_the_classes(basis_dir: Path) -> None:
    """The public directions of largest variance need not separate the classes (TREC's case)."""
    _, fp = save_basis(pca_basis(_public(14), D))  # variance decreasing along the axes
    n = np.array([200.0, 200.0, 203.0])
    sums = np.zeros((3, D))
    sums[:, -1] = np.array([-1.0, 0.0, 1.0]) * n  # separation in the last (weakest) axis
    chosen = choose_subspace(f"auto:{fp}", _meta(), {"scatter": 1e4, "sums": 0.0}, 603.0,
                             sums, n)
    assert chosen.spec is None
    assert "keep only 0.000 of the release's between-class energy, at least 0.000 < " \
        f"{AUTO_MIN_CAPTURE:g} within two standard deviations" in chosen.reason
    sums[:, 0] = np.array([-1.0, 0.0, 1.0]) * n  # and now along the strongest
    sums[:, -1] = 0.0
    chosen = choose_subspace(f"auto:{fp}", _meta(), {"scatter": 1e4, "sums": 0.0}, 603.0,
                             sums, n)
    assert chosen.spec is not None
    assert re.search(r"keeping (0\.9[5-9]\d|1\.000) of the between-class energy",
                     chosen.reason)
    # an explicit subspace is the user's choice: not checked
    forced = choose_subspace(f"pca:3:{fp}", _meta(), {"scatter": 1.0, "sums": 0.0}, 603.0,
                             sums[:, ::-1].copy(), n)
    assert forced.spec is not None and forced.spec.dim == 3


# ---------------------------------------------------------------------- the law
def test_projected_noise_has_the_law_of_a_k_dimensional_release(basis_dir: Path) -> None:
    """Vᵀ E_B V: σ² on the diagonal, σ²/2 off it; Vᵀ e_A: σ_A² per coordinate (N2s)."""
    v = pca_basis(_public(6), K).astype(np.float64)
    sig = _sigma("gram", 2.0, 1.0)
    plan = NoisePlan(DPConfig(1.0), "gram", 2.0, 1, 1.0, block_sensitivities("gram", 2.0),
                     {b: 1 / 3 for b in sig}, sig)
    sch = schema_for("gram")
    rng = np.random.default_rng(0)
    draws = 3000
    diag, off, sums = np.empty((draws, K)), np.empty((draws, K * (K - 1) // 2)), np.empty(
        (draws, C * K))
    iu = np.triu_indices(K, 1)
    for i in range(draws):
        _, floats = draw_noise(plan, C, D, rng)
        blocks = {}
        for spec, seg in zip(sch.float_arrays, sch.float_layout(C, D), strict=True):
            packed = floats[seg.offset: seg.stop].reshape(spec.packed_shape(C, D))
            blocks[spec.name] = spec.unpack(packed, C, D)
        e = v.T @ blocks["scatter"] @ v
        diag[i], off[i] = np.diagonal(e), e[iu]
        sums[i] = (blocks["sums"] @ v).ravel()
    # 3000 draws: the sample variance is within 10% of its value with overwhelming odds
    np.testing.assert_allclose(diag.var(axis=0) / sig["scatter"] ** 2, 1.0, atol=0.1)
    np.testing.assert_allclose(off.var(axis=0) / (sig["scatter"] ** 2 / 2), 1.0, atol=0.1)
    np.testing.assert_allclose(sums.var(axis=0) / sig["sums"] ** 2, 1.0, atol=0.1)
    assert abs(np.mean(diag[:, 0] * diag[:, 1])) < 0.1 * sig["scatter"] ** 2


@pytest.mark.parametrize("mode", ["gram", "pooled", "full"])
def test_projecting_the_total_is_the_total_of_projected_embeddings(basis_dir: Path,
                                                                   mode: str) -> None:
    """The subspace release is the post-processed release of the clients' projected totals.

    With (almost) no noise, so that both sides see the same total: projecting the noisy
    total, then post-processing, gives what the same post-processing gives on the total of
    the embeddings the clients projected themselves.
    """
    x, y = _data(7)
    clip = 100.0  # binds on no row
    _, fp = save_basis(pca_basis(_public(8), K))
    spec = ProjectionSpec(0, D, K, PCA_GENERATOR, fp)
    total = compute_stats(x, y, CLASSES, mode, clip_norm=clip)  # type: ignore[arg-type]
    sig = {b: 1e-9 for b in block_sensitivities(mode, clip)}
    ints, floats = schema_for(mode).flatten(total)
    got, notes = postprocess(total.meta, ints[:C].astype(np.float64), floats, 1, sig,
                             f"pca:{K}:{fp}")
    proj = compute_stats(x, y, CLASSES, mode, projection=spec,  # type: ignore[arg-type]
                         clip_norm=clip)  # the clients project, then accumulate
    pints, pfloats = schema_for(mode).flatten(proj)
    want, _ = postprocess(proj.meta, pints[:C].astype(np.float64), pfloats, 1, sig)
    assert got.meta == want.meta and got.meta.projection == spec and got.meta.dim == K
    assert any(f"first {K} principal directions of the public basis {fp}" in n for n in notes)
    np.testing.assert_allclose(got.sums, want.sums, rtol=1e-9, atol=1e-7)
    if mode == "full":
        np.testing.assert_allclose(got.class_scatter, want.class_scatter, rtol=1e-7,
                                   atol=1e-6)
    else:
        np.testing.assert_allclose(got.scatter, want.scatter, rtol=1e-7, atol=1e-6)
    if mode == "pooled":  # naive Bayes' diagonals: the pooled within variance per class
        n = got.counts.astype(np.float64)
        var = got.sq_sums - got.sums**2 / n[:, None]
        np.testing.assert_allclose(var / n[:, None], np.broadcast_to(var[0] / n[0], var.shape),
                                   rtol=1e-6)
        within = np.diagonal(want.scatter) - np.sum(want.sums**2 / n[:, None], axis=0)
        np.testing.assert_allclose(var.sum(axis=0), within, rtol=1e-6)


# ---------------------------------------------------------------------- releases
def test_central_release_in_the_subspace_costs_nothing_and_predicts_in_d(
        basis_dir: Path) -> None:
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    x, y = _data(9, n=3000)
    _, fp = save_basis(pca_basis(_public(10), K))
    total = compute_stats(x, y, CLASSES, "pooled", clip_norm=8.0)
    cfg = DPConfig(1.0, subspace=f"pca:{K}:{fp}")
    plan = plan_noise(cfg, "pooled", 8.0, num_classes=C, dim=D)
    whole = release_central(total, plan_noise(replace(cfg, subspace="none"), "pooled", 8.0,
                                              num_classes=C, dim=D), np.random.default_rng(1))
    rel = release_central(total, plan, np.random.default_rng(1))
    assert isinstance(rel.stats, NoisyStats) and rel.stats.meta.dim == K
    assert rel.stats.noise_sigma == whole.stats.noise_sigma == plan.sigma
    assert (rel.epsilon_spent, rel.delta_spent) == (whole.epsilon_spent, whole.delta_spent)
    assert any("at no privacy cost" in n for n in rel.notes)
    assert rel.to_dict()["subspace"] == f"pca:{K}:{fp}"
    head = LDAHead().fit_from_stats(rel.stats)
    assert head.predict(x[:50]).shape == (50,)  # d-dimensional inputs, projected by the head
    assert np.mean(head.predict(x) == y) > 0.5


def test_distributed_release_takes_the_subspace(basis_dir: Path) -> None:
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    from ghofl.client.job import ClientJob
    from ghofl.server.job import ServerJob
    from ghofl.server.plan import AggregationSpec, FederationPlan
    from ghofl.server.simulation import Population, simulate

    x, y = _data(11, n=2400)
    xt, yt = _data(12, n=600)
    _, fp = save_basis(pca_basis(_public(13), K))
    dp = DPConfig(2.0, mode="distributed", subspace=f"pca:{K}:{fp}")
    plan = FederationPlan(ClientJob(CLASSES, "pooled", clip_norm=8.0),
                          AggregationSpec("secure", dp=dp), ServerJob(("lda", "nb"), seed=0))
    res = simulate(plan, (x, y), (xt, yt), Population(4, 1.0))
    notes = res.privacy["postprocessing"]
    assert any(f"first {K} principal directions" in n for n in notes)
    assert res.heads["lda"].accuracy > 0.5
