"""The aggregation seam: how the server turns client payloads into one total.

The server side of ghofl only ever sees the value returned by :meth:`Aggregator.aggregate`: the
sum of the client statistics. :class:`PlainSumAggregator` computes it in the clear (the
simulation default and the ``ghofl aggregate`` command); a secure-aggregation implementation
(method.md §5) provides the same method but learns nothing about any single payload.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from ghofl.errors import IncompatibleStatsError, InputError, StatsValidationError
from ghofl.stats.client_stats import ClientStats

__all__ = ["Aggregator", "PlainSumAggregator"]


@runtime_checkable
class Aggregator(Protocol):
    """Anything that sums client statistics for the server.

    Implementations must return exactly Σ_u payload_u (up to their numeric precision), check
    that payloads are compatible, and treat a dropped client as simply absent from
    ``payloads``.
    """

    def aggregate(self, payloads: Iterable[ClientStats]) -> ClientStats:
        """Return the sum of ``payloads`` (consumed once, in order)."""
        ...


class PlainSumAggregator:
    """Streaming sum in the clear: one payload in memory at a time, plus the running total.

    Attributes
    ----------
    num_aggregated_ : int
        Number of payloads summed by the last call of :meth:`aggregate` (0 before any call).

    Examples
    --------
    >>> agg = PlainSumAggregator()
    >>> total = agg.aggregate(client_payloads)  # doctest: +SKIP
    >>> agg.num_aggregated_  # doctest: +SKIP
    10
    """

    def __init__(self) -> None:
        self.num_aggregated_ = 0

    def aggregate(self, payloads: Iterable[ClientStats]) -> ClientStats:
        """Sum ``payloads`` one at a time (memory independent of how many there are).

        Parameters
        ----------
        payloads : iterable of ClientStats
            Client statistics with identical metadata (mode, dim, classes, encoder,
            projection). A generator is consumed lazily.

        Returns
        -------
        ClientStats
            The total.

        Raises
        ------
        IncompatibleStatsError
            A payload differs from the first one; the message names its 1-based position
            and every differing field.
        StatsValidationError
            No payload arrived.
        InputError
            An item is not a :class:`ClientStats`.
        """
        total: ClientStats | None = None
        count = 0
        for count, item in enumerate(payloads, start=1):
            if not isinstance(item, ClientStats):
                raise InputError(
                    f"payload {count} is a {type(item).__name__}, not ClientStats; pass the "
                    "statistics computed by the clients"
                )
            if total is None:
                total = item
                continue
            try:
                total = total + item
            except IncompatibleStatsError as exc:
                raise IncompatibleStatsError(
                    f"payload {count} cannot be added to the total of the payloads before it: "
                    f"{exc}"
                ) from exc
        if total is None:
            raise StatsValidationError(
                "no client payload arrived, so there is nothing to aggregate; at least one "
                "client must upload its statistics"
            )
        self.num_aggregated_ = count
        return total
