"""Server side of the Flower evaluation stage (:mod:`ghofl.integrations.flower.evaluation`).

:func:`run_evaluation` sends the fitted model to the nodes, gathers their evaluation sums with
the statistics round's protocol (plain: each node's sums; secure: one vector round with the
same identities and roster, every roster client invited), releases the total under the run's
DP and returns its report. A node tells the server only whether it holds held-out rows; the
report's row count is read from the released total (noised under DP), never from the nodes.
When the model holds an OOD score, the nodes' sums carry its score histogram and the
threshold calibrated from the released total's is recorded in the model directory
(:func:`record_ood_threshold`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.errors import AggregationAbortedError, InputError
from ghofl.evaluation.federated import EvaluationSums, federated_ood_report, report
from ghofl.heads.ood import DEFAULT_FPR, MahalanobisOOD
from ghofl.integrations.flower import MESSAGE_TYPE
from ghofl.integrations.flower.evaluation import (
    EVAL_INFO,
    EVAL_SUMS,
    MODEL_RECORD,
    layout_of,
    model_files,
)
from ghofl.integrations.flower.transport import CLIENT_INFO, FlowerTransport, send_and_receive
from ghofl.secure import Roster
from ghofl.server.eval_privacy import (
    EvaluationRelease,
    charge_evaluation,
    release_evaluation,
)
from ghofl.server.federated_eval import (
    aggregate_evaluation,
    secure_evaluation_round,
)
from ghofl.server.plan import FederationPlan

__all__ = ["record_ood_threshold", "run_evaluation"]


def _model_messages(model_dir: Path, ids: Mapping[str, int]) -> list[Any]:
    """One message per node carrying every file of the model directory."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

    files = model_files(model_dir)
    messages = []
    for node in ids.values():
        rd = RecordDict()
        rd[MODEL_RECORD] = ArrayRecord({f"f{i}": Array(np.frombuffer(b, dtype=np.uint8).copy())
                                        for i, b in enumerate(files.values())})
        rd[EVAL_INFO] = ConfigRecord({"files": list(files)})
        messages.append(Message(content=rd, dst_node_id=node, message_type=MESSAGE_TYPE))
    return messages


def _scored(grid: Any, model_dir: Path, ids: Mapping[str, int], timeout: float,
            layout: EvaluationSums, problems: dict[str, str]
            ) -> tuple[dict[str, EvaluationSums | None], bool]:
    """Send the model; per answering node its sums (plain) or None; whether any holds rows."""
    client_of = {n: c for c, n in ids.items()}
    answered: dict[str, EvaluationSums | None] = {}
    held = False
    want = layout.to_vectors()[0].shape
    for reply in send_and_receive(grid, _model_messages(model_dir, ids), timeout):
        client = client_of.get(int(reply.metadata.src_node_id))
        if client is None or client in answered:
            continue
        if reply.has_error():
            problems[client] = f"model: Flower error {reply.error.code}: {reply.error.reason}"
            continue
        info = reply.content.get(CLIENT_INFO)
        refused = None if info is None else info.get("refused")
        if isinstance(refused, str) and refused:
            problems[client] = f"model: refused: {refused}"
            continue
        has_rows = (reply.content.get(EVAL_INFO) or {}).get("held", False)
        arrays = reply.content.get(EVAL_SUMS)
        try:
            ints = None if arrays is None else arrays["ints"].numpy().astype(np.int64)
            if ints is not None and ints.shape != want:
                raise ValueError(f"{ints.size} int entries, not the {want[0]} of this model's "
                                 "layout (its OOD score histogram included when it has one)")
            answered[client] = None if ints is None else EvaluationSums.from_vectors(
                layout.classes, tuple(layout.heads), layout.bins, ints,
                arrays["floats"].numpy())
        except (InputError, KeyError, TypeError, ValueError) as exc:
            problems[client] = f"model: sent sums no evaluation can produce ({exc})"
            continue
        held = held or has_rows is True
    for client in ids:
        if client not in answered:
            problems.setdefault(client, "model: no answer")
    return answered, held


