"""Atomic file and directory writes: every output of ghofl is complete or absent.

Readers never see a half-written file: a file is written to a temporary file beside its
target and renamed onto it (``os.replace``, atomic on POSIX and Windows); a directory is
filled beside its target and renamed onto it. On any failure the temporary is removed and the
target is left as it was. Created files and folders get the permissions ``open()`` and
``mkdir()`` would give them (``0o666`` / ``0o777`` minus the umask), not ``mkstemp``'s 0600.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_directory", "atomic_write", "umask_mode", "write_json_atomic"]


def umask_mode(base: int) -> int:
    """``base`` permissions minus the process umask (what ``open``/``mkdir`` would give)."""
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` then rename the temporary file onto ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        The target file; its folder is created when missing.
    write : callable
        Writes the whole content to the path it is given (a new, empty file beside
        ``path``).

    Notes
    -----
    Nothing is left behind on failure: the temporary file is removed and an existing
    ``path`` keeps its previous content.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        os.chmod(tmp, umask_mode(0o666))  # mkstemp makes 0600 files; follow the umask
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(
    path: str | os.PathLike[str],
    obj: Any,
    *,
    indent: int | None = 2,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
) -> None:
    """Write ``obj`` as JSON (UTF-8, trailing newline) to ``path`` atomically.

    Parameters
    ----------
    path : str or os.PathLike
        The target file.
    obj : any JSON-serialisable value
        Serialised before anything is written, so an unserialisable value leaves no file.
    indent, sort_keys, default
        As in :func:`json.dumps`.
    """
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on success it replaces ``target``.

    Parameters
    ----------
    target : Path
        The directory to create or replace (its parent is created when missing). Callers
        decide beforehand whether an existing ``target`` may be replaced.

    Yields
    ------
    Path
        The temporary directory to fill.

    Notes
    -----
    "Complete or absent": when the ``with`` block raises, the temporary directory is removed
    and ``target`` is untouched; when it completes, ``target`` is swapped for the filled
    directory (an older ``target`` is renamed aside first and restored if the swap fails).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(tmp, umask_mode(0o777))
        yield tmp
        if target.exists():
            old = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.old"
            os.replace(target, old)
            try:
                os.replace(tmp, target)
            except BaseException:
                os.replace(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
