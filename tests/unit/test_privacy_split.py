"""The DP budget split (ghofl.privacy.split) and the symmetric-matrix noise (N2s)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ghofl.bench.synthetic import gaussian_classes
from ghofl.client.job import ClientJob
from ghofl.errors import ConfigError
from ghofl.privacy import (
    UNUSED_FRACTION,
    DPConfig,
    auto_fractions,
    block_names,
    denoise_covariance,
    denoised_eigenvalues,
    entry_scales,
    floor_noise_bulk,
    noise_aware_within,
    plan_noise,
    weighted_sensitivity,
)
from ghofl.server.job import ServerJob
from ghofl.server.plan import AggregationSpec, FederationPlan, unused_blocks
from ghofl.server.simulation import Population, simulate
from ghofl.stats.schema import pack_upper

R = 3.0


@pytest.mark.parametrize("seed", range(5))
def test_the_scaled_coordinates_of_a_symmetric_matrix_keep_the_sensitivity(seed: int) -> None:
    """One sample's change, in the coordinates the noise is added in, has norm ‖z‖² ≤ R²."""
    rng = np.random.default_rng(seed)
    d = 7
    z = rng.standard_normal(d)
    z *= R / np.linalg.norm(z) * rng.uniform(0.1, 1.0)
    change = pack_upper(np.outer(z, z)) / entry_scales("gram", "scatter", 3, d)
    assert float(np.linalg.norm(change)) == pytest.approx(float(z @ z), rel=1e-12)
    axis = np.zeros(d)
    axis[2] = R  # the worst case of the plain triangle is the worst case here too
    worst = pack_upper(np.outer(axis, axis)) / entry_scales("gram", "scatter", 3, d)
    assert float(np.linalg.norm(worst)) == pytest.approx(R**2)


def test_entry_scales_cover_every_class_matrix_and_skip_non_symmetric_arrays() -> None:
    scales = entry_scales("full", "class_scatter", 4, 3)
    assert scales is not None and scales.shape == (4 * 6,)
    assert np.count_nonzero(scales == 1.0) == 4 * 3
    assert entry_scales("full", "sums", 4, 3) is None
    assert entry_scales("pooled", "sq_sums", 4, 3) is None


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag", "means"])
@pytest.mark.parametrize(("c", "d", "n", "z"), [(5, 16, 20000, 0.6), (10, 64, 3000, 7.0),
                                                (200, 512, 20000, 2.0)])
def test_auto_fractions_are_a_split_of_the_budget(mode: str, c: int, d: int, n: int,
                                                   z: float) -> None:
    f = auto_fractions(mode, c, d, z, n)
    assert tuple(f) == block_names(mode)
    assert all(v > 0 for v in f.values())
    assert sum(f.values()) == pytest.approx(1.0)
    sens = {b: 1.0 for b in f}  # any block sensitivities: sigma_b / z = Delta_b / sqrt(f_b)
    assert weighted_sensitivity(sens, {b: 1 / math.sqrt(v) for b, v in f.items()}) == (
        pytest.approx(1.0))


def test_auto_gives_the_second_moments_the_budget_while_they_can_use_it() -> None:
    many = auto_fractions("full", 5, 16, 0.6, 20000)  # N/C = 4,000 samples per class in d=16
    assert many["class_scatter"] > 0.9
    assert many["counts"] < many["sums"] < many["class_scatter"]
    few = auto_fractions("full", 10, 64, 7.0, 3000)  # 300 per class in d=64 at eps 0.5
    assert few["class_scatter"] == pytest.approx(1 / 3, abs=0.02)
    assert auto_fractions("full", 5, 16, 0.6, None) == {b: 1 / 3 for b in block_names("full")}


def test_unused_blocks_get_the_least_budget() -> None:
    f = auto_fractions("pooled", 5, 16, 0.6, 20000, unused=("sq_sums",))
    assert f["sq_sums"] == pytest.approx(UNUSED_FRACTION)
    assert sum(f.values()) == pytest.approx(1.0)
    assert unused_blocks("pooled", ("lda", "ridge")) == ("sq_sums",)
    assert unused_blocks("pooled", ("lda", "nb")) == ()
    assert unused_blocks("full", ("lda",)) == ()


def test_an_auto_plan_waits_for_the_shape_and_refuses_another() -> None:
    plan = plan_noise(DPConfig(2.0, expected_samples=1000), "full", R)
    assert not plan.resolved
    shaped = plan.shaped(4, 8)
    assert shaped.resolved and shaped.shape == (4, 8)
    assert shaped.fractions == auto_fractions("full", 4, 8, plan.noise_multiplier, 1000)
    assert shaped.shaped(4, 8) is shaped
    with pytest.raises(ConfigError, match=r"planned for C=4, d=8 but the statistics have C=4"):
        shaped.shaped(4, 9)
    equal = plan_noise(DPConfig(2.0, split="equal", expected_samples=1000), "full", R)
    assert equal.resolved and equal.shaped(4, 9) is equal
    assert list(equal.fractions.values()) == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize(("kw", "match"), [
    ({"split": "thirds"}, r"budget split must be one of auto, equal; got 'thirds'"),
    ({"expected_samples": 0}, r"expected_samples .* must be a positive integer or None"),
    ({"expected_samples": 2.5}, r"expected_samples .* must be a positive integer or None"),
])
def test_split_options_are_checked(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DPConfig(1.0, **kw)  # type: ignore[arg-type]


def test_noise_aware_within_is_exact_without_noise_and_definite_with_it() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 6))
    w = a @ a.T * 50.0
    counts = np.array([40.0, 60.0])
    assert noise_aware_within(w, 100.0, 2, 0.0, 0.0, counts) == pytest.approx(w, rel=1e-10)
    noisy = w + 3.0 * np.diag(rng.standard_normal(6)) - 2000.0 * np.eye(6)
    out = noise_aware_within(noisy, 100.0, 2, 1.0, 30.0, counts)
    assert np.allclose(out, out.T)
    # the pooled and gram releases' denoised eigenvalues of W/(N - C) are at least
    # nu = sigma_B/(N - C)
    assert np.linalg.eigvalsh(out)[0] == pytest.approx(30.0, rel=1e-9)


