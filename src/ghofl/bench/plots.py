"""PNG plots of experiment records (matplotlib, imported lazily; the ``bench`` extra)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from ghofl.bench.tables import mean_std
from ghofl.errors import require_extra


def write_plots(records: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Accuracy per head vs α, and accuracy vs upload bytes; returns the files written."""
    require_extra("matplotlib", "bench")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    fed = [r for r in records if r["mode"] != "reference"]
    refs = [r for r in records if r["mode"] == "reference"]
    for (ds, enc), recs in _group(fed, ("dataset", "encoder")).items():
        base = [r for r in recs if r["mode"] == recs[0]["mode"] and not r["projection_dim"]]
        k0 = min(r["clients"] for r in base) if base else None
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for head, hr in _group([r for r in base if r["clients"] == k0], ("head",)).items():
            pts = sorted(_by(hr, "alpha").items())
            means = [100 * mean_std(v)[0] for _, v in pts]
            errs = [100 * mean_std(v)[1] for _, v in pts]
            ax.errorbar([a for a, _ in pts], means, yerr=errs, marker="o", capsize=3, label=head[0])
        for ref in refs:
            if ref["dataset"] == ds and ref["encoder"] == enc:
                ax.axhline(100 * ref["accuracy"], ls="--", lw=1, color="gray")
                ax.annotate(
                    f"{ref['head']} (centralised)",
                    (0.01, 100 * ref["accuracy"]),
                    xycoords=("axes fraction", "data"),
                    va="top",
                    fontsize=8,
                    color="gray",
                )
        ax.set_xscale("log")
        alphas = sorted({r["alpha"] for r in base})
        ax.set_xticks(alphas, [f"{a:g}" for a in alphas])
        ax.minorticks_off()
        written.append(
            _finish(
                fig,
                ax,
                "Dirichlet α (label skew; smaller = more skewed)",
                f"{ds} / {enc}: one-shot heads vs α ({k0} clients)",
                out_dir / f"accuracy_vs_alpha_{_slug(ds)}_{_slug(enc)}.png",
            )
        )

        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors: dict[str, Any] = {}
        styles = {"full": "-", "pooled": "--", "gram": "-.", "diag": ":"}
        for (head, mode), hr in _group(recs, ("head", "mode")).items():
            pts = sorted(_by(hr, "upload_bytes_per_client").items())
            line = ax.plot(
                [b / 1e6 for b, _ in pts],
                [100 * mean_std(v)[0] for _, v in pts],
                marker="o",
                ls=styles.get(mode, "-"),
                color=colors.get(head),
                label=f"{head} ({mode})",
            )
            colors.setdefault(head, line[0].get_color())

        ax.set_xscale("log")
        written.append(
            _finish(
                fig,
                ax,
                "upload per client (MB, log scale)",
                f"{ds} / {enc}: accuracy vs upload size",
                out_dir / f"accuracy_vs_bytes_{_slug(ds)}_{_slug(enc)}.png",
            )
        )
    return written


