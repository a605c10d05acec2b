"""ServerApp: one fit round of Flower's ``SecAggPlusWorkflow``; writes the aggregate to disk.

The workflow unmasks and de-quantises the sum of the clients' quantised, weighted vectors,
divides it by the total weight and hands that mean to ``Strategy.aggregate_fit`` inside every
``FitRes``. The strategy below records it unchanged (no second FedAvg averaging), so
``result.npy`` is exactly the workflow's output; with equal ``num_examples`` the caller gets the
sum as mean times the number of results. ``result.json`` is written last (atomically) and is
the success marker: ``flwr run --stream`` exits 0 even when this ServerApp raises.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.common import (
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp


class RecordAggregate(FedAvg):  # type: ignore[misc]
    """FedAvg whose ``aggregate_fit`` keeps the SecAgg+ workflow's aggregate as it is."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.aggregate: NDArrays | None = None
        self.num_results = 0
        self.num_failures = 0

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Record the unmasked aggregate that the workflow put into every ``FitRes``."""
        del server_round
        self.num_results, self.num_failures = len(results), len(failures)
        if not results:
            return None, {}
        parameters = results[0][1].parameters
        self.aggregate = parameters_to_ndarrays(parameters)
        return parameters, {}


class TimedSecAggPlusWorkflow(SecAggPlusWorkflow):  # type: ignore[misc]
    """``SecAggPlusWorkflow`` that measures the wall time of its four stages."""

    elapsed_s: float | None = None

    def __call__(self, grid: Grid, context: Context) -> None:
        """Run the SecAgg+ stages (setup, share keys, collect masked vectors, unmask)."""
        start = time.perf_counter()
        super().__call__(grid, context)
        self.elapsed_s = time.perf_counter() - start


def _number(value: Any) -> int | float:
    """A run-config number: ints stay ints (counts), everything else becomes a float."""
    return value if isinstance(value, int) and not isinstance(value, bool) else float(value)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run one SecAgg+ fit round over all nodes and write ``result.npy``/``result.json``."""
    cfg = context.run_config
    out_dir = Path(str(cfg["out-dir"]))
    num_clients = int(cfg["num-clients"])
    timeout = float(cfg["timeout"])
    strategy = RecordAggregate(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=num_clients,
        min_evaluate_clients=0,
        min_available_clients=num_clients,
        # A one-element placeholder: the clients ignore it, and it keeps the FitIns small.
        initial_parameters=ndarrays_to_parameters([np.zeros(1)]),
    )
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
    secagg = TimedSecAggPlusWorkflow(
        num_shares=_number(cfg["num-shares"]),
        reconstruction_threshold=_number(cfg["reconstruction-threshold"]),
        max_weight=float(cfg["max-weight"]),
        clipping_range=float(cfg["clipping-range"]),
        quantization_range=int(cfg["quantization-range"]),
        modulus_range=int(cfg["modulus-range"]),
        timeout=None if timeout < 0 else timeout,
    )
    DefaultWorkflow(fit_workflow=secagg)(grid, legacy)

    if strategy.aggregate is None:
        # SecAggPlusWorkflow only logs "Secure aggregation halted." and returns.
        raise RuntimeError(
            "SecAgg+ produced no aggregate (halted: too few clients or shares, "
            f"{strategy.num_failures} failures)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    np.save(out_dir / "result.npy", np.asarray(strategy.aggregate[0], dtype=np.float64))
    meta = {
        "aggregate_s": secagg.elapsed_s,
        "num_results": strategy.num_results,
        "num_failures": strategy.num_failures,
        "num_nodes": len(list(grid.get_node_ids())),
    }
    tmp = out_dir / "result.json.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, out_dir / "result.json")
