"""The OOD threshold calibrated on data (conformal rule): its false-positive rate on fresh
in-distribution rows, its refusals, its record in the manifest, the exported graph's
``ood_score``/``ood`` outputs and ``ghofl evaluate --calibrate-ood`` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ghofl.errors import ConfigError, InputError
from ghofl.heads.ood import MahalanobisOOD, conformal_rank
from ghofl.heads.registry import make_head
from ghofl.model.directory import MANIFEST, load_model, load_ood, save_model, update_ood
from ghofl.moments.core import compute_moments
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture


def _heavy_tailed(seed: int, n: int, dim: int = 8, num_classes: int = 4
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Class means plus Student-t (3 degrees of freedom) noise: far from the Gaussian model."""
    rng = np.random.default_rng(seed)
    means = np.random.default_rng(100).normal(0.0, 4.0, size=(num_classes, dim))
    y = rng.integers(0, num_classes, size=n)
    return means[y] + rng.standard_t(3, size=(n, dim)), y


def _fitted(x: np.ndarray, y: np.ndarray, num_classes: int = 4) -> MahalanobisOOD:
    return MahalanobisOOD().fit_from_moments(
        compute_moments(compute_stats(x, y, num_classes, "full")))


def test_threshold_is_the_conformal_order_statistic() -> None:
    x, y = _heavy_tailed(0, 3000)
    ood = _fitted(x[:2000], y[:2000])
    cal = x[2000:2237]  # n = 237
    ood.calibrate(cal, fpr=0.1)
    r = math.ceil(238 * 0.9)
    assert r == conformal_rank(237, 0.1) == 215
    assert ood.threshold_ == np.sort(ood.score(cal))[r - 1]
    assert (ood.calibration_, ood.fpr_, ood.n_calibration_) == ("conformal", 0.1, 237)
    assert int(np.sum(ood.flag(ood.score(cal)))) <= 0.1 * 237
    assert conformal_rank(19, 0.05) == 19 and conformal_rank(99, 0.01) == 99


def test_empirical_fpr_within_binomial_tolerance_on_fresh_data() -> None:
    """n = 2000 calibration rows: the FPR of one calibration is Beta(n + 1 − r, r) distributed,
    mean 100/2001, sd 0.0049; the test rate adds binomial noise of sd 0.0015 (20 000 rows)."""
    rates, gaussian = [], []
    for seed in range(5):
        x, y = _heavy_tailed(seed, 26000)
        ood = _fitted(x[:4000], y[:4000])
        fresh = ood.score(x[6000:])
        assert ood.gaussian_threshold_ is not None
        gaussian.append(float(np.mean(fresh > ood.gaussian_threshold_)))  # the chi-square value
        ood.calibrate(x[4000:6000], fpr=0.05)
        rates.append(float(np.mean(ood.flag(fresh))))
    assert all(abs(r - 0.05) <= 0.021 for r in rates), rates  # 4 sd of one draw
    assert abs(float(np.mean(rates)) - 0.05) <= 0.0095, rates  # 4 sd of the mean of five
    assert min(gaussian) > 0.03, gaussian  # heavy tails: the Gaussian 1 % value over-flags


def test_refusals_one_line() -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=4, n=200, sep=2.0)
    ood = _fitted(x, y, 3)
    with pytest.raises(InputError, match=r"calibrating the OOD threshold at false-positive "
                       r"rate 0.05 needs at least 19 in-distribution rows; got 18; give more "
                       r"held-out rows or a larger rate \(--ood-fpr\)"):
        ood.calibrate(x[:18], fpr=0.05)
    ood.calibrate(x[:19], fpr=0.05)  # r = 19 = n: the largest score
    assert ood.threshold_ == ood.score(x[:19]).max()
    for bad in (0.0, 1.0, -0.1, True):
        with pytest.raises(ConfigError, match=r"the OOD false-positive rate must lie in "
                           r"\(0, 1\), e.g. 0.05; got"):
            ood.calibrate(x, fpr=bad)
    with pytest.raises(InputError, match=r"the OOD calibration rows hold NaN or infinite"):
        ood.calibrate(np.vstack([x, np.full((1, 4), np.nan)]), fpr=0.05)
    with pytest.raises(InputError, match=r"takes inputs of shape \(n, 4\); got \(30, 3\)"):
        ood.calibrate(x[:30, :3])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    x, y = gaussian_mixture(1, num_classes=3, dim=4, n=300, sep=2.0)
    stats = compute_stats(x, y, 3, "full")
    save_model(tmp_path / "m", {"lda": make_head("lda").fit_from_stats(stats)},
               stats_meta=stats.meta, ood=_fitted(x, y, 3))
    return tmp_path / "m"


