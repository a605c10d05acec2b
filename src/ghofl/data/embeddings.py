"""Labelled embeddings: the ``.npz`` archive reader, validation, and label alignment.

An embeddings archive is an ``.npz`` holding ``x`` (n, d) numbers, ``y`` (n,) integer class
indices and optionally ``classes`` (C,) class names (``numpy.savez(path, x=..., y=...,
classes=...)``). Clients read their local embeddings with :func:`load_embeddings`, validate
them with :func:`check_labelled_embeddings`, and map the labels of a source that carries its
own class names onto the federation's class list with :func:`align_labels`.
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import GhoflError, InputError

__all__ = [
    "Embeddings",
    "align_labels",
    "check_labelled_embeddings",
    "load_embeddings",
]

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: The fix suggested when a label is out of range, unless the caller gives its own.
DEFAULT_RANGE_HINT = "give the full class list (every class any client has)"


@dataclass(frozen=True)
class Embeddings:
    """Arrays read from an embeddings archive.

    Attributes
    ----------
    path : Path
    x : ndarray, shape (n, d)
        As stored (validated later against the class count).
    y : ndarray of int64, shape (n,)
    classes : tuple of str or None
        The optional ``classes`` array of the archive.
    """

    path: Path
    x: NDArray[Any]
    y: NDArray[np.int64]
    classes: tuple[str, ...] | None


def load_embeddings(path: str | Path, what: str = "embeddings") -> Embeddings:
    """Read an ``.npz`` holding ``x`` (n, d), ``y`` (n,) and optionally ``classes`` (C,).

    Parameters
    ----------
    path : str or Path
        The archive.
    what : str, default "embeddings"
        What named the file (the CLI option ``"--embeddings"``), for messages.

    Returns
    -------
    Embeddings
        ``x`` as stored (2-D, numeric), ``y`` as int64 (n,), ``classes`` or ``None``.

    Raises
    ------
    InputError
        Missing, unreadable or malformed archive; the message names the file and the fix.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} file '{path}' does not exist; check the path")
    if path.is_dir():
        raise InputError(f"{what} path '{path}' is a directory; give an .npz file")
    fix = "write it with numpy.savez(path, x=embeddings, y=labels)"
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise InputError(f"'{path}' holds a single array, not an .npz archive; {fix}")
        with loaded as z:
            missing = [k for k in ("x", "y") if k not in z.files]
            if missing:
                held = ", ".join(z.files) or "nothing"
                raise InputError(
                    f"'{path}' has no array {missing[0]!r} (it holds: {held}); {fix}"
                )
            x = z["x"]
            y = z["y"]
            classes = z["classes"] if "classes" in z.files else None
    except GhoflError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise InputError(
            f"'{path}' is not a readable .npz archive ({_one_line(exc)}); {fix}"
        ) from exc
    if not isinstance(x, np.ndarray):  # pragma: no cover - np.load always gives arrays
        raise InputError(f"'{path}': x is not an array; {fix}")
    if x.ndim != 2:
        raise InputError(f"'{path}': x must be a 2-D array (n, d); got shape {x.shape}")
    if x.dtype.kind not in "fiu":
        raise InputError(f"'{path}': x must hold numbers; got dtype {x.dtype}")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise InputError(
            f"'{path}': y must have shape ({x.shape[0]},) to match x; got {y.shape}"
        )
    if y.size and y.dtype.kind not in "iu" and not _integral_floats(y):
        raise InputError(f"'{path}': y must hold integer class indices; got dtype {y.dtype}")
    return Embeddings(path, x, y.astype(np.int64), _archive_classes(path, classes))


def _integral_floats(y: NDArray[Any]) -> bool:
    return bool(y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)))


def _archive_classes(path: Path, classes: NDArray[Any] | None) -> tuple[str, ...] | None:
    if classes is None:
        return None
    if classes.ndim != 1 or classes.dtype.kind not in "USiu" or classes.size == 0:
        raise InputError(
            f"'{path}': classes must be a non-empty 1-D array of names (strings); got shape "
            f"{classes.shape} and dtype {classes.dtype}"
        )
    names = tuple(str(c) for c in classes.tolist())
    if len(set(names)) != len(names):
        raise InputError(f"'{path}': class names must be unique; got {list(names)}")
    return names


