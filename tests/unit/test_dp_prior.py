"""A public within-class covariance as the prior of a DP release (issue 41, P3p).

The server mixes the denoised pooled covariance of a ``pooled`` or ``gram`` release with a
public covariance, P̂ = (1 − b)·R + b·s·T, at b* = s·⟨T, P̃ − R⟩/‖R − s·T‖²
(:mod:`ghofl.privacy.prior`). It reads the release and public values only: post-processing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghofl.errors import ConfigError
from ghofl.moments.core import compute_moments
from ghofl.privacy import DPConfig, block_sensitivities, block_sigmas, draw_noise, plan_noise
from ghofl.privacy.mechanism import PrivateRelease, release_central
from ghofl.privacy.postprocess import (
    denoise_covariance,
    noise_aware_within,
    noisy_pooled_covariance,
    postprocess,
)
from ghofl.privacy.prior import (
    check_prior_option,
    choose_prior,
    default_prior,
    load_prior,
    mix_prior,
    prior_fingerprint,
    prior_weight,
    save_prior,
    within_covariance,
)
from ghofl.stats.accumulate import compute_stats
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import EncoderInfo, StatsMeta
from ghofl.stats.projection import (
    BASIS_DIR_ENV,
    PCA_GENERATOR,
    ProjectionSpec,
    pca_basis,
    save_basis,
)
from ghofl.stats.schema import schema_for

D, C = 10, 3
CLIP = 6.0  # about the 90th percentile of the rows' norms
CLASSES = ("a", "b", "c")


@pytest.fixture()
def public_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(BASIS_DIR_ENV, str(tmp_path))
    return tmp_path


def _spectrum(d: int = D) -> np.ndarray:
    return np.diag(np.geomspace(3.0, 0.05, d))


def _data(seed: int, n: int = 3000, d: int = D) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    x = rng.standard_normal((n, d)) @ _spectrum(d)
    x[:, -1] += 0.3 * y  # the classes differ along the weakest axis
    return x, y


def _public(seed: int, n: int = 4000, d: int = D) -> tuple[np.ndarray, np.ndarray]:
    """Other classes, the same within-class geometry."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 7, n)
    x = rng.standard_normal((n, d)) @ _spectrum(d) + 5.0 * rng.standard_normal((7, d))[y]
    return x, y


