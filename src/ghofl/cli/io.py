"""File and option handling shared by the CLI commands: embedding archives, class lists,
``--param`` values, atomic JSON and directory writes, plain-text tables."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, GhoflError, InputError, StatsValidationError
from ghofl.simulation import head_defaults
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import atomic_write, load_stats
from ghofl.stats.meta import Mode
from ghofl.stats.schema import SCHEMAS, schema_for

MANIFEST = "manifest.json"
MODEL_FORMAT = "ghofl.model"
MODEL_FORMAT_VERSION = 1


# ---------------------------------------------------------------------- embeddings
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


def load_embeddings(path: Path, option: str) -> Embeddings:
    """Read an ``.npz`` holding ``x`` (n, d), ``y`` (n,) and optionally ``classes`` (C,).

    Parameters
    ----------
    path : Path
        The archive.
    option : str
        The option that named it (``"--embeddings"``), for messages.

    Raises
    ------
    InputError
        Missing, unreadable or malformed archive; the message names the file and the fix.
    """
    if not path.exists():
        raise InputError(f"{option} file '{path}' does not exist; check the path")
    if path.is_dir():
        raise InputError(f"{option} path '{path}' is a directory; give an .npz file")
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


def resolve_classes(
    option_classes: str | None, num_classes: int | None, archives: Sequence[Embeddings]
) -> tuple[str, ...]:
    """The class list: ``--classes``, else the archive's ``classes``, else ``--num-classes``,
    else ``max(y) + 1`` over the archives.

    Raises
    ------
    ConfigError
        ``--classes`` and ``--num-classes`` disagree, or a list is malformed.
    InputError
        Archives carry different class lists.
    """
    if option_classes is not None:
        names = tuple(s.strip() for s in option_classes.split(","))
        if not all(names):
            raise ConfigError(
                f"--classes must be a comma-separated list of non-empty names; got "
                f"{option_classes!r}"
            )
        if len(set(names)) != len(names):
            raise ConfigError(f"--classes has duplicate names: {option_classes!r}")
        if num_classes is not None and num_classes != len(names):
            raise ConfigError(
                f"--num-classes {num_classes} disagrees with --classes, which names "
                f"{len(names)} classes; give only one of them"
            )
        return names
    stored = [a for a in archives if a.classes is not None]
    for a in stored[1:]:
        if a.classes != stored[0].classes:
            raise InputError(
                f"'{a.path}' and '{stored[0].path}' store different class lists; "
                "embed every split with the same class list"
            )
    if stored:
        names = stored[0].classes or ()
        if num_classes is not None and num_classes != len(names):
            raise ConfigError(
                f"--num-classes {num_classes} disagrees with '{stored[0].path}', which stores "
                f"{len(names)} class names; drop --num-classes or fix the archive"
            )
        return names
    if num_classes is not None:
        if num_classes < 1:
            raise ConfigError(f"--num-classes must be >= 1; got {num_classes}")
        return tuple(str(i) for i in range(num_classes))
    top = max((int(a.y.max()) for a in archives if a.y.size), default=0)
    return tuple(str(i) for i in range(max(top, 0) + 1))


def read_stats(path: Path) -> ClientStats:
    """:func:`~ghofl.stats.load_stats`, with the file named in validation errors too."""
    try:
        return load_stats(path)
    except StatsValidationError as exc:
        raise StatsValidationError(f"'{path}' holds invalid statistics: {exc}") from exc


def check_mode(mode: str) -> Mode:
    """Validate ``--mode`` against the upload modes of :data:`~ghofl.stats.schema.SCHEMAS`."""
    try:
        return schema_for(mode).mode
    except StatsValidationError:
        raise ConfigError(
            f"--mode must be one of {', '.join(SCHEMAS)}; got {mode!r}"
        ) from None


# ---------------------------------------------------------------------- --param
def parse_param_options(
    items: Sequence[str] | None, heads: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Parse ``--param HEAD.KEY=VALUE`` options into ``{head: {key: value}}``.

    Each value is converted to the type of the head's default for that key (int, float, bool,
    str); ``auto`` is passed as the string ``"auto"``.

    Raises
    ------
    ConfigError
        Malformed option, head not in ``heads``, unknown key (listing the valid ones), value
        of the wrong type, or a key given twice.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items or ():
        lhs, eq, raw = item.partition("=")
        head, dot, key = lhs.partition(".")
        if not (eq and dot and head.strip() and key.strip()):
            raise ConfigError(
                f"--param {item!r} must look like HEAD.KEY=VALUE, e.g. lda.shrinkage=0.1"
            )
        head, key = head.strip(), key.strip()
        if head not in heads:
            raise ConfigError(
                f"--param {item!r} names head {head!r}, which is not among the heads to fit "
                f"({', '.join(heads)}); add it to --heads or drop the --param"
            )
        defaults = head_defaults(head)
        if key not in defaults:
            valid = ", ".join(sorted(defaults)) or "none"
            raise ConfigError(
                f"--param {item!r}: head {head!r} has no parameter {key!r}; valid keys: {valid}"
            )
        if key in out.get(head, {}):
            raise ConfigError(f"--param {head}.{key} is given twice; give it once")
        out.setdefault(head, {})[key] = parse_value(raw.strip(), defaults[key], f"--param {item!r}")
    return out


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def parse_value(raw: str, default: Any, where: str) -> Any:
    """Convert ``raw`` to the type of ``default`` (see :func:`parse_param_options`)."""
    if raw == "auto":
        return "auto"
    if isinstance(default, bool):
        if raw.lower() in _TRUE | _FALSE:
            return raw.lower() in _TRUE
        raise ConfigError(f"{where}: expected true or false; got {raw!r}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{where}: expected an integer; got {raw!r}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{where}: expected a number (or auto); got {raw!r}") from None
    if isinstance(default, str):
        return raw
    return _guess(raw)


def _guess(raw: str) -> Any:
    """Value of a parameter whose default gives no type (``None``): JSON if it parses."""
    if raw.lower() in ("none", "null"):
        return None
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    try:
        return json.loads(raw)
    except ValueError:
        return raw


# ---------------------------------------------------------------------- atomic outputs
def _umask_mode(base: int) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


def check_output_file(path: Path, option: str) -> None:
    """Refuse an output path that is an existing directory (before any work)."""
    if path.is_dir():
        raise InputError(f"{option} '{path}' is a directory; give a file path")


def write_json(path: Path, obj: Any, option: str = "--json") -> None:
    """Write ``obj`` as indented JSON, atomically (temporary file, then rename)."""
    check_output_file(path, option)
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"

    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")
        os.chmod(tmp, _umask_mode(0o666))

    atomic_write(path, write)


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Refuse to replace anything but a ghofl model directory or an empty directory."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} '{path}' exists and is not a directory; choose another path")
    if path.is_dir() and any(path.iterdir()) and not (path / MANIFEST).is_file():
        raise InputError(
            f"refusing to replace {option} '{path}': it is a non-empty directory that is not a "
            f"ghofl model directory (no {MANIFEST}); choose another path"
        )


@contextmanager
def atomic_directory(target: Path, option: str = "--out") -> Iterator[Path]:
    """Yield a temporary directory beside ``target``; on success it replaces ``target``.

    On any failure the temporary directory is removed and ``target`` is left untouched.
    """
    check_output_dir(target, option)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(tmp, _umask_mode(0o777))
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


# ---------------------------------------------------------------------- text
def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A left-aligned plain-text table."""
    cells = [[str(h) for h in header]] + [[_cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
