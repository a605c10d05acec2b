"""What clipping allows: the checks a payload or a decoded total must pass before it is used.

Secure aggregation shows the server only the sum, so a client could send anything: one sample
of norm 1000·R, a count of millions, a word that wraps the sum. Every honest contribution,
though, is a sum of samples with ‖z‖ ≤ R, at most M samples per client, over at most n
clients, and such a total obeys, per class c (N_c samples, first moment A_c = Σ z, second
moment S_c = Σ z zᵀ, or its diagonal D_c = Σ z⊙z, and the pooled B = Σ_c S_c):

=================  ============================================================  ======
check              law                                                           where
=================  ============================================================  ======
``finite``         every value finite                                            (B0)
``counts``         N_c integral and 0 ≤ N_c ≤ n·M                                (B1)
``total count``    Σ_c N_c ≤ n·M; 0 ≤ n_clipped ≤ Σ_c N_c                        (B2)
``first moment``   ‖A_c‖ ≤ R·N_c  (triangle inequality)                          (B3)
``second moment``  tr S_c ≤ R²·N_c  (Σ_j D_c[j] for D_c; tr B ≤ R²·Σ_c N_c)      (B4)
``psd``            S_c ⪰ 0 and B ⪰ 0; D_c ≥ 0 entrywise                          (B5)
``cauchy-schwarz`` ‖A_c‖² ≤ N_c·tr S_c  (‖Σ z‖² ≤ N Σ ‖z‖²)                     (B6)
=================  ============================================================  ======

:func:`check_bounds` tests them on the flattened vectors of a payload or a decoded total
(:meth:`~ghofl.stats.schema.ModeSchema.flatten` layout, every mode, projected statistics
included: R bounds the vector that is accumulated, after the projection) and returns the
failures by name; an empty tuple means the values are what clipping at R can produce.

Rounding. Nothing is compared exactly; every tolerance comes from the arithmetic that made the
values (u = 2⁻⁵³, γ_m = m·u/(1 − m·u), the classic bound of m floating-point additions):

* a client's sums of at most M samples, the norms of d-vectors and the server's addition of n
  payloads round each value by at most γ_m relative with m = M + d + n + 2, widened by the
  unit roundoff of any transport (float32 files);
* the fixed-point words (:class:`~ghofl.secure.fixedpoint.FixedPointCodec`) add at most
  ``error_bound(kind)`` to every entry: √d times that to a norm, d times that to a trace or
  to an eigenvalue;
* the PSD test (one Cholesky factorisation of S + τ·I) uses τ = (γ_m + d·u)·tr S + d·e₂,
  e₂ the codec's error bound of a second-moment entry (a matrix of entries within e₂ has
  eigenvalues within d·e₂; the factorisation's own backward error is within d·u·tr S).

Differential privacy. A total released under distributed DP carries Gaussian noise of public
standard deviation σ_b per entry of block b (:class:`TotalLimits` ``noise``); the checks then
widen each bound by a margin that honest noise exceeds with probability at most
``failure_probability`` (default 10⁻⁹) over the whole total: the probability is split evenly
over the m = 4(C + 1) events tested per section (a union bound: count, first moment,
second moment and PSD of each class and of the pooled terms), and with p = 10⁻⁹/m each
margin is

* a count, a trace (a sum of d entries, σ√d): z_p·σ, z_p the two-sided Gaussian quantile;
* a norm of d noisy entries: σ(√d + √(2 ln 1/p)) (the norm is 1-Lipschitz, E‖g‖ ≤ √d);
* the smallest eigenvalue of a noisy symmetric d×d matrix: σ(2√d + 2√(ln 1/p)) (E λ_max of
  the noise ≤ 2σ√d, as for the GOE, which has more diagonal noise and so, λ_max being
  convex, a larger mean; and λ_max is √2·σ-Lipschitz in the independent entries);
* an entry of a noisy D_c, each of d: the one-sided quantile of p/d.

Under central DP the server checks the exact total before it adds noise (no margin). The
noise is treated as Gaussian; distributed shares are clamped at 12 standard deviations
(:mod:`ghofl.privacy.distributed`, N4), which acts with probability below 10⁻²⁵ and only
shrinks the noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ClientRefusalError, StatsValidationError, TotalOutOfBoundsError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import Kind, parts, schema_for, unpack_upper

if TYPE_CHECKING:  # fixedpoint and config import this module
    from ghofl.secure.config import SessionParams
    from ghofl.secure.fixedpoint import FixedPointCodec

__all__ = [
    "CHECKS",
    "DEFAULT_FAILURE_PROBABILITY",
    "BoundFailure",
    "BoundedDecoder",
    "TotalLimits",
    "bounds_message",
    "check_bounds",
    "check_stats_bounds",
    "refuse_client_stats",
    "refuse_total",
]

F64 = NDArray[np.float64]

#: Names of the checks, in the order they are reported (see the module docstring).
CHECKS: tuple[str, ...] = ("finite", "counts", "total count", "first moment", "second moment",
                           "psd", "cauchy-schwarz")
#: Probability that an honest noisy total fails any check (the margins are sized for it).
DEFAULT_FAILURE_PROBABILITY = 1e-9
_U = 2.0**-53
#: Events per class and section tested (count, first moment, second moment, psd), for the
#: union bound; the pooled B and the total count add one class worth.
_EVENTS_PER_CLASS = 4


@dataclass(frozen=True)
class TotalLimits:
    """The public limits a payload or a total is checked against.

    Parameters
    ----------
    clip_norm : float
        R, the per-sample L2 clipping bound.
    num_clients : int, default 1
        n, clients whose contributions may be in the values (1 for one client's payload).
    max_samples : int or None, default None
        M, the public maximum samples per client; ``None``: no public maximum (plain sums),
        counts are then only checked to be non-negative integers.
    entry_error : mapping of kind to float, optional
        Largest absolute error an entry of each kind (``"count"``, ``"first"``, ``"second"``)
        may carry from its encoding (:meth:`FixedPointCodec.error_bound`); default exact.
    rounding : float, default 0.0
        Unit roundoff of a transport the values went through (2⁻²⁴ for float32).
    noise : mapping of str to float, optional
        Standard deviation of the Gaussian noise on every entry of each block of the values
        (keys :func:`~ghofl.privacy.block_names`: ``counts`` and the float arrays); ``None``:
        no noise. Counts are then not required to be integral.
    failure_probability : float, default 1e-9
        Largest probability that honest noise fails a check (only with ``noise``).
    """

    clip_norm: float
    num_clients: int = 1
    max_samples: int | None = None
    entry_error: Mapping[str, float] = field(default_factory=dict)
    rounding: float = 0.0
    noise: Mapping[str, float] | None = None
    failure_probability: float = DEFAULT_FAILURE_PROBABILITY

    @classmethod
    def for_codec(cls, codec: FixedPointCodec, contributors: int | None = None,
                  noise: Mapping[str, float] | None = None, count_error: float = 0.0,
                  ) -> TotalLimits:
        """Limits of a total decoded by ``codec`` (a :class:`FixedPointCodec`).

        Parameters
        ----------
        codec : FixedPointCodec
        contributors : int, optional
            Clients whose payloads are in the total (default the codec's K).
        noise : mapping of str to float, optional
            σ per block of the noise in the total (distributed DP).
        count_error : float, default 0.0
            Absolute rounding error of a decoded count (noisy counts travel in fixed point).
        """
        kinds: tuple[Kind, ...] = ("first", "second")
        errors: dict[str, float] = {k: codec.error_bound(k) for k in kinds}
        errors["count"] = float(count_error)
        n = codec.num_clients if contributors is None else max(int(contributors), 1)
        return cls(codec.clip_norm, n, codec.max_samples, errors, noise=noise)

    def describe(self) -> str:
        """The limits in words, for messages."""
        m = "no public maximum of samples" if self.max_samples is None else (
            f"at most M={self.max_samples} samples per client")
        who = "one client" if self.num_clients == 1 else f"n={self.num_clients} clients"
        dp = "" if self.noise is None else ", with the public DP noise"
        return f"clipping at R={self.clip_norm:g} with {m} over {who}{dp}"


@dataclass(frozen=True)
class BoundFailure:
    """One failed check: its name (one of :data:`CHECKS`), where, and the numbers."""

    check: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"{self.check} ({self.where}): {self.detail}"


def bounds_message(failures: tuple[BoundFailure, ...], shown: int = 3,
                   public: bool = False) -> str:
    """The first ``shown`` failures in words, and how many more there are.

    ``public``: only each check's name and where it failed (a class name, public), without
    the numbers of the values checked (a client's refusal, which leaves the client).
    """
    text = "; ".join(f"{f.check} ({f.where})" if public else str(f) for f in failures[:shown])
    more = len(failures) - shown
    return text + (f"; and {more} more" if more > 0 else "")


# ---------------------------------------------------------------------- tolerances
@dataclass(frozen=True)
class _Tol:
    """Tolerances of one section: rounding (γ, entry errors) and noise margins."""

    gamma: float
    e_count: float
    e_first: float
    e_second: float
    m_count: float      # count noise margin (one class)
    m_count_sum: float  # Σ of C counts
    m_norm: float       # norm of a d-vector of first-moment noise
    m_norm_sum: float   # the same for Σ_c A_c (pooled B)
    m_trace: float      # trace of a noisy second-moment matrix or Σ_j D_c[j]
    m_trace_b: float    # trace of the noisy B
    m_eig: float        # smallest eigenvalue of the noise of S_c
    m_eig_b: float      # the same for B
    m_diag: float       # one entry of a noisy D_c


def _z_two_sided(p: float) -> float:
    from scipy.special import erfcinv  # on first use: scipy is slow to import

    return float(math.sqrt(2.0) * erfcinv(p))


def _tolerances(meta: StatsMeta, limits: TotalLimits, samples: float) -> _Tol:
    d, c = meta.dim, meta.num_classes
    terms = samples + d + limits.num_clients + 2
    gamma = terms * _U / (1.0 - terms * _U) if terms * _U < 0.5 else 1.0  # γ_m, for m·u < 1/2
    gamma = (1.0 + gamma) * (1.0 + limits.rounding) - 1.0
    err = limits.entry_error
    noise = limits.noise or {}
    sch = schema_for(meta.mode)
    second = [a.name for a in sch.float_arrays if a.kind == "second"]
    s_cls = max((noise.get(n, 0.0) for n in second if n != "scatter"), default=0.0)
    s_b = noise.get("scatter", 0.0)
    s_n, s_a = noise.get("counts", 0.0), noise.get("sums", 0.0)
    events = len(parts(meta.has_holdout)) * _EVENTS_PER_CLASS * (c + 1)
    p = limits.failure_probability / events
    z, lg = _z_two_sided(p), math.sqrt(math.log(1.0 / p))
    z_d = _z_two_sided(2.0 * p / max(d, 1))  # one-sided quantile of p/d
    rd = math.sqrt(d)
    return _Tol(
        gamma=gamma,
        e_count=err.get("count", 0.0), e_first=rd * err.get("first", 0.0),
        e_second=d * err.get("second", 0.0),
        m_count=z * s_n, m_count_sum=z * s_n * math.sqrt(c),
        m_norm=s_a * (rd + math.sqrt(2.0) * lg),
        m_norm_sum=s_a * math.sqrt(c) * (rd + math.sqrt(2.0) * lg),
        m_trace=z * s_cls * rd, m_trace_b=z * s_b * rd,
        m_eig=s_cls * (2.0 * rd + 2.0 * lg), m_eig_b=s_b * (2.0 * rd + 2.0 * lg),
        m_diag=z_d * s_cls,
    )


# ---------------------------------------------------------------------- the checks
@dataclass(frozen=True)
class _Moment:
    """One (count, first moment, second moment) triple to test: a class, or the pooled B."""

    where: str
    count: float
    first: F64
    trace: float | None  # None: no second moment (a class in modes 'means', 'gram')
    matrix: F64 | None  # (d, d) second moment, or None
    diag: F64 | None    # (d,) diagonal second moment, or None
    pooled: bool = False


def check_bounds(meta: StatsMeta, ints: NDArray[np.generic], floats: NDArray[np.generic],
                 limits: TotalLimits, psd: bool = True) -> tuple[BoundFailure, ...]:
    """Every check of the module docstring on flattened statistics; the failures, in order.

    Parameters
    ----------
    meta : StatsMeta
        Mode, classes, dimension and held-out section of the values.
    ints : ndarray, shape (C + 1,) or (2C + 2,)
        Layout :meth:`~ghofl.stats.schema.ModeSchema.int_layout`: counts and n_clipped per
        section (float counts allowed: noisy counts of a DP total).
    floats : ndarray, shape (F,) or (2F,)
        Layout :meth:`~ghofl.stats.schema.ModeSchema.float_layout`.
    limits : TotalLimits
    psd : bool, default True
        Run the ``psd`` check (one Cholesky factorisation per d×d matrix, the only check
        that costs more than reading the values; a :class:`ClientStats` already validates it
        when built, so a client skips it).

    Returns
    -------
    tuple of BoundFailure
        Empty when every check passes.

    Raises
    ------
    StatsValidationError
        The vectors do not have the layout of ``meta``.
    """
    iv = np.asarray(ints, dtype=np.float64)
    fv = np.asarray(floats, dtype=np.float64)
    sch = schema_for(meta.mode)
    c, d = meta.num_classes, meta.dim
    ilay = {s.name: s for s in sch.int_layout(c, d, meta.has_holdout)}
    flay = {s.name: s for s in sch.float_layout(c, d, meta.has_holdout)}
    sizes = (sum(g.size for g in ilay.values()), sum(g.size for g in flay.values()))
    if (iv.shape, fv.shape) != ((sizes[0],), (sizes[1],)):
        raise StatsValidationError(
            f"the vectors checked against the bounds must have shapes ({sizes[0]},) and "
            f"({sizes[1]},) for mode {meta.mode!r} statistics with C={c} and d={d}; got "
            f"{iv.shape} and {fv.shape}; pass the vectors of ModeSchema.flatten"
        )
    bad = [name for name, v in (("counts", iv), ("floats", fv)) if not np.all(np.isfinite(v))]
    if bad:
        return tuple(BoundFailure("finite", w, "holds NaN or infinite values") for w in bad)
    out: list[BoundFailure] = []
    for part in parts(meta.has_holdout):
        seg = ilay[part + "counts"]
        counts = iv[seg.offset : seg.stop]
        n_clipped = float(iv[ilay[part + "n_clipped"].offset])
        blocks = {a.name: fv[flay[part + a.name].offset : flay[part + a.name].stop]
                  for a in sch.float_arrays}
        samples = float(limits.max_samples if limits.max_samples is not None else
                        max(float(np.sum(np.maximum(counts, 0.0))), 1.0))
        tol = _tolerances(meta, limits, samples)
        with np.errstate(over="ignore", invalid="ignore"):
            out += _check_counts(meta, part, counts, n_clipped, limits, tol)
            for mom in _moments(meta, part, counts, blocks, psd):
                out += _check_moment(mom, limits, tol, psd)
    order = {name: i for i, name in enumerate(CHECKS)}
    return tuple(sorted(out, key=lambda f: order[f.check]))


def check_stats_bounds(stats: ClientStats | PackedStats, limits: TotalLimits, psd: bool = True
                       ) -> tuple[BoundFailure, ...]:
    """:func:`check_bounds` of ``stats`` (flattened with its mode's schema)."""
    ints, floats = schema_for(stats.mode).flatten(stats)
    return check_bounds(stats.meta, ints, floats, limits, psd)


def _cls(meta: StatsMeta, part: str, c: int) -> str:
    return f"{part}class {meta.classes[c]!r}"


def _check_counts(meta: StatsMeta, part: str, counts: F64, n_clipped: float,
                  limits: TotalLimits, tol: _Tol) -> list[BoundFailure]:
    out: list[BoundFailure] = []
    n, m = limits.num_clients, limits.max_samples
    cap = math.inf if m is None else float(n) * float(m)
    slack = tol.m_count + tol.e_count
    what = f"[0, n·M] = [0, {cap:.6g}]" if m is not None else "[0, ∞)"
    if limits.noise is not None:
        what += f" by more than the noise margin {slack:.3g}"
    for c in np.flatnonzero((counts < -slack) | (counts > cap + slack)):
        out.append(BoundFailure("counts", _cls(meta, part, int(c)),
                                f"N_c = {counts[c]:.10g} lies outside {what}"))
    if limits.noise is None:
        for c in np.flatnonzero(counts != np.rint(counts)):
            out.append(BoundFailure("counts", _cls(meta, part, int(c)),
                                    f"N_c = {counts[c]:.10g} is not an integer"))
    total = float(np.sum(counts))
    c_all = meta.num_classes
    if total > cap + tol.m_count_sum + c_all * tol.e_count:
        out.append(BoundFailure("total count", f"{part}all classes",
                                f"Σ_c N_c = {total:.10g} > n·M = {cap:.6g}"))
    if limits.noise is None and not 0.0 <= n_clipped <= max(total, 0.0):
        out.append(BoundFailure("total count", f"{part}n_clipped",
                                f"n_clipped = {n_clipped:.10g} lies outside [0, Σ_c N_c] = "
                                f"[0, {total:.10g}]"))
    return out


def _moments(meta: StatsMeta, part: str, counts: F64, blocks: Mapping[str, F64],
             matrices: bool) -> Iterator[_Moment]:
    """The moments to test, one class at a time (then the pooled B).

    The (d, d) matrices are unpacked only when ``matrices`` (for the PSD check),
    else only their traces are read.
    """
    c, d = meta.num_classes, meta.dim
    sums = blocks["sums"].reshape(c, d)
    scatter = blocks.get("class_scatter")
    sq = blocks.get("sq_sums")
    tri = d * (d + 1) // 2
    on_diag = np.cumsum(np.r_[0, np.arange(d, 1, -1)])  # (i, i) in a packed upper triangle

    def matrix(packed: F64) -> tuple[float, F64 | None]:
        return (float(np.sum(packed[on_diag])),
                unpack_upper(packed, d) if matrices else None)

    for k in range(c):
        where = _cls(meta, part, k)
        if scatter is not None:
            tr, mat = matrix(scatter[k * tri : (k + 1) * tri])
            yield _Moment(where, float(counts[k]), sums[k], tr, mat, None)
        elif sq is None:  # modes 'means', 'gram': counts and first moments per class
            yield _Moment(where, float(counts[k]), sums[k], None, None, None)
        else:
            diag = sq.reshape(c, d)[k]
            yield _Moment(where, float(counts[k]), sums[k], float(np.sum(diag)), None, diag)
    b = blocks.get("scatter")
    if b is not None:
        tr, mat = matrix(b)
        yield _Moment(f"{part}pooled B", float(np.sum(counts)), sums.sum(axis=0), tr, mat,
                      None, pooled=True)


def _norm(v: F64) -> float:
    """‖v‖ without overflow for finite entries of any magnitude."""
    peak = float(np.max(np.abs(v), initial=0.0))
    if peak == 0.0 or not math.isfinite(peak):
        return peak
    return peak * float(np.linalg.norm(v / peak))


def _check_moment(mom: _Moment, limits: TotalLimits, tol: _Tol, psd: bool
                  ) -> list[BoundFailure]:
    out: list[BoundFailure] = []
    r, g = limits.clip_norm, tol.gamma
    m_n = tol.m_count_sum if mom.pooled else tol.m_count
    m_a = tol.m_norm_sum if mom.pooled else tol.m_norm
    m_t = tol.m_trace_b if mom.pooled else tol.m_trace
    n_hi = max(mom.count + m_n + tol.e_count, 0.0)  # the count, at its largest honest value
    norm = _norm(mom.first)
    if norm > r * n_hi * (1.0 + g) + tol.e_first + m_a:
        out.append(BoundFailure("first moment", mom.where,
                                f"‖A‖ = {norm:.6g} > R·N = {r * mom.count:.6g}"))
    if mom.trace is None:
        return out
    if mom.trace > r * r * n_hi * (1.0 + g) + tol.e_second + m_t:
        out.append(BoundFailure("second moment", mom.where,
                                f"tr S = {mom.trace:.6g} > R²·N = {r * r * mom.count:.6g}"))
    why = _psd_failure(mom, tol) if psd else None
    if why is not None:
        out.append(BoundFailure("psd", mom.where, why))
    tr_hi = max(mom.trace + tol.e_second + m_t, 0.0) / (1.0 - g)
    if norm > (1.0 + g) * math.sqrt(n_hi) * math.sqrt(tr_hi) + tol.e_first + m_a:
        out.append(BoundFailure("cauchy-schwarz", mom.where,
                                f"‖A‖² = {norm * norm:.6g} > N·tr S = "
                                f"{mom.count * mom.trace:.6g}"))
    return out


def _psd_failure(mom: _Moment, tol: _Tol) -> str | None:
    """Why the second moment is not positive semi-definite within tolerance, or ``None``."""
    d = mom.first.size
    trace = 0.0 if mom.trace is None else max(mom.trace, 0.0)
    if mom.diag is not None:
        low = float(np.min(mom.diag, initial=0.0))
        floor = tol.gamma * trace + tol.e_second + tol.m_diag
        return None if low >= -floor else f"an entry of D is {low:.6g} < 0"
    assert mom.matrix is not None
    m_eig = tol.m_eig_b if mom.pooled else tol.m_eig
    tau = (tol.gamma + d * _U) * trace + tol.e_second + m_eig
    scale = max(float(np.max(np.abs(mom.matrix), initial=0.0)), tau)
    if scale == 0.0:
        return None
    from scipy.linalg import LinAlgError, cholesky

    shifted = mom.matrix / scale
    shifted[np.diag_indices(d)] += tau / scale
    try:
        factor = cholesky(shifted, lower=True, check_finite=False)
        ok = bool(np.all(np.isfinite(factor)))
    except LinAlgError:
        ok = False
    return None if ok else f"S has an eigenvalue below −{tau:.3g} (sums of z zᵀ have none)"


# ---------------------------------------------------------------------- the two sides
def refuse_client_stats(stats: ClientStats, max_samples: int,
                        flat: tuple[NDArray[np.int64], NDArray[np.float64]] | None = None
                        ) -> None:
    """Client side: refuse statistics that clipping at their R cannot produce.

    One client, at most ``max_samples``; PSD is not re-checked (:class:`ClientStats` validates it).

    Parameters
    ----------
    stats : ClientStats
    max_samples : int
        M.
    flat : (ints, floats), optional
        ``schema_for(stats.mode).flatten(stats)`` when the caller has it already.

    Raises
    ------
    ClientRefusalError
        Naming the failed checks, where (the class), the public limits and the fix
        (recompute with clipping at R); never a number of the statistics, since a node
        returns the message to the server. The numbers are in its ``local_detail``.
    """
    r = stats.meta.clip_norm
    if r is None:
        return
    limits = TotalLimits(float(r), 1, int(max_samples), rounding=stats.rounding)
    ints, floats = schema_for(stats.mode).flatten(stats) if flat is None else flat
    failures = check_bounds(stats.meta, ints, floats, limits, psd=False)
    if failures:
        raise ClientRefusalError(
            f"these statistics are not what {limits.describe()} can produce: "
            f"{bounds_message(failures, public=True)}; recompute them from the embeddings with "
            f"clipping at R={r:g} (--clip {r:g}) instead of editing or merging them by hand",
            local_detail=bounds_message(failures, shown=len(failures)))


def refuse_total(failures: tuple[BoundFailure, ...], limits: TotalLimits, what: str) -> None:
    """Server side: raise :class:`~ghofl.errors.TotalOutOfBoundsError` for ``failures``."""
    if failures:
        raise TotalOutOfBoundsError(
            f"{what} aborted: the total fails the bounds of {limits.describe()}: "
            f"{bounds_message(failures)}; a client sent statistics beyond the public bounds "
            "(poisoned or corrupt), so nothing is fitted or released",
            tuple(f.check for f in failures))


class BoundedDecoder:
    """Server side of the secure sum: a decoder that checks the decoded total.

    The ``decode`` of a :class:`~ghofl.secure.SecAggServer`; it checks the total
    before validating it.

    Parameters
    ----------
    contributors : callable returning int, optional
        How many clients are in the sum (e.g. the server half's survivors); default the
        round's n.

    Raises (when called)
    --------------------
    TotalOutOfBoundsError
        The total fails a check of :func:`check_bounds`; nothing is decoded.
    """

    def __init__(self, contributors: Callable[[], int] | None = None) -> None:
        self._contributors = contributors

    def __call__(self, params: SessionParams, meta: StatsMeta, words: NDArray[np.uint64]
                 ) -> ClientStats:
        """Decode ``words`` into the total, refusing it when it fails the bounds."""
        codec = params.codec
        ints, floats = codec.decode_vectors(meta, words)
        n = None if self._contributors is None else self._contributors()
        limits = TotalLimits.for_codec(codec, n)
        refuse_total(check_bounds(meta, ints, floats, limits), limits, "secure aggregation")
        return unflatten_stats(meta, ints, floats)