def _meta(mode: str = "pooled", **kw: object) -> StatsMeta:
    return StatsMeta(mode, D, CLASSES, clip_norm=50.0, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the artefact
def test_within_covariance_matches_per_class_centring() -> None:
    x, y = _public(1, n=500)
    got = within_covariance(x, y)
    centred = np.concatenate([x[y == c] - x[y == c].mean(axis=0) for c in np.unique(y)])
    np.testing.assert_allclose(got, centred.T @ centred / (len(y) - 7), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(got, got.T)
    # rows clipped to the federation's bound first, as its clients do
    bound = 0.5 * float(np.median(np.linalg.norm(x, axis=1)))
    xc = x * np.minimum(1.0, bound / np.linalg.norm(x, axis=1))[:, None]
    np.testing.assert_allclose(within_covariance(x, y, bound), within_covariance(xc, y),
                               rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("x", "y", "clip", "match"), [
    (np.ones((4, 3)), np.zeros(3, dtype=int), None, r"features \(n, d\) and one label per row"),
    (np.full((4, 3), np.nan), np.zeros(4, dtype=int), None, r"contain NaN or infinite"),
    (np.ones((4, 3)), np.array([0, 1, -1, 0]), None, r"non-negative integers"),
    (np.ones((4, 3)), np.array([0.0, 1.0, 1.0, 0.0]), None, r"non-negative integers"),
    (np.ones((2, 3)), np.array([0, 1]), None, r"more rows than classes; got 2 rows of 2"),
    (np.ones((4, 3)), np.zeros(4, dtype=int), 0.0, r"clipping bound must be positive"),
])
def test_within_covariance_refuses_bad_input(x: np.ndarray, y: np.ndarray, clip: float | None,
                                             match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        within_covariance(x, y, clip)


def test_save_load_and_the_encoders_default(public_dir: Path) -> None:
    cov = within_covariance(*_public(2))
    enc = EncoderInfo("enc", D)
    path, fp = save_prior(cov, default_for=enc.fingerprint(), source="public: 4000")
    assert path == public_dir / f"{fp}.cov.npy" and fp == prior_fingerprint(cov)
    got = load_prior(fp)
    np.testing.assert_array_equal(got, cov.astype(np.float32).astype(np.float64))
    assert not got.flags.writeable
    assert default_prior(enc.fingerprint()) == fp
    record = json.loads((public_dir / f"{enc.fingerprint()}.cov.json").read_text())
    assert record == {"covariance": fp, "dim": D, "source": "public: 4000"}
    assert default_prior(EncoderInfo("other", D).fingerprint()) is None


def test_load_and_save_refuse_bad_files(public_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"no public covariance with fingerprint "
                                          r"00000000deadbeef in .*ghofl covariance-prior"):
        load_prior("00000000deadbeef")
    _, fp = save_prior(np.eye(3))
    (public_dir / f"{fp}.cov.npy").write_bytes(b"changed")
    with pytest.raises(ConfigError, match=rf"has fingerprint [0-9a-f]{{16}}, not {fp}; it was "
                                          r"changed or corrupted"):
        load_prior(fp)
    with pytest.raises(ConfigError, match=r"must be symmetric"):
        save_prior(np.triu(np.ones((3, 3))))
    with pytest.raises(ConfigError, match=r"finite square array \(d, d\); got shape \(2, 3\)"):
        save_prior(np.ones((2, 3)))
    (public_dir / "abc.cov.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"is malformed .*rebuild it with ghofl "
                                          r"covariance-prior"):
        default_prior("abc")
    (public_dir / "abd.cov.json").write_text('{"covariance": "XYZ"}')
    with pytest.raises(ConfigError, match=r"names no valid covariance fingerprint; rebuild it "
                                          r"with ghofl covariance-prior"):
        default_prior("abd")


def test_a_non_symmetric_file_is_refused(public_dir: Path) -> None:
    import hashlib
    import io

    buf = io.BytesIO()
    np.save(buf, np.triu(np.ones((3, 3), dtype="<f4")), allow_pickle=False)
    blob = buf.getvalue()
    fp = hashlib.sha256(blob).hexdigest()[:16]
    (public_dir / f"{fp}.cov.npy").write_bytes(blob)
    with pytest.raises(ConfigError, match=r"is not a finite symmetric square array"):
        load_prior(fp)


# ---------------------------------------------------------------------- the option
@pytest.mark.parametrize("text", ["auto", "none", "auto:0123456789abcdef", " none "])
def test_option_forms_accepted(text: str) -> None:
    assert check_prior_option(text) == text.strip()
    assert DPConfig(1.0, prior=text).prior == text.strip()


@pytest.mark.parametrize("text", ["", "auto:", "auto:xyz", "0123456789abcdef", "mix:0.5",
                                  "auto:0123456789ABCDEF", "none:1"])
def test_option_forms_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid DP prior .*expected auto, "
                                          r"auto:<covariance fingerprint> or none"):
        DPConfig(1.0, prior=text)
    with pytest.raises(ConfigError, match=r"the DP prior must be a string"):
        check_prior_option(3)  # type: ignore[arg-type]


def test_default_is_auto_and_recorded_in_the_plan() -> None:
    cfg = DPConfig(1.0)
    assert cfg.prior == "auto"
    assert plan_noise(cfg, "pooled", 2.0, num_classes=C, dim=D).to_dict()["prior"] == "auto"


# ---------------------------------------------------------------------- the choice
def test_choose_prior_finds_names_or_declines(public_dir: Path) -> None:
    cov = within_covariance(*_public(3))
    enc = EncoderInfo("enc", D)
    _, fp = save_prior(cov, default_for=enc.fingerprint())
    want = cov.astype(np.float32).astype(np.float64)
    auto = choose_prior("auto", _meta(encoder=enc))
    assert auto.fingerprint == fp and auto.target is not None
    np.testing.assert_allclose(auto.target, want)
    named = choose_prior(f"auto:{fp}", _meta())
    assert named.fingerprint == fp and named.target is not None
    none = choose_prior("none", _meta(encoder=enc))
    assert none.target is None and none.reason == "no public covariance prior (DP prior: none)"
    no_enc = choose_prior("auto", _meta())
    assert no_enc.target is None and "the statistics record no encoder" in no_enc.reason
    other = choose_prior("auto", _meta(encoder=EncoderInfo("other", D)))
    assert other.target is None and "none is recorded for the encoder" in other.reason


def test_choose_prior_projects_with_the_statistics(public_dir: Path) -> None:
    cov = within_covariance(*_public(4))
    _, fp = save_prior(cov)
    _, bfp = save_basis(pca_basis(_public(5)[0], 4))
    for spec in (ProjectionSpec(0, D, 4, PCA_GENERATOR, bfp), ProjectionSpec(7, D, 4)):
        got = choose_prior(f"auto:{fp}", replace(_meta(), dim=4, projection=spec))
        m = spec.matrix()
        assert got.target is not None
        np.testing.assert_allclose(got.target, m.T @ load_prior(fp) @ m, rtol=1e-12)
    _, small = save_prior(np.eye(D - 1))
    with pytest.raises(ConfigError, match=rf"public covariance {small} is 9-dimensional but "
                                          r"the statistics' encoder space has d=10"):
        choose_prior(f"auto:{small}", _meta())


# ---------------------------------------------------------------------- the weight
def _projection_estimate(p: np.ndarray, noisy: np.ndarray) -> np.ndarray:
    """The oracle of the denoised eigenvalues: ξ_i = v_iᵀ P v_i on P̃'s eigenvectors."""
    _, v = np.linalg.eigh(noisy)
    xi = np.einsum("di,de,ei->i", v, p, v)
    out: np.ndarray = (v * xi) @ v.T
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.01, 2.0))
def test_weight_is_the_exact_minimiser_given_the_oracle(seed: int, noise: float) -> None:
    """With R the oracle estimate (⟨R, P − R⟩ = 0) and P̃ replaced by P, b* is the exact
    minimiser over [0, 1] of ‖(1 − b)R + b·s·T − P‖²."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((8, 8))
    p = a @ a.T / 8 + 0.1 * np.eye(8)
    e = rng.standard_normal((8, 8)) * noise
    r = _projection_estimate(p, p + (e + e.T) / 2)
    t = p + 0.3 * np.diag(rng.random(8))  # a public covariance near P
    b, s = prior_weight(p, r, t)
    assert s == pytest.approx(np.trace(p) / np.trace(t))
    grid = np.linspace(0.0, 1.0, 2001)
    err = [np.sum(((1 - g) * r + g * s * t - p) ** 2) for g in grid]
    best = float(grid[int(np.argmin(err))])
    assert b == pytest.approx(best, abs=1e-3)
    mixed = mix_prior(p, r, t)
    assert mixed.weight == b and mixed.scale == s
    np.testing.assert_allclose(mixed.cov, (1 - b) * r + b * s * t, rtol=1e-12, atol=1e-15)


def test_weight_without_noise_is_zero_and_degenerate_targets_give_zero() -> None:
    rng = np.random.default_rng(6)
    a = rng.standard_normal((6, 6))
    p = a @ a.T
    b0, s0 = prior_weight(p, p, np.eye(6))
    assert b0 == 0.0 and s0 == pytest.approx(np.trace(p) / 6)
    assert prior_weight(p, p + np.eye(6), np.zeros((6, 6))) == (0.0, 0.0)
    same = prior_weight(p, np.eye(6) * np.trace(p) / 6, np.eye(6))  # R = s·T: nothing to mix
    assert same[0] == 0.0
    assert mix_prior(p, p, np.eye(6)).cov is not None


def test_weight_grows_with_the_noise_and_the_mix_helps() -> None:
    """On a noisy release of a covariance the public one resembles, the denoised estimate
    gains from the mix, more at more noise; the mix stays positive definite."""
    x, y = _data(7, n=6000, d=40)
    p = within_covariance(x, y)
    t = within_covariance(*_public(8, d=40))
    rng = np.random.default_rng(9)
    weights, gains = [], []
    for nu in (0.002, 0.02, 0.2):
        g = rng.standard_normal((40, 40)) * nu / np.sqrt(2)
        e = (g + g.T) / np.sqrt(2)
        e[np.diag_indices(40)] = rng.standard_normal(40) * nu
        noisy = p + e
        r = denoise_covariance(noisy, nu)
        mixed = mix_prior(noisy, r, t)
        weights.append(mixed.weight)
        gains.append(np.sum((r - p) ** 2) - np.sum((mixed.cov - p) ** 2))
        assert np.linalg.eigvalsh(mixed.cov).min() > 0.0
    assert weights[0] < weights[1] < weights[2] and weights[2] > 0.3
    assert gains[2] > 0.0 and gains[1] > 0.0


# ---------------------------------------------------------------------- releases
def _release(total: ClientStats, cfg: DPConfig, seed: int) -> PrivateRelease:
    plan = plan_noise(cfg, total.meta.mode, CLIP, num_classes=C, dim=D)
    return release_central(total, plan, np.random.default_rng(seed))


@pytest.mark.parametrize("mode", ["pooled", "gram"])
def test_release_mixes_the_denoised_covariance_and_says_so(public_dir: Path, mode: str) -> None:
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    x, y = _data(10)
    _, fp = save_prior(within_covariance(*_public(11)))
    total = compute_stats(x, y, CLASSES, mode, clip_norm=CLIP)  # type: ignore[arg-type]
    cfg = DPConfig(0.5, subspace="none", prior=f"auto:{fp}")
    rel = _release(total, cfg, 12)
    plain = _release(total, replace(cfg, prior="none"), 12)
    assert (rel.epsilon_spent, rel.delta_spent) == (plain.epsilon_spent, plain.delta_spent)
    assert rel.stats.noise_sigma == plain.stats.noise_sigma  # type: ignore[attr-defined]
    note = next(n for n in rel.notes if "mixed with the public covariance" in n)
    assert fp in note and "no budget" in note
    assert "no public covariance prior (DP prior: none)" in plain.notes
    weight = float(note.split("weight b = ")[1].split(" ")[0])
    assert 0.0 < weight <= 1.0
    # the mix, recomputed from the same noisy draw: P̂ = (1 − b)R + b·s·T
    plan = plan_noise(cfg, mode, CLIP, num_classes=C, dim=D)
    sch = schema_for(mode)
    ints, floats = sch.flatten(total)
    dc, df = draw_noise(plan, C, D, np.random.default_rng(12))
    noisy_counts, noisy_floats = ints[:C].astype(np.float64) + dc, floats + df
    again, _ = postprocess(total.meta, noisy_counts, noisy_floats, plan.min_class_count,
                           plan.sigma, "none", f"auto:{fp}")
    m, m_plain = compute_moments(rel.stats), compute_moments(plain.stats)
    np.testing.assert_allclose(compute_moments(again).pooled_covariance("n-c"),
                               m.pooled_covariance("n-c"), rtol=1e-12)
    n = rel.stats.counts.astype(np.float64)
    dof = float(n.sum()) - C
    arrays = {}
    for spec, seg in zip(sch.float_arrays, sch.float_layout(C, D), strict=True):
        packed = noisy_floats[seg.offset: seg.stop].reshape(spec.packed_shape(C, D))
        arrays[spec.name] = spec.unpack(packed, C, D)
    sums = arrays["sums"]
    w = arrays["scatter"] - (sums.T / n) @ sums
    p_noisy, _ = noisy_pooled_covariance(w, float(n.sum()), C, plan.sigma["sums"], n)
    r = noise_aware_within(w, float(n.sum()), C, plan.sigma["sums"], plan.sigma["scatter"],
                           n) / dof
    np.testing.assert_allclose(m_plain.pooled_covariance("n-c"), r, rtol=1e-9)
    t = load_prior(fp)
    b, s = prior_weight(p_noisy, r, t)
    assert b == pytest.approx(weight, abs=5e-4)
    np.testing.assert_allclose(m.pooled_covariance("n-c"), (1 - b) * r + b * s * t, rtol=1e-9)


def test_prior_is_not_consulted_without_a_pooled_covariance(public_dir: Path) -> None:
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    x, y = _data(13)
    _, fp = save_prior(within_covariance(*_public(14)))
    for mode in ("full", "diag", "means"):
        total = compute_stats(x, y, CLASSES, mode, clip_norm=CLIP)  # type: ignore[arg-type]
        rel = _release(total, DPConfig(1.0, subspace="none", prior=f"auto:{fp}"), 15)
        assert not any("public covariance" in n for n in rel.notes), mode
    # without noise levels (a release of exact statistics) nothing is mixed either
    total = compute_stats(x, y, CLASSES, "pooled", clip_norm=CLIP)
    ints, floats = schema_for("pooled").flatten(total)
    _, notes = postprocess(total.meta, ints[:C].astype(np.float64), floats, 1, None, "none",
                           f"auto:{fp}")
    assert not any("public covariance" in n for n in notes)


def test_prior_in_the_dp_subspace_is_the_projected_covariance(public_dir: Path) -> None:
    """With the server's DP subspace the prior is projected too, and the release states both."""
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    x, y = _data(16)
    _, fp = save_prior(within_covariance(*_public(17)))
    _, bfp = save_basis(pca_basis(_public(18)[0], 6))
    total = compute_stats(x, y, CLASSES, "pooled", clip_norm=CLIP)
    rel = _release(total, DPConfig(0.5, subspace=f"pca:6:{bfp}", prior=f"auto:{fp}"), 19)
    assert rel.stats.meta.dim == 6
    assert any("first 6 principal directions" in n for n in rel.notes)
    assert any(f"mixed with the public covariance {fp}" in n for n in rel.notes)


