"""Upload mode ``means`` (class counts and sums only) end to end: every protocol and privacy
setting carries it, the ``ncm`` head fits from it as from the richer modes, the heads that need
second moments refuse it with the fix."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.client.job import ClientJob
from ghofl.errors import UnsupportedModeError
from ghofl.heads import make_head
from ghofl.moments import compute_moments
from ghofl.server.job import ServerJob
from ghofl.server.plan import FederationPlan
from ghofl.server.simulation import Population, simulate
from ghofl.stats import compute_stats, schema_for
from tests.helpers import gaussian_mixture, numbered, protocol_setting


def test_means_payload_is_counts_and_sums_only() -> None:
    x, y = gaussian_mixture(1, num_classes=4, dim=7, n=300)
    s = compute_stats(x, y, 4, mode="means")
    assert s.sq_sums is None and s.class_scatter is None and s.scatter is None
    assert schema_for("means").nbytes(4, 7) == 8 * (4 + 4 * 7)
    full = compute_stats(x, y, 4, mode="full")
    assert full.to_mode("means").allclose(s, rtol=1e-12)
    with pytest.raises(UnsupportedModeError, match="mode 'means' statistics"):
        _ = s.diag_sums
    with pytest.raises(UnsupportedModeError, match="per-class variances need per-class second moments"):
        _ = compute_moments(s).class_vars


@pytest.mark.parametrize("setting", ["plain", "secure", "central-dp", "distributed-dp"])
def test_every_protocol_carries_the_means_mode(setting: str) -> None:
    x, y = gaussian_mixture(3, num_classes=3, dim=6, n=900, sep=3.0)
    clip, agg = protocol_setting(setting)
    plan = FederationPlan(ClientJob(numbered(3), "means", clip_norm=clip), agg,
                          ServerJob(("ncm",), seed=0))
    res = simulate(plan, (x, y), (x, y), Population(5, 0.5))
    assert res.mode == "means"
    acc = res.heads["ncm"].accuracy
    ref = float(np.mean(make_head("ncm").fit(x, y).predict(x) == y))
    tol = 0.0 if setting in ("plain", "secure") else 0.05  # DP noise moves the means a little
    assert abs(acc - ref) <= tol + 1e-12


@pytest.mark.parametrize("head", ["nb", "lda", "ridge", "fed3r", "fedcof"])
def test_heads_needing_second_moments_refuse_means(head: str) -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=200)
    with pytest.raises(UnsupportedModeError, match=rf"head '{head}' needs upload mode"):
        make_head(head).fit_from_stats(compute_stats(x, y, 3, mode="means"))
