"""The header that travels with a :class:`ClientStats`, declared once for every transport.

A statistics payload is its arrays (:mod:`ghofl.stats.transport`) plus a small header: the
metadata, the clipping counts and how the float sums were rounded. :class:`StatsHeader` is
that header; :data:`HEADER_FIELDS` declares each of its entries once (its key in each
spelling, its value type, the value when the entry is absent and the check of a value), and
:meth:`StatsHeader.to_entries` / :meth:`StatsHeader.from_entries` render and parse it in the
two spellings ghofl uses:

``"file"``
    The ``__metadata__`` of a ``.ghs`` file (:mod:`ghofl.stats.codec`): string values,
    underscore keys, preceded by the file envelope ``format`` and ``schema_version``. The
    rendering is byte for byte what ghofl always wrote.
``"records"``
    The Flower ``ConfigRecord "ghofl-stats-meta"``
    (:mod:`ghofl.integrations.flower.records`): typed values (``int`` counts, ``str``
    names), hyphenated keys; the records envelope (``records-version``, shared with the
    protocol messages) is added and checked by the records codec.

Fields, as ``field (file key / records key): when absent``:

* ``meta`` (``meta`` / ``meta``): required; JSON of :class:`StatsMeta` in both;
* ``n_clipped`` (``n_clipped`` / ``n_clipped``): 0 (version-1 files lack it; records must
  hold it);
* ``holdout_n_clipped`` (``holdout_n_clipped`` / ``holdout-n_clipped``): no count (read as
  0); only with a held-out section;
* ``transport_dtype`` (``transport_dtype`` / ``transport-dtype``): ``"float64"``;
* ``rounded_to`` (``rounded_to`` / ``rounded-to``): ``"float64"``;
* ``noise_sigma`` (``noise_sigma`` / ``noise-sigma``): none (plain statistics); the public
  noise level σ_b of each block of a differentially private release (JSON object of block
  names to standard deviations, :class:`~ghofl.stats.release.NoisyStats`), since version 3;
* ``noise_shrinkage`` (``noise_shrinkage`` / ``noise-shrinkage``): none (not recorded; the
  heads then recover it); the intensity a_c by which the post-processing of a ``full``
  release shrank each class covariance (JSON list, one float in [0, 1] per class), only with
  ``noise_sigma``, since version 3.

Entries equal to their absent value are not written (except ``n_clipped``, always written),
so payloads that use no newer option are exactly what older ghofl wrote and older ghofl reads
them; absent entries read as their default, so everything older ghofl wrote still loads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ghofl.errors import GhoflError, StatsFormatError, StatsValidationError
from ghofl.stats._json import parse_json
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.meta import (
    HOLDOUT_SCHEMA_VERSION,
    MIN_SCHEMA_VERSION,
    SCHEMA_VERSION,
    StatsMeta,
)
from ghofl.stats.release import NoisyStats, noise_shrinkage_problem, noise_sigma_problem
from ghofl.stats.transport import (
    TRANSPORT_DTYPES,
    TRANSPORT_ROUNDING,
    packed_stats_from_tensors,
    rounding_name,
    stats_from_tensors,
    transport_dtype_name,
)

__all__ = [
    "FORMAT",
    "HEADER_FIELDS",
    "STYLES",
    "HeaderField",
    "StatsHeader",
    "Style",
    "check_envelope",
    "meta_from_entries",
]

#: Format tag of a statistics file (header entry ``format``).
FORMAT = "ghofl.stats"
Style = Literal["file", "records"]
STYLES: tuple[Style, ...] = ("file", "records")
#: Largest count an entry may hold (19 decimal digits, as files always allowed).
_MAX_COUNT = 10**19 - 1
_FIX = {"file": "the file is corrupt, re-create it with ghofl", "records": "it is malformed"}


@dataclass(frozen=True)
class HeaderField:
    """One entry of the statistics header, declared once for both spellings.

    Parameters
    ----------
    name : str
        Attribute of :class:`StatsHeader` (and the file key).
    record_key : str
        Key in the Flower record.
    kind : {"meta", "count", "dtype", "sigma", "shrinkage"}
        Value type: :class:`StatsMeta` (JSON text in both spellings), a non-negative ``int``
        (decimal text in files), a transport dtype name (``str``), the noise levels of a
        release (a dict of block names to floats; JSON text in both spellings) or its
        post-processing intensities (a tuple of floats; a JSON list in both spellings).
    absent : object
        Value when the entry is absent (``None`` for ``meta``: required).
    always : bool
        Written even when equal to ``absent`` (``n_clipped``).
    required : tuple of str
        Spellings in which the entry must be present.
    since : int
        File schema version that introduced the entry (files of older versions must not hold
        it, and files holding it are written with at least that version).
    """

    name: str
    record_key: str
    kind: Literal["meta", "count", "dtype", "sigma", "shrinkage"]
    absent: Any = None
    always: bool = False
    required: tuple[Style, ...] = ()
    since: int = MIN_SCHEMA_VERSION

    def key(self, style: Style) -> str:
        """The entry's key in ``style``."""
        return self.name if style == "file" else self.record_key

    def expected(self, style: Style) -> str:
        """What a value must be, in words (for messages)."""
        if self.kind == "count":
            return f"a non-negative {'decimal ' if style == 'file' else ''}integer"
        if self.kind == "dtype":
            others = [repr(n) for n in TRANSPORT_DTYPES if n != self.absent]
            return f"{' or '.join(others)} (or no entry for {self.absent})"
        if self.kind == "sigma":
            return "a JSON object of block names to noise standard deviations >= 0"
        if self.kind == "shrinkage":
            return "a JSON list of one intensity in [0, 1] per class"
        return "JSON of the statistics metadata"

    def check(self, value: Any) -> bool:
        """Whether ``value`` (already of the field's type) is valid for this field."""
        if value is None:
            return self.absent is None and self.kind != "meta"
        if self.kind == "count":
            return isinstance(value, int) and not isinstance(value, bool) \
                and 0 <= value <= _MAX_COUNT
        if self.kind == "dtype":
            return value in TRANSPORT_DTYPES
        if self.kind == "sigma":
            return bool(value) and noise_sigma_problem(value) is None
        if self.kind == "shrinkage":  # its length is checked against the metadata
            return isinstance(value, tuple) and noise_shrinkage_problem(value, len(value)) \
                is None
        return isinstance(value, StatsMeta)

    def written(self, value: Any) -> bool:
        """Whether an entry with ``value`` is written (not left to its absent default)."""
        return value is not None and (self.always or value != self.absent)


