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

#: SIGTERM tears fixtures down (and so stops the processes they started) as Ctrl-C does.
pytest_plugins = ["tests.sigterm_plugin"]


@pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
def synthetic_gaussian(request: pytest.FixtureRequest) -> SyntheticSplit:
    """Small seeded draw of the issue-10 Gaussian set (covariance s_c·A Aᵀ)."""
    return gaussian_classes(request.param, dim=16, num_classes=5, n_train=1500, n_test=1500)


@pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
def synthetic_offset(request: pytest.FixtureRequest) -> SyntheticSplit:
    """Small seeded draw of the issue-10 offset set (a random half shifted by N(0, 1.5² I))."""
    return offset_classes(request.param, dim=12, num_classes=5, n_train=1500, n_test=1500)


# ---------------------------------------------------------------- parallel runs (pytest-xdist)
#: Modules that start Flower deployments or simulations: they pick free ports before binding,
#: start Ray and wait on stage timeouts, so under ``pytest -n N --dist loadgroup`` they run on
#: one worker, one at a time, while the other workers take the rest of the suite.
_SERIAL_MODULES = frozenset({
    "test_identity_cli", "test_flower", "test_flower_cli", "test_flower_fedavg",
    "test_flower_tls", "test_flower_attacks",
})


#: Modules whose last test checks a tally kept by the module's other tests (the fuzz suites
#: count their refused cases): each runs whole on one worker, in its own group.
_WHOLE_MODULES = frozenset({"test_fuzz_readers", "test_fuzz_holdout"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        name = getattr(module, "__name__", "").rsplit(".", 1)[-1]
        if name in _SERIAL_MODULES:
            item.add_marker(pytest.mark.xdist_group("processes"))
        elif name in _WHOLE_MODULES:
            item.add_marker(pytest.mark.xdist_group(name))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under ``--dist loadgroup`` every grouped test's node id must carry its group (pytest-xdist
    appends ``@group``); a pytest that stops it would spread a group over workers silently."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
            raise pytest.UsageError(
                f"pytest-xdist did not apply the xdist_group of {item.nodeid}: this pytest and "
                "pytest-xdist do not work together (install the versions pyproject.toml pins)")


# ---------------------------------------------------------------- client state (round ledgers)
@pytest.fixture(autouse=True)
def _isolated_state_dir(tmp_path_factory: pytest.TempPathFactory,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test keeps its clients' default round ledgers in a fresh directory of its own."""
    monkeypatch.setenv("GHOFL_STATE_DIR", str(tmp_path_factory.mktemp("ghofl-state")))
