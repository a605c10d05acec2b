"""ClientStats.from_transport: the public entry always checks finiteness; transport skips it
only for arrays whose packed triangles it checked itself."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

from ghofl.errors import StatsValidationError
from ghofl.stats import ClientStats, compute_stats
from ghofl.stats.transport import stats_from_tensors, stats_tensors
from tests.helpers import gaussian_mixture


def _stats() -> ClientStats:
    x, y = gaussian_mixture(7, num_classes=3, dim=5, n=60)
    return compute_stats(x, y, 3, "full", holdout_fraction=0.3, holdout_seed=1)


def test_the_public_entry_has_no_switch_for_validation() -> None:
    params = inspect.signature(ClientStats.from_transport).parameters
    assert "finite" not in params and "_finite_checked" not in params
    s = _stats()
    with pytest.raises(TypeError, match="finite"):
        ClientStats.from_transport(s.meta, {}, finite=True)  # type: ignore[call-arg]


@pytest.mark.parametrize(("rounding", "unpacked"), [(0.0, False), (0.0, True), (2.0**-24, True)])
@pytest.mark.parametrize("name", ["sums", "class_scatter"])
def test_the_public_entry_refuses_non_finite_arrays(rounding: float, unpacked: bool,
                                                    name: str) -> None:
    s = _stats().fitting_part()  # no held-out section
    arrays: dict[str, Any] = {k: np.array(v) for k, v in s.arrays().items() if v is not None}
    arrays[name][0, 0] = np.inf
    meta = s.meta
    with pytest.raises(StatsValidationError,
                       match=rf"{name} contains NaN or infinite values; the embeddings fed to "
                             r"the client were not finite, or the payload is corrupt"):
        ClientStats.from_transport(meta, arrays, rounding=rounding, unpacked=unpacked)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_transport_still_refuses_a_non_finite_packed_triangle(dtype: str) -> None:
    s = _stats()
    t = stats_tensors(s, dtype)
    ok = stats_from_tensors(s.meta, t, transport_dtype=dtype)
    assert ok.allclose(s, rtol=1e-6)
    name = "class_scatter_triu"  # the packed upper triangles of S_c
    assert name in t
    t[name] = np.array(t[name])
    t[name].reshape(-1)[1] = np.nan
    with pytest.raises(StatsValidationError, match="class_scatter contains NaN or infinite"):
        stats_from_tensors(s.meta, t, transport_dtype=dtype)
