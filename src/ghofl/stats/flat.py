"""Statistics from the flat vectors of secure aggregation and the aggregation store.

:meth:`ModeSchema.flatten <ghofl.stats.schema.ModeSchema.flatten>` lays a payload out as one
integer and one float vector; :func:`unflatten_stats` is its exact inverse. It sits above both
:mod:`ghofl.stats.schema` (the layouts) and :mod:`ghofl.stats.client_stats` (the value and its
validation), so neither of them imports the other's work.
"""

from __future__ import annotations

from typing import Any

from numpy.typing import NDArray

from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import StatsMeta
from ghofl.stats.schema import schema_for

__all__ = ["unflatten_stats"]


def unflatten_stats(
    meta: StatsMeta, ints: NDArray[Any], floats: NDArray[Any], rounding: float = 0.0
) -> ClientStats:
    """Exact inverse of ``schema_for(meta.mode).flatten``: validated statistics.

    The result carries the metadata ``meta``.

    Parameters
    ----------
    meta : StatsMeta
        Metadata of the result. With ``meta.holdout_fraction > 0`` the vectors hold the
        held-out section too.
    ints : ndarray of integers, shape (C + 1,) or (2C + 2,)
        Layout :meth:`~ghofl.stats.schema.ModeSchema.int_layout` (``holdout=meta.has_holdout``).
    floats : ndarray of floats, shape (F,) or (2F,)
        Layout :meth:`~ghofl.stats.schema.ModeSchema.float_layout`
        (``holdout=meta.has_holdout``).
    rounding : float, default 0.0
        Unit roundoff of a transport the sums went through (2⁻²⁴ for float32), tolerated
        by the validation (:meth:`ClientStats.from_transport`).

    Returns
    -------
    ClientStats
        Owns copies of the data (later changes to ``ints``/``floats`` do not affect it).

    Raises
    ------
    StatsValidationError
        Wrong dtype or wrong length of a vector, or invalid statistics.
    """
    sections = schema_for(meta.mode).unflatten_arrays(meta, ints, floats)
    holdout = None
    if len(sections) > 1:
        h_arrays, h_clipped = sections[1]
        holdout = ClientStats.from_transport(meta.without_holdout(), h_arrays, h_clipped,
                                             rounding=rounding)
    main_arrays, n_clipped = sections[0]
    return ClientStats.from_transport(meta, main_arrays, n_clipped, holdout, rounding)
