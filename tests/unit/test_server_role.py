"""The server role has one home: servers, releases and fits are built only in ``ghofl.server``.

Every front end (the CLI, the Flower apps, the benchmarks' library code) reaches the server
through :class:`~ghofl.server.run.FederationServer` (or the simulator in
:mod:`ghofl.server.simulation`, which builds one), never by building a protocol's server half,
a DP release or a server job itself. The scan reads the AST of every module under
``src/ghofl`` (nothing is imported); lazy imports inside functions count like any call.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

#: What only the server role builds or runs, by the name it is called under.
SERVER_ONLY: frozenset[str] = frozenset({
    "SecAggServer", "PlainServer", "NoisyDecoder", "release_central", "run_server_job",
    "run_aggregation", "run_hierarchical", "sum_stats",
})

#: Packages that may call them: the server role itself, and the secure package, whose
#: hierarchy runs one round per region with the server half it is handed.
ALLOWED: dict[str, tuple[str, ...]] = {
    "SecAggServer": ("ghofl.server.", "ghofl.secure."),
    "PlainServer": ("ghofl.server.", "ghofl.secure."),
    "NoisyDecoder": ("ghofl.server.", "ghofl.privacy."),
    "release_central": ("ghofl.server.", "ghofl.privacy."),
    "run_server_job": ("ghofl.server.",),
    "run_aggregation": ("ghofl.server.", "ghofl.secure."),
    "run_hierarchical": ("ghofl.server.", "ghofl.secure."),
    # FedCOF's own protocol (ghofl.moments.fedcof) and the store's total sum payloads below
    # the server; the front ends never do.
    "sum_stats": ("ghofl.server.", "ghofl.stats.", "ghofl.store.", "ghofl.moments."),
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((SRC / "ghofl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def server_calls(source: str) -> list[tuple[int, str]]:
    """``(line, name)`` of every call of a :data:`SERVER_ONLY` name in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            func.attr if isinstance(func, ast.Attribute) else "")
        if name in SERVER_ONLY:
            found.append((node.lineno, name))
    return found


def violations() -> list[str]:
    """``module:line name`` for every call of a server-only name outside its allowed places."""
    out = []
    for module, path in _modules().items():
        for line, name in server_calls(path.read_text(encoding="utf-8")):
            if not (module + ".").startswith(ALLOWED[name]):
                out.append(f"{module}:{line} {name}")
    return out


def test_the_scanner_finds_calls_by_name_and_attribute() -> None:
    src = "import x\nx.PlainServer(1)\nSecAggServer(cfg)\nprint(run_server_job)\n"
    assert server_calls(src) == [(2, "PlainServer"), (3, "SecAggServer")]


def test_servers_releases_and_fits_are_built_only_in_the_server_role() -> None:
    found = violations()
    assert not found, (
        "server halves, DP releases, server jobs and payload sums are built only in "
        f"ghofl.server (through FederationServer); found: {found}"
    )
