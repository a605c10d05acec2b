"""Markdown tables of experiment records: accuracy mean ± std over seeds."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ghofl.bench.config import ExperimentConfig
from ghofl.bench.report import markdown_table
from ghofl.stats.codec import atomic_write
from ghofl.stats.meta import EncoderInfo


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt_pct(values: list[float]) -> str:
    """Mean of ``values`` as a percentage, with ``± std`` when there are several."""
    m, s = mean_std(values)
    return f"{100 * m:.2f} ± {100 * s:.2f}" if len(values) > 1 else f"{100 * m:.2f}"


def accuracy_tables(records: list[dict[str, Any]]) -> str:
    """One table per (dataset, encoder, mode, projection): heads × (alpha, clients)."""
    fed = [r for r in records if r["mode"] != "reference"]
    refs = [r for r in records if r["mode"] == "reference"]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in fed:
        groups[(r["dataset"], r["encoder"], r["mode"], r["projection_dim"])].append(r)
    parts: list[str] = []
    for (ds, enc, mode, proj), recs in groups.items():
        cols = sorted({(r["alpha"], r["clients"]) for r in recs})
        heads = list(dict.fromkeys(r["head"] for r in recs))
        cell: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        for r in recs:
            cell[(r["head"], r["alpha"], r["clients"])].append(r["accuracy"])
        rows = [
            [h] + [fmt_pct(cell[(h, a, k)]) if cell[(h, a, k)] else "" for a, k in cols]
            for h in heads
        ]
        for ref in refs:
            if ref["dataset"] == ds and ref["encoder"] == enc:
                rows.append(
                    [f"*{ref['head']} (centralised)*"]
                    + [f"{100 * ref['accuracy']:.2f}"] * len(cols)
                )
        upload = recs[0]["upload_bytes_per_client"]
        seeds = len({r["seed"] for r in recs})
        parts.append(
            f"### {ds} / {enc} / mode `{mode}`"
            + (f" / projection k={proj}" if proj else "")
            + f"\n\nTest accuracy %, mean ± std over {seeds} seed(s); upload "
            f"{upload / 1e6:.2f} MB per client.\n\n"
            + markdown_table(["head"] + [f"α={a}, K={k}" for a, k in cols], rows)
        )
    return "\n\n".join(parts)


def invariance_summary(records: list[dict[str, Any]]) -> str:
    """Spread of each head's accuracy across (alpha, clients) for a fixed seed: 0 = invariant."""
    fed = [r for r in records if r["mode"] != "reference"]
    by: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in fed:
        by[
            (r["dataset"], r["encoder"], r["mode"], r["projection_dim"], r["head"], r["seed"])
        ].append(r["accuracy"])
    rows = []
    spread: dict[tuple[Any, ...], float] = defaultdict(float)
    count: dict[tuple[Any, ...], int] = defaultdict(int)
    for (ds, enc, mode, proj, head, _seed), accs in by.items():
        k = (ds, enc, mode, proj, head)
        spread[k] = max(spread[k], max(accs) - min(accs))
        count[k] = max(count[k], len(accs))
    for (ds, enc, mode, proj, head), sp in spread.items():
        if count[(ds, enc, mode, proj, head)] > 1:
            rows.append([ds, enc, mode, proj or "-", head, f"{100 * sp:.4f}"])
    if not rows:
        return ""
    return (
        "### Partition invariance\n\nLargest accuracy difference (points) between any two "
        "(α, clients) settings with the same seed:\n\n"
        + markdown_table(["dataset", "encoder", "mode", "proj", "head", "max spread"], rows)
    )


