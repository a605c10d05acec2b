"""The server role: the federation plan and the one server entry point of every front end.

The names below load on first use, so a client process that reads one helper (a config
coercion, the plan's defaults) does not import the heads and their scipy dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ghofl.server.fields import CLI, CONFIG, FIELDS, LIBRARY, Naming, key_table
    from ghofl.server.plan import AggregationSpec, FederationPlan, PlanError
    from ghofl.server.run import Aggregated, FederationServer

_LAZY = {
    **dict.fromkeys(("CLI", "CONFIG", "FIELDS", "LIBRARY", "Naming", "key_table"),
                    "ghofl.server.fields"),
    **dict.fromkeys(("AggregationSpec", "FederationPlan", "PlanError"), "ghofl.server.plan"),
    **dict.fromkeys(("Aggregated", "FederationServer"), "ghofl.server.run"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ghofl.server' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "CLI",
    "CONFIG",
    "FIELDS",
    "LIBRARY",
    "Aggregated",
    "AggregationSpec",
    "FederationPlan",
    "FederationServer",
    "Naming",
    "PlanError",
    "key_table",
]
