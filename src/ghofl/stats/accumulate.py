"""Incremental client-side accumulation of :class:`ClientStats` from batches of embeddings.

Per-class second moments S_c: each batch is sorted by label once and the rows of each class
present are gathered and multiplied in one product ``zᵀz`` (up to :data:`_BLOCK_BYTES` of rows
at a time), so the cost is one pass of Σ_c n_c d² flops, i.e. the cost of a single ``xᵀx``.
The modes without S_c take B in one product of the rows in order and, for up to 32 classes,
the class sums from cache-sized slices of the rows (no gather by class, no BLAS call). No
Python loop runs per sample. Large batches run on every core, one BLAS thread each: the
classes (with S_c) or one row range per core (without), so that single-threaded gathers and
sums overlap the products.

Every product is numpy's ``zᵀz`` (:mod:`ghofl.stats._products`): exactly symmetric, and one
BLAS library, numpy's, the one the rest of the client's numpy work uses, serves the module.
(SciPy's bundled OpenBLAS, whose ``dsyrk`` accumulates in place, ran ``xᵀx`` 4-6 % slower at
n = 50,000, d = 1280 on the benchmark machine, its one-hot ``dgemm`` for the class sums ran
far below peak, and alternating between two libraries' thread pools costs about 50 ms per
switch while the idle pool's threads spin.)

With a clipping bound R every accumulated row z (after the projection, if any) is replaced by
z·min(1, R/‖z‖), so each sample adds at most 1 to a count, R to a first-moment entry and R² to
a second-moment entry. Clipping happens on the block buffer the accumulation already fills,
so no extra copy of the data is made.

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
from ghofl.stats._products import Scratch, spread
from ghofl.stats._threads import thread_count
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import EncoderInfo, Mode, StatsMeta, check_holdout_fraction
from ghofl.stats.projection import ProjectionSpec
from ghofl.stats.schema import schema_for

#: Up to this many classes, the modes without S_c add the class sums in row order, picking each
#: class's rows from cache-sized slices; with more, the rows are gathered by class.
_ROW_ORDER_CLASSES = 32

#: Bytes of float64 rows that one product takes at most (a class's gathered rows, or converted
#: or clipped rows in a reused buffer; at least :data:`_MIN_BLOCK_ROWS` rows).
_BLOCK_BYTES = 64 << 20
_MIN_BLOCK_ROWS = 1024

#: Bytes of one slice of rows for the class sums in row order (it stays in cache while the
#: rows of each class present are picked from it).
_SUM_BYTES = 8 << 20

#: Flops (rows · k²) of a batch's products from which they are spread over threads (one BLAS
#: thread each).
_THREADED_FLOPS = 1 << 30

#: Rows per batch of :func:`compute_stats` when a batch copies rows (projected or held out).
_BATCH_ROWS = 32768

#: The row-order path splits a large batch into one row range per core from this many rows
#: per dimension k: each extra range costs one more k × k product output (written, mirrored
#: and added: O(k²)) and moves its share of the class sums (O(rows·k)) beside the products.
_SPLIT_ROWS = 8

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
        # S_c (C, d, d) and B (d, d) accumulate in place in the final C-ordered arrays.
        self._cs = zeros.get("class_scatter")
        self._b = zeros.get("scatter")
        self._cs_taken: NDArray[np.float64] | None = None
        self._b_taken: NDArray[np.float64] | None = None
        # Which of S_c and B no update has written yet: their first product is written into
        # them directly (the zero pages written once, never read).
        self._cs_fresh = np.ones(c, dtype=bool)
        self._b_fresh = True
        # Reused buffers, one set per thread that adds products (the first: this thread's).
        self._scratch = [Scratch()]
        # Arrays of the row ranges after the first (_add_by_rows): B's, A_c's and D_c's.
        self._partial: list[tuple[NDArray[np.float64], ...]] = []
        # Rows per product at most (see _BLOCK_BYTES).
        self._chunk = max(_MIN_BLOCK_ROWS, _BLOCK_BYTES // (8 * out_dim))
        # Rows per slice of the class sums in row order.
        self._sum_rows = max(16, _SUM_BYTES // (8 * out_dim))

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
            self._b = np.array(self._b_taken)
            self._b_fresh = False
        if xin.shape[0] == 0:
            return
        if self.meta.projection is not None:
            xin = self.meta.projection.apply(xin)
        counts = np.bincount(yy, minlength=self.meta.num_classes)
        self._counts += counts
        with np.errstate(over="ignore"):  # a sum beyond float64 is ±inf: the caller's to check
            if self._cs is None and self.meta.num_classes <= _ROW_ORDER_CLASSES:
                self._add_by_rows(xin, yy)
            else:
                self._add_by_class(xin, yy, counts)

    def _add_by_rows(self, xin: NDArray[Any], yy: NDArray[np.int64]) -> None:
        """Add a batch in row order (the modes without S_c, few classes): no gather by class.

        A large batch (:data:`_THREADED_FLOPS`, and :data:`_SPLIT_ROWS` rows per dimension)
        is split into one row range per core, all added at once (``spread``): the first range
        to the accumulated arrays, each other one to arrays of its own (reused across
        batches), added once all are done; so the class sums, single-threaded, run beside the
        other ranges' products. Each range: :meth:`_add_range`.
        """
        n, k = xin.shape
        parts = 1
        if n * k * k >= _THREADED_FLOPS and n >= _SPLIT_ROWS * k:
            parts = thread_count(n)
        edges = np.linspace(0, n, parts + 1).astype(int)
        c = self.meta.num_classes
        while len(self._partial) < parts - 1:
            self._partial.append((np.empty((k, k)), np.empty((c, k)), np.empty((c, k))))
        clipped = np.zeros(parts, dtype=np.int64)
        fresh = self._b_fresh

        def add(i: int, scratch: Scratch) -> None:
            rows = slice(edges[i], edges[i + 1])
            if i == 0:
                clipped[0] = self._add_range(xin[rows], yy[rows], scratch, self._b, fresh,
                                             self._sums, self._sq)
                return
            b, sums, sq = self._partial[i - 1]
            sums[:] = 0.0
            sq[:] = 0.0
            clipped[i] = self._add_range(xin[rows], yy[rows], scratch,
                                         None if self._b is None else b, True, sums,
                                         None if self._sq is None else sq)

        spread(parts, add, self._scratch, parts)
        for b, sums, sq in self._partial[: parts - 1]:
            if self._b is not None:
                self._b += b
            self._sums += sums
            if self._sq is not None:
                self._sq += sq
        self._b_fresh = False
        self._n_clipped += int(clipped.sum())

    def _add_range(self, xin: NDArray[Any], yy: NDArray[np.int64], scratch: Scratch,
                   b: NDArray[np.float64] | None, fresh: bool, sums: NDArray[np.float64],
                   sq: NDArray[np.float64] | None) -> int:
        """Add rows ``xin`` (m, k), labels ``yy`` (m,), to ``b`` (k, k), ``sums`` and ``sq`` (C, k).

        ``b`` takes the rows in one product when they are float64 C-ordered and unclipped (a
        view, no copy), else a converted or clipped block of ``_chunk`` rows at a time in the
        reused buffer; ``fresh``: ``b`` holds no sum yet. The class sums come from the same
        blocks (:meth:`_add_row_sums`). Returns the number of rows clipped.
        """
        clip = self.meta.clip_norm
        m = xin.shape[0]
        view = clip is None and xin.dtype == np.float64 and xin.flags.c_contiguous
        step = max(m, 1) if view else self._chunk
        clipped = 0
        for start in range(0, m, step):
            stop = min(start + step, m)
            block = xin[start:stop] if view else scratch.rows(xin[start:stop], min(step, m))
            if clip is not None:
                clipped += clip_rows(block, clip)
            if b is not None:
                scratch.add_gram(b, block, fresh)
                fresh = False
            self._add_row_sums(block, yy[start:stop], sums, sq)
        return clipped

    def _add_row_sums(self, block: NDArray[np.float64], labels: NDArray[np.int64],
                      sums: NDArray[np.float64], sq: NDArray[np.float64] | None) -> None:
        """Add rows ``block`` (m, k) with labels ``labels`` (m,) to ``sums`` (C, k) and ``sq``.

        In slices of ``_sum_rows`` rows, small enough to stay in cache: in each, the rows of
        every class present are picked (a small copy) and summed, squared for ``sq``. About one
        pass over the rows from memory and no BLAS call (a one-hot product Yᵀ X of C columns
        runs far below the BLAS peak).
        """
        c = self.meta.num_classes
        for start in range(0, block.shape[0], self._sum_rows):
            part = block[start : start + self._sum_rows]
            lab = labels[start : start + self._sum_rows]
            for k in np.flatnonzero(np.bincount(lab, minlength=c)):
                rows = part[lab == k]
                sums[k] += rows.sum(axis=0)
                if sq is not None:
                    sq[k] += np.einsum("ij,ij->j", rows, rows)

    def _add_by_class(self, xin: NDArray[Any], yy: NDArray[np.int64],
                      counts: NDArray[np.int64]) -> None:
        """Add a batch class by class: rows sorted by label once, gathered a block at a time.

        The path of the modes with S_c (and of the others with many classes). The classes are
        taken largest first; when the batch's products reach :data:`_THREADED_FLOPS` and B is
        not held, they are spread over the cores (:func:`~ghofl.stats._products.spread`; each
        class's arrays are written by one thread only), so that the gather, sums and clipping
        of one class overlap the product of another.
        """
        order = np.argsort(yy, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(counts)])
        present = np.flatnonzero(counts)
        present = present[np.argsort(-counts[present], kind="stable")]
        size = min(self._chunk, int(counts.max()))  # rows of the largest block
        clipped = np.zeros(present.size, dtype=np.int64)
        # With clipping, B accumulates from the clipped class blocks (a second gather-and-clip
        # pass would cost more); without, from row blocks of the batch in order, which for
        # float64 C-ordered input need no copy at all.
        clip = self.meta.clip_norm

        def add(i: int, scratch: Scratch) -> None:
            c = int(present[i])
            rows = order[bounds[c] : bounds[c + 1]]
            for start in range(0, rows.size, self._chunk):
                block = scratch.gather(xin, rows[start : start + self._chunk], size)
                if clip is not None:
                    clipped[i] += clip_rows(block, clip)
                self._add_class_block(c, block, scratch, with_scatter=clip is not None)

        threads = 1
        if self._b is None and xin.shape[0] * xin.shape[1] ** 2 >= _THREADED_FLOPS:
            threads = present.size
        spread(present.size, add, self._scratch, threads)
        self._n_clipped += int(clipped.sum())
        if self._b is not None and clip is None:
            view = xin.dtype == np.float64 and xin.flags.c_contiguous
            scratch = self._scratch[0]
            for start in range(0, xin.shape[0], self._chunk):
                part = xin[start : start + self._chunk]
                block = part if view else scratch.rows(part, min(self._chunk, xin.shape[0]))
                scratch.add_gram(self._b, block, self._b_fresh)
                self._b_fresh = False

    def _add_class_block(self, c: int, block: NDArray[np.float64], scratch: Scratch,
                         with_scatter: bool = False) -> None:
        """Add rows ``block`` (m, k) of class ``c`` to A_c and to D_c or S_c.

        And to B when ``with_scatter`` and the mode holds B.
        """
        self._sums[c] += block.sum(axis=0)
        if self._sq is not None:
            self._sq[c] += np.einsum("ij,ij->j", block, block)
        if self._cs is not None:
            scratch.add_gram(self._cs[c], block, bool(self._cs_fresh[c]))
            self._cs_fresh[c] = False
        if with_scatter and self._b is not None:
            scratch.add_gram(self._b, block, self._b_fresh)
            self._b_fresh = False

    def result(self) -> ClientStats:
        """Return the accumulated statistics as an immutable :class:`ClientStats`.

        The arrays are exact sums of checked, finite batches and exactly symmetric (sums of
        numpy's mirrored ``zᵀz`` products), so they are not re-validated (that check is for
        payloads from outside). The per-class second moments (S_c and B) are handed over
        without a copy; a later :meth:`update` continues on a copy, so the returned value never
        changes.
        """
        cs = self._cs_taken  # result() twice in a row: the same array
        if self._cs is not None:
            cs, self._cs = self._cs, None
            self._cs_taken = cs
        b = self._b_taken
        if self._b is not None:
            b, self._b = self._b, None
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
    batch_size: int | None = None,
    clip_norm: float | None = None,
    holdout_fraction: float = 0.0,
    holdout_seed: int = 0,
    sample_ids: NDArray[Any] | None = None,
    *,
    finite: bool = False,
) -> ClientStats:
    """Statistics of a whole labelled embedding matrix ``x`` (n, d), ``y`` (n,), in batches.

    ``batch_size``: rows per :meth:`StatsAccumulator.update`; by default all of them when a
    batch would copy nothing (no projection, no held-out section: the rows are read through
    views or converted a block at a time), else :data:`_BATCH_ROWS`, which bounds the
    projected and held-out copies. (Each batch costs one more product per k × k matrix.)
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
    if batch_size is None:
        copies = projection is not None or acc.meta.has_holdout
        batch_size = _BATCH_ROWS if copies else max(x.shape[0], 1)
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
