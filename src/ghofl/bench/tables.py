"""Markdown tables of experiment records: accuracy mean ± std over seeds."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ghofl.bench.config import ExperimentConfig
from ghofl.bench.report import markdown_table
from ghofl.stats.codec import atomic_write


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    m = statistics.fmean(values)
    return m, (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt_pct(values: list[float]) -> str:
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


def write_markdown(cfg: ExperimentConfig, records: list[dict[str, Any]], path: Path) -> None:
    """Write ``results.md`` for ``records``."""
    text = (
        f"# Results: {cfg.name}\n\nGrid: datasets {list(cfg.datasets)}, encoders "
        f"{list(cfg.encoders)} at {cfg.resolution}px ({cfg.backend}), α {list(cfg.alphas)}, "
        f"clients {list(cfg.clients)}, seeds {list(cfg.seeds)}, modes {list(cfg.modes)}, "
        f"projections {list(cfg.projection_dims)}.\n\n"
        + accuracy_tables(records)
        + "\n\n"
        + invariance_summary(records)
        + "\n"
    )
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def demo_table(records: list[dict[str, Any]]) -> str:
    """A compact terminal table: one row per head/reference (accuracy, fit seconds, upload)."""
    rows = []
    for r in records:
        upload = r.get("upload_bytes_per_client")
        rows.append(
            [
                r["head"] + (" (centralised)" if r["mode"] == "reference" else ""),
                f"{100 * r['accuracy']:.2f}",
                f"{r['fit_seconds']:.2f}",
                "-" if upload is None else f"{upload / 1e6:.2f}",
            ]
        )
    return markdown_table(["head", "test accuracy %", "server fit s", "upload MB/client"], rows)
