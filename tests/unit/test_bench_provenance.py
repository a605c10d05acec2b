"""Benchmark sections name the commit they measured (ghofl.bench.provenance and the harness)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ghofl.bench import harness
from ghofl.bench.harness import Benchmark, Section
from ghofl.bench.provenance import (
    changed_since,
    code_sentence,
    code_version,
    loaded_sources,
    recorded_versions,
    section_age,
    source_blobs,
)
from tests.helpers import load_script

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A repository with one committed source file and one committed results file."""
    root = tmp_path / "repo"
    for rel in ("src/m.py", "benchmarks/results/r.json", "notes.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("0\n")
    _git(root.parent, "init", "-q", str(root))
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root


def test_code_version_counts_changed_sources_but_not_results(repo: Path) -> None:
    head = _git(repo, "rev-parse", "--short=12", "HEAD")
    assert code_version(repo) == {"commit": head, "changed_files": 0}
    (repo / "benchmarks" / "results" / "r.json").write_text("1\n")  # results: not source
    (repo / "notes.txt").write_text("1\n")  # outside src/ and benchmarks/
    (repo / "benchmarks" / "results" / "new.json").write_text("1\n")
    assert code_version(repo) == {"commit": head, "changed_files": 0}
    (repo / "src" / "m.py").write_text("1\n")
    assert code_version(repo) == {"commit": head, "changed_files": 1}
    (repo / "benchmarks" / "bench_new.py").write_text("new\n")  # a new script counts too
    assert code_version(repo) == {"commit": head, "changed_files": 2}


def test_code_version_outside_a_checkout_is_none(tmp_path: Path) -> None:
    assert code_version(tmp_path) is None


def test_the_sentence_names_one_commit_or_each_commit_of_the_parts() -> None:
    one = {"commit": "abc123abc123", "changed_files": 0}
    dirty = {"commit": "abc123abc123", "changed_files": 2}
    assert code_sentence({"rows": [], "code": one}) == (
        "Latest run measured commit `abc123abc123`.")
    assert code_sentence({"code": dirty}) == (
        "Latest run measured commit `abc123abc123` with 2 changed source files, committed "
        "with these results.")
    parts = {"parts": {"c.json": {"code": {"commit": "def456def456", "changed_files": 1}},
                       "a.json": {"code": one}, "b.json": {"code": one},
                       "d.json": {"rows": []}, "e.json": {"code": {"changed_files": 0}}}}
    # in part-name order whatever the order they were added in; a record without a commit
    # counts as none
    assert code_sentence(parts) == (
        "Code measured: commit `abc123abc123` (2 parts); commit `def456def456` with 1 changed "
        "source file, committed with these results (1 part); 2 parts name no commit.")
    assert len(recorded_versions(parts)) == 3
    assert code_sentence({"rows": []}) == "" and code_sentence([1, 2]) == ""
    assert code_sentence({"parts": {"a.json": {"rows": []}}}) == ""


def _import(path: Path, name: str) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


@pytest.fixture(autouse=True)
def _forget_toys() -> Iterator[None]:
    yield
    for name in [n for n in sys.modules if n.startswith("_toy_")]:
        del sys.modules[name]


def _bench(root: Path, in_parts: bool) -> Benchmark:
    script = root / "benchmarks" / "bench_toy.py"

    def measure(ctx: harness.Context) -> dict[str, Any]:
        _import(root / "src" / "m.py", "_toy_m")  # the code it ran
        if in_parts:
            return {"toy": {"parts": {"p.json": {"x": 1, "code": ctx.code_version()}}}}
        return {"toy": {"x": 1}}

    def load(path: Path) -> dict[str, Any]:
        raise AssertionError("measured results render without reading the parts back")

    return Benchmark(script=str(script), description="toy", measure=measure,
                     sections=(Section("toy", "toy" if in_parts else "toy.json",
                                       lambda r: "## Toy", load=load if in_parts else None),))


@pytest.mark.parametrize("in_parts", [False, True])
def test_a_measured_section_names_its_commit(repo: Path, in_parts: bool) -> None:
    (repo / "src" / "m.py").write_text("X = 2\n")
    out = repo / "B.md"
    harness.main(_bench(repo, in_parts), ["--out", str(out)])
    head = _git(repo, "rev-parse", "--short=12", "HEAD")
    said = "Code measured:" if in_parts else "Latest run measured"
    assert (f"## Toy\n\n{said} commit `{head}` with 1 changed source file, committed "
            "with these results") in out.read_text()
    if not in_parts:  # a one-file section saves the record with its results
        saved = json.loads((repo / "benchmarks" / "results" / "toy.json").read_text())
        assert saved["code"] == {"commit": head, "changed_files": 1, "sources": {
            "src/m.py": _git(repo, "hash-object", "src/m.py")}}


def test_the_record_is_the_commit_when_the_run_started(repo: Path) -> None:
    """A commit made while a benchmark runs is not what it measured."""
    def measure(ctx: harness.Context) -> dict[str, Any]:
        (repo / "src" / "m.py").write_text("during\n")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
        return {"toy": {"x": 1, "part": ctx.code_version()}}

    start = _git(repo, "rev-parse", "--short=12", "HEAD")
    bench = Benchmark(script=str(repo / "benchmarks" / "bench_toy.py"), description="toy",
                      measure=measure, sections=(Section("toy", "toy.json", lambda r: "## T"),))
    harness.main(bench, ["--out", str(repo / "B.md")])
    saved = json.loads((repo / "benchmarks" / "results" / "toy.json").read_text())
    # nothing of src/ imported: the code run is unknown, so no sources are listed
    assert saved["code"] == saved["part"] == {"commit": start, "changed_files": 0,
                                              "sources": None}


def test_loaded_sources_are_the_repository_files_imported(repo: Path) -> None:
    assert loaded_sources(repo) is None  # no file of src/: the code run is unknown
    (repo / "benchmarks" / "b.py").write_text("X = 1\n")
    _import(repo / "benchmarks" / "b.py", "_toy_b")
    assert loaded_sources(repo) is None
    _import(repo / "src" / "m.py", "_toy_m")
    assert loaded_sources(repo) == ["benchmarks/b.py", "src/m.py"]
    blobs = source_blobs(repo, ["src/m.py", "benchmarks/b.py"])
    assert blobs == {"src/m.py": _git(repo, "rev-parse", "HEAD:src/m.py"),
                     "benchmarks/b.py": _git(repo, "hash-object", "benchmarks/b.py")}
    assert source_blobs(repo, []) == {}


def _commit_all(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
    return _git(repo, "rev-parse", "--short=12", "HEAD")


def test_a_section_is_stale_when_the_code_it_ran_changed(repo: Path) -> None:
    (repo / "src" / "other.py").write_text("0\n")
    (repo / "benchmarks" / "bench_t.py").write_text("0\n")
    first = _commit_all(repo, "two")
    sources = source_blobs(repo, ["src/m.py", "benchmarks/bench_t.py"])
    ran = {"code": {"commit": first, "changed_files": 0, "sources": sources}}
    age = section_age("t", "benchmarks/bench_t.py", ran, repo)
    assert (age.commits, age.changed, age.whole_library, age.stale) == (
        (first,), (), False, False)
    (repo / "src" / "other.py").write_text("1\n")  # code the run did not import
    _commit_all(repo, "three")
    assert not section_age("t", "benchmarks/bench_t.py", ran, repo).stale
    # a record without sources counts the whole library
    whole = section_age("t", "benchmarks/bench_t.py", {"code": {"commit": first}}, repo)
    assert whole.whole_library and whole.changed == ("src/other.py",) and whole.stale
    (repo / "benchmarks" / "bench_t.py").write_text("1\n")  # the script itself
    (repo / "src" / "m.py").write_text("1\n")
    _commit_all(repo, "four")
    assert section_age("t", "benchmarks/bench_t.py", ran, repo).changed == (
        "benchmarks/bench_t.py", "src/m.py")
    assert changed_since(repo, first, ["src/m.py"]) == ("src/m.py",)


def test_uncommitted_code_measured_then_committed_is_up_to_date(repo: Path) -> None:
    """The blobs are the files as measured: a change measured before its commit counts."""
    (repo / "src" / "m.py").write_text("measured\n")
    before = _git(repo, "rev-parse", "--short=12", "HEAD")
    ran = {"code": {"commit": before, "changed_files": 1,
                    "sources": source_blobs(repo, ["src/m.py"])}}
    _commit_all(repo, "the change with its results")
    assert not section_age("t", "benchmarks/b.py", ran, repo).stale
    (repo / "src" / "m.py").write_text("0\n")  # the measured change taken back
    _commit_all(repo, "reverted")
    assert section_age("t", "benchmarks/b.py", ran, repo).changed == ("src/m.py",)


def test_recording_files_change_no_measurement(repo: Path) -> None:
    path = repo / "src" / "ghofl" / "bench" / "report.py"
    path.parent.mkdir(parents=True)
    path.write_text("0\n")
    first = _commit_all(repo, "report")
    ran = {"code": {"commit": first,
                    "sources": source_blobs(repo, ["src/ghofl/bench/report.py", "src/m.py"])}}
    path.write_text("1\n")
    _commit_all(repo, "tables reworded")
    assert not section_age("t", "benchmarks/b.py", ran, repo).stale
    assert not section_age("t", "benchmarks/b.py", {"code": {"commit": first}}, repo).stale


def test_a_section_without_a_commit_or_with_an_unknown_one_is_stale(repo: Path) -> None:
    none = section_age("t", "benchmarks/b.py", {"rows": []}, repo)
    assert none.commits == () and none.stale
    head = _git(repo, "rev-parse", "--short=12", "HEAD")
    parts = {"parts": {"a": {"code": {"commit": head,
                                      "sources": source_blobs(repo, ["src/m.py"])}}, "b": {}}}
    some = section_age("t", "benchmarks/b.py", parts, repo)
    assert some.untracked == 1 and some.changed == () and some.stale
    gone = section_age("t", "benchmarks/b.py", {"code": {"commit": "0123456789ab"}}, repo)
    assert gone.unknown == ("0123456789ab",) and gone.stale
    assert changed_since(repo, "0123456789ab", ["src"]) is None
    assert section_age("t", "benchmarks/b.py", [1, 2], repo).commits == ()


def test_benchmarks_that_start_processes_record_no_sources() -> None:
    """Their children's imports are not seen: the whole library must count for them."""
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "benchmarks").glob("bench_*.py")):
        text = path.read_text()
        starts = any(s in text for s in ("sys.executable", "run_local", "flower_secaggplus"))
        bench: Any = load_script(path, f"_procs_{path.stem}")
        assert bench.BENCH.child_processes == starts, path.name


