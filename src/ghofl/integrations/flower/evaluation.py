"""The Flower evaluation stage: the nodes score the fitted model on their held-out rows.

With the run config key :data:`EVAL_KEY` (``federated-eval``, a fraction f in (0, 1); 0 or
absent: no stage), every node holds out each of its rows with probability f
(:func:`held_out_rows`, the rule of ``ghofl simulate --federated-eval``: a keyed hash of the
row and its label under the plan's seed decides, whatever the node's other rows,
:mod:`ghofl.evaluation.split`) and computes its statistics from the rest
(:func:`~ghofl.integrations.flower.eval_node.node_statistics`). After the fit, the ServerApp
(:func:`~ghofl.integrations.flower.eval_server.run_evaluation`):

1. sends every node the model directory's files (one message per node: an ``ArrayRecord``
   :data:`MODEL_RECORD` of uint8 arrays and a ``ConfigRecord`` :data:`EVAL_INFO` naming them;
   at most :data:`MAX_MODEL_BYTES`, below Flower's gRPC message limit). The node loads the
   model, scores it on its held-out rows (:func:`~ghofl.evaluation.federated.local_evaluation`)
   and keeps its :class:`~ghofl.evaluation.federated.EvaluationSums` in ``context.state``
   (:data:`EVAL_STATE`); it answers only whether it holds held-out rows (never how many);
   with the plain protocol it returns its sums (:data:`EVAL_SUMS`);
2. secure protocol: runs one vector round (:mod:`ghofl.secure.vectors`) with the statistics
   round's identities, roster (every roster client is invited; those that scored nothing
   are its dropouts), node policy and ledger; the node recognises the round by its
   advertised :class:`~ghofl.secure.VectorMeta` and masks the sums it kept (under
   distributed DP first adding its noise share,
   :func:`~ghofl.server.eval_privacy.evaluation_noise_share`, for the round's threshold).
   Its ledger records the digest of its held-out rows (:func:`~ghofl.evaluation.split.
   rows_digest`) with the round's privacy cost, so it refuses a second evaluation round
   over the same rows unless its node config says ``allow-repeat-rounds=true``;
3. releases the total (central DP: noised by the server; distributed: post-processed only),
   charges it to the run's privacy report and returns the report of
   :func:`~ghofl.evaluation.federated.report` (its row count ``n`` read from the released
   total), which the ServerApp writes to ``results.json``
   (``federated_evaluation``) and records in the model card
   (:func:`~ghofl.model.card_update.record_evaluation`).

When the model holds an OOD score (``ood.npz``, among the files sent), the node also counts
its held-out rows' scores in the public bins (:func:`~ghofl.heads.ood.score_bin_edges`): the
sums carry ``ood_counts`` (as ``ghofl evaluate --local`` writes them), the round's layout
(:func:`layout_of`) includes the histogram on both sides, and the ServerApp calibrates the
model's threshold from the released total's histogram at :data:`~ghofl.heads.ood.DEFAULT_FPR`
(:func:`~ghofl.evaluation.federated.federated_ood_report`), records it in the model
directory (:func:`~ghofl.model.directory.update_ood`, calibration ``"federated"``, as
``ghofl evaluate --report TOTAL.ghe --update-card MODEL`` does) and reports it as
``federated_evaluation.ood`` (calibration ``"none"`` and the reason when the rows do not
suffice for the rate).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ghofl.errors import ConfigError, ProtocolError
from ghofl.evaluation.federated import DEFAULT_BINS, EvaluationSums, local_evaluation
from ghofl.evaluation.split import split_rows
from ghofl.heads.ood import HIST_BINS
from ghofl.integrations.flower._eval_keys import (  # re-exported: light, for the ClientApp
    EVAL_INFO,
    EVAL_KEY,
    EVAL_STATE,
    EVAL_SUMS,
    MAX_MODEL_BYTES,
    MODEL_RECORD,
    eval_fraction,
    is_vector_meta,
)
from ghofl.secure import VectorMeta, VectorPayload
from ghofl.secure.config import SessionParams
from ghofl.server.eval_privacy import (
    NOISY_EVALUATION_VECTORS,
    evaluation_noise_share,
    noisy_evaluation_meta,
)
from ghofl.server.federated_eval import evaluation_meta

__all__ = ["EVAL_INFO", "EVAL_KEY", "EVAL_STATE", "EVAL_SUMS", "MAX_MODEL_BYTES", "MODEL_RECORD",
           "eval_fraction", "evaluation_payload", "held_out_rows", "is_vector_meta",
           "layout_of", "model_files", "score_model"]

def held_out_rows(x: NDArray[Any], y: NDArray[Any], fraction: float, seed: int
                  ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(training rows, held-out rows) of a node's rows ``x`` (n, d) labelled ``y`` (n,), sorted.

    Each row is held out by :func:`~ghofl.evaluation.split.held_out_mask` under ``seed`` (the
    plan's), independently of the node's other rows and of n.
    """
    return split_rows(x, y, fraction, seed)


