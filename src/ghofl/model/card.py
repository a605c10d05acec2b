"""``MODEL_CARD.md``: what a model directory holds, how it was made and how good it is.

:func:`model_card` is a pure function of the manifest (:mod:`ghofl.model.directory`) and of
what the writer knows besides it (the values each head chose, test scores, the command); it
reads nothing and writes nothing. :func:`~ghofl.model.directory.save_model` writes its result
beside the manifest. The card is documentation only: it is not part of the manifest or its
digest, and loading a model never reads it.

Manifest keys read (each optional; what is absent is said to be unrecorded): ``ghofl_version``;
``stats`` (the statistics metadata: ``encoder``, ``projection``, ``classes``, ``mode``,
``clip_norm``, ``holdout_fraction``, and the writer's ``n_samples``, ``counts``, ``n_clipped``,
``source``, and for a total read from an aggregation store ``contributions`` and
``store_head``, the store's head digest, evidence of which copy of the store it was);
``heads`` (``head``, ``params``, ``fit_seconds``); ``aggregation`` (``protocol``,
``clients``, ``threshold``); ``source`` (when ``stats`` has none); ``privacy`` (a DP
release: ``epsilon``/``epsilon_spent``, ``delta``/``delta_spent``, ``dp_mode``,
``min_class_count``, ``min_class_count_rule``; without ε and δ, a noised release whose budget
is not recorded, with its noise ``sigma`` per block); ``default_head`` and ``default_head_rule``
(the head ``predict`` and ``export`` use without ``--head``, and why); ``license`` (an SPDX
identifier, ``ghofl fit --license``); ``command`` (the fit command); ``ood`` (``threshold``,
``calibration``: ``"none"``, ``"conformal"`` or ``"federated"``, ``fpr``,
``n_calibration``); ``evaluations`` (``ghofl evaluate --update-card``: per data set
``data``, ``kind`` (``"test"`` or ``"federated"``), ``n``, ``clients`` and per head
``accuracy``, ``balanced_accuracy``, ``macro_f1``, ``log_loss``, ``ece``, as
:func:`ghofl.evaluation.federated.report` defines them).

The card starts with YAML front matter in the Hugging Face model card format
(``library_name``, ``license``, ``tags`` and a ``model-index`` holding the evaluation table),
which ``huggingface_hub.ModelCard`` parses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ghofl.evaluation.federated import DEFAULT_BINS
from ghofl.heads.ood import CALIBRATE_HINT

__all__ = ["CARD_FILE", "EVAL_METRICS", "model_card"]

CARD_FILE = "MODEL_CARD.md"
#: The evaluation table's metrics: manifest key, column title, Hugging Face metric type.
EVAL_METRICS = (("accuracy", "accuracy", "accuracy"),
                ("balanced_accuracy", "balanced accuracy", "balanced_accuracy"),
                ("macro_f1", "macro-F1", "f1"), ("log_loss", "log-loss", "log_loss"),
                ("ece", "ECE", "ece"))
#: What the training heads' ``val_accuracy_`` measures (FisherMix, Proto-Hyper).
SYNTHETIC_VAL = "validation accuracy on synthetic samples, not on real data"
#: Classes listed one per row at most (a larger model lists the first ones and the count).
MAX_CLASS_ROWS = 50

_LIMITS = (
    "The heads are Gaussian or linear models of the frozen encoder's features: they are only "
    "as good as the encoder is for this data, and they assume test data distributed like the "
    "clients' pooled data (no guarantee under distribution shift or for classes absent from "
    "training).",
    "Inputs must come from the same encoder, preprocessing and feature transform (the "
    "encoder fingerprint above); other embeddings give meaningless scores.",
    "Probabilities of the Gaussian heads can be over-confident; use them for ranking, or "
    "calibrate them on held-out data before thresholding.",
    "Classes with few samples have poorly estimated statistics; their scores are the least "
    "reliable.",
)


def _fmt(value: Any) -> str:
    """A compact rendering of a hyperparameter or fitted value."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        if value and all(v == value[0] for v in value):
            return f"{_fmt(value[0])} (all {len(value)})"
        nums = [v for v in value if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(nums) == len(value) and len(value) > 4:
            return f"{_fmt(float(min(nums)))}..{_fmt(float(max(nums)))} ({len(value)} values)"
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _encoder_lines(stats: Mapping[str, Any]) -> list[str]:
    from ghofl.stats.meta import EncoderInfo

    enc = stats.get("encoder")
    if not isinstance(enc, Mapping):
        return ["- Encoder: none recorded (the statistics were computed from raw features)."]
    try:
        fingerprint = EncoderInfo.from_dict(dict(enc)).fingerprint()
    except Exception:  # a card never fails on what it describes
        fingerprint = "unknown"
    lines = [f"- Encoder: `{enc.get('name')}`, d = {enc.get('dim')}, fingerprint "
             f"`{fingerprint}`"]
    if enc.get("resolution"):
        lines.append(f"- Input resolution: {enc['resolution']} px")
    if enc.get("preprocessing"):
        lines.append(f"- Preprocessing (with any feature transform): {enc['preprocessing']}")
    if enc.get("weights_hash"):
        lines.append(f"- Weights SHA-256: `{enc['weights_hash']}`")
    return lines


def _statistics_lines(stats: Mapping[str, Any]) -> list[str]:
    lines = [f"- Upload mode: `{stats.get('mode', 'unrecorded')}`"]
    proj = stats.get("projection")
    if isinstance(proj, Mapping):
        kind = "principal directions" if proj.get("generator") == "pca-v1" else "random"
        lines.append(f"- Projection: {kind}, {proj.get('input_dim')} -> {proj.get('dim')}")
    else:
        lines.append("- Projection: none")
    clip = stats.get("clip_norm")
    lines.append("- Per-sample clipping: " + ("none" if clip is None else f"L2 norm <= {clip}"
                 + f" ({stats.get('n_clipped', 'unrecorded')} samples clipped)"))
    if stats.get("holdout_fraction"):
        lines.append(f"- Held-out part of the statistics: {stats['holdout_fraction']} of each "
                     "client's samples (used to choose hyperparameters)")
    if stats.get("source"):
        lines.append(f"- Source: {stats['source']}")
    return lines


def _data_lines(stats: Mapping[str, Any], aggregation: Mapping[str, Any],
                privacy: Mapping[str, Any] | None) -> list[str]:
    classes = [str(c) for c in stats.get("classes", [])]
    counts = stats.get("counts")
    clients = aggregation.get("clients")
    stored = stats.get("contributions")
    if clients is None and stored is not None:
        clients = f"{stored} (contributions recorded in the aggregation store)"
    lines = [f"- Clients: {clients}" if clients is not None else
             "- Clients: not recorded (the aggregate statistics hold sums, not client "
             "identities)"]
    if stats.get("store_head"):
        lines.append(f"- Fitted from: {stored if stored is not None else 'unrecorded'} "
                     f"contributions, store head digest {stats['store_head']} (check a "
                     "store against it: `ghofl store verify DB --expect DIGEST`)")
    n = stats.get("n_samples")
    noised = privacy is not None
    note = " (differentially private release: noised and post-processed counts)" if noised \
        else ""
    lines.append(f"- Samples: {n if n is not None else 'not recorded'}{note}")
    lines.append(f"- Classes: {len(classes)}")
    lines += ["", "| class | samples |", "|---|---|"]
    for i, name in enumerate(classes[:MAX_CLASS_ROWS]):
        count = counts[i] if isinstance(counts, Sequence) and i < len(counts) else "unrecorded"
        lines.append(f"| {_cell(name)} | {count} |")
    if len(classes) > MAX_CLASS_ROWS:
        lines.append(f"| ... {len(classes) - MAX_CLASS_ROWS} more | |")
    if noised:
        lines += ["", "Under differential privacy the true per-class counts are withheld; the "
                  "counts above are the noised ones the heads were fitted from."]
    return lines


def _protocol_lines(aggregation: Mapping[str, Any],
                    privacy: Mapping[str, Any] | None) -> list[str]:
    protocol = aggregation.get("protocol")
    if protocol is None:
        lines = ["- Aggregation protocol: not recorded (the model was fitted from a statistics "
                 "file; see its source above)"]
    else:
        lines = [f"- Aggregation protocol: {protocol}"]
        if aggregation.get("threshold") is not None:
            lines.append(f"- Secure-aggregation threshold: {aggregation['threshold']} clients")
    if privacy is None:
        lines.append("- Differential privacy: none recorded")
        return lines
    eps = privacy.get("epsilon_spent", privacy.get("epsilon"))
    delta = privacy.get("delta_spent", privacy.get("delta"))
    if eps is None and delta is None:  # a noised release fitted without its privacy report
        sigma = privacy.get("sigma")
        levels = ", ".join(f"{b}={_fmt(v)}" for b, v in sigma.items()) \
            if isinstance(sigma, Mapping) and sigma else "unrecorded"
        lines.append("- Differential privacy: the statistics are a differentially private "
                     "release whose budget (epsilon, delta) is not recorded (its privacy "
                     f"report was not given); noise sigma per block from their header: {levels}")
        return lines
    lines.append(f"- Differential privacy: (epsilon, delta) = ({_fmt(eps)}, {_fmt(delta)}), "
                 f"{privacy.get('dp_mode', 'unrecorded')} mode, "
                 f"neighbouring: {privacy.get('neighbouring', 'unrecorded')}")
    k = privacy.get("min_class_count")
    if k and privacy.get("min_class_count_rule"):
        lines.append(f"- Classes whose noised total count was below {k} were dropped by the "
                     "server (post-processing of the release)")
    elif k:
        lines.append(f"- Classes with fewer than {k} samples on a client were withheld by "
                     "that client")
    return lines


def _head_lines(heads: Mapping[str, Any], chosen: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = ["| head | type | parameters | chosen from the data | fit seconds |",
             "|---|---|---|---|---|"]
    for name, entry in heads.items():
        entry = entry if isinstance(entry, Mapping) else {}
        params = entry.get("params") or {}
        given = ", ".join(f"{k}={_fmt(v)}" for k, v in params.items()) or "-"
        picked = ", ".join(_chosen(k, v) for k, v in (chosen.get(name) or {}).items()
                           if k != "fit_seconds_") or "-"
        secs = entry.get("fit_seconds")
        lines.append(f"| {_cell(str(name))} | {_cell(str(entry.get('head', name)))} | "
                     f"{_cell(given)} | {_cell(picked)} | "
                     f"{'-' if secs is None else f'{float(secs):.3g}'} |")
    return lines


def _chosen(key: str, value: Any) -> str:
    """One fitted value of a head; the synthetic validation figures say what they measure."""
    name = key.rstrip("_")
    if name in ("val_accuracy", "base_val_accuracy"):
        return f"{name}={_fmt(value)} ({SYNTHETIC_VAL})"
    return f"{name}={_fmt(value)}"


def _score_lines(heads: Mapping[str, Any], scores: Mapping[str, Mapping[str, Any]] | None,
                 evaluated: bool = False) -> list[str]:
    if not scores and evaluated:
        return []
    if not scores:
        return ["No test data was given when the model was fitted, so no accuracy is "
                "recorded; measure it with `ghofl evaluate MODEL_DIR --embeddings TEST.npz "
                "--update-card` on labelled test embeddings from the same encoder."]
    lines = ["| head | test accuracy | test samples |", "|---|---|---|"]
    for name in heads:
        s = scores.get(name)
        if s is not None:
            lines.append(f"| {_cell(str(name))} | {float(s['accuracy']):.4f} | {s.get('n')} |")
    return lines


def _metric(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return f"{float(value):.4f}"
    return "-"


def _evaluation_lines(evaluations: Any) -> list[str]:
    """The evaluation table of ``ghofl evaluate --update-card`` (one block per data set)."""
    if not isinstance(evaluations, list) or not evaluations:
        return []
    lines: list[str] = []
    for ev in evaluations:
        if not isinstance(ev, Mapping):
            continue
        if ev.get("kind") == "federated":
            what = (f"Federated evaluation (sums of {ev.get('clients')} clients' held-out rows, "
                    f"`ghofl evaluate --report`): `{_cell(str(ev.get('data')))}`")
        else:
            what = f"Test data `{_cell(str(ev.get('data')))}` (`ghofl evaluate`)"
        lines += [f"{what}, {ev.get('n')} items:", "",
                  "| head | " + " | ".join(t for _, t, _ in EVAL_METRICS) + " |",
                  "|---|" + "---|" * len(EVAL_METRICS)]
        for head, m in dict(ev.get("heads") or {}).items():
            m = m if isinstance(m, Mapping) else {}
            lines.append(f"| {_cell(str(head))} | "
                         + " | ".join(_metric(m.get(k)) for k, _, _ in EVAL_METRICS) + " |")
        lines.append("")
    if lines:
        lines.append("Balanced accuracy is the mean recall over the classes present, macro-F1 "
                     "the mean F1 over the classes true or predicted, ECE the expected "
                     f"calibration error over {DEFAULT_BINS} equal-width confidence bins.")
    return lines


def _yaml(value: Any) -> str:
    """A YAML scalar: JSON strings and numbers are valid YAML flow scalars."""
    return json.dumps(value)


def _model_index(manifest: Mapping[str, Any], task: str) -> list[str]:
    """``model-index`` lines: one result per evaluation, one metric per head and measure."""
    results: list[str] = []
    for ev in manifest.get("evaluations") or []:
        if not isinstance(ev, Mapping):
            continue
        metrics = []
        for head, m in dict(ev.get("heads") or {}).items():
            for key, title, kind in EVAL_METRICS:
                v = dict(m).get(key) if isinstance(m, Mapping) else None
                if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                    metrics += [f"    - type: {kind}", f"      value: {float(v)!r}",
                                f"      name: {_yaml(f'{title} ({head})')}"]
        if not metrics:
            continue
        data = str(ev.get("data"))
        label = "federated " if ev.get("kind") == "federated" else ""
        results += ["  - task:", f"      type: {task}", "    dataset:",
                    f"      name: {_yaml(label + data)}", f"      type: {_yaml(data)}",
                    "    metrics:", *metrics]
    if not results:
        return []
    return ["model-index:", f"- name: {_yaml(_model_name(manifest))}", "  results:", *results]


def _model_name(manifest: Mapping[str, Any]) -> str:
    enc = dict(manifest.get("stats") or {}).get("encoder")
    name = enc.get("name") if isinstance(enc, Mapping) else None
    return f"ghofl-{name}" if name else "ghofl-model"


def _task(manifest: Mapping[str, Any]) -> str:
    enc = dict(manifest.get("stats") or {}).get("encoder")
    if not isinstance(enc, Mapping):
        return "tabular-classification"
    return "image-classification" if enc.get("resolution") else "text-classification"


def front_matter(manifest: Mapping[str, Any]) -> list[str]:
    """The card's YAML front matter (Hugging Face model card metadata), with its fences.

    ``license`` is the manifest's (``ghofl fit --license``), ``other`` when unset; ``tags``
    name the library, the method and the task; ``model-index`` holds the evaluations.
    """
    task = _task(manifest)
    lic = manifest.get("license")
    tags = ["ghofl", "federated-learning", "one-shot-federated-learning", task]
    return ["---", "library_name: ghofl", f"license: {_yaml(lic if lic else 'other')}",
            "tags:", *(f"- {t}" for t in tags), f"pipeline_tag: {task}",
            *_model_index(manifest, task), "---"]


def _usage_lines(manifest: Mapping[str, Any], heads: Mapping[str, Any]) -> list[str]:
    default = manifest.get("default_head")
    default = default if isinstance(default, str) and default in heads else next(iter(heads),
                                                                                  "lda")
    rule = manifest.get("default_head_rule") or ("not recorded (a model written before the "
                                                 "rule existed: the first head of the manifest)")
    lic = manifest.get("license")
    return [f"- Default head: `{default}` (used by `ghofl predict` and `ghofl export` without "
            f"`--head`), chosen by: {rule}",
            "- License: " + (f"`{lic}`" if lic else "not set (`other`); set it with "
                             "`ghofl fit --license SPDX-ID`"), "",
            "```bash",
            "# one row per item: label, p_<class> per class, ood_score (and ood once the OOD "
            "threshold is calibrated)",
            "ghofl predict MODEL_DIR --data images/ --out predictions.csv",
            "# the default head as one ONNX graph (encoder + feature transform + head)",
            "ghofl export MODEL_DIR --out model.onnx",
            "```", "",
            "```python",
            "import onnxruntime as ort",
            "session = ort.InferenceSession(\"model.onnx\")",
            "outputs = session.run(None, {session.get_inputs()[0].name: batch})  # uint8 images",
            "```", "",
            "In Python, `ghofl.model.directory.load_model(MODEL_DIR)` returns the heads; their "
            "`predict_proba` takes raw embeddings of the encoder above."]


def _ood_lines(ood: Any) -> list[str]:
    if not isinstance(ood, Mapping):
        return ["This model holds no out-of-distribution score (fitted before ghofl wrote one, "
                "or from too few samples)."]
    kind = ood.get("calibration")
    where = {"conformal": "held-out in-distribution items",
             "federated": "held-out in-distribution items of the clients (federated "
                          "evaluation: histogram counts of their scores, no item left its "
                          "client)"}
    score = f"`predict` writes `ood_score`, the {ood.get('score', 'out-of-distribution score')}"
    if kind in where and ood.get("threshold") is not None:
        first = (f"{score}, and flags `ood` above the threshold {_fmt(ood.get('threshold'))}, "
                 f"calibrated on {ood.get('n_calibration')} {where[kind]} at a false-positive "
                 f"rate of {_fmt(ood.get('fpr'))}.")
    else:
        first = (f"{score}, but no `ood` flag: this model has no OOD threshold (calibration "
                 "`none`), since a threshold from an assumption on the features (Gaussian) "
                 f"would not mean what it says. To set one, {CALIBRATE_HINT}.")
    return [first, "",
            "Limits: the score measures distance in the encoder's feature space only. It "
            "separates inputs far from every class (far-OOD) better than near-OOD inputs that "
            "the encoder maps close to a class; differences of resolution or preprocessing "
            "move the score as much as content does. A calibrated threshold keeps its "
            "false-positive rate on data distributed like the calibration items only."]


def _personalised_lines(record: Any) -> list[str]:
    """The card's section on a client's personalisation (``ghofl personalize``), if any."""
    if not isinstance(record, Mapping):
        return []
    heads = record.get("heads") or {}
    done = [f"`{h}` ({', '.join(parts)})" for h, parts in heads.items() if parts]
    lines = ["## Personalisation", "",
             "This model is a client's own version of a global model, made on the client from "
             "its own statistics; nothing of it left the client.", "",
             f"- From model: {_fmt(record.get('from_model'))}",
             f"- From statistics: {_fmt(record.get('from_stats'))} "
             f"({_fmt(record.get('local_samples'))} local samples)",
             f"- Priors: {_fmt(record.get('priors'))} (pseudocount "
             f"{_fmt(record.get('prior_pseudocount'))})",
             "- Class Gaussians: " + (
                 f"local, shrunk to the global ({_fmt(record.get('kappa_rule'))}, kappa = "
                 f"{_fmt(record.get('kappa'))})" if record.get("moments") else "global"),
             f"- Heads personalised: {', '.join(done) if done else 'none'}"]
    tuned = record.get("fine_tune")
    if isinstance(tuned, Mapping):
        lines.append(f"- Fine-tuned on the client's own embeddings: "
                     f"{_fmt(tuned.get('from_embeddings'))} ({_fmt(tuned.get('rows'))} rows, "
                     f"{_fmt(tuned.get('classes_held'))} classes held; only these are "
                     f"predicted), pulled towards the global head with tau = "
                     f"{_fmt(tuned.get('tau'))}")
    for head, why in (record.get("skipped") or {}).items():
        lines.append(f"- Not personalised, {head}: {_fmt(why)}")
    return [*lines, ""]


def model_card(
    manifest: Mapping[str, Any],
    *,
    chosen: Mapping[str, Mapping[str, Any]] | None = None,
    scores: Mapping[str, Mapping[str, Any]] | None = None,
    command: str | None = None,
) -> str:
    """The Markdown model card of a model directory.

    Parameters
    ----------
    manifest : mapping
        The model's manifest (module docstring lists the keys read).
    chosen : mapping of head name to mapping, optional
        The values each head chose from the data (its fitted scalars, e.g. the shrinkage an
        ``"auto"`` rule picked).
    scores : mapping of head name to mapping, optional
        Test scores per head: ``{"accuracy": float, "n": int}``.
    command : str, optional
        The command line that reproduces the model.

    Returns
    -------
    str
        The card, ending with a newline.
    """
    stats = dict(manifest.get("stats") or {})
    if not stats.get("source") and manifest.get("source"):  # the Flower ServerApp's entry
        stats["source"] = manifest["source"]
    heads = manifest.get("heads") or {}
    aggregation = manifest.get("aggregation") or {}
    privacy = manifest.get("privacy") if isinstance(manifest.get("privacy"), Mapping) else None
    out = [*front_matter(manifest), "", "# Model card", "",
           f"A ghofl model directory: {len(heads)} classification head(s) ("
           f"{', '.join(f'`{h}`' for h in heads)}) fitted in one shot from aggregated client "
           "statistics (per-class sums of encoder features), never from raw data.", "",
           f"- ghofl version: {manifest.get('ghofl_version', 'unrecorded')}", "",
           "## Encoder and statistics", "", *_encoder_lines(stats), *_statistics_lines(stats),
           "", "## Training data", "", *_data_lines(stats, aggregation, privacy), "",
           "## Protocol and privacy", "", *_protocol_lines(aggregation, privacy), "",
           *_personalised_lines(manifest.get("personalised")),
           "## Heads", "", *_head_lines(heads, chosen or {}), "",
           "## Evaluation", "", *_evaluation_lines(manifest.get("evaluations")),
           *_score_lines(heads, scores or manifest.get("test_scores"),
                         bool(manifest.get("evaluations"))), "",
           "## How to use", "", *_usage_lines(manifest, heads), "",
           "## Out-of-distribution score", "", *_ood_lines(manifest.get("ood")), "",
           "## Reproduce", ""]
    command = command or manifest.get("command")
    if command:
        out += ["```", command, "```"]
    else:
        out.append("The command that made this model was not recorded.")
    out += ["", "## Intended use", "",
            "Classifying new inputs from the same encoder into the classes above (see How to "
            "use).", "", "## Known limits", "", *(f"- {t}" for t in _LIMITS)]
    return "\n".join(out) + "\n"
