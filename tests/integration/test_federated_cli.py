"""Federated evaluation and personalisation on the command line (in process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

from ghofl.cli.main import main
from ghofl.data.partition import dirichlet_partition
from ghofl.model.directory import load_model
from ghofl.stats import compute_stats, save_stats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import main_ok, write_npz

C, D = 3, 5


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train/test archives, three clients' held-out archives and statistics, and a model."""
    w = tmp_path_factory.mktemp("fed")
    x, y = gaussian_mixture(7, num_classes=C, dim=D, n=480, sep=1.2)
    xtr, ytr = x[:300], y[:300]
    write_npz(w / "train.npz", xtr, ytr)
    write_npz(w / "test.npz", x[300:360], y[300:360])
    total = compute_stats(xtr, ytr, C, "full")
    save_stats(total, w / "total.ghs")
    rc = main(["fit", str(w / "total.ghs"), "--heads", "nb,lda", "--out", str(w / "model")])
    assert rc == 0
    rest, yrest = x[360:], y[360:]
    for i, idx in enumerate(np.array_split(np.arange(rest.shape[0]), 3)):
        write_npz(w / f"held{i}.npz", rest[idx], yrest[idx])
    parts = dirichlet_partition(ytr, 3, 0.1, seed=2, min_per_client=10)
    save_stats(compute_stats(xtr[parts[0]], ytr[parts[0]], C, "full"), w / "client0.ghs")
    write_npz(w / "client0.npz", xtr[parts[0]], ytr[parts[0]])
    save_stats(compute_stats(xtr[:20], ytr[:20], 4, "full"), w / "other.ghs")
    return w


def _fails(args: list[Any], capsys: Any, match: str) -> None:
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ghofl: error: "), err
    assert match in err, err


def test_local_files_add_up_to_the_central_metrics(ws: Path, tmp_path: Path,
                                                  capsys: Any) -> None:
    for i in range(3):
        out = main_ok(["evaluate", ws / "model", "--embeddings", ws / f"held{i}.npz", "--local",
                       "--out", tmp_path / f"c{i}.ghe"], capsys)
        assert "no prediction leaves this client" in out
    out = main_ok(["aggregate-eval", *(tmp_path / f"c{i}.ghe" for i in range(3)), "--out",
                   tmp_path / "total.ghe"], capsys)
    assert "3 clients, 120 held-out rows" in out
    main_ok(["evaluate", "--report", tmp_path / "total.ghe", "--json", tmp_path / "r.json"],
            capsys)
    rep = json.loads((tmp_path / "r.json").read_text())
    model = load_model(ws / "model")
    xs, ys = [], []
    for i in range(3):
        with np.load(ws / f"held{i}.npz") as z:
            xs.append(z["x"])
            ys.append(z["y"])
    x, y = np.concatenate(xs), np.concatenate(ys)
    for name in ("nb", "lda"):
        pred = model.predict(x, head=name)
        r = rep["heads"][name]
        assert r["n"] == 120 and r["clients"] == 3
        assert r["accuracy"] == pytest.approx(accuracy_score(y, pred), abs=1e-12)
        assert r["macro_f1"] == pytest.approx(f1_score(y, pred, average="macro"), abs=1e-12)


def test_file_flow_errors_are_one_line(ws: Path, tmp_path: Path, capsys: Any) -> None:
    _fails(["evaluate", ws / "model", "--embeddings", ws / "held0.npz", "--local"], capsys,
           "give --out client.ghe")
    _fails(["evaluate", ws / "model", "--embeddings", ws / "held0.npz", "--out",
            tmp_path / "x.ghe"], capsys, "add --local")
    _fails(["evaluate", ws / "model", "--report", tmp_path / "x.ghe"], capsys,
           "--report prints a total evaluation file alone")
    _fails(["evaluate", "--embeddings", ws / "held0.npz"], capsys,
           "give the model directory to evaluate")
    main_ok(["evaluate", ws / "model", "--embeddings", ws / "held0.npz", "--local", "--out",
             tmp_path / "a.ghe"], capsys)
    _fails(["aggregate-eval", tmp_path / "a.ghe", tmp_path / "a.ghe", "--out",
            tmp_path / "t.ghe"], capsys, "is given twice")
    (tmp_path / "bad.ghe").write_text("{}")
    _fails(["evaluate", "--report", tmp_path / "bad.ghe"], capsys,
           "not a ghofl evaluation file")