def test_manifest_records_rule_and_fpr_and_stays_signed(model: Path) -> None:
    _, manifest = load_model(model)
    ood = load_ood(model, manifest)
    assert ood is not None and manifest["ood"]["calibration"] == "none"
    assert "fpr" not in manifest["ood"] and manifest["ood"]["threshold"] is None
    x, _ = gaussian_mixture(2, num_classes=3, dim=4, n=300, sep=2.0)
    ood.calibrate(x, fpr=0.1)
    entry = update_ood(model, ood)
    _, manifest = load_model(model)  # the digest was recomputed: still signed
    assert manifest["ood"] == entry
    assert entry["calibration"] == "conformal" and entry["fpr"] == 0.1
    assert entry["n_calibration"] == 300 and entry["threshold"] == ood.threshold_
    assert entry["rule"].startswith("conformal: the ceil((n+1)(1-fpr))-th smallest score of "
                                    "n=300 held-out in-distribution rows, fpr=0.1")
    again = load_ood(model, manifest)
    assert again is not None and again.threshold_ == ood.threshold_
    assert (again.calibration_, again.fpr_, again.n_calibration_) == ("conformal", 0.1, 300)
    # back to no threshold: fpr and n_calibration leave the entry
    entry = update_ood(model, _fitted(*gaussian_mixture(1, num_classes=3, dim=4, n=300,
                                                        sep=2.0), 3))
    assert entry["calibration"] == "none" and "fpr" not in entry and entry["threshold"] is None


def test_update_and_state_refusals(model: Path, tmp_path: Path) -> None:
    other = _fitted(*gaussian_mixture(7, num_classes=3, dim=4, n=300, sep=2.0), 3)
    with pytest.raises(InputError, match=r"the OOD score given differs from '.*ood\.npz'; "
                       r"calibrate the one load_ood reads from this model directory"):
        update_ood(model, other)
    x, y = gaussian_mixture(1, num_classes=3, dim=4, n=300, sep=2.0)
    stats = compute_stats(x, y, 3, "full")
    save_model(tmp_path / "plain", {"lda": make_head("lda").fit_from_stats(stats)},
               stats_meta=stats.meta)
    with pytest.raises(InputError, match=r"has no OOD score \(ood\.npz\); fit it again"):
        update_ood(tmp_path / "plain", other)
    arrays, scalars = other.calibrate(x, 0.05).get_state()
    for key, value, what in [("calibration", "beta", r"calibration must be one of none, "
                              r"conformal, federated; got 'beta'"),
                             ("fpr", 2.0, r"fpr must lie in \(0, 1\); got 2.0"),
                             ("n_calibration", 0, r"n_calibration must be a positive integer")]:
        with pytest.raises(InputError, match=r"'here' is malformed \(" + what):
            MahalanobisOOD.from_state(arrays, {**scalars, key: value}, 3, 4, "'here'")