def _finish(fig: Any, ax: Any, xlabel: str, title: str, path: Path) -> Path:
    """Label an accuracy plot, save it as PNG and close it."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _group(
    records: list[dict[str, Any]], keys: tuple[str, ...]
) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def _by(records: list[dict[str, Any]], key: str) -> dict[Any, list[float]]:
    out: dict[Any, list[float]] = defaultdict(list)
    for r in records:
        out[r[key]].append(r["accuracy"])
    return out


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in Path(str(s)).name)


def write_demo_plots(
    records: list[dict[str, Any]], fedavg: dict[str, Any] | None, out_dir: Path
) -> list[Path]:
    """The three pictures of ``ghofl demo``; returns the files written.

    * ``accuracy_vs_alpha.png``: every head's accuracy against Dirichlet α (mode ``full``, no
      projection), with the centralised references as dashed lines;
    * ``fedavg_rounds.png``: FedAvg's accuracy after every round against the one-shot heads at
      its α, the round where it first reaches the best head marked (or the gap noted);
    * ``accuracy_vs_bytes.png``: accuracy against the bytes a client uploads, one colour per
      head, one marker per upload mode, lines joining the projections of a mode.
    """
    require_extra("matplotlib", "bench")
    import matplotlib

    matplotlib.use("Agg")

    fed = [r for r in records if r["mode"] != "reference"]
    refs = [r for r in records if r["mode"] == "reference"]
    heads = list(dict.fromkeys(r["head"] for r in fed))
    colour = {h: f"C{i % 10}" for i, h in enumerate(heads)}
    written: list[Path] = []

    base = [r for r in fed if r["mode"] == "full" and not r["projection_dim"]]
    written.append(_demo_alpha_plot(base, refs, heads, colour, out_dir))
    if fedavg and fedavg.get("accuracy"):
        written.append(_demo_fedavg_plot(fedavg, base, colour, out_dir))
    bytes_plot = _demo_bytes_plot(fed, heads, colour, out_dir)
    if bytes_plot is not None:
        written.append(bytes_plot)
    return written


def _demo_alpha_plot(
    base: list[dict[str, Any]],
    refs: list[dict[str, Any]],
    heads: list[str],
    colour: dict[str, str],
    out_dir: Path,
) -> Path:
    """Write ``accuracy_vs_alpha.png``: each head's accuracy against α.

    Over the ``base`` records (mode ``full``, no projection), the references ``refs`` as gray
    lines.
    """
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for head in heads:
        pts = sorted((r["alpha"], r["accuracy"]) for r in base if r["head"] == head)
        if pts:
            ax.plot([a for a, _ in pts], [100 * v for _, v in pts], marker="o",
                    color=colour[head], label=head)
    _reference_lines(ax, refs)
    alphas = sorted({r["alpha"] for r in base})
    ax.set_xscale("log")
    ax.set_xticks(alphas, [f"{a:g}" for a in alphas])
    ax.minorticks_off()
    k = base[0]["clients"] if base else "?"
    return _finish(fig, ax, "Dirichlet α (label skew; smaller = more skewed)",
                   f"One-shot heads vs label skew ({k} clients): flat = invariant",
                   out_dir / "accuracy_vs_alpha.png")


def _demo_fedavg_plot(
    fedavg: dict[str, Any], base: list[dict[str, Any]], colour: dict[str, str], out_dir: Path
) -> Path:
    """Write ``fedavg_rounds.png``: FedAvg's accuracy per round against the one-shot heads.

    The heads of ``base`` at FedAvg's α, with the round it reaches the best head marked (or the
    gap noted).
    """
    import matplotlib.pyplot as plt

    from ghofl.bench.tables import fedavg_crossing

    acc = 100 * np.asarray(fedavg["accuracy"])
    one_shot = [r for r in base if r["alpha"] == fedavg["alpha"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(np.arange(acc.size), acc, color="black", lw=2,
            label=f"FedAvg (linear head, lr {fedavg['lr']:g})")
    for r in one_shot:
        ax.axhline(100 * r["accuracy"], ls="--", lw=1, color=colour[r["head"]],
                   label=f"{r['head']} (one shot)")
    if one_shot:
        best = max(one_shot, key=lambda r: r["accuracy"])
        cross = fedavg_crossing(list(fedavg["accuracy"]), best["accuracy"])
        if cross is not None:
            ax.axvline(cross, color="gray", lw=1)
            ax.annotate(f"reaches {best['head']} at round {cross}", (cross, acc.min()),
                        xytext=(4, 4), textcoords="offset points", fontsize=8)
        else:
            ax.annotate(f"below {best['head']} after {acc.size - 1} rounds "
                        f"({acc[-1] - 100 * best['accuracy']:+.1f} points)",
                        (0.02, 0.96), xycoords="axes fraction", ha="left", va="top",
                        fontsize=8)
        ax.set_ylim(max(0.0, float(np.median(acc)) - 25), 100 * best["accuracy"] + 4)
    kb = fedavg["upload_bytes_per_round"] / 1e3
    return _finish(
        fig, ax, f"FedAvg round (each: {kb:.0f} kB uploaded per client)",
        f"FedAvg vs one upload ({fedavg['clients']} clients, α = {fedavg['alpha']:g})",
        out_dir / "fedavg_rounds.png")


def _demo_bytes_plot(
    fed: list[dict[str, Any]], heads: list[str], colour: dict[str, str], out_dir: Path
) -> Path | None:
    """Write ``accuracy_vs_bytes.png``: accuracy against upload bytes.

    At the α of the upload and projection sweeps (the first record not in mode ``full`` without
    projection); ``None``, and nothing written, when no record has that α.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    markers = {"full": "o", "pooled": "s", "gram": "D", "diag": "^"}
    alpha = next((r["alpha"] for r in fed if r["mode"] != "full" or r["projection_dim"]), None)
    swept = [r for r in fed if r["alpha"] == alpha]
    if not swept:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for (head, mode), hr in _group(swept, ("head", "mode")).items():
        pts = sorted((r["upload_bytes_per_client"], r["accuracy"]) for r in hr)
        ax.plot([b for b, _ in pts], [100 * v for _, v in pts], marker=markers.get(mode, "o"),
                ls="-" if mode == "full" else ":", color=colour[head], alpha=0.85)
    for (mode, proj), hr in _group(swept, ("mode", "projection_dim")).items():
        top = max(hr, key=lambda r: r["accuracy"])
        ax.annotate(f"{mode}" + (f" k={proj}" if proj else ""),
                    (top["upload_bytes_per_client"], 100 * top["accuracy"]),
                    xytext=(0, 6), textcoords="offset points", ha="center", fontsize=7)
    handles = [Line2D([], [], color=colour[h], label=h) for h in heads]
    handles += [Line2D([], [], color="gray", marker=m, ls="", label=f"mode {mode}")
                for mode, m in markers.items() if any(r["mode"] == mode for r in swept)]
    ax.set_xscale("log")
    ax.set_xlabel("bytes uploaded per client, once (log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"Accuracy vs upload size (α = {alpha:g}; projections k marked)")
    ax.legend(handles=handles, fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    path = out_dir / "accuracy_vs_bytes.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _reference_lines(ax: Any, refs: list[dict[str, Any]]) -> None:
    """Centralised references as gray lines named in the legend (equal values stay readable)."""
    styles = ("--", ":", "-.")
    for i, ref in enumerate(refs):
        ax.axhline(100 * ref["accuracy"], ls=styles[i % len(styles)], lw=1.2, color="gray",
                   label=f"{ref['head']} (centralised)")
