"""Multi-round baselines the one-shot heads are compared with.

The maths only; the Flower integration runs them over a real federated engine.
"""

from ghofl.baselines.fedavg import SoftmaxParams, fedavg_rounds, local_sgd, softmax_accuracy

__all__ = ["SoftmaxParams", "fedavg_rounds", "local_sgd", "softmax_accuracy"]
