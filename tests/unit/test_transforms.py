"""Client-side feature transforms and their place in the encoder fingerprint."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.client.transforms import apply_feature_transform, transformed_info
from ghofl.errors import ConfigError, IncompatibleStatsError
from ghofl.stats import EncoderInfo, compute_stats


def test_sqrt_transform_values_and_dtype() -> None:
    x = np.array([[0.0, 4.0], [9.0, -1e-9]], dtype=np.float32)
    out = apply_feature_transform(x, "sqrt")
    np.testing.assert_array_equal(out, np.array([[0.0, 2.0], [3.0, 0.0]], dtype=np.float32))
    assert out.dtype == np.float32
    assert apply_feature_transform(x, "none") is x


def test_transform_changes_the_fingerprint_so_payloads_cannot_mix() -> None:
    info = EncoderInfo("lite0", 2, "w", "resize 224", 224)
    assert transformed_info(info, "none") == info
    sq = transformed_info(info, "sqrt")
    assert sq.preprocessing == "resize 224; then sqrt" and sq.fingerprint() != info.fingerprint()
    x, y = np.abs(np.random.default_rng(0).normal(size=(20, 2))), np.arange(20) % 2
    a = compute_stats(x, y, 2, encoder=info)
    b = compute_stats(apply_feature_transform(x, "sqrt"), y, 2, encoder=sq)
    with pytest.raises(IncompatibleStatsError, match="differ in encoder"):
        _ = a + b


def test_concat_transform_doubles_the_dimension() -> None:
    x = np.array([[1.0, 4.0]])
    np.testing.assert_array_equal(apply_feature_transform(x, "x+sqrt"), [[1.0, 4.0, 1.0, 2.0]])
    info = transformed_info(EncoderInfo("lite0", 2), "x+sqrt")
    assert info.dim == 4 and info.preprocessing == "x+sqrt"
    s = compute_stats(apply_feature_transform(x, "x+sqrt"), np.array([0]), 1, encoder=info)
    assert s.dim == 4


def test_unknown_transform() -> None:
    with pytest.raises(ConfigError, match="feature_transform must be one of none, sqrt, x\\+sqrt "
                                          "or x\\+sqrt\\+rbf:<kernel-map fingerprint>; got 'log'"):
        apply_feature_transform(np.zeros((1, 1)), "log")
