"""Totals of many ClientStats payloads, added in place in bounded memory.

:class:`StatsTotal` adds payloads one at a time into one copy, :func:`sum_stats` sums an
iterable with it, and :func:`check_addable` raises what ``total + other`` would raise without
computing the sum. Payloads read packed (:class:`~ghofl.stats.client_stats.packed.PackedStats`,
:func:`~ghofl.stats.codec.load_packed_stats`) are added packed and the total unpacked once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ghofl.errors import IncompatibleStatsError, StatsOverflowError, StatsValidationError
from ghofl.stats.client_stats.laws import Magnitude, check_arrays_addable
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.client_stats.value import ClientStats, check_combinable, check_meta_combinable
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for

__all__ = ["StatsTotal", "check_addable", "sum_stats"]

def sum_stats(items: Iterable[ClientStats | PackedStats]) -> ClientStats:
    """Add statistics one at a time, in place (:class:`StatsTotal`).

    The memory is the running total plus the payload being added, however many there are.

    Equal, bit for bit, to ``items[0] + items[1] + ...`` added left to right (with every
    :class:`~ghofl.stats.client_stats.packed.PackedStats` unpacked); payloads read packed
    (:func:`~ghofl.stats.codec.load_packed_stats`) are added packed, which writes half the
    bytes and unpacks the total once instead of every payload.

    Raises
    ------
    StatsValidationError
        ``items`` is empty.
    IncompatibleStatsError, StatsOverflowError
        As :meth:`StatsTotal.add`, naming the 0-based index of the offending payload.
    """
    total = StatsTotal()
    for s in items:
        total.add(s)
    return total.result()

class StatsTotal:
    """Running total of payloads added in place: bounded-memory server aggregation.

    The first payload is copied once into arrays the total owns; every later one is added into
    them in place (``numpy.add`` with ``out=``), so aggregating any number of payloads holds
    the total and the payload being added (two payloads' worth), never the intermediate sums
    ``a + b`` allocates (a third payload's worth at C = 200, d = 1280 in mode ``full``:
    2.6 GB). Once :meth:`result` has handed those arrays out, the next add writes the sum into
    new ones instead, so a result never changes. The payloads are never modified. The result
    equals, bit for bit, the left-to-right sum ``p0 + p1 + ...`` (same additions, same order).

    Every payload is checked as ``+`` checks it: same metadata (:class:`IncompatibleStatsError`
    naming every difference) and no overflow (:class:`StatsOverflowError`); a refused payload
    leaves the total unchanged, so the caller may skip it and go on. The sum of valid payloads
    is valid by construction, so the total is not re-validated.

    Packed payloads (:class:`~ghofl.stats.client_stats.packed.PackedStats`, what
    :func:`~ghofl.stats.codec.load_packed_stats` reads) are added as they came: a total
    started from one keeps its symmetric matrices packed (the triangles, d(d+1)/2 numbers
    each), adds the next packed payloads into them and unpacks once, in :meth:`result`. The
    sum is the same, bit for bit, as adding the payloads unpacked (:meth:`PackedStats.unpack`
    mirrors each upper triangle, and unpacking the total mirrors the sum of the upper
    triangles, the same additions in the same order). A :class:`ClientStats` added to a
    packed total unpacks the total first (once), and a packed payload added to an unpacked
    total is unpacked, so the two kinds may be mixed in any order.

    Examples
    --------
    >>> total = StatsTotal()
    >>> for payload in payloads:          # doctest: +SKIP
    ...     total.add(payload)
    >>> aggregate = total.result()        # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._count = 0
        self._meta: StatsMeta | None = None
        self._arrays: dict[str, Any] = {}
        self._n_clipped = 0
        self._magnitude = Magnitude(0.0, 0.0)
        self._holdout: StatsTotal | None = None
        self._result: ClientStats | None = None  # shares the arrays: next add writes new ones
        self._packed = False  # the symmetric arrays are packed triangles

    def __len__(self) -> int:
        """Number of payloads added."""
        return self._count

    @property
    def meta(self) -> StatsMeta | None:
        """Metadata of the total (``None`` before the first payload)."""
        return self._meta

    def add(self, stats: ClientStats | PackedStats) -> None:
        """Add one payload to the total (in place; ``stats`` is not modified).

        Raises
        ------
        IncompatibleStatsError
            ``stats`` is neither :class:`ClientStats` nor
            :class:`~ghofl.stats.client_stats.packed.PackedStats`, or its metadata differs
            from the total's; the message starts with ``payload #i (0-based)`` and names
            every difference.
        StatsOverflowError
            The sum would overflow the int64 counts or float64 sums; the total is unchanged.
        """
        i = self._count
        try:
            if isinstance(stats, PackedStats):
                check_meta_combinable(self._meta, stats.meta)
            else:
                check_combinable(self._meta, stats)
        except IncompatibleStatsError as exc:
            raise IncompatibleStatsError(f"payload #{i} (0-based): {exc}") from exc
        if self._meta is None:
            self._start(stats)
            self._count = 1
            return
        stats = self._alike(stats)
        try:
            self._check_addable(stats)
        except StatsOverflowError as exc:
            raise StatsOverflowError(
                f"cannot add payload #{i} (0-based) to the total of the payloads before it: {exc}"
            ) from exc
        self._add(stats)
        self._count += 1

    def result(self) -> ClientStats:
        """The total as :class:`ClientStats`.

        The result holds the total's own arrays (no copy) and is the same object until the
        next :meth:`add`, which then writes the sum into new arrays instead of in place, so a
        result never changes and never shares memory with a payload.

        Raises
        ------
        StatsValidationError
            No payload was added.
        """
        if self._meta is None:
            raise StatsValidationError(
                "cannot sum an empty collection of statistics; give at least one"
            )
        if self._result is None:
            holdout = None if self._holdout is None else self._holdout.result()
            self._result = ClientStats._trusted(
                self._meta, n_clipped=self._n_clipped, magnitude=self._magnitude,
                holdout=holdout, **(self._unpacked() if self._packed else self._arrays),
            )
        return self._result

    # ------------------------------------------------------------------ internals
    def _start(self, s: ClientStats | PackedStats) -> None:
        self._meta = s.meta
        self._packed = isinstance(s, PackedStats)
        # A copy the total owns, so every later add is in place: total + payload at most.
        self._arrays = {name: np.array(getattr(s, name)) for name in schema_for(s.mode).names}
        self._n_clipped = s.n_clipped
        self._magnitude = s._magnitude
        if s.holdout is not None:
            self._holdout = StatsTotal()
            self._holdout._start(s.holdout)

    def _unpacked(self) -> dict[str, Any]:
        """The total's arrays with the symmetric ones unpacked (new arrays; the others shared)."""
        assert self._meta is not None
        c, d = self._meta.num_classes, self._meta.dim
        schema = schema_for(self._meta.mode)
        return {name: (schema.spec(name).unpack(arr, c, d) if schema.spec(name).symmetric
                       else arr) for name, arr in self._arrays.items()}

    def _alike(self, s: ClientStats | PackedStats) -> ClientStats | PackedStats:
        """``s`` in the total's form.

        A packed payload is unpacked for an unpacked total; a packed total is unpacked (for
        good) before an unpacked payload.
        """
        if isinstance(s, PackedStats):
            return s if self._packed else s.unpack()
        if self._packed:
            self._unpack_total()
        return s

    def _unpack_total(self) -> None:
        """Unpack the total's symmetric arrays, and its held-out part's, into new ones.

        The other arrays may still be shared with a result handed out: the next add then
        writes new ones, as after any :meth:`result`.
        """
        self._arrays = self._unpacked()
        self._packed = False
        if self._holdout is not None:
            self._holdout._unpack_total()

    def _check_addable(self, s: ClientStats | PackedStats) -> None:
        check_arrays_addable(self._arrays, self._n_clipped, self._magnitude, s)
        if self._holdout is not None and s.holdout is not None:
            self._holdout._check_addable(s.holdout)

    def _add(self, s: ClientStats | PackedStats) -> None:
        if self._result is None:  # the total's own arrays: in place
            for name, arr in self._arrays.items():
                np.add(arr, getattr(s, name), out=arr)
        else:  # arrays shared with a result (read-only): the sum into new ones
            self._arrays = {name: np.add(arr, getattr(s, name))
                            for name, arr in self._arrays.items()}
            self._result = None
        self._n_clipped += s.n_clipped
        self._magnitude = self._magnitude + s._magnitude
        if self._holdout is not None and s.holdout is not None:
            self._holdout._add(s.holdout)

def check_addable(total: ClientStats, other: ClientStats) -> None:
    """Raise what ``total + other`` would raise, without computing the sum (no allocation).

    Raises
    ------
    IncompatibleStatsError
        The metadata differ (the message names every difference).
    StatsOverflowError
        The sum would overflow the int64 counts or the float64 sums.
    """
    check_combinable(total.meta, other)
    arrays = {name: getattr(total, name) for name in schema_for(total.mode).names}
    check_arrays_addable(arrays, total.n_clipped, total._magnitude, other)
    if total.holdout is not None and other.holdout is not None:
        check_addable(total.holdout, other.holdout)
