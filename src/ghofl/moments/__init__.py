"""From additive sums to means, priors and (shrunk) covariances."""

from ghofl.moments.core import GhoflWarning, Moments, compute_moments
from ghofl.moments.shrinkage import check_shrinkage, oas_shrinkage, resolve_shrinkage, shrink

__all__ = [
    "GhoflWarning",
    "Moments",
    "check_shrinkage",
    "compute_moments",
    "oas_shrinkage",
    "resolve_shrinkage",
    "shrink",
]
