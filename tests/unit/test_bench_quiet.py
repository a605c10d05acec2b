"""A timing benchmark refuses a busy machine unless told to, and records the load beside its
timings (issue 40)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from ghofl.bench import harness, quiet
from ghofl.bench.harness import ALLOW_BUSY_FLAG, Benchmark, BenchmarkError, Section, check_quiet
from ghofl.bench.quiet import MachineLoad, machine_load, other_processes_cores

QUIET = MachineLoad((0.4, 0.5, 0.6), 2, 0.05)


def test_a_quiet_machine_has_no_reasons_and_is_returned() -> None:
    assert QUIET.busy_reasons() == []
    assert check_quiet(False, QUIET) is QUIET


def test_a_load_average_above_one_and_a_half_per_core_is_refused_naming_it_and_the_flag() -> None:
    busy = MachineLoad((3.2, 2.0, 1.0), 2, 0.1)
    with pytest.raises(BenchmarkError, match=(
        r"^The machine is busy \(1-minute load average 3\.20 on 2 cores, above 1\.5 per core\): "
        r"timings measured now would not be worth writing down; run again when it is quiet, or "
        r"pass --allow-busy to measure anyway \(the load is recorded beside the timings\)\.$")):
        check_quiet(False, busy)
    assert MachineLoad((3.0, 2.0, 1.0), 2, 0.1).busy_reasons() == []  # 1.5 per core: not above


def test_other_processes_over_half_a_core_are_refused_naming_both_signs() -> None:
    busy = MachineLoad((5.0, 1.0, 1.0), 2, 0.75)
    with pytest.raises(BenchmarkError, match=(
        r"busy \(1-minute load average 5\.00 on 2 cores, above 1\.5 per core; other processes "
        r"use 0\.75 cores, above 0\.5\)")):
        check_quiet(False, busy)
    assert check_quiet(True, busy) is busy
    assert MachineLoad((0.1, 0.1, 0.1), 2, None).busy_reasons() == []  # not measurable


def test_machine_load_reads_the_load_average_and_the_sampler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (1.25, 1.0, 0.75))
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(quiet, "other_processes_cores", lambda s: 0.3)
    got = machine_load()
    assert got == MachineLoad((1.25, 1.0, 0.75), 4, 0.3)
    assert got.to_dict() == {"load_average": [1.25, 1.0, 0.75], "cores": 4, "other_cores": 0.3}


def _proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stats: list[str],
          own: list[str]) -> None:
    """/proc/stat and /proc/self/stat that change from their first to second reading."""
    stat, self_stat = tmp_path / "stat", tmp_path / "self_stat"
    stat.write_text(stats[0])
    self_stat.write_text(own[0])
    monkeypatch.setattr(quiet, "_PROC_STAT", stat)
    monkeypatch.setattr(quiet, "_PROC_SELF", self_stat)

    def sleep(seconds: float) -> None:
        stat.write_text(stats[1])
        self_stat.write_text(own[1])

    monkeypatch.setattr(time, "sleep", sleep)


def _self_stat(utime: int, stime: int) -> str:
    return f"123 (python (x) 3) S 1 2 3 4 5 6 7 8 9 10 {utime} {stime} 0 0 20 0\n"


def test_other_processes_cores_is_the_busy_time_less_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 2 cores, 100 ticks each over the window: 80 busy ticks (user 50, system 30) of 200,
    # 20 of them ours (utime 15 + stime 5): the others use 60 / 200 of 2 cores = 0.6.
    stats = ["cpu  100 0 50 1000 10 0 0 0 0 0\ncpu0 1 2 3\n",
             "cpu  150 0 80 1110 20 0 0 0 0 0\ncpu0 1 2 3\n"]
    _proc(tmp_path, monkeypatch, stats, [_self_stat(10, 4), _self_stat(25, 9)])
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert other_processes_cores(0.5) == pytest.approx(0.6)


def test_other_processes_cores_is_none_without_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(quiet, "_PROC_STAT", tmp_path / "missing")
    assert other_processes_cores(0.0) is None


def _toy(tmp_path: Path, timings: bool, calls: list[Any]) -> Benchmark:
    script = tmp_path / "benchmarks" / "bench_toy.py"
    script.parent.mkdir(parents=True, exist_ok=True)

    def measure(ctx: harness.Context) -> dict[str, Any]:
        calls.append(os.environ.get("GHOFL_BENCH_QUIET_CHECKED"))
        return {"toy": {"seconds": 1.5}}

    def render(r: dict[str, Any]) -> str:
        return f"## Toy\n\n{r['seconds']} s. {harness.load_sentence(r)}"

    return Benchmark(script=str(script), description="toy", measure=measure, timings=timings,
                     sections=(Section("toy", "toy.json", render),))


def test_main_refuses_a_busy_machine_in_one_line_and_measures_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "machine_load", lambda: MachineLoad((4.0, 1, 1), 2, 0.0))
    calls: list[Any] = []
    out = tmp_path / "B.md"
    with pytest.raises(SystemExit, match=r"^The machine is busy \(1-minute load average 4\.00 "
                       r"on 2 cores, above 1\.5 per core\).*pass --allow-busy to measure "
                       r"anyway") as exc:
        harness.main(_toy(tmp_path, True, calls), ["--out", str(out)])
    assert "\n" not in str(exc.value)
    assert calls == [] and not out.exists()


def test_main_with_the_flag_records_the_load_beside_the_timings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "machine_load", lambda: MachineLoad((4.0, 1, 1), 2, 0.25))
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 1.0, 1.0))
    calls: list[Any] = []
    out = tmp_path / "B.md"
    harness.main(_toy(tmp_path, True, calls), ["--out", str(out), ALLOW_BUSY_FLAG])
    assert calls == ["1"]  # the processes the measurement starts do not check again
    assert "GHOFL_BENCH_QUIET_CHECKED" not in os.environ
    saved = json.loads((tmp_path / "benchmarks" / "results" / "toy.json").read_text())
    assert saved["machine_load"] == {
        "start": {"load_average": [4.0, 1, 1], "cores": 2, "other_cores": 0.25},
        "end": {"load_average": [3.5, 1.0, 1.0], "cores": 2, "other_cores": None},
        "forced": True}
    assert ("1.5 s. 1-minute load average 4.00 at the start (2 cores; other processes 0.25 "
            "cores, measured on a busy machine), 3.50 at the end.") in out.read_text()


def test_a_quiet_run_is_not_marked_forced_and_a_worker_does_not_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(harness, "machine_load", lambda: QUIET)
    calls: list[Any] = []
    harness.main(_toy(tmp_path, True, calls), ["--out", str(tmp_path / "B.md")])
    saved = json.loads((tmp_path / "benchmarks" / "results" / "toy.json").read_text())
    assert saved["machine_load"]["forced"] is False

    def busy() -> MachineLoad:
        raise AssertionError("a worker of a checked benchmark must not check")

    monkeypatch.setattr(harness, "machine_load", busy)
    monkeypatch.setenv("GHOFL_BENCH_QUIET_CHECKED", "1")
    harness.main(_toy(tmp_path, True, calls), ["--no-write"])
    assert len(calls) == 2


def test_only_timing_benchmarks_take_the_flag_and_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def busy() -> MachineLoad:
        raise AssertionError("a benchmark without timings must not check")

    monkeypatch.setattr(harness, "machine_load", busy)
    calls: list[Any] = []
    bench = _toy(tmp_path, False, calls)
    with pytest.raises(SystemExit):
        bench.parser().parse_args([ALLOW_BUSY_FLAG])
    harness.main(bench, ["--no-write"])
    assert calls == [None]
    assert "--allow-busy" in _toy(tmp_path, True, calls).parser().format_help()


def test_load_sentence_of_results_saved_without_the_load_is_empty() -> None:
    assert harness.load_sentence({"rows": []}) == ""


@pytest.mark.parametrize("name", ["bench_client_stats.py", "bench_core.py", "bench_qda_floor.py",
                                  "bench_validation.py", "bench_secure_cost.py"])
def test_the_timing_scripts_declare_timings(name: str) -> None:
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / name).read_text()
    assert "timings=True" in text
