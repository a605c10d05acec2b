"""The Flower evaluation stage end to end (simulation engine on 127.0.0.1, Flower 1.42).

Four simulated nodes with identity keys and a roster: the secure statistics round, the fit,
then the evaluation stage (the model sent to every node, each scoring it on its held-out rows,
one secure vector round with the same identities and roster). The test starts its own
SuperLink, stops exactly the processes it started by PID and checks that none survives; it
waits on conditions only (the ServerApp's node and stage timeouts), never a fixed sleep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.evaluation.federated import local_evaluation, report
from ghofl.heads.ood import DEFAULT_FPR
from ghofl.integrations.flower.evaluation import EVAL_KEY, held_out_rows
from ghofl.model.directory import load_model, load_ood
from tests.integration.test_flower import APP, _closed, _config, _data, _simulated

pytestmark = pytest.mark.slow

NODES, FRACTION, SEED = 4, 0.25, 0


def test_secure_evaluation_stage_equals_the_nodes_local_evaluations(tmp_path: Path) -> None:
    data = _data(tmp_path, NODES)
    flower, roster = _simulated(tmp_path, NODES)
    try:
        flower.__enter__()
        res = flower.run(_config(tmp_path, data, "out", **roster,
                                 **{"expected-nodes": NODES, EVAL_KEY: FRACTION}),
                         app_dir=APP, num_supernodes=NODES)
    finally:
        _closed(flower)
    assert res["status"] == "ok", res.get("error")
    fed: dict[str, Any] = res["federated_evaluation"]
    assert fed["protocol"]["protocol"] == "secure" and fed["problems"] == {}
    assert sorted(fed["protocol"]["survivor_ids"]) == [f"site-{i}" for i in range(NODES)]
    model_dir = tmp_path / "out" / "model"
    model = load_model(model_dir)
    ood = load_ood(model_dir, model.manifest)
    assert ood is not None
    sums, train_rows = [], 0
    for idx in data["parts"]:
        train, held = held_out_rows(data["xtr"][idx], data["ytr"][idx], FRACTION, SEED)
        train_rows += train.size
        sums.append(local_evaluation(model, data["xtr"][idx][held], data["ytr"][idx][held],
                                     ood=ood))
    want = sum(sums[1:], sums[0])
    ints, floats = want.to_vectors()
    np.testing.assert_array_equal(fed["sums"]["ints"], ints)  # counts exact
    np.testing.assert_allclose(fed["sums"]["floats"], floats, rtol=1e-12, atol=1e-12)
    for head, metrics in report(want).items():
        for k, v in metrics.items():
            assert fed["heads"][head][k] == pytest.approx(v, rel=1e-12, abs=1e-12), (head, k)
    assert res["n_samples"] == train_rows  # the nodes' statistics come from the other rows
    assert fed["clients"] == NODES and fed["n"] == int(ints[:9].sum())
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert [e["kind"] for e in manifest["evaluations"]] == ["federated"]
    assert want.ood_counts is not None  # the histogram travelled with the sums
    threshold = ood.calibrate_from_histogram(want.ood_counts, ood.bin_edges(),
                                             DEFAULT_FPR).threshold_
    assert fed["ood"]["calibration"] == "federated" and fed["ood"]["threshold"] == threshold
    assert manifest["ood"]["calibration"] == "federated"
    assert manifest["ood"]["threshold"] == threshold
