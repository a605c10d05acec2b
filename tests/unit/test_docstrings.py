"""Docstrings and comments state behaviour: no commit hashes in them.

A commit hash says where a fact came from, not what the code does, and it rots when history is
rewritten. The scan reads every module under src/ghofl: its docstrings (every bare string
statement: module, class, function and attribute docstrings) and its ``#`` comments. A token
is commit-hash-like when it is 7 to 40 lowercase hex digits (as git prints them) holding both a
digit and a letter, standing alone (not part of a longer word, number, path or URL). Hex
constants in code (``0x0D1FF``) and string values that are not docstrings are not read.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

COMMIT_LIKE = re.compile(
    r"(?<![\w\-./:])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w\-/])"
)


def _prose(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring and comment of ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            found.append((node.lineno, node.value.value))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], tok.string))
    return found


def commit_hashes(source: str, where: str) -> list[str]:
    """``where:line: token`` for every commit-hash-like token in the prose of ``source``."""
    return sorted(f"{where}:{line}: {m.group(0)}" for line, text in _prose(source)
                  for m in COMMIT_LIKE.finditer(text))


def test_the_scan_finds_hashes_in_prose_only() -> None:
    source = '''"""Module (ported from b7d6a00)."""
SEED = 0x0D1FF  # fixed at 9c6a676.
LABEL = "abc1234f"


def f() -> None:
    """Ed25519 keys, 1234567 samples, a deadbeef marker, https://x.org/tree/3f2a1bc/a.py."""
    # digest e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 of nothing
    x = 0x1f2e3d4c  # commit 1a2b3c4d5e6f
'''
    assert commit_hashes(source, "m.py") == [
        "m.py:1: b7d6a00", "m.py:2: 9c6a676", "m.py:9: 1a2b3c4d5e6f",
    ]


def test_no_docstring_or_comment_holds_a_commit_hash() -> None:
    found: list[str] = []
    for path in sorted((SRC / "ghofl").rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        found += commit_hashes(path.read_text(encoding="utf-8"), rel)
    assert not found, (
        "commit hashes in docstrings or comments (file:line: token); state the behaviour "
        "instead (measured figures belong in BENCHMARKS.md):\n" + "\n".join(found))
