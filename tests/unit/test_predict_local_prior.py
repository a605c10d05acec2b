"""``ghofl predict --prior local --stats CLIENT.ghs``: the global heads with the client's priors."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from scipy.special import softmax
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis, QuadraticDiscriminantAnalysis

from ghofl.cli.main import build_command
from ghofl.errors import ConfigError, InputError, StatsFormatError
from ghofl.heads import make_head
from ghofl.model.directory import load_model, save_model
from ghofl.model.personalize import save_personalized, with_local_priors
from ghofl.stats import compute_stats, save_stats
from tests.helpers import gaussian_mixture
from tests.helpers_cli import write_npz

C, D = 4, 5
CLASSES = tuple(f"c{i}" for i in range(C))


def _clients_priors(counts: np.ndarray) -> np.ndarray:
    """(n_c + 1) / Σ_k (n_k + 1): Laplace's rule, written out independently."""
    return (counts + 1.0) / (counts.sum() + counts.size)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Pooled data, a global model (lda, qda, ncm), one client's rows and statistics."""
    w = tmp_path_factory.mktemp("prior")
    x, y = gaussian_mixture(3, num_classes=C, dim=D, n=600, sep=0.8)
    total = compute_stats(x, y, CLASSES, mode="full")
    heads = {"lda": make_head("lda", shrinkage=0.1, covariance_divisor="n"),
             "qda": make_head("qda", shrinkage=0.05, shrinkage_target="identity",
                              covariance_divisor="n"),
             "ncm": make_head("ncm")}
    fitted = {n: h.fit_from_stats(total) for n, h in heads.items()}
    save_model(w / "model", fitted, stats_meta=total.meta,
               extra={"stats": {"n_samples": total.n_samples,
                                "counts": total.counts.tolist()}})
    mine = np.flatnonzero((y == 0) | ((y == 1) & (np.arange(y.size) % 4 == 0))
                          | ((y == 2) & (np.arange(y.size) % 10 == 0)))  # class 3 absent
    local = compute_stats(x[mine], y[mine], CLASSES, mode="means")
    save_stats(local, w / "client.ghs")
    save_stats(compute_stats(x[:40], y[:40] % 3, 3, mode="means"), w / "other.ghs")
    (w / "broken.ghs").write_bytes(b"not statistics")
    write_npz(w / "new.npz", x[::7], y[::7])
    return {"w": w, "x": x, "y": y, "local": local}


def _sklearn_lda_with(pri: np.ndarray, x: np.ndarray, y: np.ndarray,
                      rows: np.ndarray) -> np.ndarray:
    """scikit-learn's LDA posteriors on ``rows`` with its log priors replaced by log ``pri``.

    (``LinearDiscriminantAnalysis(priors=...)`` would also weigh the class covariances by the
    priors, which is another covariance, not the same one with other priors.)
    """
    ref = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=0.1).fit(x, y)
    scores = ref.decision_function(rows) - np.log(ref.priors_) + np.log(pri)
    out: np.ndarray = softmax(scores, axis=1)
    return out


def test_local_priors_equal_sklearn_with_the_clients_priors(ws: dict[str, Any]) -> None:
    w, x, y, local = ws["w"], ws["x"], ws["y"], ws["local"]
    pri = _clients_priors(local.counts.astype(np.float64))
    assert local.counts[3] == 0 and pri[3] == pytest.approx(1 / (local.counts.sum() + C))
    model = load_model(w / "model")
    want = {"lda": _sklearn_lda_with(pri, x, y, x),
            "qda": QuadraticDiscriminantAnalysis(reg_param=0.05, priors=pri).fit(x, y)
            .predict_proba(x)}
    for name, ref in want.items():
        mine = with_local_priors(model, name, local, w / "model")
        got = mine.head(name).predict_proba(x)
        np.testing.assert_allclose(got, ref, atol=1e-6)
        assert np.isfinite(np.log(got)).all()  # the absent class keeps a finite prior
        assert not np.allclose(got, model.head(name).predict_proba(x), atol=1e-3)
        others = [n for n in model.heads if n != name]  # only the chosen head changes
        assert all(mine.heads[n] is model.heads[n] for n in others)


def _probs(path: Path) -> np.ndarray:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return np.array([[float(r[f"p_{c}"]) for c in CLASSES] for r in rows])


def _run(args: list[Any]) -> Any:
    return CliRunner().invoke(build_command(), [str(a) for a in args])


