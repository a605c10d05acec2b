"""Atomic file and directory writes: every output of ghofl is complete or absent.

Readers never see a half-written file: a file is written to a temporary file beside its
target and renamed onto it (``os.replace``, atomic on POSIX and Windows); a directory is
filled beside its target and renamed onto it. On any failure the temporary is removed and the
target is left as it was. Created files and folders get the permissions ``open()`` and
``mkdir()`` would give them (``0o666`` / ``0o777`` minus the umask), not ``mkstemp``'s 0600.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_directory",
    "atomic_write",
    "remove_stale_temporaries",
    "umask_mode",
    "write_json_atomic",
]


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
    Nothing is left behind on failure, ``KeyboardInterrupt`` included: the temporary file
    ``.NAME.XXXX.tmp`` is removed and an existing ``path`` keeps its previous content. The
    writer holds an advisory lock on its temporary file while it works; temporaries that a
    killed process left next to ``path`` (no live writer holds their lock) are removed by the
    next write of ``path`` (where advisory locks do not exist: once untouched for
    :data:`STALE_SECONDS`). Readers open ``path`` only, never a temporary. The file gets the
    permissions ``open()`` would give it (0o666 minus the umask), not ``mkstemp``'s 0600.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(target)
    fd, tmp = _locked_temporary(target)
    try:
        os.chmod(tmp, umask_mode(0o666))  # mkstemp makes 0600 files; follow the umask
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


#: Where advisory locks do not exist, a temporary file untouched for this long is stale.
STALE_SECONDS = 2.0


def _locked_temporary(target: Path, directory: bool = False) -> tuple[int, str]:
    """A new temporary file (or directory) beside ``target`` and a descriptor holding its lock.

    A cleaner may take the lock of a temporary in the instant between its creation and the
    lock being taken, and remove it: then the path no longer names the locked one, and a new
    one is made.
    """
    prefix = f".{target.name}."
    while True:
        if directory:
            tmp = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=target.parent)
            fd = os.open(tmp, os.O_RDONLY)
        else:
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=target.parent)
        _lock(fd, blocking=True)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(tmp)):
                return fd, tmp
        except FileNotFoundError:
            pass
        os.close(fd)


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Remove the ``.NAME.*.tmp`` files and folders beside ``target`` left by killed writers.

    A temporary is removed only when no process holds its lock (the writer died; where
    advisory locks do not exist, when it was not modified for :data:`STALE_SECONDS`); errors
    (permissions, a race with another cleaner) are ignored. Returns the removed paths.
    """
    return _remove_unlocked(target, "tmp")


def _remove_unlocked(target: Path, suffix: str) -> list[Path]:
    """Remove the ``.NAME.*.SUFFIX`` files and folders beside ``target`` nobody locks."""
    removed: list[Path] = []
    try:
        candidates = list(target.parent.glob(f".{glob_escape(target.name)}.*.{suffix}"))
    except OSError:
        return removed
    now = time.time()
    for cand in candidates:
        try:
            st = cand.lstat()
            is_dir = stat.S_ISDIR(st.st_mode)
            if not (is_dir or stat.S_ISREG(st.st_mode)) or (
                    not _HAVE_LOCKS and now - st.st_mtime < STALE_SECONDS):
                continue
            fd = os.open(cand, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            try:
                if not _lock(fd, blocking=False):
                    continue  # a live writer holds it
                if is_dir:
                    shutil.rmtree(cand)
                else:
                    cand.unlink()
                removed.append(cand)
            finally:
                os.close(fd)
        except OSError:
            continue
    return removed


def glob_escape(name: str) -> str:
    """``name`` with the glob metacharacters ``*?[`` escaped."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


try:
    import fcntl as _fcntl  # noqa: F401
    _HAVE_LOCKS = True
except ImportError:  # pragma: no cover - Windows
    _HAVE_LOCKS = False


def _lock(fd: int, blocking: bool) -> bool:
    """Take an exclusive advisory lock on ``fd``; False when another process holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no advisory locks, age alone decides
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


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
        The temporary directory ``.NAME.XXXX.tmp`` to fill.

    Notes
    -----
    "Complete or absent": when the ``with`` block raises, the temporary directory is removed
    and ``target`` is untouched; when it completes, ``target`` is swapped for the filled
    directory in one atomic exchange where the system has one (Linux ``renameat2``), else by
    renaming the older ``target`` aside first (restored if the swap fails). The writer locks
    its temporary directory while it works, so what a killed writer leaves behind is told
    from a live writer's work: the next write of ``target`` removes leftover temporaries and,
    if the kill fell between the two renames of the fallback swap, first puts the previous
    ``target`` back, so it is never lost.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _recover_interrupted_swap(target)
    remove_stale_temporaries(target)
    fd, made = _locked_temporary(target, directory=True)
    tmp = Path(made)
    try:
        os.chmod(tmp, umask_mode(0o777))
        yield tmp
        if not target.exists():
            os.replace(tmp, target)
        elif not _exchange(tmp, target):
            _swap_by_renaming(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # the filled temporary, or the old target
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    False where the system or file system has no such call (the caller then renames).
    """
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_by_renaming(tmp: Path, target: Path) -> None:
    """Replace ``target`` by ``tmp`` in two renames; the old target waits aside, locked."""
    old = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.old"
    fd = os.open(target, os.O_RDONLY)
    try:
        _lock(fd, blocking=True)  # a kill between the renames leaves an unlocked .old
        os.replace(target, old)
        try:
            os.replace(tmp, target)
        except BaseException:
            os.replace(old, target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        os.close(fd)


def _recover_interrupted_swap(target: Path) -> None:
    """Put back a previous ``target`` that a writer killed mid-swap left aside, or remove it.

    When ``target`` is missing, the newest unlocked ``.NAME.*.old`` is the previous
    directory and is renamed back; every other unlocked one is a leftover and removed.
    """
    if not target.exists():
        olds = []
        for cand in target.parent.glob(f".{glob_escape(target.name)}.*.old"):
            try:
                if cand.is_dir() and not cand.is_symlink():
                    olds.append((cand.stat().st_mtime, cand))
            except OSError:
                continue
        for _, cand in sorted(olds, reverse=True):
            try:
                fd = os.open(cand, os.O_RDONLY)
            except OSError:
                continue
            try:
                if _lock(fd, blocking=False):
                    os.replace(cand, target)
                    break
            except OSError:
                continue
            finally:
                os.close(fd)
    _remove_unlocked(target, "old")
