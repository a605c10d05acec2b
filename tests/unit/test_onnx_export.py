"""Head-only ONNX graphs compute what the heads compute, for every registered head."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from ghofl.client.transforms import apply_feature_transform, transformed_info
from ghofl.errors import ConfigError
from ghofl.heads import Head, available_heads, make_head
from ghofl.heads.base import F64
from ghofl.model.onnx_graph import (
    INPUT_NAME,
    LABEL_NAME,
    PROBA_NAME,
    head_graph,
    register_onnx_converter,
)
from ghofl.moments.core import Moments, compute_moments
from ghofl.stats import compute_stats
from ghofl.stats.meta import EncoderInfo
from ghofl.stats.projection import ProjectionSpec
from tests.helpers import gaussian_mixture

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

#: trainable heads at a budget of a fraction of a second (as test_sklearn_compat's FAST)
FAST = {"epochs": 2, "n_per_class": 50, "val_per_class": 20, "batch_size": 64}
TRAINABLE = ("fishermix", "protohyper")
HAS_TORCH = importlib.util.find_spec("torch") is not None
#: (feature transform, projection dim or None, number of classes without samples)
SETUPS = [("none", None, 0), ("x+sqrt", 5, 0), ("sqrt", None, 1)]


def _head(name: str, **extra: Any) -> Head:
    if name in TRAINABLE:
        if not HAS_TORCH:
            pytest.skip("trainable heads need the torch extra")
        return make_head(name, **FAST, **extra)
    if name == "ridge":
        return make_head(name, n_calibration=32, **extra)
    return make_head(name, **extra)


def fitted(name: str, transform: str, proj_dim: int | None, empty: int,
           seed: int = 0, **extra: Any) -> tuple[Head, NDArray[np.float32]]:
    """A head fitted on statistics of toy embeddings (d = 6, C = 4 + ``empty``), and fresh
    float32 embeddings to score."""
    d, c = 6, 4
    x, y = gaussian_mixture(seed, num_classes=c, dim=d, n=400)
    x = x.astype(np.float32)
    enc = transformed_info(EncoderInfo("toy", d, "abc", "none"), transform)
    xt = apply_feature_transform(x, transform)
    proj = None if proj_dim is None else ProjectionSpec(3, xt.shape[1], proj_dim)
    stats = compute_stats(xt, y, c + empty, mode="full", encoder=enc, projection=proj)
    if name == "protohyper" and empty:
        # its default teacher standardises scores that hold -inf and the loss becomes NaN (a
        # fault of the head, reported); the base teacher trains on empty classes
        extra = {"teacher": "base", **extra}
    # classes without samples as a DP release may leave them (log prior −∞)
    head = _head(name, **extra).fit_from_moments(compute_moments(stats, allow_empty_classes=True))
    rng = np.random.default_rng(seed + 1)
    probe = (x[rng.integers(0, len(x), 40)]
             + rng.normal(scale=1.0, size=(40, d))).astype(np.float32)
    return head, probe


def run_onnx(model: Any, x: NDArray[np.float32]) -> tuple[NDArray[Any], NDArray[Any]]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    proba, label = sess.run([PROBA_NAME, LABEL_NAME], {INPUT_NAME: x})
    return proba, label


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: f"{s[0]}-p{s[1]}-e{s[2]}")
@pytest.mark.parametrize("name", available_heads())
def test_graph_matches_head(name: str, setup: tuple[str, int | None, int]) -> None:
    transform, proj_dim, empty = setup
    head, probe = fitted(name, transform, proj_dim, empty)
    model = head_graph(head, name)
    proba, label = run_onnx(model, probe)
    xt = apply_feature_transform(probe, transform)
    want = head.predict_proba(xt)
    assert proba.dtype == np.float32 and proba.shape == want.shape
    assert label.dtype == np.int64 and label.shape == (len(probe),)
    assert np.all(np.isfinite(proba))
    np.testing.assert_allclose(proba, want, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(label, head.predict(xt))
    if empty and type(head).neg_inf_arrays:  # a log prior −∞: probability exactly 0
        assert np.all(proba[:, -empty:] == 0.0)


def test_cosine_fishermix_and_qda_base_protohyper() -> None:
    """The other branches of the trainable converters: a cosine layer, a QDA_f base."""
    for name, extra in (("fishermix", {"variant": "cosine"}), ("protohyper", {"base": "qda"})):
        head, probe = fitted(name, "none", None, 0, **extra)
        proba, label = run_onnx(head_graph(head), probe)
        np.testing.assert_allclose(proba, head.predict_proba(probe), atol=1e-4, rtol=0)
        np.testing.assert_array_equal(label, head.predict(probe))


def test_metadata_records_classes_head_encoder_and_contract() -> None:
    head, _ = fitted("lda", "x+sqrt", None, 0)
    model = head_graph(head, "lda")
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props["ghofl.classes"]) == list(head.meta_.classes)
    assert props["ghofl.head"] == "lda" and props["ghofl.head_type"] == "lda"
    assert json.loads(props["ghofl.head_params"])["shrinkage"] == "auto"
    assert props["ghofl.encoder_fingerprint"] == head.meta_.encoder.fingerprint()
    contract = json.loads(props["ghofl.input_contract"])
    assert contract["shape"] == ["N", 6] and contract["feature_transform"] == "x+sqrt"
    assert props["ghofl.version"]
    assert [i.name for i in model.graph.input] == [INPUT_NAME]
    assert [o.name for o in model.graph.output] == [PROBA_NAME, LABEL_NAME]
    assert model.opset_import[0].version == 17


class _OddHead(Head):
    """A head type without a converter (scores = −‖z‖² per class)."""

    name = ""

    def __init__(self) -> None:
        pass

    def _fit(self, moments: Moments) -> None:
        self.means_ = moments.means.copy()

    def _decision(self, Z: F64) -> F64:
        out: F64 = -((Z[:, None, :] - self.means_) ** 2).sum(axis=2)
        return out


def test_head_without_converter_is_refused_until_one_is_registered() -> None:
    x, y = gaussian_mixture(0, num_classes=3, dim=4, n=90)
    head = _OddHead().fit(x, y)
    with pytest.raises(ConfigError, match="_OddHead has no ONNX converter; register one"):
        head_graph(head)

    def convert(h: Any, g: Any, z: str) -> str:
        # −‖z‖² + 2 z μᵀ − ‖μ‖²
        sq = g.mul(g.row_sq_norm(z), -1.0)
        return g.op("Add", sq, g.affine(z, 2.0 * h.means_.T, -np.sum(h.means_**2, axis=1)))

    register_onnx_converter(_OddHead, convert)
    try:
        probe = x[:10].astype(np.float32)
        proba, label = run_onnx(head_graph(head, "odd"), probe)
        np.testing.assert_allclose(proba, head.predict_proba(probe), atol=1e-4, rtol=0)
        np.testing.assert_array_equal(label, head.predict(probe))
    finally:
        from ghofl.model.onnx_graph import CONVERTERS

        CONVERTERS.pop("_OddHead", None)
    with pytest.raises(ConfigError, match="registered for Head subclasses"):
        register_onnx_converter(int, convert)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["lda", "qda"])
def test_kernel_transform_and_pca_projection(name: str, tmp_path: Any,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel feature map (read from its file) and a principal-direction basis."""
    from ghofl.client import kernel_map as km
    from ghofl.stats.projection import BASIS_DIR_ENV, pca_basis, save_basis

    monkeypatch.setenv(BASIS_DIR_ENV, str(tmp_path / "maps"))
    x, y = gaussian_mixture(4, num_classes=3, dim=5, n=300)
    x = np.abs(x).astype(np.float32)
    _, fp = km.save_kernel_map(km.build_kernel_map(x[:100], 7, seed=1))
    transform = f"x+sqrt+rbf:{fp}"
    xt = apply_feature_transform(x, transform)
    _, basis = save_basis(pca_basis(xt[:100], 8))
    proj = ProjectionSpec(0, xt.shape[1], 6, "pca-v1", basis)
    enc = transformed_info(EncoderInfo("toy", 5), transform)
    head = make_head(name).fit_from_stats(compute_stats(xt, y, 3, encoder=enc, projection=proj))
    probe = x[150:200]
    proba, label = run_onnx(head_graph(head), probe)
    np.testing.assert_allclose(proba, head.predict_proba(xt[150:200]), atol=1e-4, rtol=0)
    np.testing.assert_array_equal(label, head.predict(xt[150:200]))
