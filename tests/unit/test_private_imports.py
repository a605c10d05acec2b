"""Private names stay private: no module imports another module's ``_name``.

A leading underscore (not a dunder) marks a name as internal to its module. Another module may
use it only when the defining module is a package's own private helper module (a module whose own
name starts with ``_``, e.g. ``ghofl/heads/_linalg.py``) and the importer sits in that package
(its parent package or below). A private helper module itself may be imported only from inside
its package. The scan reads the AST of every module under src/ghofl (nothing is imported):
relative imports are resolved, lazy imports inside functions and imports under
``if TYPE_CHECKING:`` count, and ``import ghofl.x.mod`` (with or without ``as``) followed by the
attribute ``mod._name`` counts like ``from ghofl.x.mod import _name``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _inside(importer: str, package: str) -> bool:
    return importer == package or importer.startswith(package + ".")


def _placed_right(importer: str, module: str) -> bool:
    """Whether ``importer`` may import ``module``: inside the package of every private part."""
    parts = module.split(".")
    return all(_inside(importer, ".".join(parts[:i]))
               for i in range(1, len(parts)) if _is_private(parts[i]))


def _may_use_private_name(importer: str, module: str) -> bool:
    """Whether ``importer`` may use a private name defined in ``module``."""
    return _is_private(module.rpartition(".")[2]) and _placed_right(importer, module)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = importer.split(".") if is_package else importer.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _is_ghofl(module: str) -> bool:
    return module == "ghofl" or module.startswith("ghofl.")


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    names: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        names.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    names.append(current.id)
    return names[::-1]


def _scan_module(importer: str, source: str, is_package: bool,
                 modules: frozenset[str]) -> set[str]:
    """``importer -> module.name`` for every private import in one module's source."""
    found: set[str] = set()
    bound: dict[str, str] = {}  # local name -> ghofl module it is bound to
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_ghofl(alias.name):
                    continue
                if not _placed_right(importer, alias.name):
                    found.add(f"{importer} -> {alias.name}")
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(importer, is_package, node)
            if not _is_ghofl(base) or base == importer:
                continue
            for alias in node.names:
                if alias.name == "*":
                    continue
                dotted = f"{base}.{alias.name}"
                if dotted in modules:  # a submodule
                    bound[alias.asname or alias.name] = dotted
                    ok = _placed_right(importer, dotted)
                elif _is_private(alias.name):
                    ok = _may_use_private_name(importer, base)
                else:
                    ok = _placed_right(importer, base)
                if not ok:
                    found.add(f"{importer} -> {dotted}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain = _attribute_chain(node)
        if chain is None or chain[0] not in bound:
            continue
        module, rest = bound[chain[0]], chain[1:]
        while rest and f"{module}.{rest[0]}" in modules:
            module, rest = f"{module}.{rest[0]}", rest[1:]
        if (len(rest) == 1 and module != importer and _is_private(rest[0])
                and not _may_use_private_name(importer, module)):
            found.add(f"{importer} -> {module}.{rest[0]}")
    return found


def private_imports(sources: Mapping[str, tuple[str, bool]]) -> list[str]:
    """Every ``importer -> module.name`` that breaks the rule in the module docstring.

    Parameters
    ----------
    sources : mapping of str to (str, bool)
        Dotted module name -> (its source text, whether it is a package ``__init__``).
    """
    modules = frozenset(sources)
    found: set[str] = set()
    for importer, (source, is_package) in sources.items():
        found |= _scan_module(importer, source, is_package, modules)
    return sorted(found)


def _ghofl_sources() -> dict[str, tuple[str, bool]]:
    sources: dict[str, tuple[str, bool]] = {}
    for path in sorted((SRC / "ghofl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        sources[".".join(parts)] = (path.read_text(encoding="utf-8"), is_package)
    return sources


def test_the_scanner_flags_private_imports_and_spares_package_helpers() -> None:
    sources = {
        "ghofl": ("", True),
        "ghofl.a": ("", True),
        "ghofl.a.mod": ("_x = 1\ny = 2\n", False),
        "ghofl.a._help": ("_h = 1\nh = 2\n", False),
        "ghofl.a.sub": ("", True),
        "ghofl.a.sub.deep": ("from .._help import _h\nfrom ghofl.a import _help\n", False),
        "ghofl.a.user": (
            "from .mod import _x, y\n"          # private name of a public module
            "from ._help import _h, h\n"        # own package's helper: fine
            "import ghofl.a.mod as m\n"
            "def f():\n"
            "    from ghofl.a.mod import _x as z\n"  # lazy import counts
            "    return m._x + m.y\n", False),   # attribute use counts
        "ghofl.b": ("", True),
        "ghofl.b.other": (
            "from typing import TYPE_CHECKING\n"
            "import ghofl.a.mod\n"
            "if TYPE_CHECKING:\n"
            "    from ghofl.a._help import h\n"  # helper of another package
            "from ghofl.a import _help\n"
            "v = ghofl.a.mod._x + ghofl.a.mod.y\n"
            "from ghofl.a.mod import __doc__\n", False),  # dunders are public
    }
    assert private_imports(sources) == [
        "ghofl.a.user -> ghofl.a.mod._x",
        "ghofl.b.other -> ghofl.a._help",
        "ghofl.b.other -> ghofl.a._help.h",
        "ghofl.b.other -> ghofl.a.mod._x",
    ]


def test_no_module_imports_a_private_name_of_another_module() -> None:
    found = private_imports(_ghofl_sources())
    assert not found, (
        "private names imported across modules (importer -> module.name); make the name public "
        "(drop the underscore, add it to __all__, document it) or move the shared helper into "
        "a private `_module` of the package both importers live in:\n" + "\n".join(found))
