"""Durable aggregation store in one embedded SQLite file (standard library, no server).

It holds every accepted contribution and an exact running total; see :mod:`ghofl.store.aggregation`.
"""

from ghofl.store.aggregation import (
    DEFAULT_MAX_CONTRIBUTIONS,
    AddResult,
    AggregationStore,
    ContributionInfo,
    ExactPath,
    content_sha256,
)
from ghofl.store.read import is_store, read_total, read_total_and_head
from ghofl.store.records import StoreHead
from ghofl.store.verify import check_store

__all__ = [
    "DEFAULT_MAX_CONTRIBUTIONS",
    "AddResult",
    "AggregationStore",
    "ContributionInfo",
    "ExactPath",
    "StoreHead",
    "check_store",
    "content_sha256",
    "is_store",
    "read_total",
    "read_total_and_head",
]
