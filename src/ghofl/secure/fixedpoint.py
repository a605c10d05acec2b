"""Exact fixed-point encoding of client statistics as 64-bit words (integers mod 2^64).

Secure aggregation adds vectors modulo 2^64, so every statistic must become an integer whose
sum over all clients can never wrap. The public bounds that make this possible are agreed by
every party before the round:

* K, the number of clients that may contribute;
* M, the maximum number of samples one client may hold;
* R, the per-sample L2 clipping bound (‖x‖ ≤ R, applied on the client).

With them, one client's statistic of kind ``count`` is at most M in absolute value, of kind
``first`` (Σ x) at most M·R, of kind ``second`` (Σ x xᵀ, Σ x⊙x) at most M·R². The integer
words of ``counts`` and ``n_clipped`` travel as they are. Each float statistic x with bound B
travels as two 64-bit limbs (``limbs=2``, the default):

    hi = round(x · 2^e1),   lo = round((x · 2^e1 − hi) · 2^e2),

with e1 the largest exponent for which K·B·2^e1 ≤ 2^62, and e2 = 62 − ⌈log2 K⌉. Both limbs
are summed independently: |Σ hi| ≤ 2^62 and |Σ lo| ≤ K·2^(e2−1) < 2^62, so no sum wraps and
the reinterpreted int64 totals are exact. Scaling by powers of two is exact in floating point,
so the only error is the final rounding of lo: at most K·2^−(e1+e2+1) per entry, far below
float64 resolution of the total. ``limbs=1`` sends hi only (half the words) with error at most
K·2^−(e1+1) per entry, which :meth:`FixedPointCodec.error_bound` reports.

The decoded total is therefore the float64 sum to within one rounding of the final value, for
any number of clients and any data within the bounds; counts are exact.

A payload with a held-out section (``meta.holdout_fraction > 0``) flattens to the vectors of
:meth:`~ghofl.stats.schema.ModeSchema.flatten` with the section appended (``holdout.counts``,
``holdout.n_clipped``, ``holdout.<float arrays>``); a held-out sample is bounded as any other,
so each segment keeps the bound of its kind and the total's held-out section is exact in the
same way. Float32 transport (:func:`ghofl.stats.save_stats`) does not apply here: the words
are this fixed-point encoding of the float64 sums, whatever dtype the client would have used
to send them in the clear.

A vector payload (:class:`~ghofl.secure.vectors.VectorPayload` of a public
:class:`~ghofl.secure.vectors.VectorMeta`) is encoded the same way with the bound of each
float entry given by its description instead of M·R^k: its integer words, then the hi limbs,
then the lo limbs, with per-entry exponents (:meth:`FixedPointCodec.vector_exponents`) and
per-entry error bounds (:meth:`FixedPointCodec.vector_error_bounds`); integers are exact. A
decoded float total is within K·2^−(e1_j+e2+1) (``limbs=2``; K·2^−(e1_j+1) with ``limbs=1``)
plus K·b_j·2^−51 of the exact sum of the clients' float64 values: the first term is the
rounding of the lo limbs, the second the float64 arithmetic of the decoding (the hi and lo
totals made float64 and added: a few roundings relative to the total, which is at most
K·b_j). :meth:`FixedPointCodec.vector_exponents` refuses descriptions the words cannot carry:
K times an integer bound of 2^62 or more, or K·b_j not finite or outside
[2^−898, 2^1022] (the exponents and the error bound must stay normal float64 numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ClientRefusalError, ConfigError, InputError
from ghofl.secure.bounds import refuse_client_stats
from ghofl.secure.vectors import VectorMeta, VectorPayload, refuse_client_vector
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import Kind, ModeSchema, schema_for

__all__ = ["DEFAULT_MAX_SAMPLES", "HEADROOM_BITS", "FixedPointCodec"]

#: Default public maximum number of samples per client (M).
DEFAULT_MAX_SAMPLES = 1_000_000
#: Bits a summed integer word may use (of its 64): totals below 2^this cannot wrap.
HEADROOM_BITS = 62
_RELATIVE_SLACK = 1e-9  # accumulation rounding may exceed an exact bound by a few ulps
#: The range of log2(K·b_j) a vector payload's float bound may take (see the module docstring).
_LOG2_RANGE = (-898.0, 1022.0)


@dataclass(frozen=True)
class FixedPointCodec:
    """Public parameters of the encoding and the encode/decode maps.

    Parameters
    ----------
    num_clients : int
        K, the number of clients that may contribute (the roster size).
    max_samples : int
        M, the public maximum number of samples per client.
    clip_norm : float
        R, the per-sample L2 clipping bound every client applied.
    limbs : {1, 2}, default 2
        64-bit words per float statistic.
    """

    num_clients: int
    max_samples: int
    clip_norm: float
    limbs: int = 2

    def __post_init__(self) -> None:
        if int(self.num_clients) < 1:
            raise ConfigError(f"num_clients must be >= 1; got {self.num_clients}")
        if int(self.max_samples) < 1:
            raise ConfigError(f"max_samples must be >= 1; got {self.max_samples}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ConfigError(
                f"the clipping bound R must be a finite number > 0; got {self.clip_norm!r}"
            )
        if self.limbs not in (1, 2):
            raise ConfigError(f"limbs must be 1 or 2; got {self.limbs!r}")
        if self.num_clients * self.max_samples >= 2**HEADROOM_BITS:
            raise ConfigError(
                f"num_clients × max_samples = {self.num_clients * self.max_samples} does not fit "
                "in 62 bits, so counts could wrap; lower max_samples"
            )

    # ------------------------------------------------------------------ public bounds
    def bound(self, kind: Kind) -> float:
        """Largest absolute value one client's statistic of ``kind`` can take."""
        r = float(self.clip_norm)
        return float(self.max_samples) * {"count": 1.0, "first": r, "second": r * r}[kind]

    def exponents(self, kind: Kind) -> tuple[int, int]:
        """(e1, e2): the power-of-two scales of the high and low limbs for ``kind``."""
        total = self.num_clients * self.bound(kind) * (1.0 + _RELATIVE_SLACK)
        e1 = math.floor(HEADROOM_BITS - math.log2(total))
        e2 = HEADROOM_BITS - math.ceil(math.log2(max(self.num_clients, 2)))
        return e1, e2

    def error_bound(self, kind: Kind) -> float:
        """Largest absolute error of a decoded total entry of ``kind``.

        Before float64 rounding of the result.
        """
        e1, e2 = self.exponents(kind)
        bits = e1 + (e2 if self.limbs == 2 else 0) + 1
        return float(self.num_clients) * math.ldexp(1.0, -bits)

    def length(self, meta: StatsMeta | VectorMeta) -> int:
        """Number of uint64 words of an encoded payload of ``meta``."""
        if isinstance(meta, VectorMeta):
            return meta.n_int + self.limbs * meta.n_float
        sch = schema_for(meta.mode)
        c, d, ho = meta.num_classes, meta.dim, meta.has_holdout
        n_int = sum(s.size for s in sch.int_layout(c, d, ho))
        n_float = sum(s.size for s in sch.float_layout(c, d, ho))
        return n_int + self.limbs * n_float

    # ------------------------------------------------------------------ encode
    def encode(self, stats: ClientStats | VectorPayload) -> NDArray[np.uint64]:
        """Encode one client's statistics as uint64 words (integers, then hi limbs, then lo).

        A :class:`~ghofl.secure.vectors.VectorPayload` is encoded by :meth:`encode_payload`.

        Raises
        ------
        InputError
            The statistics were clipped with another bound, or exceed the public bounds (more
            than M samples, or values that clipping to R cannot produce: the checks of
            :func:`ghofl.secure.bounds.check_bounds`, per class, not only per entry).
        """
        if isinstance(stats, VectorPayload):
            return self.encode_payload(stats)
        meta = stats.meta
        if meta.clip_norm is None or not math.isclose(meta.clip_norm, self.clip_norm,
                                                      rel_tol=0.0, abs_tol=0.0):
            got = "no clipping" if meta.clip_norm is None else f"R={meta.clip_norm:g}"
            raise InputError(
                f"secure aggregation uses the public clipping bound R={self.clip_norm:g} but "
                f"these statistics were computed with {got}; recompute them with "
                f"--clip {self.clip_norm:g}"
            )
        if stats.n_samples > self.max_samples:
            raise ClientRefusalError(
                f"this client holds more samples than the public maximum M={self.max_samples} "
                "per client that bounds the fixed-point encoding; raise max_samples "
                "(--max-samples) for the whole federation",
                local_detail=f"the client holds {stats.n_samples} samples")
        ints, floats = schema_for(meta.mode).flatten(stats)
        refuse_client_stats(stats, self.max_samples, (ints, floats))
        return self.encode_vectors(meta, ints, floats)

    def encode_vectors(self, meta: StatsMeta, ints: NDArray[np.int64],
                       floats: NDArray[np.float64]) -> NDArray[np.uint64]:
        """Encode flattened payload vectors (layout ``schema_for(meta.mode)``) as uint64 words.

        The integer words travel as they are; each float segment is checked against its public
        bound M·R^k and split into limbs. :meth:`encode` is this applied to
        ``ModeSchema.flatten(stats)``; a caller that alters the vectors first (e.g. adds noise
        shares, :mod:`ghofl.privacy`) must keep every float within the bounds and every sum of
        integer words within 62 bits.

        Parameters
        ----------
        meta : StatsMeta
        ints : ndarray of int64, shape (C + 1,)
        floats : ndarray of float64, shape (F,)

        Raises
        ------
        InputError
            A float exceeds the public bound of its segment.
        """
        sch = schema_for(meta.mode)
        layout = sch.float_layout(meta.num_classes, meta.dim, meta.has_holdout)
        hi = np.empty(floats.size, np.int64)
        lo = np.empty(floats.size, np.int64) if self.limbs == 2 else None
        for seg in layout:
            part = floats[seg.offset : seg.offset + seg.size]
            _check_bound(part, self.bound(seg.kind), seg.name)
            e1, e2 = self.exponents(seg.kind)
            scaled = np.ldexp(part, e1)
            high = np.rint(scaled)
            hi[seg.offset : seg.offset + seg.size] = high
            if lo is not None:
                lo[seg.offset : seg.offset + seg.size] = np.rint(np.ldexp(scaled - high, e2))
        words = [np.asarray(ints).astype(np.int64), hi] + ([lo] if lo is not None else [])
        return np.concatenate(words).view(np.uint64)

    # ------------------------------------------------------------------ decode
    def decode(self, meta: StatsMeta, total: NDArray[np.uint64],
               rounding: float = 0.0) -> ClientStats:
        """Decode the modular sum of encoded payloads into the total statistics.

        Parameters
        ----------
        meta : StatsMeta
            Metadata shared by every payload.
        total : ndarray of uint64, shape (length(meta),)
            Σ_u encode(stats_u) mod 2^64.
        rounding : float, default 0.0
            Unit roundoff of a transport the encoded sums went through before (e.g. float32
            payloads recorded in a store), tolerated by the validation.

        Returns
        -------
        ClientStats
            The validated total.
        """
        return unflatten_stats(meta, *self.decode_vectors(meta, total), rounding=rounding)

    def decode_vectors(self, meta: StatsMeta, total: NDArray[np.uint64]
                       ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Decode the modular sum into the flattened vectors, without validating them.

        Parameters
        ----------
        meta : StatsMeta
        total : ndarray of uint64, shape (length(meta),)

        Returns
        -------
        ints : ndarray of int64, shape (C + 1,)
            Sum of the integer words.
        floats : ndarray of float64, shape (F,)
            Sum of the float entries (layout ``ModeSchema.float_layout``).
        """
        sch: ModeSchema = schema_for(meta.mode)
        expected = self.length(meta)
        if total.shape != (expected,) or total.dtype != np.uint64:
            raise InputError(
                f"the aggregated vector must be uint64 of length {expected} for these "
                f"statistics; got {total.dtype} of shape {total.shape}"
            )
        signed = total.view(np.int64)
        n_int = sum(s.size for s in sch.int_layout(meta.num_classes, meta.dim, meta.has_holdout))
        n_float = (expected - n_int) // self.limbs
        ints = np.array(signed[:n_int])
        hi = signed[n_int : n_int + n_float]
        lo = signed[n_int + n_float :] if self.limbs == 2 else None
        floats = np.empty(n_float)
        for seg in sch.float_layout(meta.num_classes, meta.dim, meta.has_holdout):
            e1, e2 = self.exponents(seg.kind)
            sl = slice(seg.offset, seg.offset + seg.size)
            value = hi[sl].astype(np.float64)
            if lo is not None:
                value = value + np.ldexp(lo[sl].astype(np.float64), -e2)
            floats[sl] = np.ldexp(value, -e1)
        return ints, floats

    # ------------------------------------------------------------------ vector payloads
    def vector_exponents(self, meta: VectorMeta) -> tuple[NDArray[np.int64], int]:
        """(e1, e2) of a vector payload: e1 per float entry, shape (F,), e2 shared.

        Raises
        ------
        ConfigError
            K times an integer bound does not fit in 62 bits (the sum could wrap), or K times
            a float bound is not finite or outside [2^−898, 2^1022].
        """
        if meta.int_bounds and self.num_clients * max(meta.int_bounds) >= 2**HEADROOM_BITS:
            raise ConfigError(
                f"num_clients × the largest integer bound of {meta.name!r} = "
                f"{self.num_clients * max(meta.int_bounds)} does not fit in 62 bits, so the "
                "integer sums could wrap; lower the bounds (max_samples)"
            )
        _, fb = meta.bound_arrays()
        with np.errstate(over="ignore", divide="ignore"):
            total = self.num_clients * fb * (1.0 + _RELATIVE_SLACK)
            log = np.log2(total)
        low, high = _LOG2_RANGE
        bad = ~np.isfinite(log) | (log < low) | (log > high)
        if bad.any():
            j = int(np.argmax(bad))
            raise ConfigError(
                f"num_clients × the float bound of entry {j} of {meta.name!r} = "
                f"{self.num_clients} × {float(fb[j])!r} = {total[j]:.6g} is not within "
                f"[2^{low:g}, 2^{high:g}], so the 64-bit fixed-point words cannot carry it; give "
                "float bounds of a realistic magnitude")
        e1 = np.floor(HEADROOM_BITS - log).astype(np.int64)
        e2 = HEADROOM_BITS - math.ceil(math.log2(max(self.num_clients, 2)))
        return e1, e2

    def vector_error_bounds(self, meta: VectorMeta) -> NDArray[np.float64]:
        """Largest absolute error of each decoded float entry of a total, shape (F,).

        K·2^−(e1_j + e2 + 1) (``limbs=1``: K·2^−(e1_j + 1)), the rounding of the lo limbs,
        plus K·b_j·2^−51, the float64 rounding of the decoding (see the module docstring),
        against the exact sum of the clients' float64 entries.
        """
        e1, e2 = self.vector_exponents(meta)
        bits = e1 + (e2 if self.limbs == 2 else 0) + 1
        k = float(self.num_clients)
        _, fb = meta.bound_arrays()
        out: NDArray[np.float64] = (np.ldexp(np.full(e1.shape, k), -bits)
                                    + k * fb * (1.0 + _RELATIVE_SLACK) * 2.0**-51)
        return out

    def encode_payload(self, payload: VectorPayload) -> NDArray[np.uint64]:
        """Encode one client's vectors as uint64 words: integers, hi limbs, then lo limbs.

        Raises
        ------
        InputError
            An entry lies beyond its public bound
            (:func:`~ghofl.secure.vectors.refuse_client_vector`); nothing is encoded.
        """
        refuse_client_vector(payload)
        e1, e2 = self.vector_exponents(payload.meta)
        scaled = np.ldexp(payload.floats, e1)
        high = np.rint(scaled)
        words = [payload.ints.astype(np.int64), high.astype(np.int64)]
        if self.limbs == 2:
            words.append(np.rint(np.ldexp(scaled - high, e2)).astype(np.int64))
        return np.concatenate(words).view(np.uint64)

    def decode_payload(self, meta: VectorMeta, total: NDArray[np.uint64]) -> VectorPayload:
        """Decode the modular sum of encoded vector payloads, without checking bounds.

        Parameters
        ----------
        meta : VectorMeta
        total : ndarray of uint64, shape (length(meta),)

        Returns
        -------
        VectorPayload
            The summed integers (exact) and floats (within :meth:`vector_error_bounds`).
        """
        expected = self.length(meta)
        if total.shape != (expected,) or total.dtype != np.uint64:
            raise InputError(
                f"the aggregated vector must be uint64 of length {expected} for the "
                f"{meta.name!r} vectors; got {total.dtype} of shape {total.shape}"
            )
        signed = total.view(np.int64)
        n_i, n_f = meta.n_int, meta.n_float
        e1, e2 = self.vector_exponents(meta)
        value = signed[n_i:n_i + n_f].astype(np.float64)
        if self.limbs == 2:
            value = value + np.ldexp(signed[n_i + n_f:].astype(np.float64), -e2)
        return VectorPayload(meta, np.array(signed[:n_i]), np.ldexp(value, -e1))

    def to_dict(self) -> dict[str, Any]:
        """The codec's public parameters as JSON-ready fields."""
        return {"num_clients": self.num_clients, "max_samples": self.max_samples,
                "clip_norm": self.clip_norm, "limbs": self.limbs}


def _check_bound(values: NDArray[np.float64], bound: float, name: str) -> None:
    if values.size == 0:
        return
    peak = float(np.max(np.abs(values)))
    if not peak <= bound * (1.0 + _RELATIVE_SLACK):
        raise ClientRefusalError(  # the message leaves the client: no value of its data
            f"{name} holds a value above the public bound {bound:.6g} that clipping to R with "
            "at most M samples guarantees; the client did not clip its embeddings to R before "
            "computing statistics", local_detail=f"{name}: largest magnitude {peak!r}")
