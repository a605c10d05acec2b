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
    assert roots <= {"__future__", "flwr", "json", "os", "random", "time", "pathlib"}, roots


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


def test_stage_ratios_against_the_same_bytes_floor(bench: ModuleType) -> None:
    """Each deployment run (the warm-cache ones too) against both floors, stage by stage; the
    plain stage against the same-bytes floor's ``input`` stage."""
    data = {"floor": {"stage_seconds": {"advertise": 2.0, "share": 4.0, "mask": 5.0,
                                        "unmask": 10.0}},
            "floor_bytes": {"stage_seconds": {"advertise": 2.0, "share": 2.0, "mask": 8.0,
                                              "unmask": 5.0, "input": 6.0},
                            "reply_bytes": {"advertise": 300, "share": 2000,
                                            "mask": 13_500_000, "unmask": 900,
                                            "input": 6_700_000}},
            "runs": [{"engine": "deployment", "protocol": "secure",
                      "stage_seconds": {"advertise": 3.0, "share": 4.0, "mask": 10.0,
                                        "unmask": 10.0}},
                     {"engine": bench.WARM, "protocol": "plain",
                      "stage_seconds": {"input": 9.0}}]}
    text = "\n".join(bench.floor_lines(data))
    assert "mask 13.5 MB" in text and "2.00 / 2.00 / 8.00 / 5.00 / 6.00 s." in text
    assert "| secure | 1.50 / 1.00 / 2.00 / 1.00 | 1.25 | 1.50 / 2.00 / 1.25 / 2.00 | 1.75 |" in text
    assert "| plain (warm stats cache) | 2.00 | 2.00 | 1.50 | 1.50 |" in text


def test_sent_bytes_come_from_the_deployment_runs(bench: ModuleType) -> None:
    runs = [{"engine": "simulation", "protocol": "plain",
             "stages": {"input": {"client_sent_bytes_mean": 1.0}}},
            {"engine": "deployment", "protocol": "plain",
             "stages": {"input": {"client_sent_bytes_mean": 6763653.4}}}]
    assert bench.sent_bytes(runs) == {"input": 6763653}


def test_floor_reply_sizes() -> None:
    """The floor ClientApp's reply size per stage, from the run config's ``reply-bytes``."""
    spec = importlib.util.spec_from_file_location("floor_client", APP / "ghofl_floor"
                                                  / "client_app.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.reply_size("", "a,b", "a") == 0
    assert mod.reply_size("5,7", "a,b", "b") == 7
    assert mod.reply_size("5,7", "a,b", "c") == 0
    with pytest.raises(ValueError):
        mod.reply_size("5", "a,b", "a")