#: The entries of the statistics header, in the order they are written.
HEADER_FIELDS: tuple[HeaderField, ...] = (
    HeaderField("meta", "meta", "meta", required=("file", "records")),
    HeaderField("n_clipped", "n_clipped", "count", absent=0, always=True,
                required=("records",)),  # absent in version-1 files
    HeaderField("holdout_n_clipped", "holdout-n_clipped", "count"),
    HeaderField("transport_dtype", "transport-dtype", "dtype", absent="float64",
                since=HOLDOUT_SCHEMA_VERSION),
    HeaderField("rounded_to", "rounded-to", "dtype", absent="float64",
                since=HOLDOUT_SCHEMA_VERSION),
    HeaderField("noise_sigma", "noise-sigma", "sigma", since=HOLDOUT_SCHEMA_VERSION),
    HeaderField("noise_shrinkage", "noise-shrinkage", "shrinkage",
                since=HOLDOUT_SCHEMA_VERSION),
)


@dataclass(frozen=True)
class StatsHeader:
    """The header of a statistics payload (see :data:`HEADER_FIELDS` and the module docstring).

    Parameters
    ----------
    meta : StatsMeta
        The statistics metadata.
    n_clipped : int, default 0
        Samples the client's clipping scaled down.
    holdout_n_clipped : int or None, default None
        The same for the held-out section; ``None`` (no entry) without one, and for files
        written before the entry existed (read as 0).
    transport_dtype : {"float64", "float32"}, default "float64"
        Dtype of the float arrays as they travel.
    rounded_to : {"float64", "float32"}, default "float64"
        Coarsest dtype the float sums went through before, when coarser than the transport
        dtype: ``"float32"`` for float64 sums of float32-transported payloads (their total),
        so that the reader validates them with a tolerance for that rounding.
    noise_sigma : dict of str to float or None, default None
        The noise level σ_b of each block of a differentially private release
        (:class:`~ghofl.stats.release.NoisyStats`); ``None`` (no entry) for other statistics.
    noise_shrinkage : tuple of float or None, default None
        Its post-processing intensities, one per class
        (:attr:`~ghofl.stats.release.NoisyStats.noise_shrinkage`); ``None`` (no entry) when
        not recorded.

    Raises
    ------
    StatsValidationError
        A value fails its field's check, a held-out count comes without a held-out section,
        or intensities come without noise levels or not one per class.
    """

    meta: StatsMeta
    n_clipped: int = 0
    holdout_n_clipped: int | None = None
    transport_dtype: str = "float64"
    rounded_to: str = "float64"
    noise_sigma: Mapping[str, float] | None = None
    noise_shrinkage: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        """Check every value with its field's declared check."""
        for spec in HEADER_FIELDS:
            value = getattr(self, spec.name)
            if not spec.check(value):
                raise StatsValidationError(
                    f"the statistics header's {spec.name} is {value!r:.60}; expected "
                    f"{spec.expected('records')}"
                )
        if self.holdout_n_clipped is not None and not self.meta.has_holdout:
            raise StatsValidationError(
                "the statistics header has a holdout_n_clipped but its metadata has no "
                "held-out section (holdout_fraction); drop the count or add the section"
            )
        problem = _shrinkage_problem(self.meta, self.noise_sigma, self.noise_shrinkage)
        if problem is not None:
            raise StatsValidationError(f"the statistics header's noise_shrinkage {problem}")

    @classmethod
    def of(cls, stats: ClientStats, transport_dtype: Any = "float64") -> StatsHeader:
        """The header that travels with ``stats`` sent in ``transport_dtype``.

        ``rounded_to`` is set when the sums went through a coarser dtype before than the
        transport's (e.g. a float64 total of float32 payloads).

        Raises
        ------
        StatsValidationError
            ``transport_dtype`` is not float64 or float32.
        """
        tname = transport_dtype_name(transport_dtype)
        rounded = rounding_name(max(stats.rounding, TRANSPORT_ROUNDING[tname]))
        return cls(
            meta=stats.meta,
            n_clipped=int(stats.n_clipped),
            holdout_n_clipped=None if stats.holdout is None else int(stats.holdout.n_clipped),
            transport_dtype=tname,
            rounded_to=rounded if rounded != tname else "float64",
            noise_sigma=dict(stats.noise_sigma) if isinstance(stats, NoisyStats)
            and stats.noise_sigma else None,
            noise_shrinkage=stats.noise_shrinkage if isinstance(stats, NoisyStats)
            and stats.noise_sigma else None,
        )

    @property
    def schema_version(self) -> int:
        """The file schema version written: the oldest that holds every written entry.

        2 for statistics without a held-out section, float32 sums, such rounding or noise
        levels (readable by older ghofl), else 3.
        """
        since = [spec.since for spec in HEADER_FIELDS if spec.written(getattr(self, spec.name))]
        return max(self.meta.written_version(), *since)

    def stats_from(self, tensors: Mapping[str, Any]) -> ClientStats:
        """The statistics of this header and their arrays (validated; see ``stats_from_tensors``).

        A :class:`~ghofl.stats.release.NoisyStats` when the header holds noise levels.

        Raises
        ------
        StatsFormatError, StatsValidationError
            The arrays do not match the header or do not form valid statistics.
        """
        stats = stats_from_tensors(self.meta, dict(tensors), self.n_clipped,
                                   self.holdout_n_clipped or 0, self.transport_dtype,
                                   self.rounded_to)
        if not self.noise_sigma:
            return stats
        return NoisyStats.of(stats, self.noise_sigma, self.noise_shrinkage)

    def packed_stats_from(self, tensors: Mapping[str, Any]) -> PackedStats:
        """:meth:`stats_from` keeping the symmetric matrices packed (``packed_stats_from_tensors``).

        For a file reader: ``tensors`` are views of its own buffer, which the result keeps (no
        copy). Only for a header without noise levels (a payload, not a DP release).
        """
        assert not self.noise_sigma, "a DP release is read with stats_from"
        return packed_stats_from_tensors(self.meta, dict(tensors), self.n_clipped,
                                         self.holdout_n_clipped or 0, self.transport_dtype,
                                         self.rounded_to, copy=False)

    def to_entries(self, style: Style) -> dict[str, Any]:
        """The header's entries in ``style``, in :data:`HEADER_FIELDS` order.

        ``"file"``: strings, after the envelope ``format`` and ``schema_version``;
        ``"records"``: typed values, without the records envelope. Entries equal to their
        absent value are left out (``n_clipped`` excepted).
        """
        _check_style(style)
        out: dict[str, Any] = {}
        if style == "file":
            out = {"format": FORMAT, "schema_version": str(self.schema_version)}
        for spec in HEADER_FIELDS:
            value = getattr(self, spec.name)
            if spec.written(value):
                out[spec.key(style)] = _render(spec, value, style)
        return out

    @classmethod
    def from_entries(cls, entries: Mapping[str, Any], style: Style, where: str) -> StatsHeader:
        """Parse and validate the header entries ``entries`` in ``style``.

        Parameters
        ----------
        entries : mapping
            A file's ``__metadata__`` (``"file"``) or the records' ``ConfigRecord``
            (``"records"``; other keys, such as ``records-version``, are left to the caller).
        style : {"file", "records"}
        where : str
            The payload, as messages name it (the quoted path, ``"the ghofl statistics
            record"``).

        Raises
        ------
        StatsFormatError
            An entry is missing, of the wrong type or value, newer than the file's schema
            version, or a held-out count comes without a held-out section. The message names
            the entry and ``where``. (Errors in the metadata JSON's content are raised as
            :meth:`StatsMeta.from_dict` raises them in files; records prefix them with
            ``where``.)
        """
        _check_style(style)
        version = check_envelope(entries, where, FORMAT, "statistics") if style == "file" \
            else SCHEMA_VERSION
        values: dict[str, Any] = {}
        for spec in HEADER_FIELDS:
            key = spec.key(style)
            if key not in entries:
                if style in spec.required:
                    raise StatsFormatError(_missing(where, key, style))
                values[spec.name] = spec.absent
                continue
            values[spec.name] = value = _parse(spec, entries[key], style, where)
            if version < spec.since:
                raise StatsFormatError(
                    f"{where} has schema version {version} but a {key}, which version "
                    f"{spec.since} introduced; {_FIX[style]}"
                )
            if spec.name == "holdout_n_clipped" and not values["meta"].has_holdout:
                raise StatsFormatError(
                    f"{where} has the {_entry(key, style)} but no held-out section (its "
                    f"metadata has no holdout_fraction); {_FIX[style]}"
                )
            if spec.name == "noise_shrinkage":
                problem = _shrinkage_problem(values["meta"], values["noise_sigma"], value)
                if problem is not None:
                    raise StatsFormatError(
                        f"{where}'s {_entry(key, style)} {problem}; {_FIX[style]}")
        return cls(**values)

    @classmethod
    def keys(cls, style: Style) -> frozenset[str]:
        """Every key the header may hold in ``style`` (the file's include its envelope)."""
        _check_style(style)
        envelope = {"format", "schema_version"} if style == "file" else set()
        return frozenset(envelope | {spec.key(style) for spec in HEADER_FIELDS})


