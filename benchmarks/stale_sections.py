"""Which sections of BENCHMARKS.md are older than the code they measure.

Every benchmark records, beside its results, the commit it ran and the git blob id of each of
the repository's source files it imported (:meth:`ghofl.bench.harness.Context.code_version`).
This lists every section of every benchmark script with the commits its saved results record
and the files of that code changed since, up to the checkout's ``HEAD``
(:func:`ghofl.bench.provenance.section_age`): a section is stale when its results name no
commit, a commit this checkout lacks, or code it ran that changed since. For results that
record no sources (recorded before they were, or by a benchmark that runs ghofl in processes
it starts) the whole library (``src/``) and the script count instead. Re-run a stale section's
script to bring it up to date.

Run: ``.venv/bin/python benchmarks/stale_sections.py`` (``--stale`` lists only the stale
sections; ``--files`` names the changed files; ``--check`` exits with status 1 when any section
is stale).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

from ghofl.bench.harness import Benchmark, BenchmarkError
from ghofl.bench.provenance import SectionAge, section_age
from ghofl.bench.report import markdown_table

ROOT = Path(__file__).resolve().parents[1]


def _benchmark(path: Path) -> Benchmark | None:
    """The ``BENCH`` a benchmark script declares (``None`` for a script without one)."""
    spec = importlib.util.spec_from_file_location(f"_stale_{path.stem}", path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    bench = getattr(module, "BENCH", None)
    return bench if isinstance(bench, Benchmark) else None


def ages(root: Path = ROOT) -> list[SectionAge]:
    """Every section of every benchmark script under ``root/benchmarks``, script by script."""
    out = []
    rdir = root / "benchmarks" / "results"
    for path in sorted((root / "benchmarks").glob("bench_*.py")):
        script = str(path.relative_to(root))
        try:
            bench = _benchmark(path)
        except Exception as exc:  # one broken script must not hide the others' sections
            print(f"{script}: cannot be imported ({type(exc).__name__}: {exc}); its sections "
                  "are not listed", file=sys.stderr)
            continue
        for sec in bench.sections if bench is not None else ():
            try:
                results: Any = sec.read(rdir)
            except BenchmarkError:
                results = None
            except Exception as exc:  # unreadable results: the section names no commit
                print(f"{script}: the results of section {sec.marker!r} cannot be read "
                      f"({type(exc).__name__}: {exc}); re-run the script", file=sys.stderr)
                results = None
            out.append(section_age(sec.marker, script, results, root))
    return out


def _state(age: SectionAge, files: bool) -> str:
    if not age.commits:
        return "names no commit"
    said = []
    if age.unknown:
        said.append("records commits this checkout lacks: " + ", ".join(age.unknown))
    if age.untracked:
        said.append(f"{age.untracked} part{'s name' if age.untracked > 1 else ' names'} "
                    "no commit")
    if age.changed:
        n = len(age.changed)
        what = " (the whole library counted)" if age.whole_library else ""
        said.append(f"{n} file{'s' if n > 1 else ''} changed since{what}"
                    + (": " + ", ".join(age.changed) if files else ""))
    return "; ".join(said) or "up to date"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--stale", action="store_true", help="list only the stale sections")
    ap.add_argument("--files", action="store_true", help="name the files changed since")
    ap.add_argument("--check", action="store_true", help="exit 1 when any section is stale")
    args = ap.parse_args(argv)
    found = ages()
    shown = [a for a in found if a.stale or not args.stale]
    print(markdown_table(["section", "script", "commits recorded", "state"],
                         [[a.marker, a.script, ", ".join(a.commits) or "—",
                           _state(a, args.files)] for a in shown]))
    stale = sum(a.stale for a in found)
    print(f"\n{stale} of {len(found)} sections stale", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
