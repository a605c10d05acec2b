"""Head-only ONNX graphs: embeddings → feature transform → projection → head → probabilities.

:func:`head_graph` builds, with the ``onnx.helper`` API (opset :data:`OPSET`), a graph from the
fitted arrays of a head that computes exactly what :meth:`Head.predict_proba
<ghofl.heads.base.Head.predict_proba>` and :meth:`~ghofl.heads.base.Head.predict` compute on
raw encoder output::

    embeddings  float32 (N, d)   the encoder's output, before any feature transform
    probabilities float32 (N, C) softmax of the head's log-scores
    label       int64 (N,)       arg-max of the log-scores (index into the classes)
    ood_score   float64 (N,)     with the model's OOD score (:mod:`ghofl.heads.ood`): squared
                                 Mahalanobis distance to the nearest class mean, as
                                 ``ghofl predict`` reports it (float64: scores reach 1e4)
    ood         bool (N,)        ood_score > the model's threshold, only when the threshold
                                 was calibrated on data (:mod:`ghofl.heads.ood`: a model
                                 without one outputs ``ood_score`` alone)

The recorded feature transform runs in float32 (as :func:`~ghofl.client.transforms.
apply_feature_transform` does on float32 embeddings); the projection and the head's scores run
in float64, like the head itself, and only the probabilities are cast to float32. Scores of
classes without samples (log prior −∞) become :data:`NEG_SCORE`, a large negative finite
number, so their probability is exactly 0 and every output stays finite.

Each head type has a converter (:data:`CONVERTERS`, keyed by class name) that emits its
``_decision`` as ONNX nodes; :func:`register_onnx_converter` adds one for a user's own head.
onnx is imported only inside these functions (``torch`` extra).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ghofl.client.transforms import base_dim, kernel_map_of, recorded_feature_transform
from ghofl.errors import ConfigError, require_extra
from ghofl.heads.base import Head

if TYPE_CHECKING:
    import onnx

    from ghofl.heads.ood import MahalanobisOOD

__all__ = [
    "CONVERTERS",
    "INPUT_NAME",
    "LABEL_NAME",
    "NEG_SCORE",
    "OOD_FLAG_NAME",
    "OOD_SCORE_NAME",
    "OPSET",
    "PROBA_NAME",
    "GraphBuilder",
    "head_graph",
    "head_metadata",
    "head_outputs",
    "register_onnx_converter",
    "rename_input",
]

OPSET = 17
INPUT_NAME = "embeddings"
PROBA_NAME = "probabilities"
LABEL_NAME = "label"
OOD_SCORE_NAME = "ood_score"
OOD_FLAG_NAME = "ood"
#: Score given to classes whose log prior is −∞ (no samples): exp(NEG_SCORE − max) is 0.
NEG_SCORE = -1e30

F64 = NDArray[np.float64]


class GraphBuilder:
    """Collects ONNX nodes and initializers under unique names.

    Every method returns the name of the tensor it produced.
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}{hint}_{self._count}"

    def const(self, value: Any, hint: str = "c", dtype: Any = np.float64) -> str:
        """An initializer holding ``value`` (−∞ entries replaced by :data:`NEG_SCORE`)."""
        from onnx import numpy_helper

        arr = np.asarray(value, dtype=dtype)
        if arr.dtype.kind == "f":
            arr = np.where(np.isneginf(arr), NEG_SCORE, arr).astype(dtype)
        name = self._name(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op_type: str, *inputs: str, hint: str = "", **attrs: Any) -> str:
        """One node with one output."""
        from onnx import helper

        out = self._name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    # shorthands ---------------------------------------------------------------------------
    def matmul(self, x: str, matrix: Any) -> str:
        """A MatMul node of ``x`` by the constant ``matrix``; returns its output's name."""
        return self.op("MatMul", x, self.const(matrix, "w"))

    def add(self, x: str, value: Any) -> str:
        """An Add node of ``x`` and the constant ``value``; returns its output's name."""
        return self.op("Add", x, self.const(value, "b"))

    def mul(self, x: str, value: Any) -> str:
        """A Mul node of ``x`` by the constant ``value``; returns its output's name."""
        return self.op("Mul", x, self.const(value, "s"))

    def affine(self, x: str, matrix: Any, bias: Any) -> str:
        """Nodes computing x @ matrix + bias; returns the output's name."""
        return self.add(self.matmul(x, matrix), bias)

    def row_sq_norm(self, x: str) -> str:
        """Σ_j x_ij² as (N, 1)."""
        return self.op("ReduceSumSquare", x, axes=[1], keepdims=1)  # axes: attribute < opset 18


