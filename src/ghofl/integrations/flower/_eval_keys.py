"""The evaluation stage's record names and run config key, without its heavy modules.

What ghofl's ClientApp checks on every message (is it the evaluation stage's model message, or
its vector round?) lives here, so that a stage which is no evaluation stage loads neither the
model, the heads nor scipy. :mod:`ghofl.integrations.flower.evaluation` re-exports every name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ghofl.errors import ConfigError
from ghofl.secure.vectors import VECTOR_FORMAT

__all__ = ["EVAL_INFO", "EVAL_KEY", "EVAL_STATE", "EVAL_SUMS", "MAX_MODEL_BYTES", "MODEL_RECORD",
           "eval_fraction", "is_vector_meta"]

#: Run config key: the fraction of its rows every node holds out for the evaluation stage.
EVAL_KEY = "federated-eval"
#: ArrayRecord of the model files (uint8 arrays ``f0``, ``f1``, ...) in the model message.
MODEL_RECORD = "ghofl-eval-model"
#: ConfigRecord of the model message (``files``: the relative names of ``f0``, ...) and of
#: the node's reply (``held``: whether it holds held-out rows, a bool).
EVAL_INFO = "ghofl-eval"
#: ArrayRecord of a node's evaluation vectors (``ints``, ``floats``), plain protocol.
EVAL_SUMS = "ghofl-eval-sums"
#: Key of the node's kept evaluation sums (and the payload it masks) in ``context.state``.
EVAL_STATE = "ghofl-eval-state"
#: Largest model the stage sends (Flower's gRPC messages stop at 512 MiB).
MAX_MODEL_BYTES = 256 * 2**20


def eval_fraction(run_cfg: Mapping[str, Any]) -> float:
    """The run config's :data:`EVAL_KEY` (0.0 when absent).

    Raises
    ------
    ConfigError
        Not a number in [0, 1).
    """
    value = run_cfg.get(EVAL_KEY, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0.0 <= float(value) < 1.0):
        raise ConfigError(f"run config key {EVAL_KEY!r} must be a fraction in [0, 1) of each "
                          f"node's rows to hold out (e.g. 0.2; 0: no evaluation); got {value!r}")
    return float(value)


def is_vector_meta(text: str) -> bool:
    """Whether an advertised or saved description is a vector payload's."""
    try:
        data = json.loads(text)
    except (TypeError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == VECTOR_FORMAT