def _session(path: Path) -> Any:
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_exported_graph_outputs_ood_score_and_flag(model: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from ghofl.model.onnx_graph import head_graph

    heads, manifest = load_model(model)
    ood = load_ood(model, manifest)
    assert ood is not None
    rng = np.random.default_rng(3)
    x = np.vstack([rng.normal(0, 2, size=(40, 4)), rng.normal(0, 40, size=(10, 4))])
    x = x.astype(np.float32)
    ood.calibrate(gaussian_mixture(2, num_classes=3, dim=4, n=300, sep=2.0)[0], 0.05)
    (tmp_path / "g.onnx").write_bytes(head_graph(heads["lda"], "lda", ood).SerializeToString())
    sess = _session(tmp_path / "g.onnx")
    assert [o.name for o in sess.get_outputs()] == ["probabilities", "label", "ood_score", "ood"]
    proba, _, score, flag = sess.run(None, {"embeddings": x})
    want = ood.score(x.astype(np.float64))
    np.testing.assert_allclose(score, want, rtol=1e-9, atol=1e-6)
    np.testing.assert_array_equal(flag, want > ood.threshold_)
    assert 0 < int(flag.sum()) < 50
    np.testing.assert_allclose(proba, heads["lda"].predict_proba(x), atol=1e-5)
    import onnx

    props = {p.key: p.value for p in onnx.load(str(tmp_path / "g.onnx")).metadata_props}
    assert float(props["ghofl.ood_threshold"]) == ood.threshold_
    assert props["ghofl.ood_fpr"] == "0.05" and props["ghofl.ood_rule"] == ood.rule
    assert json.loads(props["ghofl.input_contract"])["outputs"]["ood"] == ["N"]
    wrong = _fitted(*gaussian_mixture(0, num_classes=2, dim=4, n=100, sep=2.0), 2)
    with pytest.raises(ConfigError, match=r"the OOD score has class means of shape \(2, 4\), "
                       r"but the head was fitted on 3 classes in dimension 4"):
        head_graph(heads["lda"], "lda", wrong)


def test_cli_calibrate_predict_and_export_agree(model: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("onnx")
    from ghofl.cli.main import main

    x, y = gaussian_mixture(2, num_classes=3, dim=4, n=300, sep=2.0)
    np.savez(tmp_path / "cal.npz", x=x, y=y)
    rng = np.random.default_rng(5)
    new = np.vstack([x[:30], rng.normal(0, 30, size=(6, 4))]).astype(np.float32)
    np.savez(tmp_path / "new.npz", x=new)
    assert main(["evaluate", str(model), "--embeddings", str(tmp_path / "cal.npz"),
                 "--calibrate-ood", "--ood-fpr", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "OOD threshold" in out and "from 300 in-distribution rows at false-positive rate " \
        "0.1 (conformal rule)" in out
    manifest = json.loads((model / MANIFEST).read_text())
    assert manifest["ood"]["fpr"] == 0.1 and manifest["ood"]["calibration"] == "conformal"
    ood = load_ood(model, manifest)
    assert ood is not None and float(np.mean(ood.flag(ood.score(x)))) <= 0.1
    assert main(["predict", str(model), "--data", str(tmp_path / "new.npz"), "--out",
                 str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert main(["export", str(model), "--head", "lda", "--out", str(tmp_path / "m.onnx"),
                 "--head-only"]) == 0
    _, _, score, flag = _session(tmp_path / "m.onnx").run(None, {"embeddings": new})
    np.testing.assert_allclose(score, [r["ood_score"] for r in rows], rtol=0, atol=1e-4)
    assert flag.tolist() == [r["ood"] for r in rows]
    assert any(flag[30:]) and not all(flag[:30])
    assert main(["evaluate", str(model), "--embeddings", str(tmp_path / "cal.npz"),
                 "--ood-fpr", "0.1"]) == 2
    assert "--ood-fpr is the rate of --calibrate-ood; add --calibrate-ood" in \
        capsys.readouterr().err
    assert main(["evaluate", str(model), "--embeddings", str(tmp_path / "cal.npz"),
                 "--calibrate-ood", "--ood-fpr", "0.001"]) == 2
    assert "needs at least 999 in-distribution rows; got 300" in capsys.readouterr().err


def test_cli_calibrate_needs_a_model_with_the_score(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ghofl.cli.main import main

    x, y = gaussian_mixture(1, num_classes=3, dim=4, n=300, sep=2.0)
    stats = compute_stats(x, y, 3, "full")
    save_model(tmp_path / "plain", {"lda": make_head("lda").fit_from_stats(stats)},
               stats_meta=stats.meta)
    np.savez(tmp_path / "cal.npz", x=x, y=y)
    assert main(["evaluate", str(tmp_path / "plain"), "--embeddings",
                 str(tmp_path / "cal.npz"), "--calibrate-ood"]) == 2
    assert "has no OOD score to calibrate; fit it again with `ghofl fit`" in \
        capsys.readouterr().err
