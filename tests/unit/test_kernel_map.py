"""The public kernel feature map (x+sqrt+rbf): construction, files, fingerprints, the
transform plumbing, clipping bounds and the heads on its statistics."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from ghofl.client import kernel_map as km
from ghofl.client.encoders.clipping import default_clip_norm, split_transform
from ghofl.client.transforms import (
    apply_feature_transform,
    base_dim,
    check_feature_transform,
    kernel_map_of,
    recorded_feature_transform,
    transformed_dim,
    transformed_info,
)
from ghofl.errors import ConfigError, IncompatibleStatsError, InputError
from ghofl.heads import make_head
from ghofl.stats import EncoderInfo, compute_stats, sum_stats
from ghofl.stats.projection import BASIS_DIR_ENV


@pytest.fixture()
def map_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private folder of map files (and no user cache), with the loader's cache cleared."""
    monkeypatch.setenv(BASIS_DIR_ENV, str(tmp_path / "maps"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    km._load_cached.cache_clear()
    yield tmp_path / "maps"
    km._load_cached.cache_clear()


def _public(n: int = 300, d: int = 6, seed: int = 0) -> np.ndarray:
    """Non-negative, skewed 'pooled activations' standing in for public embeddings."""
    return np.random.default_rng(seed).gamma(0.7, 1.0, size=(n, d))


def _saved(map_dir: Path, k: int = 16, seed: int = 0) -> tuple[km.KernelMap, str]:
    m = km.build_kernel_map(_public(), k, seed=seed, source="test")
    _, fp = km.save_kernel_map(m)
    return m, f"x+sqrt+rbf:{fp}"


def test_build_uses_public_rows_median_bandwidth_and_matched_variance() -> None:
    x = _public()
    m = km.build_kernel_map(x, 20, seed=3)
    s = np.sqrt(x)
    # anchors are distinct public rows (in the sqrt space), reproducible from the seed
    rows = [int(np.flatnonzero(np.all(np.isclose(s, a, atol=1e-6), axis=1))[0])
            for a in m.anchors]
    assert len(set(rows)) == 20
    assert km.build_kernel_map(x, 20, seed=3).fingerprint == m.fingerprint
    assert km.build_kernel_map(x, 20, seed=4).fingerprint != m.fingerprint
    d2 = ((s[:, None, :] - m.anchors[None].astype(np.float64)) ** 2).sum(-1)
    assert m.gamma == pytest.approx(1.0 / (2.0 * np.median(d2)), rel=1e-5)
    k = m.kernel_block(x)
    base_var = np.mean(np.concatenate([x.var(0), s.var(0)]))
    assert np.mean(k.var(0)) == pytest.approx(base_var, rel=1e-4)
    np.testing.assert_allclose(k.mean(0), 0.0, atol=1e-5 * m.scale)  # centred on public data


def test_kernel_block_matches_the_formula_in_blocks_and_dtypes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x = _public(50)
    m = km.build_kernel_map(_public(300, seed=1), 8)
    s = np.sqrt(x)
    a = m.anchors.astype(np.float64)
    want = m.scale * np.exp(-m.gamma * ((s[:, None, :] - a[None]) ** 2).sum(-1)) - m.offset
    monkeypatch.setattr(km, "BLOCK_ROWS", 7)  # several blocks, a ragged last one
    np.testing.assert_allclose(m.kernel_block(x), want, rtol=1e-10)
    phi = m.apply(x.astype(np.float32))
    assert phi.dtype == np.float32 and phi.shape == (50, 2 * 6 + 8)
    np.testing.assert_allclose(phi[:, :6], x, rtol=1e-6)
    np.testing.assert_allclose(phi[:, 6:12], s, rtol=1e-6)
    np.testing.assert_allclose(phi[:, 12:], want, rtol=1e-5)
    assert np.all(phi[:, 12:] <= m.scale - m.offset) and np.all(phi[:, 12:] > -m.offset)
    assert m.apply(np.round(x * 10).astype(np.int64)).dtype == np.float64


@pytest.mark.parametrize(("x", "k", "match"), [
    (np.zeros((5, 2, 2)), 2, "2-D array"),
    (np.full((5, 2), np.nan), 2, "NaN or infinite"),
    (np.ones((5, 2)), 6, "at least as many public samples"),
    (np.ones((5, 2)), 0, "at least 1"),
    (np.ones((5, 2)), 2, "no spread"),
])
def test_build_refuses_bad_public_data(x: np.ndarray, k: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        km.build_kernel_map(x, k)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"anchors": np.ones(3)}, "2-D array"),
    ({"anchors": -np.ones((2, 3))}, "non-negative"),
    ({"gamma": 0.0}, "gamma must be a finite positive"),
    ({"scale": float("nan")}, "scale must be a finite positive"),
    ({"offset": np.zeros(3)}, "offsets must be 2 finite numbers"),
    ({"offset": np.array([0.5, 1.5])}, "offsets must lie in \\[0, scale\\]"),
])
def test_map_values_are_validated(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"anchors": np.ones((2, 3)), "gamma": 1.0, "scale": 1.0,
                               "offset": np.full(2, 0.5)}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        km.KernelMap(**args)  # type: ignore[arg-type]


