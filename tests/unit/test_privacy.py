"""ghofl.privacy: sensitivity vs worst-case samples, calibration vs dp-accounting, noise std,
distributed shares, post-processing, the minimum-count rule, and the secure round with noise."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chi2

from ghofl.client.job import ClientJob, client_statistics, suppress_small_classes
from ghofl.errors import ConfigError, InputError
from ghofl.privacy import (
    NOISE_CLAMP_SIGMAS,
    DPConfig,
    NoisePlan,
    block_sensitivities,
    block_sigmas,
    draw_noise,
    entry_scales,
    flat_change,
    packed_outer_norm,
    postprocess,
    project_psd,
    truncation_probability,
    weighted_sensitivity,
)
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.projection import ProjectionSpec
from ghofl.stats.schema import schema_for

MODES = ("full", "pooled", "gram", "diag")
R = 3.0


def _plan(mode: str, z: float = 2.0, k: int = 1, dp_mode: str = "central") -> NoisePlan:
    """A plan with a fixed noise multiplier (no accountant needed)."""
    sens = block_sensitivities(mode, R)
    frac = {b: 1.0 / len(sens) for b in sens}
    cfg = DPConfig(1.0, 1e-5, dp_mode)  # type: ignore[arg-type]
    return NoisePlan(cfg, mode, R, k, z, sens, frac, block_sigmas(sens, frac, z))


def _flat(x: np.ndarray, y: np.ndarray, mode: str, proj: ProjectionSpec | None = None,
          c: int = 3) -> tuple[np.ndarray, np.ndarray]:
    s = compute_stats(x, y, c, mode, projection=proj, clip_norm=R)
    return schema_for(mode).flatten(s)


# ---------------------------------------------------------------------- sensitivity
@pytest.mark.parametrize("mode", MODES)
def test_one_sample_never_moves_a_block_beyond_its_sensitivity(mode: str) -> None:
    rng = np.random.default_rng(0)
    d = 5
    x, y = rng.normal(size=(40, d)), rng.integers(0, 3, 40)
    base = _flat(x, y, mode)
    sens = block_sensitivities(mode, R)
    worst = {b: 0.0 for b in sens}
    extras = [R * np.eye(d)[1], np.full(d, R / math.sqrt(d)), 10 * rng.normal(size=d),
              rng.normal(size=d)]
    for z in extras:
        after = _flat(np.vstack([x, z]), np.append(y, 2), mode)
        change = flat_change(base, after, mode, 3, d)
        for b, v in change.items():
            assert v <= sens[b] * (1 + 1e-9), (b, v, sens[b])
            worst[b] = max(worst[b], v)
    for b in sens:  # the one-axis sample of norm R attains every bound
        assert worst[b] == pytest.approx(sens[b], rel=1e-9)
    scaled = {b: sens[b] * math.sqrt(len(sens)) for b in sens}
    assert weighted_sensitivity(sens, scaled) == pytest.approx(1.0)


def test_sensitivity_holds_under_projection() -> None:
    rng = np.random.default_rng(1)
    proj = ProjectionSpec(3, 12, 4)
    x, y = rng.normal(size=(30, 12)), rng.integers(0, 3, 30)
    base = _flat(x, y, "full", proj)
    sens = block_sensitivities("full", R)
    worst = 0.0
    for z in [50 * rng.normal(size=12) for _ in range(20)]:
        change = flat_change(base, _flat(np.vstack([x, z]), np.append(y, 0), "full", proj),
                             "full", 3, 4)
        for b, v in change.items():
            assert v <= sens[b] * (1 + 1e-9)
        worst = max(worst, change["sums"])
    assert worst == pytest.approx(R, rel=1e-6)  # clipping after the projection is tight


def test_packed_outer_norm_matches_the_triangle() -> None:
    rng = np.random.default_rng(2)
    for z in (rng.normal(size=6), np.eye(6)[2] * R, np.full(6, 1.0)):
        packed = schema_for("full").float_arrays[1].pack(np.outer(z, z)[None])[0]
        assert packed_outer_norm(z) == pytest.approx(float(np.linalg.norm(packed)))
        assert packed_outer_norm(z) <= float(z @ z) + 1e-12


def _kth_sample_change(job: ClientJob, d: int = 4, k: int = 3) -> dict[str, float]:
    """Per-block change when one sample lifts class 0 from k − 1 to k samples."""
    x = np.vstack([np.eye(d)[0] * R] * (k - 1))
    y = np.zeros(k - 1, np.int64)
    before = schema_for("full").flatten(client_statistics((x, y), job))
    after = schema_for("full").flatten(client_statistics(
        (np.vstack([x, x[:1]]), np.append(y, 0)), job))
    return flat_change(before, after, "full", 2, d)


def test_a_client_side_rule_would_break_the_bound_so_dp_clients_keep_every_class() -> None:
    from ghofl.server.plan import AggregationSpec, FederationPlan

    k, sens = 3, block_sensitivities("full", R)
    job = ClientJob(("a", "b"), clip_norm=R, min_class_count=k)
    assert _kth_sample_change(job, k=k)["sums"] == pytest.approx(k * sens["sums"])
    plan = FederationPlan(job, AggregationSpec(dp=DPConfig(2.0)))
    assert plan.client.min_class_count == k and plan.clients_job.min_class_count == 1
    change = _kth_sample_change(plan.clients_job, k=k)
    assert all(change[b] <= sens[b] * (1 + 1e-12) for b in sens)
    assert FederationPlan(job).clients_job == job  # without DP the clients apply the rule


def test_sensitivity_needs_a_positive_bound() -> None:
    with pytest.raises(ConfigError, match="clipping bound R must be a finite number > 0"):
        block_sensitivities("full", 0.0)


# ---------------------------------------------------------------------- calibration
@pytest.mark.parametrize(("eps", "delta"), [(8.0, 1e-5), (1.0, 1e-5), (0.5, 1e-6)])
def test_calibration_round_trips_through_dp_accounting(eps: float, delta: float) -> None:
    dpa = pytest.importorskip("dp_accounting")
    from ghofl.privacy import calibrate_noise_multiplier, gaussian_epsilon

    z = calibrate_noise_multiplier(eps, delta)
    assert gaussian_epsilon(z, delta) <= eps * (1 + 1e-6)
    assert gaussian_epsilon(z * 0.99, delta) > eps  # the smallest such z (to 1 %)
    rdp = dpa.rdp.RdpAccountant()  # an independent accountant agrees within its slack
    rdp.compose(dpa.GaussianDpEvent(z))
    assert eps <= rdp.get_epsilon(delta) <= 1.5 * eps


def test_plan_noise_uses_the_calibrated_multiplier() -> None:
    pytest.importorskip("dp_accounting")
    from ghofl.privacy import calibrate_noise_multiplier, plan_noise

    z = calibrate_noise_multiplier(2.0, 1e-5)
    for k in (1, 2, 5):  # the minimum count is post-processing: σ does not depend on it
        plan = plan_noise(DPConfig(2.0), "pooled", R, min_class_count=k)
        assert plan.noise_multiplier == z and plan.min_class_count == k
        assert plan.sigma["scatter"] == pytest.approx(z * R**2 * 2.0)  # Δ=R², f=1/4
        assert plan.sensitivity == block_sensitivities("pooled", R)


@pytest.mark.parametrize(("kw", "match"), [
    ({"epsilon": 0.0}, "epsilon must be a finite number > 0; got 0.0"),
    ({"epsilon": math.inf}, "epsilon must be a finite number > 0"),
    ({"epsilon": 1.0, "delta": 1.0}, "delta must be a number strictly between 0 and 1"),
    ({"epsilon": 1.0, "mode": "local"}, "mode must be one of central, distributed"),
])
def test_dp_config_errors(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DPConfig(**kw)  # type: ignore[arg-type]


def test_plan_needs_a_clipping_bound() -> None:
    from ghofl.privacy import plan_noise

    with pytest.raises(ConfigError, match="differential privacy needs a per-sample clipping"):
        plan_noise(DPConfig(1.0), "full", None)


def test_budget_fractions_are_checked() -> None:
    from ghofl.privacy import plan_noise

    with pytest.raises(ConfigError, match="must give every block"):
        plan_noise(DPConfig(1.0, fractions={"counts": 1.0}), "full", R)


# ---------------------------------------------------------------------- noise
def _chi2_interval(n: int) -> tuple[float, float]:
    return (math.sqrt(chi2.ppf(0.0005, n) / n), math.sqrt(chi2.ppf(0.9995, n) / n))


@pytest.mark.parametrize("mode", MODES)
def test_noise_has_the_calibrated_std(mode: str) -> None:
    plan = _plan(mode)
    counts, floats = draw_noise(plan, 50, 20, np.random.default_rng(3))
    lo, hi = _chi2_interval(50)
    assert lo <= np.std(counts) / plan.sigma["counts"] <= hi
    for seg in schema_for(mode).float_layout(50, 20):
        part = floats[seg.offset : seg.stop]
        scales = entry_scales(mode, seg.name, 50, 20)
        if scales is not None:  # off-diagonal entries get sigma / sqrt(2) (N2s)
            off = scales < 1.0
            assert np.all(scales[off] == pytest.approx(math.sqrt(0.5)))
            assert np.count_nonzero(~off) == part.size * 2 // 21  # d = 20: 20 of 210 per matrix
            part = part / scales
        lo, hi = _chi2_interval(part.size)
        assert lo <= float(np.sqrt(np.mean(part**2))) / plan.sigma[seg.name] <= hi, seg.name


@pytest.mark.parametrize("survivors", [4, 5, 7])
def test_survivors_noise_has_at_least_the_target_variance(survivors: int) -> None:
    plan, t = _plan("diag"), 4
    rng = np.random.default_rng(4)
    shares = [draw_noise(plan, 2000, 3, rng, scale=1 / math.sqrt(t), clamp=NOISE_CLAMP_SIGMAS)
              for _ in range(survivors)]
    total = sum(s[1] for s in shares)
    sigma = plan.sigma["sums"]
    part = np.asarray(total)[: 2000 * 3]  # the sums block
    lo, hi = _chi2_interval(part.size)
    ratio = float(np.sqrt(np.mean(part**2))) / (sigma * math.sqrt(survivors / t))
    assert lo <= ratio <= hi
    assert survivors / t >= 1.0  # any s >= t survivors carry variance s·σ²/t >= σ²


def test_truncation_probability_is_negligible() -> None:
    assert truncation_probability(10**9) < 1e-20
    assert truncation_probability(10, clamp=0.0) == 1.0


# ---------------------------------------------------------------------- post-processing
@pytest.mark.parametrize("mode", MODES)
def test_postprocessing_gives_valid_psd_statistics_and_fittable_heads(mode: str) -> None:
    from ghofl.heads import make_head

    rng = np.random.default_rng(5)
    c, d = 3, 6
    x, y = rng.normal(size=(60, d)) + np.arange(3)[rng.integers(0, 3, 60)][:, None], \
        rng.integers(0, 3, 60)
    total = compute_stats(x, y, c, mode, clip_norm=R)
    ints, floats = schema_for(mode).flatten(total)
    plan = _plan(mode, z=3.0)
    dc, df = draw_noise(plan, c, d, rng)
    counts = ints[:c] + dc
    counts[1] = -4.0  # a class whose noisy count is not positive
    stats, notes = postprocess(total.meta, counts, floats + df)
    assert stats.counts[1] == 1 and not stats.sums[1].any() and stats.n_clipped == 0
    assert any("placeholders" in n for n in notes)
    scat = stats.class_scatter if mode == "full" else stats.total_scatter
    if scat is not None:
        mats = scat if scat.ndim == 3 else scat[None]
        for m in mats:
            assert np.linalg.eigvalsh(m).min() >= -1e-8 * max(1.0, np.abs(m).max())
    for head in {"full": ("nb", "lda", "qda"), "pooled": ("nb", "lda"), "gram": ("lda", "ridge"),
                 "diag": ("nb",)}[mode]:
        pred = make_head(head).fit_from_stats(stats).predict(x)
        assert pred.shape == (60,)
    first = "lda" if mode == "gram" else "nb"  # gram holds no D_c: no naive Bayes
    proba = make_head(first).fit_from_stats(stats).predict_proba(x)
    assert np.all(np.isfinite(proba))


def test_project_psd_is_the_identity_on_psd_matrices() -> None:
    rng = np.random.default_rng(6)
    a = rng.normal(size=(5, 5))
    m = a @ a.T
    np.testing.assert_allclose(project_psd(m), m, atol=1e-10)
    assert np.linalg.eigvalsh(project_psd(m - 10 * np.eye(5))).min() >= -1e-10


# ---------------------------------------------------------------------- minimum count
def test_minimum_count_rule_drops_small_classes() -> None:
    x = np.arange(14, dtype=np.float64).reshape(7, 2)
    y = np.array([0, 0, 0, 1, 1, 2, 0])
    kx, ky = suppress_small_classes(x, y, 4, 3)
    assert ky.tolist() == [0, 0, 0, 0] and kx.shape == (4, 2)
    s = client_statistics((x, y), ClientJob(("a", "b", "c", "d"), min_class_count=3))
    assert s.counts.tolist() == [4, 0, 0, 0] and not s.sums[1:].any()
    assert client_statistics((x, y), ClientJob(("a", "b", "c", "d"))).counts.tolist() == \
        [4, 2, 1, 0]


@pytest.mark.parametrize("mode", MODES)
def test_the_minimum_count_thresholds_the_noised_counts_after_the_noise(mode: str) -> None:
    """T_k reads the noised release only: the same noise draw for every k, the same released
    values on the classes kept, placeholders exactly where the noised count rounds below k."""
    from ghofl.privacy import release_central

    rng = np.random.default_rng(8)
    c, d = 6, 3
    y = np.repeat(np.arange(c), [1, 2, 4, 6, 9, 30])
    total = compute_stats(rng.normal(size=(y.size, d)), y, c, mode, clip_norm=R)
    base = _plan(mode, z=0.3)
    released = {}
    for k in (1, 3, 7):
        plan = NoisePlan(base.config, mode, R, k, base.noise_multiplier, base.sensitivity,
                         base.fractions, base.sigma)
        released[k] = release_central(total, plan, np.random.default_rng(9)).stats
    noised = released[1].counts
    assert np.any(noised < 7) and np.any(noised >= 7)
    for k, stats in released.items():
        dropped = noised < k
        assert np.array_equal(stats.counts, np.where(dropped, 1, noised))
        assert not stats.sums[dropped].any()
        np.testing.assert_array_equal(stats.sums[~dropped], released[1].sums[~dropped])


def test_minimum_count_travels_in_the_job_config() -> None:
    job = ClientJob(("a", "b"), min_class_count=5)
    from ghofl.server.config import plan_from_config, plan_to_config
    from ghofl.server.plan import FederationPlan

    assert plan_from_config(plan_to_config(FederationPlan(job))).client == job
    with pytest.raises(ConfigError, match="min_class_count must be an integer >= 1; got 0"):
        ClientJob(("a", "b"), min_class_count=0)


# ---------------------------------------------------------------------- secure rounds
def test_distributed_noise_goes_through_secure_aggregation() -> None:
    from ghofl.privacy import NoisyDecoder, noise_share_encoder
    from ghofl.secure import (
        InMemoryTransport,
        SecAggClient,
        SecAggConfig,
        SecAggServer,
        run_aggregation,
    )

    rng = np.random.default_rng(7)
    plan = _plan("full", z=1.0, dp_mode="distributed")
    payloads = [compute_stats(rng.normal(size=(30, 4)), rng.integers(0, 3, 30), 3, "full",
                              clip_norm=R) for _ in range(4)]
    seeds = np.random.SeedSequence(8).spawn(4)
    clients = [SecAggClient(f"c{i}", p, encode=noise_share_encoder(
        plan, np.random.default_rng(seeds[i])), allow_unauthenticated=True)
        for i, p in enumerate(payloads)]
    decoder = NoisyDecoder(plan)
    server = SecAggServer(SecAggConfig(clip_norm=R, threshold=3), payloads[0].meta,
                          [c.client_id for c in clients], decode=decoder)
    report = run_aggregation(server, InMemoryTransport(clients))
    exact = sum(payloads[1:], payloads[0])
    assert decoder.release is not None and report.total is decoder.release.stats
    assert np.abs(report.total.counts - exact.counts).max() <= 8 * plan.sigma["counts"]
    assert report.total.n_clipped == 0
    assert decoder.release.delta_spent == pytest.approx(1e-5, rel=1e-9)


def test_noise_share_must_fit_the_public_bound() -> None:
    from ghofl.privacy import noise_share_encoder
    from ghofl.secure import SecAggConfig

    plan = _plan("diag", z=50.0, dp_mode="distributed")
    stats = compute_stats(np.ones((3, 2)), np.zeros(3, np.int64), 2, "diag", clip_norm=R)
    params = SecAggConfig(clip_norm=R, max_samples=10).for_clients(3)
    with pytest.raises(InputError, match="its noise share may add as much as"):
        noise_share_encoder(plan, np.random.default_rng(0))(stats, params)


# ---------------------------------------------------------------------- noise-aware estimate
def test_noise_aware_covariances_are_positive_definite_and_exact_without_noise() -> None:
    from ghofl.privacy import noise_aware_covariances

    rng = np.random.default_rng(11)
    a = rng.normal(size=(4, 4))
    covs = np.stack([a @ a.T * s + np.eye(4) for s in (1.0, 2.0)])
    n = np.array([500.0, 800.0])
    noisy = covs * (n - 1)[:, None, None] + rng.normal(scale=40.0, size=(2, 4, 4))
    out = noise_aware_covariances(noisy, n, 40.0)
    assert all(np.linalg.eigvalsh(m).min() > 0 for m in out)
    np.testing.assert_allclose(out, np.swapaxes(out, 1, 2))
    exact = noise_aware_covariances(covs * (n - 1)[:, None, None], n, 0.0)
    assert np.max(np.abs(exact - covs)) < 0.05 * np.abs(covs).max()  # little shrinkage


def test_noise_aware_release_keeps_qda_from_collapsing() -> None:
    """At ε = 8 (noise multiplier of about 0.5) on the synthetic Gaussian set, the projection
    (P2) lets QDA whiten the noise; the noise-aware estimate (P2n) keeps it near LDA."""
    from ghofl.bench.synthetic import gaussian_classes
    from ghofl.heads import make_head

    s = gaussian_classes(1, dim=12, num_classes=4, n_train=8000, n_test=2000)
    total = compute_stats(s.x_train, s.y_train, 4, "full", clip_norm=R * 3)
    sens = block_sensitivities("full", R * 3)
    frac = {b: 1.0 / 3 for b in sens}
    sigma = block_sigmas(sens, frac, 0.5)
    ints, floats = schema_for("full").flatten(total)
    dc, df = draw_noise(NoisePlan(DPConfig(8.0), "full", R * 3, 1, 0.5, sens, frac, sigma),
                        4, 12, np.random.default_rng(12))

    def acc(head: str, stats: object) -> float:
        return float(np.mean(make_head(head).fit_from_stats(stats).predict(s.x_test)
                             == s.y_test))

    plain, _ = postprocess(total.meta, ints[:4] + dc, floats + df)
    aware, notes = postprocess(total.meta, ints[:4] + dc, floats + df, 1, sigma)
    assert any("P2n" in n for n in notes)
    assert acc("qda", aware) > acc("qda", plain) + 0.1
    assert acc("qda", aware) >= acc("lda", aware) - 0.03
