"""Public random projection: bit-identical rebuild, z-space statistics, metadata checks."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from ghofl.errors import ConfigError, IncompatibleStatsError, InputError
from ghofl.heads import make_head
from ghofl.stats import ProjectionSpec, StatsAccumulator, compute_stats
from tests.helpers import gaussian_mixture

_HASH_SNIPPET = (
    "import hashlib; from ghofl.stats import ProjectionSpec; "
    "print(hashlib.sha256(ProjectionSpec(7, 50, 12).matrix().tobytes()).hexdigest())"
)


def test_matrix_identical_across_processes() -> None:
    here = hashlib.sha256(ProjectionSpec(7, 50, 12).matrix().tobytes()).hexdigest()
    out = subprocess.run(
        [sys.executable, "-c", _HASH_SNIPPET], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == here


def test_matrix_is_documented_rademacher() -> None:
    spec = ProjectionSpec(3, 10, 16)
    r = spec.matrix()
    assert set(np.unique(r)) == {-0.25, 0.25}
    raw = np.random.PCG64(3).random_raw(3)
    first_bit = int(raw[0]) & 1
    assert r[0, 0] == (-0.25 if first_bit else 0.25)
    bit_17 = (int(raw[0]) >> 17) & 1  # entry 17 in row-major order = row 1, column 1
    assert r[1, 1] == (-0.25 if bit_17 else 0.25)
    assert not np.array_equal(r, ProjectionSpec(4, 10, 16).matrix())


def test_norms_preserved_in_expectation() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 256))
    z = ProjectionSpec(1, 256, 128).apply(x)
    ratio = np.linalg.norm(z, axis=1) ** 2 / np.linalg.norm(x, axis=1) ** 2
    assert abs(ratio.mean() - 1.0) < 0.05


@pytest.mark.parametrize("mode", ["full", "pooled", "gram", "diag"])
def test_stats_in_z_space_equal_stats_of_projected_data(mode: str) -> None:
    x, y = gaussian_mixture(4, num_classes=3, dim=20, n=300)
    spec = ProjectionSpec(11, 20, 6)
    s_proj = compute_stats(x, y, 3, mode=mode, projection=spec)  # type: ignore[arg-type]
    s_manual = compute_stats(x @ spec.matrix(), y, 3, mode=mode)  # type: ignore[arg-type]
    assert s_proj.dim == 6 and s_proj.meta.projection == spec
    for name, arr in s_manual.arrays().items():
        other = s_proj.arrays()[name]
        if arr is not None:
            np.testing.assert_allclose(other, arr, rtol=1e-12, atol=1e-12)


def test_heads_fitted_on_projected_stats_take_raw_embeddings() -> None:
    x, y = gaussian_mixture(5, num_classes=3, dim=20, n=300)
    spec = ProjectionSpec(2, 20, 8)
    head = make_head("qda").fit_from_stats(compute_stats(x, y, 3, projection=spec))
    manual = make_head("qda").fit_from_stats(compute_stats(x @ spec.matrix(), y, 3))
    np.testing.assert_allclose(
        head.predict_proba(x), manual.predict_proba(x @ spec.matrix()), atol=1e-12
    )


def test_projection_mismatch_is_refused_on_merge() -> None:
    x, y = gaussian_mixture(6, num_classes=2, dim=10, n=50)
    a = compute_stats(x, y, 2, projection=ProjectionSpec(1, 10, 4))
    b = compute_stats(x, y, 2, projection=ProjectionSpec(2, 10, 4))
    with pytest.raises(IncompatibleStatsError, match=r"projection \(ProjectionSpec\(seed=1"):
        _ = a + b


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 10, 4), "projection seed must be a non-negative integer; got -1"),
        ((0, 0, 4), r"projection dims must be >= 1; got input_dim=0, dim=4"),
    ],
)
def test_spec_validation(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ProjectionSpec(*args)


def test_accumulator_checks_projection_input_dim() -> None:
    with pytest.raises(
        InputError, match="projection expects input dim 10 but the embeddings have dim 12"
    ):
        StatsAccumulator(2, dim=12, projection=ProjectionSpec(0, 10, 4))
