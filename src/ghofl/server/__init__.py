"""The server role: the federation plan and the one server entry point of every front end."""

from ghofl.server.fields import CLI, CONFIG, FIELDS, LIBRARY, Naming, key_table
from ghofl.server.plan import AggregationSpec, FederationPlan, PlanError
from ghofl.server.run import Aggregated, FederationServer

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
