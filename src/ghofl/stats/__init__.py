"""The additive value clients upload: ClientStats, its accumulator, projection and file format."""

from ghofl.stats.accumulate import StatsAccumulator, compute_stats
from ghofl.stats.client_stats import ClientStats, sum_stats
from ghofl.stats.codec import load_stats, payload_nbytes, save_stats
from ghofl.stats.meta import MODES, EncoderInfo, Mode, StatsMeta
from ghofl.stats.projection import ProjectionSpec

__all__ = [
    "MODES",
    "ClientStats",
    "EncoderInfo",
    "Mode",
    "ProjectionSpec",
    "StatsAccumulator",
    "StatsMeta",
    "compute_stats",
    "load_stats",
    "payload_nbytes",
    "save_stats",
    "sum_stats",
]
