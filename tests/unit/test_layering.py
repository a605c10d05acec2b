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
    "ghofl.server_job",
    "ghofl.evaluation.metrics",
    "ghofl.heads.model_dir",
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
    assert not any(m == "ghofl.simulation" or m.startswith("ghofl.simulation.")
                   for m in _imports(module))


def test_deployment_commands_do_not_load_the_simulator_even_indirectly() -> None:
    code = ("import sys; import " + ", ".join(DEPLOYMENT_MODULES)
            + "; print('ghofl.simulation' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