def describe_encoder(
    name: str, cfg: ExperimentConfig, info: EncoderInfo | None = None
) -> str:
    """How ``results.md`` names an encoder.

    Image encoders by input resolution and backend
    (``efficientnet-lite0 at 224px (onnx)``), others by kind and dimension
    (``minilm (text, d=384)``). With ``info`` (the encoder's :class:`EncoderInfo`) the
    resolution and dimension come from it; without, from ``cfg`` and the encoder's name.
    """
    from ghofl.bench.features import is_text_encoder_name

    if info is not None:
        if info.resolution is None:
            kind = "text" if is_text_encoder_name(name) else "no input resolution"
            return f"{name} ({kind}, d={info.dim})"
        return f"{name} at {info.resolution}px ({cfg.backend}, d={info.dim})"
    if is_text_encoder_name(name):
        return f"{name} (text)"
    return f"{name} at {cfg.resolution}px ({cfg.backend})"


def write_markdown(
    cfg: ExperimentConfig, records: list[dict[str, Any]], path: Path,
    encoders: Mapping[str, EncoderInfo] | None = None,
) -> None:
    """Write ``results.md`` for ``records``.

    ``encoders`` maps encoder names to their :class:`EncoderInfo` when known (see
    :func:`describe_encoder`).
    """
    from ghofl.bench.features import dataset_label

    infos = encoders or {}
    described = ", ".join(describe_encoder(e, cfg, infos.get(e)) for e in cfg.encoders)
    text = (
        f"# Results: {cfg.name}\n\nGrid: datasets {[dataset_label(d) for d in cfg.datasets]}, "
        f"encoders {described}, α {list(cfg.alphas)}, "
        f"clients {list(cfg.clients)}, seeds {list(cfg.seeds)}, modes {list(cfg.modes)}, "
        f"projections {list(cfg.projection_dims)}.\n\n"
        + accuracy_tables(records)
        + "\n\n"
        + invariance_summary(records)
        + "\n"
    )
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def fedavg_crossing(accuracy: list[float], target: float) -> int | None:
    """First FedAvg round (>= 1) whose accuracy reaches ``target``, else ``None``."""
    return next((r for r, a in enumerate(accuracy) if r >= 1 and a >= target), None)


def demo_alpha_table(records: list[dict[str, Any]], fedavg: dict[str, Any] | None = None) -> str:
    """Heads × Dirichlet α (mode ``full``, no projection), with the spread across α.

    Also the centralised references and, at its α, FedAvg after its last round.
    """
    fed = [r for r in records
           if r["mode"] == "full" and not r["projection_dim"] and r["alpha"] is not None]
    alphas = sorted({r["alpha"] for r in fed})
    cell = {(r["head"], r["alpha"]): r for r in fed}
    heads = list(dict.fromkeys(r["head"] for r in fed))
    rows: list[list[Any]] = []
    for h in heads:
        accs = [cell[(h, a)]["accuracy"] for a in alphas if (h, a) in cell]
        rows.append([h] + [f"{100 * cell[(h, a)]['accuracy']:.2f}" if (h, a) in cell else ""
                           for a in alphas]
                    + [f"{100 * (max(accs) - min(accs)):.2f}",
                       f"{max(cell[(h, a)]['fit_seconds'] for a in alphas if (h, a) in cell):.1f}"])
    for r in records:
        if r["mode"] == "reference":
            rows.append([f"*{r['head']} (centralised)*"] + [f"{100 * r['accuracy']:.2f}"]
                        * len(alphas) + ["-", f"{r['fit_seconds']:.1f}"])
    if fedavg:
        n = len(fedavg["accuracy"]) - 1
        rows.append([f"*FedAvg, {n} rounds*"]
                    + [f"{100 * fedavg['accuracy'][-1]:.2f}" if a == fedavg["alpha"] else "-"
                       for a in alphas] + ["-", f"{fedavg['seconds']:.1f}"])
    upload = fed[0]["upload_bytes_per_client"] if fed else 0
    return (f"Test accuracy % per Dirichlet α ({fed[0]['clients'] if fed else '?'} clients, "
            f"upload mode `full`: {_mb(upload)} per client, once). Spread = largest difference "
            "across α (points): 0 means the head is partition invariant.\n\n"
            + markdown_table(["head"] + [f"α={a:g}" for a in alphas]
                             + ["spread", "fit s (max)"], rows))