Converter = Callable[[Head, GraphBuilder, str], str]


def _linear(head: Head, g: GraphBuilder, z: str) -> str:
    """LDA, FedCGS: Z coefᵀ + intercept."""
    h: Any = head
    return g.affine(z, h.coef_.T, h.intercept_)


def _ridge(head: Head, g: GraphBuilder, z: str) -> str:
    """Ridge: (Z coefᵀ + intercept)/T."""
    h: Any = head
    t = float(h.temperature_)
    return g.affine(z, h.coef_.T / t, h.intercept_ / t)


def _diag_gaussian(head: Head, g: GraphBuilder, z: str) -> str:
    """NB-diag: log π + const − ½ (Z² inv − 2 Z (μ·inv) + Σ μ² inv), expanded as the head."""
    h: Any = head
    inv = 1.0 / h.vars_
    const = -0.5 * np.sum(np.log(2.0 * np.pi * h.vars_), axis=1)
    bias = h.log_priors_ + const - 0.5 * np.sum(h.means_**2 * inv, axis=1)
    sq = g.matmul(g.op("Mul", z, z), -0.5 * inv.T)
    return g.op("Add", sq, g.affine(z, (h.means_ * inv).T, bias))


def _sum_whitened(g: GraphBuilder, z: str, means: F64, prec: F64) -> str:
    """‖(z − μ_c) P_c‖² for every class, (N, C): one product with the concatenated P."""
    c_num, k = means.shape
    p_cat = np.swapaxes(prec, 0, 1).reshape(k, c_num * k)
    shift = np.einsum("ck,ckl->cl", means, prec).reshape(-1)
    u = g.op("Sub", g.matmul(z, p_cat), g.const(shift, "shift"))
    sq = g.op("Mul", u, u)
    shaped = g.op("Reshape", sq, g.const([0, c_num, k], "shape", np.int64))
    return g.op("ReduceSum", shaped, g.const([2], "axes", np.int64), keepdims=0)


def _qda(head: Head, g: GraphBuilder, z: str) -> str:
    """QDA: −½‖(z − μ_c)P_c‖² − ½ log det Σ̃_c + log π_c − (d/2) log 2π."""
    h: Any = head
    d = h.means_.shape[1]
    quad = _sum_whitened(g, z, h.means_, h.precision_chol_)
    bias = h.log_priors_ - h.half_log_det_ - 0.5 * d * np.log(2.0 * np.pi)
    return g.add(g.mul(quad, -0.5), bias)


def _fishermix(head: Head, g: GraphBuilder, z: str) -> str:
    """FisherMix: the layer on z_f − ō (linear, or scaled cosine) plus log priors."""
    h: Any = head
    zf = g.op("Sub", g.matmul(z, h.V_), g.const(h.offset_, "offset"))
    if h.variant != "cosine":
        return g.affine(zf, h.coef_.T, h.intercept_ + h.log_priors_)
    norm = g.op("Sqrt", g.row_sq_norm(zf))
    zn = g.op("Div", zf, g.op("Max", norm, g.const(1e-12, "eps")))
    wn = h.coef_ / np.maximum(np.linalg.norm(h.coef_, axis=1, keepdims=True), 1e-12)
    return g.add(g.matmul(zn, float(h.scale) * wn.T), h.log_priors_)


