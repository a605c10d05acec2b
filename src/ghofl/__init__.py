"""ghofl: one-shot federated learning from client statistics (the GH-OFL family).

The public surface is deliberately small; everything else lives in the sub-packages
(``ghofl.stats``, ``ghofl.moments``, ``ghofl.heads``, ...). Importing ``ghofl`` has no
side effects and does not import torch, flwr or scipy: each name below is loaded on first use,
so a process that needs one part (a Flower ClientApp, a CLI command) pays only for that part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ghofl._lazy import lazy_attributes
from ghofl._version import __version__

if TYPE_CHECKING:
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

_LAZY = {
    "GhoflError": "ghofl.errors",
    "available_heads": "ghofl.heads.registry",
    "load_head": "ghofl.heads.registry",
    "make_head": "ghofl.heads.registry",
    "save_head": "ghofl.heads.registry",
    "Moments": "ghofl.moments",
    "compute_moments": "ghofl.moments",
    "ClientStats": "ghofl.stats",
    "EncoderInfo": "ghofl.stats",
    "ProjectionSpec": "ghofl.stats",
    "StatsAccumulator": "ghofl.stats",
    "load_stats": "ghofl.stats",
    "save_stats": "ghofl.stats",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)


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
