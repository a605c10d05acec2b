"""Which code a benchmark section measured: the git commit recorded beside its results.

A benchmark that measures records :func:`code_version` in its results (the harness does it for
every section saved as one file; a benchmark that saves its results in parts records it in
each part), and the section names it (:func:`code_sentence`), so a reader sees at a glance
whether a section is older than the code it describes. Results are usually measured on a tree
with the change under test not yet committed: the record then also counts the changed source
files (under ``src/`` and ``benchmarks/``, results excluded), which land with the results.
Results saved before this existed name no commit.

The record also holds ``"sources"``: the git blob id of every source file of the repository the
run imported (:func:`source_blobs` of :func:`loaded_sources`), as the files were when measured,
uncommitted changes included; ``None`` when the run's code is not all in this process (a
benchmark that starts processes running ghofl, or ghofl imported from elsewhere).
:func:`section_age` compares them with ``HEAD``: a section is older than its code when one of
those files differs (without the blob ids: when ``src/`` or its script changed since the
commit); ``benchmarks/stale_sections.py`` lists them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CODE_KEY",
    "RECORDING_FILES",
    "SectionAge",
    "changed_blobs",
    "changed_since",
    "code_phrase",
    "code_sentence",
    "code_version",
    "loaded_sources",
    "recorded_versions",
    "section_age",
    "source_blobs",
]

#: The key under which results (or each part of them) carry :func:`code_version`.
CODE_KEY = "code"
#: Source paths whose uncommitted changes a record counts (results and the report excluded).
_SOURCES = ("src", "benchmarks", ":(exclude)benchmarks/results")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def loaded_sources(root: Path) -> list[str] | None:
    """The repository's source files this process has imported, relative to ``root``, sorted.

    Modules of the library (``src/``) and of the benchmarks (``benchmarks/``) in
    ``sys.modules``: the code a benchmark ran in this process.

    Parameters
    ----------
    root : Path
        The repository root.

    Returns
    -------
    list of str or None
        POSIX paths relative to ``root``; ``None`` when no file of ``src/`` is among them
        (ghofl imported from outside ``root``, an installed copy): the code run is unknown.
    """
    base = root.resolve()
    found = set()
    for mod in list(sys.modules.values()):
        file = getattr(mod, "__file__", None)
        if not file:
            continue
        try:
            rel = Path(file).resolve().relative_to(base)
        except ValueError:
            continue
        if rel.parts and rel.parts[0] in ("src", "benchmarks") and rel.suffix == ".py":
            found.add(rel.as_posix())
    return sorted(found) if any(f.startswith("src/") for f in found) else None


def source_blobs(root: Path, paths: Sequence[str]) -> dict[str, str] | None:
    """The git blob id of each file of ``paths`` (relative to ``root``) as it is on disk.

    ``None`` without git. What ``git ls-tree`` lists for a committed file of the same bytes,
    so that :func:`section_age` can compare them with any commit.
    """
    if not paths:
        return {}
    out = _git(root, "hash-object", "--", *paths)
    ids = out.split() if out is not None else []
    return dict(zip(paths, ids, strict=True)) if len(ids) == len(paths) else None


def code_version(root: Path) -> dict[str, Any] | None:
    """The commit checked out at ``root`` and how many source files differ from it.

    Changed, added, deleted and new (untracked, not ignored) files under ``src/`` and
    ``benchmarks/`` count; results under ``benchmarks/results/`` do not.

    Parameters
    ----------
    root : Path
        The repository root.

    Returns
    -------
    dict or None
        ``{"commit": 12 hex digits, "changed_files": int}``; ``None`` outside a git checkout
        (an installed package) or without git.
    """
    head = _git(root, "rev-parse", "--short=12", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *_SOURCES)
    if head is None or status is None:
        return None
    return {"commit": head.strip(), "changed_files": len(status.splitlines())}


def recorded_versions(results: Any) -> list[dict[str, Any]]:
    """The code records in ``results``: its own, or one per part (``{"parts": {name: part}}``)."""
    if not isinstance(results, Mapping):
        return []
    parts = results.get("parts")
    # parts in name order, as they load from disk, so a re-render states them alike
    found = [parts[k] for k in sorted(parts)] if isinstance(parts, Mapping) else [results]
    return [p[CODE_KEY] for p in found if isinstance(p, Mapping)
            and isinstance(p.get(CODE_KEY), Mapping) and "commit" in p[CODE_KEY]]


def code_phrase(rec: Mapping[str, Any]) -> str:
    """One record as a phrase: "commit `abc…`" (with its changed source files when any)."""
    n = int(rec.get("changed_files", 0))
    changes = "" if n == 0 else (f" with {n} changed source file{'s' if n > 1 else ''}, "
                                 "committed with these results")
    return f"commit `{rec['commit']}`{changes}"


def code_sentence(results: Any) -> str:
    """The sentence naming the code a section measured (``""`` when none is recorded).

    One record (a section saved as one file): "Latest run measured commit `abc…`." (a
    benchmark that keeps rows of earlier runs beside new ones records only the latest run).
    Parts: each commit and how many parts it measured, in the order first seen in part-name
    order; parts without a record are counted as naming no commit.
    """
    recs = recorded_versions(results)
    if not recs:
        return ""
    counts: dict[str, int] = {}
    for what in map(code_phrase, recs):
        counts[what] = counts.get(what, 0) + 1
    parts = isinstance(results, Mapping) and isinstance(results.get("parts"), Mapping)
    if len(counts) == 1 and not parts:
        return f"Latest run measured {next(iter(counts))}."
    total = len(results["parts"]) if parts else len(recs)
    listed = "; ".join(f"{what} ({n} part{'s' if n > 1 else ''})" for what, n in counts.items())
    untracked = total - len(recs)
    older = "" if not untracked else (
        f"; {untracked} part{'s name' if untracked > 1 else ' names'} no commit")
    return f"Code measured: {listed}{older}."


#: Files that only record and render what a benchmark measured (its provenance, tables,
#: plots): a change to them changes no measurement, so no section is older than them.
RECORDING_FILES = tuple(f"src/ghofl/bench/{name}.py"
                        for name in ("provenance", "report", "tables", "plots"))


def changed_since(root: Path, commit: str, paths: Sequence[str]) -> tuple[str, ...] | None:
    """Files under ``paths`` that differ between ``commit`` and ``HEAD`` at ``root``.

    Parameters
    ----------
    root : Path
        The repository root (a git checkout).
    commit : str
        The commit compared with ``HEAD``.
    paths : sequence of str
        Files or folders relative to ``root``; :data:`RECORDING_FILES` are left out.

    Returns
    -------
    tuple of str or None
        Paths relative to the repository's top level, sorted; ``None`` when the checkout does
        not hold ``commit`` (or git cannot tell).
    """
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return None
    diff = _git(root, "diff", "--name-only", commit, "HEAD", "--", *paths,
                *(f":(exclude){f}" for f in RECORDING_FILES))
    return None if diff is None else tuple(sorted(diff.splitlines()))


def changed_blobs(root: Path, sources: Mapping[str, str]) -> tuple[str, ...] | None:
    """Files of ``sources`` (path -> blob id) whose blob in ``HEAD`` differs (or is gone).

    :data:`RECORDING_FILES` are left out. ``None`` without git.
    """
    paths = [p for p in sources if p not in RECORDING_FILES]
    if not paths:
        return ()
    out = _git(root, "ls-tree", "HEAD", "--", *paths)
    if out is None:
        return None
    head = {}
    for line in out.splitlines():  # "<mode> blob <id>\t<path>"
        meta, _, path = line.partition("\t")
        head[path] = meta.split()[-1]
    return tuple(sorted(p for p in paths if head.get(p) != sources[p]))


@dataclass(frozen=True)
class SectionAge:
    """How a section of the benchmark report stands against the code it measured.

    Attributes
    ----------
    marker : str
        The section's name (``<!-- BEGIN marker -->``).
    script : str
        The benchmark script that writes it, relative to the repository root.
    commits : tuple of str
        The commits its saved results record (none: they name no commit).
    changed : tuple of str
        Files changed since it was measured, up to ``HEAD``: of the sources a record lists,
        those whose blob differs; for a record without them, the files of the library
        (``src/``) and of the script changed since its commit.
        :data:`RECORDING_FILES` are left out.
    unknown : tuple of str
        Recorded commits this checkout does not hold (for records without sources).
    untracked : int
        Parts of the results that record no commit.
    whole_library : bool
        Some record lists no sources, so the whole library counted for it.
    """

    marker: str
    script: str
    commits: tuple[str, ...]
    changed: tuple[str, ...]
    unknown: tuple[str, ...]
    untracked: int
    whole_library: bool

    @property
    def stale(self) -> bool:
        """Names no commit (or some part none), a commit this checkout lacks, or code changed."""
        return (not self.commits or self.untracked > 0 or bool(self.unknown)
                or bool(self.changed))


def section_age(marker: str, script: str, results: Any, root: Path) -> SectionAge:
    """A section's saved ``results`` against the checkout at ``root``.

    Parameters
    ----------
    marker : str
        The section's name.
    script : str
        The script that writes it, relative to ``root``.
    results : object
        Its saved results, as the section reads them (see :func:`recorded_versions`).
    root : Path
        The repository root (a git checkout).

    Returns
    -------
    SectionAge
    """
    recs = recorded_versions(results)
    parts = results.get("parts") if isinstance(results, Mapping) else None
    untracked = (len(parts) - len(recs)) if isinstance(parts, Mapping) else 0
    changed: set[str] = set()
    unknown: list[str] = []
    whole = False
    for rec in recs:
        sources = rec.get("sources")
        found: tuple[str, ...] | None
        if isinstance(sources, Mapping) and sources:
            found = changed_blobs(root, sources)
            if script not in sources and found is not None:
                more = changed_since(root, str(rec["commit"]), [script])
                found = None if more is None else (*found, *more)
        else:
            whole = True
            found = changed_since(root, str(rec["commit"]), ["src", script])
        if found is None:
            unknown.append(str(rec["commit"]))
        else:
            changed.update(found)
    commits = tuple(dict.fromkeys(str(r["commit"]) for r in recs))
    return SectionAge(marker, script, commits, tuple(sorted(changed)),
                      tuple(dict.fromkeys(unknown)), untracked, whole)