# ---------------------------------------------------------------------- the envelope
def check_envelope(
    header: Mapping[str, Any], where: str, expected: str, what: str, newest: int = SCHEMA_VERSION
) -> int:
    """Check a ghofl file header's ``format`` tag and ``schema_version``; return the version.

    Parameters
    ----------
    header : mapping
        The file's ``__metadata__``.
    where : str
        The quoted path, for messages.
    expected : str
        The format tag the file must carry (:data:`FORMAT`, or the head format).
    what : str
        What the file is (``"statistics"``, ``"head"``).
    newest : int, default :data:`~ghofl.stats.meta.SCHEMA_VERSION`
        Newest schema version read.

    Raises
    ------
    StatsFormatError
        Another format, or a schema version outside what this ghofl reads.
    """
    fmt = header.get("format")
    if fmt != expected:
        raise StatsFormatError(
            f"{where} is not a ghofl {what} file (format tag {fmt!r}, expected {expected!r})"
        )
    raw = header.get("schema_version", "-1")
    version = int(raw) if isinstance(raw, str) and re.fullmatch(r"-?[0-9]{1,9}", raw) else -1
    if version > newest:
        raise StatsFormatError(
            f"{where} uses {what} schema version {version}, newer than this ghofl supports "
            f"({newest}); upgrade ghofl"
        )
    if version < MIN_SCHEMA_VERSION:
        raise StatsFormatError(
            f"{where} uses {what} schema version {version}, older than this ghofl supports "
            f"({MIN_SCHEMA_VERSION}); re-create it with the current ghofl"
        )
    return version


