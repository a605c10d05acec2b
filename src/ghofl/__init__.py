"""ghofl: one-shot federated learning from client statistics (the GH-OFL family).

The public surface is deliberately small; everything else lives in the sub-packages
(``ghofl.stats``, ``ghofl.moments``, ``ghofl.heads``, ...). Importing ``ghofl`` has no
side effects and does not import torch or flwr.
"""

from ghofl._version import __version__
from ghofl.errors import GhoflError
from ghofl.heads.registry import available_heads, load_head, make_head, save_head
from ghofl.moments import Moments, compute_moments
from ghofl.stats import (
    ClientStats,
    EncoderInfo,
    ProjectionSpec,
    StatsAccumulator,
    load_stats,
    save_stats,
)

__all__ = [
    "ClientStats",
    "EncoderInfo",
    "GhoflError",
    "Moments",
    "ProjectionSpec",
    "StatsAccumulator",
    "__version__",
    "available_heads",
    "compute_moments",
    "load_head",
    "load_stats",
    "make_head",
    "save_head",
    "save_stats",
]
