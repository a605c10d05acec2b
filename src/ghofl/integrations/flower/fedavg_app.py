"""The multi-round FedAvg baseline on Flower, with Flower's own FedAvg strategy.

A linear softmax head on the same frozen embeddings and the same clients as the one-shot protocol.

``client`` is the ClientApp (train handler: local mini-batch SGD from
:func:`ghofl.baselines.local_sgd` on the node's embeddings, from node config ``data-path`` or
run config ``data-template``); ``server`` is the ServerApp (``flwr.serverapp.strategy.FedAvg``,
weighted by the clients' sample counts, with a central evaluation of the global weights on the
server-side test set after every round). The server writes ``results.json`` into ``out-dir``:
accuracy after every round (round 0 = the initial zero weights) and the bytes moved.

Run config keys: ``data-template``, ``test-path``, ``out-dir``, ``num-classes``, ``dim``,
``num-rounds``, ``local-epochs``, ``lr``, ``batch-size``, ``seed``, ``expected-nodes``,
``wait-timeout-s``, ``round-timeout-s``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ghofl.errors import require_extra

require_extra("flwr", "flower")

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402

from ghofl.baselines.fedavg import SoftmaxParams, local_sgd, softmax_accuracy  # noqa: E402
from ghofl.data.embeddings import load_embeddings  # noqa: E402
from ghofl.errors import AggregationAbortedError, ProtocolError  # noqa: E402
from ghofl.files import write_json_atomic  # noqa: E402
from ghofl.integrations.flower._config import cfg_float, cfg_int, cfg_str  # noqa: E402
from ghofl.integrations.flower.client_app import data_source  # noqa: E402

__all__ = ["client", "server"]

client = ClientApp()
server = ServerApp()


def _params(record: ArrayRecord) -> SoftmaxParams:
    return SoftmaxParams(np.asarray(record["W"].numpy(), dtype=np.float64),
                         np.asarray(record["b"].numpy(), dtype=np.float64))


def _record(params: SoftmaxParams) -> ArrayRecord:
    return ArrayRecord({"W": Array(params.W), "b": Array(params.b)})


@client.train()
def train(msg: Message, context: Context) -> Message:
    """One local update from the global weights in the message."""
    run = dict(context.run_config)
    emb = load_embeddings(data_source(dict(context.node_config), run), "the node's data")
    arrays, config = msg.content["arrays"], msg.content["config"]
    if not isinstance(arrays, ArrayRecord) or not isinstance(config, ConfigRecord):
        raise ProtocolError("a FedAvg train message must hold an ArrayRecord 'arrays' and a "
                            "ConfigRecord 'config'; the server runs another app")
    params = _params(arrays)
    server_round = cfg_int(dict(config), "server-round")
    part = int(context.node_config.get("partition-id", 0))
    rng = np.random.default_rng([cfg_int(run, "seed"), server_round, part])
    updated = local_sgd(params, emb.x, emb.y, epochs=cfg_int(run, "local-epochs", 1),
                        lr=cfg_float(run, "lr", 0.01), batch_size=cfg_int(run, "batch-size", 64),
                        rng=rng)
    content = RecordDict({"arrays": _record(updated),
                          "metrics": MetricRecord({"num-examples": int(emb.y.size)})})
    return Message(content=content, reply_to=msg)


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Wait for the nodes, run FedAvg, record accuracy and bytes per round."""
    run = dict(context.run_config)
    out_dir = Path(cfg_str(run, "out-dir"))
    try:
        results = _fedavg(grid, run)
    except Exception as exc:
        write_json_atomic(out_dir / "results.json", {"status": "failed", "error": str(exc)})
        raise
    write_json_atomic(out_dir / "results.json", results)


def _wait_for_nodes(grid: Grid, expected: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = list(grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        if time.monotonic() > deadline:
            raise AggregationAbortedError(
                f"only {len(nodes)} of the {expected} expected nodes connected within "
                f"{timeout_s:g} s; start the missing SuperNodes or lower expected-nodes"
            )
        time.sleep(0.5)


def _fedavg(grid: Grid, run: dict[str, Any]) -> dict[str, Any]:
    expected = cfg_int(run, "expected-nodes", 2)
    nodes = _wait_for_nodes(grid, expected, cfg_float(run, "wait-timeout-s", 120.0))
    test = load_embeddings(Path(cfg_str(run, "test-path")), "the server's test set")
    start = SoftmaxParams.zeros(cfg_int(run, "dim"), cfg_int(run, "num-classes"))
    history: list[dict[str, float]] = []

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        # One BLAS thread: under the simulation engine this runs in a thread of the process
        # that is starting Ray, whose fork() runs OpenBLAS's fork handler; with the product
        # on OpenBLAS's worker threads at that moment, the run hung before round 1 (the
        # product is n × d × C, milliseconds on one thread).
        with threadpool_limits(limits=1, user_api="blas"):
            acc = softmax_accuracy(_params(arrays), test.x, test.y)
        history.append({"round": server_round, "accuracy": acc,
                        "seconds": time.perf_counter() - t0})
        return MetricRecord({"accuracy": acc})

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=expected,
                      min_available_nodes=expected, min_evaluate_nodes=0)
    rounds = cfg_int(run, "num-rounds", 10)
    t0 = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=_record(start), num_rounds=rounds,
                   timeout=cfg_float(run, "round-timeout-s", 600.0),
                   train_config=ConfigRecord({"lr": cfg_float(run, "lr", 0.01)}),
                   evaluate_fn=evaluate)
    per_round = 2 * len(nodes) * start.nbytes  # the weights go down to and up from each node
    return {
        "status": "ok", "nodes": len(nodes), "rounds": rounds,
        "accuracy": [h["accuracy"] for h in sorted(history, key=lambda h: h["round"])],
        "seconds": [h["seconds"] for h in sorted(history, key=lambda h: h["round"])],
        "bytes_per_round": per_round, "bytes_per_client_per_round": 2 * start.nbytes,
        "config": {k: v for k, v in run.items() if isinstance(v, str | int | float | bool)},
        "wall_s": time.perf_counter() - t0,
    }


