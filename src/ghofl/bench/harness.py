"""The benchmark harness: a benchmark declares its sections and how to measure; this runs it.

A script in ``benchmarks/`` builds one :class:`Benchmark`: the BENCHMARKS.md sections it owns
(each a marker, a results file under ``benchmarks/results/`` and a ``render`` from the saved
results to markdown), the flags of its own, and ``measure``, which runs its rows and returns
the results per section. :func:`main` owns the rest: argument parsing with the common flags
(``--report-only`` rebuilds every section from the saved results without measuring,
``--no-write`` prints instead of writing, ``--out`` names the markdown file), the results
files, the section writer and the terminal. A benchmark that reports timings
(``timings=True``) also gets :data:`ALLOW_BUSY_FLAG`: it refuses to measure on a busy
machine (:func:`check_quiet`) unless given that flag, and the load at its start and end is
recorded beside its timings, under ``machine_load`` in each section's results
(:func:`load_sentence` states it). Every measurement records the commit it measured and its
section names it (:mod:`ghofl.bench.provenance`). :func:`find_data_dir`, :func:`median_times` (the
medians of side-by-side repeats), :func:`run_rows` (a grid whose finished rows survive an
interrupted run) and :func:`stated_machine` (the machine and date lines of results saved
before they were recorded) are the shared pieces a ``measure`` uses; :func:`in_order` gives a
``render`` the measured order of a mapping whose saved keys are sorted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ghofl.bench.provenance import (
    CODE_KEY,
    code_sentence,
    code_version,
    loaded_sources,
    source_blobs,
)
from ghofl.bench.quiet import MachineLoad, machine_load
from ghofl.bench.report import (
    load_sentence,
    machine_summary,
    read_section,
    replace_section,
    settle_sentence,
    write_json,
)
from ghofl.errors import GhoflError
from ghofl.files import atomic_write

__all__ = [
    "Benchmark",
    "BenchmarkError",
    "Context",
    "Section",
    "check_quiet",
    "find_data_dir",
    "in_order",
    "load_sentence",
    "machine_summary",
    "main",
    "median_times",
    "render_sections",
    "run_rows",
    "settle_sentence",
    "stated_machine",
]

R = TypeVar("R")
V = TypeVar("V")

#: Flags every benchmark script understands.
COMMON_FLAGS = ("--report-only", "--no-write", "--out")
#: The flag with which a timing benchmark measures on a busy machine.
ALLOW_BUSY_FLAG = "--allow-busy"
#: Set while a benchmark that passed :func:`check_quiet` runs: the processes it starts (its
#: workers, whose parent is busy measuring) do not check again.
_CHECKED_ENV = "GHOFL_BENCH_QUIET_CHECKED"

_MACHINE = re.compile(r"Machine: (?P<machine>.+?)\.(?= )")
_DATE = re.compile(r"Measured (?P<date>\d{4}-\d{2}-\d{2})")


class BenchmarkError(GhoflError, ValueError):
    """A benchmark cannot run or render: missing data, results or section markers."""


@dataclass(frozen=True)
class Section:
    """One BENCHMARKS.md section: ``<!-- BEGIN marker -->`` ... ``<!-- END marker -->``.

    Parameters
    ----------
    marker : str
        The name in the section's markers.
    results : str
        The results file, relative to ``benchmarks/results/`` (``""``: the folder itself).
    render : callable
        Saved results -> the section's markdown body.
    first : bool
        Place a new section right after the file's header instead of at its end.
    load : callable, optional
        Path of ``results`` -> the saved results (default: the JSON it holds).
    after_render : callable, optional
        ``(results, results_dir)``: side products such as plots, redrawn with the section
        (skipped by :func:`render_sections` when ``side_products`` is false).
    states_machine : bool
        ``render`` reads ``machine`` and ``date`` from the results; results saved without them
        get those the section states now (:func:`stated_machine`).
    """

    marker: str
    results: str
    render: Callable[[Any], str]
    first: bool = False
    load: Callable[[Path], Any] | None = None
    after_render: Callable[[Any, Path], None] | None = None
    states_machine: bool = False

    def read(self, results_dir: Path) -> Any:
        """The saved results of this section, with a clear error when they are missing."""
        path = results_dir / self.results
        if not path.exists():
            raise BenchmarkError(
                f"The results of section {self.marker!r} ({path}) do not exist; run the "
                "benchmark once without --report-only to measure them."
            )
        if self.load is not None:
            return self.load(path)
        return json.loads(path.read_text())


@dataclass(frozen=True)
class Context:
    """What a running benchmark may use: its paths, its arguments and the log.

    ``code`` is the code version when the run started (:func:`~ghofl.bench.provenance.
    code_version`; ``None`` outside a git checkout); ``"now"`` reads it on first use.
    ``whole_library``: the benchmark runs ghofl in processes it starts too
    (:attr:`Benchmark.child_processes`), so its records list no sources.
    """

    root: Path
    args: argparse.Namespace
    out: Path
    code: dict[str, Any] | str | None = "now"
    whole_library: bool = False

    @property
    def results_dir(self) -> Path:
        """``benchmarks/results/`` of the repository."""
        return self.root / "benchmarks" / "results"

    def data_dir(self, required: bool = True) -> str | None:
        """The data folder (see :func:`find_data_dir`)."""
        found = find_data_dir(self.root, required=required)
        return None if found is None else str(found)

    def load(self, name: str, default: Any = None) -> Any:
        """The saved results file ``name`` (``default`` when it does not exist)."""
        path = self.results_dir / name
        return json.loads(path.read_text()) if path.exists() else default

    def code_version(self, inputs: Sequence[str] = ()) -> dict[str, Any] | None:
        """The commit this run measures (read when it started) and the sources it ran.

        For results saved in parts (the harness records it for a section saved as one file):
        ``{"commit", "changed_files", "sources"}``, ``sources`` the git blob id of each of the
        repository's source files imported so far and of ``inputs`` (files relative to the
        root that the results depend on, a config), so call it once the part has run;
        ``None`` for a benchmark whose code also runs in processes it starts
        (``whole_library``) or when the code run is unknown
        (:func:`~ghofl.bench.provenance.loaded_sources`).
        """
        if self.code == "now":
            object.__setattr__(self, "code", code_version(self.root))
        if not isinstance(self.code, dict):
            return None
        files = None if self.whole_library else loaded_sources(self.root)
        sources = None if files is None else source_blobs(self.root, [*files, *inputs])
        return {**self.code, "sources": sources}

    def save(self, name: str, data: Any) -> None:
        """Write the results file ``name`` atomically (never under ``--no-write``)."""
        if not self.args.no_write:
            write_json(self.results_dir / name, data)

    @staticmethod
    def log(msg: str) -> None:
        """Progress on the terminal (benchmarks own it; the library never prints)."""
        print(msg, flush=True)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: its script, its sections, its flags and its measurement.

    Parameters
    ----------
    script : str
        The script's ``__file__``; the repository root is its folder's parent.
    description : str
        The ``--help`` text (the script's docstring).
    sections : tuple of Section
        The BENCHMARKS.md sections it owns.
    measure : callable
        ``Context -> {marker: results}`` for the sections it measured this time (a part left
        out keeps its section), or ``None`` when nothing is to be written.
    add_arguments : callable, optional
        Adds the benchmark's own flags to the parser.
    report_aliases : tuple of str
        Older spellings of ``--report-only`` that scripts keep accepting.
    timings : bool
        It reports timings: it takes :data:`ALLOW_BUSY_FLAG`, refuses a busy machine
        without it, and its results record the machine's load.
    child_processes : bool
        It runs ghofl in processes it starts (workers, the CLI, Flower apps), whose imports
        its own process does not see: its code records list no sources, and a change anywhere
        in the library makes its sections stale
        (:func:`~ghofl.bench.provenance.section_age`).
    """

    script: str
    description: str
    sections: tuple[Section, ...]
    measure: Callable[[Context], Mapping[str, Any] | None]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    report_aliases: tuple[str, ...] = ()
    timings: bool = False
    child_processes: bool = False
    _by_marker: dict[str, Section] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        markers = [s.marker for s in self.sections]
        if len(set(markers)) != len(markers) or not markers:
            raise BenchmarkError(
                f"Benchmark {self.script!r} must declare at least one section and each marker "
                f"once; got {markers}."
            )
        object.__setattr__(self, "_by_marker", {s.marker: s for s in self.sections})

    @property
    def root(self) -> Path:
        """The repository root (the parent of ``benchmarks/``)."""
        return Path(self.script).resolve().parents[1]

    def section(self, marker: str) -> Section:
        """The declared section ``marker``."""
        try:
            return self._by_marker[marker]
        except KeyError:
            raise BenchmarkError(
                f"Benchmark {Path(self.script).name!r} has no section {marker!r}; its sections "
                f"are {sorted(self._by_marker)}."
            ) from None

    def parser(self) -> argparse.ArgumentParser:
        """The argument parser: the common flags and the benchmark's own."""
        ap = argparse.ArgumentParser(
            description=self.description, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        ap.add_argument(
            "--report-only", *self.report_aliases, dest="report_only", action="store_true",
            help="rewrite the sections (and plots) from the saved results; measure nothing",
        )
        ap.add_argument("--no-write", action="store_true",
                        help="print the sections; write neither results nor BENCHMARKS.md")
        ap.add_argument("--out", type=Path, default=self.root / "BENCHMARKS.md",
                        help="the markdown file whose sections are rewritten")
        if self.timings:
            ap.add_argument(ALLOW_BUSY_FLAG, dest="allow_busy", action="store_true",
                            help="measure even when the machine is busy (load average above "
                            "1.5 per core, or other processes using more than half a core); "
                            "the load is recorded beside the timings either way")
        if self.add_arguments is not None:
            self.add_arguments(ap)
        return ap


def check_quiet(force: bool, load: MachineLoad | None = None) -> MachineLoad:
    """The machine's load, or a refusal to time anything when it is busy.

    Parameters
    ----------
    force : bool
        Measure on a busy machine anyway (:data:`ALLOW_BUSY_FLAG`).
    load : MachineLoad, optional
        The load to judge (default :func:`ghofl.bench.quiet.machine_load`, which samples
        the other processes' CPU for half a second).

    Returns
    -------
    MachineLoad
        The load, to record beside the timings.

    Raises
    ------
    BenchmarkError
        The machine is busy and not ``force``: one line naming the load and the flag.
    """
    now = machine_load() if load is None else load
    reasons = now.busy_reasons()
    if reasons and not force:
        raise BenchmarkError(
            f"The machine is busy ({'; '.join(reasons)}): timings measured now would not be "
            f"worth writing down; run again when it is quiet, or pass {ALLOW_BUSY_FLAG} to "
            "measure anyway (the load is recorded beside the timings)."
        )
    return now


def saved_order(results: Mapping[str, Any]) -> str:
    """The ``order`` saved results were timed in (``"rotate"`` for older ones with ``rotated``)."""
    order = results.get("order")
    if isinstance(order, str) and order in ORDERS:
        return order
    return "rotate" if results.get("rotated") else "fixed"


def _with_load(measured: Mapping[str, Any], start: MachineLoad,
               forced: bool) -> dict[str, Any]:
    """``measured`` (marker -> results) with the load recorded in each mapping of results."""
    end = MachineLoad(os.getloadavg(), start.cores, None)
    rec = {"start": start.to_dict(), "end": end.to_dict(), "forced": forced}
    return {marker: {**data, "machine_load": rec} if isinstance(data, Mapping) else data
            for marker, data in measured.items()}


def _with_code(bench: Benchmark, measured: Mapping[str, Any] | None,
               rec: dict[str, Any] | None) -> Mapping[str, Any] | None:
    """``measured`` with the code version ``rec`` in each section saved as one results file.

    A section saved in parts records it in each part (:meth:`Context.code_version`).
    """
    if measured is None or rec is None:
        return measured
    return {m: {**data, CODE_KEY: rec}
            if isinstance(data, Mapping) and bench.section(m).load is None else data
            for m, data in measured.items()}


def _measure(bench: Benchmark, ctx: Context) -> Mapping[str, Any] | None:
    """``bench.measure(ctx)``, behind :func:`check_quiet` for a timing benchmark.

    The code version is recorded (:func:`_with_code`). Not checked again in a process a
    checked benchmark started (its worker).
    """
    if not bench.timings or os.environ.get(_CHECKED_ENV):
        return _with_code(bench, bench.measure(ctx), ctx.code_version())
    start = check_quiet(bool(ctx.args.allow_busy))
    forced = bool(start.busy_reasons())
    os.environ[_CHECKED_ENV] = "1"
    try:
        measured = bench.measure(ctx)
    finally:
        del os.environ[_CHECKED_ENV]
    return None if measured is None else _with_code(bench, _with_load(measured, start, forced),
                                                    ctx.code_version())


def find_data_dir(root: Path, required: bool = True) -> Path | None:
    """The folder holding the real data sets.

    ``$GHOFL_DATA_DIR`` when set, else ``../shared/data`` beside the repository when it exists.

    Parameters
    ----------
    root : Path
        The repository root.
    required : bool
        Raise when no folder is found (else return ``None``).

    Raises
    ------
    BenchmarkError
        ``$GHOFL_DATA_DIR`` names no folder, or none is found and ``required``.
    """
    env = os.environ.get("GHOFL_DATA_DIR")
    if env:
        path = Path(env)
        if not path.is_dir():
            raise BenchmarkError(
                f"GHOFL_DATA_DIR is {env!r}, which is not a folder; point it at the folder "
                "holding cifar10.zip and the other data sets, or unset it."
            )
        return path
    fallback = root.parent / "shared" / "data"
    if fallback.is_dir():
        return fallback
    if required:
        raise BenchmarkError(
            f"No data folder: GHOFL_DATA_DIR is not set and {fallback} does not exist; set "
            "GHOFL_DATA_DIR to the folder holding cifar10.zip and the other data sets."
        )
    return None


#: Seconds waited, untimed, before each timed call so BLAS threads the last step woke park.
SETTLE_S = 0.3


def median_times(
    fns: Mapping[str, Callable[[], Any]], repeats: int, warmup: bool = False,
    settle: float = 0.0, order: str = "fixed",
) -> dict[str, tuple[float, list[float]]]:
    """Median wall-clock seconds of each function, the functions timed side by side.

    Each repeat calls every function once, so a change in machine load falls on all of them
    alike.

    Parameters
    ----------
    fns : mapping of str to callable
        The timed functions, by name.
    repeats : int
        Calls of each function (>= 1).
    warmup : bool
        Call each once, untimed, first.
    settle : float
        Seconds to wait, untimed, before each call, so that one step's BLAS worker threads
        have parked before the next is timed (OpenBLAS keeps them spinning for a while after a
        call; with two BLAS libraries in the process, NumPy's and SciPy's, the spinning
        threads of one take the cores of the other).
    order : {"fixed", "rotate", "balanced"}
        The order of the calls in a repeat. ``"fixed"``: the order of ``fns``. ``"rotate"``:
        repeat r starts at the (r mod k)-th of the k functions, the cyclic order kept, so
        within a repeat each step still follows its cyclic predecessor. ``"balanced"``: the
        rows of a Williams design (:func:`balanced_orders`), one per repeat in turn, in which
        every step follows every other step equally often, so that what one step leaves
        behind for the next (memory it freed, threads still spinning) falls on every step
        alike; exactly so when ``repeats`` is a multiple of the design's length (k rows for
        an even k, 2k for an odd one). Only for functions that do not depend on each
        other's order.

    Returns
    -------
    dict
        name -> (median seconds, the ``repeats`` samples).

    Raises
    ------
    BenchmarkError
        ``repeats`` < 1 or an unknown ``order``.
    """
    if repeats < 1:
        raise BenchmarkError(f"median_times needs repeats >= 1; got {repeats}.")
    if order not in ORDERS:
        raise BenchmarkError(f"median_times has no order {order!r}; use one of "
                             f"{', '.join(ORDERS)}.")
    if warmup:
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    k = len(names)
    rows = balanced_orders(k) if order == "balanced" else [
        [(i + (r if order == "rotate" else 0)) % k for i in range(k)] for r in range(max(k, 1))]
    for r in range(repeats):
        for i in rows[r % len(rows)]:
            fn = fns[names[i]]
            if settle > 0.0:
                time.sleep(settle)
            t0 = time.perf_counter()
            fn()
            samples[names[i]].append(time.perf_counter() - t0)
    return {name: (statistics.median(s), s) for name, s in samples.items()}


#: The orders :func:`median_times` knows.
ORDERS = ("fixed", "rotate", "balanced")


def balanced_orders(k: int) -> list[list[int]]:
    """A Williams design for k steps: orders in which each step follows each other equally often.

    Row 0 is 0, 1, k−1, 2, k−2, …; row i adds i (mod k) to it. For an even k these k rows hold
    every ordered pair of distinct steps side by side exactly once; for an odd k the k rows
    and their reverses (2k rows) hold each exactly twice. Every step also opens a row equally
    often.

    Parameters
    ----------
    k : int
        Number of steps (>= 0).

    Returns
    -------
    list of list of int
        The rows, each a permutation of ``range(k)``.
    """
    if k <= 1:
        return [list(range(k))]
    base = [0] + [(j + 1) // 2 if j % 2 else k - j // 2 for j in range(1, k)]
    rows = [[(b + i) % k for b in base] for i in range(k)]
    return rows if k % 2 == 0 else rows + [row[::-1] for row in rows]


def run_rows(
    rows: Iterable[R],
    key: Callable[[R], str],
    run_row: Callable[[R], Any],
    done: Mapping[str, Any] | None = None,
    save: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run a benchmark's grid row by row, keeping the rows already done.

    Parameters
    ----------
    rows : iterable
        The grid.
    key : callable
        Row -> its name in the results.
    run_row : callable
        Row -> its results, or ``None`` when the row cannot run here (it is left out).
    done : mapping, optional
        Results of rows measured earlier; their rows are not run again.
    save : callable, optional
        Called with all results after every row, so an interrupted run keeps its rows.

    Returns
    -------
    dict
        key -> results, the earlier rows first.
    """
    out = dict(done or {})
    for row in rows:
        name = key(row)
        if name in out:
            continue
        res = run_row(row)
        if res is None:
            continue
        out[name] = res
        if save is not None:
            save(out)
    return out


def in_order(items: Mapping[str, V], order: Iterable[str]) -> dict[str, V]:
    """``items`` with the keys named in ``order`` first, the others after.

    The keys in ``order`` come in that order; the others follow in their own order.
    Saved results sort their keys (:func:`ghofl.bench.report.write_json`), so a ``render``
    that lists the entries of a mapping restores the order they were measured in with this,
    and renders the same from measured and from saved results.

    Parameters
    ----------
    items : mapping
        Entries by name (results just measured or read back).
    order : iterable of str
        The measured order; names without an entry are skipped.

    Returns
    -------
    dict
        The same entries, reordered.
    """
    first = [k for k in dict.fromkeys(order) if k in items]
    seen = set(first)
    return {k: items[k] for k in [*first, *(k for k in items if k not in seen)]}


def stated_machine(results: Mapping[str, Any], previous: str | None) -> dict[str, str]:
    """The machine and date a section states: recorded in the results, else in its text.

    Results saved before a script recorded them keep the lines of the section they rendered.

    Parameters
    ----------
    results : mapping
        Saved results, possibly with ``machine`` and ``date``.
    previous : str or None
        The section's current body.

    Returns
    -------
    dict
        ``machine`` and ``date`` (``""`` where neither source has it).
    """
    text = previous or ""
    found = {"machine": _MACHINE.search(text), "date": _DATE.search(text)}
    out = {}
    for k, m in found.items():
        value = results.get(k)
        out[k] = str(value) if value else (m.group(k) if m else "")
    return out


def render_sections(
    bench: Benchmark,
    out: Path,
    results: Mapping[str, Any] | None = None,
    results_dir: Path | None = None,
    side_products: bool = True,
    write: bool = True,
) -> dict[str, str]:
    """Render sections into the markdown file ``out``; return their bodies.

    Parameters
    ----------
    bench : Benchmark
        The benchmark.
    out : Path
        The markdown file (created with the header when missing).
    results : mapping, optional
        marker -> results just measured; without it every section renders from its saved
        results.
    results_dir : Path, optional
        Where saved results are read (default ``benchmarks/results/``).
    side_products : bool
        Also run each section's ``after_render`` (plots).
    write : bool
        Write ``out`` (else only return the bodies).
    """
    rdir = results_dir or bench.root / "benchmarks" / "results"
    todo = dict(results) if results is not None else {
        s.marker: s.read(rdir) for s in bench.sections
    }
    text = out.read_text() if out.exists() else None
    bodies: dict[str, str] = {}
    for marker, data in todo.items():
        sec = bench.section(marker)
        if sec.states_machine:
            data = {**data, **stated_machine(data, read_section(text or "", marker))}
        body = sec.render(data).rstrip()
        if (code := code_sentence(data)) and code not in body:
            body += "\n\n" + code
        text = replace_section(text, marker, body, first=sec.first)
        bodies[marker] = body
        if side_products and sec.after_render is not None:
            sec.after_render(data, rdir)
    if write and text is not None and bodies:
        final = text
        atomic_write(out, lambda tmp: Path(tmp).write_text(final))
    return bodies


def main(bench: Benchmark, argv: Sequence[str] | None = None) -> None:
    """Run a benchmark script: parse, measure (or read the saved results) and write.

    Parameters
    ----------
    bench : Benchmark
        The script's declaration.
    argv : sequence of str, optional
        The arguments (default ``sys.argv[1:]``).
    """
    args = bench.parser().parse_args(argv)
    ctx = Context(root=bench.root, args=args, out=args.out, code=code_version(bench.root),
                  whole_library=bench.child_processes)
    try:
        measured: Mapping[str, Any] | None = None
        if not args.report_only:
            measured = _measure(bench, ctx)
            if measured is None:
                return
            for marker, data in measured.items():
                sec = bench.section(marker)
                if sec.results and sec.load is None:
                    ctx.save(sec.results, data)
        bodies = render_sections(bench, args.out, measured, write=not args.no_write,
                                 side_products=not args.no_write)
    except BenchmarkError as exc:
        raise SystemExit(str(exc)) from None
    for body in bodies.values():
        print(body)
    if not args.no_write:
        print(f"wrote section(s) {', '.join(bodies)} of {args.out}", file=sys.stderr)
