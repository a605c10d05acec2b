"""The Flower evaluation stage, in process: ServerApp and ClientApp handlers over a fake grid.

The grid delivers every message to ghofl's ClientApp handler with one persistent Context per
node (as a SuperNode keeps ``context.state`` across a run's messages).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed: pip install 'ghofl[flower]'")

from ghofl.data.partition import dirichlet_partition
from ghofl.errors import ConfigError, ProtocolError
from ghofl.evaluation.federated import EvaluationSums, local_evaluation
from ghofl.heads.ood import DEFAULT_FPR, HIST_BINS
from ghofl.integrations.flower import server_app
from ghofl.integrations.flower.eval_server import record_ood_threshold
from ghofl.integrations.flower.evaluation import (
    EVAL_INFO,
    EVAL_KEY,
    EVAL_SUMS,
    MODEL_RECORD,
    eval_fraction,
    held_out_rows,
    model_files,
)
from ghofl.integrations.flower.records import message_from_record, message_to_record
from ghofl.integrations.flower.runner import identity_node_config, make_identities
from ghofl.model.directory import load_model, load_ood
from ghofl.secure import SecAggClient, SecAggConfig, SecAggServer, VectorMeta, VectorPayload
from ghofl.secure.messages import ClientMessage, ServerMessage
from tests.helpers import FakeGrid, gaussian_mixture

CLIP, SEED, NODES, FRACTION = 30.0, 3, 4, 0.25
CLASSES = ("0", "1", "2")


@pytest.fixture
def federation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from flwr.supercore.task_identity import TaskIdentity

    for attr in ("_run_id", "_node_id", "_task_id"):  # what a ServerApp process has set
        monkeypatch.setattr(TaskIdentity, attr, 1)
    x, y = gaussian_mixture(2, num_classes=3, dim=6, n=480, sep=1.2)
    parts = dirichlet_partition(y, NODES, 1.0, SEED, min_per_client=20)
    (tmp_path / "parts").mkdir()
    for i, idx in enumerate(parts):
        np.savez(tmp_path / "parts" / f"client-{i}.npz", x=x[idx], y=y[idx])
    ids = make_identities(tmp_path / "ids", NODES)
    node_cfgs = [{**identity_node_config(ids, i), "partition-id": i} for i in range(NODES)]
    return {"x": x, "y": y, "parts": parts, "root": tmp_path, "node_cfgs": node_cfgs,
            "cfg": {"classes": json.dumps(list(CLASSES)), "clip_norm": CLIP, "heads": "nb,lda",
                    "seed": SEED, "dim": 6, "expected-nodes": NODES, "stage-timeout-s": 30.0,
                    "wait-timeout-s": 30.0, EVAL_KEY: FRACTION,
                    "data-template": str(tmp_path / "parts" / "client-{partition_id}.npz")}}


def _run(fed: dict[str, Any], out: str, **extra: Any) -> dict[str, Any]:
    cfg = {**fed["cfg"], "out-dir": str(fed["root"] / out), **extra}
    node_cfgs = fed["node_cfgs"] if "roster" in extra else [  # plain: no identities
        {"partition-id": i} for i in range(NODES)]
    return server_app.run_federation(FakeGrid(node_cfgs, cfg), cfg, fed["root"] / out, {})


def _expected(fed: dict[str, Any], model_dir: Path, nodes: int = NODES
               ) -> tuple[EvaluationSums, int]:
    """Σ over the first nodes of local_evaluation (with the model's OOD score) on each node's
    held-out rows; their training rows."""
    model = load_model(model_dir)
    ood = load_ood(model_dir, model.manifest)
    assert ood is not None  # the fit gives the model an OOD score
    sums, train_rows = [], 0
    for idx in fed["parts"][:nodes]:
        train, held = held_out_rows(fed["x"][idx], fed["y"][idx], FRACTION, SEED)
        train_rows += train.size
        sums.append(local_evaluation(model, fed["x"][idx][held], fed["y"][idx][held], ood=ood))
    return sum(sums[1:], sums[0]), train_rows


def _check_ood(fed: dict[str, Any], want: EvaluationSums, model_dir: Path) -> None:
    """The released histogram is Σ of the nodes' and the recorded threshold calibrates it."""
    assert want.ood_counts is not None and want.ood_counts.shape == (HIST_BINS,)
    assert int(want.ood_counts.sum()) == fed["n"] > 0
    total = EvaluationSums.from_vectors(want.classes, tuple(want.heads), want.bins,
                                        np.asarray(fed["sums"]["ints"], dtype=np.int64),
                                        np.asarray(fed["sums"]["floats"]))
    assert total.ood_counts is not None
    np.testing.assert_array_equal(total.ood_counts, want.ood_counts)
    model = load_model(model_dir)
    fresh = load_ood(model_dir, model.manifest)
    assert fresh is not None
    threshold = fresh.calibrate_from_histogram(want.ood_counts, fresh.bin_edges(),
                                               DEFAULT_FPR).threshold_
    rep = fed["ood"]
    assert rep["calibration"] == "federated" and rep["fpr"] == DEFAULT_FPR
    assert rep["threshold"] == threshold and rep["n"] == fed["n"]
    assert 0.0 <= rep["held_out_flagged"] <= DEFAULT_FPR
    entry = model.manifest["ood"]
    assert entry["calibration"] == "federated" and entry["threshold"] == threshold
    assert entry["fpr"] == DEFAULT_FPR and entry["n_calibration"] == fed["n"]


def test_secure_evaluation_stage_equals_the_nodes_local_evaluations(
        federation: dict[str, Any]) -> None:
    roster = str(federation["root"] / "ids" / "roster.json")
    res = _run(federation, "secure", protocol="secure", roster=roster)
    model_dir = federation["root"] / "secure" / "model"
    want, train_rows = _expected(federation, model_dir)
    fed = res["federated_evaluation"]
    assert res["n_samples"] == train_rows  # the statistics come from the other rows
    assert fed["protocol"]["protocol"] == "secure"
    assert sorted(fed["protocol"]["survivor_ids"]) == [f"site-{i}" for i in range(NODES)]
    assert fed["clients"] == NODES and fed["problems"] == {} and fed["status"] == "ok"
    assert fed["n"] == sum(held_out_rows(federation["x"][p], federation["y"][p], FRACTION,
                                         SEED)[1].size for p in federation["parts"])
    ints, floats = want.to_vectors()
    np.testing.assert_array_equal(fed["sums"]["ints"], ints)  # counts exact
    np.testing.assert_allclose(fed["sums"]["floats"], floats, rtol=1e-12, atol=1e-12)
    from ghofl.evaluation.federated import report

    for head, metrics in report(want).items():
        for k, v in metrics.items():
            assert fed["heads"][head][k] == pytest.approx(v, rel=1e-12, abs=1e-12), (head, k)
    _check_ood(fed, want, model_dir)
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert manifest["ood"]["calibration"] == "federated"
    (entry,) = [e for e in manifest["evaluations"] if e["kind"] == "federated"]
    assert entry["clients"] == NODES and entry["n"] == fed["n"]
    assert "flower federated evaluation" in (model_dir / "MODEL_CARD.md").read_text()


class _Silent(FakeGrid):
    """A grid whose node 3 fails on the model message (it scores nothing); the replies kept."""

    def __init__(self, node_cfgs: list[dict[str, Any]], run_cfg: dict[str, Any]) -> None:
        super().__init__(node_cfgs, run_cfg)
        self.held: list[Any] = []

    def pull_messages(self, ids: set[str]) -> list[Any]:
        out = []
        for mid in sorted(ids):
            node, content = self.pushed[mid]
            if MODEL_RECORD in content and node == 3:
                del self.pushed[mid]
                out.append(SimpleNamespace(
                    metadata=SimpleNamespace(src_node_id=node, reply_to_message_id=mid),
                    has_error=lambda: True, error=SimpleNamespace(code=0, reason="down")))
                continue
            (reply,) = super().pull_messages({mid})
            if MODEL_RECORD in content:
                self.held.append(reply.content[EVAL_INFO]["held"])
            out.append(reply)
        return out


def test_a_roster_round_counts_a_node_that_scored_nothing_as_a_dropout(
        federation: dict[str, Any]) -> None:
    roster = str(federation["root"] / "ids" / "roster.json")
    cfg = {**federation["cfg"], "out-dir": str(federation["root"] / "r"), "protocol": "secure",
           "roster": roster}
    grid = _Silent(federation["node_cfgs"], cfg)
    res = server_app.run_federation(grid, cfg, federation["root"] / "r", {})
    fed = res["federated_evaluation"]
    assert fed["status"] == "ok", fed
    assert sorted(fed["protocol"]["survivor_ids"]) == [f"site-{i}" for i in range(3)]
    assert "site-3" in fed["protocol"]["dropped"] and "site-3" in fed["problems"]
    assert grid.held == [True] * 3  # a node says whether it holds rows, never how many
    assert fed["n"] == sum(
        held_out_rows(federation["x"][p], federation["y"][p], FRACTION, SEED)[1].size
        for p in federation["parts"][:3])
    want, _ = _expected(federation, federation["root"] / "r" / "model", nodes=3)
    _check_ood(fed, want, federation["root"] / "r" / "model")


def test_plain_evaluation_stage_and_distributed_dp(federation: dict[str, Any]) -> None:
    res = _run(federation, "plain")
    want, _ = _expected(federation, federation["root"] / "plain" / "model")
    fed = res["federated_evaluation"]
    assert fed["protocol"]["protocol"] == "plain" and fed["clients"] == NODES
    np.testing.assert_array_equal(fed["sums"]["ints"], want.to_vectors()[0])
    _check_ood(fed, want, federation["root"] / "plain" / "model")
    roster = str(federation["root"] / "ids" / "roster.json")
    dp = _run(federation, "dp", protocol="secure", roster=roster, dp_epsilon=4.0,
              dp_mode="distributed", max_samples=400)
    assert dp["federated_evaluation"]["status"] == "ok"
    assert dp["federated_evaluation"]["ood"]["fpr"] == DEFAULT_FPR  # from the noised histogram
    priv = dp["privacy"]
    assert "every client added a share" in priv["evaluation"]["noise"]
    assert priv["epsilon_spent"] < priv["epsilon_total"]


def test_a_failed_evaluation_stage_keeps_the_fitted_model(
        federation: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import ghofl.integrations.flower.evaluation as ev

    monkeypatch.setattr(ev, "MAX_MODEL_BYTES", 10)
    res = _run(federation, "big")
    assert res["status"] == "ok" and res["federated_evaluation"]["status"] == "failed"
    assert "one Flower message carries" in res["federated_evaluation"]["error"]
    assert (federation["root"] / "big" / "model" / "manifest.json").is_file()


def test_vector_round_messages_survive_the_records_codec() -> None:
    meta = VectorMeta("evaluation", (5, 1), (2.0,))
    payloads = {c: VectorPayload(meta, np.array([i, 1]), np.array([0.5 * i]))
                for i, c in enumerate("abc")}
    server = SecAggServer(SecAggConfig(clip_norm=1.0, threshold=2), meta, list(payloads))
    clients = {c: SecAggClient(c, p, allow_unauthenticated=True) for c, p in payloads.items()}
    for _ in server.stages:
        replies = []
        for c, request in server.requests().items():
            req = message_from_record(message_to_record(request), ServerMessage)
            assert isinstance(req, ServerMessage)
            rep = message_from_record(message_to_record(clients[c].handle(req)), ClientMessage)
            assert isinstance(rep, ClientMessage)
            replies.append((c, rep))
        server.receive(replies)
    np.testing.assert_array_equal(server.vector_result().ints, [3, 3])


def test_evaluation_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be a fraction in"):
        eval_fraction({EVAL_KEY: 1.5})
    assert eval_fraction({}) == 0.0
    x = np.arange(20.0).reshape(10, 2)
    train, held = held_out_rows(x, np.zeros(10, dtype=np.int64), 0.25, 1)
    assert np.union1d(train, held).tolist() == list(range(10))
    assert np.intersect1d(train, held).size == 0
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "big.bin").write_bytes(b"0")
    import ghofl.integrations.flower.evaluation as ev

    small = pytest.MonkeyPatch()
    small.setattr(ev, "MAX_MODEL_BYTES", 0)
    try:
        with pytest.raises(ConfigError, match="more than the 0 one Flower message carries"):
            model_files(tmp_path / "m")
    finally:
        small.undo()
    with pytest.raises(ProtocolError, match="outside the model directory"):
        ev.score_model({"../x": b""}, np.zeros((1, 2)), np.zeros(1, dtype=np.int64))


class _NoHistogram(FakeGrid):
    """A plain grid whose node 0 returns its sums without the OOD score histogram."""

    def pull_messages(self, ids: set[str]) -> list[Any]:
        from flwr.app import Array, ArrayRecord

        out = super().pull_messages(ids)
        for reply in out:
            sums = reply.content.get(EVAL_SUMS)
            if sums is not None and reply.metadata.src_node_id == 0:
                ints = sums["ints"].numpy()
                cut = np.concatenate([ints[:-1 - HIST_BINS], ints[-1:]])
                reply.content[EVAL_SUMS] = ArrayRecord({"ints": Array(cut),
                                                        "floats": sums["floats"]})
        return out


def test_a_node_without_the_histogram_is_left_out(federation: dict[str, Any]) -> None:
    cfg = {**federation["cfg"], "out-dir": str(federation["root"] / "nh")}
    grid = _NoHistogram([{"partition-id": i} for i in range(NODES)], cfg)
    fed = server_app.run_federation(grid, cfg, federation["root"] / "nh", {})[
        "federated_evaluation"]
    assert fed["status"] == "ok" and fed["clients"] == NODES - 1
    (problem,) = fed["problems"].values()
    assert "not the" in problem and "layout (its OOD score histogram included" in problem
    assert fed["ood"]["calibration"] == "federated"


def test_too_few_held_out_rows_leave_the_threshold_uncalibrated(
        federation: dict[str, Any]) -> None:
    _run(federation, "few", **{EVAL_KEY: 0.0})
    model_dir = federation["root"] / "few" / "model"
    model = load_model(model_dir)
    ood = load_ood(model_dir, model.manifest)
    assert ood is not None
    x, y = federation["x"][:5], federation["y"][:5]
    rep = record_ood_threshold(model_dir, local_evaluation(model, x, y, ood=ood), ood)
    assert rep is not None and rep["calibration"] == "none" and rep["fpr"] == DEFAULT_FPR
    assert "needs at least" in rep["reason"] and "got 5" in rep["reason"]
    assert load_model(model_dir).manifest["ood"]["calibration"] == "none"
    assert record_ood_threshold(model_dir, local_evaluation(model, x, y), None) is None
