"""FedAvg (McMahan et al., AISTATS 2017) of a linear softmax head on frozen embeddings.

Each round, every client starts from the global weights, runs ``epochs`` of mini-batch SGD on
the cross-entropy of its own rows, and sends its weights back; the server averages them
weighted by the clients' sample counts. :func:`local_sgd` is the client update (used by the
Flower ClientApp), :func:`fedavg_rounds` the whole loop in process (a reference for tests and
for checking the Flower run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError

__all__ = ["SoftmaxParams", "fedavg_rounds", "local_sgd", "softmax_accuracy"]

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class SoftmaxParams:
    """Weights of a linear softmax head: scores = x @ W + b.

    Attributes
    ----------
    W : ndarray of float64, shape (d, C)
    b : ndarray of float64, shape (C,)
    """

    W: F64
    b: F64

    @classmethod
    def zeros(cls, dim: int, num_classes: int) -> SoftmaxParams:
        """All-zero weights for ``dim`` inputs and ``num_classes`` classes."""
        return cls(np.zeros((dim, num_classes)), np.zeros(num_classes))

    @property
    def nbytes(self) -> int:
        """Bytes of one copy of the weights (what one client sends or receives per round)."""
        return int(self.W.nbytes + self.b.nbytes)


def _check(lr: float, epochs: int, batch_size: int) -> None:
    if not (np.isfinite(lr) and lr > 0):
        raise ConfigError(f"the learning rate must be a finite number > 0; got {lr!r}")
    if epochs < 1 or batch_size < 1:
        raise ConfigError(
            f"local epochs and batch size must be >= 1; got epochs={epochs}, "
            f"batch_size={batch_size}"
        )


def local_sgd(params: SoftmaxParams, x: NDArray[np.floating], y: NDArray[np.integer], *,
              epochs: int, lr: float, batch_size: int, rng: np.random.Generator
              ) -> SoftmaxParams:
    """One client's update: ``epochs`` passes of mini-batch SGD on the mean cross-entropy.

    Parameters
    ----------
    params : SoftmaxParams
        Global weights at the start of the round (not modified).
    x : ndarray, shape (n, d)
    y : ndarray of int, shape (n,)
        Labels in ``0..C-1``.
    epochs, lr, batch_size :
        Local epochs, learning rate, mini-batch size.
    rng : numpy.random.Generator
        Shuffles the rows each epoch.

    Returns
    -------
    SoftmaxParams
        The client's weights after local training (a copy).
    """
    _check(lr, epochs, batch_size)
    W, b = params.W.copy(), params.b.copy()
    n = x.shape[0]
    if n == 0:
        return SoftmaxParams(W, b)
    xs = np.asarray(x, dtype=np.float64)
    onehot = np.zeros((n, W.shape[1]))
    onehot[np.arange(n), np.asarray(y, dtype=np.int64)] = 1.0
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]
            xb = xs[rows]
            scores = xb @ W + b
            scores -= scores.max(axis=1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=1, keepdims=True)
            g = (p - onehot[rows]) / rows.size
            W -= lr * (xb.T @ g)
            b -= lr * g.sum(axis=0)
    return SoftmaxParams(W, b)


def average(updates: Sequence[tuple[SoftmaxParams, int]]) -> SoftmaxParams:
    """Sample-weighted average of client weights (the FedAvg server step)."""
    total = sum(n for _, n in updates)
    if total <= 0:
        raise ConfigError("FedAvg needs at least one client with samples in a round")
    W = sum(p.W * (n / total) for p, n in updates)
    b = sum(p.b * (n / total) for p, n in updates)
    return SoftmaxParams(np.asarray(W), np.asarray(b))


def softmax_accuracy(params: SoftmaxParams, x: NDArray[np.floating],
                     y: NDArray[np.integer]) -> float:
    """Accuracy of argmax(x @ W + b) on (x, y)."""
    pred = np.argmax(np.asarray(x, dtype=np.float64) @ params.W + params.b, axis=1)
    return float(np.mean(pred == np.asarray(y)))


def fedavg_rounds(x: NDArray[np.floating], y: NDArray[np.integer],
                  parts: Sequence[NDArray[np.int64]], num_classes: int, *, rounds: int,
                  epochs: int = 1, lr: float = 0.01, batch_size: int = 64, seed: int = 0,
                  on_round: Callable[[int, SoftmaxParams], None] | None = None
                  ) -> SoftmaxParams:
    """FedAvg in process: ``rounds`` rounds over the clients' row indices ``parts``.

    ``on_round(r, params)`` is called after each round r = 1..rounds (and with r = 0 before the
    first), e.g. to record the test accuracy per round.
    """
    if rounds < 0:
        raise ConfigError(f"rounds must be >= 0; got {rounds}")
    params = SoftmaxParams.zeros(np.asarray(x).shape[1], num_classes)
    rng = np.random.default_rng(seed)
    if on_round is not None:
        on_round(0, params)
    for r in range(1, rounds + 1):
        updates = [(local_sgd(params, x[idx], y[idx], epochs=epochs, lr=lr,
                              batch_size=batch_size, rng=rng), int(idx.size))
                   for idx in parts if idx.size]
        params = average(updates)
        if on_round is not None:
            on_round(r, params)
    return params