def test_simulate_reports_the_federated_evaluation(ws: Path, tmp_path: Path,
                                                   capsys: Any) -> None:
    args = ["simulate", "--train", ws / "train.npz", "--test", ws / "test.npz", "--clients",
            "5", "--alpha", "0.5", "--seed", "1", "--heads", "nb,lda"]
    out = main_ok([*args, "--federated-eval", "--eval-fraction", "0.25", "--json",
                   tmp_path / "sim.json"], capsys)
    assert "federated evaluation: 5 clients" in out and "fed_accuracy" in out
    res = json.loads((tmp_path / "sim.json").read_text())
    fed = res["federated_evaluation"]
    assert fed["eval_fraction"] == 0.25 and fed["clients"] == 5
    assert fed["n"] + res["n_train"] == 300 and 40 <= fed["n"] <= 110  # Binomial(300, 0.25)
    assert set(fed["heads"]) == {"nb", "lda"}
    assert 0.0 <= fed["heads"]["lda"]["ece"] <= 1.0
    plain = main_ok([*args, "--json", tmp_path / "plain.json"], capsys)
    assert "fed_accuracy" not in plain
    assert json.loads((tmp_path / "plain.json").read_text())["federated_evaluation"] is None
    _fails([*args, "--eval-fraction", "0.2"], capsys, "add --federated-eval")
    _fails([*args, "--federated-eval", "--eval-fraction", "1.5"], capsys,
           "--eval-fraction must be between 0 and 1")


def test_personalize_writes_a_model_that_predicts(ws: Path, tmp_path: Path,
                                                  capsys: Any) -> None:
    out = main_ok(["personalize", ws / "model", "--stats", ws / "client0.ghs", "--out",
                   tmp_path / "mine", "--moments", "--kappa", "20"], capsys)
    assert "nb" in out and "priors, moments" in out
    mine = load_model(tmp_path / "mine")
    rec = mine.manifest["personalised"]
    assert rec["kappa"] == 20.0 and rec["from_stats"] == str(ws / "client0.ghs")
    assert rec["heads"]["lda"] == ["priors"]
    main_ok(["evaluate", tmp_path / "mine", "--embeddings", ws / "test.npz"], capsys)
    _fails(["personalize", ws / "model", "--stats", ws / "other.ghs", "--out",
            tmp_path / "x"], capsys, "not the model's")
    _fails(["personalize", ws / "model", "--stats", ws / "client0.ghs", "--out",
            tmp_path / "t", "--tau", "5"], capsys, "add --embeddings or drop --tau")
    _fails(["personalize", ws / "model", "--stats", ws / "client0.ghs", "--out",
            tmp_path / "y", "--prior", "global"], capsys, "nothing to personalise")
    _fails(["personalize", ws / "model", "--stats", ws / "client0.ghs", "--out",
            tmp_path / "z", "--kappa", "3"], capsys, "add --moments or drop --kappa")
    _fails(["personalize", ws / "model", "--stats", ws / "client0.ghs", "--out",
            tmp_path / "z", "--prior", "mine"], capsys, "--prior must be 'local' or 'global'")


def test_personalize_fine_tunes_the_linear_heads_on_the_clients_embeddings(
        ws: Path, tmp_path: Path, capsys: Any) -> None:
    out = main_ok(["personalize", ws / "model", "--stats", ws / "client0.ghs", "--out",
                   tmp_path / "tuned", "--embeddings", ws / "client0.npz", "--tau", "30"],
                  capsys)
    assert "priors, fine-tuned" in out
    mine = load_model(tmp_path / "tuned")
    rec = mine.manifest["personalised"]
    held = np.load(ws / "client0.npz")["y"]
    ft = rec["fine_tune"]
    assert ft["tau"] == 30.0 and ft["rows"] == held.size
    assert ft["classes_held"] == np.unique(held).size
    assert ft["from_embeddings"] == str(ws / "client0.npz")
    assert rec["heads"] == {"nb": ["priors"], "lda": ["priors", "fine-tuned"]}
    card = (tmp_path / "tuned" / "MODEL_CARD.md").read_text()
    assert "- Fine-tuned on the client's own embeddings:" in card and "tau = 30" in card
    x = np.load(ws / "test.npz")["x"]
    assert set(np.unique(mine.predict(x, head="lda"))) <= set(np.unique(held).tolist())
    main_ok(["evaluate", tmp_path / "tuned", "--embeddings", ws / "test.npz"], capsys)
    write_npz(tmp_path / "named.npz", x[:5], np.zeros(5, dtype=int), classes=["nope"])
    _fails(["personalize", ws / "model", "--stats", ws / "client0.ghs", "--out",
            tmp_path / "u", "--embeddings", tmp_path / "named.npz"], capsys, "nope")