def test_predict_prior_local_on_the_command_line(ws: dict[str, Any], tmp_path: Path) -> None:
    w, x, y, local = ws["w"], ws["x"], ws["y"], ws["local"]
    base = ["predict", w / "model", "--data", w / "new.npz", "--head", "lda"]
    r = _run([*base, "--out", tmp_path / "global.csv"])
    assert r.exit_code == 0, r.output
    r = _run([*base, "--out", tmp_path / "local.csv", "--prior", "local", "--stats",
              w / "client.ghs"])
    assert r.exit_code == 0, r.output
    assert "with head 'lda' and this client's priors" in r.output
    pri = _clients_priors(local.counts.astype(np.float64))
    np.testing.assert_allclose(_probs(tmp_path / "local.csv"),
                               _sklearn_lda_with(pri, x, y, x[::7]), atol=1e-6)
    glob = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=0.1).fit(x, y)
    np.testing.assert_allclose(_probs(tmp_path / "global.csv"), glob.predict_proba(x[::7]),
                               atol=1e-6)


def test_pseudocount_zero_never_predicts_a_class_the_client_never_held(
        ws: dict[str, Any], tmp_path: Path) -> None:
    w, x, y, local = ws["w"], ws["x"], ws["y"], ws["local"]
    r = _run(["predict", w / "model", "--data", w / "new.npz", "--head", "lda", "--out",
              tmp_path / "only.csv", "--prior", "local", "--stats", w / "client.ghs",
              "--prior-pseudocount", "0"])
    assert r.exit_code == 0, r.output
    got = _probs(tmp_path / "only.csv")
    pri = local.counts / local.counts.sum()
    assert pri[3] == 0 and (got[:, 3] == 0).all()
    held = pri > 0
    ref = _sklearn_lda_with(np.where(held, pri, 1.0), x, y, x[::7])[:, held]
    np.testing.assert_allclose(got[:, held], ref / ref.sum(axis=1, keepdims=True), atol=1e-6)


def _refused(args: list[Any], error: type[Exception], match: str) -> None:
    r = _run(args)
    assert isinstance(r.exception, error), r.output
    with pytest.raises(error, match=match):
        raise r.exception


def test_predict_prior_local_refusals(ws: dict[str, Any], tmp_path: Path) -> None:
    w = ws["w"]
    base = ["predict", w / "model", "--data", w / "new.npz", "--out", tmp_path / "p.csv"]
    _refused([*base, "--prior", "local"], ConfigError,
             r"^--prior local needs this client's class counts: give --stats client\.ghs")
    _refused([*base, "--stats", w / "client.ghs"], ConfigError,
             r"^--stats gives the client's class counts for --prior local; add --prior local")
    _refused([*base, "--prior", "mine", "--stats", w / "client.ghs"], ConfigError,
             r"^--prior must be 'global' or 'local'; got 'mine'$")
    _refused([*base, "--prior-pseudocount", "0"], ConfigError,
             r"^--prior-pseudocount sets λ of the local priors; add --prior local")
    _refused([*base, "--prior", "local", "--stats", w / "client.ghs", "--head", "lda",
              "--prior-pseudocount", "-1"], ConfigError,
             r"^the prior pseudo-count must be a finite number >= 0; got -1\.0$")
    _refused([*base, "--prior", "local", "--stats", w / "other.ghs"], InputError,
             r"^the client's statistics have 3 classes \(0, 1, 2\), not the model's")
    _refused([*base, "--prior", "local", "--stats", w / "broken.ghs", "--head", "lda"],
             StatsFormatError, r"^'.*broken\.ghs' is not a readable ghofl statistics file")
    _refused([*base, "--prior", "local", "--stats", w / "client.ghs", "--head", "ncm"],
             ConfigError, r"^--prior local cannot change head 'ncm': the head scores without "
             r"class priors; choose a head that scores with class priors")
    assert not (tmp_path / "p.csv").exists()


def test_a_personalised_model_is_refused(ws: dict[str, Any], tmp_path: Path) -> None:
    w = ws["w"]
    model = load_model(w / "model")
    save_personalized(tmp_path / "mine", model, w / "model", ws["local"], "client.ghs")
    mine = load_model(tmp_path / "mine")
    with pytest.raises(InputError, match=r"is already personalised; personalise the global"):
        with_local_priors(mine, "lda", ws["local"], tmp_path / "mine")
    bare = model._replace(manifest={**model.manifest, "stats": {}})
    with pytest.raises(InputError, match=r"records no class counts, so its global priors are "
                                         r"unknown"):
        with_local_priors(bare, "lda", ws["local"], w / "model")
