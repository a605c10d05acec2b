"""The benchmark harness: every script's sections re-render from the committed results."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from ghofl.bench.harness import (
    Benchmark,
    BenchmarkError,
    balanced_orders,
    find_data_dir,
    in_order,
    median_times,
    render_sections,
    run_rows,
    saved_order,
    settle_sentence,
    stated_machine,
)
from ghofl.bench.report import read_section, replace_section
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
#: Scripts ported onto the harness so far (the others keep their own entry points).
SCRIPTS = ("bench_ablation_cifar10.py", "bench_accuracy_bytes.py", "bench_c1000.py",
           "bench_cifar10c.py", "bench_client_stats.py", "bench_clip_norms.py", "bench_core.py",
           "bench_defaults.py", "bench_defaults_cv.py", "bench_demo.py", "bench_dp.py",
           "bench_dp_anchors.py", "bench_dp_synthetic.py",
           "bench_encoders.py", "bench_experiments.py", "bench_fedavg.py", "bench_flower.py",
           "bench_ood.py", "bench_paper.py", "bench_payload_bytes.py", "bench_peers.py", "bench_personalize.py", "bench_predict.py", "bench_qda_floor.py",
           "bench_secure.py",
           "bench_secure_cost.py", "bench_secure_graph.py", "bench_secure_regions.py",
           "bench_tiny_imagenet.py", "bench_tiny_levers.py", "bench_trainable_heads.py", "bench_trainable_vs_base.py",
           "bench_validation.py")
#: Ported scripts whose committed section is not what their committed results render to;
#: each moves to SCRIPTS once its section is rewritten (the strict xfail then reports it).
STALE: dict[str, str] = {
}


def _script(name: str) -> ModuleType:
    return load_script(BENCH / name, f"_harness_{name[:-3]}")  # type: ignore[return-value]


@pytest.mark.parametrize("name", [
    *SCRIPTS,
    *(pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=r)) for n, r in STALE.items()),
])
def test_section_renders_from_committed_results(name: str, tmp_path: Path) -> None:
    bench = _script(name).BENCH
    assert isinstance(bench, Benchmark)
    out = tmp_path / "BENCHMARKS.md"
    shutil.copyfile(ROOT / "BENCHMARKS.md", out)
    bodies = render_sections(bench, out, side_products=False)
    assert set(bodies) == {s.marker for s in bench.sections}
    assert out.read_text() == (ROOT / "BENCHMARKS.md").read_text()


def test_replace_section_keeps_other_sections_and_places_first() -> None:
    text = replace_section(None, "a", "one")
    text = replace_section(text, "b", "two")
    text = replace_section(text, "a", "three\n")
    assert read_section(text, "a") == "three" and read_section(text, "b") == "two"
    text = replace_section(text, "s", "summary", first=True)
    assert text.index("summary") < text.index("three") < text.index("two")
    assert read_section(text, "missing") is None


def test_median_times_side_by_side_order_and_medians() -> None:
    calls: list[str] = []
    times = median_times({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] * 3
    assert set(times) == {"a", "b"} and len(times["a"][1]) == 3
    assert times["a"][0] == sorted(times["a"][1])[1]


def test_median_times_settles_before_every_timed_call(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[object] = []
    monkeypatch.setattr("ghofl.bench.harness.time.sleep", events.append)
    times = median_times({"a": lambda: events.append("a"), "b": lambda: events.append("b")}, 2,
                         warmup=True, settle=0.25)
    # the warm-up calls are not timed, so nothing waits before them
    assert events == ["a", "b"] + [0.25, "a", 0.25, "b"] * 2
    assert len(times["a"][1]) == 2


def test_median_times_rotates_the_order_when_asked() -> None:
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abc"}
    times = median_times(fns, 4, order="rotate")
    assert calls == list("abc" "bca" "cab" "abc")
    assert list(times) == ["a", "b", "c"] and all(len(v[1]) == 4 for v in times.values())


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7])
def test_balanced_orders_put_every_step_after_every_other_equally_often(k: int) -> None:
    rows = balanced_orders(k)
    assert len(rows) == (k if k % 2 == 0 or k == 1 else 2 * k)
    assert all(sorted(row) == list(range(k)) for row in rows)
    pairs = Counter((row[i], row[i + 1]) for row in rows for i in range(k - 1))
    assert set(pairs) == {(a, b) for a in range(k) for b in range(k) if a != b}
    assert len(set(pairs.values())) <= 1  # every ordered pair equally often
    assert len(set(Counter(row[0] for row in rows).values())) == 1  # every step opens alike


def test_median_times_balanced_calls_the_design_rows_in_turn() -> None:
    calls: list[str] = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abcd"}
    times = median_times(fns, 5, order="balanced")
    rows = balanced_orders(4)
    want = [("abcd")[i] for r in range(5) for i in rows[r % 4]]
    assert calls == want and all(len(v[1]) == 5 for v in times.values())
    with pytest.raises(BenchmarkError, match=r"median_times has no order 'shuffled'; use one of "
                       r"fixed, rotate, balanced\."):
        median_times(fns, 1, order="shuffled")


def test_settle_sentence_states_the_spacing_and_the_order() -> None:
    assert settle_sentence(None, order="rotate") == ""
    assert settle_sentence(0.3) == (", each step timed 0.3 s after the one before (once the "
                                    "BLAS threads the step before woke have parked)")
    assert settle_sentence(0.25, order="rotate").endswith(
        "0.25 s after the one before (once the BLAS threads the step before woke have "
        "parked), the order of the steps rotated from one repeat to the next")
    assert settle_sentence(0.3, order="balanced").endswith(
        "the steps in the orders of a Williams design (every step right after every other "
        "equally often)")
    assert saved_order({"rotated": True}) == "rotate" and saved_order({}) == "fixed"
    assert saved_order({"order": "balanced", "rotated": True}) == "balanced"


def test_median_times_rejects_zero_repeats() -> None:
    with pytest.raises(BenchmarkError, match=r"median_times needs repeats >= 1; got 0\."):
        median_times({"a": lambda: None}, 0)


def test_run_rows_keeps_done_rows_and_saves_each() -> None:
    saved: list[dict[str, object]] = []
    out = run_rows([1, 2, 3], key=str, run_row=lambda r: None if r == 3 else r * 10,
                   done={"1": "old"}, save=lambda d: saved.append(dict(d)))
    assert out == {"1": "old", "2": 20} and saved == [{"1": "old", "2": 20}]


def test_find_data_dir_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GHOFL_DATA_DIR", str(tmp_path / "nope"))
    with pytest.raises(BenchmarkError, match=r"GHOFL_DATA_DIR is .*which is not a folder"):
        find_data_dir(tmp_path / "repo")
    monkeypatch.delenv("GHOFL_DATA_DIR")
    with pytest.raises(BenchmarkError, match=r"No data folder: GHOFL_DATA_DIR is not set"):
        find_data_dir(tmp_path / "repo")
    assert find_data_dir(tmp_path / "repo", required=False) is None
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert find_data_dir(tmp_path / "repo") == tmp_path / "shared" / "data"


def test_stated_machine_prefers_results_then_section_text() -> None:
    text = "Machine: 2 CPU cores, Python 3.11.7 (x, 2 threads). Measured 2026-01-02; more."
    assert stated_machine({}, text) == {"machine": "2 CPU cores, Python 3.11.7 (x, 2 threads)",
                                        "date": "2026-01-02"}
    assert stated_machine({"machine": "m", "date": "d"}, text) == {"machine": "m", "date": "d"}


def test_in_order_restores_the_measured_order_then_the_rest() -> None:
    saved = {"a": 1, "b": 2, "c": 3, "d": 4}  # as read back: keys sorted
    assert list(in_order(saved, ["c", "a", "x", "c"])) == ["c", "a", "b", "d"]
    assert in_order(saved, ["c", "a"]) == saved
    assert list(in_order(saved, [])) == ["a", "b", "c", "d"]


def test_every_benchmark_script_is_reachable_from_make_bench() -> None:
    """``make bench`` (or the ``bench-secure`` target it calls) runs every benchmarks/bench_*.py."""
    makefile = (ROOT / "Makefile").read_text()
    body = makefile.split("\nbench:", 1)[1].split("\nclean:", 1)[0]
    missing = sorted(p.name for p in BENCH.glob("bench_*.py") if f"benchmarks/{p.name}" not in body)
    assert not missing, f"not run by make bench: {missing}; add them to the Makefile's bench target"
    assert set(SCRIPTS) | set(STALE) == {p.name for p in BENCH.glob("bench_*.py")}
