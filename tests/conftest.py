"""Shared fixtures. Environment set here keeps every test offline and quiet."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """The real-data folder: $GHOFL_DATA_DIR, else ../shared/data beside the repo, else None."""
    env = os.environ.get("GHOFL_DATA_DIR")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "data"]:
        if cand.is_dir():
            return cand
    return None


@pytest.fixture
def data_dir() -> Path:
    d = shared_data_dir()
    if d is None:
        pytest.skip("real datasets not found: set GHOFL_DATA_DIR to the folder holding cifar10.zip")
    return d
