"""Aggregation of client statistics: the seam secure aggregation plugs into.

:class:`Aggregator` is the protocol the server relies on (``aggregate(payloads) -> total``);
:class:`PlainSumAggregator` is the in-the-clear implementation. The secure-sum protocol
(method.md §5) will live beside it in this package and implement the same protocol.
"""

from ghofl.secure.plain import Aggregator, PlainSumAggregator

__all__ = ["Aggregator", "PlainSumAggregator"]