def run_evaluation(grid: Any, plan: FederationPlan, model_dir: Path, ids: Mapping[str, int],
                   roster: Roster | None, timeout: float, fraction: float,
                   privacy: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The evaluation stage; returns its report and the run's privacy report charged with it.

    The report: ``eval_fraction``, ``clients`` (nodes with held-out rows in the total), ``n``
    (held-out rows in the released total: noised under DP), ``protocol`` (the round's
    report), ``problems`` (nodes that did not score the model), ``heads``
    (:func:`~ghofl.evaluation.federated.report`), ``sums`` (the released total's
    :meth:`EvaluationSums.to_vectors` as lists), ``seconds``, ``noise`` (who noised the
    release under DP, else None), ``ood`` (:func:`record_ood_threshold`: the OOD threshold
    calibrated from the total's histogram and recorded in ``model_dir``; None without an OOD
    score) and ``total`` (the :class:`EvaluationSums` itself, for the model card; not JSON).

    Raises
    ------
    AggregationAbortedError
        No node holds a held-out row, or the secure round aborted (a total inconsistent
        within the bounds included: a client sent inconsistent sums).
    InputError
        The model directory or its OOD score is refused (``load_model``, ``load_ood``).
    """
    from ghofl.model.directory import load_model, load_ood

    t0 = time.perf_counter()
    model = load_model(model_dir)
    ood = load_ood(model_dir, model.manifest)
    layout = layout_of(tuple(plan.client.classes), tuple(model.heads), ood=ood is not None)
    problems: dict[str, str] = {}
    sums, held = _scored(grid, model_dir, ids, timeout, layout, problems)
    if not sums or not held:
        raise AggregationAbortedError("the evaluation stage aborted: no node scored the model "
                                      f"on held-out rows ({problems or 'no node answered'})")
    noise = plan.noise_plan() if privacy is not None else None
    release: EvaluationRelease | None = None
    if not plan.secure:
        rnd = aggregate_evaluation(sums)
        total, agg = rnd.total, rnd.aggregation
    else:
        total, agg, release = _secure_round(grid, plan, layout, ids, list(sums), roster,
                                            timeout)
    if release is None and noise is not None:
        release = release_evaluation(total, noise.noise_multiplier, np.random.default_rng())
    if release is not None and privacy is not None:
        total, privacy = release.sums, charge_evaluation(privacy, release)
    ints, floats = total.to_vectors()
    n = next(iter(total.heads.values())).n
    return {"eval_fraction": fraction, "clients": total.clients, "n": n,
            "protocol": agg, "problems": problems, "heads": report(total),
            "sums": {"ints": ints.tolist(), "floats": floats.tolist()},
            "seconds": time.perf_counter() - t0, "noise": None if release is None
            else release.noise, "ood": record_ood_threshold(model_dir, total, ood),
            "total": total}, privacy


def record_ood_threshold(model_dir: Path, total: EvaluationSums, ood: MahalanobisOOD | None,
                         fpr: float = DEFAULT_FPR) -> dict[str, Any] | None:
    """Calibrate ``ood`` from ``total``'s score histogram; record a threshold in ``model_dir``.

    :func:`~ghofl.evaluation.federated.federated_ood_report` (as ``ghofl simulate
    --federated-eval`` reports it), and, when the rows suffice for ``fpr``, the threshold
    written with :func:`~ghofl.model.directory.update_ood` (manifest ``ood`` entry, calibration
    ``"federated"``, and the card), as ``ghofl evaluate --report TOTAL.ghe --update-card``
    records it. ``ood`` must be the score :func:`~ghofl.model.directory.load_ood` read from
    ``model_dir``; None: nothing to calibrate (returns None).

    Returns
    -------
    dict or None
        The report: ``calibration`` (``"federated"``), ``threshold``, ``fpr``, ``n`` and
        ``held_out_flagged``, or ``calibration`` ``"none"``, ``fpr`` and ``reason`` (nothing
        written).
    """
    from ghofl.model.directory import update_ood

    out = federated_ood_report(total, ood, fpr)
    if ood is not None and out is not None and out["calibration"] == "federated":
        update_ood(model_dir, ood)
    return out


def _secure_round(grid: Any, plan: FederationPlan, layout: EvaluationSums,
                  ids: Mapping[str, int], scored: list[str], roster: Roster | None,
                  timeout: float
                  ) -> tuple[EvaluationSums, dict[str, Any], EvaluationRelease | None]:
    """One vector round over the nodes that scored the model (noised in shares under DP).

    With a roster every roster client is invited (clients check the round's size against
    it); only the nodes in ``scored`` are sent its requests, the others are its dropouts.
    """
    noise = plan.noise_plan() if plan.distributed_dp else None
    clients = list(roster.clients) if roster is not None else list(scored)
    transport = FlowerTransport(grid, {c: ids[c] for c in scored}, timeout)
    total, summary, release = secure_evaluation_round(
        plan.secagg_config(), layout, clients, roster, transport,
        None if noise is None else noise.noise_multiplier)
    return total, {**summary, "problems": dict(transport.problems)}, release
