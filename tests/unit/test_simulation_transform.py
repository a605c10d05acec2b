"""The client-side feature transform through the in-process simulation."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.client.transforms import (
    apply_feature_transform,
    recorded_feature_transform,
    transformed_info,
)
from ghofl.errors import ConfigError, InputError
from ghofl.heads import make_head
from ghofl.moments.core import compute_moments
from ghofl.server.job import ServerJob
from ghofl.server.plan import FederationPlan
from ghofl.server.simulation import Population, simulate
from ghofl.stats import compute_stats
from ghofl.stats.meta import EncoderInfo
from ghofl.stats.schema import schema_for
from tests.helpers import numbered


def _nonnegative(seed: int, n: int = 240, d: int = 8, c: int = 3) -> tuple[np.ndarray, ...]:
    """ReLU-like embeddings: class-dependent Gaussians clipped at zero."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % c
    means = rng.normal(0.0, 1.0, (c, d))
    x = np.maximum(means[y] + rng.normal(0.0, 1.0, (n, d)), 0.0)
    return x, y


@pytest.mark.parametrize("transform", ["sqrt", "x+sqrt"])
@pytest.mark.parametrize("mode", ["pooled", "full"])
def test_simulation_equals_heads_on_the_pooled_transformed_data(transform: str, mode: str) -> None:
    x, y = _nonnegative(0)
    xte, yte = _nonnegative(1)
    info = EncoderInfo("toy", x.shape[1])
    job = ClientJob(numbered(3), mode, feature_transform=transform)  # type: ignore[arg-type]
    res = simulate(FederationPlan(job, server=ServerJob(("lda", "ridge"))), (x, y), (xte, yte),
                   Population(4, 0.3, encoder=info))
    xt, xtet = apply_feature_transform(x, transform), apply_feature_transform(xte, transform)
    moments = compute_moments(compute_stats(xt, y, 3, mode))  # type: ignore[arg-type]
    for name in ("lda", "ridge"):
        want = make_head(name).fit_from_moments(moments).score(xtet, yte)
        assert res.heads[name].accuracy == pytest.approx(want, abs=1e-12)
    assert res.feature_transform == transform
    assert res.to_dict()["feature_transform"] == transform
    factor = 2 if transform == "x+sqrt" else 1
    assert res.upload_bytes_per_client == schema_for(mode).nbytes(3, factor * x.shape[1])


def test_unknown_transform_is_refused() -> None:
    x, y = _nonnegative(0)
    with pytest.raises(ConfigError, match="feature_transform must be one of none, sqrt, x"):
        simulate(FederationPlan(ClientJob(numbered(3), feature_transform="cube"),
                                server=ServerJob(("lda",))), (x, y), (x, y), Population(2, 1.0))


@pytest.mark.parametrize(("preprocessing", "want"), [
    ("", "none"), ("x+sqrt", "x+sqrt"), ("resize 224; then sqrt", "sqrt"),
    ("resize 224", "none"), ("resize 224; then x+sqrt", "x+sqrt"),
])
def test_recorded_feature_transform(preprocessing: str, want: str) -> None:
    info = EncoderInfo("toy", 4, preprocessing=preprocessing)
    assert recorded_feature_transform(info) == want
    assert recorded_feature_transform(None) == "none"


def test_raw_embeddings_on_a_transformed_head_name_the_transform() -> None:
    x, y = _nonnegative(0)
    info = transformed_info(EncoderInfo("toy", x.shape[1]), "x+sqrt")
    stats = compute_stats(apply_feature_transform(x, "x+sqrt"), y, 3, "pooled", info)
    head = make_head("lda").fit_from_stats(stats)
    with pytest.raises(InputError, match="applied the feature transform 'x\\+sqrt'"):
        head.predict(x)
    plain = make_head("lda").fit_from_stats(compute_stats(x, y, 3, "pooled"))
    with pytest.raises(InputError, match="use the same encoder as the clients"):
        plain.predict(apply_feature_transform(x, "x+sqrt"))
