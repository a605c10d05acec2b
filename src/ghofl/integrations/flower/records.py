"""Records codec: statistics and protocol messages to and from a Flower ``RecordDict``.

:class:`~ghofl.stats.ClientStats` and every aggregation protocol message
(:mod:`ghofl.secure.messages`).

Layout of a message record (version :data:`RECORDS_VERSION`):

* ``ConfigRecord "ghofl"``: ``records-version`` (int), ``type`` (the message class name), the
  protocol header (``version``, ``round_id`` bytes, ``stage``, and ``sender`` in replies) and
  every non-array field: bytes, ints and strings as they are; a tuple of strings as a list; a
  tuple of pairs, of :class:`~ghofl.secure.messages.RosterEntry` or of
  :class:`~ghofl.secure.messages.SealedShare` as one list per component (``roster.client``,
  ``roster.enc_public``, ...), all of the same length;
* ``ArrayRecord "ghofl-arrays"``: numpy arrays (the masked vector, uint64), bit-exact (Flower
  ships them as ``.npy`` bytes);
* a :class:`ClientStats` (plain protocol) as ``ArrayRecord "ghofl-stats"`` (the arrays of
  :func:`ghofl.stats.codec.stats_tensors`, symmetric matrices as their upper triangles, the
  held-out section's under ``holdout.<name>``; float arrays float64, or float32 under float32
  transport) and ``ConfigRecord "ghofl-stats-meta"``: ``records-version`` and the
  statistics header :class:`~ghofl.stats.header.StatsHeader` in its records spelling
  (``meta`` JSON, ``n_clipped``, and when they apply ``holdout-n_clipped``,
  ``transport-dtype`` ``"float32"`` and ``rounded-to`` ``"float32"``; absent keys mean no
  held-out count, float64 and no earlier rounding, so records without these options are
  unchanged). The file codec writes the same header, spelt for files.

Decoding validates everything (missing keys, wrong types, list lengths, record version, the
expected message type) and raises :class:`~ghofl.errors.ProtocolError` with a message naming
the record and the key; the protocol layer then checks the content as for any transport.

flwr is imported lazily, inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ghofl.errors import GhoflError, ProtocolError, require_extra
from ghofl.secure.messages import (
    SECURE_STAGES,
    AdvertiseKeys,
    AdvertiseRequest,
    ClientMessage,
    ConsistencyRequest,
    ConsistencySignature,
    Hello,
    HelloRequest,
    MaskedInput,
    MaskRequest,
    NonceReveal,
    PlainInput,
    PlainRequest,
    RevealRequest,
    RosterEntry,
    SealedShare,
    ServerMessage,
    ShareKeys,
    ShareRequest,
    UnmaskRequest,
    UnmaskShares,
)
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.codec import stats_tensors, transport_dtype_name
from ghofl.stats.header import StatsHeader
from ghofl.stats.transport import DeclaredArray, check_declared_arrays

if TYPE_CHECKING:  # pragma: no cover
    from flwr.app import RecordDict

__all__ = [
    "ARRAYS",
    "HEADER",
    "RECORDS_VERSION",
    "STATS_ARRAYS",
    "STATS_META",
    "message_from_record",
    "message_to_record",
    "stats_from_record",
    "stats_to_record",
]

RECORDS_VERSION = 3
HEADER = "ghofl"
ARRAYS = "ghofl-arrays"
STATS_ARRAYS = "ghofl-stats"
STATS_META = "ghofl-stats-meta"
_STAGES = ("hello", *SECURE_STAGES, "input")
_STATS_WHERE = "the ghofl statistics record"
#: Bytes an array of the statistics record may carry beyond its data (its ``.npy`` header).
_NPY_HEADER_BYTES = 4096

# Field kinds: bytes, int, str, strs (tuple of str), str_pairs (tuple of (str, str)),
# str_bytes (tuple of (str, bytes)), str_int_bytes (tuple of (str, int, bytes)), bytess (tuple
# of bytes), roster, sealed, u64 (uint64 vector), stats.
_SPECS: dict[str, tuple[type, tuple[tuple[str, str], ...]]] = {
    "PlainRequest": (PlainRequest, ()),
    "PlainInput": (PlainInput, (("stats", "stats"),)),
    "HelloRequest": (HelloRequest, (("challenge", "bytes"), ("roster_fingerprint", "bytes"))),
    "Hello": (Hello, (("address", "str"), ("signature", "bytes"))),
    "AdvertiseRequest": (AdvertiseRequest, (("params", "str_pairs"), ("meta", "str"),
                                            ("roster_fingerprint", "bytes"))),
    "AdvertiseKeys": (AdvertiseKeys, (("enc_public", "bytes"), ("mask_public", "bytes"),
                                      ("nonce_commitment", "bytes"), ("meta", "str"),
                                      ("signature", "bytes"))),
    "RevealRequest": (RevealRequest, (("roster", "roster"),)),
    "NonceReveal": (NonceReveal, (("nonce", "bytes"),)),
    "ShareRequest": (ShareRequest, (("nonces", "str_bytes"),)),
    "ShareKeys": (ShareKeys, (("shares", "sealed"), ("seed_commitment", "bytes"),
                              ("level_commitments", "bytess"))),
    "MaskRequest": (MaskRequest, (("sharers", "strs"), ("shares", "sealed"))),
    "MaskedInput": (MaskedInput, (("vector", "u64"), ("complaints", "str_pairs"),
                                  ("complaint_keys", "str_bytes"))),
    "ConsistencyRequest": (ConsistencyRequest, (("survivors", "strs"), ("dropped", "strs"))),
    "ConsistencySignature": (ConsistencySignature, (("signature", "bytes"),)),
    "UnmaskRequest": (UnmaskRequest, (("survivors", "strs"), ("dropped", "strs"),
                                      ("signatures", "str_bytes"))),
    "UnmaskShares": (UnmaskShares, (("seed_shares", "str_bytes"), ("key_shares", "str_bytes"),
                                    ("level_shares", "str_int_bytes"))),
}
_COLUMNS = {
    "str_pairs": (("0", str), ("1", str)),
    "str_bytes": (("0", str), ("1", bytes)),
    "str_int_bytes": (("0", str), ("1", int), ("2", bytes)),
    "roster": (("client", str), ("enc_public", bytes), ("mask_public", bytes),
               ("nonce_commitment", bytes), ("signature", bytes)),
    "sealed": (("sender", str), ("recipient", str), ("sealed", bytes), ("key_commitment", bytes),
               ("signature", bytes)),
}
_ROW_TYPES: dict[str, Any] = {"roster": RosterEntry, "sealed": SealedShare}


def _flwr() -> Any:
    require_extra("flwr", "flower")
    import flwr.app

    return flwr.app


# ---------------------------------------------------------------------- ClientStats
def stats_to_record(stats: ClientStats, into: RecordDict | None = None,
                    transport_dtype: str = "float64") -> RecordDict:
    """``stats`` as a ``RecordDict`` (or added to ``into``).

    Arrays bit-exact (float sums in ``transport_dtype``, ``"float64"`` or
    ``"float32"``), meta as JSON.
    """
    app = _flwr()
    tname = transport_dtype_name(transport_dtype)
    rd = app.RecordDict() if into is None else into
    rd[STATS_ARRAYS] = app.ArrayRecord({
        name: app.Array(np.ascontiguousarray(a))
        for name, a in stats_tensors(stats, tname).items()
    })
    header = StatsHeader.of(stats, tname).to_entries("records")
    cfg: dict[str, Any] = {"records-version": RECORDS_VERSION, **header}
    rd[STATS_META] = app.ConfigRecord(cfg)
    return rd


def stats_from_record(rd: Any) -> ClientStats:
    """Inverse of :func:`stats_to_record`.

    Raises
    ------
    ProtocolError
        The records are missing, of another version, or do not form valid statistics.
    """
    app = _flwr()
    cfg = _record(rd, STATS_META, app.ConfigRecord, "ConfigRecord")
    arrays = _record(rd, STATS_ARRAYS, app.ArrayRecord, "ArrayRecord")
    _check_version(cfg, STATS_META)
    try:
        header = StatsHeader.from_entries(cfg, "records", _STATS_WHERE)
    except GhoflError as exc:  # the message names the record and the key
        raise ProtocolError(str(exc)) from exc
    try:  # declared names, dtypes, shapes and sizes first: no array is decoded before
        declared = {name: DeclaredArray(str(a.dtype), tuple(int(n) for n in a.shape),
                                        len(a.data)) for name, a in arrays.items()}
        check_declared_arrays(header.meta, declared, transport=header.transport_dtype,
                              overhead=_NPY_HEADER_BYTES)
        tensors = {name: arrays[name].numpy() for name in arrays}
        return header.stats_from(tensors)
    except (GhoflError, ValueError, TypeError) as exc:
        raise ProtocolError(f"{_STATS_WHERE} is invalid: {exc}") from exc


# ---------------------------------------------------------------------- messages
def message_to_record(message: ServerMessage | ClientMessage,
                      transport_dtype: str = "float64") -> RecordDict:
    """Any protocol message (request or reply) as a ``RecordDict``.

    Statistics in it (the plain protocol's input) carry their float sums in ``transport_dtype``.
    """
    app = _flwr()
    kind = type(message).__name__
    if kind not in _SPECS or _SPECS[kind][0] is not type(message):
        raise ProtocolError(f"cannot encode a {kind}: it is not a ghofl protocol message")
    cfg: dict[str, Any] = {
        "records-version": RECORDS_VERSION, "type": kind, "version": int(message.version),
        "round_id": bytes(message.round_id), "stage": str(message.stage),
    }
    if isinstance(message, ClientMessage):
        cfg["sender"] = str(message.sender)
    rd = app.RecordDict()
    arrays: dict[str, Any] = {}
    for name, field_kind in _SPECS[kind][1]:
        value = getattr(message, name)
        if field_kind in ("bytes", "str"):
            cfg[name] = value
        elif field_kind == "strs":
            cfg[name] = [str(v) for v in value]
        elif field_kind == "bytess":
            cfg[name] = [bytes(v) for v in value]
        elif field_kind in _COLUMNS:
            for i, (col, _) in enumerate(_COLUMNS[field_kind]):
                cfg[f"{name}.{col}"] = [
                    getattr(row, col) if field_kind in _ROW_TYPES else row[i] for row in value
                ]
        elif field_kind == "u64":
            arrays[name] = app.Array(np.ascontiguousarray(value))
        elif field_kind == "stats":
            stats_to_record(value, into=rd, transport_dtype=transport_dtype)
    rd[HEADER] = app.ConfigRecord(cfg)
    if arrays:
        rd[ARRAYS] = app.ArrayRecord(arrays)
    return rd  # type: ignore[no-any-return]


def message_from_record(rd: Any, expected: type | tuple[type, ...] | None = None
                        ) -> ServerMessage | ClientMessage:
    """Decode and validate a record made by :func:`message_to_record`.

    Parameters
    ----------
    rd : RecordDict
    expected : type or tuple of types, optional
        The message class(es) acceptable here (e.g. ``ServerMessage`` on a client).

    Raises
    ------
    ProtocolError
        No ghofl record, another record version, an unknown or unexpected message type, a
        missing key, a value of the wrong type, or columns of different lengths.
    """
    app = _flwr()
    cfg = _record(rd, HEADER, app.ConfigRecord, "ConfigRecord")
    _check_version(cfg, HEADER)
    kind = _get(cfg, "type", str, "message")
    if kind not in _SPECS:
        raise ProtocolError(
            f"the ghofl record holds an unknown message type {kind!r}; known: "
            f"{', '.join(sorted(_SPECS))}"
        )
    cls, spec = _SPECS[kind]
    if expected is not None and not issubclass(cls, expected):
        names = expected if isinstance(expected, tuple) else (expected,)
        raise ProtocolError(
            f"the ghofl record holds a {kind} where a {' or '.join(t.__name__ for t in names)} "
            "was expected"
        )
    fields: dict[str, Any] = {
        "version": _get(cfg, "version", int, kind),
        "round_id": _get(cfg, "round_id", bytes, kind),
        "stage": _get(cfg, "stage", str, kind),
    }
    if fields["stage"] not in _STAGES:
        raise ProtocolError(
            f"the ghofl {kind} record names an unknown stage {fields['stage']!r}"
        )
    if issubclass(cls, ClientMessage):
        fields["sender"] = _get(cfg, "sender", str, kind)
    for name, field_kind in spec:
        if field_kind == "bytes":
            fields[name] = _get(cfg, name, bytes, kind)
        elif field_kind == "str":
            fields[name] = _get(cfg, name, str, kind)
        elif field_kind == "strs":
            fields[name] = tuple(_get_list(cfg, name, str, kind))
        elif field_kind == "bytess":
            fields[name] = tuple(_get_list(cfg, name, bytes, kind))
        elif field_kind in _COLUMNS:
            cols = [_get_list(cfg, f"{name}.{col}", t, kind) for col, t in _COLUMNS[field_kind]]
            if len({len(c) for c in cols}) > 1:
                raise ProtocolError(
                    f"the ghofl {kind} record's columns of {name!r} have different lengths "
                    f"({', '.join(str(len(c)) for c in cols)}); it is malformed"
                )
            row_type = _ROW_TYPES.get(field_kind, tuple)
            fields[name] = tuple(
                row_type(*row) if row_type is not tuple else tuple(row)
                for row in zip(*cols, strict=True)
            )
        elif field_kind == "u64":
            arrays = _record(rd, ARRAYS, app.ArrayRecord, "ArrayRecord")
            if name not in arrays:
                raise ProtocolError(
                    f"the ghofl {kind} record lacks the array {name!r}; it is malformed"
                )
            try:
                vec = arrays[name].numpy()
            except Exception as exc:
                raise ProtocolError(
                    f"the ghofl {kind} record's array {name!r} cannot be read ({exc})"
                ) from exc
            if vec.dtype != np.uint64 or vec.ndim != 1:
                raise ProtocolError(
                    f"the ghofl {kind} record's array {name!r} must be a 1-D uint64 vector; "
                    f"got {vec.dtype} of shape {vec.shape}"
                )
            fields[name] = vec
        elif field_kind == "stats":
            fields[name] = stats_from_record(rd)
    return cls(**fields)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- validation helpers
def _record(rd: Any, name: str, cls: type, what: str) -> Any:
    app = _flwr()
    if not isinstance(rd, app.RecordDict):
        raise ProtocolError(
            f"expected a Flower RecordDict holding ghofl records; got a {type(rd).__name__}"
        )
    if name not in rd:
        raise ProtocolError(
            f"the Flower message holds no {what} {name!r}; it was not sent by this version "
            "of ghofl"
        )
    rec = rd[name]
    if not isinstance(rec, cls):
        raise ProtocolError(
            f"the Flower record {name!r} must be a {what}; got a {type(rec).__name__}"
        )
    return rec


def _check_version(cfg: Mapping[str, Any], name: str) -> None:
    v = cfg.get("records-version")
    if v is None:
        raise ProtocolError(f"the ghofl record {name!r} lacks its 'records-version'")
    if v != RECORDS_VERSION or isinstance(v, bool):
        raise ProtocolError(
            f"the ghofl record {name!r} has records-version {v!r}; this ghofl reads version "
            f"{RECORDS_VERSION}; run the same ghofl version on the server and the clients"
        )


def _type_name(t: type) -> str:
    return {bytes: "bytes", str: "a string", int: "an integer"}.get(t, t.__name__)


def _get(cfg: Mapping[str, Any], key: str, t: type, kind: str) -> Any:
    if key not in cfg:
        raise ProtocolError(f"the ghofl {kind} record lacks the key {key!r}; it is malformed")
    value = cfg[key]
    if not isinstance(value, t) or (t is int and isinstance(value, bool)):
        raise ProtocolError(
            f"the ghofl {kind} record's key {key!r} must be {_type_name(t)}; got "
            f"{type(value).__name__}"
        )
    return value


def _get_list(cfg: Mapping[str, Any], key: str, t: type, kind: str) -> list[Any]:
    value = _get(cfg, key, list, kind)
    for item in value:
        if not isinstance(item, t) or (t is int and isinstance(item, bool)):
            raise ProtocolError(
                f"the ghofl {kind} record's key {key!r} must be a list of {_type_name(t)}; "
                f"it holds a {type(item).__name__}"
            )
    return list(value)
