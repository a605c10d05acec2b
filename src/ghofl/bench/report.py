"""Helpers for benchmark scripts: JSON results, sections of BENCHMARKS.md, common sentences.

Besides writing results and replacing one section, the sentences every timing section states
(the load it was measured under, how its steps were spaced).

Each benchmark script owns one section, delimited by ``<!-- BEGIN name -->`` and
``<!-- END name -->``; re-running a script rewrites only its section, atomically.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ghofl.files import atomic_write, write_json_atomic

REPORT_PREAMBLE = (
    "# Benchmarks\n\nEvery section below is written by the script named in it; "
    "do not edit by hand.\n"
    "Re-run a script to refresh its section (`make bench` runs them all).\n"
)


def machine_summary() -> str:
    """One line describing the machine (CPU count, Python, numpy BLAS)."""
    import numpy as np

    blas = ""
    try:
        from threadpoolctl import threadpool_info

        info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        if info:
            blas = (
                f", BLAS {info[0].get('internal_api')} {info[0].get('version')} "
                f"({info[0].get('architecture')}, {info[0].get('num_threads')} threads)"
            )
    except ImportError:  # pragma: no cover - threadpoolctl ships with scikit-learn
        pass
    return (
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"numpy {np.__version__}{blas}"
    )


def median_time(fn: Callable[[], Any], repeats: int = 5) -> tuple[float, list[float]]:
    """Median wall-clock seconds of ``repeats`` calls of ``fn`` (and all the samples)."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), samples


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """Write ``data`` as indented JSON atomically."""
    write_json_atomic(path, data, indent=2, sort_keys=True, default=str)


def _section_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- BEGIN {re.escape(name)} -->\n?(.*?)\n?<!-- END {re.escape(name)} -->",
                      re.S)


def read_section(text: str, name: str) -> str | None:
    """The body of section ``name`` in the markdown ``text`` (``None`` when it has none)."""
    m = _section_pattern(name).search(text)
    return None if m is None else m.group(1)


def replace_section(text: str | None, name: str, body: str, first: bool = False) -> str:
    """``text`` (default: the BENCHMARKS.md header) with section ``name`` holding ``body``.

    A new section is appended, or placed right after the file's header when ``first``.
    """
    text = REPORT_PREAMBLE if text is None else text
    block = f"<!-- BEGIN {name} -->\n{body.rstrip()}\n<!-- END {name} -->"
    pattern = _section_pattern(name)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    if first and "<!-- BEGIN " in text:
        i = text.index("<!-- BEGIN ")
        return text[:i] + block + "\n\n" + text[i:]
    return text.rstrip() + "\n\n" + block + "\n"


def update_section(path: str | os.PathLike[str], name: str, body: str, first: bool = False) -> None:
    """Replace the section ``name`` of the markdown file ``path`` atomically.

    A new section is appended, or placed right after the file's header when ``first``.
    """
    p = Path(path)
    text = replace_section(p.read_text() if p.exists() else None, name, body, first)
    atomic_write(p, lambda tmp: Path(tmp).write_text(text))


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def settle_sentence(settle_s: float | None, order: str = "fixed") -> str:
    """The clause a section states about how the timings spaced and ordered their steps.

    Of :func:`~ghofl.bench.harness.median_times`.

    Parameters
    ----------
    settle_s : float or None
        The ``settle`` the timings were taken with (``None``: results saved without it).
    order : {"fixed", "rotate", "balanced"}
        The ``order`` they were taken in.

    Returns
    -------
    str
        E.g. ", each step timed 0.3 s after the one before (once the BLAS threads the step
        before woke have parked), the order of the steps rotated from one repeat to the next";
        ``""`` without ``settle_s``.
    """
    if settle_s is None:
        return ""
    how = {"fixed": "",
           "rotate": ", the order of the steps rotated from one repeat to the next",
           "balanced": (", the steps in the orders of a Williams design (every step right "
                        "after every other equally often)")}[order]
    return (f", each step timed {settle_s:g} s after the one before (once the BLAS threads the "
            "step before woke have parked)" + how)


def load_sentence(results: Mapping[str, Any]) -> str:
    """The sentence a section states about the load it was measured under.

    Parameters
    ----------
    results : mapping
        A section's results, with the ``machine_load`` a timing benchmark records.

    Returns
    -------
    str
        E.g. "1-minute load average 0.42 at the start (2 cores; other processes 0.03
        cores), 0.95 at the end." (with "measured on a busy machine" when forced); ``""``
        for results saved without it.
    """
    rec = results.get("machine_load")
    if not rec:
        return ""
    start, end = rec["start"], rec["end"]
    other = start.get("other_cores")
    used = "" if other is None else f"; other processes {other:.2f} cores"
    busy = ", measured on a busy machine" if rec.get("forced") else ""
    return (f"1-minute load average {start['load_average'][0]:.2f} at the start "
            f"({start['cores']} cores{used}{busy}), {end['load_average'][0]:.2f} at the end.")
