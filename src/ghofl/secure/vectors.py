"""Public-shape vectors through the secure sum: their public description, bounds and checks.

Besides client statistics (:class:`~ghofl.stats.client_stats.ClientStats`, described by a
:class:`~ghofl.stats.meta.StatsMeta`), a secure round can sum any payload of public shape: one
int64 vector and one float64 vector per client, every entry bounded by a public value agreed
before the round (e.g. the federated evaluation sums,
:meth:`ghofl.evaluation.federated.EvaluationSums.to_vectors`). :class:`VectorMeta` is that
agreement: a name, the per-entry bounds of ONE client (their lengths are the segment lengths)
and whether entries are non-negative; :class:`VectorPayload` is one client's (or the total's)
vectors.

Encoding (:meth:`~ghofl.secure.fixedpoint.FixedPointCodec.encode`): the integer entries travel
as 64-bit words as they are; float entry j with bound b_j travels as the codec's limbs with the
exponents of the statistics codec taken per entry (e1_j the largest exponent with
K·b_j·2^e1_j ≤ 2^62, e2 = 62 − ⌈log2 K⌉), so no sum of K clients wraps and the decoded total
is exact for integers and, for floats, within K·2^−(e1_j + e2 + 1) (``limbs=2``;
K·2^−(e1_j + 1) with ``limbs=1``) plus K·b_j·2^−52 (the rounding of the result to float64)
of the exact sum of the clients' float64 values
(:meth:`~ghofl.secure.fixedpoint.FixedPointCodec.vector_error_bounds`).

Checks. A client refuses, before masking, a payload with an entry beyond its public bound
(:func:`refuse_client_vector`: its message names the entry and the bound, never the value,
since a node returns it to the server); the server refuses a decoded total beyond n times the
bounds for its n contributors (:func:`refuse_vector_total`), so a lying client cannot blow the
total up.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import (
    ClientRefusalError,
    ConfigError,
    InputError,
    StatsFormatError,
    TotalOutOfBoundsError,
)

if TYPE_CHECKING:  # fixedpoint imports this module
    from ghofl.secure.config import SessionParams

__all__ = [
    "VECTOR_FORMAT",
    "VectorMeta",
    "VectorPayload",
    "decode_vector_total",
    "refuse_client_vector",
    "refuse_vector_total",
    "vector_meta_difference",
]

#: The ``format`` tag of a serialised :class:`VectorMeta`.
VECTOR_FORMAT = "ghofl.vector"
#: Relative slack of float comparisons (accumulated rounding of a client's own float sums).
_SLACK = 1e-9


def _runs(values: tuple[float, ...] | tuple[int, ...]) -> list[list[Any]]:
    """Run-length encoding [[value, count], …] of ``values`` (canonical, compact)."""
    out: list[list[Any]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out


def _unruns(runs: Any, kind: type, limit: int | None = None) -> tuple[Any, ...]:
    """Inverse of :func:`_runs`; refuses more than ``limit`` entries before expanding them."""
    if not isinstance(runs, list) or not all(isinstance(r, list) and len(r) == 2 for r in runs):
        raise ValueError("bounds must be a list of [value, count] runs")
    total = 0
    for value, count in runs:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"a run count must be a positive integer; got {count!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"a bound must be a number; got {value!r}")
        total += count
        if limit is not None and total > limit:
            raise ValueError(f"the runs hold more than the {limit} entries expected")
    out: list[Any] = []
    for value, count in runs:
        out.extend([kind(value)] * count)
    return tuple(out)


@dataclass(frozen=True)
class VectorMeta:
    """Public description of a vector payload, agreed by the server and every client.

    Parameters
    ----------
    name : str
        What the vectors are (e.g. ``"evaluation"``); part of what clients must agree on.
    int_bounds : tuple of int, length I
        Largest absolute value of each integer entry of ONE client's payload.
    float_bounds : tuple of float, length F
        Largest absolute value of each float entry of one client's payload (finite, > 0).
    nonnegative : bool, default True
        Every entry lies in [0, bound] (else in [−bound, bound]).
    """

    name: str
    int_bounds: tuple[int, ...]
    float_bounds: tuple[float, ...]
    nonnegative: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"a vector payload needs a non-empty name; got {self.name!r}")
        ints = tuple(int(b) for b in self.int_bounds)
        floats = tuple(float(b) for b in self.float_bounds)
        if any(b < 0 for b in ints):
            raise ConfigError("the integer bounds of a vector payload must be >= 0; got "
                              f"{min(ints)}")
        if any(not (math.isfinite(b) and b > 0) for b in floats):
            bad = next(b for b in floats if not (math.isfinite(b) and b > 0))
            raise ConfigError("the float bounds of a vector payload must be finite and > 0; got "
                              f"{bad!r}")
        if not ints and not floats:
            raise ConfigError(f"the vector payload {self.name!r} has no entries")
        object.__setattr__(self, "int_bounds", ints)
        object.__setattr__(self, "float_bounds", floats)
        object.__setattr__(self, "nonnegative", bool(self.nonnegative))

    @property
    def n_int(self) -> int:
        """I, the length of the integer vector."""
        return len(self.int_bounds)

    @property
    def n_float(self) -> int:
        """F, the length of the float vector."""
        return len(self.float_bounds)

    def to_dict(self) -> dict[str, Any]:
        """Canonical JSON-ready fields (bounds run-length encoded)."""
        return {"format": VECTOR_FORMAT, "name": self.name, "nonnegative": self.nonnegative,
                "int_bounds": _runs(self.int_bounds), "float_bounds": _runs(self.float_bounds)}

    @classmethod
    def from_dict(cls, d: Any, limit: tuple[int, int] | None = None) -> VectorMeta:
        """Inverse of :meth:`to_dict`.

        Parameters
        ----------
        d : dict
            Fields of :meth:`to_dict` (e.g. another party's, not trusted).
        limit : (int, int), optional
            The most integer and float entries accepted: bounds describing more are refused
            before they are expanded (a description from another party cannot exhaust memory).

        Raises
        ------
        StatsFormatError
            ``d`` is not a serialised vector description.
        """
        try:
            if not isinstance(d, dict) or d.get("format") != VECTOR_FORMAT:
                raise ValueError(f"no format {VECTOR_FORMAT!r}")
            n_int, n_float = (None, None) if limit is None else limit
            return cls(str(d["name"]), _unruns(d["int_bounds"], int, n_int),
                       _unruns(d["float_bounds"], float, n_float), bool(d["nonnegative"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StatsFormatError(f"not a vector payload description ({exc})") from exc

    def differences(self, other: VectorMeta) -> list[str]:
        """What differs between ``self`` and ``other``, in words (empty: the same)."""
        out = [f"{k} ({getattr(self, k)!r} vs {getattr(other, k)!r})"
               for k in ("name", "nonnegative", "n_int", "n_float")
               if getattr(self, k) != getattr(other, k)]
        for k in ("int_bounds", "float_bounds"):
            mine, theirs = getattr(self, k), getattr(other, k)
            if len(mine) == len(theirs) and mine != theirs:
                j = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
                out.append(f"{k} (entry {j}: {mine[j]!r} vs {theirs[j]!r})")
        return out

    def bound_arrays(self) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """The bounds as arrays: int64 of shape (I,), float64 of shape (F,)."""
        return (np.asarray(self.int_bounds, dtype=np.int64).reshape(-1),
                np.asarray(self.float_bounds, dtype=np.float64).reshape(-1))


@dataclass(frozen=True, eq=False)
class VectorPayload:
    """One client's vectors (or their total) of a :class:`VectorMeta`.

    Attributes
    ----------
    meta : VectorMeta
    ints : ndarray of int64, shape (I,)
    floats : ndarray of float64, shape (F,)
    source : str, default ""
        Hex digest of the data the vectors were computed from (e.g. the held-out rows,
        :func:`ghofl.evaluation.split.rows_digest`), or "" (none given). A client's round
        ledger keys on it rather than on the vectors, which change with the model scored and
        with a fresh noise share while the data does not (:meth:`ledger_key`).
    """

    meta: VectorMeta
    ints: NDArray[np.int64]
    floats: NDArray[np.float64]
    source: str = ""

    def __post_init__(self) -> None:
        ints, floats = np.asarray(self.ints), np.asarray(self.floats)
        if ints.shape != (self.meta.n_int,) or ints.dtype.kind not in "iu":
            raise InputError(f"the integer vector of {self.meta.name!r} must be int64 of shape "
                             f"({self.meta.n_int},); got {ints.dtype} of shape {ints.shape}")
        if floats.shape != (self.meta.n_float,) or floats.dtype.kind != "f":
            raise InputError(f"the float vector of {self.meta.name!r} must be float64 of shape "
                             f"({self.meta.n_float},); got {floats.dtype} of shape "
                             f"{floats.shape}")
        object.__setattr__(self, "ints", ints.astype(np.int64))
        object.__setattr__(self, "floats", floats.astype(np.float64))

    def digest(self) -> str:
        """Hex SHA-256 of the canonical description and both vectors (for a round ledger)."""
        h = hashlib.sha256(json.dumps(self.meta.to_dict(), sort_keys=True).encode())
        h.update(self.ints.tobytes())
        h.update(self.floats.tobytes())
        return h.hexdigest()

    def ledger_key(self) -> str:
        """What a client's round ledger records: ``data:<source>``, else :meth:`digest`."""
        return f"data:{self.source}" if self.source else self.digest()


def _first_out(values: NDArray[Any], low: NDArray[Any], high: NDArray[Any]
               ) -> tuple[int, float, float, float] | None:
    """(index, value, low, high) of the first entry outside [low, high] or not finite."""
    finite = np.isfinite(values) if values.dtype.kind == "f" else np.ones(values.shape, bool)
    bad = ~finite | (values < low) | (values > high)
    if not bad.any():
        return None
    j = int(np.argmax(bad))
    return j, float(values[j]), float(low[j]), float(high[j])


def _out_of_bounds(meta: VectorMeta, ints: NDArray[np.int64], floats: NDArray[np.float64],
                   clients: int, float_slack: NDArray[np.float64]) -> tuple[str, str] | None:
    """The first entry beyond ``clients`` times the bounds (None: all within).

    Returns (where, value): ``where`` names the entry and its public interval only,
    ``value`` is the entry's value (the payload's, not public). Integers are compared exactly
    (int64: the codec keeps K·bound below 2^62); floats with a relative slack of 1e-9 plus
    ``float_slack`` (the decoding error).
    """
    ib, fb = meta.bound_arrays()
    hi_i = ib * np.int64(clients)
    lo_i = np.zeros_like(hi_i) if meta.nonnegative else -hi_i
    hi_f = fb * clients * (1.0 + _SLACK) + float_slack
    lo_f = -(fb * clients * _SLACK + float_slack) if meta.nonnegative else -hi_f
    for kind, vals, low, high in (("integer", ints, lo_i, hi_i), ("float", floats, lo_f, hi_f)):
        hit = _first_out(vals, low, high)
        if hit is not None:
            j, v, lo, up = hit
            return f"{kind} entry {j} is not finite or lies outside [{lo:.6g}, {up:.6g}]", \
                f"{v!r}"
    return None


def refuse_client_vector(payload: VectorPayload) -> None:
    """Client side: refuse a payload with an entry beyond its public bound (before masking).

    The message names the entry and its public bound, never its value: a node returns the
    message to the server (with a public bound of one row, a value would tell the server
    about that row). The value is kept in the error's ``local_detail``.

    Raises
    ------
    ClientRefusalError
        Naming the entry and its public bound.
    """
    meta = payload.meta
    problem = _out_of_bounds(meta, payload.ints, payload.floats, 1,
                             np.zeros(meta.n_float, dtype=np.float64))
    if problem is not None:
        where, value = problem
        raise ClientRefusalError(
            f"the {meta.name!r} vectors exceed the public per-client bounds agreed for the "
            f"round: {where}; compute them again from at most the public maximum of rows "
            "instead of editing them", local_detail=f"{where}: the value is {value}")


def refuse_vector_total(meta: VectorMeta, ints: NDArray[np.int64], floats: NDArray[np.float64],
                        contributors: int, float_error: NDArray[np.float64]) -> None:
    """Server side: refuse a decoded total beyond ``contributors`` times the bounds.

    Parameters
    ----------
    meta : VectorMeta
    ints : ndarray of int64, shape (I,)
    floats : ndarray of float64, shape (F,)
    contributors : int
        n, clients whose payloads are in the total.
    float_error : ndarray of float64, shape (F,)
        The codec's largest decoding error per float entry (tolerated).

    Raises
    ------
    TotalOutOfBoundsError
        An entry lies outside what n honest clients can produce.
    """
    problem = _out_of_bounds(meta, ints, floats, int(contributors), float_error)
    if problem is not None:
        raise TotalOutOfBoundsError(
            f"secure aggregation aborted: the {meta.name!r} total of {contributors} clients "
            f"exceeds {contributors} times the public per-client bounds ({problem[0]}: the "
            f"total is {problem[1]}); a client "
            "sent vectors beyond the public bounds (poisoned or corrupt), so nothing is released"
        )


def decode_vector_total(params: SessionParams, meta: VectorMeta, words: NDArray[np.uint64],
                        contributors: int) -> VectorPayload:
    """Decode the unmasked sum of a vector round and check it against the bounds.

    Parameters
    ----------
    params : SessionParams
        The round's public parameters (its codec: K, limbs).
    meta : VectorMeta
    words : ndarray of uint64, shape (codec.length(meta),)
    contributors : int
        Clients in the sum.

    Returns
    -------
    VectorPayload
        The total.
    """
    codec = params.codec
    total = codec.decode_payload(meta, words)
    refuse_vector_total(meta, total.ints, total.floats, contributors,
                        codec.vector_error_bounds(meta))
    return total


def vector_meta_difference(text: str, meta: VectorMeta) -> str:
    """Why a client's advertised description ``text`` differs from the round's ``meta``."""
    try:
        theirs = VectorMeta.from_dict(json.loads(text), (meta.n_int, meta.n_float))
    except (ValueError, TypeError, ConfigError, StatsFormatError) as exc:
        return f"advertised a malformed vector description ({exc})"
    diffs = meta.differences(theirs) or ["their canonical form"]
    return f"holds {meta.name!r} vectors that differ from the round's in " + "; ".join(diffs)