def model_files(model_dir: Path) -> dict[str, bytes]:
    """Every file of a model directory by its relative name (the model message's content).

    Raises
    ------
    ConfigError
        The files exceed :data:`MAX_MODEL_BYTES`.
    """
    files = {p.relative_to(model_dir).as_posix(): p.read_bytes()
             for p in sorted(Path(model_dir).rglob("*")) if p.is_file()}
    size = sum(len(b) for b in files.values())
    if size > MAX_MODEL_BYTES:
        raise ConfigError(f"the model directory holds {size} bytes, more than the "
                          f"{MAX_MODEL_BYTES} one Flower message carries; fit fewer or smaller "
                          f"heads, or leave out the run config key {EVAL_KEY!r}")
    return files


def layout_of(classes: tuple[str, ...], heads: tuple[str, ...],
              bins: int = DEFAULT_BINS, ood: bool = False) -> EvaluationSums:
    """Zero sums of these classes, heads and bins (the layout both sides agree on).

    With ``ood`` (the model holds an OOD score) the sums carry the OOD score histogram
    (:data:`~ghofl.heads.ood.HIST_BINS` more int entries), as the nodes' sums then do.
    """
    c, h = len(classes), len(heads)
    hist = HIST_BINS if ood else 0
    return EvaluationSums.from_vectors(classes, heads, bins,
                                       np.zeros(h * (c * c + 2 * bins) + hist + 1,
                                                dtype=np.int64),
                                       np.zeros(h * (bins + 3), dtype=np.float64))


def score_model(files: Mapping[str, bytes], x: NDArray[Any], y: NDArray[np.int64]
                ) -> EvaluationSums | None:
    """A node's sums of the model in ``files`` on its held-out raw embeddings (None: no row).

    ``x`` (n, d) and ``y`` (n,). With the model's OOD score (``ood.npz`` among the files,
    :func:`~ghofl.model.directory.load_ood`) the sums carry its score histogram.

    Raises
    ------
    ProtocolError
        A file name that leaves the model directory.
    InputError
        The model, its OOD score or the rows are refused (``load_model``, ``load_ood`` of
        :mod:`ghofl.model.directory`).
    """
    from ghofl.model.directory import load_model, load_ood

    if y.size == 0:
        return None
    with tempfile.TemporaryDirectory(prefix="ghofl-eval-") as tmp:
        root = Path(tmp)
        for name, data in files.items():
            path = (root / name).resolve()
            if root.resolve() not in path.parents:
                raise ProtocolError(f"the model message names a file {name!r} outside the "
                                    "model directory; the server is not ghofl's")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        model = load_model(root)
        ood = load_ood(root, model.manifest)
        return local_evaluation(model, x, y, what="held-out", ood=ood)


def evaluation_payload(sums: EvaluationSums, meta_text: str, params: SessionParams,
                       max_samples: int, noise_multiplier: float | None) -> VectorPayload:
    """What a node masks in the evaluation round it was advertised.

    The exact vectors of its ``sums``, or (distributed DP, the round's description is the
    noised one) its sums plus a noise share for the round's threshold, from OS entropy.

    Raises
    ------
    ProtocolError
        The advertised description is not the one these sums, M and the node's plan give.
    """
    ints, floats = sums.to_vectors()  # no description longer than the node's own is expanded
    entries = ints.size + floats.size
    meta = VectorMeta.from_dict(json.loads(meta_text), (entries, entries))
    if meta.name == NOISY_EVALUATION_VECTORS:
        if noise_multiplier is None:
            raise ProtocolError("the server advertised noised evaluation vectors but this "
                                "node's plan has no distributed DP")
        mine = noisy_evaluation_meta(sums, max_samples, noise_multiplier, params.threshold)
        if mine.differences(meta):
            raise ProtocolError("the advertised noised evaluation vectors differ from this "
                                f"node's ({'; '.join(mine.differences(meta))})")
        return evaluation_noise_share(sums, mine, noise_multiplier, params.threshold,
                                      np.random.default_rng())
    mine = evaluation_meta(sums, max_samples)
    if mine.differences(meta) or noise_multiplier is not None:
        raise ProtocolError("the advertised evaluation vectors differ from this node's ("
                            f"{'; '.join(mine.differences(meta)) or 'no noise share'})")
    return VectorPayload(mine, ints, floats)
