"""The OOD threshold without an assumption and from the clients' histograms (issue 45).

No threshold until calibrated on data; the public score bins; the histogram in the federated
evaluation sums (adds, vectors, bounds, files); :meth:`MahalanobisOOD.calibrate_from_histogram`
against the conformal threshold; the head graph and the card without a threshold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ghofl.errors import ConfigError, InputError
from ghofl.evaluation.federated import (
    EvaluationSums,
    calibrate_ood,
    federated_ood_report,
    load_evaluation,
    local_evaluation,
    save_evaluation,
    vector_bounds,
)
from ghofl.heads.ood import (
    HIST_BINS,
    MahalanobisOOD,
    conformal_rank,
    ood_or_none,
    score_bin_edges,
    score_histogram,
)
from ghofl.heads.registry import make_head
from ghofl.model.card import model_card
from ghofl.model.card_update import federated_ood_threshold
from ghofl.model.directory import load_model, load_ood, save_model
from ghofl.stats import compute_stats
from tests.helpers import gaussian_mixture

C, D = 3, 4


def _fitted(seed: int = 1, n: int = 300) -> tuple[MahalanobisOOD, np.ndarray, np.ndarray]:
    x, y = gaussian_mixture(seed, num_classes=C, dim=D, n=n, sep=2.0)
    ood = ood_or_none(compute_stats(x, y, C, "full"))
    assert ood is not None
    return ood, x, y


def test_edges_are_public_exact_and_fine() -> None:
    e = score_bin_edges(7)
    assert e.shape == (HIST_BINS - 1,) and bool(np.all(np.diff(e) > 0))
    rel = e / 7.0
    assert rel[0] == 2.0 ** -12 and rel[-1] == 2.0 ** 13
    lower = rel[:-1]
    assert bool(np.all(np.diff(rel) <= lower / 32 * (1 + 1e-15)))  # at most 1/32 of the edge
    np.testing.assert_array_equal(score_bin_edges(7), e)  # the same bits every call
    counts = score_histogram(np.array([0.0, e[0], e[5] * 0.999999, e[-1], 1e300]), e)
    assert counts.dtype == np.int64 and counts.shape == (HIST_BINS,)
    assert counts[0] == 1 and counts[1] == 1 and counts[5] == 1 and counts[-1] == 2


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(20, 400), st.integers(1, 64),
       st.sampled_from([0.01, 0.05, 0.1, 0.3]))
def test_histogram_threshold_is_the_conformal_one_rounded_up(seed: int, n: int, k: int,
                                                            fpr: float) -> None:
    rng = np.random.default_rng(seed)
    scores = k * np.exp(rng.normal(0.0, 1.5, size=n))
    edges = score_bin_edges(k)
    assume(math.ceil((n + 1) * (1 - fpr) - 1e-9) <= n)  # enough rows (refusal: below)
    ood = _fitted()[0]
    ood.calibrate_from_histogram(score_histogram(scores, edges), edges, fpr)
    s_r = np.sort(scores)[conformal_rank(n, fpr) - 1]
    assert ood.threshold_ == edges[np.searchsorted(edges, s_r, side="right")]
    assert s_r < ood.threshold_ <= s_r * (1 + 1 / 32) + 1e-12 * s_r
    assert float(np.mean(scores > ood.threshold_)) <= fpr  # empirical FPR on the rows
    assert (ood.calibration_, ood.fpr_, ood.n_calibration_) == ("federated", fpr, n)
    assert ood.rule.startswith(f"federated: the ceil((n+1)(1-fpr))-th smallest score of n={n}")


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 50), st.integers(0, 50))
def test_histograms_add(seed: int, n1: int, n2: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.lognormal(2.0, 2.0, size=n1), rng.lognormal(2.0, 2.0, size=n2)
    e = score_bin_edges(5)
    np.testing.assert_array_equal(score_histogram(a, e) + score_histogram(b, e),
                                  score_histogram(np.concatenate([a, b]), e))


def test_histogram_calibration_refusals() -> None:
    ood = _fitted()[0]
    e = ood.bin_edges()
    with pytest.raises(InputError, match=r"an OOD score histogram needs B >= 2 non-negative "
                       r"integer counts and B - 1 increasing edges; got counts float64"):
        ood.calibrate_from_histogram(np.ones(HIST_BINS), e)
    with pytest.raises(InputError, match=r"B - 1 increasing edges; got counts int64 of shape "
                       r"\(5,\) and edges of shape"):
        ood.calibrate_from_histogram(np.ones(5, dtype=np.int64), e)
    with pytest.raises(InputError, match=r"B - 1 increasing edges"):
        ood.calibrate_from_histogram(np.ones(3, dtype=np.int64), np.array([2.0, 1.0]))
    few = score_histogram(np.ones(18), e)
    with pytest.raises(InputError, match=r"needs at least 19 in-distribution rows; got 18"):
        ood.calibrate_from_histogram(few, e, 0.05)
    with pytest.raises(ConfigError, match=r"the OOD false-positive rate must lie in \(0, 1\)"):
        ood.calibrate_from_histogram(score_histogram(np.ones(30), e), e, 1.5)
    beyond = score_histogram(np.full(40, e[-1] * 2), e)
    with pytest.raises(InputError, match=r"the OOD score quantile of these 40 rows lies beyond "
                       r"the histogram's last edge .*--calibrate-ood"):
        ood.calibrate_from_histogram(beyond, e, 0.05)
    assert ood.threshold_ is None  # nothing was set by a refusal


def test_legacy_gaussian_manifest_reads_without_flag() -> None:
    ood = _fitted()[0]
    arrays, scalars = ood.get_state()
    legacy = {k: v for k, v in scalars.items() if k != "gaussian_threshold"}
    legacy.update(calibration="gaussian", threshold=12.5)
    old = MahalanobisOOD.from_state(arrays, legacy, C, D, "'old'")
    assert old.threshold_ is None and old.calibration_ == "none"
    assert old.gaussian_threshold_ == 12.5
    legacy.pop("calibration")  # written before calibration was recorded
    assert MahalanobisOOD.from_state(arrays, legacy, C, D, "'old'").threshold_ is None


def _sums(seed: int, ood: MahalanobisOOD | None, heads: dict[str, object]) -> EvaluationSums:
    x, y = gaussian_mixture(seed, num_classes=C, dim=D, n=40, sep=2.0)
    return local_evaluation(heads, x, y, ood=ood)  # type: ignore[arg-type]


def test_sums_carry_the_histogram_through_add_vectors_bounds_and_files(tmp_path: Path) -> None:
    ood, x, y = _fitted()
    stats = compute_stats(x, y, C, "full")
    heads = {"lda": make_head("lda").fit_from_stats(stats)}
    parts = [_sums(s, ood, heads) for s in (2, 3, 4)]
    for p in parts:
        assert p.ood_counts is not None and int(p.ood_counts.sum()) == 40
    total = sum(parts[1:], parts[0])
    assert total.ood_counts is not None
    np.testing.assert_array_equal(total.ood_counts, sum(p.ood_counts for p in parts))
    ints, floats = total.to_vectors()
    lo = parts[0].to_vectors()[0]
    bound_i, bound_f = vector_bounds(total, 40)
    assert bound_i.shape == ints.shape and bound_f.shape == floats.shape
    assert bool(np.all(lo <= bound_i))
    back = EvaluationSums.from_vectors(total.classes, tuple(total.heads), total.bins, ints,
                                       floats)
    assert back.ood_counts is not None and back.clients == 3
    np.testing.assert_array_equal(back.ood_counts, total.ood_counts)
    plain = _sums(2, None, heads)
    assert plain.ood_counts is None and vector_bounds(plain, 40)[0].shape == \
        plain.to_vectors()[0].shape
    assert EvaluationSums.from_vectors(plain.classes, ("lda",), plain.bins,
                                       *plain.to_vectors()).ood_counts is None
    with pytest.raises(InputError, match=r"cannot add evaluation sums with and without an OOD "
                       r"score histogram; evaluate every client with the same model directory"):
        _ = plain + parts[0]
    with pytest.raises(InputError, match=r"with or without the 802 OOD score bins"):
        EvaluationSums.from_vectors(total.classes, ("lda",), total.bins, ints[:-2], floats)
    save_evaluation(tmp_path / "t.ghe", total)
    again = load_evaluation(tmp_path / "t.ghe")
    assert again.ood_counts is not None
    np.testing.assert_array_equal(again.ood_counts, total.ood_counts)
    # reference: the threshold from the rows' own scores
    rows = np.concatenate([gaussian_mixture(s, num_classes=C, dim=D, n=40, sep=2.0)[0]
                           for s in (2, 3, 4)])
    want = MahalanobisOOD.from_state(*ood.get_state(), C, D, "'x'")
    want.calibrate_from_histogram(score_histogram(want.score(rows), want.bin_edges()),
                                  want.bin_edges(), 0.1)
    assert calibrate_ood(again, ood, 0.1).threshold_ == want.threshold_


def test_files_versions_and_corrupt_histograms(tmp_path: Path) -> None:
    ood, x, y = _fitted()
    heads = {"lda": make_head("lda").fit_from_stats(compute_stats(x, y, C, "full"))}
    sums = _sums(2, ood, heads)
    save_evaluation(tmp_path / "a.ghe", sums)
    raw = json.loads((tmp_path / "a.ghe").read_text())
    assert raw["format_version"] == 2 and len(raw["ood_counts"]) == HIST_BINS

    def rewrite(body: dict[str, object], name: str) -> Path:
        from ghofl.evaluation.federated import _digest

        body = {k: v for k, v in body.items() if k != "digest"}
        (tmp_path / name).write_text(json.dumps({**body, "digest": _digest(body)}))
        return tmp_path / name

    v1 = {k: v for k, v in raw.items() if k != "ood_counts"}
    old = load_evaluation(rewrite({**v1, "format_version": 1}, "v1.ghe"))
    assert old.ood_counts is None  # version 1: read without the histogram
    with pytest.raises(InputError, match=r"has evaluation format version 3; this ghofl reads "
                       r"versions 1, 2; write it again"):
        load_evaluation(rewrite({**raw, "format_version": 3}, "v3.ghe"))
    bad = list(raw["ood_counts"])
    bad[0] += 1
    with pytest.raises(InputError, match=r"the OOD score histogram must be 802 non-negative "
                       r"integer counts summing to the 40 rows scored; got int64 of shape "
                       r"\(802,\) summing to 41"):
        load_evaluation(rewrite({**raw, "ood_counts": bad}, "bad.ghe"))
    with pytest.raises(InputError, match=r"these evaluation sums carry no OOD score histogram"):
        calibrate_ood(old, ood)


def test_report_of_the_calibration() -> None:
    ood, x, y = _fitted()
    heads = {"lda": make_head("lda").fit_from_stats(compute_stats(x, y, C, "full"))}
    total = sum((_sums(s, ood, heads) for s in (2, 3)), start=_sums(4, ood, heads))
    rep = federated_ood_report(total, ood, 0.1)
    assert rep is not None and rep["calibration"] == "federated" and rep["n"] == 120
    assert rep["threshold"] == ood.threshold_ and 0 < rep["held_out_flagged"] <= 0.1
    small = _sums(2, ood, heads)
    few = federated_ood_report(small, ood, 0.01)
    assert few is not None and few["calibration"] == "none"
    assert "needs at least 99 in-distribution rows; got 40" in few["reason"]
    assert federated_ood_report(small, None) is None


@pytest.fixture
def model(tmp_path: Path) -> Path:
    ood, x, y = _fitted()
    stats = compute_stats(x, y, C, "full")
    save_model(tmp_path / "m", {"lda": make_head("lda").fit_from_stats(stats)},
               stats_meta=stats.meta, ood=ood)
    return tmp_path / "m"


def test_card_and_graph_without_a_threshold(model: Path, tmp_path: Path) -> None:
    heads, manifest = load_model(model)
    card = (model / "MODEL_CARD.md").read_text()
    assert "but no `ood` flag: this model has no OOD threshold (calibration `none`)" in card
    assert "`ghofl evaluate MODEL --embeddings HELD_OUT.npz --calibrate-ood`" in card
    fed = model_card({**manifest, "ood": {"threshold": 3.5, "calibration": "federated",
                                          "fpr": 0.05, "n_calibration": 400}})
    assert ("flags `ood` above the threshold 3.5, calibrated on 400 held-out in-distribution "
            "items of the clients (federated evaluation") in fed
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from ghofl.model.onnx_graph import head_graph

    ood = load_ood(model, manifest)
    assert ood is not None
    graph = head_graph(heads["lda"], "lda", ood)
    props = {p.key: p.value for p in graph.metadata_props}
    assert props["ghofl.ood_threshold"] == "" and props["ghofl.ood_calibration"] == "none"
    assert "ood" not in json.loads(props["ghofl.input_contract"])["outputs"]
    sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == ["probabilities", "label", "ood_score"]
    z = np.random.default_rng(0).normal(0, 3, size=(9, D)).astype(np.float32)
    np.testing.assert_allclose(sess.run(["ood_score"], {"embeddings": z})[0],
                               ood.score(z.astype(np.float64)), rtol=1e-9, atol=1e-6)


def test_federated_threshold_refusals(model: Path, tmp_path: Path) -> None:
    _, manifest = load_model(model)
    _, x, y = _fitted()
    heads = {"lda": make_head("lda").fit_from_stats(compute_stats(x, y, C, "full"))}
    plain = _sums(2, None, heads)
    assert federated_ood_threshold(model, manifest, plain) is None  # nothing to calibrate
    with pytest.raises(InputError, match=r"carry no OOD score histogram"):
        federated_ood_threshold(model, manifest, plain, 0.1)
    stats = compute_stats(x, y, C, "full")
    save_model(tmp_path / "bare", heads, stats_meta=stats.meta)
    _, bare = load_model(tmp_path / "bare")
    with pytest.raises(InputError, match=r"the model in '.*bare' has no OOD score to "
                       r"calibrate; drop --ood-fpr"):
        federated_ood_threshold(tmp_path / "bare", bare, plain, 0.1)
    assert federated_ood_threshold(tmp_path / "bare", bare, plain) is None
