"""Recording an evaluation in a model directory: the manifest's ``evaluations`` and the card.

``ghofl evaluate --update-card`` scores the heads on labelled test data (or reads the
server's total of federated evaluation sums) and calls :func:`record_evaluation`. The metrics
are those of :func:`ghofl.evaluation.federated.report` (accuracy, balanced accuracy, macro-F1,
log-loss, ECE), computed from :func:`~ghofl.evaluation.federated.local_evaluation` sums for
test data, so that both kinds of evaluation share one definition.

The manifest keeps one entry per data set and kind (evaluating the same data again replaces
its entry) in ``evaluations``: ``{"data", "kind": "test" | "federated", "n", "clients",
"heads": {NAME: {"accuracy", "balanced_accuracy", "macro_f1", "log_loss", "ece", "n"}}}``.
The manifest and the card are replaced together, atomically, and a signed manifest is
re-signed (:func:`~ghofl.model.directory.rewrite_manifest`).

A federated total also carries the histogram of the clients' OOD scores (when the model holds
an OOD score): :func:`federated_ood_threshold` turns it into the model's calibrated threshold
(calibration ``"federated"``), which :func:`~ghofl.model.directory.update_ood` records with the
card that states it, as ``ghofl evaluate --calibrate-ood`` records a conformal one.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ghofl.errors import InputError
from ghofl.evaluation.federated import EvaluationSums, calibrate_ood, report
from ghofl.heads.ood import DEFAULT_FPR, MahalanobisOOD
from ghofl.model.card import CARD_FILE, EVAL_METRICS, model_card
from ghofl.model.directory import UnsignedModelWarning, load_model, load_ood, rewrite_manifest

__all__ = ["evaluation_entry", "federated_ood_threshold", "record_evaluation"]

_KINDS = ("test", "federated")


def evaluation_entry(data: str, kind: str, sums: EvaluationSums) -> dict[str, Any]:
    """The manifest's record of one evaluation (see the module docstring).

    Parameters
    ----------
    data : str
        The data set: its path or name.
    kind : {"test", "federated"}
        Test data scored here, or the total of the clients' federated evaluation sums.
    sums : EvaluationSums
        The sums (one client's for test data), metrics by :func:`report`.
    """
    if kind not in _KINDS:
        raise InputError(f"evaluation kind must be one of {', '.join(_KINDS)}; got {kind!r}")
    metrics = report(sums)
    heads = {name: {**{k: m[k] for k, _, _ in EVAL_METRICS}, "n": m["n"]}
             for name, m in metrics.items()}
    n = max((int(m["n"]) for m in metrics.values()), default=0)
    return {"data": data, "kind": kind, "n": n,
            "clients": sums.clients if kind == "federated" else None, "heads": heads}


def record_evaluation(model_dir: Path, entry: Mapping[str, Any], *,
                      allow_unsigned: bool = False) -> Path:
    """Add ``entry`` to the model's ``evaluations`` and rewrite manifest and card atomically.

    Parameters
    ----------
    model_dir : Path
        A model directory (read with :func:`load_model`, its checks included; heads whose
        file is absent are allowed, the card lists what the manifest lists).
    entry : mapping
        From :func:`evaluation_entry`; an earlier entry of the same data and kind is replaced.
    allow_unsigned : bool, default False
        As for :func:`load_model`; an unsigned model stays unsigned.

    Returns
    -------
    Path
        The card file written.

    Raises
    ------
    InputError
        The model directory is refused by :func:`load_model`, or ``entry`` names a head the
        model does not list.
    """
    model_dir = Path(model_dir)
    with warnings.catch_warnings():  # the caller loaded the model already and was warned
        warnings.simplefilter("ignore", UnsignedModelWarning)
        model = load_model(model_dir, allow_unsigned=allow_unsigned, missing_ok=True)
    manifest = dict(model.manifest)
    unknown = [h for h in entry["heads"] if h not in manifest["heads"]]
    if unknown:
        raise InputError(f"the evaluation scores head(s) {', '.join(unknown)}, which the model "
                         f"in '{model_dir}' does not hold ({', '.join(manifest['heads'])}); "
                         "record an evaluation of this model")
    kept = [e for e in manifest.get("evaluations") or []
            if not (isinstance(e, Mapping) and e.get("data") == entry["data"]
                    and e.get("kind") == entry["kind"])]
    manifest["evaluations"] = [*kept, dict(entry)]
    chosen = {name: head.get_state()[1] for name, head in model.heads.items()}
    card = model_card(manifest, chosen=chosen)
    rewrite_manifest(model_dir, manifest, card)
    return model_dir / CARD_FILE


def federated_ood_threshold(model_dir: Path, manifest: Mapping[str, Any], total: EvaluationSums,
                            fpr: float | None = None, *, allow_unsigned: bool = False
                            ) -> MahalanobisOOD | None:
    """The model's OOD score with its threshold calibrated from ``total``'s histogram.

    Nothing is written (:func:`~ghofl.model.directory.update_ood` records the result).

    Parameters
    ----------
    model_dir : Path
    manifest : mapping
        The model's manifest, as :func:`load_model` read it.
    total : EvaluationSums
        The clients' total (``ghofl aggregate-eval``), of this model.
    fpr : float, optional
        The false-positive rate; given, the calibration is required.

    Returns
    -------
    MahalanobisOOD or None
        ``None`` when ``fpr`` is not given and the model holds no OOD score or ``total`` no
        histogram (nothing to calibrate).

    Raises
    ------
    InputError
        ``fpr`` given and nothing to calibrate; too few rows for the rate
        (:meth:`~ghofl.heads.ood.MahalanobisOOD.calibrate_from_histogram`).
    ConfigError
        ``fpr`` outside (0, 1).
    """
    ood = load_ood(Path(model_dir), manifest, allow_unsigned=allow_unsigned)
    if ood is None and fpr is not None:
        raise InputError(f"the model in '{model_dir}' has no OOD score to calibrate; drop "
                         "--ood-fpr, or fit the model again with `ghofl fit`")
    if ood is None or (total.ood_counts is None and fpr is None):
        return None
    return calibrate_ood(total, ood, DEFAULT_FPR if fpr is None else fpr)
