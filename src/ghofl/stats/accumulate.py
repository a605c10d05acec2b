"""Incremental client-side accumulation of :class:`ClientStats` from batches of embeddings.

Per-class accumulation sorts each batch by label once and issues one symmetric rank-k update
(BLAS ``dsyrk``) per class present, so the cost is one pass of Σ_c n_c d² flops, i.e. the
cost of a single ``xᵀx`` with half the work skipped by symmetry. No Python loop runs per sample.

With a clipping bound R every accumulated row z (after the projection, if any) is replaced by
z·min(1, R/‖z‖), so each sample adds at most 1 to a count, R to a first-moment entry and R² to
a second-moment entry. Clipping happens on the small per-chunk buffer the accumulation already
fills, so no extra copy of the data is made.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.blas import dsyrk

from ghofl.errors import InputError
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import EncoderInfo, Mode, StatsMeta
from ghofl.stats.projection import ProjectionSpec
from ghofl.stats.schema import schema_for

#: Clipped rows get norm R·_CLIP_SAFETY: a margin of a few float64 ulps against rounding.
_CLIP_SAFETY = 1.0 - 2.0**-48


class StatsAccumulator:
    """Accumulate statistics over batches so a client never holds all its embeddings at once.

    Parameters
    ----------
    classes : sequence of str or int
        Class names, or the number of classes C (names become ``"0".."C-1"``).
    dim : int
        Encoder dimension d of the embeddings passed to :meth:`update`.
    mode : {"full", "pooled", "diag"}
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
        self.meta = StatsMeta(mode, out_dim, names, encoder, projection, clip_norm=clip_norm)
        self.input_dim = dim
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
        b = zeros.get("scatter")
        self._b = None if b is None else np.asfortranarray(b)
        self._buf: NDArray[np.float64] | None = None
        self._cs_taken: NDArray[np.float64] | None = None
        # Rows per BLAS call: large enough for an efficient rank-k update, small enough
        # (about 8 MB, cache-resident on this machine; 32 MB measured 10-15 % slower).
        self._chunk = max(256, (8 << 20) // (8 * out_dim))

    def update(self, x: NDArray[Any], y: NDArray[Any]) -> None:
        """Add a batch.

        Parameters
        ----------
        x : array_like, shape (n, d)
            Finite embeddings (any float dtype; accumulated in float64).
        y : array_like of int, shape (n,)
            Labels in ``0..C-1``.
        """
        xin, yy = _check_batch(x, y, self.input_dim, self.meta.num_classes)
        if self._cs is None and self._cs_taken is not None:  # result() handed S over: copy back
            self._cs = np.array(self._cs_taken)
        if xin.shape[0] == 0:
            return
        if self.meta.projection is not None:
            xin = self.meta.projection.apply(xin)
        order = np.argsort(yy, kind="stable")
        counts = np.bincount(yy, minlength=self.meta.num_classes)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        self._counts += counts
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
            direct = xin.dtype == np.float64 and xin.flags.c_contiguous
            for start in range(0, xin.shape[0], self._chunk):
                stop = min(start + self._chunk, xin.shape[0])
                block = xin[start:stop] if direct else self._gather(xin, np.arange(start, stop))
                self._b = dsyrk(1.0, block.T, beta=1.0, c=self._b, trans=0, overwrite_c=1)

    def _add_class_block(
        self, c: int, block: NDArray[np.float64], with_scatter: bool = False
    ) -> None:
        """Add rows ``block`` (m, k) of class ``c`` to A_c and to D_c or S_c (and to B when
        ``with_scatter`` and the mode holds B)."""
        self._sums[c] += block.sum(axis=0)
        if self._sq is not None:
            self._sq[c] += np.einsum("ij,ij->j", block, block)
        if self._cs is not None:
            dsyrk(1.0, block.T, beta=1.0, c=self._cs[c].T, trans=0, overwrite_c=1)
        if with_scatter and self._b is not None:
            self._b = dsyrk(1.0, block.T, beta=1.0, c=self._b, trans=0, overwrite_c=1)

    def _gather(self, xin: NDArray[Any], rows: NDArray[np.intp]) -> NDArray[np.float64]:
        """Rows ``rows`` of ``xin`` as a contiguous float64 block in a buffer reused across
        chunks: at most ``_chunk`` rows, so the copy stays small and its pages stay mapped
        (fresh large allocations cost page faults that rival the BLAS work itself)."""
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
        second moments are handed over without a copy; a later :meth:`update` continues on a
        copy, so the returned value never changes.
        """
        cs = self._cs_taken  # result() twice in a row: the same (already mirrored) array
        if self._cs is not None:
            iu = np.triu_indices(self.meta.dim, 1)
            for m in self._cs:
                m[iu] = m.T[iu]  # mirror the lower triangle that dsyrk filled
            cs, self._cs = self._cs, None
            self._cs_taken = cs
        b = None if self._b is None else _symmetrize_upper(self._b)
        return ClientStats._trusted(
            self.meta,
            self._counts.copy(),
            self._sums.copy(),
            sq_sums=None if self._sq is None else self._sq.copy(),
            class_scatter=cs,
            scatter=b,
            n_clipped=self._n_clipped,
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
) -> ClientStats:
    """Statistics of a whole labelled embedding matrix ``x`` (n, d), ``y`` (n,), in batches.

    ``clip_norm`` is the per-sample L2 clipping bound R (see :class:`StatsAccumulator`).
    """
    x = np.asarray(x)
    if x.ndim != 2:
        raise InputError(f"embeddings must be a 2-D array (n, d); got shape {x.shape}")
    acc = StatsAccumulator(classes, x.shape[1], mode, encoder, projection, clip_norm=clip_norm)
    yy = np.asarray(y)
    if yy.shape[:1] != x.shape[:1]:
        raise InputError(
            f"embeddings and labels disagree in length: {x.shape[0]} rows vs {yy.shape[0]} labels"
        )
    for start in range(0, max(x.shape[0], 1), batch_size):
        acc.update(x[start : start + batch_size], yy[start : start + batch_size])
    return acc.result()


def _check_batch(
    x: NDArray[Any], y: NDArray[Any], dim: int, num_classes: int
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
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
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


def clip_rows(z: NDArray[np.float64], clip_norm: float) -> int:
    """Scale, in place, every row of ``z`` (m, k) with ‖z_i‖ > R down to the bound; return how
    many rows were scaled. The common case (no row above R) costs one pass of m·k
    multiply-adds and no (m, k) temporary.

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


def _symmetrize_upper(m: NDArray[np.float64]) -> NDArray[np.float64]:
    """Full symmetric (C-ordered) matrix from ``m`` whose upper triangle holds the values and
    whose strict lower triangle is zero (as ``dsyrk`` leaves a zero-initialised output)."""
    res = np.add(m, m.T)
    diag = np.einsum("ii->i", res)
    diag *= 0.5
    return res
