"""Metadata carried by every statistics payload: encoder fingerprint, projection, classes, mode."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from ghofl.errors import StatsFormatError, StatsValidationError

Mode = Literal["full", "pooled", "gram", "diag", "means"]
MODES: tuple[str, ...] = get_args(Mode)
#: Version 2 added the clipping bound (meta ``clip_norm``) and the ``n_clipped`` count.
#: Version 3 added the held-out section (meta ``holdout_fraction``, the ``holdout.*`` arrays)
#: and float32 transport of the float sums. Statistics that use neither are still written as
#: version 2 (:meth:`StatsMeta.written_version`), so older ghofl reads them.
SCHEMA_VERSION = 3
#: Oldest version that can hold a held-out section or float32 arrays.
HOLDOUT_SCHEMA_VERSION = 3
#: Version written for statistics without a held-out section (and float64 arrays).
PLAIN_SCHEMA_VERSION = 2
#: Largest held-out fraction: at least half of every client's samples stay for fitting.
MAX_HOLDOUT_FRACTION = 0.5
#: Oldest version still read; older metadata is upgraded on read (version 1 had no clipping).
MIN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class EncoderInfo:
    """Identity of the frozen encoder that produced the embeddings.

    Two payloads can be added only if their encoders have the same :meth:`fingerprint`.

    Parameters
    ----------
    name : str
        Human-readable encoder name, e.g. ``"efficientnet-lite0"``.
    dim : int
        Embedding dimension d produced by the encoder.
    weights_hash : str
        Hash of the weights file (or ``""`` when unknown).
    preprocessing : str
        Description of the preprocessing (resize, normalisation) applied before the encoder.
    resolution : int or None
        Input resolution in pixels for image encoders.
    """

    name: str
    dim: int
    weights_hash: str = ""
    preprocessing: str = ""
    resolution: int | None = None

    def fingerprint(self) -> str:
        """Return a 16-hex-digit SHA-256 digest of the canonical JSON of all fields."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dictionary."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderInfo:
        """Inverse of :meth:`to_dict`; every field is type-checked (no coercion of strings)."""
        where = "encoder metadata"
        if not isinstance(data, dict):
            raise StatsFormatError(
                f"{where} must be a JSON object; got {_json_type(data)}; expected keys name, "
                "dim, weights_hash, preprocessing, resolution"
            )
        try:
            return cls(
                name=_json_str(data, "name", where),
                dim=_json_int(data, "dim", where, lo=1),
                weights_hash=_json_str(data, "weights_hash", where, default=""),
                preprocessing=_json_str(data, "preprocessing", where, default=""),
                resolution=_json_int(data, "resolution", where, lo=1, optional=True),
            )
        except KeyError as exc:
            raise StatsFormatError(
                f"encoder metadata is malformed (missing {exc}); expected keys name, dim, "
                "weights_hash, preprocessing, resolution"
            ) from exc


