"""CIFAR-10-C corruptions: determinism, shape/dtype/range, severity monotonicity, caching."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from ghofl.data._corruption_params import CIFAR10C_PARAMS
from ghofl.data.corruptions import (
    ALL_CORRUPTIONS,
    BENCHMARK_CORRUPTIONS,
    EXTRA_CORRUPTIONS,
    CorruptedImages,
    corrupt_image,
    corrupt_images,
    corrupted_array,
    image_rng,
)
from ghofl.data.images import ArrayImageSource
from ghofl.errors import ConfigError

pytest.importorskip("scipy")
pytest.importorskip("PIL")


def _images(n: int = 6, seed: int = 0) -> np.ndarray:
    """Smooth-ish natural-looking images: low-frequency colour fields plus texture."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:32, 0:32] / 31.0
    out = np.empty((n, 32, 32, 3), dtype=np.uint8)
    for k in range(n):
        a, b, c = rng.uniform(0.2, 0.8, 3)
        base = np.stack([a + 0.3 * xx, b + 0.3 * yy, c - 0.2 * xx * yy], axis=-1)
        tex = 0.15 * np.sin(6.0 * np.pi * (xx + rng.uniform()))[..., None]
        out[k] = np.clip((base + tex) * 255, 0, 255).astype(np.uint8)
    return out


def _frost_available() -> bool:
    try:
        from ghofl.data.corruptions import _frost_dir

        _frost_dir()
    except ImportError:
        return False
    return True


def _ops() -> list[str]:
    return [c for c in ALL_CORRUPTIONS if c != "frost" or _frost_available()]


def test_table_has_19_corruptions_with_5_severities() -> None:
    assert len(BENCHMARK_CORRUPTIONS) == 15 and len(EXTRA_CORRUPTIONS) == 4
    assert set(CIFAR10C_PARAMS) == set(ALL_CORRUPTIONS)
    assert all(len(v) == 5 for v in CIFAR10C_PARAMS.values())


@pytest.mark.parametrize("corruption", _ops())
def test_every_op_is_deterministic_uint8_and_changes_the_image(corruption: str) -> None:
    imgs = _images(3)
    idx = np.array([7, 11, 13])
    a = corrupt_images(imgs, corruption, 5, idx, seed=1)
    b = corrupt_images(imgs, corruption, 5, idx, seed=1)
    assert a.dtype == np.uint8 and a.shape == imgs.shape
    np.testing.assert_array_equal(a, b)
    assert np.any(a != imgs)


@pytest.mark.parametrize("corruption", ["gaussian_noise", "glass_blur", "fog", "snow", "spatter"])
def test_randomness_depends_on_index_seed_and_not_on_batching(corruption: str) -> None:
    imgs = np.repeat(_images(1), 3, axis=0)
    whole = corrupt_images(imgs, corruption, 3, np.array([0, 1, 2]))
    assert np.any(whole[0] != whole[1])  # same pixels, different index -> different draw
    alone = corrupt_images(imgs[2:], corruption, 3, np.array([2]))
    np.testing.assert_array_equal(whole[2], alone[0])
    other_seed = corrupt_images(imgs[:1], corruption, 3, np.array([0]), seed=5)
    assert np.any(other_seed[0] != whole[0])


def test_image_rng_keys_on_all_four_values() -> None:
    draws = {
        tuple(image_rng(*k).integers(0, 2**31, 4))
        for k in [(0, 1, "fog", 2), (1, 1, "fog", 2), (0, 2, "fog", 2), (0, 1, "snow", 2),
                  (0, 1, "fog", 3)]
    }
    assert len(draws) == 5


def _mean_abs_error(corruption: str, severity: int) -> float:
    imgs = _images(8, seed=3)
    out = corrupt_images(imgs, corruption, severity, np.arange(8))
    return float(np.abs(out.astype(np.float64) - imgs).mean())


def _high_freq_energy(x: np.ndarray) -> float:
    f = x.astype(np.float64)
    return float(np.abs(np.diff(f, axis=1)).mean() + np.abs(np.diff(f, axis=2)).mean())


@pytest.mark.parametrize(
    "corruption",
    ["gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "contrast", "brightness",
     "fog", "zoom_blur"],
)
def test_distortion_grows_with_severity(corruption: str) -> None:
    errs = [_mean_abs_error(corruption, s) for s in range(1, 6)]
    assert all(b >= a for a, b in itertools.pairwise(errs)), errs
    assert errs[-1] > errs[0]


@pytest.mark.parametrize("corruption", ["gaussian_blur", "defocus_blur"])
def test_blur_removes_more_detail_at_higher_severity(corruption: str) -> None:
    imgs = _images(8, seed=4)
    energy = [
        _high_freq_energy(corrupt_images(imgs, corruption, s, np.arange(8))) for s in range(1, 6)
    ]
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(energy)), energy
    assert energy[-1] < _high_freq_energy(imgs)