def _protohyper(head: Head, g: GraphBuilder, z: str) -> str:
    """ProtoHyper: base (NB_f or QDA_f) on z_f = Z V plus the low-rank residual."""
    h: Any = head
    zf = g.matmul(z, h.V_)
    if h.base_used_ == "qda":
        quad = _sum_whitened(g, zf, h.means_f_, h.qda_prec_)
        base = g.add(g.mul(quad, -0.5), h.log_priors_ - h.qda_half_logdet_)
    else:
        s2 = float(h.sigma2_)
        k = h.means_f_.shape[1]
        bias = (h.log_priors_ - 0.5 * np.sum(h.means_f_**2, axis=1) / s2
                - 0.5 * k * np.log(s2))
        sq = g.mul(g.row_sq_norm(zf), -0.5 / s2)
        base = g.op("Add", sq, g.affine(zf, h.means_f_.T / s2, bias))
    shifted = g.op("Sub", zf, g.const(h.offset_, "offset"))
    residual = g.affine(g.matmul(shifted, h.U_.T), h.W2_.T, h.b_)
    return g.op("Add", base, residual)


def _unscaled_linear(head: Head, g: GraphBuilder, z: str) -> str:
    """Fed3R, FedCOF: Z coefᵀ / T (no intercept)."""
    h: Any = head
    return g.matmul(z, h.coef_.T / float(h.temperature_))


def _ncm(head: Head, g: GraphBuilder, z: str) -> str:
    """NCM: cosine similarity or −½‖z − μ_c‖², over T, plus the empty-class offsets."""
    h: Any = head
    t = float(h.params_["temperature"])
    off = np.maximum(h.offsets_, -1e30)  # −inf for empty classes: finite, probability 0
    means = np.asarray(h.means_, dtype=np.float64)
    if h.params_["metric"] == "cosine":
        norms = np.linalg.norm(means, axis=1, keepdims=True)
        unit = means / np.where(norms > 0, norms, 1.0)
        zn = g.op("Sqrt", g.row_sq_norm(z))
        safe = g.op("Max", zn, g.const(np.finfo(np.float64).tiny, "tiny"))
        return g.add(g.matmul(g.op("Div", z, safe), unit.T / t), off)
    sq = g.mul(g.row_sq_norm(z), -0.5 / t)
    bias = off - 0.5 * np.sum(means**2, axis=1) / t
    return g.op("Add", sq, g.affine(z, means.T / t, bias))


#: Head class name → converter emitting its log-scores (N, C) from statistics-space inputs.
CONVERTERS: dict[str, Converter] = {
    "NBDiagHead": _diag_gaussian,
    "LDAHead": _linear,
    "FedCGSHead": _linear,
    "QDAHead": _qda,
    "RidgeHead": _ridge,
    "FisherMixHead": _fishermix,
    "ProtoHyperHead": _protohyper,
    "NCMHead": _ncm,
    "Fed3RHead": _unscaled_linear,
    "FedCOFHead": _unscaled_linear,
}


