"""Test-session environment: every test runs offline and without telemetry."""

from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ---------------------------------------------------------------- issue 10: synthetic sets
import pytest

from ghofl.bench.synthetic import SyntheticSplit, gaussian_classes, offset_classes


@pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
def synthetic_gaussian(request: pytest.FixtureRequest) -> SyntheticSplit:
    """Small seeded draw of the issue-10 Gaussian set (covariance s_c·A Aᵀ)."""
    return gaussian_classes(request.param, dim=16, num_classes=5, n_train=1500, n_test=1500)


@pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
def synthetic_offset(request: pytest.FixtureRequest) -> SyntheticSplit:
    """Small seeded draw of the issue-10 offset set (a random half shifted by N(0, 1.5² I))."""
    return offset_classes(request.param, dim=12, num_classes=5, n_train=1500, n_test=1500)
