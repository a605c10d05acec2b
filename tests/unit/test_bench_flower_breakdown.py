"""bench_flower.py's breakdown of the deployment stages (issue 40): per run and per floor, the
server's stage seconds beside the nodes' own timings (medians over the nodes), and what no node
measured; an older results file without timings still renders (no Flower run here)."""

from __future__ import annotations

import copy
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script(ROOT / "benchmarks" / "bench_flower.py",  # type: ignore[return-value]
                       "bench_flower_breakdown")


def _ghofl(start: float, imports: float, work: float) -> dict[str, float]:
    return {"start-s": start, "import-s": imports, "decode-s": 0.01, "work-s": work,
            "encode-s": 0.02, "seconds": imports + work + 0.03}


def _run(engine: str, protocol: str, seconds: dict[str, float],
         timings: dict[str, Any] | None) -> dict[str, Any]:
    stages = {s: {"client_sent_bytes_mean": 1e6, "client_received_bytes_mean": 1e3}
              for s in seconds}
    return {"engine": engine, "protocol": protocol, "wall_s": 10.0, "stage_seconds": seconds,
            "stages": stages, "accuracy": {"nb": 0.5, "lda": 0.6, "fedcgs": 0.7},
            "client_timings": timings}


def _data(bench: ModuleType) -> dict[str, Any]:
    """A results file with timings: a plain deployment run of three nodes and the floor."""
    plain = {"input": {"node-1": _ghofl(1.0, 0.5, 2.0), "node-2": _ghofl(1.2, 0.7, 4.0),
                       "node-3": _ghofl(3.0, 0.6, 3.0)}}
    floor = {s: {"1": {"start-s": 0.9, "seconds": 0.001}, "2": {"start-s": 1.1, "seconds": 0.003},
                 "3": {"seconds": 0.002}}
             for s in ("advertise", "share", "mask", "unmask")}
    return {"machine": "test", "n_train": 3000, "n_test": 1000, "clients": 3, "clip": 1.0,
            "runs": [_run("in process", "plain", {"input": 0.4}, None),
                     _run("deployment", "plain", {"input": 9.0}, plain),
                     _run(bench.WARM, "plain", {"input": 7.0}, None)],
            "floor": {"stage_seconds": {"advertise": 4.0, "share": 3.0, "mask": 3.5,
                                        "unmask": 3.2},
                      "reply_bytes": {}, "client_timings": floor},
            "floor_bytes": None}


def test_the_breakdown_takes_medians_over_the_nodes(bench: ModuleType) -> None:
    data = _data(bench)
    rows = bench.breakdown_rows(data["runs"][1]["stage_seconds"],
                                data["runs"][1]["client_timings"], ["input"])
    # totals per node: 1+0.5+0.01+2+0.02 = 3.53, 5.93, 6.63: median 5.93, slowest 6.63
    assert rows == [["input", "9.00", "1.200", "0.600", "0.010", "3.000", "0.020", "5.930",
                     "6.630", "—", "3.070"]]
    # with the server's own work measured, it leaves the unexplained rest
    rows = bench.breakdown_rows(data["runs"][1]["stage_seconds"],
                                data["runs"][1]["client_timings"], ["input"], {"input": 1.5})
    assert rows[0][-2:] == ["1.500", "1.570"]
    floor = bench.breakdown_rows(data["floor"]["stage_seconds"],
                                 data["floor"]["client_timings"], ["advertise"])
    # the floor: start→handler and its handler as work; a node without its start counts its
    # handler only
    assert floor == [["advertise", "4.00", "1.000", "—", "—", "0.002", "—", "0.901", "1.103",
                      "—", "3.099"]]
    assert bench.breakdown_rows({"input": 1.0}, {}, ["input"]) == []


def test_render_shows_a_breakdown_table_per_run_and_says_which_were_not_measured(
        bench: ModuleType) -> None:
    text = bench.render(_data(bench))
    assert "| stage | server-seen s | process start→handler | imports | decode | work | " \
           "encode | client total | slowest client | server work | unexplained |" in text
    assert "ghofl plain:\n\n| stage |" in text
    assert "| input | 9.00 | 1.200 | 0.600 | 0.010 | 3.000 | 0.020 | 5.930 | 6.630 | — | 3.070 |" \
        in text
    assert f"ghofl plain (warm stats cache): {bench.NOT_MEASURED}." in text
    assert "Flower floor (empty replies):\n\n| stage |" in text
    assert "| unmask | 3.20 | 1.000 | — | — | 0.002 | — |" in text
    assert "ghofl plain / in process" not in text  # in-process runs have no breakdown
    assert "| deployment | plain | 10.0 |" in text  # the existing tables stay


def test_render_copes_with_a_results_file_without_timings(bench: ModuleType) -> None:
    """The results files written before the timings (no ``client_timings`` key at all)."""
    data = _data(bench)
    old = copy.deepcopy(data)
    for run in old["runs"]:
        del run["client_timings"]
    del old["floor"]["client_timings"]
    text = bench.render(old)
    assert text.endswith("Where a deployment stage's time goes (process start, imports, "
                         "decoding, work, encoding; run config `client-timings`): "
                         f"{bench.NOT_MEASURED}.")
    assert "| stage | server-seen s |" not in text
    assert bench.render(data).split("\n\nWhere a deployment")[0] == \
        text.split("\n\nWhere a deployment")[0]  # the tables before it are the same
    no_floor = {**old, "floor": None, "runs": old["runs"][:1]}
    assert "Where a deployment" not in bench.render(no_floor)


def test_the_recorded_results_file_still_renders(bench: ModuleType) -> None:
    import json

    recorded = json.loads((ROOT / "benchmarks" / "results" / "flower.json").read_text())
    data = recorded.get("flower", recorded)
    text = bench.render(data)
    assert "| deployment run | ghofl stage / floor stage | median |" in text
    measured = any(r.get("client_timings") for r in data["runs"])
    assert ("| stage | server-seen s |" in text) == measured
    assert measured or text.endswith(f"{bench.NOT_MEASURED}.")
