"""FedCOF's estimate at the server: kept from each accepted upload, built once the round ends.

With ``aggregation.estimate = "fedcof"`` (:data:`~ghofl.server.fields.FIELDS`) the plain
server hands every payload it accepts to a :class:`FedCOFEstimate`, which keeps only what
FedCOF's estimator reads of it, the client's class counts and class sums (mode ``means``:
C (d + 1) numbers per client, whatever the upload mode), and after the round turns them into
:func:`~ghofl.moments.fedcof.fedcof_statistics`: counts and sums are the exact totals, the second
moments FedCOF's estimate, with the degrees of freedom it really has. The heads are fitted from
these instead of the total. The estimate needs every client's own upload, so the plan allows it
only with the plain protocol, without differential privacy and without a store
(:class:`~ghofl.server.plan.AggregationSpec`).
"""

from __future__ import annotations

from dataclasses import replace

from ghofl.errors import StatsValidationError
from ghofl.moments.estimated import EstimatedStats
from ghofl.moments.fedcof import fedcof_statistics
from ghofl.stats.client_stats import ClientStats
from ghofl.stats.meta import Mode

__all__ = ["FedCOFEstimate"]


class FedCOFEstimate:
    """The per-client class counts and sums of one plain round, and FedCOF's estimate of them.

    Parameters
    ----------
    mode : {"pooled", "full"}
        Mode of the estimate (:attr:`~ghofl.server.plan.FederationPlan.fit_mode`).
    """

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self._clients: list[ClientStats] = []

    def add(self, client: str, stats: ClientStats) -> None:
        """Keep the counts (C,) and sums (C, d) of an accepted upload (``client`` unused)."""
        self._clients.append(stats.without_holdout().to_mode("means"))

    @property
    def clients(self) -> int:
        """How many uploads were kept."""
        return len(self._clients)

    def estimate(self, total: ClientStats) -> EstimatedStats:
        """FedCOF's statistics of the uploads kept, checked against the round's ``total``.

        Parameters
        ----------
        total : ClientStats
            The exact sum of the same uploads (its clipping count is carried over).

        Raises
        ------
        StatsValidationError
            No upload was kept, or their counts are not the total's (an upload reached the
            total without passing through :meth:`add`).
        """
        if not self._clients:
            raise StatsValidationError("FedCOF's estimate needs the upload of at least one "
                                       "client; none was accepted")
        out = fedcof_statistics(self._clients, self.mode)
        if not (out.counts == total.counts).all():
            raise StatsValidationError(
                f"FedCOF's estimate holds {out.n_samples} samples from {self.clients} uploads "
                f"but the total holds {total.n_samples}: every accepted upload must reach the "
                "estimate"
            )
        return replace(out, n_clipped=total.n_clipped)