@dataclass(frozen=True)
class StatsMeta:
    """Metadata of a :class:`~ghofl.stats.ClientStats` value.

    Parameters
    ----------
    mode : {"full", "pooled", "gram", "diag", "means"}
        Upload mode: ``full`` holds per-class second moments S_c (every head),
        ``pooled`` holds per-class diagonals D_c and the global B (no QDA),
        ``gram`` holds only the global B (no QDA, no naive Bayes),
        ``diag`` holds only D_c (naive Bayes only), ``means`` no second moment.
    dim : int
        Dimension of the statistics space: d, or k under a random projection.
    classes : tuple of str
        Class names; label ``c`` refers to ``classes[c]``.
    encoder : EncoderInfo or None
        Encoder that produced the embeddings (``None`` for raw features).
    projection : ProjectionSpec or None
        Public random projection applied before accumulation, if any.
    schema_version : int
        Version of the statistics schema.
    clip_norm : float or None
        Per-sample L2 clipping bound R the client applied in the statistics space (after the
        projection, if any): every accumulated vector z satisfies ‖z‖ ≤ R. ``None``: no
        clipping. Payloads with different bounds cannot be added.
    holdout_fraction : float, default 0.0
        Fraction f in (0, 0.5] of its samples each client held out (by the seeded per-sample
        rule of :func:`~ghofl.stats.accumulate.holdout_mask`) and uploaded the sums of
        separately, in :attr:`ClientStats.holdout <ghofl.stats.ClientStats.holdout>`, besides
        the sums over all its samples; 0.0: no held-out section. Payloads with different
        fractions cannot be added. Metadata written before version 3 reads as 0.0.
    """

    mode: Mode
    dim: int
    classes: tuple[str, ...]
    encoder: EncoderInfo | None = None
    projection: ProjectionSpec | None = None
    schema_version: int = field(default=SCHEMA_VERSION)
    clip_norm: float | None = None
    holdout_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise StatsValidationError(
                f"statistics mode must be one of {', '.join(MODES)}; got {self.mode!r}"
            )
        if int(self.dim) < 1:
            raise StatsValidationError(f"statistics dim must be >= 1; got {self.dim}")
        if len(self.classes) < 1:
            raise StatsValidationError(
                "statistics need at least one class; got an empty class list"
            )
        if len(set(self.classes)) != len(self.classes):
            raise StatsValidationError(f"class names must be unique; got {list(self.classes)}")
        if self.projection is not None and self.projection.dim != self.dim:
            raise StatsValidationError(
                f"projection output dim {self.projection.dim} does not match statistics "
                f"dim {self.dim}"
            )
        if self.encoder is not None and self.projection is None and self.encoder.dim != self.dim:
            raise StatsValidationError(
                f"encoder {self.encoder.name!r} produces d={self.encoder.dim} but the statistics "
                f"have dim {self.dim}"
            )
        if self.clip_norm is not None:
            object.__setattr__(self, "clip_norm", _check_clip_norm(self.clip_norm))
        object.__setattr__(
            self, "holdout_fraction", check_holdout_fraction(self.holdout_fraction)
        )

    @property
    def num_classes(self) -> int:
        """Number of classes C."""
        return len(self.classes)

    @property
    def has_holdout(self) -> bool:
        """Whether statistics of this metadata carry a held-out section (fraction > 0)."""
        return self.holdout_fraction > 0.0

    def with_mode(self, mode: Mode) -> StatsMeta:
        """The same metadata with upload mode ``mode``."""
        return StatsMeta(
            mode, self.dim, self.classes, self.encoder, self.projection, clip_norm=self.clip_norm,
            holdout_fraction=self.holdout_fraction,
        )

    def with_holdout(self, fraction: float) -> StatsMeta:
        """The same metadata with ``holdout_fraction`` set to ``fraction`` (0.0: none)."""
        return StatsMeta(
            self.mode, self.dim, self.classes, self.encoder, self.projection,
            clip_norm=self.clip_norm, holdout_fraction=fraction,
        )

    def without_holdout(self) -> StatsMeta:
        """The metadata of the parts of held-out statistics: ``holdout_fraction`` 0.0.

        The parts are its held-out section and the fitting part; otherwise identical.
        """
        return self if not self.has_holdout else self.with_holdout(0.0)

    def written_version(self) -> int:
        """Schema version written for statistics of this metadata: the oldest that can hold them.

        :data:`PLAIN_SCHEMA_VERSION` without a held-out section, so that files that need no new
        feature stay readable by older ghofl.
        """
        return HOLDOUT_SCHEMA_VERSION if self.has_holdout else PLAIN_SCHEMA_VERSION

    def differences(self, other: StatsMeta) -> list[str]:
        """List, in words, every field in which ``other`` differs from ``self``."""
        out: list[str] = []
        if self.schema_version != other.schema_version:
            out.append(f"schema version ({self.schema_version} vs {other.schema_version})")
        if self.mode != other.mode:
            out.append(f"mode ({self.mode!r} vs {other.mode!r})")
        if self.dim != other.dim:
            out.append(f"dim ({self.dim} vs {other.dim})")
        if self.classes != other.classes:
            if len(self.classes) != len(other.classes):
                out.append(f"number of classes ({len(self.classes)} vs {len(other.classes)})")
            else:
                diff = [(a, b) for a, b in zip(self.classes, other.classes, strict=True) if a != b]
                out.append(f"class names (first difference {diff[0][0]!r} vs {diff[0][1]!r})")
        fa = None if self.encoder is None else self.encoder.fingerprint()
        fb = None if other.encoder is None else other.encoder.fingerprint()
        if fa != fb:
            out.append(
                f"encoder ({_describe_encoder(self.encoder)} vs {_describe_encoder(other.encoder)})"
            )
        if self.projection != other.projection:
            out.append(f"projection ({self.projection} vs {other.projection})")
        if self.clip_norm != other.clip_norm:
            a, b = _describe_clip(self.clip_norm), _describe_clip(other.clip_norm)
            if a == b:  # bounds that differ beyond the short form: show them in full
                a, b = f"R={self.clip_norm!r}", f"R={other.clip_norm!r}"
            out.append(f"clipping bound ({a} vs {b})")
        if self.holdout_fraction != other.holdout_fraction:
            out.append(
                f"held-out fraction ({_describe_holdout(self.holdout_fraction)} vs "
                f"{_describe_holdout(other.holdout_fraction)})"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields.

        ``schema_version`` is :meth:`written_version`, and ``holdout_fraction`` is present only
        when > 0, so metadata without a held-out section is exactly what version 2 wrote (same
        digests, readable by older ghofl).
        """
        out: dict[str, Any] = {
            "schema_version": self.written_version(),
            "mode": self.mode,
            "dim": self.dim,
            "classes": list(self.classes),
            "encoder": None if self.encoder is None else self.encoder.to_dict(),
            "projection": None if self.projection is None else self.projection.to_dict(),
            "clip_norm": self.clip_norm,
        }
        if self.has_holdout:
            out["holdout_fraction"] = self.holdout_fraction
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StatsMeta:
        """Inverse of :meth:`to_dict`.

        Metadata of an older supported schema version is upgraded to :data:`SCHEMA_VERSION`
        (version 1 had no clipping: ``clip_norm`` is ``None``), so old payloads combine with
        new ones.

        Raises
        ------
        StatsFormatError
            A key is missing or malformed, or the schema version is not supported.
        """
        from ghofl.stats.projection import ProjectionSpec

        where = "statistics metadata"
        if not isinstance(data, dict):
            raise StatsFormatError(
                f"{where} must be a JSON object; got {_json_type(data)}; the file was not "
                "written by ghofl or is corrupt"
            )
        try:
            version = _json_int(data, "schema_version", where, lo=-(2**31))
            if not MIN_SCHEMA_VERSION <= version <= SCHEMA_VERSION:
                raise StatsFormatError(
                    f"statistics metadata has schema version {version}; this ghofl reads "
                    f"versions {MIN_SCHEMA_VERSION} to {SCHEMA_VERSION}; re-create the "
                    "statistics with this ghofl, or upgrade ghofl if they are newer"
                )
            mode = _json_str(data, "mode", where)
            classes = data["classes"]
            if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
                raise StatsFormatError(
                    f"{where} has classes of type {_json_type(classes)}; expected a list of "
                    "strings; the file was not written by ghofl or is corrupt"
                )
            if len(classes) > MAX_CLASSES:
                raise StatsFormatError(
                    f"{where} lists {len(classes)} classes, more than the {MAX_CLASSES} "
                    "supported; the file is corrupt"
                )
            enc = data.get("encoder")
            proj = data.get("projection")
            if proj is not None:
                pw = "projection metadata"
                if not isinstance(proj, dict):
                    raise StatsFormatError(
                        f"{pw} must be a JSON object or null; got {_json_type(proj)}; the "
                        "file is corrupt"
                    )
                for key, lo in (("seed", 0), ("input_dim", 1), ("dim", 1)):
                    _json_int(proj, key, pw, lo=lo, hi=2**64 - 1 if key == "seed" else MAX_DIM)
                _json_str(proj, "generator", pw, default="")
            fields: dict[str, Any] = {
                "mode": mode,
                "dim": _json_int(data, "dim", where, lo=1),
                "classes": tuple(classes),
                "encoder": None if enc is None else EncoderInfo.from_dict(enc),
                "projection": None if proj is None else ProjectionSpec.from_dict(proj),
            }
        except StatsFormatError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise StatsFormatError(
                f"statistics metadata is malformed (missing or invalid {exc}); "
                "the file was not written by ghofl or is corrupt"
            ) from exc
        holdout = _parse_holdout(data.get("holdout_fraction"))
        if holdout > 0.0 and version < HOLDOUT_SCHEMA_VERSION:
            raise StatsFormatError(
                f"{where} has schema version {version} but a holdout_fraction, which version "
                f"{HOLDOUT_SCHEMA_VERSION} introduced; the file is corrupt, re-create it with ghofl"
            )
        return cls(**fields, clip_norm=_parse_clip_norm(data.get("clip_norm")),
                   holdout_fraction=holdout)


#: Largest dimension and number of classes read from metadata.
MAX_DIM = 1 << 20
MAX_CLASSES = 1 << 20


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "an integer", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _json_int(
    data: dict[str, Any], key: str, where: str, *, lo: int, hi: int = MAX_DIM,
    optional: bool = False,
) -> Any:
    """``data[key]`` if it is a JSON integer in [lo, hi] (``None`` allowed when optional)."""
    value = data.get(key) if optional else data[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise StatsFormatError(
            f"{where} is malformed: {key} is {value!r:.60}; expected an integer from {lo} to "
            f"{hi}; the file was not written by ghofl or is corrupt"
        )
    return value


def _json_str(data: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    """``data[key]`` if it is a string (``default`` when absent and a default is given)."""
    value = data[key] if default is None else data.get(key, default)
    if not isinstance(value, str):
        raise StatsFormatError(
            f"{where} is malformed: {key} is {_json_type(value)}; expected a string; the file "
            "was not written by ghofl or is corrupt"
        )
    return value


def _check_clip_norm(value: Any) -> float:
    """``value`` as a float if it is a finite number > 0, else StatsValidationError."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not ok or not (math.isfinite(float(value)) and float(value) > 0):
        raise StatsValidationError(
            f"clip_norm (the per-sample L2 clipping bound R) must be a finite number > 0; got "
            f"{value!r}; pass a positive bound, or None for no clipping"
        )
    return float(value)


def _parse_clip_norm(value: Any) -> float | None:
    """Read ``clip_norm`` from metadata JSON (absent or null: no clipping)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):  # JSON numbers
        raise StatsFormatError(
            f"statistics metadata has clip_norm {value!r}; expected a number or null; the file "
            "was not written by ghofl or is corrupt"
        )
    return float(value)


def check_holdout_fraction(value: Any) -> float:
    """``value`` as a float if it is 0 (no held-out section) or in (0, 0.5].

    Else :class:`StatsValidationError` naming the allowed range.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    f = float(value) if ok else math.nan
    if not (f == 0.0 or 0.0 < f <= MAX_HOLDOUT_FRACTION):
        raise StatsValidationError(
            f"the held-out fraction must be 0 (no held-out section) or a number in (0, "
            f"{MAX_HOLDOUT_FRACTION:g}]; got {value!r}; pass e.g. 0.2 to hold out a fifth of "
            "each client's samples"
        )
    return f


def _parse_holdout(value: Any) -> float:
    """Read ``holdout_fraction`` from metadata JSON (absent: 0.0, no held-out section)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StatsFormatError(
            f"statistics metadata has holdout_fraction {value!r:.60}; expected a number; the "
            "file was not written by ghofl or is corrupt"
        )
    try:
        return check_holdout_fraction(value)
    except StatsValidationError as exc:
        raise StatsFormatError(f"statistics metadata is malformed: {exc}") from None


def _describe_holdout(fraction: float) -> str:
    return "none" if fraction == 0.0 else f"f={fraction:g}"


def _describe_clip(clip_norm: float | None) -> str:
    return "none" if clip_norm is None else f"R={clip_norm:g}"


def _describe_encoder(enc: EncoderInfo | None) -> str:
    if enc is None:
        return "none"
    res = f"@{enc.resolution}" if enc.resolution else ""
    return f"{enc.name}{res} d={enc.dim} fingerprint {enc.fingerprint()}"


from ghofl.stats.projection import ProjectionSpec  # noqa: E402  (circular-safe re-export)