def demo_upload_table(records: list[dict[str, Any]]) -> str:
    """Upload settings (mode, projection) by bytes per client × head accuracy.

    Sorted by bytes, at the α of the upload sweep.
    """
    fed = [r for r in records if r["mode"] != "reference" and r["alpha"] is not None]
    swept = [r for r in fed if r["mode"] != "full" or r["projection_dim"]]
    if not swept:
        return ""
    alpha = swept[0]["alpha"]
    fed = [r for r in fed if r["alpha"] == alpha]
    heads = list(dict.fromkeys(r["head"] for r in fed))
    settings: dict[tuple[str, int | None], dict[str, Any]] = defaultdict(dict)
    size: dict[tuple[str, int | None], int] = {}
    for r in fed:
        key = (r["mode"], r["projection_dim"])
        settings[key][r["head"]] = r["accuracy"]
        size[key] = r["upload_bytes_per_client"]
    rows = []
    for key in sorted(settings, key=lambda k: size[k]):
        mode, proj = key
        rows.append([f"`{mode}`", f"k={proj}" if proj else "none", _mb(size[key])]
                    + [f"{100 * settings[key][h]:.2f}" if h in settings[key] else "-"
                       for h in heads])
    return (f"Test accuracy % against the bytes one client uploads (once), α={alpha:g}; "
            "`-`: the mode does not carry what the head needs.\n\n"
            + markdown_table(["mode", "projection", "upload per client", *heads], rows))


def demo_fedavg_line(records: list[dict[str, Any]], fedavg: dict[str, Any]) -> str:
    """One sentence: where FedAvg meets the best one-shot head at its α (or not)."""
    one_shot = [r for r in records if r["mode"] == "full" and not r["projection_dim"]
                and r["alpha"] == fedavg["alpha"]]
    n = len(fedavg["accuracy"]) - 1
    per_round = fedavg["upload_bytes_per_round"]
    head = f"FedAvg (linear softmax head, lr {fedavg['lr']:g} chosen on held-out rows)"
    if not one_shot:
        return f"{head}: {100 * fedavg['accuracy'][-1]:.2f}% after {n} rounds."
    best = max(one_shot, key=lambda r: r["accuracy"])
    crossed = fedavg_crossing(fedavg["accuracy"], best["accuracy"])
    if crossed is None:
        verdict = (f"does not reach the best one-shot head ({best['head']}, "
                   f"{100 * best['accuracy']:.2f}%) within {n} rounds "
                   f"({100 * (fedavg['accuracy'][-1] - best['accuracy']):+.2f} points after "
                   f"{n} rounds, {_mb(n * per_round)} uploaded per client)")
    else:
        verdict = (f"reaches the best one-shot head ({best['head']}, "
                   f"{100 * best['accuracy']:.2f}%) after {crossed} rounds "
                   f"({_mb(crossed * per_round)} uploaded per client, against "
                   f"{_mb(best['upload_bytes_per_client'])} once)")
    return (f"{head} on the same {fedavg['clients']} clients (α={fedavg['alpha']:g}) {verdict}; "
            f"each round a client uploads {_mb(per_round)}.")


def demo_markdown(result: dict[str, Any]) -> str:
    """``results.md`` of ``ghofl demo`` (and what it prints).

    The α table, the FedAvg sentence, the upload table.
    """
    records, fedavg = result["records"], result.get("fedavg")
    parts = [f"# ghofl demo: CIFAR-10 ({result['n_train']:,} train / {result['n_test']:,} test "
             f"images), {result['encoder']}", "", demo_alpha_table(records, fedavg)]
    if fedavg:
        parts += ["", demo_fedavg_line(records, fedavg)]
    upload = demo_upload_table(records)
    if upload:
        parts += ["", upload]
    return "\n".join(parts) + "\n"