def check_labelled_embeddings(
    x: NDArray[Any], y: NDArray[Any], num_classes: int, what: str = "input",
    range_hint: str = DEFAULT_RANGE_HINT,
) -> tuple[F64, I64]:
    """Validate embeddings and labels; return them as float64 (n, d) and int64 (n,).

    Parameters
    ----------
    x : array_like, shape (n, d)
        Finite numeric embeddings.
    y : array_like of int, shape (n,)
        Labels in ``0..num_classes-1``.
    num_classes : int
    what : str
        Name used in messages, e.g. ``"training"``.
    range_hint : str
        The fix suggested when a label is out of range.

    Returns
    -------
    x : ndarray of float64, shape (n, d)
    y : ndarray of int64, shape (n,)

    Raises
    ------
    InputError
        Naming the problem (shape, dtype, NaN, label range) and the fix.
    """
    xa = np.asarray(x)
    ya = np.asarray(y)
    if xa.ndim != 2:
        raise InputError(f"{what} embeddings must be a 2-D array (n, d); got shape {xa.shape}")
    if xa.dtype.kind not in "fiu":
        raise InputError(f"{what} embeddings must be numeric; got dtype {xa.dtype}")
    if ya.ndim != 1 or ya.shape[0] != xa.shape[0]:
        raise InputError(
            f"{what} labels must have shape ({xa.shape[0]},) to match the embeddings; "
            f"got {ya.shape}"
        )
    x64: F64 = np.asarray(xa, dtype=np.float64)
    # Checked a few thousand rows at a time (a temporary that stays in cache); the rows
    # themselves only to name the first bad one.
    step = 4096
    if not all(bool(np.isfinite(x64[i : i + step]).all()) for i in range(0, x64.shape[0], step)):
        finite = np.isfinite(x64).all(axis=1)
        raise InputError(
            f"{what} embeddings contain NaN or infinite values (first bad row "
            f"{int(np.flatnonzero(~finite)[0])}); fix the encoder output or drop those rows"
        )
    integral = ya.dtype.kind == "f" and np.all(np.isfinite(ya)) and np.all(ya == np.round(ya))
    if ya.size and ya.dtype.kind not in "iu" and not integral:
        raise InputError(f"{what} labels must be integers; got dtype {ya.dtype}")
    y64: I64 = ya.astype(np.int64)
    if y64.size and y64.min() < 0:
        raise InputError(
            f"{what} labels must be class indices 0..{num_classes - 1}; got the negative "
            f"label {int(y64.min())}"
        )
    if y64.size and y64.max() >= num_classes:
        raise InputError(
            f"{what} label {int(y64.max())} is out of range for {num_classes} classes "
            f"(0..{num_classes - 1}); {range_hint}"
        )
    return x64, y64


def align_labels(
    y: NDArray[Any], source_classes: Sequence[str] | None, classes: Sequence[str], what: str
) -> I64:
    """Map labels that index ``source_classes`` to indices into the federation's ``classes``.

    A client's data may carry its own class list (an ImageFolder's sorted class folders, the
    ``classes`` array of an archive, a text reader's names); it may lack classes the
    federation has, so its label ``i`` means the class named ``source_classes[i]``, which is
    looked up by name in ``classes``.

    Parameters
    ----------
    y : array of int, shape (n,)
        Labels into ``source_classes`` (or into ``classes`` when ``source_classes`` is None).
    source_classes : sequence of str or None
        Class names of the source; ``None``: the labels already index ``classes``.
    classes : sequence of str
        The federation's class list.
    what : str
        The source, for messages (e.g. ``"'data/site-3'"``).

    Returns
    -------
    ndarray of int64, shape (n,)
        Labels into ``classes``.

    Raises
    ------
    InputError
        The source names a class that is not in ``classes`` (both lists are named), or a label
        is not an index into ``source_classes``.
    """
    y64 = np.asarray(y).astype(np.int64)
    if source_classes is None:
        return y64
    src, fed = tuple(source_classes), tuple(classes)
    if src == fed:
        return y64
    unknown = [c for c in src if c not in fed]
    if unknown:
        raise InputError(
            f"{what} has the classes {_names(src)}, which disagree with the federation's class "
            f"list {_names(fed)} (e.g. {unknown[0]!r} is not in it); give every client the "
            "same class list and name the classes of its data the same way"
        )
    if y64.size and (y64.min() < 0 or y64.max() >= len(src)):
        raise InputError(
            f"{what} has labels from {int(y64.min())} to {int(y64.max())} but names only "
            f"{len(src)} classes; its labels must index its class names"
        )
    lookup = np.asarray([fed.index(c) for c in src], dtype=np.int64)
    out: I64 = lookup[y64]
    return out


def _names(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:8])
    return f"[{shown}, ... ({len(names)} in all)]" if len(names) > 8 else f"[{shown}]"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