def test_sensitivities_and_noise_are_unchanged_by_the_prior() -> None:
    """The prior is post-processing: the accounted mechanism is the same with and without."""
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    base = plan_noise(DPConfig(1.0, prior="none"), "pooled", 3.0, num_classes=C, dim=D)
    with_prior = plan_noise(DPConfig(1.0, prior="auto:0123456789abcdef"), "pooled", 3.0,
                            num_classes=C, dim=D)
    assert base.sigma == with_prior.sigma and base.sensitivity == with_prior.sensitivity
    assert dict(base.sensitivity) == block_sensitivities("pooled", 3.0)
    assert base.sigma == block_sigmas(base.sensitivity, base.fractions, base.noise_multiplier)


def test_named_public_files_are_checked_before_a_round(public_dir: Path) -> None:
    """DPConfig.check_public_files loads what the options name, so the server refuses a missing
    or corrupt file before any node is asked; ``auto`` alone names nothing."""
    DPConfig(1.0).check_public_files()
    DPConfig(1.0, subspace="none", prior="none").check_public_files()
    with pytest.raises(ConfigError, match=r"no public covariance with fingerprint "
                                          r"00000000deadbeef"):
        DPConfig(1.0, prior="auto:00000000deadbeef").check_public_files()
    for sub in ("auto:00000000deadbeef", "pca:4:00000000deadbeef"):
        with pytest.raises(ConfigError, match=r"no projection basis with fingerprint "
                                              r"00000000deadbeef"):
            DPConfig(1.0, subspace=sub).check_public_files()
    _, fp = save_prior(np.eye(D))
    _, bfp = save_basis(pca_basis(_public(20)[0], 4))
    DPConfig(1.0, subspace=f"pca:4:{bfp}", prior=f"auto:{fp}").check_public_files()


def test_named_files_of_the_options() -> None:
    """One reader of the fingerprint an option names, for the check at start and the release."""
    from ghofl.privacy.prior import named_prior
    from ghofl.privacy.subspace import named_basis

    fp = "0123456789abcdef"
    assert named_basis(f"auto:{fp}") == named_basis(f"pca:12:{fp}") == fp
    assert named_basis("auto") is named_basis("pca:12") is named_basis("none") is None
    assert named_prior(f"auto:{fp}") == fp
    assert named_prior("auto") is named_prior("none") is None
