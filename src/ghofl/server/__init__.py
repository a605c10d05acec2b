"""The server role: the federation plan and the one server entry point of every front end.

The names below load on first use, so importing one submodule (a ClientApp reads
``ghofl.server.config``) does not load the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ghofl._lazy import lazy_attributes

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


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)


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