def test_wrong_input_dimension_is_refused() -> None:
    m = km.build_kernel_map(_public(), 4)
    with pytest.raises(ConfigError, match="built for 6-dimensional embeddings; got shape"):
        m.apply(np.ones((3, 5)))


def test_save_load_round_trip(map_dir: Path) -> None:
    m = km.build_kernel_map(_public(), 12, source="public set")
    path, fp = km.save_kernel_map(m)
    assert path == map_dir / f"{fp}.rbf.npz" and fp == m.fingerprint
    back = km.load_kernel_map(fp)
    np.testing.assert_array_equal(back.anchors, m.anchors)
    assert (back.gamma, back.scale, back.source) == (m.gamma, m.scale, "public set")
    assert back.fingerprint == fp


def test_corrupted_or_missing_map_files_are_refused(map_dir: Path) -> None:
    m = km.build_kernel_map(_public(), 12)
    path, fp = km.save_kernel_map(m)
    with pytest.raises(ConfigError, match="16 lower-case hex digits"):
        km.load_kernel_map("nothex")
    with pytest.raises(ConfigError, match="no kernel feature map with fingerprint 0000000000000000"):
        km.load_kernel_map("0" * 16)
    # a file changed after it was written: its content no longer hashes to its name
    other = km.KernelMap(m.anchors, m.gamma * 2, m.scale, m.offset)
    _, fp2 = km.save_kernel_map(other)
    (map_dir / f"{fp2}.rbf.npz").replace(path)
    km._load_cached.cache_clear()
    with pytest.raises(ConfigError, match=f"has fingerprint {fp2}, not {fp}; it was changed"):
        km.load_kernel_map(fp)
    path.write_bytes(b"not a zip file")
    km._load_cached.cache_clear()
    with pytest.raises(ConfigError, match="is unreadable"):
        km.load_kernel_map(fp)


def test_transform_names_parse_and_refuse() -> None:
    fp = "0123456789abcdef"
    assert check_feature_transform(f"x+sqrt+rbf:{fp}") == f"x+sqrt+rbf:{fp}"
    assert kernel_map_of(f"x+sqrt+rbf:{fp}") == fp and kernel_map_of("x+sqrt") is None
    with pytest.raises(ConfigError, match="must name its kernel map: x\\+sqrt\\+rbf:<fingerprint>"):
        check_feature_transform("x+sqrt+rbf")
    with pytest.raises(ConfigError, match="must name its kernel map"):
        check_feature_transform("x+sqrt+rbf:XYZ")
    with pytest.raises(ConfigError, match="must be one of none, sqrt, x\\+sqrt or x\\+sqrt\\+rbf"):
        check_feature_transform("rbf")


def test_transform_plumbing_dims_info_and_merge_refusal(map_dir: Path) -> None:
    m, name = _saved(map_dir)
    _, other = _saved(map_dir, seed=5)
    assert transformed_dim(6, name) == 2 * 6 + 16 and base_dim(28, name) == 6
    with pytest.raises(ConfigError, match="built for 6-dimensional embeddings, not 5"):
        transformed_dim(5, name)
    info = EncoderInfo("lite0", 6, "w", "resize 224", 224)
    t = transformed_info(info, name)
    assert t.dim == 28 and t.preprocessing == f"resize 224; then {name}"
    assert recorded_feature_transform(t) == name
    assert split_transform(t) == (info, name)
    x = _public(40, seed=2)
    y = np.arange(40) % 3
    phi = apply_feature_transform(x, name)
    np.testing.assert_allclose(phi, m.apply(x))
    a = compute_stats(phi, y, 3, mode="pooled", encoder=t)
    b = compute_stats(apply_feature_transform(x, other), y, 3, mode="pooled",
                      encoder=transformed_info(info, other))
    with pytest.raises(IncompatibleStatsError, match="differ in encoder"):
        sum_stats([a, b])


