"""ClientApp: client ``i`` returns row ``i`` of the run's data file as its fit result.

``secaggplus_mod`` wraps the legacy ``NumPyClient``: it runs the four SecAgg+ stages and, in
the masking stage, quantises and masks what ``fit`` returns. The vector reaches the client
through a local ``.npy`` file named in the run config (memory-mapped, no network).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context
from flwr.client import Client, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import NDArrays, Scalar


class VectorClient(NumPyClient):  # type: ignore[misc]
    """A client whose fit result is one fixed float64 vector."""

    def __init__(self, vector: np.ndarray, num_examples: int) -> None:
        self.vector = vector
        self.num_examples = num_examples

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Ignore the (placeholder) global parameters and return the client's vector."""
        del parameters, config
        return [self.vector], self.num_examples, {}


def client_fn(context: Context) -> Client:
    """Build the client of virtual node ``partition-id`` from the run's data file."""
    data = np.load(str(context.run_config["data-path"]), mmap_mode="r")
    row = int(context.node_config["partition-id"])
    vector = np.array(data[row], dtype=np.float64)
    return VectorClient(vector, int(context.run_config["num-examples"])).to_client()


app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
