"""Server side of the Flower evaluation stage (:mod:`ghofl.integrations.flower.evaluation`).

:func:`run_evaluation` sends the fitted model to the nodes, gathers their evaluation sums with
the statistics round's protocol (plain: each node's sums; secure: one vector round with the
same identities and roster, every roster client invited), releases the total under the run's
DP and returns its report. A node tells the server only whether it holds held-out rows; the
report's row count is read from the released total (noised under DP), never from the nodes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.errors import AggregationAbortedError, InputError
from ghofl.evaluation.federated import EvaluationSums, report
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

__all__ = ["run_evaluation"]


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
            answered[client] = None if arrays is None else EvaluationSums.from_vectors(
                layout.classes, tuple(layout.heads), layout.bins,
                arrays["ints"].numpy().astype(np.int64), arrays["floats"].numpy())
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
    release under DP, else None) and ``total`` (the :class:`EvaluationSums` itself, for the
    model card; not JSON).

    Raises
    ------
    AggregationAbortedError
        No node holds a held-out row, or the secure round aborted (a total inconsistent
        within the bounds included: a client sent inconsistent sums).
    """
    from ghofl.model.directory import load_model

    t0 = time.perf_counter()
    model = load_model(model_dir)
    layout = layout_of(tuple(plan.client.classes), tuple(model.heads))
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
            else release.noise, "total": total}, privacy


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
