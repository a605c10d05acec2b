"""Helpers for the CLI tests: running ``ghofl`` as a subprocess and writing tiny archives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

GHOFL = [sys.executable, "-m", "ghofl.cli.main"]


def run_cli(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ghofl.cli.main ARGS`` in ``cwd`` and capture its output as text."""
    full_env = {k: v for k, v in os.environ.items() if k != "GHOFL_DEBUG"}
    full_env.update(env or {})
    return subprocess.run(
        [*GHOFL, *map(str, args)], cwd=cwd, env=full_env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )


def write_npz(path: Path, x: Any, y: Any, classes: Any = None) -> Path:
    """Write an embeddings archive with ``x``, ``y`` and optionally ``classes``."""
    arrays: dict[str, Any] = {"x": np.asarray(x), "y": np.asarray(y)}
    if classes is not None:
        arrays["classes"] = np.asarray(classes)
    np.savez(path, **arrays)
    return path


def tree(root: Path) -> list[str]:
    """Every path under ``root`` (hidden ones included), relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def main_ok(args: list[Any], capsys: Any) -> str:
    """Run ``ghofl`` in process with ``args`` (str()-ed); assert exit 0; its stdout + stderr."""
    from ghofl.cli.main import main

    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return str(out.out + out.err)
