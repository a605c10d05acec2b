"""Helpers for benchmark scripts: write JSON results and replace one section of BENCHMARKS.md.

Each benchmark script owns one section, delimited by ``<!-- BEGIN name -->`` and
``<!-- END name -->``; re-running a script rewrites only its section, atomically.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from collections.abc import Callable
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