def meta_from_entries(entries: Mapping[str, Any], style: Style, where: str) -> StatsMeta:
    """Only the ``meta`` entry of header ``entries`` (head files carry it too), checked.

    Raises
    ------
    StatsFormatError
        It is missing, not a string, or not valid metadata JSON (as in
        :meth:`StatsHeader.from_entries`).
    """
    _check_style(style)
    spec = HEADER_FIELDS[0]
    key = spec.key(style)
    if key not in entries:
        raise StatsFormatError(_missing(where, key, style))
    meta: StatsMeta = _parse(spec, entries[key], style, where)
    return meta


# ---------------------------------------------------------------------- spellings
def _check_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"the header style must be one of {', '.join(STYLES)}; got {style!r}")


def _entry(key: str, style: Style) -> str:
    return f"header entry {key}" if style == "file" else f"key {key!r}"


def _missing(where: str, key: str, style: Style) -> str:
    if style == "file":
        return (f"{where} has a missing or corrupt metadata header (no {key!r} entry); "
                "re-create it with ghofl")
    return f"{where} lacks the key {key!r}; {_FIX[style]}"


def _bad_value(spec: HeaderField, value: Any, style: Style, where: str) -> str:
    key = spec.key(style)
    shown = repr(value[:40] if isinstance(value, str) else value)[:60]
    if style == "file":
        return f"{where} has header {key} {shown}; expected {spec.expected(style)}; {_FIX[style]}"
    return f"{where}'s key {key!r} is {shown}; expected {spec.expected(style)}; {_FIX[style]}"


