"""FedAvg of a linear softmax head: local SGD, weighted averaging, the in-process loop."""

from __future__ import annotations

import numpy as np
import pytest

from ghofl.baselines import SoftmaxParams, fedavg_rounds, local_sgd, softmax_accuracy
from ghofl.baselines.fedavg import average
from ghofl.data.partition import dirichlet_partition
from ghofl.errors import ConfigError
from tests.helpers import gaussian_mixture


def test_fedavg_improves_on_round_zero_under_label_skew() -> None:
    x, y = gaussian_mixture(1, num_classes=4, dim=8, n=1200, sep=1.5)
    parts = dirichlet_partition(y[:1000], 10, 0.1, seed=0)
    accs: list[float] = []
    fedavg_rounds(x[:1000], y[:1000], parts, 4, rounds=5, lr=0.05, seed=0,
                  on_round=lambda r, p: accs.append(softmax_accuracy(p, x[1000:], y[1000:])))
    assert len(accs) == 6
    assert accs[-1] > accs[0] + 0.3


def test_local_sgd_does_not_modify_the_global_weights_and_is_seeded() -> None:
    x, y = gaussian_mixture(2, num_classes=3, dim=5, n=200)
    start = SoftmaxParams.zeros(5, 3)
    a = local_sgd(start, x, y, epochs=2, lr=0.1, batch_size=32, rng=np.random.default_rng(4))
    b = local_sgd(start, x, y, epochs=2, lr=0.1, batch_size=32, rng=np.random.default_rng(4))
    assert np.array_equal(start.W, np.zeros((5, 3)))
    np.testing.assert_array_equal(a.W, b.W)
    assert softmax_accuracy(a, x, y) > 0.6


def test_average_is_weighted_by_samples() -> None:
    p1 = SoftmaxParams(np.ones((2, 2)), np.zeros(2))
    p2 = SoftmaxParams(np.zeros((2, 2)), np.ones(2))
    avg = average([(p1, 3), (p2, 1)])
    np.testing.assert_allclose(avg.W, 0.75)
    np.testing.assert_allclose(avg.b, 0.25)
    assert p1.nbytes == 8 * 6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"lr": 0.0}, r"the learning rate must be a finite number > 0; got 0\.0"),
     ({"epochs": 0}, r"local epochs and batch size must be >= 1; got epochs=0"),
     ({"batch_size": 0}, r"batch_size=0")],
)
def test_bad_training_parameters(kwargs: dict[str, float], match: str) -> None:
    args = {"epochs": 1, "lr": 0.1, "batch_size": 8, **kwargs}
    with pytest.raises(ConfigError, match=match):
        local_sgd(SoftmaxParams.zeros(2, 2), np.zeros((4, 2)), np.zeros(4, np.int64),
                  rng=np.random.default_rng(0), **args)  # type: ignore[arg-type]


def test_no_client_with_samples_is_an_error() -> None:
    with pytest.raises(ConfigError, match="FedAvg needs at least one client with samples"):
        average([])
