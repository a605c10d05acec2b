"""Node side of the Flower evaluation stage (:mod:`ghofl.integrations.flower.evaluation`).

The node scores the model the server sent on its held-out rows, keeps the sums in
``context.state`` and (plain protocol) returns them; in the secure vector round that follows,
it masks those kept sums (:func:`round_payload`), naming the digest of its held-out rows as
the payload's source (what its round ledger records: one evaluation round per held-out set).
It tells the server only whether it holds held-out rows, never how many. Its statistics come
from the rest of its rows (:func:`node_statistics`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ghofl.data.embeddings import Embeddings, align_labels, load_embeddings
from ghofl.errors import InputError, ProtocolError
from ghofl.evaluation.federated import EvaluationSums
from ghofl.evaluation.split import rows_digest
from ghofl.integrations.flower.evaluation import (
    EVAL_INFO,
    EVAL_STATE,
    EVAL_SUMS,
    MODEL_RECORD,
    eval_fraction,
    evaluation_payload,
    held_out_rows,
    score_model,
)
from ghofl.secure import VectorMeta, VectorPayload
from ghofl.secure.config import SessionParams
from ghofl.stats.client_stats import ClientStats

if TYPE_CHECKING:
    from flwr.app import Context, RecordDict

#: The run's :class:`~ghofl.integrations.flower.client_app.RunSetup` (``plan``, ``job``,
#: ``secagg``, ``noise``); typed loosely, the client app imports this module.
RunSetup = Any

__all__ = ["answer_model", "node_rows", "node_statistics", "round_payload", "saved_payload"]


def node_rows(source: Path, setup: RunSetup, fraction: float
              ) -> tuple[Embeddings, Embeddings]:
    """The node's embeddings split into (training part, held-out part).

    Raises
    ------
    InputError
        The node's data is not an embeddings archive (the evaluation needs labelled rows).
    """
    if source.suffix.lower() != ".npz":
        raise InputError(f"the evaluation stage scores embeddings archives (.npz); this "
                         f"node's data is '{source}': embed it first (ghofl embed)")
    emb = load_embeddings(source, "data-path")
    train, held = held_out_rows(emb.x, emb.y, fraction, setup.plan.server.seed)
    return (Embeddings(emb.path, emb.x[train], emb.y[train], emb.classes),
            Embeddings(emb.path, emb.x[held], emb.y[held], emb.classes))


def node_statistics(source: Path, setup: RunSetup, run_cfg: dict[str, Any]
                    ) -> ClientStats | None:
    """The node's statistics of its training part when the run evaluates (else None)."""
    from ghofl.client.job import client_statistics

    fraction = eval_fraction(run_cfg)
    if fraction <= 0.0:
        return None
    train, _ = node_rows(source, setup, fraction)
    return client_statistics(train, setup.job)


def answer_model(content: Any, context: Context, setup: RunSetup, source: Path) -> RecordDict:
    """Score the model in the message on the node's held-out rows; keep (and return) the sums.

    The reply's :data:`EVAL_INFO` says only whether the node holds held-out rows (``held``,
    a bool): their number would tell the server the node's size.

    Raises
    ------
    ProtocolError
        The model message is malformed, or the run asks for no evaluation.
    """
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    info, arrays = content.get(EVAL_INFO), content.get(MODEL_RECORD)
    run_cfg = dict(context.run_config)
    fraction = eval_fraction(run_cfg)
    if fraction <= 0.0:
        raise ProtocolError("the server sent a model to evaluate, but the run config asks for "
                            "no evaluation stage")
    try:
        names = [str(n) for n in info["files"]]
        files = {n: arrays[f"f{i}"].numpy().astype(np.uint8).tobytes()
                 for i, n in enumerate(names)}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"the model message is malformed ({exc!r})") from exc
    _, held = node_rows(source, setup, fraction)
    y = align_labels(held.y, held.classes, setup.job.classes, f"'{source}'")
    sums = score_model(files, held.x, y)
    reply = RecordDict()
    reply[EVAL_INFO] = ConfigRecord({"held": bool(y.size)})
    if sums is not None:
        ints, floats = sums.to_vectors()
        context.state[EVAL_STATE] = ConfigRecord({
            "classes": json.dumps(list(sums.classes)), "heads": json.dumps(list(sums.heads)),
            "bins": int(sums.bins), "ints": ints.tobytes(), "floats": floats.tobytes(),
            "rows": rows_digest(held.x, y)})
        if setup.secagg is None:
            from flwr.app import Array

            reply[EVAL_SUMS] = ArrayRecord({"ints": Array(ints), "floats": Array(floats)})
    elif EVAL_STATE in context.state:
        del context.state[EVAL_STATE]
    return reply


def _kept(context: Context) -> dict[str, Any]:
    saved = context.state.get(EVAL_STATE)
    if saved is None:
        raise ProtocolError("the server started an evaluation round, but this node scored no "
                            "model (it holds no held-out row or missed the model message)")
    return dict(saved)


def round_payload(context: Context, setup: RunSetup, meta_text: str,
                  params: tuple[tuple[str, str], ...]) -> VectorPayload:
    """At the advertise stage: the payload the node masks (saved for the later stages).

    Its source is the digest of the held-out rows the sums were computed from (the key of
    the node's round ledger, whatever the model or the noise share).
    """
    kept = _kept(context)
    sums = EvaluationSums.from_vectors(
        tuple(json.loads(kept["classes"])), tuple(json.loads(kept["heads"])), int(kept["bins"]),
        np.frombuffer(bytes(kept["ints"]), dtype=np.int64).copy(),
        np.frombuffer(bytes(kept["floats"]), dtype=np.float64).copy())
    assert setup.secagg is not None
    payload = evaluation_payload(sums, meta_text, SessionParams.from_items(params),
                                 setup.secagg.max_samples,
                                 None if setup.noise is None else setup.noise.noise_multiplier)
    payload = dataclasses.replace(payload, source=str(kept["rows"]))
    from flwr.app import ConfigRecord

    context.state[EVAL_STATE] = ConfigRecord({
        **kept, "payload-meta": json.dumps(payload.meta.to_dict(), sort_keys=True),
        "payload-ints": payload.ints.tobytes(), "payload-floats": payload.floats.tobytes()})
    return payload


def saved_payload(context: Context) -> VectorPayload:
    """At the later stages: the payload saved at the advertise stage."""
    kept = _kept(context)
    if "payload-meta" not in kept:
        raise ProtocolError("this node holds no evaluation payload of this round (it missed "
                            "the advertise stage)")
    return VectorPayload(VectorMeta.from_dict(json.loads(kept["payload-meta"])),
                         np.frombuffer(bytes(kept["payload-ints"]), dtype=np.int64).copy(),
                         np.frombuffer(bytes(kept["payload-floats"]), dtype=np.float64).copy(),
                         source=str(kept["rows"]))
