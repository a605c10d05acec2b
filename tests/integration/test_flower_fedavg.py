"""The FedAvg baseline on Flower's simulation engine (Flower's own FedAvg strategy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.baselines import fedavg_rounds, softmax_accuracy
from ghofl.data.partition import dirichlet_partition
from ghofl.integrations.flower.runner import run_local
from tests.helpers import gaussian_mixture

pytestmark = pytest.mark.slow
APP = Path(__file__).resolve().parents[2] / "examples" / "flower_fedavg"


def test_fedavg_on_flower_improves_on_round_zero(tmp_path: Path) -> None:
    x, y = gaussian_mixture(4, num_classes=3, dim=8, n=900, sep=1.5)
    xtr, ytr, xte, yte = x[:700], y[:700], x[700:], y[700:]
    parts = dirichlet_partition(ytr, 4, 0.5, seed=0)
    (tmp_path / "parts").mkdir()
    for i, idx in enumerate(parts):
        np.savez(tmp_path / "parts" / f"client-{i}.npz", x=xtr[idx], y=ytr[idx])
    np.savez(tmp_path / "test.npz", x=xte, y=yte)
    config = {"test-path": str(tmp_path / "test.npz"), "out-dir": str(tmp_path / "out"),
              "num-classes": 3, "dim": 8, "num-rounds": 3, "local-epochs": 1, "lr": 0.05,
              "batch-size": 32, "seed": 0, "wait-timeout-s": 120.0}
    res = run_local("simulation", 4, config, tmp_path / "work",
                    data_template=str(tmp_path / "parts" / "client-{partition_id}.npz"),
                    app_dir=APP, timeout_s=600)
    assert res["status"] == "ok" and res["rounds"] == 3 and res["nodes"] == 4
    acc = res["accuracy"]
    assert len(acc) == 4  # round 0 (zero weights) and after each round
    assert acc[-1] > acc[0] + 0.2
    assert res["bytes_per_round"] == 2 * 4 * 8 * (8 * 3 + 3)
    # the same training in process reaches an accuracy in the same range
    ref: list[float] = []
    fedavg_rounds(xtr, ytr, parts, 3, rounds=3, lr=0.05, batch_size=32,
                  on_round=lambda r, p: ref.append(softmax_accuracy(p, xte, yte)))
    assert abs(ref[-1] - acc[-1]) < 0.1