def register_onnx_converter(cls: type[Head], converter: Converter) -> None:
    """Register ``converter(head, builder, z) -> scores`` for heads of class ``cls``.

    ``z`` names the (N, d) float64 input in the statistics space (after transform and
    projection); the converter returns the name of the (N, C) float64 log-scores, the same as
    ``head._decision``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Head)):
        raise ConfigError(f"ONNX converters are registered for Head subclasses; got {cls!r}")
    CONVERTERS[cls.__name__] = converter


def _converter(head: Head) -> Converter:
    for cls in type(head).__mro__:
        if cls.__name__ in CONVERTERS and issubclass(cls, Head):
            return CONVERTERS[cls.__name__]
    raise ConfigError(
        f"head type {type(head).__name__} has no ONNX converter; register one with "
        "ghofl.model.onnx_graph.register_onnx_converter, or use the head from Python"
    )


def _feature_transform(g: GraphBuilder, x: str, name: str) -> str:
    """The recorded transform on float32 embeddings, as apply_feature_transform computes it."""
    if name == "none":
        return x
    root = g.op("Sqrt", g.op("Max", x, g.const(0.0, "zero", np.float32)))
    if name == "sqrt":
        return root
    parts = [x, root]
    if kernel_map_of(name) is not None:
        from ghofl.client.kernel_map import load_kernel_map

        m = load_kernel_map(str(kernel_map_of(name)))
        a = m.anchors.astype(np.float64)
        # the map works in float64: s = √max(x, 0), ‖s − a‖² = ‖s‖² − 2 s·a + ‖a‖²
        s = g.op("Sqrt", g.op("Max", g.op("Cast", x, to=11), g.const(0.0, "zero")))
        d2 = g.op("Add", g.row_sq_norm(s),
                  g.affine(s, -2.0 * a.T, np.einsum("ij,ij->i", a, a)))
        d2 = g.op("Max", d2, g.const(0.0, "zero"))
        block = g.add(g.mul(g.op("Exp", g.mul(d2, -float(m.gamma))), float(m.scale)),
                      -m.offset)
        parts.append(g.op("Cast", block, to=1))
    return g.op("Concat", *parts, axis=1)


def _ood_nodes(g: GraphBuilder, z: str, ood: MahalanobisOOD) -> str:
    """min_c ‖L⁻¹(z − μ_c)‖², (N,), expanded as :func:`~ghofl.heads.ood.nearest_mahalanobis`."""
    from scipy.linalg import solve_triangular

    k = ood.chol_.shape[0]
    inv_t = solve_triangular(ood.chol_, np.eye(k), lower=True).T  # L⁻ᵀ: u = z L⁻ᵀ
    m = ood.means_ @ inv_t  # (C, k)
    u = g.matmul(z, inv_t)
    d2 = g.op("Add", g.row_sq_norm(u), g.affine(u, -2.0 * m.T, np.einsum("ij,ij->i", m, m)))
    nearest = g.op("ReduceMin", d2, axes=[1], keepdims=0)
    return g.op("Max", nearest, g.const(0.0, "zero"))


def head_outputs(ood: MahalanobisOOD | None = None) -> list[str]:
    """Names of the head graph's outputs, in order, with the model's OOD score ``ood``."""
    names = [PROBA_NAME, LABEL_NAME]
    if ood is not None:
        names.append(OOD_SCORE_NAME)
        if ood.has_threshold:
            names.append(OOD_FLAG_NAME)
    return names


def head_metadata(head: Head, name: str, input_dim: int,
                  transform: str, ood: MahalanobisOOD | None = None) -> dict[str, str]:
    """The ``metadata_props`` of an exported head (with ``ood``: its score, threshold, rule).

    Every value is a string; JSON where structured.
    """
    from ghofl import __version__

    meta = head.meta_
    enc = meta.encoder
    outputs: dict[str, list[Any]] = {PROBA_NAME: ["N", meta.num_classes], LABEL_NAME: ["N"]}
    if ood is not None:
        outputs[OOD_SCORE_NAME] = ["N"]
        if ood.has_threshold:
            outputs[OOD_FLAG_NAME] = ["N"]
    contract = {
        "input": INPUT_NAME, "dtype": "float32", "shape": ["N", input_dim],
        "feature_transform": transform,
        "projection": None if meta.projection is None else meta.projection.to_dict(),
        "outputs": outputs,
    }
    props = _ood_metadata(ood) if ood is not None else {}
    return {**props,
        "ghofl.version": __version__,
        "ghofl.classes": json.dumps(list(meta.classes)),
        "ghofl.head": name,
        "ghofl.head_type": head.name or type(head).__name__,
        "ghofl.head_params": json.dumps(head.get_params(), sort_keys=True, default=str),
        "ghofl.encoder": json.dumps(None if enc is None else enc.to_dict(), sort_keys=True),
        "ghofl.encoder_fingerprint": "" if enc is None else enc.fingerprint(),
        "ghofl.input_contract": json.dumps(contract, sort_keys=True),
        "ghofl.stats_mode": meta.mode,
    }


def _ood_metadata(ood: MahalanobisOOD) -> dict[str, str]:
    from ghofl.heads.ood import OOD_SCORE

    return {"ghofl.ood_score": OOD_SCORE,
            "ghofl.ood_threshold": "" if ood.threshold_ is None else repr(float(ood.threshold_)),
            "ghofl.ood_calibration": ood.calibration_, "ghofl.ood_rule": ood.rule,
            "ghofl.ood_fpr": "" if ood.fpr_ is None else repr(float(ood.fpr_))}


def head_graph(head: Head, name: str | None = None,
               ood: MahalanobisOOD | None = None) -> onnx.ModelProto:
    """The head-only ONNX model of a fitted head (module docstring).

    Parameters
    ----------
    head : Head
        A fitted head (from statistics or a model directory).
    name : str, optional
        Name recorded in the metadata (default: the head's registered name).
    ood : MahalanobisOOD, optional
        The model's OOD score (:func:`~ghofl.model.directory.load_ood`), fitted in the head's
        statistics space: adds the output ``ood_score`` float64 (N,) and, when its threshold
        was calibrated (``threshold_`` not ``None``), ``ood`` bool (N,) (score above it).

    Returns
    -------
    onnx.ModelProto
        Checked with ``onnx.checker``; input ``embeddings`` float32 (N, d) with d the raw
        encoder dimension, outputs ``probabilities`` float32 (N, C) and ``label`` int64 (N,)
        (and ``ood_score``, ``ood``: see ``ood``).

    Raises
    ------
    ConfigError
        The head type has no converter, or the kernel map / projection basis file the
        statistics name is not on this machine.
    NotFittedError
        The head is not fitted.
    """
    require_extra("onnx", "torch")
    import onnx
    from onnx import TensorProto, helper

    head._check_fitted()
    meta = head.meta_
    transform = recorded_feature_transform(meta.encoder)
    d = base_dim(int(head.n_features_in_), transform)
    g = GraphBuilder()
    z = g.op("Cast", _feature_transform(g, INPUT_NAME, transform), to=TensorProto.DOUBLE)
    if meta.projection is not None:
        z = g.matmul(z, meta.projection.matrix())
    scores = _converter(head)(head, g, z)
    g.nodes.append(helper.make_node("Softmax", [scores], ["proba64"], axis=1))
    g.nodes.append(helper.make_node("Cast", ["proba64"], [PROBA_NAME], to=TensorProto.FLOAT))
    g.nodes.append(helper.make_node("ArgMax", [scores], [LABEL_NAME], axis=1, keepdims=0))
    c = meta.num_classes
    outputs = [helper.make_tensor_value_info(PROBA_NAME, TensorProto.FLOAT, ["N", c]),
               helper.make_tensor_value_info(LABEL_NAME, TensorProto.INT64, ["N"])]
    if ood is not None:
        _check_ood(ood, head)
        score = _ood_nodes(g, z, ood)
        g.nodes.append(helper.make_node("Identity", [score], [OOD_SCORE_NAME]))
        outputs.append(helper.make_tensor_value_info(OOD_SCORE_NAME, TensorProto.DOUBLE, ["N"]))
        if ood.threshold_ is not None:
            g.nodes.append(helper.make_node(
                "Greater", [OOD_SCORE_NAME, g.const(float(ood.threshold_), "threshold")],
                [OOD_FLAG_NAME]))
            outputs.append(helper.make_tensor_value_info(OOD_FLAG_NAME, TensorProto.BOOL,
                                                         ["N"]))
    graph = helper.make_graph(
        g.nodes, f"ghofl_{name or head.name}",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", d])],
        outputs, g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ghofl")
    model.ir_version = 8  # readable by every ONNX Runtime that implements opset 17
    from ghofl import __version__

    model.producer_version = __version__
    helper.set_model_props(model, head_metadata(head, name or head.name, d, transform, ood))
    onnx.checker.check_model(model)
    return model


def _check_ood(ood: MahalanobisOOD, head: Head) -> None:
    """Refuse an OOD score fitted in another space than the head's statistics space."""
    ood._check_fitted()
    meta = head.meta_
    if ood.means_.shape != (meta.num_classes, meta.dim):
        raise ConfigError(
            f"the OOD score has class means of shape {ood.means_.shape}, but the head was "
            f"fitted on {meta.num_classes} classes in dimension {meta.dim}; export the OOD "
            "score of the head's own model directory"
        )


def rename_input(model: onnx.ModelProto, old: str, new: str) -> None:
    """Rename the graph input ``old`` of ``model`` to ``new``, and every use of it, in place."""
    for inp in model.graph.input:
        if inp.name == old:
            inp.name = new
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
