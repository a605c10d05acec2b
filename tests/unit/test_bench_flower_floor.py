"""benchmarks/flower_floor_app and bench_flower.py's floor rows (no Flower run here: the
benchmark itself runs the app on the deployment engine)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "benchmarks" / "flower_floor_app"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_flower", ROOT / "benchmarks"
                                                  / "bench_flower.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("module", ["client_app.py", "server_app.py"])
def test_the_floor_app_imports_flower_only(module: str) -> None:
    """The floor is Flower's own cost: its modules import flwr and the standard library only,
    never ghofl, numpy or scipy."""
    tree = ast.parse((APP / "ghofl_floor" / module).read_text(encoding="utf-8"))
    roots = {alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert roots <= {"__future__", "flwr", "json", "os", "time", "pathlib"}, roots


def test_the_floor_app_declares_its_components() -> None:
    import tomllib

    meta = tomllib.loads((APP / "pyproject.toml").read_text(encoding="utf-8"))
    comps = meta["tool"]["flwr"]["app"]["components"]
    assert comps == {"serverapp": "ghofl_floor.server_app:app",
                     "clientapp": "ghofl_floor.client_app:app"}
    assert meta["tool"]["flwr"]["app"]["config"]["stages"] == "advertise,share,mask,unmask"


def test_stage_ratios_against_the_floor(bench: ModuleType) -> None:
    data = {"floor": {"stage_seconds": {"advertise": 2.0, "share": 4.0, "mask": 5.0,
                                        "unmask": 10.0}},
            "runs": [{"engine": "simulation", "protocol": "secure", "stage_seconds": {}},
                     {"engine": "deployment", "protocol": "secure",
                      "stage_seconds": {"advertise": 3.0, "share": 4.0, "mask": 10.0,
                                        "unmask": 10.0}},
                     {"engine": "deployment", "protocol": "plain",
                      "stage_seconds": {"input": 9.0}}]}
    text = "\n".join(bench.floor_lines(data))
    assert "2.00 / 4.00 / 5.00 / 10.00 s per stage (median 4.50 s)" in text
    assert "| secure | 1.50 / 1.00 / 2.00 / 1.00 | 1.25 |" in text
    assert "| plain | 2.00 | 2.00 |" in text
    assert bench.floor_lines({"runs": [], "floor": None}) == []
