"""The additive value clients upload: ClientStats, its accumulator, projection and file format.

The rules of each upload mode (arrays, which mode contains which, packing, flat layouts) live in
:mod:`ghofl.stats.schema`; :func:`unflatten_stats` rebuilds statistics from the flat layout.
"""

from ghofl.stats.accumulate import StatsAccumulator, compute_stats, holdout_mask
from ghofl.stats.client_stats import ClientStats, StatsTotal, sum_stats
from ghofl.stats.client_stats.packed import PackedStats
from ghofl.stats.codec import (
    iter_packed_stats,
    load_packed_stats,
    load_stats,
    payload_nbytes,
    save_stats,
    through_transport,
)
from ghofl.stats.flat import unflatten_stats
from ghofl.stats.meta import MODES, EncoderInfo, Mode, StatsMeta
from ghofl.stats.projection import ProjectionSpec
from ghofl.stats.schema import (
    SCHEMAS,
    ArraySpec,
    Kind,
    ModeSchema,
    Segment,
    mode_supports,
    modes_supporting,
    schema_for,
)

__all__ = [
    "MODES",
    "SCHEMAS",
    "ArraySpec",
    "ClientStats",
    "EncoderInfo",
    "Kind",
    "Mode",
    "ModeSchema",
    "PackedStats",
    "ProjectionSpec",
    "Segment",
    "StatsAccumulator",
    "StatsMeta",
    "StatsTotal",
    "compute_stats",
    "holdout_mask",
    "iter_packed_stats",
    "load_packed_stats",
    "load_stats",
    "mode_supports",
    "modes_supporting",
    "payload_nbytes",
    "save_stats",
    "schema_for",
    "sum_stats",
    "through_transport",
    "unflatten_stats",
]