@pytest.mark.parametrize(("nu", "kept"), [(1e-4, 6), (50.0, 0)])
def test_the_noise_bulk_floor_keeps_signal_and_flattens_noise(nu: float, kept: int) -> None:
    """tau = e^2/(e + mu): near 0 while the noise edge is small against the spectrum, the
    edge itself once the noise dominates."""
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    ev = np.array([0.5, 1.0, 2.0, 3.0, 4.0, 5.0])
    out = floor_noise_bulk((q * ev) @ q.T, nu)
    got = np.linalg.eigvalsh(out)
    assert int(np.sum(np.isclose(got, ev, rtol=1e-9))) == kept
    edge = nu * math.sqrt(12.0)
    assert got[0] >= edge**2 / (edge + ev.mean()) * (1 - 1e-12)


def test_simulate_tells_the_split_the_sample_count_and_reports_it() -> None:
    split = gaussian_classes(0, dim=6, num_classes=3, n_train=900, n_test=300)
    plan = FederationPlan(ClientJob(("0", "1", "2"), "gram", clip_norm=6.0),
                          AggregationSpec(dp=DPConfig(4.0)), ServerJob(("lda",), seed=0))
    res = simulate(plan, (split.x_train, split.y_train), (split.x_test, split.y_test),
                   Population(3, 1.0))
    assert res.privacy is not None
    assert res.privacy["expected_samples"] == 900 and res.privacy["budget_split"] == "auto"
    assert res.privacy["fractions"] == pytest.approx(
        auto_fractions("gram", 3, 6, res.privacy["noise_multiplier"], 900))


def _wigner(rng: np.random.Generator, d: int, nu: float) -> np.ndarray:
    """Symmetric Gaussian noise: sd nu on the diagonal, nu/sqrt(2) off it (N2s)."""
    g = rng.standard_normal((d, d)) * nu / math.sqrt(2.0)
    return np.asarray(np.triu(g, 1) + np.triu(g, 1).T + np.diag(rng.standard_normal(d) * nu))


def test_denoised_eigenvalues_recover_a_flat_spectrum_from_the_noise_bulk() -> None:
    """P = c I plus noise whose semicircle spreads the eigenvalues over c +- nu sqrt(2d):
    the denoised ones are back at c (the noise is zero-mean: their mean stays c)."""
    rng = np.random.default_rng(3)
    d, c, nu = 400, 5.0, 0.08
    lam = np.linalg.eigvalsh(c * np.eye(d) + _wigner(rng, d, nu))
    assert np.ptp(lam) > 1.8 * nu * math.sqrt(2.0 * d)  # the bulk: c +- nu sqrt(2d)
    xi = denoised_eigenvalues(lam, nu)
    assert np.max(np.abs(xi - c)) < 0.25 * nu * math.sqrt(2.0 * d)  # the noisy: about 1
    assert np.mean(xi) == pytest.approx(c, rel=1e-3)
    np.testing.assert_array_equal(denoised_eigenvalues(lam, 0.0), lam)  # no noise: unchanged


@pytest.mark.parametrize("seed", [0, 1])
def test_the_denoised_covariance_is_nearer_the_truth_than_the_floored_one(seed: int) -> None:
    """A spiked covariance (a few strong directions over a weak bulk) under noise comparable
    to the bulk: the denoised estimate is nearer the noiseless matrix than the noisy one with
    its eigenvalues floored at nu, and along each of its eigenvectors it estimates the
    noiseless variance better."""
    rng = np.random.default_rng(seed)
    d, nu = 200, 0.01
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    ev = np.concatenate([np.linspace(4.0, 1.0, 10), rng.uniform(0.02, 0.2, d - 10)])
    truth = (q * ev) @ q.T
    noisy = truth + _wigner(rng, d, nu)
    lam, v = np.linalg.eigh(noisy)
    floored = (v * np.maximum(lam, nu)) @ v.T
    out = denoise_covariance(noisy, nu)
    assert np.linalg.norm(out - truth) < 0.8 * np.linalg.norm(floored - truth)
    oracle = np.einsum("ji,jk,ki->i", v, truth, v)  # v_i' P v_i
    xi = denoised_eigenvalues(lam, nu)
    assert np.linalg.norm(xi - oracle) < 0.5 * np.linalg.norm(np.maximum(lam, nu) - oracle)
    assert np.linalg.eigvalsh(out)[0] >= nu * (1 - 1e-9)