def test_default_clip_norm_bounds_the_kernel_block_by_construction(map_dir: Path) -> None:
    from ghofl.client.encoders.clipping import DEFAULT_CLIP_NORMS, MEASURED_WEIGHTS
    from ghofl.client.encoders.efficientnet_lite import LITE_DIM, lite_preprocessing

    public = _public(300, LITE_DIM)
    m = km.build_kernel_map(public, 32)
    _, fp = km.save_kernel_map(m)
    info = EncoderInfo("efficientnet-lite0", LITE_DIM, MEASURED_WEIGHTS["efficientnet-lite0"],
                       lite_preprocessing(224), 224)
    r = default_clip_norm(info, f"x+sqrt+rbf:{fp}")
    base = DEFAULT_CLIP_NORMS[("efficientnet-lite0", 224)]["x+sqrt"]
    assert r is not None and r >= np.hypot(base, m.norm_bound())
    assert r <= 1.1 * np.hypot(base, m.norm_bound())
    assert m.norm_bound() <= m.scale * np.sqrt(32)
    assert default_clip_norm(transformed_info(info, f"x+sqrt+rbf:{fp}")) == r
    # no kernel value leaves (0, κ], so the block's norm never passes the bound
    assert np.linalg.norm(m.kernel_block(public), axis=1).max() <= m.norm_bound()


def test_heads_on_kernel_statistics_beat_linear_ones_on_a_nonlinear_problem(
        map_dir: Path) -> None:
    """An XOR of two thresholds in the √x space: [x, √x] holds no product term, so no
    linear head separates the classes from x+sqrt; the kernel block does, from the same
    one-shot statistics."""
    rng = np.random.default_rng(0)

    def shells(n: int) -> tuple[np.ndarray, np.ndarray]:
        s = rng.uniform(0.0, 2.0, size=(n, 2))
        y = ((s[:, 0] > 1.0) ^ (s[:, 1] > 1.0)).astype(np.int64)
        return s**2, y  # non-negative "activations" whose square roots are s

    x, y = shells(2000)
    xt, yt = shells(1000)
    m = km.build_kernel_map(shells(1000)[0], 64)
    _, fp = km.save_kernel_map(m)
    name = f"x+sqrt+rbf:{fp}"
    accs = {}
    for t in ("x+sqrt", name):
        st = compute_stats(apply_feature_transform(x, t), y, 2, mode="pooled")
        head = make_head("ridge").fit_from_stats(st)
        accs[t] = float(np.mean(head.predict(apply_feature_transform(xt, t)) == yt))
    assert accs["x+sqrt"] < 0.75 < 0.9 < accs[name]
    # a head fitted on transformed statistics names the transform when given raw embeddings
    info = transformed_info(EncoderInfo("enc", 2), name)
    head = make_head("lda").fit_from_stats(
        compute_stats(apply_feature_transform(x, name), y, 2, mode="pooled", encoder=info))
    with pytest.raises(InputError,
                       match=re.escape(f"the clients applied the feature transform '{name}'")):
        head.predict(xt)


def test_centred_kernel_block_survives_float32_transport(map_dir: Path) -> None:
    """The offsets keep the kernel block's covariance intact when each client's sums travel
    as float32 (without them its mean is many standard deviations and the covariance cancels
    away)."""
    from ghofl.moments.core import compute_moments
    from ghofl.stats.codec import through_transport

    m = km.build_kernel_map(_public(2000, 8, seed=1), 32)
    x = _public(6000, 8, seed=2)
    y = np.arange(6000) % 4
    phi = m.apply(x)
    parts = np.array_split(np.arange(6000), 6)
    covs = {}
    for dtype in ("float64", "float32"):
        total = sum_stats(through_transport(compute_stats(phi[i], y[i], 4, mode="pooled"), dtype)
                          for i in parts)
        covs[dtype] = compute_moments(total).pooled_covariance()[16:, 16:]
    err = np.abs(covs["float32"] - covs["float64"]).max() / np.abs(covs["float64"]).max()
    assert err < 1e-7  # without the offsets: 7e-7 on these data


def test_client_job_and_flower_metadata_carry_the_kernel_transform(map_dir: Path) -> None:
    """The ClientJob that the CLI and the Flower ClientApp share validates the name, and the
    run metadata both Flower apps derive has the kernel dimension."""
    from ghofl.client.job import ClientJob
    from ghofl.integrations.flower._config import job_meta

    _, name = _saved(map_dir)
    job = ClientJob(("a", "b"), "pooled", feature_transform=name)
    meta = job_meta(job, 6)
    assert meta.dim == 2 * 6 + 16
    with pytest.raises(ConfigError, match="must name its kernel map"):
        ClientJob(("a", "b"), "pooled", feature_transform="x+sqrt+rbf")