def test_the_audit_finds_every_section_of_the_report_once() -> None:
    root = Path(__file__).resolve().parents[2]
    stale: Any = load_script(root / "benchmarks" / "stale_sections.py", "_stale_sections")
    markers = [a.marker for a in stale.ages(root)]
    in_report = re.findall(r"<!-- BEGIN (\S+) -->", (root / "BENCHMARKS.md").read_text())
    assert sorted(markers) == sorted(in_report)


def test_the_audit_reads_each_scripts_saved_results(repo: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    stale: Any = load_script(root / "benchmarks" / "stale_sections.py", "_stale_sections")
    (repo / "benchmarks" / "bench_toy.py").write_text(
        "from ghofl.bench.harness import Benchmark, Section\n"
        "BENCH = Benchmark(script=__file__, description='toy', measure=lambda ctx: {},\n"
        "                  sections=(Section('toy', 'toy.json', str),\n"
        "                            Section('unmeasured', 'none.json', str)))\n")
    head = _commit_all(repo, "toy")
    (repo / "benchmarks" / "results" / "toy.json").write_text(json.dumps(
        {"code": {"commit": head, "changed_files": 0,
                  "sources": {"src/m.py": _git(repo, "hash-object", "src/m.py")}}}))
    toy, unmeasured = stale.ages(repo)
    assert (toy.marker, toy.script, toy.commits, toy.stale) == (
        "toy", "benchmarks/bench_toy.py", (head,), False)
    assert unmeasured.commits == () and unmeasured.stale
    (repo / "src" / "m.py").write_text("1\n")
    _commit_all(repo, "changed")
    assert stale.ages(repo)[0].changed == ("src/m.py",)
    assert stale._state(stale.ages(repo)[0], files=True) == "1 file changed since: src/m.py"

