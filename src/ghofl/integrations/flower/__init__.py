"""ghofl on Flower (flwr 1.42): the aggregation protocols as Flower messages.

* :mod:`~ghofl.integrations.flower.records` converts :class:`~ghofl.stats.ClientStats` and every
  protocol message to and from Flower ``RecordDict`` values (versioned, validated on receipt);
* :mod:`~ghofl.integrations.flower.transport` is a :class:`~ghofl.secure.Transport` over a
  Flower ``Grid`` (one QUERY message per client per stage);
* :mod:`~ghofl.integrations.flower.client_app` and :mod:`~ghofl.integrations.flower.server_app`
  hold the ``ClientApp`` and ``ServerApp`` that ``flwr run`` loads
  (``examples/flower_app/`` is a ready app folder);
* :mod:`~ghofl.integrations.flower.runner` starts and stops local simulation and deployment
  runs (SuperLink, SuperNodes, ``flwr run``) on 127.0.0.1, by PID.

Only this package imports ``flwr``; it needs the extra: ``pip install 'ghofl[flower]'``.
The records codec and the runner import flwr lazily, so importing this package alone does not.
"""

from __future__ import annotations

__all__ = ["MESSAGE_TYPE", "QUERY_ACTION", "SIM_NODE_CONFIG_ENV", "TIMINGS_KEY"]

#: The ClientApp's query action; Flower message type ``query.ghofl``.
QUERY_ACTION = "ghofl"
MESSAGE_TYPE = f"query.{QUERY_ACTION}"
#: Environment variable naming a JSON file of simulated nodes' node configs, by partition id
#: (the simulation engine gives nodes none of their own; see
#: :mod:`~ghofl.integrations.flower.client_app`).
SIM_NODE_CONFIG_ENV = "GHOFL_SIM_NODE_CONFIG"
#: Run config key (``true``/``false``, default ``false``): each reply of ghofl's ClientApp
#: carries where its time went on the node (:mod:`ghofl.integrations.flower.timing`), and
#: ``results.json`` holds them by stage and client (``client_timings``).
TIMINGS_KEY = "client-timings"
