"""Option handling shared by the CLI commands.

Class lists, ``--mode``, ``--param`` values, statistics files, output paths and plain-text tables.

Readers and writers that are not about options live in their layers: embeddings archives in
:mod:`ghofl.data.embeddings`, the model directory in :mod:`ghofl.model.directory`, atomic
writes in :mod:`ghofl.files`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ghofl.data.embeddings import Embeddings, load_embeddings
from ghofl.errors import ConfigError, InputError, StatsValidationError
from ghofl.files import write_json_atomic
from ghofl.heads.build import head_defaults
from ghofl.model.directory import check_model_target
from ghofl.model.manifest import file_sha256
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.codec import load_packed_stats, load_stats
from ghofl.stats.meta import Mode
from ghofl.stats.release import NoisyStats
from ghofl.stats.schema import SCHEMAS, schema_for

T = TypeVar("T")

__all__ = [
    "Embeddings",  # re-exported from ghofl.data.embeddings
    "check_mode",
    "check_output_dir",
    "check_output_file",
    "load_embeddings",  # re-exported from ghofl.data.embeddings
    "parse_param_options",
    "parse_value",
    "read_packed_stats",
    "read_stats",
    "resolve_classes",
    "table",
    "write_json",
]


def resolve_classes(
    option_classes: str | None, num_classes: int | None, archives: Sequence[Embeddings]
) -> tuple[str, ...]:
    """The class list.

    ``--classes``, else the archive's ``classes``, else ``--num-classes``, else
    ``max(y) + 1`` over the archives.

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
    return _named(load_stats, path)


def read_packed_stats(path: Path) -> PackedStats:
    """:func:`~ghofl.stats.load_packed_stats`, with the file named as :func:`read_stats` does."""
    return _named(load_packed_stats, path)


def _named(load: Callable[[Path], T], path: Path) -> T:
    try:
        return load(path)
    except StatsValidationError as exc:
        raise StatsValidationError(f"'{path}' holds invalid statistics: {exc}") from exc


def read_total_arg(path: Path) -> tuple[ClientStats, dict[str, Any]]:
    """A total for the server side (a statistics file or a store) and what a model records of it.

    Stores are checked and read with :func:`ghofl.store.read_total_and_head` (one whose parts
    disagree is refused); validation errors name the path. The record (for the manifest's
    ``stats`` entry) is ``{"source": path}``, plus for a store the head digest and count of
    the contributions the total sums (``store_head``, ``contributions``).
    """
    from ghofl.store import is_store, read_total_and_head

    recorded: dict[str, Any] = {"source": str(path)}
    if not is_store(path):
        return read_stats(path), recorded
    try:
        total, head = read_total_and_head(path)
    except StatsValidationError as exc:
        raise StatsValidationError(f"'{path}' holds invalid statistics: {exc}") from exc
    if head is not None:
        recorded.update(store_head=head.digest, contributions=head.count)
    return total, recorded


# ---------------------------------------------------------------------- DP releases
#: The option of ``ghofl fit`` naming a privacy report kept away from its release.
PRIVACY_REPORT_FLAG = "--privacy-report"
_WRITER = "ghofl aggregate --dp-epsilon"


def privacy_report_path(release: Path) -> Path:
    """The privacy report's path for a release written to ``release``: beside it.

    ``total.ghs`` -> ``total.privacy.json`` (``<stem>.privacy.json``).
    """
    return release.with_name(f"{release.stem}.privacy.json")


def release_privacy(path: Path, stats: ClientStats, report: Path | None
                    ) -> tuple[dict[str, Any] | None, Path | None]:
    """The manifest's ``privacy`` entry of a model fitted from the total read from ``path``.

    A noised release (:class:`~ghofl.stats.release.NoisyStats` with noise levels) is looked
    up in its privacy report: ``report``, else the one beside it (:func:`privacy_report_path`),
    which must record the SHA-256 of ``path``'s bytes (``out_sha256``); its ``privacy`` dict
    (:meth:`~ghofl.privacy.PrivateRelease.to_dict`: spent ε and δ, σ per block, mode,
    minimum-count rule) is the entry. When no report is beside the release, the entry records
    the noise levels of the file's header only (``budget_recorded`` false) and the missing
    report's path is returned with it (the caller warns).

    Returns
    -------
    privacy : dict or None
        The entry; ``None`` for exact statistics.
    missing : Path or None
        The report looked for and not found, or ``None``.

    Raises
    ------
    ConfigError
        ``report`` is given for exact statistics.
    InputError
        ``report`` does not exist, a report is not one ``ghofl aggregate --dp-epsilon``
        wrote, or it records another file's SHA-256.
    """
    noised = isinstance(stats, NoisyStats) and bool(stats.noise_sigma)
    if not noised:
        if report is not None:
            raise ConfigError(
                f"{PRIVACY_REPORT_FLAG} '{report}' is given for '{path}', which holds exact "
                "statistics (its header records no noise): a report cannot make exact "
                f"statistics private; drop {PRIVACY_REPORT_FLAG}, or fit the noised release "
                f"that {_WRITER} wrote")
        return None, None
    assert isinstance(stats, NoisyStats)
    found = privacy_report_path(path) if report is None else report
    if not found.is_file():
        if report is not None:
            raise InputError(f"{PRIVACY_REPORT_FLAG} '{report}' is not a file; give the "
                             f"privacy report that {_WRITER} wrote with '{path}'")
        return {"budget_recorded": False, "sigma": dict(stats.noise_sigma)}, found
    recorded = _read_report(found)
    digest = file_sha256(path)
    if recorded["out_sha256"] != digest:
        raise InputError(
            f"the privacy report '{found}' belongs to another release than '{path}' (it "
            f"records SHA-256 {str(recorded['out_sha256'])[:12]}…, the file has "
            f"{digest[:12]}…); give the report written with '{path}' "
            f"({PRIVACY_REPORT_FLAG} PATH), or fit the release it records")
    return dict(recorded["privacy"]), None


def _read_report(path: Path) -> dict[str, Any]:
    """The JSON object of a privacy report, with a ``privacy`` dict and ``out_sha256``."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        report = None
    if not (isinstance(report, dict) and isinstance(report.get("privacy"), dict)
            and isinstance(report.get("out_sha256"), str)):
        raise InputError(f"'{path}' is not a privacy report of {_WRITER} (a JSON object "
                         "with 'privacy' and 'out_sha256'); give the report written with "
                         "the release")
    return report


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
    str; a number for a parameter whose default is a string such as ``"auto"`` becomes a
    float); ``auto`` is passed as the string ``"auto"``.

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
        # a number given for a rule-valued parameter (shrinkage "auto" -> 0.3): the heads
        # never rewrite their parameters, so the recorded value is the number itself
        try:
            number = float(raw)
        except ValueError:
            return raw
        return number if math.isfinite(number) else raw
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


# ---------------------------------------------------------------------- outputs
def check_output_file(path: Path, option: str) -> None:
    """Refuse an output path that is an existing directory (before any work)."""
    if path.is_dir():
        raise InputError(f"{option} '{path}' is a directory; give a file path")


def write_json(path: Path, obj: Any, option: str = "--json") -> None:
    """Write ``obj`` as indented JSON, atomically (:func:`ghofl.files.write_json_atomic`)."""
    check_output_file(path, option)
    write_json_atomic(path, obj, indent=2)


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Refuse to replace anything but a ghofl model directory or an empty directory."""
    check_model_target(path, option)


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

