"""ClientStats, the additive value a client uploads once, and totals of many of them.

Split by concern: :mod:`~ghofl.stats.client_stats.value` (the validated value and its
algebra), :mod:`~ghofl.stats.client_stats.total` (bounded-memory totals) and
:mod:`~ghofl.stats.client_stats.laws` (validation and the checks of sums and differences).
"""

from ghofl.stats.client_stats.total import StatsTotal, check_addable, sum_stats
from ghofl.stats.client_stats.value import ClientStats

__all__ = ["ClientStats", "StatsTotal", "check_addable", "sum_stats"]
