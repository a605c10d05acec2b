"""The ServerApp's run-config checks for the upload options and the preset: refused before any
node is asked for anything (``run_federation`` never touches the grid)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.errors import ConfigError
from ghofl.integrations.flower.server_app import run_federation


class _NoGrid:
    """A grid that fails the test when used: the checks must come first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the grid was used ({name}) before the run config was checked")


def _cfg(**extra: Any) -> dict[str, Any]:
    return {"protocol": "plain", "classes": json.dumps(["a", "b"]), "heads": "nb,lda",
            "clip_norm": 1.0, "dim": 3, **extra}


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"protocol": "secure", "transport_dtype": "float32"},
         r"run config: transport_dtype 'float32' applies to plain uploads; secure aggregation "
         r"sends its own fixed-point encoding of the float64 sums, so set transport_dtype = "
         r"\"float64\" or protocol = \"plain\""),
        ({"holdout_fraction": 0.2, "dp_epsilon": 1.0},
         r"run config: differential privacy does not support a held-out section .*; set "
         r"holdout_fraction = 0\.0 or dp_epsilon = 0\.0"),
        ({"dp_epsilon": 1.0, "dp_mode": "distributed"},
         r"run config: dp_mode = \"distributed\" adds each client's noise share before secure "
         r"aggregation, so it needs protocol = \"secure\"; add it, or use dp_mode = "
         r"\"central\""),
        ({"dp_delta": 1e-6}, r"^run config: dp_delta needs dp_epsilon; give the privacy budget "
                             r"epsilon$"),
        ({"dp_epsilon": 1.0, "dp_mode": "local"},
         r"^run config: dp_mode must be one of central, distributed; got 'local'$"),
        ({"dp-epsilon": 1.0}, r"^run config key 'dp-epsilon' is now 'dp_epsilon'; rename it$"),
        ({"min-class-count": 3}, r"^run config key 'min-class-count' is now 'min_class_count'"),
        ({"protocol": "secure", "clip_norm": 0.0},
         r"run config: protocol = \"secure\" needs clip_norm: the fixed-point encoding of the "
         r"secure sum needs a per-sample clipping bound"),
        ({"protocol": "secure", "store": "s.db"},
         r"run config: store records each client's contribution, which the secure protocol "
         r"never shows the server; set store = \"\" or protocol = \"plain\""),
        ({"protocol": "tls"}, r"run config: protocol must be 'secure' or 'plain'; got 'tls'"),
        ({"preset": "fast"}, r"unknown preset 'fast'; available presets: default, paper"),
        ({"preset": 2}, r"^run config key 'preset' must be a string; got 2$"),
        ({"holdout_fraction": 0.9},
         r"run config: holdout_fraction: the held-out fraction must be 0 .*got 0\.9"),
        ({"transport_dtype": "float16"},
         r"run config: transport_dtype must be one of float64, float32; got 'float16'"),
    ],
)
def test_bad_run_config_is_refused_first(extra: dict[str, Any], match: str,
                                         tmp_path: Path) -> None:
    if "dp_epsilon" in extra:
        pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    state: dict[str, Any] = {}
    with pytest.raises(ConfigError, match=match):
        run_federation(_NoGrid(), _cfg(**extra), tmp_path, state)
    assert list(tmp_path.iterdir()) == []


def test_the_allowed_combinations_pass_the_checks(tmp_path: Path) -> None:
    """Held-out sections with either protocol, float32 with the plain one and central DP reach
    the grid."""
    pytest.importorskip("dp_accounting", reason="the privacy extra is not installed")
    for extra in ({"holdout_fraction": 0.2, "protocol": "secure"},
                  {"holdout_fraction": 0.2, "transport_dtype": "float32", "preset": "paper"},
                  {"dp_epsilon": 2.0, "dp_delta": 1e-6, "dp_split": "equal"}):
        with pytest.raises(AssertionError, match=r"the grid was used \(get_node_ids\)"):
            run_federation(_NoGrid(), _cfg(**extra), tmp_path, {})
