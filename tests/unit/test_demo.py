"""The demo's pieces on synthetic records and features: its grids (every registered head by
default), FedAvg on the one-shot federation's clients, the tables and the three plots."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.bench.demo import DEMO_ALPHAS, demo_configs, fedavg_curve
from ghofl.bench.features import Features
from ghofl.bench.tables import (
    demo_alpha_table,
    demo_fedavg_line,
    demo_markdown,
    demo_upload_table,
    fedavg_crossing,
)
from ghofl.errors import ConfigError
from ghofl.heads.registry import available_heads
from ghofl.stats.meta import EncoderInfo
from tests.helpers import gaussian_mixture


def test_grids_use_every_registered_head_and_cover_modes_and_projections() -> None:
    cfgs = demo_configs(data_dir="/data")
    assert set(cfgs) == {"alpha", "upload", "projection"}
    for cfg in cfgs.values():
        assert cfg.heads == tuple(available_heads()) and cfg.references == ()
        assert cfg.clients == (10,) and cfg.data_dir == "/data"
    assert cfgs["alpha"].alphas == DEMO_ALPHAS and cfgs["alpha"].modes == ("full",)
    cells = {(m, p) for name in ("upload", "projection") for m in cfgs[name].modes
             for p in cfgs[name].projection_dims}
    cells.add(("full", 0))  # from the alpha grid at 0.1
    assert cells == {(m, p) for m in ("diag", "pooled", "full") for p in (0, 256, 64)}
    assert demo_configs(heads=("nb", "lda"))["alpha"].heads == ("nb", "lda")


def _features(seed: int = 0) -> Features:
    x, y = gaussian_mixture(seed, num_classes=3, dim=6, n=390)
    x = x.astype(np.float32)
    return Features("toy", "enc", x[:300], y[:300], x[300:], y[300:], ("a", "b", "c"),
                    EncoderInfo(name="enc", dim=6))


def test_fedavg_curve_runs_on_the_one_shot_partition_and_picks_lr_without_test_data() -> None:
    feats = _features()
    res = fedavg_curve(feats, alpha=0.5, clients=4, rounds=5, lrs=(0.01, 0.1), select_rounds=3)
    assert len(res["accuracy"]) == 6 and res["accuracy"][0] == pytest.approx(1 / 3, abs=0.05)
    assert res["lr"] in (0.01, 0.1) and set(res["lr_scores"]) == {"0.01", "0.1"}
    assert res["accuracy"][-1] > 0.6
    assert res["upload_bytes_per_round"] == (6 * 3 + 3) * 8
    again = fedavg_curve(feats, alpha=0.5, clients=4, rounds=5, lrs=(0.01, 0.1),
                         select_rounds=3)
    assert again["accuracy"] == res["accuracy"]  # seeded
    # the test split is not used to choose the learning rate
    shuffled = Features(**{**feats.__dict__, "y_test": feats.y_test[::-1].copy()})
    assert fedavg_curve(shuffled, alpha=0.5, clients=4, rounds=5, lrs=(0.01, 0.1),
                        select_rounds=3)["lr"] == res["lr"]
    with pytest.raises(ConfigError, match=r"FedAvg needs rounds >= 1 and a learning rate; "
                       r"got rounds=0"):
        fedavg_curve(feats, rounds=0)


def _rec(head: str, acc: float, alpha: float = 0.1, mode: str = "full",
         proj: int | None = None, upload: int = 1000) -> dict[str, Any]:
    return {"dataset": "cifar10", "encoder": "e", "mode": mode, "projection_dim": proj,
            "alpha": alpha, "clients": 10, "seed": 0, "head": head, "accuracy": acc,
            "fit_seconds": 0.5, "upload_bytes_per_client": upload}


RECORDS = (
    [_rec(h, a, alpha=al, upload=65_000_000) for al in (0.05, 0.1, 0.5)
     for h, a in (("nb", 0.70), ("lda", 0.78))]
    + [_rec("nb", 0.69, mode="diag", upload=200_000), _rec("nb", 0.6, mode="diag", proj=64,
                                                           upload=10_000),
       _rec("lda", 0.76, mode="pooled", proj=64, upload=27_000)]
    + [{"dataset": "cifar10", "encoder": "e", "mode": "reference", "projection_dim": None,
        "alpha": None, "clients": None, "seed": None, "head": "logreg", "accuracy": 0.8,
        "fit_seconds": 2.0, "upload_bytes_per_client": None}]
)


def test_alpha_table_shows_flat_rows_references_and_fedavg() -> None:
    fedavg = {"alpha": 0.1, "accuracy": [0.1, 0.5, 0.79], "seconds": 1.0, "lr": 0.1,
              "clients": 10, "upload_bytes_per_round": 102_480}
    table = demo_alpha_table(RECORDS, fedavg)
    assert "| head | α=0.05 | α=0.1 | α=0.5 | spread | fit s (max) |" in table
    assert "| lda | 78.00 | 78.00 | 78.00 | 0.00 | 0.5 |" in table
    assert "| *logreg (centralised)* | 80.00 | 80.00 | 80.00 | - | 2.0 |" in table
    assert "| *FedAvg, 2 rounds* | - | 79.00 | - | - | 1.0 |" in table
    assert "65.00 MB per client" in table


def test_fedavg_sentence_marks_the_crossing_or_the_gap() -> None:
    fedavg = {"alpha": 0.1, "accuracy": [0.1, 0.5, 0.79], "lr": 0.1, "clients": 10,
              "upload_bytes_per_round": 102_480}
    assert fedavg_crossing(fedavg["accuracy"], 0.78) == 2
    assert fedavg_crossing([0.9, 0.1], 0.5) is None  # round 0 never counts
    line = demo_fedavg_line(RECORDS, fedavg)
    assert re.search(r"reaches the best one-shot head \(lda, 78.00%\) after 2 rounds \(205.0 kB "
                     r"uploaded per client, against 65.00 MB once\)", line)
    slow = {**fedavg, "accuracy": [0.1, 0.5, 0.6]}
    assert re.search(r"does not reach the best one-shot head \(lda, 78.00%\) within 2 rounds "
                     r"\(-18.00 points after 2 rounds, 205.0 kB uploaded per client\)",
                     demo_fedavg_line(RECORDS, slow))


def test_upload_table_sorts_settings_by_bytes() -> None:
    table = demo_upload_table(RECORDS)
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    assert rows == ["| `diag` | k=64 | 10.0 kB | 60.00 | - |",
                    "| `pooled` | k=64 | 27.0 kB | - | 76.00 |",
                    "| `diag` | none | 200.0 kB | 69.00 | - |",
                    "| `full` | none | 65.00 MB | 70.00 | 78.00 |"]
    assert demo_upload_table([r for r in RECORDS if r["mode"] == "full"]) == ""


def test_markdown_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ghofl.bench.plots import write_demo_plots

    fedavg = {"alpha": 0.1, "accuracy": [0.1, 0.5, 0.6], "lr": 0.1, "clients": 10,
              "upload_bytes_per_round": 102_480, "seconds": 1.0}
    md = demo_markdown({"records": RECORDS, "fedavg": fedavg, "n_train": 3000, "n_test": 1000,
                        "encoder": "efficientnet-lite0"})
    assert md.startswith("# ghofl demo: CIFAR-10 (3,000 train / 1,000 test images)")
    paths = write_demo_plots(RECORDS, fedavg, tmp_path)
    assert [p.name for p in paths] == ["accuracy_vs_alpha.png", "fedavg_rounds.png",
                                       "accuracy_vs_bytes.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_probe_with_one_c_skips_cross_validation_and_is_cached_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sklearn")
    import ghofl.bench.references as refs

    feats = _features()
    args = (feats.x_train, feats.y_train, feats.x_test, feats.y_test)
    fixed = refs.logreg_reference(*args, cs=(0.1,))
    assert fixed.details["C"] == 0.1 and fixed.details["cv_scores"] == {}
    assert fixed.details["folds"] == 0 and fixed.accuracy > 0.8
    a = refs.run_reference("logreg", *args, cache_dir=tmp_path, logreg_cs=(0.1,))
    calls: list[Any] = []
    real = refs.logreg_reference
    monkeypatch.setattr(refs, "logreg_reference",
                        lambda *a, **k: calls.append(k) or real(*a, **k))
    assert refs.run_reference("logreg", *args, cache_dir=tmp_path, logreg_cs=(0.1,)) == a
    assert calls == []  # cached
    refs.run_reference("logreg", *args, cache_dir=tmp_path, logreg_cs=(1.0,))
    assert calls == [{"seed": 0, "cs": (1.0,)}]  # another C: another cache entry