def _render(spec: HeaderField, value: Any, style: Style) -> Any:
    if spec.kind == "meta":
        return json.dumps(value.to_dict(), sort_keys=True)
    if spec.kind == "sigma":
        return json.dumps(dict(value), sort_keys=True)
    if spec.kind == "shrinkage":
        return json.dumps([float(v) for v in value])
    return str(value) if style == "file" else value


def _parse(spec: HeaderField, raw: Any, style: Style, where: str) -> Any:
    """The value of one present entry, checked (a StatsFormatError naming it otherwise)."""
    key = spec.key(style)
    want: type = int if spec.kind == "count" and style == "records" else str
    if not isinstance(raw, want) or isinstance(raw, bool):
        name = "an integer" if want is int else "a string"
        raise StatsFormatError(
            f"{where}'s key {key!r} must be {name}; got {type(raw).__name__}" if style ==
            "records" else f"{where} has header {key} of type {type(raw).__name__}; expected "
            f"a string; {_FIX[style]}"
        )
    if spec.kind == "meta":
        return _parse_meta(str(raw), style, where)
    value: Any = raw
    if spec.kind in ("sigma", "shrinkage"):
        try:
            value = parse_json(str(raw), f"{where}'s {_entry(key, style)}")
        except StatsFormatError:
            value = None
        if spec.kind == "shrinkage":
            value = tuple(value) if isinstance(value, list) else None
    if spec.kind == "count" and isinstance(raw, str):
        ok = raw.isascii() and raw.isdigit() and len(raw) <= 19
        value = int(raw) if ok else None
    # A present entry never holds its absent value: that is written as no entry.
    if value is None or (value == spec.absent and not spec.always) or not spec.check(value):
        raise StatsFormatError(_bad_value(spec, raw, style, where))
    return value


def _shrinkage_problem(meta: StatsMeta, sigma: Mapping[str, float] | None,
                       shrinkage: tuple[float, ...] | None) -> str | None:
    """What is wrong with ``shrinkage`` beside ``meta`` and ``sigma``, or None."""
    if shrinkage is None:
        return None
    if not sigma:
        return "comes without noise_sigma (intensities belong to a private release)"
    if len(shrinkage) != meta.num_classes:
        return f"holds {len(shrinkage)} intensities for {meta.num_classes} classes"
    return None


def _parse_meta(raw: str, style: Style, where: str) -> StatsMeta:
    if style == "file":
        try:
            data = parse_json(raw, "the metadata header")
        except StatsFormatError as exc:
            raise StatsFormatError(
                f"{where} has a missing or corrupt metadata header: {exc}") from exc
        return StatsMeta.from_dict(data)  # its errors name the metadata; the reader the file
    data = parse_json(raw, f"{where}'s key 'meta'", "re-send it with ghofl")
    try:
        return StatsMeta.from_dict(data)
    except GhoflError as exc:
        raise StatsFormatError(f"{where} is invalid: {exc}") from exc
