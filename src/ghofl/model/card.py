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
``min_class_count``, ``min_class_count_rule``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["CARD_FILE", "model_card"]

CARD_FILE = "MODEL_CARD.md"
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
        picked = ", ".join(f"{k.rstrip('_')}={_fmt(v)}" for k, v in
                           (chosen.get(name) or {}).items() if k != "fit_seconds_") or "-"
        secs = entry.get("fit_seconds")
        lines.append(f"| {_cell(str(name))} | {_cell(str(entry.get('head', name)))} | "
                     f"{_cell(given)} | {_cell(picked)} | "
                     f"{'-' if secs is None else f'{float(secs):.3g}'} |")
    return lines


def _score_lines(heads: Mapping[str, Any],
                 scores: Mapping[str, Mapping[str, Any]] | None) -> list[str]:
    if not scores:
        return ["No test data was given when the model was fitted, so no accuracy is "
                "recorded; measure it with `ghofl evaluate MODEL_DIR --embeddings TEST.npz` "
                "on labelled test embeddings from the same encoder."]
    lines = ["| head | test accuracy | test samples |", "|---|---|---|"]
    for name in heads:
        s = scores.get(name)
        if s is not None:
            lines.append(f"| {_cell(str(name))} | {float(s['accuracy']):.4f} | {s.get('n')} |")
    return lines


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
    first = next(iter(heads), "lda")
    out = ["# Model card", "",
           f"A ghofl model directory: {len(heads)} classification head(s) ("
           f"{', '.join(f'`{h}`' for h in heads)}) fitted in one shot from aggregated client "
           "statistics (per-class sums of encoder features), never from raw data.", "",
           f"- ghofl version: {manifest.get('ghofl_version', 'unrecorded')}", "",
           "## Encoder and statistics", "", *_encoder_lines(stats), *_statistics_lines(stats),
           "", "## Training data", "", *_data_lines(stats, aggregation, privacy), "",
           "## Protocol and privacy", "", *_protocol_lines(aggregation, privacy), "",
           *_personalised_lines(manifest.get("personalised")),
           "## Heads", "", *_head_lines(heads, chosen or {}), "",
           "## Evaluation", "", *_score_lines(heads, scores), "",
           "## Reproduce", ""]
    if command:
        out += ["```", command, "```"]
    else:
        out.append("The command that made this model was not recorded.")
    out += ["", "## Intended use", "",
            "Classifying new inputs from the same encoder into the classes above: "
            f"`ghofl evaluate` on labelled embeddings, `ghofl export MODEL_DIR --head {first} "
            "--out model.onnx` for an ONNX graph, or `ghofl.model.directory.load_model` in "
            "Python.", "", "## Known limits", "", *(f"- {t}" for t in _LIMITS)]
    return "\n".join(out) + "\n"
