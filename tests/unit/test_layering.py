"""Layering: the real-deployment CLI commands and the client/server jobs never import the
simulator, so the Flower apps and the CLI share one code path without it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOYMENT_MODULES = (
    "ghofl.cli.stats_cmds",
    "ghofl.cli.model_cmds",
    "ghofl.cli.io",
    "ghofl.client.job",
    "ghofl.server.job",
    "ghofl.evaluation.metrics",
    "ghofl.model.directory",
    "ghofl.data.embeddings",
    "ghofl.files",
)


def _imports(module: str) -> set[str]:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("module", DEPLOYMENT_MODULES)
def test_module_source_does_not_import_the_simulator(module: str) -> None:
    assert not any(m == "ghofl.server.simulation" or m.startswith("ghofl.server.simulation.")
                   for m in _imports(module))


def test_deployment_commands_do_not_load_the_simulator_even_indirectly() -> None:
    code = ("import sys; import " + ", ".join(DEPLOYMENT_MODULES)
            + "; print('ghofl.server.simulation' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# ---------------------------------------------------------------------------------------------
# Import graph: no cycles, no upward imports.
#
# The graph is read from the AST of every module under src/ghofl (nothing is imported). Every
# ``import``/``from ... import`` counts, including lazy imports inside functions: a lazy import is
# still a dependency, it only moves the failure from import time to call time. Imports under
# ``if TYPE_CHECKING:`` do not count (they never run). ``from pkg import name`` where ``pkg`` is a
# package ``__init__`` is resolved to the module the facade re-exports ``name`` from (a facade
# importing its own children is not a dependency of concerns); names defined in the facade itself
# make the facade a node like any module.

SRC = Path(__file__).resolve().parents[2] / "src"

#: Layer rank of every top-level part of ghofl; a module may import only modules of the same or
#: a lower rank. The order follows one run (data -> client -> secure sum -> privacy -> moments ->
#: heads -> evaluation), except that the statistics value sits below the client that produces it.
#: ``""`` is the ``ghofl`` facade. A new top-level part must be placed here deliberately.
LAYERS: dict[str, int] = {
    "errors": 0, "files": 0, "_version": 0, "_lazy": 0,
    "data": 1,
    "stats": 2,
    "client": 3,
    "secure": 4,
    "store": 5,
    "privacy": 6,
    "moments": 7,
    "heads": 8, "baselines": 8,
    "evaluation": 9, "": 9,
    "model": 9,
    "server": 10,
    "integrations": 11, "cli": 11, "bench": 11,
}

#: Cycles still to break (each a sorted tuple of modules), with the reason; must only shrink.
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}

#: Upward imports still to remove (importer, imported), with the reason; must only shrink.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def _module_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for path in sorted((SRC / "ghofl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def _is_facade(files: dict[str, Path], module: str) -> bool:
    return files[module].name == "__init__.py"


def _owner(files: dict[str, Path], dotted: str) -> str | None:
    while dotted and dotted not in files:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def _import_nodes(files: dict[str, Path], module: str) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(files[module].read_text(encoding="utf-8"))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return [n for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in type_only]


def _base(files: dict[str, Path], module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".") if _is_facade(files, module) else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _reexports(files: dict[str, Path], facade: str) -> dict[str, str]:
    """``name -> dotted place it comes from`` for the names a package ``__init__`` imports."""
    out: dict[str, str] = {}
    for node in _import_nodes(files, facade):
        if isinstance(node, ast.ImportFrom):
            base = _base(files, facade, node)
            for alias in node.names:
                out[alias.asname or alias.name] = f"{base}.{alias.name}"
    return out


def _target(files: dict[str, Path], dotted: str, seen: frozenset[str] = frozenset()) -> str | None:
    """The module that ``dotted`` (a module, or ``module.name``) finally resolves to."""
    if dotted in files:
        return dotted
    owner = _owner(files, dotted)
    if owner is None or not _is_facade(files, owner) or dotted in seen:
        return owner
    name = dotted[len(owner) + 1:].split(".")[0]
    source = _reexports(files, owner).get(name)
    return owner if source is None else _target(files, source, seen | {dotted})


def import_graph() -> dict[str, set[str]]:
    """Module -> ghofl modules it imports (rules in the comment above)."""
    files = _module_files()
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module in files:
        for node in _import_nodes(files, module):
            if isinstance(node, ast.Import):
                dotted = [a.name for a in node.names]
            else:
                base = _base(files, module, node)
                dotted = [f"{base}.{a.name}" for a in node.names]
            for d in dotted:
                if not d.startswith("ghofl"):
                    continue
                if _is_facade(files, module) and _owner(files, d) != module and d.startswith(
                        module + "."):
                    continue  # a facade re-exporting its own children
                t = _target(files, d)
                if t is not None and t != module:
                    graph[module].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[tuple[str, ...]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(tuple(sorted(comp)))
    return sorted(out)


def _layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    assert part in LAYERS, (
        f"{module} is in the top-level part {part!r}, which has no layer; add it to LAYERS in "
        "tests/unit/test_layering.py at its place in the data order"
    )
    return LAYERS[part]


def test_the_cycle_finder_sees_a_lazy_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_resolves_facade_reexports_and_lazy_imports() -> None:
    graph = import_graph()
    # lazy, function-level import (fisher imports selection inside functions)
    assert "ghofl.moments.selection" in graph["ghofl.heads.fisher"]
    # `from ghofl.stats(.client_stats) import ClientStats` resolves past the package facades
    # to its defining module
    assert "ghofl.stats" not in graph["ghofl.moments.core"]
    assert "ghofl.stats.client_stats" not in graph["ghofl.moments.core"]
    assert "ghofl.stats.client_stats.value" in graph["ghofl.moments.core"]


def test_no_import_cycles_among_ghofl_modules() -> None:
    found = _cycles(import_graph())
    new = [c for c in found if c not in KNOWN_CYCLES]
    assert not new, f"import cycles among src/ghofl modules: {new}; break them"
    fixed = [c for c in KNOWN_CYCLES if c not in found]
    assert not fixed, f"{fixed} no longer form a cycle; remove them from KNOWN_CYCLES"


def test_no_module_imports_a_higher_layer() -> None:
    graph = import_graph()
    found = {(m, t) for m, ts in graph.items() for t in ts if _layer(t) > _layer(m)}
    new = sorted(found - set(KNOWN_UPWARD))
    assert not new, f"upward imports (importer, imported): {new}; move the shared piece down"
    fixed = sorted(set(KNOWN_UPWARD) - found)
    assert not fixed, f"{fixed} are no longer upward imports; remove them from KNOWN_UPWARD"


def test_the_flower_client_app_does_not_load_scipy_stats_torch_or_the_simulator() -> None:
    """A SuperNode starts one ClientApp process per message: its import stays light (no
    scipy, torch, simulator, heads or evaluation stage; a stage loads what it needs)."""
    heavy = ("scipy", "scipy.stats", "scipy.linalg", "scipy.special", "torch",
             "ghofl.server.simulation", "ghofl.server.job", "ghofl.heads.base",
             "ghofl.heads.registry", "ghofl.heads.lda", "ghofl.heads.qda", "ghofl.moments",
             "ghofl.evaluation", "ghofl.integrations.flower.eval_node",
             "ghofl.integrations.flower.evaluation")
    code = ("import sys; import ghofl.integrations.flower.client_app; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("package", ["ghofl", "ghofl.server", "ghofl.heads"])
def test_lazy_facades_resolve_every_exported_name(package: str) -> None:
    import importlib

    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
        assert name in dir(module)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        module.nope  # noqa: B018
