"""Incremental client-side accumulation of :class:`ClientStats` from batches of embeddings.

Per-class second moments S_c: each batch is sorted by label once and one symmetric rank-k
update (BLAS ``dsyrk``) runs per class present, so the cost is one pass of Σ_c n_c d² flops,
i.e. the cost of a single ``xᵀx`` with half the work skipped by symmetry. The modes without
S_c take B in one rank-k update of the rows in order and, for up to 32 classes, the class sums
as one-hot products (no gather by class). No Python loop runs per sample.

With a clipping bound R every accumulated row z (after the projection, if any) is replaced by
z·min(1, R/‖z‖), so each sample adds at most 1 to a count, R to a first-moment entry and R² to
a second-moment entry. Clipping happens on the small per-chunk buffer the accumulation already
fills, so no extra copy of the data is made.

Held-out section: with a held-out fraction f > 0 each sample is held out or not by a seeded,
per-sample rule (:func:`holdout_mask`: a SplitMix64 hash of the seed and the sample's id, held
out when the hash, as a number in [0, 1), is below f). No generator state is involved, so the
split of a sample depends only on (seed, id, f): not on batching, not on the other samples.
By default the id of a sample is its position in the client's stream (0, 1, 2, ... over all
:meth:`StatsAccumulator.update` calls); a caller that knows global sample ids (e.g. the row
index in a dataset split among simulated clients) passes them as ``sample_ids``, and then the
held-out totals are partition invariant too: the union of the clients' held-out samples is
the same set whichever client holds which sample. The totals over all samples are partition
invariant in both cases.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import InputError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import EncoderInfo, Mode, StatsMeta, check_holdout_fraction
from ghofl.stats.projection import ProjectionSpec
from ghofl.stats.schema import mirror_lower, schema_for

#: Up to this many classes, the modes without S_c add the class sums as one-hot products of
#: row slices (2·C·d flops a row); with more, the rows are gathered by class.
_ONEHOT_CLASSES = 32

#: Clipped rows get norm R·_CLIP_SAFETY: a margin of a few float64 ulps against rounding.
_CLIP_SAFETY = 1.0 - 2.0**-48

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_U64 = (1 << 64) - 1


def _mix64(z: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64 finaliser, elementwise on uint64 (arithmetic modulo 2^64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    out: NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return out


def holdout_mask(sample_ids: Any, fraction: float, seed: int = 0) -> NDArray[np.bool_]:
    """Which samples are held out: the seeded per-sample split rule of every client.

    Sample i is held out iff ``h(seed, id_i) / 2^53 < fraction`` with h the top 53 bits of
    the SplitMix64 output at position ``id_i + 1`` of the stream seeded by
    SplitMix64(``seed``). Deterministic per (seed, id); over many ids about ``fraction`` of
    them are held out, independently of each other.

    Parameters
    ----------
    sample_ids : array_like of int, shape (n,)
        Non-negative sample ids (below 2^63).
    fraction : float
        f in [0, 0.5]; 0 holds out nothing.
    seed : int, default 0
        Seed in [0, 2^64).

    Returns
    -------
    ndarray of bool, shape (n,)

    Raises
    ------
    InputError
        Ids that are not non-negative integers, or a seed out of range.
    """
    f = check_holdout_fraction(fraction)
    ids = np.asarray(sample_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise InputError(
            f"sample ids must be a 1-D array of integers; got shape {ids.shape} and dtype "
            f"{ids.dtype}; pass e.g. the row indices of the samples in their dataset"
        )
    if ids.size and ids.dtype.kind == "i" and int(ids.min()) < 0:
        raise InputError(
            f"sample ids must be non-negative; got {int(ids.min())}; pass e.g. the row "
            "indices of the samples in their dataset"
        )
    seed = _check_seed(seed)
    key = _mix64(np.array([(seed + _GOLDEN) & _U64], np.uint64))[0]
    with np.errstate(over="ignore"):
        state = key + (ids.astype(np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN)
    threshold = np.uint64(int(f * 2.0**53))
    out: NDArray[np.bool_] = (_mix64(state) >> np.uint64(11)) < threshold
    return out


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not (
        0 <= int(seed) <= _U64
    ):
        raise InputError(
            f"the holdout seed must be an integer in [0, 2^64); got {seed!r}; every client of "
            "a federation should use the same seed"
        )
    return int(seed)


class StatsAccumulator:
    """Accumulate statistics over batches so a client never holds all its embeddings at once.

    Parameters
    ----------
    classes : sequence of str or int
        Class names, or the number of classes C (names become ``"0".."C-1"``).
    dim : int
        Encoder dimension d of the embeddings passed to :meth:`update`.
    mode : {"full", "pooled", "gram", "diag", "means"}
        Upload mode (see :class:`ClientStats`).
    encoder : EncoderInfo, optional
        Fingerprint of the encoder that produced the embeddings.
    projection : ProjectionSpec, optional
        Public projection applied to each batch before accumulation (statistics live in
        the k-dimensional space, S_z included).
    clip_norm : float, optional
        Per-sample L2 clipping bound R, applied in the statistics space (after the
        projection): rows with ‖z‖ > R are scaled to norm R and counted in ``n_clipped``.
        Recorded in ``meta.clip_norm``.
    holdout_fraction : float, default 0.0
        Fraction f in (0, 0.5] of samples held out by :func:`holdout_mask`; their sums are
        accumulated again, separately, into the held-out section
        (:attr:`ClientStats.holdout`). 0: no held-out section. Recorded in the metadata.
    holdout_seed : int, default 0
        Seed of the split (not recorded: every client of a federation should use the same).

    Examples
    --------
    >>> acc = StatsAccumulator(3, dim=4, mode="full")
    >>> acc.update(np.ones((2, 4)), np.array([0, 2]))
    >>> acc.result().counts.tolist()
    [1, 0, 1]
    """

    def __init__(
        self,
        classes: Any,
        dim: int,
        mode: Mode = "full",
        encoder: EncoderInfo | None = None,
        projection: ProjectionSpec | None = None,
        clip_norm: float | None = None,
        holdout_fraction: float = 0.0,
        holdout_seed: int = 0,
    ) -> None:
        names = (
            tuple(str(i) for i in range(int(classes)))
            if isinstance(classes, int | np.integer)
            else tuple(str(c) for c in classes)
        )
        if projection is not None and projection.input_dim != dim:
            raise InputError(
                f"projection expects input dim {projection.input_dim} but the embeddings have "
                f"dim {dim}; rebuild the ProjectionSpec with input_dim={dim}"
            )
        out_dim = projection.dim if projection is not None else dim
        self.meta = StatsMeta(mode, out_dim, names, encoder, projection, clip_norm=clip_norm,
                              holdout_fraction=holdout_fraction)
        self.input_dim = dim
        self.holdout_seed = _check_seed(holdout_seed)
        self._seen = 0  # samples passed so far: the default id of the next one
        self._held: StatsAccumulator | None = None
        if self.meta.has_holdout:
            self._held = StatsAccumulator(names, dim, mode, encoder, projection,
                                          clip_norm=clip_norm)
        c = len(names)
        zeros = schema_for(mode).zeros(c, out_dim)
        self._counts = zeros["counts"]
        self._sums = zeros["sums"]
        self._sq = zeros.get("sq_sums")
        self._n_clipped = 0
        # dsyrk writes the upper triangle of Fortran-ordered outputs in place.
        # S_c accumulates in place in the final (C, d, d) array: dsyrk updates the upper
        # triangle of the Fortran-ordered view S_c.T, i.e. the lower triangle of S_c.
        self._cs = zeros.get("class_scatter")
        self._b: NDArray[np.float64] | None = None
        if zeros.get("scatter") is not None:  # B likewise, in a Fortran-ordered (d, d) array
            self._b = np.zeros((out_dim, out_dim), order="F")
        self._b_taken: NDArray[np.float64] | None = None
        # Which of S_c and B no update has written yet (zero pages, written with beta = 0).
        self._cs_fresh = np.ones(c, dtype=bool)
        self._b_fresh = True
        self._buf: NDArray[np.float64] | None = None
        self._sq_buf: NDArray[np.float64] | None = None  # squares of a slice of rows
        self._cs_taken: NDArray[np.float64] | None = None
        # Rows per BLAS call: large enough for an efficient rank-k update, small enough
        # (8 MB) for the chunk to stay in cache.
        self._chunk = max(256, (8 << 20) // (8 * out_dim))
        # Rows per one-hot product of the class sums (2 MB: the slice stays in L2).
        self._sum_rows = max(16, (2 << 20) // (8 * out_dim))

    def update(
        self, x: NDArray[Any], y: NDArray[Any], sample_ids: NDArray[Any] | None = None,
        *, finite: bool = False,
    ) -> None:
        """Add a batch.

        Parameters
        ----------
        x : array_like, shape (n, d)
            Finite embeddings (any float dtype; accumulated in float64).
        y : array_like of int, shape (n,)
            Labels in ``0..C-1``.
        sample_ids : array_like of int, shape (n,), optional
            Ids of the samples for the held-out split (:func:`holdout_mask`); default their
            positions in the stream (the number of samples passed before, plus 0..n-1).
            Ignored without a held-out section.
        finite : bool, default False
            The caller checked that ``x`` is finite
            (:func:`ghofl.data.embeddings.check_labelled_embeddings`); that pass over the
            batch is not repeated (shapes, dtypes and labels are still checked).
        """
        xin, yy = _check_batch(x, y, self.input_dim, self.meta.num_classes, finite)
        n = xin.shape[0]
        if self._held is not None:
            if sample_ids is None:
                ids = np.arange(self._seen, self._seen + n, dtype=np.int64)
            else:
                ids = np.asarray(sample_ids)
                if ids.shape != (n,):
                    raise InputError(
                        f"sample_ids must have shape ({n},) to match the embeddings; got "
                        f"{ids.shape}"
                    )
            mask = holdout_mask(ids, self.meta.holdout_fraction, self.holdout_seed)
            if np.any(mask):
                self._held.update(xin[mask], yy[mask])
        self._seen += n
        if self._cs is None and self._cs_taken is not None:  # result() handed S over: copy back
            self._cs = np.array(self._cs_taken)
            self._cs_fresh[:] = False
        if self._b is None and self._b_taken is not None:  # and B
            self._b = np.array(self._b_taken.T, order="F")
            self._b_fresh = False
        if xin.shape[0] == 0:
            return
        if self.meta.projection is not None:
            xin = self.meta.projection.apply(xin)
        counts = np.bincount(yy, minlength=self.meta.num_classes)
        self._counts += counts
        if self._cs is None and self.meta.num_classes <= _ONEHOT_CLASSES:
            self._add_by_rows(xin, yy)
        else:
            self._add_by_class(xin, yy, counts)

    def _add_by_rows(self, xin: NDArray[Any], yy: NDArray[np.int64]) -> None:
        """Add a batch in row order (the modes without S_c, few classes): no gather by class.

        B takes the batch in one rank-k update when it is float64 C-ordered and unclipped (a
        view, no copy), else a converted or clipped chunk at a time in the reused buffer. The
        class sums A_c (and D_c) are one-hot products Yᵀ X of row slices small enough to stay
        in cache (:meth:`_add_onehot_sums`), at 2·C·k flops a row, a few percent of B's k².
        """
        clip = self.meta.clip_norm
        n = xin.shape[0]
        view = clip is None and xin.dtype == np.float64 and xin.flags.c_contiguous
        step = n if view else self._chunk
        for start in range(0, n, step):
            stop = min(start + step, n)
            block = self._rows(xin, start, stop, copy=clip is not None)
            if clip is not None:
                self._n_clipped += clip_rows(block, clip)
            if self._b is not None:
                self._add_to_b(block)
            self._add_onehot_sums(block, yy[start:stop])

    def _add_onehot_sums(self, block: NDArray[np.float64], labels: NDArray[np.int64]) -> None:
        """Add rows ``block`` (m, k) with labels ``labels`` (m,) to A_c, and to D_c if held.

        BLAS ``dgemm`` of the same library as the rank-k updates (two BLAS thread pools
        taking turns would compete for the cores), on slices of ``_sum_rows`` rows.
        """
        dgemm = _dgemm()
        c, k = self.meta.num_classes, block.shape[1]
        if self._sq is not None and self._sq_buf is None:
            self._sq_buf = np.empty((self._sum_rows, k))
        for start in range(0, block.shape[0], self._sum_rows):
            part = block[start : start + self._sum_rows]
            m = part.shape[0]
            onehot = np.zeros((m, c), order="F")
            onehot[np.arange(m), labels[start : start + m]] = 1.0
            # A_cᵀ (k, C), F-ordered: the transposed C-ordered sums, updated in place.
            dgemm(1.0, part.T, onehot, beta=1.0, c=self._sums.T, overwrite_c=1)
            if self._sq is not None and self._sq_buf is not None:
                sq = np.multiply(part, part, out=self._sq_buf[:m])
                dgemm(1.0, sq.T, onehot, beta=1.0, c=self._sq.T, overwrite_c=1)

    def _add_by_class(self, xin: NDArray[Any], yy: NDArray[np.int64],
                      counts: NDArray[np.int64]) -> None:
        """Add a batch class by class: rows sorted by label once, gathered a chunk at a time.

        The path of the modes with S_c. (One-hot products Yᵀ X for A_c instead of the gather
        would cost C times the flops of the per-class sums.)
        """
        order = np.argsort(yy, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(counts)])
        # With clipping, B accumulates from the clipped class blocks already in the buffer (a
        # second gather-and-clip pass would cost more); without, from contiguous row chunks
        # of the batch, which for float64 input need no copy at all.
        clip = self.meta.clip_norm
        for c in np.flatnonzero(counts):
            rows = order[bounds[c] : bounds[c + 1]]
            for start in range(0, rows.size, self._chunk):
                block = self._gather(xin, rows[start : start + self._chunk])
                if clip is not None:
                    self._n_clipped += clip_rows(block, clip)
                self._add_class_block(int(c), block, with_scatter=clip is not None)
        if self._b is not None and clip is None:
            for start in range(0, xin.shape[0], self._chunk):
                block = self._rows(xin, start, min(start + self._chunk, xin.shape[0]))
                self._add_to_b(block)

    def _rows(self, xin: NDArray[Any], start: int, stop: int,
              copy: bool = False) -> NDArray[np.float64]:
        """Rows ``start:stop`` of ``xin`` as float64, shape (stop - start, k).

        A view of float64 C-ordered input unless ``copy``; other input, or any with ``copy``,
        is copied (converted) into the reused buffer.
        """
        if xin.dtype == np.float64 and xin.flags.c_contiguous and not copy:
            return xin[start:stop]  # type: ignore[no-any-return]
        if self._buf is None:
            self._buf = np.empty((self._chunk, xin.shape[1]))
        out = self._buf[: stop - start]
        np.copyto(out, xin[start:stop], casting="unsafe")
        return out

    def _add_class_block(
        self, c: int, block: NDArray[np.float64], with_scatter: bool = False
    ) -> None:
        """Add rows ``block`` (m, k) of class ``c`` to A_c and to D_c or S_c.

        And to B when ``with_scatter`` and the mode holds B.
        """
        dsyrk = _dsyrk()
        self._sums[c] += block.sum(axis=0)
        if self._sq is not None:
            self._sq[c] += np.einsum("ij,ij->j", block, block)
        if self._cs is not None:
            # First block of a class: beta = 0, so the untouched (zero) pages are written
            # once and never read (reading them first costs a second page fault each).
            beta = 0.0 if self._cs_fresh[c] else 1.0
            dsyrk(1.0, block.T, beta=beta, c=self._cs[c].T, trans=0, overwrite_c=1)
            self._cs_fresh[c] = False
        if with_scatter and self._b is not None:
            self._add_to_b(block)

    def _add_to_b(self, rows: NDArray[np.float64]) -> None:
        """B += rowsᵀ rows (upper triangle of the Fortran-ordered B; beta = 0 the first time)."""
        self._b = _dsyrk()(1.0, rows.T, beta=0.0 if self._b_fresh else 1.0, c=self._b,
                           trans=0, overwrite_c=1)
        self._b_fresh = False

    def _gather(self, xin: NDArray[Any], rows: NDArray[np.intp]) -> NDArray[np.float64]:
        """Rows ``rows`` of ``xin`` as a contiguous float64 block in a reused buffer.

        The buffer is reused across chunks and holds at most ``_chunk`` rows, so the copy
        stays small and its pages stay mapped (fresh large allocations cost page faults
        that rival the BLAS work itself).
        """
        m, d = rows.size, xin.shape[1]
        if self._buf is None:
            self._buf = np.empty((self._chunk, d))
        out = self._buf[:m]
        if xin.dtype == np.float64:
            np.take(xin, rows, axis=0, out=out)
        else:
            np.copyto(out, xin[rows], casting="unsafe")
        return out

    def result(self) -> ClientStats:
        """Return the accumulated statistics as an immutable :class:`ClientStats`.

        The arrays are exact sums of checked, finite batches and symmetric by construction,
        so they are not re-validated (that check is for payloads from outside). The per-class
        second moments (S_c and B) are handed over without a copy; a later :meth:`update`
        continues on a copy, so the returned value never changes.
        """
        cs = self._cs_taken  # result() twice in a row: the same (already mirrored) array
        if self._cs is not None:
            mirror_lower(self._cs)  # the lower triangles dsyrk filled
            cs, self._cs = self._cs, None
            self._cs_taken = cs
        b = self._b_taken
        if self._b is not None:  # F-ordered upper triangle = lower triangle of the C view
            b, self._b = self._b.T, None
            mirror_lower(b[None])
            self._b_taken = b
        return ClientStats._trusted(
            self.meta,
            self._counts.copy(),
            self._sums.copy(),
            sq_sums=None if self._sq is None else self._sq.copy(),
            class_scatter=cs,
            scatter=b,
            n_clipped=self._n_clipped,
            holdout=None if self._held is None else self._held.result(),
        )


def compute_stats(
    x: NDArray[Any],
    y: NDArray[Any],
    classes: Any,
    mode: Mode = "full",
    encoder: EncoderInfo | None = None,
    projection: ProjectionSpec | None = None,
    batch_size: int = 32768,
    clip_norm: float | None = None,
    holdout_fraction: float = 0.0,
    holdout_seed: int = 0,
    sample_ids: NDArray[Any] | None = None,
    *,
    finite: bool = False,
) -> ClientStats:
    """Statistics of a whole labelled embedding matrix ``x`` (n, d), ``y`` (n,), in batches.

    ``clip_norm`` is the per-sample L2 clipping bound R; ``holdout_fraction`` f > 0 adds the
    held-out section over the samples :func:`holdout_mask` picks with ``holdout_seed`` from
    ``sample_ids`` (n,) (default 0..n-1, the row positions); ``finite``: the caller checked
    that ``x`` is finite (not checked again); see :class:`StatsAccumulator`.
    """
    x = np.asarray(x)
    if x.ndim != 2:
        raise InputError(f"embeddings must be a 2-D array (n, d); got shape {x.shape}")
    acc = StatsAccumulator(classes, x.shape[1], mode, encoder, projection, clip_norm=clip_norm,
                           holdout_fraction=holdout_fraction, holdout_seed=holdout_seed)
    yy = np.asarray(y)
    if yy.shape[:1] != x.shape[:1]:
        raise InputError(
            f"embeddings and labels disagree in length: {x.shape[0]} rows vs {yy.shape[0]} labels"
        )
    ids = None if sample_ids is None else np.asarray(sample_ids)
    if ids is not None and ids.shape != (x.shape[0],):
        raise InputError(
            f"sample_ids must have shape ({x.shape[0]},) to match the embeddings; got {ids.shape}"
        )
    for start in range(0, max(x.shape[0], 1), batch_size):
        stop = start + batch_size
        acc.update(x[start:stop], yy[start:stop], None if ids is None else ids[start:stop],
                   finite=finite)
    return acc.result()


def _check_batch(
    x: NDArray[Any], y: NDArray[Any], dim: int, num_classes: int, finite: bool = False
) -> tuple[NDArray[Any], NDArray[np.int64]]:
    x = np.asarray(x)
    y = np.asarray(y)
    if x.ndim != 2 or x.shape[1] != dim:
        raise InputError(f"embeddings must have shape (n, {dim}); got {x.shape}")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise InputError(
            f"labels must have shape ({x.shape[0]},) to match the embeddings; got {y.shape}"
        )
    if x.dtype.kind not in "fiu":
        raise InputError(f"embeddings must be numeric; got dtype {x.dtype}")
    if y.size and y.dtype.kind not in "iu":
        if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise InputError(
                f"labels must be integers in 0..{num_classes - 1}; got dtype {y.dtype}"
            )
    if x.dtype.kind == "f" and not finite and not _all_finite(x):
        bad = int(np.flatnonzero(~np.all(np.isfinite(x), axis=1))[0])
        raise InputError(
            f"embeddings contain NaN or infinite values (first bad row {bad}); fix the encoder "
            "output or drop those rows before computing statistics"
        )
    yy = y.astype(np.int64, copy=False)
    if yy.size and (yy.min() < 0 or yy.max() >= num_classes):
        bad_label = int(yy.min() if yy.min() < 0 else yy.max())
        raise InputError(
            f"label {bad_label} is out of range: labels must lie in 0..{num_classes - 1} "
            f"for {num_classes} classes"
        )
    return x, yy


def _all_finite(x: NDArray[Any], rows: int = 4096) -> bool:
    """Whether every entry of ``x`` (n, d) is finite.

    Checked ``rows`` rows at a time: a small temporary that stays in cache, not one of n·d
    booleans.
    """
    return all(bool(np.isfinite(x[i : i + rows]).all()) for i in range(0, x.shape[0], rows))


def clip_rows(z: NDArray[np.float64], clip_norm: float) -> int:
    """Scale down, in place, every row of ``z`` (m, k) with ‖z_i‖ > R; return how many.

    The common case (no row above R) costs one pass of m·k multiply-adds and no (m, k) temporary.

    A clipped row is scaled to norm R·(1 − 2⁻⁴⁸) rather than R: the margin (about 16 ulps)
    covers the rounding of the norm and of the product, so the per-sample bounds |z_i| ≤ R
    and |z_i z_j| ≤ R² that the fixed-point encoding of secure aggregation relies on hold in
    float64, not only up to rounding. (Sums of N samples still round by O(N·ε) relative.)

    Parameters
    ----------
    z : ndarray of float64, shape (m, k)
        Rows to clip; modified in place.
    clip_norm : float
        R > 0.

    Returns
    -------
    int
        Number of rows scaled.
    """
    sq = np.einsum("ij,ij->i", z, z)
    over = np.flatnonzero(sq > clip_norm * clip_norm)
    if over.size:
        z[over] *= ((clip_norm * _CLIP_SAFETY) / np.sqrt(sq[over]))[:, None]
    return int(over.size)


def _dgemm() -> Any:
    """BLAS ``dgemm`` of SciPy (the library of :func:`_dsyrk`), imported on first use."""
    from scipy.linalg.blas import dgemm

    return dgemm


def _dsyrk() -> Any:
    """BLAS ``dsyrk``, imported on first use (scipy.linalg is slow to import)."""
    from scipy.linalg.blas import dsyrk

    return dsyrk