def test_contrast_keeps_channel_means_and_shrinks_spread() -> None:
    img = _images(1)[0]
    out = corrupt_image(img, "contrast", 5, np.random.default_rng(0)).astype(np.float64)
    np.testing.assert_allclose(out.mean(axis=(0, 1)), img.mean(axis=(0, 1)), atol=1.0)
    spread_out = out.std(axis=(0, 1))
    spread_in = img.astype(np.float64).std(axis=(0, 1))
    assert np.all(spread_out < 0.2 * spread_in + 1.0)


def test_hsv_round_trip() -> None:
    from ghofl.data.corruptions import _hsv_to_rgb, _rgb_to_hsv

    rgb = np.random.default_rng(0).uniform(0, 1, (50, 3))
    rgb[0] = [0.5, 0.5, 0.5]  # grey: hue undefined
    rgb[1] = [0.0, 0.0, 0.0]
    np.testing.assert_allclose(_hsv_to_rgb(_rgb_to_hsv(rgb)), rgb, atol=1e-12)


@pytest.mark.parametrize(
    ("corruption", "severity", "match"),
    [("rain", 1, "unknown corruption 'rain'"), ("fog", 0, "from 1 to 5"), ("fog", 2.5, "1 to 5")],
)
def test_bad_name_or_severity_is_refused(corruption: str, severity: float, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        corrupt_images(_images(1), corruption, severity, np.array([0]))  # type: ignore[arg-type]


def test_bad_image_is_refused() -> None:
    with pytest.raises(ConfigError, match="uint8 RGB image of shape"):
        corrupt_image(np.zeros((8, 8), np.uint8), "fog", 1, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="one index per image"):
        corrupt_images(_images(2), "fog", 1, np.array([0]))


def _source(n: int = 12) -> ArrayImageSource:
    labels = np.arange(n) % 3
    return ArrayImageSource(_images(n), labels, ("a", "b", "c"), name="toy")


def test_corrupted_view_matches_direct_corruption_and_subsamples() -> None:
    src = _source()
    view = CorruptedImages(src, "speckle_noise", 4, seed=2)
    assert len(view) == 12 and view.classes == ("a", "b", "c")
    np.testing.assert_array_equal(view.labels, src.labels)
    idx = np.array([3, 9])
    direct = corrupt_images(src.images[idx], "speckle_noise", 4, idx, seed=2)
    np.testing.assert_array_equal(view.load_batch(idx), direct)
    np.testing.assert_array_equal(view.load_batch(np.arange(12))[idx], direct)
    assert "toy" in view.name and "speckle_noise-4-seed2" in view.name
    assert CorruptedImages(src, "speckle_noise", 5).name != view.name


def test_cache_is_written_once_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    view = CorruptedImages(_source(), "gaussian_noise", 2)
    idx = np.array([1, 4, 5])
    first = corrupted_array(view, idx, cache_dir=tmp_path)
    files = list((tmp_path / "corruptions").rglob("*.npy"))
    assert len(files) == 1
    calls = []
    monkeypatch.setattr(view, "load_batch", lambda i: calls.append(i))
    second = corrupted_array(view, idx, cache_dir=tmp_path)
    assert calls == []  # read from disk, not recomputed
    np.testing.assert_array_equal(first, second)
    files[0].write_bytes(b"garbage")  # a damaged entry is recomputed
    monkeypatch.undo()
    np.testing.assert_array_equal(corrupted_array(view, idx, cache_dir=tmp_path), first)
    everything = corrupted_array(view, None, cache_dir=tmp_path)
    assert everything.shape == (12, 32, 32, 3)
    np.testing.assert_array_equal(everything[idx], first)


def test_embedding_cache_keys_on_the_corrupted_view(tmp_path: Path) -> None:
    from ghofl.client.embed import embed_dataset_cached
    from ghofl.client.encoders import CallableEncoder

    enc = CallableEncoder(
        lambda b: np.asarray(b, np.float32).reshape(len(b), -1)[:, :4], "toy", 4
    )
    clean = _source()
    noisy = CorruptedImages(clean, "gaussian_noise", 5)
    idx = np.array([0, 2])
    xc, _ = embed_dataset_cached(clean, "test", enc, idx, cache_dir=tmp_path)
    xn, yn = embed_dataset_cached(noisy, "test", enc, idx, cache_dir=tmp_path)
    assert np.any(xc != xn)
    np.testing.assert_array_equal(yn, clean.labels[idx])
    again, _ = embed_dataset_cached(noisy, "test", enc, idx, cache_dir=tmp_path)
    np.testing.assert_array_equal(again, xn)


def test_frost_without_its_textures_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from ghofl.data import corruptions
    from ghofl.errors import MissingExtraError

    corruptions._frost_texture.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingExtraError, match=r"pip install 'ghofl\[corruptions\]'"):
        corrupt_images(_images(1), "frost", 1, np.array([0]))
    corruptions._frost_texture.cache_clear()
